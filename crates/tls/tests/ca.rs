//! The CA and the certificate manager over real gRPC with TLS, on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::citadel::IstioCertificateRequest;
use ferry_api::citadel::istio_certificate_service_client::IstioCertificateServiceClient;
use ferry_control::ca::service::{CaService, Lifetimes};
use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_core::identity::Identity;
use ferry_core::model::ClusterId;
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_tls::ca_client::{CertificateSource, GrpcCa, validity};
use ferry_tls::certs::{CertManager, ManagerConfig};
use ferry_tls::config::{
    Credentials, TrustBundle, client_config, peer_cluster, peer_identity, server_config,
    server_name,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Server, ServerTlsConfig};

const A: &str = "spiffe://cluster.local/ns/default/sa/a";
const B: &str = "spiffe://cluster.local/ns/default/sa/b";
const D: &str = "spiffe://cluster.local/ns/default/sa/d";
const SERVER_NAME: &str = "ferry-control";

fn id(s: &str) -> Identity {
    s.parse().unwrap()
}

/// Two nodes in cluster `c`, workload `a` on n1, `b` on n2; `d` on n3 in cluster `d`.
fn store() -> Arc<Store> {
    let mut m = MeshBuilder::new();
    m.cluster("c", "net")
        .cluster("d", "net")
        .node("n1", "c", "r/z/s")
        .node("n2", "c", "r/z/s")
        .node("n3", "d", "r/z/s");
    m.pod("a", "n1", "198.18.1.1");
    m.pod("b", "n2", "198.18.1.2");
    m.pod("d", "n3", "198.18.1.3");
    Arc::new(Store::new(m.build()))
}

struct ControlPlane {
    ca: Arc<Ca>,
    tokens: Arc<NodeTokens>,
    addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl ControlPlane {
    async fn start(lifetimes: Lifetimes) -> Self {
        Self::start_with(Ca::generate("cluster.local").unwrap(), lifetimes).await
    }

    async fn start_with(ca: Ca, lifetimes: Lifetimes) -> Self {
        let ca = Arc::new(ca);
        let tokens = Arc::new(NodeTokens::from_secret(&[42; 32]));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut cp = Self {
            ca,
            tokens,
            addr,
            tasks: JoinSet::new(),
        };
        cp.serve(l, lifetimes);
        cp
    }

    fn serve(&mut self, l: TcpListener, lifetimes: Lifetimes) {
        let (chain, key) = self
            .ca
            .issue_server_cert(
                &[SERVER_NAME.to_string()],
                &[self.addr.ip()],
                Duration::from_secs(3600),
            )
            .unwrap();
        let tls = ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(chain, key));
        let svc =
            CaService::new(self.ca.clone(), self.tokens.clone(), store(), lifetimes).into_server();
        let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
        let server = Server::builder().tls_config(tls).unwrap().add_service(svc);
        self.tasks.spawn(async move {
            let _ = server.serve_with_incoming(incoming).await;
        });
    }

    fn bundle_pem(&self) -> String {
        self.ca.bundle().concat()
    }

    fn client(&self, node: &str) -> GrpcCa {
        GrpcCa::new(
            &format!("https://{}", self.addr),
            &self.bundle_pem(),
            SERVER_NAME,
            self.tokens.issue(&node.into()),
            "c".into(),
        )
        .unwrap()
    }

    async fn raw(
        &self,
        csr: String,
        impersonate: Option<&str>,
        token: Option<String>,
    ) -> Result<Vec<String>, tonic::Status> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.bundle_pem()))
            .domain_name(SERVER_NAME);
        let channel = Endpoint::from_shared(format!("https://{}", self.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut fields = std::collections::BTreeMap::new();
        if let Some(i) = impersonate {
            fields.insert(
                "ImpersonatedIdentity".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(i.to_string())),
                },
            );
        }
        let mut req = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: Some(prost_types::Struct { fields }),
        });
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        IstioCertificateServiceClient::new(channel)
            .create_certificate(req)
            .await
            .map(|r| r.into_inner().cert_chain)
    }
}

