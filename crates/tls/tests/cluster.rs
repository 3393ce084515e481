//! The cluster bound into a certificate, as a server reads it from a verified peer after the
//! handshake: present, absent (another trust source), and never from a chain it did not verify.

use ferry_core::model::ClusterId;
use ferry_tls::config::{
    Credentials, TrustBundle, client_config, peer_cluster, peer_identity, server_config,
    server_name,
};
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

/// What the server learned about its client after a mutual TLS handshake, or the handshake's
/// error on the server's side.
async fn serve_one(
    client: &Credentials,
    server: &Credentials,
    server_trusts: &TrustBundle,
    client_trusts: &TrustBundle,
) -> Result<Option<ClusterId>, String> {
    let acceptor = TlsAcceptor::from(server_config(server, server_trusts).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let served = tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let certs = tls.get_ref().1.peer_certificates();
        peer_identity(certs, "cluster.local").map_err(|e| e.to_string())?;
        let cluster = peer_cluster(certs).map_err(|e| e.to_string())?;
        let mut b = [0u8; 2];
        tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
        Ok(cluster)
    });
    let config = client_config(client, client_trusts, vec![server.identity().clone()]).unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    if let Ok(mut t) = TlsConnector::from(config)
        .connect(server_name(addr), tcp)
        .await
    {
        // TLS 1.3: the server judges the client's certificate after the client is done.
        let _ = t.write_all(b"hi").await;
        let _ = t.flush().await;
    }
    served.await.unwrap()
}

#[tokio::test]
async fn the_server_reads_the_cluster_the_ca_bound_into_its_verified_client() {
    let ca = TestCa::new("mesh");
    let client = ca.issue_in(&CLIENT.parse().unwrap(), &ClusterId::new("east"));
    let server = ca.issue_str(SERVER);
    let got = serve_one(&client, &server, &ca.bundle(), &ca.bundle()).await;
    assert_eq!(got, Ok(Some(ClusterId::new("east"))));
}

#[tokio::test]
async fn a_certificate_without_the_extension_proves_no_cluster() {
    // As istiod issues them: same trust domain, no cluster.
    let ca = TestCa::new("istiod");
    let client = ca.issue_str(CLIENT);
    let server = ca.issue_str(SERVER);
    let got = serve_one(&client, &server, &ca.bundle(), &ca.bundle()).await;
    assert_eq!(got, Ok(None));
}

#[tokio::test]
async fn a_cluster_in_a_certificate_from_another_ca_is_never_read() {
    // Another root's certificate claiming "east": the handshake fails before anyone reads it.
    let mesh = TestCa::new("mesh");
    let other = TestCa::new("other");
    let client = other.issue_in(&CLIENT.parse().unwrap(), &ClusterId::new("east"));
    let server = mesh.issue_str(SERVER);
    let got = serve_one(&client, &server, &mesh.bundle(), &mesh.bundle()).await;
    let err = got.expect_err("a certificate from another root is refused");
    assert!(
        err.contains("UnknownIssuer") || err.contains("invalid peer certificate"),
        "{err}"
    );
}

#[test]
fn reading_a_certificate_finds_its_cluster_or_none() {
    let ca = TestCa::new("mesh");
    let with = ca.issue_in(&CLIENT.parse().unwrap(), &ClusterId::new("west"));
    let without = ca.issue_str(CLIENT);
    assert_eq!(
        ferry_tls::cluster::cluster_of(with.leaf()).unwrap(),
        Some(ClusterId::new("west"))
    );
    assert_eq!(
        ferry_tls::cluster::cluster_of(without.leaf()).unwrap(),
        None
    );
    // And the rest of the certificate is as before: the identity is still its only SPIFFE SAN.
    assert_eq!(with.identity(), without.identity());
}

/// A stock verifier — rustls's own WebPKI client verifier, with no Ferry code, as a peer that
/// knows nothing of Ferry's extension verifies (Istio's ztunnel verifies with webpki too) —
/// accepts a certificate that carries the cluster, and one that does not.
#[test]
fn a_stock_webpki_verifier_accepts_certificates_that_carry_the_cluster() {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let ca = TestCa::new("stock");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.root()).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .unwrap();
    let now = rustls::pki_types::UnixTime::now();
    let id: ferry_core::identity::Identity = CLIENT.parse().unwrap();
    let with = ca.issue_in(&id, &ClusterId::new("east"));
    let without = ca.issue(&id);
    assert_eq!(
        peer_cluster(Some(with.chain())).unwrap(),
        Some(ClusterId::new("east")),
        "the extension is really there"
    );
    assert_eq!(peer_cluster(Some(without.chain())).unwrap(), None);
    for creds in [&with, &without] {
        let chain = creds.chain();
        verifier
            .verify_client_cert(&chain[0], &chain[1..], now)
            .expect("a stock verifier accepts it");
    }
}
