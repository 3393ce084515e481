//! The node proxy's state: the mesh snapshot, certificates, the tunnel pool, enrolled pods, and
//! the count of open connections. What changes it (enrollment) is in [`crate::pods`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ferry_core::identity::Identity;
use ferry_core::model::{NodeName, WorkloadUid};
use ferry_core::store::Store;
use ferry_hbone::client::Dialer;
use ferry_hbone::pool::Pool;
use ferry_runtime::drain::DrainWatcher;
use ferry_tls::certs::CertManager;
use ferry_tls::config::TrustBundle;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use ferry_runtime::netns::Netns;
use ferry_runtime::telemetry::Metrics;

use crate::family::Family;

/// One enrolled pod.
#[derive(Debug)]
pub(crate) struct Pod {
    pub(crate) uid: WorkloadUid,
    pub(crate) name: String,
    /// Its first address (the workload's first: IPv4 for a dual-stack pod).
    pub(crate) ip: IpAddr,
    /// Every address it is served at: [`Pod::ip`] first, then its address of the other family
    /// if the namespace serves that family (an IPv6 address in a namespace with IPv6 disabled
    /// is not).
    pub(crate) ips: Vec<IpAddr>,
    /// The families its namespace's rules capture ([`crate::capture`]): IPv4, and IPv6 where
    /// `ip6tables` works there (fail closed: also in a namespace with IPv6 disabled).
    pub(crate) captured: Vec<crate::family::Family>,
    /// Whether the namespace has IPv6 on: then it has IPv6 listeners and original-source rules.
    pub(crate) serves_v6: bool,
    pub(crate) identity: Identity,
    /// Its DNS proxy, when its workload says `dns_capture` (taken at enrollment).
    pub(crate) dns: Option<Arc<crate::dns::Resolver>>,
    pub(crate) netns: Netns,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the rules that let the proxy connect to the app from the client's address are in
    /// place ([`crate::transparent`]), IPv4's and IPv6's: until they are, the app sees the pod's
    /// own address.
    pub(crate) transparent: AtomicBool,
    pub(crate) transparent_v6: AtomicBool,
}

// === impl Pod ===

impl Pod {
    /// The address to connect to `to` in the pod from, for a connection whose client the
    /// decision found to be `client` ([`ferry_core::app_source`]): `client` if it is of `to`'s
    /// family and the pod's rules of that family are in place, else none (the pod's own
    /// address).
    pub(crate) fn source_for(&self, client: Option<IpAddr>, to: SocketAddr) -> Option<IpAddr> {
        let family = Family::of(to.ip());
        client.filter(|c| {
            Family::of(*c) == family && self.transparent(family).load(Ordering::Relaxed)
        })
    }

    /// The families whose original-source rules the pod gets: IPv4's, and IPv6's where its
    /// namespace has IPv6 on.
    pub(crate) fn transparent_families(&self) -> Vec<Family> {
        let mut f = vec![Family::V4];
        if self.serves_v6 {
            f.push(Family::V6);
        }
        f
    }

    /// Whether the original-source rules of `family` are in place.
    pub(crate) fn transparent(&self, family: Family) -> &AtomicBool {
        match family {
            Family::V4 => &self.transparent,
            Family::V6 => &self.transparent_v6,
        }
    }

    /// The pod's address of `ip`'s family (the one a connection in that family reaches it at),
    /// else its first.
    pub(crate) fn ip_like(&self, ip: IpAddr) -> IpAddr {
        self.ips
            .iter()
            .copied()
            .find(|a| Family::of(*a) == Family::of(ip))
            .unwrap_or(self.ip)
    }
}

/// Enrolled pods by source IP, shared with the tunnel pool's dialer.
pub(crate) type PodsByIp = Arc<Mutex<HashMap<IpAddr, Arc<Pod>>>>;

