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

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (pods, services) = if quick { (1_000, 100) } else { (10_000, 1_000) };
    let values: Vec<Vec<Value>> = (0..CLUSTERS)
        .map(|c| ferry_k8s::fixtures::generated(c, CLUSTERS, pods, services))
        .collect();
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
            if let Ok(ferry_k8s::watch::Mesh { topology: t, .. }) = o {
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