fn csr_for(identity: &str) -> String {
    ferry_tls::ca_client::new_csr(&id(identity)).unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_colocated_identity_is_signed_with_the_right_san_lifetime_and_chain() {
    let cp = ControlPlane::start(Lifetimes {
        default: Duration::from_secs(3600),
        max: Duration::from_secs(7200),
    })
    .await;
    let creds = cp
        .client("n1")
        .sign(&id(A), Duration::from_secs(10 * 3600))
        .await
        .expect("signed");
    assert_eq!(creds.identity(), &id(A));
    let (nb, na) = validity(&creds).unwrap();
    let granted = na.duration_since(nb).unwrap().as_secs();
    // Capped at the 2 h maximum (plus the one-minute backdate), not the 10 h asked for.
    assert!(
        (7200..=7200 + 61).contains(&granted),
        "lifetime {granted} s"
    );
    let chain = creds.chain();
    assert_eq!(chain.len(), 2, "leaf, then root");
    let root = rustls_pemfile::certs(&mut cp.ca.cert_pem().as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(chain[1], root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_is_refused_in_every_case() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let n1 = Some(cp.tokens.issue(&"n1".into()));
    let n2 = Some(cp.tokens.issue(&"n2".into()));
    let forged = Some(NodeTokens::from_secret(&[1; 32]).issue(&"n1".into()));
    let weak_rsa = include_str!("data/csr-rsa1024.pem").to_string();
    let weak_ec = include_str!("data/csr-p192.pem").to_string();
    let c = "spiffe://cluster.local/ns/default/sa/nobody";
    // (case, CSR, impersonated identity, node token, expected reason)
    type Case<'a> = (&'a str, String, Option<&'a str>, Option<String>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "workload on another node",
            csr_for(B),
            Some(B),
            n1.clone(),
            "no workload with identity spiffe://cluster.local/ns/default/sa/b runs on node n1 (it runs on: n2)",
        ),
        (
            "unknown identity",
            csr_for(c),
            Some(c),
            n1.clone(),
            "no workload in the mesh has identity",
        ),
        (
            "forged node credential",
            csr_for(A),
            Some(A),
            forged,
            "signature does not verify",
        ),
        (
            "missing node credential",
            csr_for(A),
            Some(A),
            None,
            "no node credential",
        ),
        (
            "CSR SAN differs from the requested identity",
            csr_for(A),
            Some(B),
            n2,
            "the CSR's SAN is spiffe://cluster.local/ns/default/sa/a but spiffe://cluster.local/ns/default/sa/b was requested",
        ),
        (
            "weak RSA key",
            weak_rsa,
            Some(A),
            n1.clone(),
            "weak or unsupported key: RSA key of 1024 bits",
        ),
        (
            "unsupported curve",
            weak_ec,
            Some(A),
            n1.clone(),
            "weak or unsupported key: EC curve",
        ),
        (
            "not a CSR",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into(),
            Some(A),
            n1,
            "CSR",
        ),
    ];
    for (name, csr, imp, token, expect) in cases {
        let status = cp.raw(csr, imp, token).await.expect_err(name);
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{name}: {status:?}"
        );
        assert!(
            status.message().contains(expect),
            "{name}: {:?} lacks {expect:?}",
            status.message()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_from_this_ca_authenticate_both_sides_of_mutual_tls() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let a = cp
        .client("n1")
        .sign(&id(A), Duration::from_secs(3600))
        .await
        .unwrap();
    let b = cp
        .client("n2")
        .sign(&id(B), Duration::from_secs(3600))
        .await
        .unwrap();
    let bundle = TrustBundle::from_pem(&cp.bundle_pem()).unwrap();
    echo_over_mutual_tls(&a, &b, &bundle).await;
}

/// `client` completes the mutual TLS handshake HBONE runs (ferry_tls's client and server
/// configurations) with a server presenting `server`, each side verifying the other's identity,
/// and echoes through it.
async fn echo_over_mutual_tls(client: &Credentials, server: &Credentials, bundle: &TrustBundle) {
    let acceptor = TlsAcceptor::from(server_config(server, bundle).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let trust_domain = server.identity().trust_domain().to_owned();
    let served = tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let mut tls = acceptor
            .accept(tcp)
            .await
            .expect("server side of the handshake");
        let peer = peer_identity(tls.get_ref().1.peer_certificates(), &trust_domain)
            .expect("the client's identity");
        let cluster = peer_cluster(tls.get_ref().1.peer_certificates()).expect("readable");
        let mut b = [0u8; 5];
        tls.read_exact(&mut b).await.unwrap();
        tls.write_all(&b).await.unwrap();
        tls.flush().await.unwrap();
        (peer, cluster)
    });
    let config = client_config(client, bundle, vec![server.identity().clone()]).unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut t = TlsConnector::from(config)
        .connect(server_name(addr), tcp)
        .await
        .expect("handshake between two CA-issued identities");
    t.write_all(b"hello").await.unwrap();
    let mut back = [0u8; 5];
    t.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"hello");
    let (peer, cluster) = served.await.unwrap();
    assert_eq!(&peer, client.identity());
    // The server reads, from the certificate it verified, the cluster the CA bound into it.
    assert_eq!(
        cluster,
        ferry_tls::cluster::cluster_of(client.leaf()).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_carries_the_cluster_of_the_node_that_asked_for_it() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let a = cp
        .client("n1")
        .sign(&id(A), Duration::from_secs(3600))
        .await
        .unwrap();
    let d = cp
        .client("n3")
        .sign(&id(D), Duration::from_secs(3600))
        .await
        .unwrap();
    let cluster = |c: &Credentials| ferry_tls::cluster::cluster_of(c.leaf()).unwrap();
    assert_eq!(cluster(&a), Some(ClusterId::new("c")));
    assert_eq!(cluster(&d), Some(ClusterId::new("d")));
    // The `clusterid` header a client sends is not what decides: n3's client says "c" too.
    // And a CSR that asks for its own cluster extension is refused outright.
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::URI(D.try_into().unwrap())];
    params.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
        ferry_tls::cluster::CLUSTER_OID,
        ferry_tls::cluster::extension_value(&ClusterId::new("c")),
    )];
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    let token = cp.tokens.issue(&"n3".into());
    let refused = cp
        .raw(csr, None, Some(token))
        .await
        .expect_err("a CSR bringing its own cluster");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_send_one_csr() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let manager = CertManager::new(Arc::new(cp.client("n1")), ManagerConfig::default());
    let mut set = JoinSet::new();
    for _ in 0..50 {
        let m = manager.clone();
        set.spawn(async move { m.fetch(&id(A)).await.map(|c| c.identity().clone()) });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.unwrap().unwrap(), id(A));
    }
    assert_eq!(manager.requests(), 1);
}

