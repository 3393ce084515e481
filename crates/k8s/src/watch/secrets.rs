//! Remote clusters that come and go with Istio's remote secrets, watched in the local cluster:
//! Secrets labelled `istio/multiCluster: "true"` in the control plane's namespace, as
//! `istioctl create-remote-secret` writes them (each data key a cluster ID, its value a
//! kubeconfig for that cluster).
//!
//! - A Secret added starts watching its clusters; their objects join the mesh once every kind
//!   has listed.
//! - A Secret whose kubeconfig changes reconnects: the new connection's watches start beside
//!   the old ones, which keep serving the cluster's last objects until the new ones have
//!   listed, then are dropped.
//! - A Secret deleted (or no longer labelled) stops its clusters' watches: their objects leave
//!   the mesh at the next translation.
//! - A Secret that cannot be used (not a remote secret, a kubeconfig that does not parse or runs
//!   a command, a cluster ID the control plane already reads) is reported, as a [`Note`] naming
//!   the Secret and the reason and in [`WatchStatus::remote_secrets`], and changes nothing else:
//!   the other Secrets' clusters are untouched, and clusters it gave before it became unusable
//!   keep their watches.
//!   Secrets are taken in name order: of two naming one cluster ID, the first wins.
//! - An unreachable remote cluster keeps its last objects, as every watched cluster does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};

use super::{Cluster, SecretStatus, Stores, WatchStatus, spawn_reflector};
use crate::objects::Note;
use crate::remote::{MULTI_CLUSTER_LABEL, RemoteCluster, clusters_of, connect};

/// The remote clusters of the watched Secrets.
pub(super) struct RemoteClusters {
    /// The local cluster, where the Secrets are.
    local: String,
    namespace: String,
    secrets: Store<DynamicObject>,
    listed: Arc<AtomicBool>,
    _task: super::Tasks,
    /// By cluster ID: the watches whose objects are served.
    served: BTreeMap<String, Remote>,
    /// By cluster ID: a changed kubeconfig's watches, until they have listed.
    pending: BTreeMap<String, Remote>,
    /// By cluster ID: a kubeconfig that gave no client, and why (not tried again until it
    /// changes).
    failed: BTreeMap<String, (String, String)>,
}

/// One remote cluster's watches and where they came from.
struct Remote {
    stores: Arc<Stores>,
    secret: String,
    kubeconfig: String,
}

/// What the Secrets ask for: the clusters to watch, and each Secret's clusters or why it is
/// not used.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Wanted {
    /// By cluster ID: the Secret (`namespace/name`) and the cluster's kubeconfig.
    pub(super) clusters: BTreeMap<String, (String, RemoteCluster)>,
    /// By Secret (`namespace/name`): the cluster IDs it gives, or why it gives none.
    pub(super) secrets: BTreeMap<String, Result<Vec<String>, String>>,
}

/// What `secrets` (in any order) ask for, when the control plane already reads the clusters
/// `taken`. Pure.
pub(super) fn wanted(secrets: &[Arc<DynamicObject>], taken: &BTreeSet<String>) -> Wanted {
    let mut sorted: Vec<&DynamicObject> = secrets.iter().map(|s| &**s).collect();
    sorted.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut out = Wanted::default();
    for s in sorted {
        let name = format!(
            "{}/{}",
            s.metadata.namespace.as_deref().unwrap_or_default(),
            s.metadata.name.as_deref().unwrap_or_default()
        );
        let source = format!("Secret {name}");
        let decoded = serde_json::to_value(s)
            .and_then(serde_json::from_value::<Secret>)
            .map_err(|e| format!("{source}: not a Secret ({e})"))
            .and_then(|secret| clusters_of(&source, secret).map_err(|e| e.to_string()));
        let clusters = match decoded {
            Ok(c) => c,
            Err(e) => {
                out.secrets.insert(name, Err(e));
                continue;
            }
        };
        let mut ids = Vec::new();
        let mut refused = Vec::new();
        for c in clusters {
            if taken.contains(&c.id) {
                refused.push(format!(
                    "cluster {} is read already (the local cluster or a remote secret file)",
                    c.id
                ));
            } else if let Some((other, _)) = out.clusters.get(&c.id) {
                refused.push(format!("cluster {} is given by {other} already", c.id));
            } else {
                ids.push(c.id.clone());
                out.clusters.insert(c.id.clone(), (name.clone(), c));
            }
        }
        let result = if refused.is_empty() {
            Ok(ids)
        } else {
            // The clusters it gives that no one else does are still read.
            Err(format!("{source}: {}", refused.join("; ")))
        };
        out.secrets.insert(name, result);
    }
    out
}

