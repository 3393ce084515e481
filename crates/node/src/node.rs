//! The node proxy's state: the mesh snapshot, certificates, the tunnel pool, and enrolled pods.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_core::model::{NodeName, WorkloadUid};
use ferry_core::store::Store;
use ferry_hbone::client::Dialer;
use ferry_hbone::pool::Pool;
use ferry_runtime::drain::DrainWatcher;
use ferry_tls::certs::CertManager;
use ferry_tls::config::TrustBundle;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::capture;
use ferry_runtime::netns::Netns;
use ferry_runtime::telemetry::Metrics;

/// One enrolled pod.
#[derive(Debug)]
pub(crate) struct Pod {
    pub uid: WorkloadUid,
    pub name: String,
    pub ip: IpAddr,
    pub identity: Identity,
    pub netns: Netns,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Enrolled pods by source IP, shared with the tunnel pool's dialer.
pub(crate) type PodsByIp = Arc<Mutex<HashMap<IpAddr, Arc<Pod>>>>;

/// Why a pod could not be enrolled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnrollError {
    #[error("no workload {0} in the mesh (is this node's control plane in sync?)")]
    UnknownWorkload(String),
    #[error("workload {uid} runs on node {other}, not on {this}")]
    OtherNode {
        uid: String,
        other: String,
        this: String,
    },
    #[error("workload {0} has no address")]
    NoAddress(String),
    #[error("network namespace {path}: {source}")]
    Netns {
        path: String,
        source: std::io::Error,
    },
    #[error("no certificate for {0}: {1}")]
    Certificate(Identity, String),
    #[error("workload {0} has no valid identity: {1}")]
    BadIdentity(String, String),
    #[error(transparent)]
    Capture(#[from] capture::CaptureError),
}

/// The node proxy.
#[derive(Debug)]
pub(crate) struct Node {
    pub name: NodeName,
    pub store: Arc<Store>,
    pub certs: CertManager,
    /// The configured roots; replaced by the roots that come with certificates.
    pub bundle: Mutex<TrustBundle>,
    pub pool: Pool,
    pub metrics: Metrics,
    /// Changes whenever a new snapshot is applied: each held inbound connection waits on it and
    /// re-checks its own authorization ([`ferry_runtime::recheck`]).
    pub(crate) changes: tokio::sync::watch::Receiver<u64>,
    /// The drain: listeners stop when it starts (HBONE connections get a GOAWAY); at its
    /// deadline every connection still open is ended with a FIN (and END_STREAM in its tunnel),
    /// never a reset. Every connection's task is spawned through it.
    pub(crate) drain: DrainWatcher,
    /// HBONE connections being served (closed with a TLS close_notify when they end).
    pub(crate) hbone_conns: Arc<AtomicU64>,
    /// Where the enrolled pods are kept across restarts ([`crate::enrollment`]).
    pub state_file: Option<PathBuf>,
    /// One lock per pod being enrolled.
    pub(crate) enrolling: Mutex<HashMap<WorkloadUid, Arc<tokio::sync::Mutex<()>>>>,
    /// Enrolled pods this process cannot serve, with their namespace and why.
    pub unserved: Mutex<std::collections::BTreeMap<WorkloadUid, (PathBuf, String)>>,
    /// Capture rules found missing and put back (`ferry_capture_repairs_total`).
    pub capture_repairs: prometheus_client::metrics::counter::Counter,
    /// Accepts on every listener; refuses (and counts) when descriptors run out.
    pub(crate) acceptor: Arc<ferry_runtime::accept::Acceptor>,
    /// A half-closed connection quiet this long is ended; a vanished app peer is noticed
    /// within it (keepalive, user timeout).
    pub idle_bound: std::time::Duration,
    pub(crate) pods: Mutex<HashMap<WorkloadUid, Arc<Pod>>>,
    pub(crate) by_ip: PodsByIp,
    pub(crate) connections: AtomicU64,
    pub(crate) active: AtomicU64,
    /// The most connections open at once since memory was last given back.
    pub(crate) peak_active: AtomicU64,
    /// Notified when the open connections fall to half of `peak_active`: memory is given
    /// back then ([`crate::memory`]).
    pub(crate) halved: tokio::sync::Notify,
}

/// One open proxied connection of the node, counted until dropped (for the drain and memory).
pub(crate) struct Open(Arc<Node>);

impl Open {
    pub(crate) fn new(node: &Arc<Node>) -> Self {
        node.opened();
        Self(node.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let node = &self.0;
        let open = node
            .active
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        if crate::memory::halved(open, node.peak_active.load(Ordering::Relaxed)) {
            node.halved.notify_one();
        }
    }
}

/// Dials tunnels from inside the source pod's namespace.
#[derive(Debug)]
pub(crate) struct PodDialer(pub(crate) PodsByIp);

impl Dialer for PodDialer {
    fn dial(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<tokio::net::TcpStream>> + Send + '_>,
    > {
        Box::pin(async move {
            let pod = src.and_then(|ip| self.0.lock().get(&ip).cloned());
            match pod {
                Some(p) => p.netns.connect(None, dst).await,
                None => Err(std::io::Error::other(format!(
                    "no enrolled pod has address {src:?}"
                ))),
            }
        })
    }
}

impl Node {
    /// The trust bundle to verify peers with.
    pub(crate) fn bundle(&self) -> TrustBundle {
        if let Some(b) = self.certs.trust_bundle() {
            *self.bundle.lock() = b;
        }
        self.bundle.lock().clone()
    }

