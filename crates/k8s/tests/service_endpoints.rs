//! Where a Service's connections land, read through the watch from an in-process API server
//! (`ferry_k8s::testing`, the real kube-rs client over a real socket) and decided by
//! `core::route`:
//! - a Service without a selector is backed by the addresses of its EndpointSlices, each on the
//!   slice's port of the Service port's name, its readiness honoured;
//! - a `targetPort` given by name is each pod's own container port of that name.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, route};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::Note;
use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::{Value, json};
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);

/// The fixtures' cluster alpha, watched alone.
struct Rig {
    alpha: Arc<ApiServer>,
    meshes: watch::Receiver<Option<(Arc<Snapshot>, Vec<Note>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
        self.alpha.stop();
    }
}

impl Rig {
    async fn start() -> Self {
        let fixture = std::fs::read_to_string(format!(
            "{}/tests/fixtures/two-clusters/alpha.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let alpha = ApiServer::start(&[&fixture]).await;
        let clusters = vec![Cluster {
            id: "alpha".into(),
            network: None,
            client: alpha.client(),
        }];
        let (mesh_tx, meshes) = watch::channel(None);
        let (status_tx, _status) = watch::channel(WatchStatus::default());
        let task = tokio::spawn(run(clusters, WatchConfig::default(), status_tx, move |o| {
            if let Ok(ferry_k8s::watch::Mesh {
                topology: t,
                notes: n,
                ..
            }) = o
            {
                mesh_tx.send_replace(Some((Arc::new(t.snapshot), n)));
            }
        }));
        Self {
            alpha,
            meshes,
            task,
        }
    }

    /// Waits (on change events, within the deadline) for a mesh that satisfies `what`.
    async fn until(
        &mut self,
        why: &str,
        what: impl Fn(&Snapshot, &[Note]) -> bool,
    ) -> (Arc<Snapshot>, Vec<Note>) {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some((s, n)) = self.meshes.borrow_and_update().clone()
                    && what(&s, &n)
                {
                    return (s, n);
                }
                self.meshes.changed().await.expect("the watch runs");
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no mesh where {why} within {DEADLINE:?}"))
    }
}

/// Every (workload name, port) new connections from sleep to `to` land on, over many seeds;
/// empty when none routes.
fn landings(snap: &Snapshot, to: &str) -> BTreeSet<(String, u16)> {
    let sleep = snap.workloads().find(|w| w.name == "sleep").unwrap();
    let to = Destination::Addr(to.parse().unwrap());
    (0..64)
        .filter_map(|seed| {
            let d = route(snap, Source::new(sleep), &to, &mut SplitMix64::new(seed));
            let plan = d.outcome.ok()?;
            let w = snap
                .workloads()
                .find(|w| Some(&w.uid) == plan.landing.as_ref())?;
            Some((w.name.clone(), plan.landing_port))
        })
        .collect()
}

fn set(items: &[(&str, u16)]) -> BTreeSet<(String, u16)> {
    items.iter().map(|(n, p)| ((*n).to_string(), *p)).collect()
}

/// The EndpointSlice `db-1` of Service `db`, with these endpoints.
fn slice(endpoints: Value) -> Value {
    let mut slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "db-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "pg", "port": 6432, "protocol": "TCP"}],
    });
    slice["endpoints"] = endpoints;
    slice
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_a_selector_is_backed_by_its_endpoint_slices_addresses() {
    let mut r = Rig::start().await;
    r.until("alpha is in", |s, _| {
        s.workloads().any(|w| w.name == "sleep")
    })
    .await;
    r.alpha.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": "198.18.10.50", "clusterIPs": ["198.18.10.50"],
                 "ports": [{"name": "pg", "port": 5432, "targetPort": 5432, "protocol": "TCP"},
                           {"name": "admin", "port": 81, "targetPort": 9000, "protocol": "TCP"}]},
    }));
    r.alpha.apply(slice(json!([
        {"addresses": ["198.18.9.1"], "conditions": {"ready": true}, "nodeName": "alpha-1"},
        {"addresses": ["198.18.9.2"], "conditions": {"ready": false}},
    ])));
    let (s, notes) = r
        .until("the slice's addresses are workloads", |s, _| {
            s.workloads()
                .filter(|w| w.name.starts_with("db-1-"))
                .count()
                == 2
        })
        .await;
    assert!(
        !notes.iter().any(|n| n.object.contains("db")),
        "read, not left out: {notes:?}"
    );
    let ready = s.workloads().find(|w| w.name == "db-1-198-18-9-1").unwrap();
    assert_eq!(
        ready.uid.to_string(),
        "alpha/discovery.k8s.io/EndpointSlice/default/db-1/198.18.9.1",
        "istiod's uid for an EndpointSlice workload"
    );
    assert_eq!(
        ready.node.as_ref().map(ToString::to_string).as_deref(),
        Some("alpha-1")
    );
    // The slice's port of the Service port's name; the unready address takes nothing.
    assert_eq!(
        landings(&s, "198.18.10.50:5432"),
        set(&[("db-1-198-18-9-1", 6432)])
    );
    // A Service port no slice port names keeps the Service's target.
    assert_eq!(
        landings(&s, "198.18.10.50:81"),
        set(&[("db-1-198-18-9-1", 9000)])
    );

    // The second address becomes ready, and an endpoint names a pod: all three take
    // connections, the pod on the slice's port too.
    r.alpha.apply(slice(json!([
        {"addresses": ["198.18.9.1"], "conditions": {"ready": true}, "nodeName": "alpha-1"},
        {"addresses": ["198.18.9.2"], "conditions": {"ready": true}},
        {"addresses": ["198.18.1.20"], "conditions": {"ready": true}, "nodeName": "alpha-1",
         "targetRef": {"kind": "Pod", "namespace": "default", "name": "echo-alpha-1", "uid": "0000-echo-alpha-1"}},
    ])));
    let (s, _) = r
        .until("the three endpoints take connections", |s, _| {
            landings(s, "198.18.10.50:5432").len() == 3
        })
        .await;
    assert_eq!(
        landings(&s, "198.18.10.50:5432"),
        set(&[
            ("db-1-198-18-9-1", 6432),
            ("db-1-198-18-9-2", 6432),
            ("echo-alpha-1", 6432)
        ])
    );

    // The slice deleted: no endpoint is left.
    r.alpha
        .delete("discovery.k8s.io/v1", "EndpointSlice", "default/db-1");
    let (s, _) = r
        .until("the slice's workloads are gone", |s, _| {
            !s.workloads().any(|w| w.name.starts_with("db-1-"))
        })
        .await;
    assert!(landings(&s, "198.18.10.50:5432").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_target_port_is_each_pods_own_port_of_that_name() {
    let mut r = Rig::start().await;
    r.until("alpha is in", |s, _| {
        s.workloads().any(|w| w.name == "sleep")
    })
    .await;
    r.alpha.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": "198.18.10.60", "clusterIPs": ["198.18.10.60"],
                 "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}]},
    }));
    let pod = |name: &str, ip: &str, port: Option<u16>| {
        let ports = match port {
            Some(p) => json!([{"name": "web", "containerPort": p, "protocol": "TCP"}]),
            None => json!([{"name": "other", "containerPort": 7000, "protocol": "TCP"}]),
        };
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"nodeName": "alpha-1", "serviceAccountName": "web",
                     "containers": [{"name": "app", "image": "x", "ports": ports}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        })
    };
    r.alpha.apply(pod("web-1", "198.18.1.61", Some(8080)));
    r.alpha.apply(pod("web-2", "198.18.1.62", Some(9090)));
    r.alpha.apply(pod("web-3", "198.18.1.63", None));
    let (s, _) = r
        .until("the three pods are in", |s, _| {
            s.workloads().filter(|w| w.name.starts_with("web-")).count() == 3
        })
        .await;
    // Each pod on its own port of that name; the pod without one serves nothing of it.
    assert_eq!(
        landings(&s, "198.18.10.60:80"),
        set(&[("web-1", 8080), ("web-2", 9090)])
    );

    // A pod's port renumbered: its connections follow.
    r.alpha.apply(pod("web-2", "198.18.1.62", Some(9191)));
    let (s, _) = r
        .until("web-2's new port is used", |s, _| {
            landings(s, "198.18.10.60:80").contains(&("web-2".to_string(), 9191))
        })
        .await;
    assert_eq!(
        landings(&s, "198.18.10.60:80"),
        set(&[("web-1", 8080), ("web-2", 9191)])
    );
}