impl RemoteClusters {
    /// Starts watching the remote secrets in `namespace` of cluster `local`.
    pub(super) fn start(
        local: &Cluster,
        namespace: &str,
        changed: Arc<Notify>,
        status: watch::Sender<WatchStatus>,
    ) -> Self {
        let ar = ApiResource::erase::<Secret>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(local.client.clone(), namespace, &ar);
        let config = watcher::Config::default().labels(&format!("{MULTI_CLUSTER_LABEL}=true"));
        let listed = Arc::new(AtomicBool::new(false));
        let (secrets, task) =
            spawn_reflector(api, &ar, config, &local.id, changed, status, listed.clone());
        Self {
            local: local.id.clone(),
            namespace: namespace.to_string(),
            secrets,
            listed,
            _task: super::Tasks(vec![task]),
            served: BTreeMap::new(),
            pending: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// The Secrets have listed, and so has every served cluster.
    pub(super) fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire) && self.served.values().all(|r| r.stores.listed())
    }

    /// The served clusters' watches.
    pub(super) fn served(&self) -> impl Iterator<Item = &Arc<Stores>> {
        self.served.values().map(|r| &r.stores)
    }

    /// Brings the watched clusters in line with the Secrets: starts, restarts and stops
    /// watches, promotes restarted ones that have listed. Returns a note for every Secret
    /// that is not used in full. `taken`: the clusters read otherwise.
    pub(super) async fn reconcile(
        &mut self,
        taken: &BTreeSet<String>,
        changed: &Arc<Notify>,
        status: &watch::Sender<WatchStatus>,
    ) -> Vec<Note> {
        if !self.listed.load(Ordering::Acquire) {
            return Vec::new();
        }
        let wanted = wanted(&self.secrets.state(), taken);
        let mut errors: BTreeMap<String, String> = wanted
            .secrets
            .iter()
            .filter_map(|(s, r)| r.as_ref().err().map(|e| (s.clone(), e.clone())))
            .collect();
        for (id, r) in self
            .served
            .iter()
            .map(|(i, r)| (i.clone(), r.secret.clone()))
            .collect::<Vec<_>>()
        {
            // A Secret that became unusable keeps its clusters' last state; one deleted (or
            // no longer naming the cluster) removes them.
            let unusable = matches!(wanted.secrets.get(&r), Some(Err(_)));
            if !wanted.clusters.contains_key(&id) && !unusable {
                let gone = self.served.remove(&id);
                tracing::info!(cluster = %id, secret = gone.map(|g| g.secret).unwrap_or_default(), "remote cluster removed: its Secret is gone or no longer names it");
                status.send_modify(|s| {
                    s.clusters.remove(&id);
                });
            }
        }
        self.pending
            .retain(|id, _| wanted.clusters.contains_key(id));
        self.failed.retain(|id, _| wanted.clusters.contains_key(id));
        for (id, (secret, remote)) in &wanted.clusters {
            if let Some(err) = self.connect(id, secret, remote, changed, status).await {
                errors.entry(secret.clone()).or_insert(err);
            }
        }
        let notes = errors
            .iter()
            .map(|(secret, message)| Note {
                cluster: self.local.clone(),
                object: format!("Secret {secret}"),
                message: message.clone(),
            })
            .collect();
        status.send_modify(|s| {
            s.remote_secrets = wanted
                .secrets
                .iter()
                .map(|(name, r)| {
                    let clusters = match r {
                        Ok(ids) => ids.clone(),
                        Err(_) => wanted
                            .clusters
                            .iter()
                            .filter(|(_, (from, _))| from == name)
                            .map(|(id, _)| id.clone())
                            .collect(),
                    };
                    let error = errors.get(name).cloned();
                    (name.clone(), SecretStatus { clusters, error })
                })
                .collect();
            for (id, r) in &self.served {
                s.clusters.entry(id.clone()).or_default().secret = Some(r.secret.clone());
            }
        });
        notes
    }