    /// The copy bounds of a connection through this node: its idle bound and drain deadline.
    pub(crate) fn bounds(&self) -> ferry_hbone::copy::Bounds {
        ferry_runtime::sockets::bounds(self.idle_bound, self.drain.finish_signal())
    }

    /// Open proxied connections.
    pub(crate) fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Counts one more open connection (and the peak since memory was last given back).
    pub(crate) fn opened(&self) {
        let now = self.active.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_active.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().values().cloned().collect()
    }

    /// Enrolls pod `uid` whose network namespace is at `netns`: waits (up to `wait`) for it to
    /// appear in the mesh, gets its certificate, opens its listeners inside its namespace and
    /// installs the capture rules.
    pub(crate) async fn enroll(
        self: &Arc<Self>,
        uid: &str,
        netns: &Path,
        wait: Duration,
    ) -> Result<Arc<Pod>, EnrollError> {
        let uid = WorkloadUid::new(uid);
        // One enrollment of a pod at a time (the API and a restore may race).
        let lock = self
            .enrolling
            .lock()
            .entry(uid.clone())
            .or_default()
            .clone();
        let _one = lock.lock().await;
        if let Some(p) = self.pods.lock().get(&uid) {
            return Ok(p.clone());
        }
        // Waits for the workload to appear in the mesh: on each new snapshot, up to `wait`.
        let mut changes = self.changes.clone();
        let appeared = tokio::time::timeout(wait, async {
            loop {
                if let Some(w) = self.store.load().workload(&uid).cloned() {
                    return Some(w);
                }
                if changes.changed().await.is_err() {
                    return None;
                }
            }
        });
        let w = match appeared.await {
            Ok(Some(w)) => w,
            // Looked at once more: `wait` may be zero.
            _ => self
                .store
                .load()
                .workload(&uid)
                .cloned()
                .ok_or_else(|| EnrollError::UnknownWorkload(uid.to_string()))?,
        };
        if w.node.as_ref() != Some(&self.name) {
            return Err(EnrollError::OtherNode {
                uid: uid.to_string(),
                other: w.node.as_ref().map_or("(none)".into(), ToString::to_string),
                this: self.name.to_string(),
            });
        }
        let ip = *w
            .addresses
            .first()
            .ok_or_else(|| EnrollError::NoAddress(uid.to_string()))?;
        let identity = w
            .identity()
            .map_err(|e| EnrollError::BadIdentity(uid.to_string(), e.to_string()))?;
        self.certs
            .fetch(&identity)
            .await
            .map_err(|e| EnrollError::Certificate(identity.clone(), e.to_string()))?;
        let ns = Netns::open(netns).map_err(|source| EnrollError::Netns {
            path: netns.display().to_string(),
            source,
        })?;
        let pod = Arc::new(Pod {
            uid: uid.clone(),
            name: w.name.clone(),
            ip,
            identity,
            netns: ns,
            tasks: Mutex::new(Vec::new()),
        });
        let listen = |port| SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port);
        let io = |source| EnrollError::Netns {
            path: netns.display().to_string(),
            source,
        };
        let outbound = pod
            .netns
            .listen(listen(capture::OUTBOUND_PORT))
            .await
            .map_err(io)?;
        let inbound = pod
            .netns
            .listen(listen(capture::INBOUND_PORT))
            .await
            .map_err(io)?;
        let hbone = pod
            .netns
            .listen(listen(capture::HBONE_PORT))
            .await
            .map_err(io)?;
        // Registered before the listeners accept: a connection they take may need the pod
        // (the tunnel dialer finds pods by address).
        self.by_ip.lock().insert(ip, pod.clone());
        self.pods.lock().insert(uid.clone(), pod.clone());
        {
            let mut t = pod.tasks.lock();
            t.push(tokio::spawn(crate::outbound::serve(
                self.clone(),
                pod.clone(),
                outbound,
            )));
            t.push(tokio::spawn(crate::inbound::serve_plain(
                self.clone(),
                pod.clone(),
                inbound,
            )));
            t.push(tokio::spawn(crate::inbound::serve_hbone(
                self.clone(),
                pod.clone(),
                hbone,
            )));
        }
        if let Err(e) = capture::install(netns).await {
            self.by_ip.lock().remove(&ip);
            self.pods.lock().remove(&uid);
            self.stop(&pod).await;
            return Err(e.into());
        }
        tracing::info!(pod = %uid, ip = %ip, identity = %pod.identity, netns = %netns.display(), "pod enrolled");
        Ok(pod)
    }

