//! Kubernetes clusters as the control plane's source of truth (`ferry control serve
//! --cluster-id`): the local cluster from a kubeconfig (or the pod's own service account),
//! remote clusters from Istio remote secrets, watched by `ferry_k8s::watch` and published
//! like a topology edit: the snapshot and the served resources in one step each, and a
//! rejected translation keeps the last good state serving.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_core::store::Store;
use ferry_k8s::MeshConfig;
use ferry_k8s::remote::{connect, parse_remote_secret};
use ferry_k8s::watch::{Cluster, Outcome, WatchConfig, WatchStatus};
use ferry_topology::Topology;
use ferry_xds::resources::ResourceSet;
use tokio::sync::{mpsc, watch};

use crate::metrics::KubeMetrics;
use crate::served::Served;
use crate::source::Reloads;

/// Where the clusters are and how to read them.
#[derive(Clone, Debug)]
pub struct KubeSource {
    /// The local cluster's ID (Istio's `CLUSTER_ID`).
    pub cluster_id: String,
    /// Its network (none: its `istio-system` namespace's `topology.istio.io/network` label,
    /// else the cluster ID).
    pub network: Option<String>,
    /// A kubeconfig for it; none: `KUBECONFIG`, `~/.kube/config`, else the in-cluster
    /// service account, as kubectl finds them.
    pub kubeconfig: Option<PathBuf>,
    /// Istio remote secrets (`istioctl create-remote-secret` output), one file each.
    pub remote_secrets: Vec<PathBuf>,
    /// Watch the remote secrets (`istio/multiCluster: "true"`) of this namespace of the local
    /// cluster: clusters come and go with them.
    pub remote_secrets_namespace: Option<String>,
    pub mesh: MeshConfig,
    /// Several replicas: only the holder of this Lease of the local cluster writes to the
    /// clusters (ServiceImports, ServiceExport status); every replica serves.
    pub lease: Option<ferry_k8s::lease::LeaseConfig>,
    /// How long to wait for the first translated mesh before giving up.
    pub initial_sync: Duration,
}

/// A running source, after its first mesh: publishes the rest.
pub(crate) struct Started {
    /// The notes of the first mesh.
    first_notes: Vec<ferry_k8s::Note>,
    rest: mpsc::UnboundedReceiver<Outcome>,
    watch: AbortOnDrop,
    pub(crate) status: watch::Receiver<WatchStatus>,
}

/// Connects to every cluster and waits for the first translated mesh.
pub(crate) async fn start(src: &KubeSource) -> anyhow::Result<(Topology, Started)> {
    if let Some(lease) = &src.lease {
        lease.check()?;
    }
    let mut clusters = vec![Cluster {
        id: src.cluster_id.clone(),
        network: src.network.clone(),
        client: ferry_k8s::client::client(src.kubeconfig.as_deref()).await?,
    }];
    for path in &src.remote_secrets {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the remote secret {}", path.display()))?;
        let source_name = path.display().to_string();
        for remote in parse_remote_secret(&source_name, &text)? {
            clusters.push(Cluster {
                client: connect(&source_name, &remote).await?,
                id: remote.id,
                network: None,
            });
        }
    }
    let mut ids: Vec<&str> = clusters.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        bail!("a cluster ID is given twice: {ids:?}");
    }
    let (tx, mut rest) = mpsc::unbounded_channel();
    let (status_tx, status) = watch::channel(WatchStatus::default());
    let config = WatchConfig {
        mesh: src.mesh.clone(),
        initial_sync: src.initial_sync,
        remote_secrets: src.remote_secrets_namespace.clone(),
        lease: src.lease.clone(),
        ..WatchConfig::default()
    };
    let watch = tokio::spawn(ferry_k8s::watch::run(
        clusters,
        config,
        status_tx,
        move |o| {
            let _ = tx.send(o);
        },
    ));
    let first = tokio::time::timeout(src.initial_sync * 2, async {
        loop {
            match rest.recv().await {
                Some(Ok(mesh)) => return Ok((mesh.topology, mesh.notes)),
                Some(Err(e)) => {
                    tracing::error!(error = %e, "the first translated mesh was rejected; waiting for a good one");
                }
                None => bail!("the Kubernetes watch ended"),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no mesh from the clusters within {:?}", src.initial_sync * 2))??;
    let (first, first_notes) = first;
    let started = Started {
        first_notes,
        rest,
        watch: AbortOnDrop(watch),
        status,
    };
    Ok((first, started))
}

impl Started {
    /// Publishes every later mesh to `store` and `resources` until the watch ends.
    pub(crate) async fn run(
        mut self,
        store: Arc<Store>,
        resources: watch::Sender<Arc<ResourceSet>>,
        reloads: watch::Sender<Reloads>,
        metrics: KubeMetrics,
    ) {
        metrics.set(&self.first_notes);
        let mut status = self.status.clone();
        let reachability = metrics.clone();
        let _follow = AbortOnDrop(tokio::spawn(async move {
            loop {
                reachability.set_clusters(&status.borrow_and_update());
                if status.changed().await.is_err() {
                    return;
                }
            }
        }));
        // What is served, kept to encode the next mesh from.
        let mut served: Option<Served> = None;
        while let Some(outcome) = self.rest.recv().await {
            match outcome {
                Ok(mesh) => {
                    metrics.set(&mesh.notes);
                    let (t, edit) = (mesh.topology, mesh.edit);
                    // Flattening and encoding a large mesh takes a while: off the runtime, as
                    // the translation was.
                    let prior = served
                        .take()
                        .map_or_else(|| Err((store.load(), resources.borrow().clone())), Ok);
                    let encoded = tokio::task::spawn_blocking(move || {
                        // Only what changed is encoded again: an edit of pods names its workloads.
                        let next = match (prior, edit) {
                            (Ok(s), Some(edit)) => s.edited(&t.snapshot, &edit.workloads),
                            (Ok(s), None) => s.next(&t.snapshot),
                            (Err((snap, set)), _) => {
                                Served::from_parts(&snap, set).next(&t.snapshot)
                            }
                        };
                        (t, next)
                    })
                    .await;
                    let Ok((t, next)) = encoded else {
                        tracing::error!(
                            "encoding the Kubernetes mesh panicked; still serving the last good state"
                        );
                        reloads.send_modify(|r| {
                            r.rejected += 1;
                            r.last_error = Some("encoding the mesh panicked".into());
                        });
                        continue;
                    };
                    store.publish(t.snapshot);
                    resources.send_replace(next.resources().clone());
                    served = Some(next);
                    reloads.send_modify(|r| r.applied += 1);
                }
                Err(e) => reloads.send_modify(|r| {
                    r.rejected += 1;
                    r.last_error = Some(e.to_string());
                }),
            }
        }
        drop(self.watch);
    }
}

/// Ends the watch (every reflector with it) when the source is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
