//! Chains verified once per trust bundle, through real TLS 1.3 handshakes (in memory): the next
//! handshake with the same certificates skips the chain's signature checks at both ends, and
//! nothing verified to one bundle is trusted by another.

use std::io::Write;

use ferry_core::identity::Identity;
use ferry_tls::config::{TrustBundle, client_config, server_config, server_name};
use ferry_tls::testkit::{TestCa, pass};
use rustls::{ClientConnection, ServerConnection};

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

fn id(s: &str) -> Identity {
    s.parse().expect("identity")
}

/// A whole handshake between a client with `client_bundle` and a server with `server_bundle`,
/// then one message each way; the first error either end found.
fn handshake(
    ca: &TestCa,
    client_bundle: &TrustBundle,
    server_bundle: &TrustBundle,
) -> Result<(), rustls::Error> {
    let client = client_config(&ca.issue_str(CLIENT), client_bundle, vec![id(SERVER)])
        .expect("client config");
    let server = server_config(&ca.issue_str(SERVER), server_bundle).expect("server config");
    let addr = "127.0.0.1:15008".parse().expect("an address");
    let mut c = ClientConnection::new(client, server_name(addr)).expect("client");
    let mut s = ServerConnection::new(server).expect("server");
    while c.is_handshaking() || s.is_handshaking() {
        pass(&mut c, &mut s)?;
        pass(&mut s, &mut c)?;
    }
    c.writer().write_all(b"ping").expect("written");
    pass(&mut c, &mut s)?;
    let mut got = [0u8; 4];
    std::io::Read::read_exact(&mut s.reader(), &mut got).expect("read");
    assert_eq!(&got, b"ping");
    Ok(())
}

#[test]
fn the_same_chains_again_skip_their_verification_at_both_ends() {
    let ca = TestCa::new("root");
    let bundle = ca.bundle();
    // Each end presents new credentials per handshake here, so nothing repeats yet.
    handshake(&ca, &bundle, &bundle).expect("first handshake");
    assert_eq!(bundle.verifications_skipped(), 0);

    // The same credentials twice: the second handshake skips both chains.
    let client = client_config(&ca.issue_str(CLIENT), &bundle, vec![id(SERVER)]).expect("client");
    let server = server_config(&ca.issue_str(SERVER), &bundle).expect("server");
    let addr = "127.0.0.1:15008".parse().expect("an address");
    for round in 0..2u64 {
        let mut c = ClientConnection::new(client.clone(), server_name(addr)).expect("client");
        let mut s = ServerConnection::new(server.clone()).expect("server");
        while c.is_handshaking() || s.is_handshaking() {
            pass(&mut c, &mut s).expect("server end");
            pass(&mut s, &mut c).expect("client end");
        }
        assert_eq!(bundle.verifications_skipped(), 2 * round, "round {round}");
    }
    // A clone shares what its original verified; a bundle made anew shares nothing.
    let clone = bundle.clone();
    drop(bundle);
    assert_eq!(clone.verifications_skipped(), 2);
    assert_eq!(ca.bundle().verifications_skipped(), 0);
}