    /// Serves cluster `id` from `remote` (of Secret `secret`): starts its watches if it has
    /// none, restarts them beside the old ones if its kubeconfig changed, and promotes a
    /// restart that has listed. Returns why it cannot, if it cannot.
    async fn connect(
        &mut self,
        id: &str,
        secret: &str,
        remote: &RemoteCluster,
        changed: &Arc<Notify>,
        status: &watch::Sender<WatchStatus>,
    ) -> Option<String> {
        if let Some(served) = self.served.get_mut(id)
            && served.kubeconfig == remote.kubeconfig
        {
            // Unchanged, or changed back before the restart listed.
            served.secret = secret.to_string();
            self.pending.remove(id);
            self.failed.remove(id);
            return None;
        }
        if let Some(p) = self.pending.get(id)
            && p.kubeconfig == remote.kubeconfig
        {
            if p.stores.listed() {
                let p = self.pending.remove(id)?;
                tracing::info!(cluster = %id, secret = %p.secret, "remote cluster reconnected with its Secret's new kubeconfig");
                self.served.insert(id.to_string(), p);
            }
            return None;
        }
        if let Some((kubeconfig, error)) = self.failed.get(id)
            && kubeconfig == &remote.kubeconfig
        {
            return Some(error.clone());
        }
        let source = format!("Secret {secret}");
        let client = match connect(&source, remote).await {
            Ok(c) => c,
            Err(e) => {
                let error = e.to_string();
                tracing::warn!(cluster = %id, secret = %secret, error = %error, "remote secret refused; the cluster keeps what it had");
                self.failed
                    .insert(id.to_string(), (remote.kubeconfig.clone(), error.clone()));
                return Some(error);
            }
        };
        self.failed.remove(id);
        let cluster = Cluster {
            id: id.to_string(),
            network: None,
            client,
        };
        let started = Remote {
            stores: Arc::new(Stores::start(cluster, changed, status)),
            secret: secret.to_string(),
            kubeconfig: remote.kubeconfig.clone(),
        };
        if self.served.contains_key(id) {
            tracing::info!(cluster = %id, secret = %secret, "remote secret changed: reconnecting (the last objects serve until the new watches list)");
            self.pending.insert(id.to_string(), started);
        } else {
            tracing::info!(cluster = %id, secret = %secret, namespace = %self.namespace, "remote cluster added from its Secret");
            self.served.insert(id.to_string(), started);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, labelled: bool, data: &serde_json::Value) -> Arc<DynamicObject> {
        let labels = if labelled {
            serde_json::json!({MULTI_CLUSTER_LABEL: "true"})
        } else {
            serde_json::json!({})
        };
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
                "stringData": data.clone(),
            }))
            .unwrap(),
        )
    }

    #[test]
    fn each_secret_gives_its_clusters_and_a_bad_one_is_named() {
        let taken = BTreeSet::from(["alpha".to_string()]);
        let w = wanted(
            &[
                secret("z-dup", true, &serde_json::json!({"beta": "kc2"})),
                secret("beta", true, &serde_json::json!({"beta": "kc"})),
                secret(
                    "local",
                    true,
                    &serde_json::json!({"alpha": "kc3", "gamma": "kc4"}),
                ),
                secret("other", false, &serde_json::json!({"delta": "kc5"})),
            ],
            &taken,
        );
        let ids: Vec<&str> = w.clusters.keys().map(String::as_str).collect();
        assert_eq!(ids, ["beta", "gamma"]);
        assert_eq!(w.clusters["beta"].0, "istio-system/beta");
        assert_eq!(w.clusters["beta"].1.kubeconfig, "kc");
        assert_eq!(w.secrets["istio-system/beta"], Ok(vec!["beta".to_string()]));
        let dup = w.secrets["istio-system/z-dup"].clone().unwrap_err();
        assert!(
            dup.contains("Secret istio-system/z-dup")
                && dup.contains("cluster beta is given by istio-system/beta already"),
            "{dup}"
        );
        let local = w.secrets["istio-system/local"].clone().unwrap_err();
        assert!(local.contains("cluster alpha is read already"), "{local}");
        let other = w.secrets["istio-system/other"].clone().unwrap_err();
        assert!(
            other.contains("lacks the label istio/multiCluster"),
            "{other}"
        );
    }
}
