//! The agent's view of the API server: every Namespace and this node's Pods (field selector
//! `spec.nodeName=<node>`), each followed by a kube-rs watcher (re-watch from the last resource
//! version, relist on `410 Gone`, backoff on errors), read into [`Facts`] and announced on a
//! change counter that the agent's reconciliation and the plugin's questions wait on; and the
//! pods' `ambient.istio.io/redirection` annotation, written back as Istio's agent writes it (a
//! JSON merge patch of the pod's `status` subresource, which may change its metadata).
//!
//! A malformed object is logged, counted and named in [`KubeStatus`]; what was known of the
//! object before stays. A failing watch keeps every object it had.

mod decode;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_k8s::enrollment::{REDIRECTION, REDIRECTION_ENABLED};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::enroll::{Annotate, Labels, Override, PodFacts, Verdict, View};
use crate::spec::PodRef;

/// How the agent reads enrollment from a cluster.
#[derive(Clone)]
pub struct Kubernetes {
    pub client: kube::Client,
    /// This node's name (`spec.nodeName` of its pods).
    pub node: String,
    /// How long the plugin's add waits for the pod to appear in the watch.
    pub pod_wait: Duration,
    status: watch::Sender<KubeStatus>,
}

impl std::fmt::Debug for Kubernetes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubernetes")
            .field("node", &self.node)
            .field("pod_wait", &self.pod_wait)
            .finish_non_exhaustive()
    }
}

impl Kubernetes {
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
            pod_wait: Duration::from_secs(5),
            status: watch::channel(KubeStatus::default()).0,
        }
    }

    /// What the watch has seen, kept up to date while the agent runs.
    pub fn status(&self) -> watch::Receiver<KubeStatus> {
        self.status.subscribe()
    }

    /// A client from `kubeconfig`, else the usual places (in a pod: its service account).
    pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
        Ok(ferry_k8s::client::client(kubeconfig).await?)
    }
}

/// What the watch has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KubeStatus {
    /// Both first lists have arrived.
    pub synced: bool,
    pub namespaces: usize,
    /// This node's pods.
    pub pods: usize,
    /// Objects that could not be read (each kept its last good state).
    pub malformed: u64,
    /// The last malformed object or watch error.
    pub last_error: Option<String>,
    /// Annotations written.
    pub annotated: u64,
}

/// What the agent holds of the cluster.
#[derive(Debug, Default)]
struct Facts {
    now: Objects,
    namespaces_listed: bool,
    pods_listed: bool,
}

/// The running watch.
pub(crate) struct Watch {
    pub(crate) node: String,
    client: kube::Client,
    pod_wait: Duration,
    facts: Mutex<Facts>,
    /// Bumped on every change of the facts, and by the agent ([`Watch::kick`]).
    changes: watch::Sender<u64>,
    status: watch::Sender<KubeStatus>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("node", &self.node)
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Starts following the cluster; the tasks doing it are returned.
    pub(crate) fn start(k: Kubernetes) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let w = Arc::new(Self {
            node: k.node,
            client: k.client,
            pod_wait: k.pod_wait,
            facts: Mutex::new(Facts::default()),
            changes: watch::channel(0).0,
            status: k.status,
        });
        let pods = watcher::Config::default().fields(&format!("spec.nodeName={}", w.node));
        let tasks = vec![
            tokio::spawn(follow(
                w.clone(),
                ApiResource::erase::<Namespace>(&()),
                watcher::Config::default(),
                Kind::Namespace,
            )),
            tokio::spawn(follow(
                w.clone(),
                ApiResource::erase::<Pod>(&()),
                pods,
                Kind::Pod,
            )),
        ];
        (w, tasks)
    }

    /// Announces a change the agent made (a pod enrolled, a node proxy connected).
    pub(crate) fn kick(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// `f` of the cluster as the agent holds it, once both first lists have arrived.
    pub(crate) fn view<R>(&self, flags: Override<'_>, f: impl FnOnce(&View<'_>) -> R) -> Option<R> {
        let facts = self.facts.lock();
        if !(facts.namespaces_listed && facts.pods_listed) {
            return None;
        }
        Some(f(&View {
            node: &self.node,
            namespaces: &facts.now.namespaces,
            pods: &facts.now.pods,
            flags,
        }))
    }

    /// Whether the plugin's pod is enrolled, once the watch has it (within the pod wait).
    pub(crate) async fn verdict(
        &self,
        pod: &PodRef,
        flags: Override<'_>,
    ) -> Result<Verdict, String> {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + self.pod_wait;
        loop {
            let found = self.view(flags, |v| v.find(pod).map(|p| v.decide(p)));
            if let Some(Some(verdict)) = found {
                return Ok(verdict);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                let why = if found.is_none() {
                    "the agent has not listed the cluster's namespaces and pods yet"
                } else {
                    "the API server has not shown it among this node's pods yet"
                };
                return Err(format!(
                    "pod {}/{} (uid {:?}) on node {}: {why} (waited {:?}); the runtime retries",
                    pod.namespace, pod.name, pod.uid, self.node, self.pod_wait
                ));
            }
        }
    }

    /// Writes one pod's `ambient.istio.io/redirection` (a pod gone is no error).
    pub(crate) async fn annotate(&self, a: &Annotate) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &a.namespace,
            &ApiResource::erase::<Pod>(&()),
        );
        let value = if a.enabled {
            serde_json::Value::from(REDIRECTION_ENABLED)
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({"metadata": {"annotations": {REDIRECTION: value}}});
        match api
            .patch_status(&a.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(k8s.namespace = %a.namespace, k8s.name = %a.name, enabled = a.enabled, "pod annotated {REDIRECTION}");
                self.status.send_modify(|s| s.annotated += 1);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn malformed(&self, error: String) {
        self.status.send_modify(|s| {
            s.malformed += 1;
            s.last_error = Some(error);
        });
    }

    fn changed(&self) {
        {
            let f = self.facts.lock();
            self.status.send_modify(|s| {
                s.synced = f.namespaces_listed && f.pods_listed;
                s.namespaces = f.now.namespaces.len();
                s.pods = f.now.pods.len();
            });
        }
        self.kick();
    }
}

/// The two kinds followed.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Namespace,
    Pod,
}