    /// Removes pod `uid`: closes its listeners and deletes its capture rules.
    pub(crate) async fn remove(&self, uid: &str) -> bool {
        // Not while the pod is being enrolled (a restore or retry racing a `del`).
        let lock = self.enrolling.lock().get(&WorkloadUid::new(uid)).cloned();
        let _one = match &lock {
            Some(l) => Some(l.lock().await),
            None => None,
        };
        self.enrolling.lock().remove(&WorkloadUid::new(uid));
        let pod = self.pods.lock().remove(&WorkloadUid::new(uid));
        match pod {
            Some(p) => {
                self.by_ip.lock().remove(&p.ip);
                self.stop(&p).await;
                tracing::info!(pod = %uid, "pod removed");
                true
            }
            None => false,
        }
    }

    /// Serves pod `uid` in the namespace now at its path, which replaced the one it was
    /// enrolled in: the old listeners go, the new namespace gets listeners and rules. The rules
    /// are never removed on the way (the new namespace may already have them).
    pub(crate) async fn reenroll(
        self: &Arc<Self>,
        uid: &WorkloadUid,
    ) -> Result<Arc<Pod>, EnrollError> {
        let old = self.pods.lock().remove(uid);
        let Some(old) = old else {
            return Err(EnrollError::UnknownWorkload(uid.to_string()));
        };
        self.by_ip.lock().remove(&old.ip);
        for t in old.tasks.lock().drain(..) {
            t.abort();
        }
        let path = old.netns.path().to_path_buf();
        self.enroll(uid.as_str(), &path, Duration::ZERO).await
    }

    async fn stop(&self, pod: &Pod) {
        for t in pod.tasks.lock().drain(..) {
            t.abort();
        }
        capture::remove(pod.netns.path()).await;
    }

    /// The namespace paths of enrolled pods (for the API's `list`).
    pub(crate) fn enrolled(&self) -> Vec<(String, PathBuf)> {
        let mut v: Vec<_> = self
            .pods
            .lock()
            .values()
            .map(|p| (p.uid.to_string(), p.netns.path().to_path_buf()))
            .collect();
        v.sort();
        v
    }
}