/// Relays TCP to the CA; `cut` drops every relayed connection and stops listening.
/// A TCP relay to `to` that can be cut (its connections ended, new ones closed at once) and
/// restored. It keeps its port all along: released, the port could be given to another
/// socket of a test running alongside, and not be there to bind again.
struct Relay {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    _accepting: JoinSet<()>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (cut, _) = tokio::sync::watch::channel(false);
        let mut accepting = JoinSet::new();
        let cuts = cut.clone();
        accepting.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((mut a, _)) = l.accept().await {
                let mut cut = cuts.subscribe();
                if *cut.borrow_and_update() {
                    continue;
                }
                conns.spawn(async move {
                    let relayed = async {
                        if let Ok(mut b) = tokio::net::TcpStream::connect(to).await {
                            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                        }
                    };
                    tokio::select! {
                        () = relayed => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self {
            addr,
            cut,
            _accepting: accepting,
        }
    }

    fn cut(&mut self) {
        self.cut.send_replace(true);
    }

    fn restore(&mut self) {
        self.cut.send_replace(false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_ca_down_valid_certificates_keep_working_and_rotation_resumes() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let mut relay = Relay::start(cp.addr).await;
    let client = GrpcCa::new(
        &format!("https://{}", relay.addr),
        &cp.bundle_pem(),
        SERVER_NAME,
        cp.tokens.issue(&"n1".into()),
        "c".into(),
    )
    .unwrap();
    let config = ManagerConfig {
        lifetime: Duration::from_secs(60),
        refresh_fraction: 0.05, // refresh after ~3 s of a 60 s certificate
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        fetch_wait: Duration::from_secs(10),
    };
    let manager = CertManager::new(Arc::new(client), config);
    let first = manager.fetch(&id(A)).await.unwrap();
    let first_expiry = validity(&first).unwrap().1;
    relay.cut();
    // Refreshes start failing; the valid certificate keeps being served and keeps working.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while manager.requests() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refresh attempts while the CA is down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = manager.fetch(&id(A)).await.expect("still valid");
    assert_eq!(
        during.chain()[0],
        first.chain()[0],
        "the same certificate while the CA is away"
    );
    let b = cp
        .client("n2")
        .sign(&id(B), Duration::from_secs(3600))
        .await
        .unwrap();
    echo_over_mutual_tls(
        &during,
        &b,
        &TrustBundle::from_pem(&cp.bundle_pem()).unwrap(),
    )
    .await;
    // The CA returns: rotation resumes.
    relay.restore();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = manager.fetch(&id(A)).await.unwrap();
        if c.chain()[0] != first.chain()[0] {
            assert!(
                validity(&c).unwrap().1 >= first_expiry,
                "the new certificate lasts longer"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rotation did not resume"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_restarted_control_plane_keeps_its_trust_root_and_node_secret() {
    let dir = std::env::temp_dir().join(format!("ferry-ca-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = Ca::load_or_create(&dir, "cluster.local").unwrap();
    let tokens = NodeTokens::load_or_create(&dir.join("node-token.key")).unwrap();
    let token = tokens.issue(&"n1".into());
    let again = Ca::load_or_create(&dir, "cluster.local").unwrap();
    assert_eq!(first.cert_pem(), again.cert_pem());
    let csr = csr_for(A);
    assert!(
        again
            .sign(&csr, &id(A), &"c".into(), Duration::from_secs(60))
            .is_ok()
    );
    let tokens_again = NodeTokens::load_or_create(&dir.join("node-token.key")).unwrap();
    assert_eq!(tokens_again.verify(&token).unwrap().as_str(), "n1");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("ca-key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the CA key is readable only by its owner");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_rotation_reaches_nodes_with_their_next_certificate() {
    // Step 1 of a rotation: keep signing with the old root, distribute old + new roots.
    let new_root = Ca::generate("cluster.local").unwrap();
    let old = Ca::generate("cluster.local")
        .unwrap()
        .with_extra_roots([new_root.cert_pem().to_string()]);
    let cp = ControlPlane::start_with(old, Lifetimes::default()).await;
    let manager = CertManager::new(Arc::new(cp.client("n1")), ManagerConfig::default());
    let a = manager.fetch(&id(A)).await.unwrap();
    let bundle = manager
        .trust_bundle()
        .expect("bundle arrives with the certificate");
    assert_eq!(bundle.len(), 2, "old and new roots");
    // A peer already on the new root (step 2 elsewhere in the mesh) is trusted, and trusts us.
    let (b_csr, b_key) = ferry_tls::ca_client::new_csr(&id(B)).unwrap();
    let b_chain = new_root
        .sign(&b_csr, &id(B), &"c".into(), Duration::from_secs(3600))
        .unwrap();
    let b = ferry_tls::ca_client::credentials(&id(B), &b_chain, b_key).unwrap();
    echo_over_mutual_tls(&a, &b, &bundle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_is_reread_at_each_request() {
    let cp = ControlPlane::start(Lifetimes::default()).await;
    let file = std::env::temp_dir().join(format!("ferry-token-reread-{}", std::process::id()));
    std::fs::write(&file, cp.tokens.issue(&"n1".into())).unwrap();
    // Started with no usable token of its own: only the file's counts.
    let ca = GrpcCa::new(
        &format!("https://{}", cp.addr),
        &cp.bundle_pem(),
        SERVER_NAME,
        "stale".to_string(),
        "c".into(),
    )
    .unwrap()
    .with_token_file(file.clone());
    ca.sign(&id(A), Duration::from_secs(3600))
        .await
        .expect("a runs on n1, whose token the file holds");
    // The file is rotated (here: to another node's token); the next request sends the new one.
    std::fs::write(&file, format!("{}\n", cp.tokens.issue(&"n2".into()))).unwrap();
    ca.sign(&id(B), Duration::from_secs(3600))
        .await
        .expect("b runs on n2, whose token the file now holds");
    assert!(ca.sign(&id(A), Duration::from_secs(3600)).await.is_err());
    let _ = std::fs::remove_file(&file);
}
