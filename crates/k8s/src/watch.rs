//! The watch layer, kept thin: one kube-rs watcher per kind per cluster, whose events are
//! decoded into each cluster's kept [`ClusterObjects`] ([`cache`]) and translated
//! ([`crate::translate::incremental`]: an edit of pods and EndpointSlices for the pods it
//! touches, anything else whole) after every burst of changes.
//!
//! - Every kind is watched as a [`DynamicObject`] and decoded by [`ClusterObjects::add_as`],
//!   so an object that does not decode is a note, never a failed watch.
//! - A watch error, a dropped watch or a `410 Gone` is handled by kube-rs' watcher (re-watch
//!   from the last resource version, else relist, with backoff); the kept objects stay
//!   meanwhile and a relist replaces them once it is whole, so nothing is lost or duplicated.
//! - An unreachable cluster keeps its last good objects (they are never cleared) and is
//!   reported in [`WatchStatus`].
//! - The translation runs on a blocking thread, never on the async runtime.
//! - Each `ServiceExport`'s `Conflict` condition is written back when it changes
//!   ([`crate::status`]), and the cluster-set addresses Ferry allocates are kept in
//!   `ServiceImport`s ([`crate::imports`]).
//! - With [`WatchConfig::remote_secrets`], remote clusters come and go with Istio's remote
//!   secrets in the local cluster ([`secrets`]).
//! - With [`WatchConfig::lease`], only the replica that holds that Lease of the local cluster
//!   writes (the imports and the export status; [`crate::lease`]); the others translate and
//!   serve as ever. A replica that becomes the holder translates again and writes what the
//!   mesh calls for.

mod cache;
mod secrets;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use crate::lease::{Leadership, LeaseConfig};
use crate::objects::{ClusterObjects, Note};
use crate::status::ExportStatus;
use crate::translate::MeshConfig;
use crate::translate::incremental::{Changed, Translator};
use cache::{Cache, Kind, Pending};

/// One cluster to watch.
#[derive(Clone)]
pub struct Cluster {
    /// Its cluster ID.
    pub id: String,
    /// Its network (`None`: from its system namespace's label, else the ID).
    pub network: Option<String>,
    pub client: kube::Client,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// How the watch behaves.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    pub mesh: MeshConfig,
    /// How long the stores must be quiet after a change before the mesh is translated again.
    pub debounce: Duration,
    /// The longest the first translation waits for every cluster's first list.
    pub initial_sync: Duration,
    /// Watch the remote secrets (`istio/multiCluster: "true"`) of this namespace of the local
    /// cluster (the first one given): each adds the clusters it names, for as long as it exists.
    pub remote_secrets: Option<String>,
    /// Write to the clusters only while holding this Lease of the local cluster (several
    /// replicas); `None`: always (one replica).
    pub lease: Option<LeaseConfig>,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            mesh: MeshConfig::default(),
            debounce: Duration::from_millis(50),
            initial_sync: Duration::from_secs(30),
            remote_secrets: None,
            lease: None,
        }
    }
}

/// What the watch has seen, for the admin endpoint and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WatchStatus {
    /// By cluster ID.
    pub clusters: BTreeMap<String, ClusterStatus>,
    /// Translations applied, and rejected (the last good mesh kept serving).
    pub applied: u64,
    pub rejected: u64,
    /// The notes of the last translation.
    pub notes: Vec<Note>,
    pub last_error: Option<String>,
    /// The watched remote secrets, by `namespace/name`.
    pub remote_secrets: BTreeMap<String, SecretStatus>,
    /// The election of the replica that writes, when there is one ([`WatchConfig::lease`]).
    pub leader: Option<Leadership>,
}

/// What one watched remote secret gives.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SecretStatus {
    /// The cluster IDs read from it.
    pub clusters: Vec<String>,
    /// Why it is not used, or not in full.
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClusterStatus {
    /// Every kind's first list has arrived.
    pub synced: bool,
    /// The last watch error of any kind, cleared by the next event.
    pub last_error: Option<String>,
    /// Objects decoded and held, all kinds (none until every kind has listed), as of the last
    /// translation.
    pub objects: usize,
    /// The remote secret (`namespace/name`) it is read by, if it is watched.
    pub secret: Option<String>,
}

