//! Workload credentials: what they hold, and what they refuse to be built from.

use ferry_core::identity::Identity;
use ferry_tls::config::Credentials;
use ferry_tls::testkit::TestCa;

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";

fn id(s: &str) -> Identity {
    s.parse().expect("identity")
}

#[test]
fn the_leaf_is_the_certificate_naming_the_identity() {
    let ca = TestCa::new("root");
    let creds = ca.issue_str(CLIENT);
    assert_eq!(creds.chain().len(), 2);
    assert_eq!(creds.leaf(), &creds.chain()[0]);
    assert_ne!(creds.leaf(), &ca.root(), "the root comes after the leaf");
    assert_eq!(creds.identity(), &id(CLIENT));
}

#[test]
fn an_empty_chain_is_refused() {
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
        rcgen::KeyPair::generate().unwrap().serialize_der().into(),
    );
    let err = Credentials::from_der(Vec::new(), key).expect_err("no leaf, no credentials");
    assert!(err.to_string().contains("empty certificate chain"), "{err}");
}
