//! xDS at scale: initial sync time and bytes, one-workload edit latency, memory.
//!
//! Run: `cargo bench -p ferry-control --bench sync` (add `-- quick` to skip the 100,000 case).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_control::ca::signer::Ca;
use ferry_control::ca::token::NodeTokens;
use ferry_control::testing::Counting;
use ferry_control::xds_server::XdsServer;
use ferry_core::model::{PortMapping, ServiceScope};
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_xds::client::{ClientConfig, XdsClient};
use ferry_xds::resources::Versioned;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::{Server, ServerTlsConfig};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn mesh(workloads: usize, services: usize) -> ferry_core::snapshot::Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.gateway("gw-east", "east", "198.18.255.1")
        .gateway("gw-west", "west", "198.19.255.1");
    for n in 0..100 {
        m.node(
            &format!("node{n}"),
            if n % 2 == 0 { "east" } else { "west" },
            &format!("r{}/z{}/s", n % 2, n % 4),
        );
    }
    let keys: Vec<_> = (0..services)
        .map(|s| {
            let net = ["net-east", "net-west"];
            let a = format!("198.{}.{}.{}", 18 + (s % 2), 200 + s / 250, s % 250 + 1);
            let svc = m.service(&format!("svc{s}"), &[(net[s % 2], a.as_str())], 80, 8080);
            svc.scope = if s % 2 == 0 {
                ServiceScope::global()
            } else {
                ServiceScope::local()
            };
            svc.key()
        })
        .collect();
    for i in 0..workloads {
        let n = i % 100;
        // Pods alternate networks with their nodes; up to 50,000 per network, below the VIPs.
        let j = i / 2;
        let a = format!("198.{}.{}.{}", 18 + (n % 2), j / 250, j % 250 + 1);
        let w = m.pod(&format!("pod{i}"), &format!("node{n}"), &a);
        w.services.make_mut().insert(
            keys[i % services].clone(),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        );
    }
    m.build()
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        run(10_000, 1_000).await;
        if !quick {
            run(100_000, 1_000).await;
        }
    });
}

async fn run(workloads: usize, services: usize) {
    let snap = mesh(workloads, services);
    let heap0 = Counting::live();
    let set = ferry_control::flatten::resource_set(&snap);
    let server_heap = Counting::live() - heap0;
    let bytes: usize = set
        .by_type
        .values()
        .flat_map(|t| t.values())
        .map(|v| v.body.len())
        .sum();
    drop(snap);
    let ca = Ca::generate("cluster.local").unwrap();
    let tokens = Arc::new(NodeTokens::from_secret(&[1; 32]));
    let (tx, rx) = watch::channel(Arc::new(set));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (chain, key) = ca
        .issue_server_cert(
            &["ferry-control".into()],
            &[addr.ip()],
            Duration::from_secs(3600),
        )
        .unwrap();
    let router = Server::builder()
        .tls_config(
            ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(chain, key)),
        )
        .unwrap()
        .add_service(XdsServer::new(rx, Some(tokens.clone())).into_server());
    tokio::spawn(router.serve_with_incoming(
        tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true)),
    ));

    let heap1 = Counting::live();
    let store = Arc::new(Store::default());
    let client = XdsClient::new(
        ClientConfig {
            endpoint: format!("https://{addr}"),
            bundle_pem: ca.bundle().concat(),
            server_name: "ferry-control".into(),
            token: tokens.issue(&"node0".into()),
            cluster: "east".into(),
            node_id: "ferry~node0".into(),
            plaintext: false,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        },
        store.clone(),
    );
    let mut ready = client.ready();
    let start = Instant::now();
    tokio::spawn(client.clone().run());
    ready.wait_for(|r| *r).await.unwrap();
    let sync = start.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await; // let transient buffers drain before measuring
    let client_heap = Counting::live() - heap1;
    assert_eq!(store.load().workloads().count(), workloads);

    // One-workload edits: change pod0's capacity, watch it land.
    let mut lat = Vec::new();
    for round in 0..50u32 {
        let mut next = (**tx.borrow()).clone();
        let t = next.by_type.get_mut(ferry_api::ADDRESS_TYPE).unwrap();
        let name = "east//v1/Pod/default/pod0".to_string();
        let mut a = ferry_api::workload::Address::decode(t[&name].body.as_slice()).unwrap();
        if let Some(ferry_api::workload::address::Type::Workload(w)) = &mut a.r#type {
            w.capacity = Some(100 + round);
        }
        t.insert(name, Versioned::new(a.encode_to_vec()));
        let started = Instant::now();
        tx.send_replace(Arc::new(next));
        let uid = ferry_core::model::WorkloadUid::new("east//v1/Pod/default/pod0");
        while store.load().workload(&uid).map(|w| w.capacity) != Some(100 + round) {
            tokio::task::yield_now().await;
        }
        lat.push(started.elapsed());
    }
    lat.sort();
    println!(
        "{workloads} workloads, {services} services: initial sync {:.0} ms, {:.1} MiB of resources; \
         one-workload edit applied p50 {:.1} ms p99 {:.1} ms; heap: server resource set {:.1} MiB, client {:.1} MiB",
        sync.as_secs_f64() * 1e3,
        mib(bytes as isize),
        lat[lat.len() / 2].as_secs_f64() * 1e3,
        lat[lat.len() * 99 / 100].as_secs_f64() * 1e3,
        mib(server_heap),
        mib(client_heap),
    );
}