/// One kind's objects, as [`Facts`] holds them.
#[derive(Debug)]
enum Object {
    Namespace(String, Labels),
    Pod(PodFacts),
}

impl Kind {
    fn decode(self, obj: &DynamicObject) -> Result<Object, decode::DecodeError> {
        match self {
            Self::Namespace => decode::namespace(obj).map(|(n, l)| Object::Namespace(n, l)),
            Self::Pod => decode::pod(obj).map(Object::Pod),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Namespace => "Namespace",
            Self::Pod => "Pod",
        }
    }
}

/// Namespaces and pods by key: the ones held, or those of a (re)list under way.
#[derive(Debug, Default)]
struct Objects {
    namespaces: BTreeMap<String, Labels>,
    pods: BTreeMap<String, PodFacts>,
}

impl Objects {
    fn put(&mut self, o: Object) {
        match o {
            Object::Namespace(n, l) => {
                self.namespaces.insert(n, l);
            }
            Object::Pod(p) => {
                self.pods.insert(p.key(), p);
            }
        }
    }

    fn remove(&mut self, kind: Kind, key: &str) {
        match kind {
            Kind::Namespace => self.namespaces.remove(key).is_some(),
            Kind::Pod => self.pods.remove(key).is_some(),
        };
    }

    /// Takes `kind`'s objects from a finished listing.
    fn replace(&mut self, kind: Kind, listed: Self) {
        match kind {
            Kind::Namespace => self.namespaces = listed.namespaces,
            Kind::Pod => self.pods = listed.pods,
        }
    }

    /// Copies object `key` of `kind` from `from`, if it has it.
    fn copy(&mut self, kind: Kind, key: &str, from: &Self) {
        match kind {
            Kind::Namespace => {
                if let Some(l) = from.namespaces.get(key) {
                    self.namespaces.insert(key.to_string(), l.clone());
                }
            }
            Kind::Pod => {
                if let Some(p) = from.pods.get(key) {
                    self.pods.insert(key.to_string(), p.clone());
                }
            }
        }
    }
}

/// Follows one kind until the task is dropped.
async fn follow(w: Arc<Watch>, ar: ApiResource, config: watcher::Config, kind: Kind) {
    let api: Api<DynamicObject> = Api::all_with(w.client.clone(), &ar);
    let stream = watcher::watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<Objects> = None;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            // An object whose metadata does not decode fails its event: the watch goes on.
            Err(watcher::Error::WatchFailed(e)) if undecodable(&e).is_some() => {
                let why = undecodable(&e).unwrap_or_default();
                tracing::error!(kind = kind.name(), error = %why, "a malformed object: keeping what was known of it before");
                w.malformed(format!(
                    "a malformed {}: {why}; keeping what was known of it before",
                    kind.name()
                ));
                continue;
            }
            Err(e) => {
                let error = format!("{} watch: {e}", kind.name());
                tracing::warn!(kind = kind.name(), error = %e, "watch failed; keeping what it had and retrying");
                w.status.send_modify(|s| s.last_error = Some(error));
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing = Some(Objects::default()),
            watcher::Event::InitApply(obj) => {
                let l = listing.get_or_insert_with(Objects::default);
                match kind.decode(&obj) {
                    Ok(o) => l.put(o),
                    Err(e) => {
                        // What was known of it before stays.
                        if let Some(key) = e.key() {
                            l.copy(kind, key, &w.facts.lock().now);
                        }
                        report(&w, &e);
                    }
                }
            }
            watcher::Event::InitDone => {
                let l = listing.take().unwrap_or_default();
                let mut f = w.facts.lock();
                f.now.replace(kind, l);
                match kind {
                    Kind::Namespace => f.namespaces_listed = true,
                    Kind::Pod => f.pods_listed = true,
                }
                drop(f);
                w.changed();
            }
            watcher::Event::Apply(obj) => match kind.decode(&obj) {
                Ok(o) => {
                    w.facts.lock().now.put(o);
                    w.changed();
                }
                Err(e) => report(&w, &e),
            },
            watcher::Event::Delete(obj) => {
                if let Some(key) = decode::key(&obj.metadata) {
                    w.facts.lock().now.remove(kind, &key);
                    w.changed();
                }
            }
        }
    }
}

/// Why a watch event could not be decoded, if that is the error. kube-rs reports a line that
/// is not a `WatchEvent` as a serde error, or, when the line also reads as a `Status` (every
/// field of which is optional), as an API error with no code, which no API server sends.
fn undecodable(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::SerdeError(e) => Some(e.to_string()),
        kube::Error::Api(s) if s.code == 0 && s.message.is_empty() => Some(
            "an event whose object does not decode (its metadata is not what Kubernetes writes)"
                .into(),
        ),
        _ => None,
    }
}

fn report(w: &Watch, e: &decode::DecodeError) {
    tracing::error!(error = %e, "a malformed object: keeping what was known of it before");
    w.malformed(format!("{e}; keeping what was known of it before"));
}
