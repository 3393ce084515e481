//! Two control planes watching the same two clusters, electing with a Lease in the local one
//! (`alpha`): both translate and serve the mesh, only the Lease's holder writes the
//! ServiceImports; when the holder stops renewing, the other takes the Lease once it expired
//! and does the writes that were left. Against in-process API servers (`ferry_k8s::testing`)
//! driven by the real kube-rs client, each control plane sending its own bearer token, so the
//! servers' write logs name who wrote what.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::ServiceKey;
use ferry_core::snapshot::Snapshot;
use ferry_k8s::fixtures::two_clusters as fixture;
use ferry_k8s::lease::LeaseConfig;
use ferry_k8s::testing::{ApiServer, Write};
use ferry_k8s::watch::{Cluster, WatchConfig, WatchStatus, run};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(30);
const MCS: &str = "multicluster.x-k8s.io/v1alpha1";
const LEASE: &str = "ferry-system/ferry-control";
/// Short, so that a takeover takes seconds (renewed every second); long enough that a renewal
/// held back by a loaded machine does not lose it.
const LEASE_DURATION: Duration = Duration::from_secs(6);

/// One control plane's watch, as `identity`, with its meshes and status.
struct Plane {
    meshes: watch::Receiver<Option<Arc<Snapshot>>>,
    status: watch::Receiver<WatchStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Plane {
    fn start(alpha: &ApiServer, beta: &ApiServer, identity: &str) -> Self {
        let clusters = vec![
            Cluster {
                id: "alpha".into(),
                network: None,
                client: alpha.client_as(identity),
            },
            Cluster {
                id: "beta".into(),
                network: None,
                client: beta.client_as(identity),
            },
        ];
        let lease = LeaseConfig::new("ferry-system", "ferry-control", identity, LEASE_DURATION);
        lease.check().unwrap();
        let config = WatchConfig {
            lease: Some(lease),
            ..WatchConfig::default()
        };
        let (mesh_tx, meshes) = watch::channel(None);
        let (status_tx, status) = watch::channel(WatchStatus::default());
        let task = tokio::spawn(run(clusters, config, status_tx, move |o| {
            if let Ok(ferry_k8s::watch::Mesh { topology: t, .. }) = o {
                mesh_tx.send_replace(Some(Arc::new(t.snapshot)));
            }
        }));
        Self {
            meshes,
            status,
            task,
        }
    }

    /// The addresses of `ledger.default.svc.clusterset.local` in the latest mesh.
    fn clusterset_ips(&self) -> Vec<IpAddr> {
        let key = ServiceKey::new("default", "ledger.default.svc.clusterset.local");
        let mesh = self.meshes.borrow().clone();
        let mut ips: Vec<IpAddr> = mesh
            .as_ref()
            .and_then(|s| {
                s.service(&key)
                    .map(|svc| svc.vips.iter().map(|v| v.ip).collect())
            })
            .unwrap_or_default();
        ips.sort_unstable();
        ips.dedup();
        ips
    }

    /// Whether this plane says it leads (None: no election seen yet).
    fn leading(&self) -> Option<bool> {
        self.status.borrow().leader.as_ref().map(|l| l.leading)
    }
}

/// Polls until `what` holds, within the deadline.
async fn eventually(why: &str, what: impl Fn() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !what() {
        assert!(tokio::time::Instant::now() < end, "never: {why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn holder(alpha: &ApiServer) -> Option<String> {
    let lease = alpha.get("coordination.k8s.io/v1", "Lease", LEASE)?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

fn import_writes(server: &ApiServer) -> Vec<Write> {
    server
        .writes()
        .into_iter()
        .filter(|w| w.kind == "ServiceImport")
        .collect()
}

/// In `alpha`'s log (where the Lease is), whether every ServiceImport write was made by the
/// Lease's holder of that moment; the holders in order.
fn writes_follow_the_lease(alpha: &ApiServer) -> (bool, Vec<String>) {
    let mut holder: Option<String> = None;
    let mut holders = Vec::new();
    let mut ok = true;
    for w in alpha.writes() {
        match w.kind.as_str() {
            "Lease" => {
                let h = w.object["spec"]["holderIdentity"]
                    .as_str()
                    .map(str::to_string);
                if h != holder {
                    holders.extend(h.clone());
                    holder = h;
                }
            }
            "ServiceImport" => ok &= holder.as_deref() == Some(w.user.as_str()),
            _ => {}
        }
    }
    (ok, holders)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_writes_imports_and_the_other_takes_over_once_it_expires() {
    let alpha = ApiServer::start(&[&fixture("alpha")]).await;
    let beta = ApiServer::start(&[&fixture("beta")]).await;
    let export = json!({"apiVersion": MCS, "kind": "ServiceExport",
                        "metadata": {"name": "ledger", "namespace": "default"}});
    alpha.apply(export.clone());
    beta.apply(export);

    let planes = [
        ("a", Plane::start(&alpha, &beta, "a")),
        ("b", Plane::start(&alpha, &beta, "b")),
    ];
    // Both serve the exported service at its allocated address; the holder writes it down.
    eventually("both planes serve the cluster-set address", || {
        planes.iter().all(|(_, p)| p.clusterset_ips().len() == 1)
    })
    .await;
    let ips = planes[0].1.clusterset_ips();
    assert_eq!(
        planes[1].1.clusterset_ips(),
        ips,
        "the same address in both"
    );
    let ip = json!([ips[0].to_string()]);
    for server in [&alpha, &beta] {
        eventually("the import holds the address", || {
            server
                .get(MCS, "ServiceImport", "default/ledger")
                .is_some_and(|i| i["spec"]["ips"] == ip)
        })
        .await;
    }
    let first = holder(&alpha).expect("a holder");
    let (lead, follow) = if first == "a" { (0, 1) } else { (1, 0) };
    let other = planes[follow].0.to_string();
    eventually("each plane knows whether it leads", || {
        planes[lead].1.leading() == Some(true) && planes[follow].1.leading() == Some(false)
    })
    .await;
    assert_eq!(
        planes[follow]
            .1
            .status
            .borrow()
            .leader
            .as_ref()
            .unwrap()
            .holder
            .as_deref(),
        Some(first.as_str()),
        "the follower names the holder"
    );
    for server in [&alpha, &beta] {
        let writes = import_writes(server);
        assert!(!writes.is_empty());
        assert!(
            writes.iter().all(|w| w.user == first),
            "only the holder {first} wrote imports: {:?}",
            writes
                .iter()
                .map(|w| (&w.method, &w.user))
                .collect::<Vec<_>>()
        );
    }

    // The holder stops (and so stops renewing); the service is unexported meanwhile. The
    // follower translates the change at once but deletes the imports only once it holds the
    // Lease, after the holder's claim expired.
    let [a, b] = planes;
    let (stopped, survivor) = if lead == 0 { (a, b) } else { (b, a) };
    drop(stopped);
    alpha.delete(MCS, "ServiceExport", "default/ledger");
    beta.delete(MCS, "ServiceExport", "default/ledger");
    for server in [&alpha, &beta] {
        eventually("the import is deleted", || {
            server.get(MCS, "ServiceImport", "default/ledger").is_none()
        })
        .await;
    }
    assert_eq!(
        holder(&alpha).as_deref(),
        Some(other.as_str()),
        "the other took the Lease"
    );
    eventually("the survivor knows it leads", || {
        survivor.1.leading() == Some(true)
    })
    .await;
    let lease = alpha.get("coordination.k8s.io/v1", "Lease", LEASE).unwrap();
    assert_eq!(
        lease["spec"]["leaseTransitions"],
        json!(1),
        "one takeover: {lease}"
    );
    let (ok, holders) = writes_follow_the_lease(&alpha);
    assert!(
        ok,
        "every import write in alpha was by the holder of the moment"
    );
    assert_eq!(holders, vec![first.clone(), other.clone()]);
    for server in [&alpha, &beta] {
        let deletes: Vec<Write> = import_writes(server)
            .into_iter()
            .filter(|w| w.method == "DELETE")
            .collect();
        assert!(
            !deletes.is_empty() && deletes.iter().all(|w| w.user == other),
            "the new holder {other} deleted the imports: {deletes:?}"
        );
    }
    drop(survivor);
    alpha.stop();
    beta.stop();
}