/// The node proxy.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: NodeName,
    pub(crate) store: Arc<Store>,
    pub(crate) certs: CertManager,
    /// The configured roots; replaced by the roots that come with certificates.
    pub(crate) bundle: Mutex<TrustBundle>,
    pub(crate) pool: Pool,
    pub(crate) metrics: Metrics,
    /// Changes whenever a new snapshot is applied: each held inbound connection waits on it and
    /// re-checks its own authorization ([`ferry_runtime::recheck`]).
    pub(crate) changes: tokio::sync::watch::Receiver<u64>,
    /// The drain: listeners stop when it starts (HBONE connections get a GOAWAY); at its
    /// deadline every connection still open is ended with a FIN (and END_STREAM in its tunnel),
    /// never a reset. Every connection's task is spawned through it.
    pub(crate) drain: DrainWatcher,
    /// HBONE connections being served (closed with a TLS close_notify when they end).
    pub(crate) hbone_conns: Arc<ferry_runtime::serve::Served>,
    /// Where the enrolled pods are kept across restarts ([`crate::enrollment`]).
    pub(crate) state_file: Option<PathBuf>,
    /// One lock per pod being enrolled.
    pub(crate) enrolling: Mutex<HashMap<WorkloadUid, Arc<tokio::sync::Mutex<()>>>>,
    /// Inbound ports each pod was enrolled to leave out of capture (ZDS's
    /// `ferry_uncaptured_ports`); pods enrolled without are absent. Kept in the state file (the
    /// agent sends its pods' ports in each replay).
    pub(crate) uncaptured: Mutex<HashMap<WorkloadUid, crate::capture::Uncaptured>>,
    /// With a node agent (`--zds-socket`): whether its first replay ended (`snapshot_sent`).
    /// Readiness waits for it, so a node proxy is not ready before it serves the pods already
    /// on its node. `None` without an agent.
    pub(crate) agent_replayed: Option<std::sync::atomic::AtomicBool>,
    /// Pods of the state file this process cannot serve, with their namespace and why
    /// ([`crate::enrollment`]).
    pub(crate) unserved: Mutex<std::collections::BTreeMap<WorkloadUid, crate::recorded::Unserved>>,
    /// Capture rules found missing and put back (`ferry_capture_repairs_total`).
    pub(crate) capture_repairs: prometheus_client::metrics::counter::Counter,
    /// Outbound connects tried again on another endpoint (`ferry_connect_retries_total`).
    pub(crate) connect_retries: prometheus_client::metrics::counter::Counter,
    /// The DNS proxy's upstream and counters, for DNS-captured pods ([`crate::dns`]).
    pub(crate) dns: crate::dns::Settings,
    /// Passive health: outlier detection over this node's outbound connects.
    pub(crate) health: crate::outlier::PassiveHealth,
    /// Accepts on every listener; refuses (and counts) when descriptors run out.
    pub(crate) acceptor: Arc<ferry_runtime::accept::Acceptor>,
    /// A half-closed connection quiet this long is ended; a vanished app peer is noticed
    /// within it (keepalive, user timeout).
    pub(crate) idle_bound: std::time::Duration,
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

/// Whether `open` connections, down from `peak`, are a drop worth giving memory back after
/// ([`crate::memory`]): a peak of at least 64, halved.
pub(crate) fn halved(open: u64, peak: u64) -> bool {
    peak >= 64 && open * 2 <= peak
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
        if halved(open, node.peak_active.load(Ordering::Relaxed)) {
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

/// Forwarded queries leave from inside the pod's namespace, marked so that its capture rules
/// let them through: the upstream sees the pod's address, as without the proxy.
#[derive(Debug)]
pub(crate) struct PodEgress(pub(crate) Arc<Pod>);

impl crate::dns::Egress for PodEgress {
    fn udp(&self, upstream: SocketAddr) -> crate::dns::Opening<'_, tokio::net::UdpSocket> {
        Box::pin(async move {
            let s = self
                .0
                .netns
                .run(move || -> std::io::Result<std::net::UdpSocket> {
                    let s = socket2::Socket::new(
                        socket2::Domain::for_address(upstream),
                        socket2::Type::DGRAM,
                        Some(socket2::Protocol::UDP),
                    )?;
                    s.set_mark(ferry_runtime::netns::MARK)?;
                    s.set_nonblocking(true)?;
                    s.connect(&upstream.into())?;
                    Ok(s.into())
                })
                .await??;
            tokio::net::UdpSocket::from_std(s)
        })
    }

    fn tcp(&self, upstream: SocketAddr) -> crate::dns::Opening<'_, TcpStream> {
        Box::pin(self.0.netns.connect(None, upstream))
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

    /// Serves the pod's TCP listener `listener` (`what` names it in logs) until the drain
    /// starts: each connection with `handle`, on its own task the drain waits for.
    pub(crate) async fn serve_tcp<F, Fut>(
        self: Arc<Self>,
        pod: Arc<Pod>,
        listener: TcpListener,
        what: &'static str,
        handle: F,
    ) where
        F: Fn(Arc<Self>, Arc<Pod>, TcpStream, SocketAddr) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        ferry_runtime::serve::serve_tcp(
            listener,
            &self.acceptor,
            &self.drain,
            what,
            |tcp, peer| handle(self.clone(), pod.clone(), tcp, peer),
        )
        .await;
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

    /// The inbound ports pod `uid` was enrolled to leave out of capture (none by default).
    pub(crate) fn uncaptured(&self, uid: &WorkloadUid) -> crate::capture::Uncaptured {
        self.uncaptured.lock().get(uid).cloned().unwrap_or_default()
    }

    /// Records the inbound ports pod `uid` leaves out of capture, before it is enrolled (by the
    /// node agent, or from the state file). A pod served now keeps the ports it was enrolled
    /// with: asking it for others is refused (it is released first).
    pub(crate) fn set_uncaptured(
        &self,
        uid: &WorkloadUid,
        ports: crate::capture::Uncaptured,
    ) -> Result<(), UncapturedConflict> {
        let mut all = self.uncaptured.lock();
        let now = all.get(uid).cloned().unwrap_or_default();
        if now == ports {
            return Ok(());
        }
        if self.pods.lock().contains_key(uid) {
            return Err(UncapturedConflict {
                uid: uid.clone(),
                now,
            });
        }
        if ports.is_empty() {
            all.remove(uid);
        } else {
            all.insert(uid.clone(), ports);
        }
        Ok(())
    }
}

/// A served pod asked to leave other inbound ports out of capture than it was enrolled with.
#[derive(Debug, thiserror::Error)]
#[error(
    "{uid} is enrolled with {}",
    if now.is_empty() { "every inbound port captured".to_string() } else { now.to_string() }
)]
pub(crate) struct UncapturedConflict {
    uid: WorkloadUid,
    now: crate::capture::Uncaptured,
}