/// A translated mesh.
#[derive(Debug)]
pub struct Mesh {
    pub topology: ferry_topology::Topology,
    /// What was left out or decided on the way.
    pub notes: Vec<Note>,
    /// When it differs from the mesh of the outcome before (an `Ok` one) in these workloads
    /// alone: an edit of pods ([`crate::translate::incremental`]).
    pub edit: Option<ferry_topology::editable::WorkloadEdit>,
}

/// A translated mesh, or why the checks rejected it.
pub type Outcome = Result<Mesh, ferry_topology::TopologyError>;

/// The kinds watched in every cluster.
fn kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<Namespace>(&()),
        ApiResource::erase::<Node>(&()),
        ApiResource::erase::<Pod>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<EndpointSlice>(&()),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1",
            "Gateway",
        )),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1",
            "HTTPRoute",
        )),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "security.istio.io",
            "v1",
            "AuthorizationPolicy",
        )),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "security.istio.io",
            "v1",
            "PeerAuthentication",
        )),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "multicluster.x-k8s.io",
            "v1alpha1",
            "ServiceExport",
        )),
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "multicluster.x-k8s.io",
            "v1alpha1",
            "ServiceImport",
        )),
    ]
}

/// A cluster's watches, one per kind, and its objects decoded from their events; its watches
/// end when it is dropped.
struct Stores {
    cluster: Cluster,
    kinds: Vec<Kind>,
    /// Read and changed by the translation alone.
    cache: Mutex<Cache>,
    _tasks: Tasks,
}

