//! The Kubernetes translation at scale: objects per second and heap for a generated mesh of
//! 10,000 pods and 1,000 services across 3 clusters, and the time from an API server's watch
//! event to the translated mesh (the in-process list/watch server, the real kube-rs client).
//!
//! Run: `cargo bench -p ferry-k8s --bench translate` (add `-- quick` for 1,000 pods).

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use ferry_k8s::{ClusterObjects, MeshConfig, translate};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tokio::sync::watch;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

const CLUSTERS: usize = 3;

/// The objects of cluster `c` of a mesh of `pods` pods and `services` services in all: one
/// node per 100 pods, 10 namespaces, services selecting 10 pods each, one policy per service.
fn objects(c: usize, pods: usize, services: usize) -> Vec<Value> {
    let cluster = format!("c{c}");
    let mut out = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "istio-system", "labels": {"topology.istio.io/network": "flat"}}})];
    for ns in 0..10 {
        out.push(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("ns{ns}"), "labels": {"istio.io/dataplane-mode": "ambient"}}}));
    }
    let pods = pods / CLUSTERS;
    let services = services / CLUSTERS;
    for n in 0..pods.div_ceil(100) {
        out.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("{cluster}-node-{n}"), "labels": {"topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": format!("z{}", n % 3)}}}));
    }
    for p in 0..pods {
        let ip = format!("10.{}.{}.{}", 64 + c, p / 250, p % 250 + 1);
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{p}"), "namespace": format!("ns{}", p % 10), "labels": {"app": format!("app-{}", (p / 10) % services.max(1))}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
            "spec": {"nodeName": format!("{cluster}-node-{}", p / 100), "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x"}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}));
    }
    for s in 0..services {
        let ip = format!("10.{}.{}.{}", 96 + c, s / 250, s % 250 + 1);
        for ns in 0..10 {
            if s % 10 != ns {
                continue;
            }
            out.push(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{s}"), "namespace": format!("ns{ns}"), "labels": {"istio.io/global": "true"}},
                "spec": {"clusterIP": ip, "ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": format!("app-{s}")}}}));
            out.push(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                "metadata": {"name": format!("allow-{s}"), "namespace": format!("ns{ns}")},
                "spec": {"selector": {"matchLabels": {"app": format!("app-{s}")}}, "action": "ALLOW",
                         "rules": [{"from": [{"source": {"namespaces": [format!("ns{ns}")]}}], "to": [{"operation": {"ports": ["8080"]}}]}]}}));
        }
    }
    out
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (pods, services) = if quick { (1_000, 100) } else { (10_000, 1_000) };
    let values: Vec<Vec<Value>> = (0..CLUSTERS).map(|c| objects(c, pods, services)).collect();
    let count: usize = values.iter().map(Vec::len).sum();

    // Decoding (what the watch layer does on every translation) and translating.
    let mut runs = Vec::new();
    let mut heap = 0;
    for _ in 0..5 {
        let before = live();
        let start = Instant::now();
        let clusters: Vec<ClusterObjects> = values
            .iter()
            .enumerate()
            .map(|(c, vs)| {
                let mut co = ClusterObjects::new(format!("c{c}"));
                let mut notes = Vec::new();
                for v in vs {
                    co.add_value(v.clone(), &mut notes);
                }
                co
            })
            .collect();
        let (topology, notes) = translate(&MeshConfig::default(), &clusters)
            .into_topology()
            .expect("a valid mesh");
        runs.push(start.elapsed());
        heap = live() - before;
        assert!(notes.is_empty(), "{:?}", &notes[..notes.len().min(3)]);
        assert_eq!(
            topology.snapshot.workloads().count(),
            pods / CLUSTERS * CLUSTERS
        );
        drop((clusters, topology));
    }
    runs.sort();
    let median = runs[runs.len() / 2];
    println!(
        "translate {pods} pods / {services} services / {CLUSTERS} clusters: {count} objects in {:.0} ms (median of 5) = {:.0} objects/s; heap held by objects + mesh {:.1} MiB",
        median.as_secs_f64() * 1e3,
        count as f64 / median.as_secs_f64(),
        heap as f64 / (1 << 20) as f64
    );

    // A watch event to the translated mesh.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut servers = Vec::new();
        for vs in &values {
            let list = serde_yaml_ng::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": vs})).unwrap();
            servers.push(ApiServer::start(&[&list]).await);
        }
        let clusters = servers
            .iter()
            .enumerate()
            .map(|(c, s)| Cluster { id: format!("c{c}"), network: None, client: s.client() })
            .collect();
        let (tx, mut meshes) = watch::channel::<Option<Arc<ferry_core::snapshot::Snapshot>>>(None);
        let (status, _) = watch::channel(WatchStatus::default());
        let debounce = Duration::from_millis(10);
        let config = WatchConfig { debounce, ..WatchConfig::default() };
        let task = tokio::spawn(run(clusters, config, status, move |o| {
            if let Ok((t, _)) = o {
                tx.send_replace(Some(Arc::new(t.snapshot)));
            }
        }));
        let started = Instant::now();
        meshes.wait_for(|m| m.as_ref().is_some_and(|s| s.workloads().count() == pods / CLUSTERS * CLUSTERS)).await.unwrap();
        println!("initial list and translation over the API: {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
        let mut lat = Vec::new();
        for i in 0..20 {
            let name = format!("added-{i}");
            let t = Instant::now();
            servers[i % CLUSTERS].apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns0", "labels": {"app": "app-0"}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
                "spec": {"nodeName": format!("c{}-node-0", i % CLUSTERS), "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x"}]},
                "status": {"phase": "Running", "podIP": format!("10.200.0.{}", i + 1), "conditions": [{"type": "Ready", "status": "True"}]}}));
            meshes.wait_for(|m| m.as_ref().is_some_and(|s| s.workloads().any(|w| w.name == name))).await.unwrap();
            lat.push(t.elapsed());
        }
        lat.sort();
        println!(
            "watch event to translated mesh (debounce {} ms): p50 {:.0} ms, p99 {:.0} ms over {} edits",
            debounce.as_millis(),
            lat[lat.len() / 2].as_secs_f64() * 1e3,
            lat[lat.len() - 1].as_secs_f64() * 1e3,
            lat.len()
        );
        task.abort();
        for s in servers {
            s.stop();
        }
    });
}