#[test]
fn a_chain_verified_to_one_bundle_is_not_trusted_by_another_without_its_root() {
    let ca = TestCa::new("root");
    let other = TestCa::new("other root");
    let bundle = ca.bundle();
    let client_creds = ca.issue_str(CLIENT);
    let client = client_config(&client_creds, &bundle, vec![id(SERVER)]).expect("client");
    let creds = ca.issue_str(SERVER);
    let server = server_config(&creds, &bundle).expect("server");
    let addr = "127.0.0.1:15008".parse().expect("an address");
    for _ in 0..2 {
        let mut c = ClientConnection::new(client.clone(), server_name(addr)).expect("client");
        let mut s = ServerConnection::new(server.clone()).expect("server");
        while c.is_handshaking() || s.is_handshaking() {
            pass(&mut c, &mut s).expect("server end");
            pass(&mut s, &mut c).expect("client end");
        }
    }
    assert_eq!(
        bundle.verifications_skipped(),
        2,
        "remembered by the first bundle"
    );

    // After a rotation to the other root alone, the same server chain is refused by the client
    // (whose chain the server, still on the first bundle, accepts).
    let rotated = other.bundle();
    let client = client_config(&client_creds, &rotated, vec![id(SERVER)]).expect("client");
    let mut c = ClientConnection::new(client, server_name(addr)).expect("client");
    let mut s =
        ServerConnection::new(server_config(&creds, &bundle).expect("server")).expect("server");
    let mut client_refused = None;
    while client_refused.is_none() && (c.is_handshaking() || s.is_handshaking()) {
        pass(&mut c, &mut s).expect("the server end");
        client_refused = pass(&mut s, &mut c).err();
    }
    let err = client_refused.expect("the client refuses the server");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "a chain to a root the bundle lacks: {err:?}"
    );
    assert_eq!(rotated.verifications_skipped(), 0);

    // And the other way: the client whose chain the first bundle remembered, at a server that
    // trusts only the other root.
    let client = client_config(&client_creds, &other.bundle(), vec![id(SERVER)]).expect("client");
    let server = server_config(&other.issue_str(SERVER), &rotated).expect("server");
    let mut c = ClientConnection::new(client, server_name(addr)).expect("client");
    let mut s = ServerConnection::new(server).expect("server");
    let mut server_refused = None;
    while server_refused.is_none() && (c.is_handshaking() || s.is_handshaking()) {
        server_refused = pass(&mut c, &mut s).err();
        if server_refused.is_none() {
            pass(&mut s, &mut c).expect("the client accepts the other root's server");
        }
    }
    let err = server_refused.expect("the server refuses the client");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "a client chain to a root the server's bundle lacks: {err:?}"
    );
    assert_eq!(rotated.verifications_skipped(), 0);
}

#[test]
fn a_remembered_server_chain_still_meets_the_identity_check_and_is_no_client_chain() {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose, SanType,
    };
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    let root_key = KeyPair::generate().expect("key");
    let mut root_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let root = root_params
        .self_signed(&root_key)
        .expect("root")
        .der()
        .clone();
    let issuer = Issuer::new(root_params, root_key);
    let issue = |uri: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.subject_alt_names = vec![SanType::URI(uri.try_into().expect("a URI"))];
        p.extended_key_usages = usages;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = p.signed_by(&key, &issuer).expect("signed").der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        ferry_tls::config::Credentials::from_der(vec![cert, root.clone()], key)
            .expect("credentials")
    };
    let both = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let server_only = issue(SERVER, vec![ExtendedKeyUsagePurpose::ServerAuth]);
    let client_creds = issue(CLIENT, both);
    let bundle = TrustBundle::from_der([root.clone()]).expect("bundle");
    let addr = "127.0.0.1:15008".parse().expect("an address");
    let run = |client: std::sync::Arc<rustls::ClientConfig>,
               server: std::sync::Arc<rustls::ServerConfig>| {
        let mut c = ClientConnection::new(client, server_name(addr)).expect("client");
        let mut s = ServerConnection::new(server).expect("server");
        while c.is_handshaking() || s.is_handshaking() {
            pass(&mut c, &mut s).map_err(|e| ("server", e))?;
            pass(&mut s, &mut c).map_err(|e| ("client", e))?;
        }
        Ok::<(), (&str, rustls::Error)>(())
    };

    // The server-only chain, verified and remembered by a client.
    let server = server_config(&server_only, &bundle).expect("server");
    let client = client_config(&client_creds, &bundle, vec![id(SERVER)]).expect("client");
    run(client.clone(), server.clone()).expect("first");
    run(client, server.clone()).expect("second");
    assert_eq!(bundle.verifications_skipped(), 2);

    // Remembered, it still must be one of the identities the client expects.
    let expecting_other = client_config(&client_creds, &bundle, vec![id(CLIENT)]).expect("client");
    let (side, err) = run(expecting_other, server).expect_err("another identity expected");
    assert_eq!(side, "client");
    assert!(format!("{err}").contains("identity mismatch"), "{err}");

    // Presented as a client's chain, it is verified for clientAuth, and refused.
    let skipped = bundle.verifications_skipped();
    let as_client = client_config(&server_only, &bundle, vec![id(CLIENT)]).expect("client");
    let server = server_config(&client_creds, &bundle).expect("server");
    let (side, err) = run(as_client, server).expect_err("no clientAuth usage");
    assert_eq!(side, "server", "{err}");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "a server-only chain as a client's: {err:?}"
    );
    assert_eq!(
        bundle.verifications_skipped(),
        skipped,
        "the server's check was not taken from the client's"
    );
}
