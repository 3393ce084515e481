//! The Kubernetes source end to end at scale: a generated mesh of 10,000 pods and 1,000
//! services across 3 clusters served by in-process list/watch API servers (the local cluster
//! by kubeconfig, the other two by remote secret), read by `ferry control serve --cluster-id`
//! (`app::serve`, its production watch settings) and served over delta xDS to a node proxy's
//! client. Measures the initial sync, then the time from a watch event (a Pod added on an API
//! server) to the node proxy's applied snapshot holding it, and the live heap of the process
//! (API servers, control plane and node client together).
//!
//! Run: `cargo bench -p ferry-control --bench kube_event` (add `-- quick` for 1,000 pods;
//! `FERRY_KUBE_EVENT_PODS=N` for N pods and N/10 services).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_control::app::{Config, Listening, ServeLimits, Source};
use ferry_control::kube_source::KubeSource;
use ferry_control::source::WatchConfig;
use ferry_control::testing::Counting;
use ferry_core::store::Store;
use ferry_k8s::testing::ApiServer;
use ferry_xds::client::{ClientConfig, XdsClient};
use serde_json::json;

#[global_allocator]
static GLOBAL: Counting = Counting;

const CLUSTERS: usize = 3;
const EDITS: usize = 40;

fn mib(b: isize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn kubeconfig(server: &ApiServer, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: {name}, cluster: {{server: 'http://{}'}}}}]\nusers: [{{name: {name}, user: {{}}}}]\ncontexts: [{{name: {name}, context: {{cluster: {name}, user: {name}}}}}]\ncurrent-context: {name}\n",
        server.addr
    )
}

/// Polls `store` every millisecond until `cond` holds of its snapshot.
async fn until(store: &Store, cond: impl Fn(&ferry_core::snapshot::Snapshot) -> bool) {
    let end = Instant::now() + Duration::from_secs(600);
    while !cond(&store.load()) {
        assert!(Instant::now() < end, "the node proxy never got there");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let sized = std::env::var("FERRY_KUBE_EVENT_PODS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let (pods, services) = match sized {
        Some(n) => (n, (n / 10).max(1)),
        None if quick => (1_000, 100),
        None => (10_000, 1_000),
    };
    let total = pods / CLUSTERS * CLUSTERS;
    let dir = std::env::temp_dir().join(format!("ferry-kube-event-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let base = Counting::live();
        let mut servers = Vec::new();
        for c in 0..CLUSTERS {
            let items = ferry_k8s::fixtures::generated(c, CLUSTERS, pods, services);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            servers.push(ApiServer::serve(listener, items).unwrap());
        }
        let served = Counting::live();
        let local = dir.join("c0.kubeconfig");
        std::fs::write(&local, kubeconfig(&servers[0], "c0")).unwrap();
        let mut secrets = Vec::new();
        for (c, server) in servers.iter().enumerate().skip(1) {
            let name = format!("c{c}");
            let secret = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("istio-remote-secret-{name}"), "namespace": "istio-system",
                             "labels": {"istio/multiCluster": "true"}},
                "stringData": {&name: kubeconfig(server, &name)}});
            let path = dir.join(format!("{name}.secret.yaml"));
            std::fs::write(&path, serde_yaml_ng::to_string(&secret).unwrap()).unwrap();
            secrets.push(path);
        }
        let config = Config {
            source: Source::Kubernetes(Box::new(KubeSource {
                cluster_id: "c0".into(),
                network: None,
                kubeconfig: Some(local),
                remote_secrets: secrets,
                remote_secrets_namespace: None,
                lease: None,
                mesh: ferry_k8s::MeshConfig::default(),
                initial_sync: Duration::from_secs(300),
            })),
            state_dir: dir.join("state"),
            listen: "127.0.0.1:0".parse().unwrap(),
            ca: None,
            extra_roots: None,
            max_lifetime: Duration::from_secs(3600),
            metrics_listen: "127.0.0.1:0".parse().unwrap(),
            plaintext: true,
            watch: WatchConfig::default(),
            limits: ServeLimits::default(),
            k8s: Default::default(),
            server_names: vec![],
        };
        let started = Instant::now();
        let (tx, rx) = tokio::sync::oneshot::channel::<Listening>();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let plane = tokio::spawn(async move {
            ferry_control::app::serve(
                &config,
                |l| {
                    let _ = tx.send(*l);
                },
                async move {
                    let _ = stop.await;
                },
            )
            .await
            .unwrap();
        });
        let listening = rx.await.unwrap();
        let store = Arc::new(Store::default());
        let client = XdsClient::new(
            ClientConfig {
                endpoint: format!("http://{}", listening.addr),
                bundle_pem: String::new(),
                server_name: "ferry-control".into(),
                token: String::new(),
                cluster: "c0".into(),
                node_id: "ferry~c0-node-0".into(),
                plaintext: true,
                backoff_initial: Duration::from_millis(20),
                backoff_max: Duration::from_millis(200),
            },
            store.clone(),
        );
        let node = tokio::spawn(client.run());
        until(&store, |s| s.workloads().count() == total).await;
        println!(
            "{pods} pods / {services} services / {CLUSTERS} clusters: lists, translation and the node proxy's initial sync in {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        println!(
            "live heap: API servers' objects {:.1} MiB; control plane (watch stores, mesh, resources) and node proxy client {:.1} MiB",
            mib(served - base),
            mib(Counting::live() - served)
        );
        let mut lat = Vec::new();
        for i in 0..EDITS {
            let name = format!("added-{i}");
            let c = i % CLUSTERS;
            let t = Instant::now();
            servers[c].apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns0", "labels": {"app": "app-0"}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
                "spec": {"nodeName": format!("c{c}-node-0"), "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x"}]},
                "status": {"phase": "Running", "podIP": format!("10.200.{c}.{}", i + 1), "conditions": [{"type": "Ready", "status": "True"}]}}));
            // Looked up by its uid: a scan of every workload each millisecond would take a
            // core from the control plane at 100,000 pods.
            let uid = ferry_core::model::WorkloadUid::new(format!("c{c}//v1/Pod/ns0/{name}"));
            until(&store, |s| s.workload(&uid).is_some()).await;
            lat.push(t.elapsed());
            // Edits apart, as pods start: each is measured alone.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        lat.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "watch event (a Pod added) to the node proxy's applied snapshot: p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms over {EDITS} edits",
            ms(lat[lat.len() / 2]),
            ms(lat[lat.len() * 9 / 10]),
            ms(lat[lat.len() - 1])
        );
        node.abort();
        let _ = shutdown.send(());
        let _ = plane.await;
        for s in servers {
            s.stop();
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