/// Tasks aborted when dropped.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Watches `clusters` and calls `apply` with every translated mesh until the task is dropped.
/// `status` is kept up to date.
pub async fn run<F>(
    clusters: Vec<Cluster>,
    config: WatchConfig,
    status: watch::Sender<WatchStatus>,
    mut apply: F,
) where
    F: FnMut(Outcome) + Send,
{
    let changed = Arc::new(Notify::new());
    let (leadership, _election) = match (&config.lease, clusters.first()) {
        (Some(lease), Some(local)) => elect(local, lease, &changed, &status),
        _ => (None, Tasks(Vec::new())),
    };
    let mut remotes = match (&config.remote_secrets, clusters.first()) {
        (Some(ns), Some(local)) => Some(secrets::RemoteClusters::start(
            local,
            ns,
            changed.clone(),
            status.clone(),
        )),
        _ => None,
    };
    let fixed: Vec<Arc<Stores>> = clusters
        .into_iter()
        .map(|c| Arc::new(Stores::start(c, &changed, &status)))
        .collect();
    let taken: BTreeSet<String> = fixed.iter().map(|s| s.cluster.id.clone()).collect();
    let mut export_status = ExportStatus::default();
    let mut translator = Translator::default();
    // The first translation waits for every first list (the remote secrets', then their
    // clusters'), within a bound.
    let deadline = tokio::time::Instant::now() + config.initial_sync;
    let mut secret_notes = Vec::new();
    loop {
        if let Some(r) = remotes.as_mut() {
            secret_notes = r.reconcile(&taken, &changed, &status).await;
        }
        if fixed.iter().all(|s| s.listed()) && remotes.as_ref().is_none_or(|r| r.listed()) {
            break;
        }
        if tokio::time::timeout_at(deadline, changed.notified())
            .await
            .is_err()
        {
            tracing::warn!(
                timeout_s = config.initial_sync.as_secs(),
                "not every cluster listed its objects in time; serving the clusters that did"
            );
            break;
        }
    }
    loop {
        if let Some(r) = remotes.as_mut() {
            secret_notes = r.reconcile(&taken, &changed, &status).await;
        }
        let all: Vec<Arc<Stores>> = fixed
            .iter()
            .chain(remotes.iter().flat_map(|r| r.served()))
            .cloned()
            .collect();
        mark_synced(&all, &status);
        let clients: BTreeMap<String, kube::Client> = all
            .iter()
            .map(|s| (s.cluster.id.clone(), s.cluster.client.clone()))
            .collect();
        let stores = all;
        let mesh = config.mesh.clone();
        let mut decoding = secret_notes.clone();
        let mut taken = std::mem::take(&mut translator);
        let outcome = tokio::task::spawn_blocking(move || {
            let mut changed = Changed::default();
            let mut caches: Vec<_> = stores.iter().map(|s| s.cache.lock()).collect();
            for (s, cache) in stores.iter().zip(caches.iter_mut()) {
                cache.refresh(&s.kinds, &mut changed, &mut decoding);
            }
            let counts: Vec<(String, usize)> = stores
                .iter()
                .zip(&caches)
                .map(|(s, c)| (s.cluster.id.clone(), c.len()))
                .collect();
            let objects: Vec<&ClusterObjects> = caches.iter().map(|c| &c.objects).collect();
            let outcome = taken.translate(&mesh, &objects, &changed).map(|t| {
                let mut notes = decoding;
                notes.extend(t.notes);
                let mesh = Mesh {
                    topology: t.topology,
                    notes,
                    edit: t.edit,
                };
                (mesh, t.exports, t.imports)
            });
            drop(objects);
            drop(caches);
            (taken, outcome, counts)
        })
        .await;
        let outcome = outcome.map(|(taken, outcome, counts)| {
            status.send_modify(|s| {
                for (id, n) in counts {
                    s.clusters.entry(id).or_default().objects = n;
                }
            });
            (taken, outcome)
        });
        let outcome = match outcome {
            Ok((taken, Err(e))) => {
                translator = taken;
                Ok(Err(e))
            }
            Ok((taken, Ok((outcome, exports, imports)))) => {
                translator = taken;
                if leadership.as_ref().is_none_or(|l| l.borrow().leading) {
                    export_status.write(&clients, &exports).await;
                    crate::imports::write(&clients, &imports).await;
                } else {
                    // The holder writes; what this replica wrote as an earlier holder may have
                    // been changed since, so it is checked again once it holds the Lease.
                    export_status = ExportStatus::default();
                    tracing::debug!(
                        imports = imports.len(),
                        "not the Lease's holder: leaving the writes to it"
                    );
                }
                Ok(Ok(outcome))
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(Ok(mesh)) => {
                for n in &mesh.notes {
                    tracing::warn!(cluster = %n.cluster, object = %n.object, note = %n.message, "kubernetes object");
                }
                status.send_modify(|s| {
                    s.applied += 1;
                    s.notes.clone_from(&mesh.notes);
                });
                apply(Ok(mesh));
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the translated mesh was rejected; still serving the last good one");
                status.send_modify(|s| {
                    s.rejected += 1;
                    s.last_error = Some(e.to_string());
                });
                apply(Err(e));
            }
            Err(e) => {
                tracing::error!(error = %e, "the translation thread failed");
            }
        }
        changed.notified().await;
        // Debounce: the burst is over once the stores have been quiet for a while, or after
        // ten quiet periods at most, so steady churn cannot starve the translation.
        let latest = tokio::time::Instant::now() + config.debounce * 10;
        while tokio::time::Instant::now() < latest
            && tokio::time::timeout(config.debounce, changed.notified())
                .await
                .is_ok()
        {}
    }
}

/// Starts the election of `lease` in the `local` cluster: its leadership, and the tasks that
/// run it and keep `status` up to date (a change of leadership also translates again, so a new
/// holder writes at once).
fn elect(
    local: &Cluster,
    lease: &LeaseConfig,
    changed: &Arc<Notify>,
    status: &watch::Sender<WatchStatus>,
) -> (Option<watch::Receiver<Leadership>>, Tasks) {
    let (leadership, election) = crate::lease::elect(local.client.clone(), lease.clone());
    let mut follow = leadership.clone();
    let (changed, status) = (changed.clone(), status.clone());
    let follower = tokio::spawn(async move {
        loop {
            let now = follow.borrow_and_update().clone();
            let leading = now.leading;
            let mut was = None;
            status.send_modify(|s| was = s.leader.replace(now).map(|l| l.leading));
            if was != Some(leading) {
                changed.notify_one();
            }
            if follow.changed().await.is_err() {
                return;
            }
        }
    });
    (Some(leadership), Tasks(vec![election, follower]))
}

/// Starts the reflector of `api` (kind `ar`, in cluster `cluster`); returns its store and
/// task.
fn spawn_reflector(
    api: Api<DynamicObject>,
    ar: &ApiResource,
    config: watcher::Config,
    cluster: &str,
    changed: Arc<Notify>,
    status: watch::Sender<WatchStatus>,
    listed: Arc<AtomicBool>,
) -> (Store<DynamicObject>, tokio::task::JoinHandle<()>) {
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    let task = spawn_events(stream, ar, cluster, changed, status, listed, |_| {});
    (store, task)
}

/// Starts the watch of `api` (kind `ar`, in cluster `cluster`), whose events wait in
/// `pending` for the next translation; returns its task.
fn spawn_watch(
    api: Api<DynamicObject>,
    ar: &ApiResource,
    cluster: &str,
    changed: Arc<Notify>,
    status: watch::Sender<WatchStatus>,
    listed: Arc<AtomicBool>,
    pending: Arc<Mutex<Pending>>,
) -> tokio::task::JoinHandle<()> {
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    spawn_events(stream, ar, cluster, changed, status, listed, move |e| {
        pending.lock().push(e);
    })
}

/// Runs the watch `stream` of kind `ar` in cluster `cluster`: each event goes to `each`, then
/// wakes the translation (`changed`); a kind's first complete list sets `listed`; errors are
/// reported in `status` and retried by the stream's backoff.
fn spawn_events<S>(
    stream: S,
    ar: &ApiResource,
    cluster: &str,
    changed: Arc<Notify>,
    status: watch::Sender<WatchStatus>,
    listed: Arc<AtomicBool>,
    mut each: impl FnMut(watcher::Event<DynamicObject>) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    S: futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>
        + Send
        + 'static,
{
    let cluster = cluster.to_string();
    let kind = ar.kind.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(e) => {
                    let done = matches!(e, watcher::Event::InitDone);
                    each(e);
                    if done {
                        listed.store(true, Ordering::Release);
                    }
                    status.send_if_modified(|s| {
                        let c = s.clusters.entry(cluster.clone()).or_default();
                        c.last_error.take().is_some()
                    });
                    changed.notify_one();
                }
                Err(e) => {
                    if is_not_served(&e) && !listed.swap(true, Ordering::AcqRel) {
                        // The kind is not installed (no CRD): listed, and empty.
                        tracing::info!(cluster = %cluster, kind = %kind, "kind not served by this cluster; taken as empty");
                        changed.notify_one();
                    }
                    tracing::warn!(cluster = %cluster, kind = %kind, error = %e, "watch failed; keeping the last objects and retrying");
                    status.send_modify(|s| {
                        s.clusters.entry(cluster.clone()).or_default().last_error =
                            Some(format!("{kind}: {e}"));
                    });
                }
            }
        }
    })
}

