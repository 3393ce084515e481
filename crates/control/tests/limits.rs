//! What a client may cost the control plane, served as `ferry control serve` serves it (in
//! process, TLS, on loopback): the CA judges the credential from the headers before decoding a
//! body, certificate requests are small, and streams per connection and connections per peer
//! are capped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ferry_api::citadel::IstioCertificateRequest;
use ferry_api::citadel::istio_certificate_service_client::IstioCertificateServiceClient;
use ferry_control::app::{Config, Listening, ServeLimits};
use ferry_control::ca::service::MAX_REQUEST_BYTES;
use ferry_control::source::WatchConfig;
use tokio::io::AsyncReadExt as _;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const SLEEP: &str = "spiffe://cluster.local/ns/default/sa/sleep";

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/two-clusters.yaml")
}

/// A state directory removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Served {
    listening: Listening,
    bundle: String,
    token: String,
    _dir: Dir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(tag: &str, plaintext: bool, limits: ServeLimits) -> Served {
    let dir = Dir(std::env::temp_dir().join(format!("ferry-limits-{}-{tag}", std::process::id())));
    let config = Config {
        source: ferry_control::app::Source::File(example()),
        state_dir: dir.0.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ca: None,
        extra_roots: None,
        max_lifetime: Duration::from_secs(3600),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        plaintext,
        watch: WatchConfig::default(),
        limits,
        k8s: Default::default(),
        server_names: vec![],
    };
    let bundle = ferry_control::app::bundle(&dir.0, "cluster.local").unwrap();
    let token = ferry_control::app::node_token(&dir.0, "east-1").unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        ferry_control::app::serve(
            &config,
            |l| {
                let _ = tx.send(*l);
            },
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    let listening = tokio::time::timeout(Duration::from_secs(20), rx)
        .await
        .unwrap()
        .unwrap();
    Served {
        listening,
        bundle,
        token,
        _dir: dir,
        task,
    }
}

async fn channel(s: &Served) -> Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&s.bundle))
        .domain_name("ferry-control");
    Endpoint::from_shared(format!("https://{}", s.listening.addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn csr(identity: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::URI(identity.try_into().unwrap()));
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn request(csr: String, token: Option<&str>) -> tonic::Request<IstioCertificateRequest> {
    let mut req = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata: None,
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    req
}

/// The value of counter `name` on the metrics endpoint.
async fn counter(metrics: SocketAddr, name: &str) -> u64 {
    let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
        .unwrap_or_else(|| panic!("{name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_is_judged_before_the_body_and_bodies_are_small() {
    let s = serve("ca", false, ServeLimits::default()).await;
    let mut ca =
        IstioCertificateServiceClient::new(channel(&s).await).max_encoding_message_size(usize::MAX);
    let metrics = s.listening.metrics_addr;
    // No credential and a 4 MiB body: refused from the headers. Were the body decoded first, the
    // answer would be OutOfRange (it is over the limit) and the decoded count would move.
    let big = "A".repeat(4 << 20);
    let status = ca
        .create_certificate(request(big.clone(), None))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("no node credential"),
        "{status:?}"
    );
    let forged = "ferry-node.v1.east-1.00";
    let status = ca
        .create_certificate(request(big.clone(), Some(forged)))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert_eq!(
        counter(metrics, "ferry_ca_requests").await,
        0,
        "no body decoded"
    );
    assert_eq!(counter(metrics, "ferry_ca_refused").await, 2);
    // With a credential, a body over the limit is refused from its length prefix.
    let status = ca
        .create_certificate(request("A".repeat(MAX_REQUEST_BYTES + 1), Some(&s.token)))
        .await
        .expect_err("too large");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert_eq!(counter(metrics, "ferry_ca_requests").await, 0);
    // And a real request still gets its certificate.
    let chain = ca
        .create_certificate(request(csr(SLEEP), Some(&s.token)))
        .await
        .expect("signed")
        .into_inner()
        .cert_chain;
    assert!(!chain.is_empty());
    assert_eq!(counter(metrics, "ferry_ca_requests").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_are_advertised_and_connections_per_peer_capped() {
    let limits = ServeLimits {
        streams_per_connection: 7,
        connections_per_peer: 2,
        ..ServeLimits::default()
    };
    let s = serve("conns", true, limits).await;
    // HTTP/2 without TLS (plaintext mode): the server's SETTINGS carry the stream cap.
    let tcp = tokio::net::TcpStream::connect(s.listening.addr)
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let h2 = h2.ready().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h2.current_max_send_streams() != 7 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "max streams {}",
            h2.current_max_send_streams()
        );
        // The connection task applies the server's SETTINGS when they arrive.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two connections are open from 127.0.0.1 (the h2 one above and this one): a third is
    // closed as soon as it is accepted.
    let _second = tokio::net::TcpStream::connect(s.listening.addr)
        .await
        .unwrap();
    let mut third = tokio::net::TcpStream::connect(s.listening.addr)
        .await
        .unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
        .await
        .expect("closed, not left open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(
        counter(
            s.listening.metrics_addr,
            "ferry_control_connections_refused"
        )
        .await,
        1
    );
}
