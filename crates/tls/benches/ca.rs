//! The CA's throughput and the time from a pod's first connection to a usable certificate.
//!
//! Run: `cargo bench -p ferry-tls --bench ca`

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_control::ca::service::{CaService, Lifetimes};
use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_core::identity::Identity;
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_tls::ca_client::{CertificateSource, GrpcCa, new_csr};
use ferry_tls::certs::{CertManager, ManagerConfig};
use tokio::net::TcpListener;
use tonic::transport::{Server, ServerTlsConfig};

const PODS: usize = 2000;

fn ident(i: usize) -> Identity {
    format!("spiffe://cluster.local/ns/default/sa/pod{i}")
        .parse()
        .unwrap()
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let ca = Arc::new(Ca::generate("cluster.local").unwrap());

    // 1. Signing alone (CSR parse, checks, sign), one core.
    let n = 1000;
    let csrs: Vec<(String, Identity)> = (0..n)
        .map(|i| (new_csr(&ident(i)).unwrap().0, ident(i)))
        .collect();
    let start = Instant::now();
    for (csr, id) in &csrs {
        ca.sign(csr, id, &"c".into(), Duration::from_secs(3600))
            .unwrap();
    }
    let local = n as f64 / start.elapsed().as_secs_f64();

    // 2. Over gRPC + TLS, keys and CSRs made by the client, 16 requests in flight.
    let mut m = MeshBuilder::new();
    m.cluster("c", "net").node("n1", "c", "r/z/s");
    for i in 0..PODS {
        m.pod(
            &format!("pod{i}"),
            "n1",
            &format!("198.18.{}.{}", i / 200, i % 200 + 1),
        );
    }
    let store = Arc::new(Store::new(m.build()));
    let tokens = Arc::new(NodeTokens::from_secret(&[9; 32]));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (chain, key) = ca
        .issue_server_cert(
            &["ferry-control".into()],
            &[addr.ip()],
            Duration::from_secs(3600),
        )
        .unwrap();
    let svc = CaService::new(ca.clone(), tokens.clone(), store, Lifetimes::default()).into_server();
    let server = Server::builder()
        .tls_config(
            ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(chain, key)),
        )
        .unwrap()
        .add_service(svc);
    tokio::spawn(server.serve_with_incoming(
        tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true)),
    ));
    let client = GrpcCa::new(
        &format!("https://{addr}"),
        &ca.bundle().concat(),
        "ferry-control",
        tokens.issue(&"n1".into()),
        "c".into(),
    )
    .unwrap();
    client
        .sign(&ident(0), Duration::from_secs(3600))
        .await
        .unwrap(); // connect
    let n = 1000;
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..16 {
        let (client, next) = (client.clone(), next.clone());
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                client
                    .sign(&ident(i), Duration::from_secs(3600))
                    .await
                    .unwrap();
            }
        });
    }
    while set.join_next().await.is_some() {}
    let grpc = n as f64 / start.elapsed().as_secs_f64();

    // 3. A pod's first connection: the manager has nothing yet for its identity.
    let manager = CertManager::new(Arc::new(client), ManagerConfig::default());
    let mut lat = Vec::new();
    for i in 1000..1300 {
        let t = Instant::now();
        manager.fetch(&ident(i)).await.unwrap();
        lat.push(t.elapsed());
    }
    let cached = {
        let t = Instant::now();
        for _ in 0..10_000 {
            manager.fetch(&ident(1000)).await.unwrap();
        }
        t.elapsed() / 10_000
    };
    println!("CA signing in process        {local:.0} certificates/s (one core)");
    println!(
        "CA over gRPC+TLS, 16 in flight {grpc:.0} certificates/s (client keygen + CSR included)"
    );
    println!(
        "first connection -> usable certificate: p50 {:.2} ms, p99 {:.2} ms; later connections (cached) {:.2} us",
        pct(&mut lat, 0.5).as_secs_f64() * 1e3,
        pct(&mut lat, 0.99).as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e6
    );
}