fn mark_synced(all: &[Arc<Stores>], status: &watch::Sender<WatchStatus>) {
    status.send_modify(|s| {
        for st in all {
            let c = s.clusters.entry(st.cluster.id.clone()).or_default();
            c.synced = st.kinds.iter().all(|k| k.listed.load(Ordering::Acquire));
        }
    });
}

impl Stores {
    /// Starts watching every kind of cluster `c`.
    fn start(c: Cluster, changed: &Arc<Notify>, status: &watch::Sender<WatchStatus>) -> Self {
        status.send_modify(|s| {
            s.clusters.insert(c.id.clone(), ClusterStatus::default());
        });
        let mut kinds = Vec::new();
        let mut tasks = Vec::new();
        for ar in self::kinds() {
            let listed = Arc::new(AtomicBool::new(false));
            let pending = Arc::new(Mutex::new(Pending::default()));
            let api: Api<DynamicObject> = Api::all_with(c.client.clone(), &ar);
            let task = spawn_watch(
                api,
                &ar,
                &c.id,
                changed.clone(),
                status.clone(),
                listed.clone(),
                pending.clone(),
            );
            kinds.push(Kind {
                ar,
                listed,
                pending,
            });
            tasks.push(task);
        }
        let cache = Mutex::new(Cache::new(&c.id, c.network.clone()));
        Self {
            cluster: c,
            kinds,
            cache,
            _tasks: Tasks(tasks),
        }
    }

    /// Every kind's first list has arrived (or the kind is not served).
    fn listed(&self) -> bool {
        self.kinds.iter().all(|k| k.listed.load(Ordering::Acquire))
    }
}

/// The watch error of a kind the API server does not serve (its CRD is not installed).
fn is_not_served(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    /// The in-process API server serves every watched kind where kube-rs asks for it.
    #[test]
    fn the_test_api_server_serves_every_watched_kind() {
        for ar in super::kinds() {
            let prefix = if ar.group.is_empty() { "/api" } else { "/apis" };
            assert_eq!(
                crate::testing::collection_of(&ar.api_version, &ar.kind),
                format!("{prefix}/{}/{}", ar.api_version, ar.plural),
                "{}",
                ar.kind
            );
        }
    }
}
