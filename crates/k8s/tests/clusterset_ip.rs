//! A ClusterSetIP Ferry allocates is kept in a `ServiceImport` of every cluster (as the MCS API
//! keeps it), read back by a control plane started later, so the address stays the same
//! across restarts; the imports go once the service is no longer exported. Against two
//! in-process API servers (`ferry_k8s::testing`) driven by the real kube-rs client.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::ServiceKey;
use ferry_core::snapshot::Snapshot;
use ferry_k8s::MeshConfig;
use ferry_k8s::fixtures::two_clusters as fixture;
use ferry_k8s::testing::ApiServer;
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);
const MCS: &str = "multicluster.x-k8s.io/v1alpha1";

/// A control plane's watch over `servers` (alpha, beta), allocating from `cidr`; its meshes.
struct Plane {
    meshes: watch::Receiver<Option<Arc<Snapshot>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Plane {
    fn start(alpha: &ApiServer, beta: &ApiServer, cidr: (Ipv4Addr, u8)) -> Self {
        let clusters = vec![
            Cluster {
                id: "alpha".into(),
                network: None,
                client: alpha.client(),
            },
            Cluster {
                id: "beta".into(),
                network: None,
                client: beta.client(),
            },
        ];
        let config = WatchConfig {
            mesh: MeshConfig {
                clusterset_cidr: cidr,
                ..MeshConfig::default()
            },
            ..WatchConfig::default()
        };
        let (mesh_tx, meshes) = watch::channel(None);
        let (status_tx, _status) = watch::channel(WatchStatus::default());
        let task = tokio::spawn(run(clusters, config, status_tx, move |o| {
            if let Ok(ferry_k8s::watch::Mesh { topology: t, .. }) = o {
                mesh_tx.send_replace(Some(Arc::new(t.snapshot)));
            }
        }));
        Self { meshes, task }
    }

    /// The addresses of `ledger.default.svc.clusterset.local`, once it has some.
    async fn clusterset_ips(&mut self) -> Vec<IpAddr> {
        let key = ServiceKey::new("default", "ledger.default.svc.clusterset.local");
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(s) = self.meshes.borrow_and_update().clone()
                    && let Some(svc) = s.service(&key)
                    && !svc.vips.is_empty()
                {
                    let mut ips: Vec<IpAddr> = svc.vips.iter().map(|v| v.ip).collect();
                    ips.sort_unstable();
                    ips.dedup();
                    return ips;
                }
                self.meshes.changed().await.expect("the watch runs");
            }
        })
        .await;
        found.expect("the cluster-set service has addresses")
    }
}

/// Polls `server`'s ServiceImport `default/ledger` until `what` holds for it, within the
/// deadline.
async fn import_until(
    server: &ApiServer,
    why: &str,
    what: impl Fn(Option<&serde_json::Value>) -> bool,
) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !what(server.get(MCS, "ServiceImport", "default/ledger").as_ref()) {
        assert!(tokio::time::Instant::now() < end, "no import where {why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocated_clusterset_ip_survives_a_restart_and_goes_with_the_export() {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    let export = json!({"apiVersion": MCS, "kind": "ServiceExport",
                        "metadata": {"name": "ledger", "namespace": "default"}});
    alpha.apply(export.clone());
    beta.apply(export);

    let first_range = (Ipv4Addr::new(240, 240, 0, 0), 16);
    let mut plane = Plane::start(&alpha, &beta, first_range);
    let ips = plane.clusterset_ips().await;
    let [IpAddr::V4(ip)] = ips.as_slice() else {
        panic!("one allocated address on both networks: {ips:?}")
    };
    assert_eq!(&ip.octets()[..2], &[240, 240], "from the configured range");
    let ip = ip.to_string();
    for server in [&alpha, &beta] {
        import_until(server, "it holds the allocated address", |i| {
            i.is_some_and(|i| {
                i["spec"]["ips"] == json!([ip])
                    && i["spec"]["type"] == json!("ClusterSetIP")
                    && i["metadata"]["labels"]["app.kubernetes.io/managed-by"] == json!("ferry")
                    && i["spec"]["ports"][0]["port"] == json!(80)
            })
        })
        .await;
    }
    let applies = alpha.applies() + beta.applies();
    drop(plane);

    // A control plane started later, whose range would allocate elsewhere, serves the same
    // address: it is read back from the imports, which it does not write again.
    let other_range = (Ipv4Addr::new(198, 19, 200, 0), 24);
    let mut plane = Plane::start(&alpha, &beta, other_range);
    let again = plane.clusterset_ips().await;
    assert_eq!(again, ips, "the same address after a restart");
    // A change after the restart's first mesh: once it is in, the imports were left alone.
    alpha.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ledger-alpha-2", "namespace": "default", "labels": {"app": "ledger"}},
        "spec": {"nodeName": "alpha-1", "serviceAccountName": "ledger", "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "198.18.1.77", "conditions": [{"type": "Ready", "status": "True"}]},
    }));
    tokio::time::timeout(DEADLINE, async {
        loop {
            if plane
                .meshes
                .borrow_and_update()
                .as_ref()
                .is_some_and(|s| s.workloads().any(|w| w.name == "ledger-alpha-2"))
            {
                return;
            }
            plane.meshes.changed().await.unwrap();
        }
    })
    .await
    .expect("the new pod reaches the mesh");
    assert_eq!(
        alpha.applies() + beta.applies(),
        applies,
        "a kept address is not written again"
    );

    // Unexported everywhere: Ferry deletes the imports it wrote.
    alpha.delete(MCS, "ServiceExport", "default/ledger");
    beta.delete(MCS, "ServiceExport", "default/ledger");
    for server in [&alpha, &beta] {
        import_until(server, "it is deleted", |i| i.is_none()).await;
    }
    drop(plane);
    alpha.stop();
    beta.stop();
}
