//! Inbound: HBONE terminated with the pod's own certificate, authorized, forwarded to the pod;
//! and plain TCP from outside the mesh, authorized without an identity.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::app_source::{self, AppSource, TunnelSource};
use ferry_core::authz::{self, ConnInfo, Verdict};
use ferry_core::hop::{self, OriginError, PeerCluster};
use ferry_core::identity::Identity;
use ferry_core::inbound::{self, InboundPlan};
use ferry_core::model::{Service, Workload};
use ferry_core::ports;
use ferry_core::route::Destination;
use ferry_core::snapshot::{AddressOwner, Snapshot};
use ferry_core::telemetry;
use ferry_hbone::copy;
use ferry_hbone::headers::{Baggage, ConnectHeaders, Refusal};
use ferry_hbone::pool::PoolKey;
use ferry_hbone::server::{ConnectRequest, Ended, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_hbone::socket::reset_tcp;
use ferry_hbone::upstream::{Forward, Until};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use ferry_runtime::conn::{ConnError, ConnErrorKind, Denial, ResponseFlag};
use ferry_runtime::sockets::original_dst;
use ferry_runtime::telemetry::{AccessLog, Labels, Reporter, SecurityPolicy, UNKNOWN};
use ferry_runtime::text::Text;

use crate::state::{Node, Open, Pod};

/// Authorizes a connection to the pod at `pod_ip` (workload `dst` in `snap`) on `port`.
fn authorize(
    snap: &Snapshot,
    dst: &Workload,
    pod_ip: IpAddr,
    peer: Option<&Identity>,
    src: SocketAddr,
    port: u16,
    to_waypoint: bool,
) -> Verdict {
    authz::authorize(
        snap,
        dst,
        &ConnInfo {
            source_identity: peer,
            source_ip: src.ip(),
            destination_ip: pod_ip,
            destination_port: port,
            // HTTP facts are judged by the waypoint: the one this connection is about to be
            // sent through, or the one it came from.
            via_waypoint: to_waypoint || authz::is_waypoint_of(snap, dst, peer),
        },
    )
}

/// What a tunnel's admission judged beyond its source address and port: its verified peer,
/// the cluster the peer's certificate proves, and what its CONNECT named.
#[derive(Clone, Copy)]
struct TunnelFacts<'a> {
    peer: &'a Identity,
    cluster: &'a PeerCluster,
    target: &'a Destination,
}

/// Whether a connection from `src` to `dst` (the pod at `pod_ip`) on `port` is admitted in
/// `snap`: for a tunnel, scope first (what the CONNECT named must admit the cluster its peer's
/// certificate proves, [`hop::destination_admits`]), then policy. Plain TCP from outside the mesh
/// (`tunnel` is `None`) proves no cluster and has no scope checked: policy only. The same rule at
/// admission and on each snapshot change ([`Held::check`]). The error is a denial or an
/// out-of-scope refusal.
fn judge(
    snap: &Snapshot,
    dst: &Workload,
    pod_ip: IpAddr,
    src: SocketAddr,
    port: u16,
    tunnel: Option<TunnelFacts<'_>>,
) -> Result<(), ConnError> {
    if let Some(t) = tunnel {
        hop::destination_admits(snap, dst, t.target, port, t.cluster)?;
    }
    let verdict = authorize(snap, dst, pod_ip, tunnel.map(|t| t.peer), src, port, false);
    if verdict.is_allowed() {
        Ok(())
    } else {
        Err(Denial(verdict).into())
    }
}

/// A connection to `pod` held open, judged again with what it was admitted on ([`judge`]) on
/// each snapshot change.
struct Held {
    node: Arc<Node>,
    pod: Arc<Pod>,
    src: SocketAddr,
    port: u16,
    /// A tunnel's peer, proven cluster and target; `None` for plain TCP from outside the mesh.
    tunnel: Option<HeldTunnel>,
}

/// [`TunnelFacts`], kept for as long as the tunnel is held: the peer and its proven cluster are
/// its HBONE connection's, shared by every tunnel on it.
struct HeldTunnel {
    peer: Arc<Identity>,
    cluster: Arc<PeerCluster>,
    target: Destination,
}

impl Held {
    /// Resolves with the first denial after a change on `changes` (see
    /// [`ferry_runtime::recheck::until_denied`]). For plain TCP from outside the mesh, which
    /// has no scope: only a policy can end it.
    fn until_denied(self, changes: watch::Receiver<u64>) -> impl Future<Output = Denial> + Send {
        ferry_runtime::recheck::until_denied(changes, move || match self.check() {
            Err(ConnError {
                kind: ConnErrorKind::Denied(d),
                ..
            }) => Err(d),
            _ => Ok(()),
        })
    }

    /// The same, as what a tunnel's copy waits on: ended by a denial, or by a scope that no
    /// longer admits its origin (the copy ends with the [`Denial`] or the [`OriginError`],
    /// read back in `finished`).
    fn interrupt(self, changes: watch::Receiver<u64>) -> Until {
        ferry_runtime::recheck::interrupt_on_denial(changes, move || {
            self.check().map_err(|e| -> Box<dyn std::error::Error + Send + Sync> {
                match e.kind {
                    ConnErrorKind::Denied(d) => Box::new(d),
                    ConnErrorKind::OutOfScope(o) => {
                        tracing::info!(dst.workload = %self.pod.uid, src.addr = %self.src, error = %o, "connection closed: no longer admitted by scope");
                        Box::new(o)
                    }
                    _ => Box::new(e),
                }
            })
        })
    }

    fn check(&self) -> Result<(), ConnError> {
        let snap = self.node.store.load();
        // A pod that left the mesh keeps its connections until it is removed (they end with it).
        let Some(dst) = snap.workload(&self.pod.uid) else {
            return Ok(());
        };
        let tunnel = self.tunnel.as_ref().map(|t| TunnelFacts {
            peer: &t.peer,
            cluster: &t.cluster,
            target: &t.target,
        });
        judge(
            &snap,
            dst,
            self.pod.ip_like(self.src.ip()),
            self.src,
            self.port,
            tunnel,
        )
    }
}

/// A tunnel closed because a scope change no longer admits its origin ([`Held::interrupt`]).
fn out_of_scope(outcome: &Outcome<'_>) -> Option<ConnError> {
    match &outcome.ended {
        Ended::Closed(reason) => reason
            .downcast_ref::<OriginError>()
            .map(|e| ConnError::from(e.clone())),
        _ => None,
    }
}

/// What a tunnel proves and claims about its source, for the metrics' labels.
#[derive(Clone, Copy)]
struct SourceFacts<'a> {
    peer: &'a Identity,
    cluster: &'a PeerCluster,
    /// The workload the peer proved ([`proven_source`]).
    workload: Option<&'a Workload>,
    headers: &'a ConnectHeaders,
}

/// The metric labels of a connection to the pod of workload `dst` (which proves `identity`),
/// counted under `service` if one fits ([`telemetry::inbound_service`]). A tunnel (`tunnel`
/// given) is `mutual_tls`, plain TCP from outside the mesh `none`. A tunnel's `source_*` labels
/// are those of the workload it proves, else `unknown`: its baggage is a claim and names none
/// of them. Two labels take a claim when nothing proves them, as Istio takes its
/// `source_cluster` from the baggage: `source_cluster` ([`source_cluster`]) and Ferry's
/// `source_network` (the proven workload's, else what the inner request of double HBONE
/// names).
fn labels(
    dst: &Workload,
    identity: &Identity,
    service: Option<&Service>,
    tunnel: Option<SourceFacts<'_>>,
    flag: ResponseFlag,
) -> Labels {
    let policy = match tunnel {
        Some(_) => SecurityPolicy::MutualTls,
        None => SecurityPolicy::None,
    };
    let mut l = Labels::new(Reporter::Destination, policy).with_destination(dst);
    l.destination_principal = identity.to_string();
    if let Some(s) = service {
        l = l.with_service(s);
    }
    if let Some(t) = tunnel {
        l.source_principal = t.peer.to_string();
        match t.workload {
            Some(w) => l = l.with_source(w),
            None => {
                if let Some(network) = &t.headers.forwarded_network {
                    l.source_network.clone_from(network);
                }
            }
        }
        l.source_cluster = source_cluster(t.cluster, t.workload, t.headers);
    }
    l.response_flags = flag.into();
    l
}

/// A tunnel's `source_cluster` label: the cluster the peer's certificate proves; for a
/// certificate without one (another trust source), the cluster of the workload it proved, else
/// the one its baggage claims (read only then).
fn source_cluster(
    peer: &PeerCluster,
    workload: Option<&Workload>,
    headers: &ConnectHeaders,
) -> String {
    match (peer.proven(), workload) {
        (Some(proven), _) => proven.to_string(),
        (None, Some(w)) => w.cluster.to_string(),
        (None, None) => headers
            .typed_baggage()
            .cluster
            .unwrap_or_else(|| UNKNOWN.to_string()),
    }
}

/// A tunnel's labels: its own until it is counted opened, then the metrics' shared copy (a
/// long connection holds a pointer, not twenty strings).
enum Counted {
    Pending(Box<Labels>),
    Opened(Arc<Labels>),
}

/// The HBONE handler of one pod.
struct Inbound {
    node: Arc<Node>,
    pod: Arc<Pod>,
}

/// One admitted tunnel: what `admit` derived, from one snapshot and one read of the CONNECT
/// headers, carried to `connect` and `finished`.
struct Admitted {
    /// The pod's address and port the tunnel goes to.
    to: SocketAddr,
    /// The client's address the app sees the connection from ([`app_source`]); `None`: the
    /// pod's own.
    client: Option<IpAddr>,
    /// Counted opened under these when the pod is reached (or opened and closed at once if the
    /// dial failed); closed under the same.
    labels: Counted,
    /// Why `connect` failed, if it did (the server reports only the refusal).
    error: Option<Box<ConnError>>,
    /// Snapshot changes since just before the one it was admitted on: each re-checks it.
    /// Moved into the tunnel's re-check when it is connected.
    changes: Option<watch::Receiver<u64>>,
    /// How the tunnel came, for the access log.
    path: Cow<'static, str>,
    /// The source workload the peer proved, for the access log ([`proven_source`]).
    src_workload: String,
    /// When `admit` began, and how long after it the decision was taken and the pod reached
    /// (microseconds; 0 when not reached): the record's phases.
    started: Instant,
    decided_us: u32,
    connected_us: u32,
    /// The connection counted as open (for the drain and memory) until it is dropped.
    _open: Open,
}

fn micros_since(t: Instant) -> u32 {
    u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX)
}

fn phase(us: u32) -> Option<Duration> {
    (us > 0).then(|| Duration::from_micros(u64::from(us)))
}

impl Inbound {
    /// The access-log line of a tunnel, with ztunnel's meanings: `dst.addr` the address it
    /// arrived at (the pod's HBONE port), `dst.hbone_addr` the target it asked for.
    fn access_log<'a>(
        &'a self,
        req: &ConnectRequest,
        src_workload: &'a str,
        path: Cow<'static, str>,
    ) -> AccessLog<'a> {
        AccessLog {
            direction: "inbound",
            src_addr: req.peer_addr.into(),
            src_workload,
            src_identity: (&*req.peer).into(),
            dst_addr: SocketAddr::new(self.pod.ip_like(req.peer_addr.ip()), ports::HBONE_PORT)
                .into(),
            dst_hbone_addr: req.target.to_string().into(),
            dst_workload: (&self.pod.uid).into(),
            dst_identity: (&self.pod.identity).into(),
            src_cluster: match &*req.peer_cluster {
                PeerCluster::Proven(c) => c.into(),
                PeerCluster::Unproven => "(unproven)".into(),
            },
            dst_cluster: self
                .node
                .store
                .load()
                .workload(&self.pod.uid)
                .map(|w| Text::from(&w.cluster))
                .unwrap_or_default(),
            path: path.into(),
            trace_id: req.trace_id.map_or(Text::Empty, Text::trace),
            ..AccessLog::default()
        }
    }
}

impl Handler for Inbound {
    type Admit = Admitted;

    fn admit(&self, req: &ConnectRequest) -> Result<Admitted, Refusal> {
        let started = Instant::now();
        // Taken before the snapshot: a change after this one re-checks the tunnel.
        let changes = ferry_runtime::recheck::from_now(&self.node.changes);
        let snap = self.node.store.load();
        let pod_ip = tunnel_pod_ip(&self.pod, req);
        let to = inbound::resolve_target(&snap, &self.pod.uid, pod_ip, &req.target)
            .map_err(|e| ConnError::from(e).refusal())?;
        ports::refuse_recursion(pod_ip, to).map_err(|e| ConnError::from(e).refusal())?;
        let dst = snap
            .workload(&self.pod.uid)
            .ok_or_else(|| ConnError::from(inbound::InboundError::LeftMesh).refusal())?;
        let headers = ConnectHeaders::read(&req.headers);
        let client = app_source::for_destination(
            &snap,
            dst,
            to.ip(),
            &TunnelSource {
                peer: &req.peer,
                peer_ip: req.peer_addr.ip(),
                network: &dst.network,
                forwarded_for: headers.forwarded_for.map(|a| a.ip()),
                forwarded_network: headers.forwarded_network.as_deref(),
            },
        );
        let path = with_app_source(hbone_path(&snap, dst, &req.peer, &headers), &client);
        let source = proven_source(&snap, dst, req.peer_addr.ip(), &req.peer);
        let src_workload = source.map(|w| w.name.clone()).unwrap_or_default();
        let service =
            telemetry::inbound_service(&snap, dst, headers.forwarded_host.as_deref(), to.port());
        let mut labels = labels(
            dst,
            &self.pod.identity,
            service.map(|s| &**s),
            Some(SourceFacts {
                peer: &req.peer,
                cluster: &req.peer_cluster,
                workload: source,
                headers: &headers,
            }),
            ResponseFlag::None,
        );
        // The last hop checks scope too, against the cluster the peer's certificate proves
        // (the baggage's is a hint for the metrics' labels), then policy.
        let tunnel = TunnelFacts {
            peer: &req.peer,
            cluster: &req.peer_cluster,
            target: &req.target,
        };
        if let Err(e) = judge(&snap, dst, pod_ip, req.peer_addr, to.port(), Some(tunnel)) {
            labels.response_flags = e.flag.into();
            self.node.metrics.opened(&labels);
            self.node.metrics.closed(&labels, 0, 0);
            self.node
                .metrics
                .denials
                .count_error(Reporter::Destination, &e);
            let mut log = self.access_log(req, &src_workload, path);
            log.phases.decision = Some(started.elapsed());
            log.fail(&e);
            log.emit();
            return Err(e.refusal());
        }
        Ok(Admitted {
            to,
            client: client.ip(),
            labels: Counted::Pending(Box::new(labels)),
            error: None,
            changes: Some(changes),
            path,
            src_workload,
            decided_us: micros_since(started).max(1),
            connected_us: 0,
            started,
            _open: Open::new(&self.node),
        })
    }

    fn connect(
        &self,
        req: &ConnectRequest,
        admitted: &mut Admitted,
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let (pod, node, to) = (self.pod.clone(), self.node.clone(), admitted.to);
        let from = pod.source_for(admitted.client, to);
        let held = Held {
            node: node.clone(),
            pod: pod.clone(),
            src: req.peer_addr,
            port: to.port(),
            tunnel: Some(HeldTunnel {
                peer: req.peer.clone(),
                cluster: req.peer_cluster.clone(),
                target: req.target.clone(),
            }),
        };
        async move {
            let up = match connect_app(&pod, from, 0, to).await {
                Ok(up) => up,
                Err(e) => {
                    // Counted opened and closed under the failure's flag, in `finished`.
                    let e = ConnError::connect(to, e);
                    let refusal = e.refusal();
                    if let Counted::Pending(l) = &mut admitted.labels {
                        l.response_flags = e.flag.into();
                    }
                    admitted.error = Some(Box::new(e));
                    return Err(refusal);
                }
            };
            ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
            admitted.connected_us = micros_since(admitted.started).max(1);
            if let Counted::Pending(l) = &admitted.labels {
                admitted.labels = Counted::Opened(node.metrics.opened_shared((**l).clone()));
            }
            let changes = admitted
                .changes
                .take()
                .unwrap_or_else(|| ferry_runtime::recheck::from_now(&node.changes));
            Ok(Forward::from(up).until(held.interrupt(changes)))
        }
    }

    fn finished(&self, req: &ConnectRequest, mut admitted: Admitted, outcome: &Outcome<'_>) {
        match &admitted.labels {
            Counted::Opened(labels) => {
                self.node
                    .metrics
                    .closed(labels, outcome.sent, outcome.received);
            }
            Counted::Pending(labels) => {
                self.node.metrics.opened(labels);
                self.node.metrics.closed(labels, 0, 0);
            }
        }
        let error = admitted
            .error
            .take()
            .map(|e| *e)
            .or_else(|| out_of_scope(outcome))
            .or_else(|| ConnError::from_outcome(outcome));
        // A tunnel that was up and then failed (a refusal was counted when it was made).
        if let (Counted::Opened(labels), Some(e)) = (&admitted.labels, &error) {
            self.node.metrics.failed_after_open(labels, e.flag);
            self.node
                .metrics
                .denials
                .count_error(Reporter::Destination, e);
        }
        let path = std::mem::take(&mut admitted.path);
        let mut log = self.access_log(req, &admitted.src_workload, path);
        log.phases.decision = phase(admitted.decided_us);
        log.phases.connect = phase(admitted.connected_us);
        log.bytes_sent = outcome.sent;
        log.bytes_recv = outcome.received;
        if let Some(e) = &error {
            log.fail(e);
        }
        log.emit();
    }
}

/// Connects to `to` in `pod` from `from` (the client's address, never from its port
/// `client_port`), else from the pod's own address.
async fn connect_app(
    pod: &Pod,
    from: Option<IpAddr>,
    client_port: u16,
    to: SocketAddr,
) -> std::io::Result<TcpStream> {
    match from {
        Some(ip) => {
            pod.netns
                .connect_from(SocketAddr::new(ip, client_port), to)
                .await
        }
        None => pod.netns.connect(None, to).await,
    }
}

/// `path`, and, when the app does not see the client's address, why (the decision record says
/// so).
fn with_app_source(path: Cow<'static, str>, source: &AppSource) -> Cow<'static, str> {
    match source {
        AppSource::Use { .. } => path,
        AppSource::Own(why) => format!("{path}; the app sees the pod's own address: {why}").into(),
    }
}

/// The workload a tunnel came from, when its certificate proves it: the workload at the
/// tunnel's source address (on `dst`'s network) holds the identity the peer proved. A tunnel
/// relayed by a gateway or from an unknown address names none.
fn proven_source<'s>(
    snap: &'s Snapshot,
    dst: &Workload,
    peer_ip: IpAddr,
    peer: &Identity,
) -> Option<&'s Workload> {
    let addr = ferry_core::model::NetworkAddress::new(dst.network.clone(), peer_ip);
    let Some(AddressOwner::Workload(uid)) = snap.owner(&addr) else {
        return None;
    };
    let w = snap.workload(uid)?;
    (w.identity().ok().as_ref() == Some(peer)).then_some(&**w)
}

/// How a tunnel came: `hbone`, or, from the pod's own waypoint, `hbone from waypoint <id> for
/// <original source>` (the waypoint's word is taken only from the pod's waypoint).
fn hbone_path(
    snap: &Snapshot,
    dst: &Workload,
    peer: &Identity,
    headers: &ConnectHeaders,
) -> Cow<'static, str> {
    match headers.typed_baggage().source_principal {
        Some(original) if authz::is_waypoint_of(snap, dst, Some(peer)) => {
            format!("hbone from waypoint {peer} for {original}").into()
        }
        _ => "hbone".into(),
    }
}

/// Serves HBONE on the pod's port 15008 with the pod's current certificate.
pub(crate) async fn serve_hbone(node: Arc<Node>, pod: Arc<Pod>, listener: TcpListener) {
    let hbone = ferry_runtime::serve::Hbone {
        what: "hbone",
        identity: pod.identity.clone(),
        certs: node.certs.clone(),
        bundle: node.bundle(),
        settings: Settings {
            half_closed_idle: Some(node.idle_bound),
            ..Settings::default()
        },
        acceptor: node.acceptor.clone(),
        drain: node.drain.clone(),
        open: node.hbone_conns.clone(),
    };
    let handler = Arc::new(Inbound { node, pod });
    ferry_runtime::serve::serve_hbone(listener, hbone, handler).await;
}

/// How a plain TCP connection from outside the mesh came, in its access log.
const PLAIN_PATH: &str = "plain tcp";

/// Serves one plain TCP connection captured on the pod's inbound port (sources outside the
/// mesh).
pub(crate) async fn plain(node: Arc<Node>, pod: Arc<Pod>, tcp: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    ferry_runtime::sockets::tune_app_socket(&tcp, node.idle_bound);
    // Counted as open, so a drain waits for it (and ends it at the deadline).
    let _open = Open::new(&node);
    let mut log = AccessLog {
        direction: "inbound",
        src_addr: peer.into(),
        src_identity: "(none: plain TCP)".into(),
        dst_workload: (&pod.uid).into(),
        dst_identity: (&pod.identity).into(),
        path: PLAIN_PATH.into(),
        ..AccessLog::default()
    };
    match plain_relay(&node, &pod, tcp, peer, &mut log).await {
        Ok((s, r)) => {
            log.bytes_sent = s;
            log.bytes_recv = r;
        }
        Err(e) => {
            (log.bytes_sent, log.bytes_recv) = e.moved();
            log.fail(&e);
        }
    }
    log.duration = started.elapsed();
    log.emit();
}

/// Decides about one plain connection from outside the mesh (one snapshot), then carries it:
/// to the pod, or through the pod's waypoint. The app side is reset on any failure.
async fn plain_relay(
    node: &Arc<Node>,
    pod: &Arc<Pod>,
    mut tcp: TcpStream,
    peer: SocketAddr,
    log: &mut AccessLog<'_>,
) -> Result<(u64, u64), ConnError> {
    let r = plain_checked(node, pod, &mut tcp, peer, log).await;
    if r.is_err() {
        reset_tcp(&tcp);
    }
    r
}

/// The pod's address a tunnel is for: of its target's family when the target is an address
/// (it must be the pod's own), else of the tunnel's own (a hostname target).
fn tunnel_pod_ip(pod: &Pod, req: &ConnectRequest) -> IpAddr {
    match &req.target {
        Destination::Addr(a) => pod.ip_like(a.ip()),
        Destination::Host { .. } => pod.ip_like(req.peer_addr.ip()),
    }
}

async fn plain_checked(
    node: &Arc<Node>,
    pod: &Arc<Pod>,
    tcp: &mut TcpStream,
    peer: SocketAddr,
    log: &mut AccessLog<'_>,
) -> Result<(u64, u64), ConnError> {
    let orig = original_dst(tcp).map_err(ConnError::no_original_dst)?;
    log.dst_addr = orig.into();
    // Taken before the snapshot: a change after this one re-checks the connection.
    let changes = ferry_runtime::recheck::from_now(&node.changes);
    let (plan, l) = {
        let snap = node.store.load();
        let pod_ip = pod.ip_like(orig.ip());
        let plan = inbound::plan_inbound(&snap, &pod.uid, pod_ip, inbound::Arrival::Plain(orig));
        let (plan, dst) = match (plan, snap.workload(&pod.uid)) {
            (InboundPlan::Refuse(e), _) => return Err(e.into()),
            (_, None) => return Err(inbound::InboundError::LeftMesh.into()),
            (plan, Some(dst)) => (plan, dst),
        };
        let verdict = authorize(
            &snap,
            dst,
            pod_ip,
            None,
            peer,
            orig.port(),
            matches!(plan, InboundPlan::ViaWaypoint(_)),
        );
        let service = telemetry::inbound_service(&snap, dst, None, orig.port()).map(|s| &**s);
        let mut l = labels(dst, &pod.identity, service, None, ResponseFlag::None);
        if !verdict.is_allowed() {
            node.metrics.denials.count(Reporter::Destination, &verdict);
            let e = ConnError::from(Denial(verdict));
            l.response_flags = e.flag.into();
            node.metrics.opened(&l);
            node.metrics.closed(&l, 0, 0);
            return Err(e);
        }
        (plan, l)
    };
    match plan {
        // A destination served by a waypoint: plain TCP from outside the mesh goes through it.
        InboundPlan::ViaWaypoint(wp) => {
            log.path = format!("{PLAIN_PATH} via waypoint {}", wp.waypoint).into();
            // Dialled: the waypoint; asked of it: the original destination.
            log.dst_addr = wp.hbone.into();
            log.dst_hbone_addr = orig.into();
            via_waypoint(node, pod, tcp, peer, orig, wp, l).await
        }
        InboundPlan::Deliver(to) => {
            let client = app_source::for_plain(peer.ip(), to.ip());
            log.path = with_app_source(PLAIN_PATH.into(), &client).into();
            to_pod(node, pod, tcp, peer, to, client.ip(), l, changes).await
        }
        InboundPlan::Refuse(e) => Err(e.into()),
    }
}

/// Counts a plain connection opened once its next hop is reached (opened and closed at once
/// under the failure's flag if it is not), copies, and counts it closed.
/// Ended, both sides reset, if `until` resolves first (a policy change that denies it).
async fn carry<U>(
    node: &Node,
    tcp: &mut TcpStream,
    up: Result<U, ConnError>,
    mut labels: Labels,
    until: impl std::future::Future<Output = Denial>,
) -> Result<(u64, u64), ConnError>
where
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + ferry_hbone::copy::Reset + Unpin,
{
    let mut up = match up {
        Ok(up) => up,
        Err(e) => {
            labels.response_flags = e.flag.into();
            node.metrics.opened(&labels);
            node.metrics.closed(&labels, 0, 0);
            return Err(e);
        }
    };
    let labels = node.metrics.opened_shared(labels);
    let r = copy::relay_until(tcp, &mut up, node.bounds(), until)
        .await
        .map_err(ConnError::from);
    let (s, rcv) = match &r {
        Ok(moved) => *moved,
        Err(e) => e.moved(),
    };
    node.metrics.closed(&labels, s, rcv);
    if let Err(e) = &r {
        node.metrics.failed_after_open(&labels, e.flag);
        node.metrics.denials.count_error(Reporter::Destination, e);
    }
    r
}

/// Carries a plain connection through the pod's waypoint, in a tunnel under the pod's identity.
async fn via_waypoint(
    node: &Node,
    pod: &Pod,
    tcp: &mut TcpStream,
    peer: SocketAddr,
    orig: SocketAddr,
    wp: inbound::WaypointInstance,
    labels: Labels,
) -> Result<(u64, u64), ConnError> {
    let tunnel = Box::pin(async {
        let creds = node.certs.fetch(&pod.identity).await?;
        let key = PoolKey::new(
            pod.identity.clone(),
            pod.ip_like(wp.hbone.ip()),
            wp.hbone,
            vec![wp.identity],
        );
        let baggage = Baggage {
            cluster: Some(wp.cluster.to_string()),
            plaintext: true,
            ..Baggage::default()
        };
        let headers = ConnectHeaders {
            baggage: baggage.to_pairs(),
            forwarded_for: Some(peer),
            ..ConnectHeaders::default()
        };
        Ok(node
            .pool
            .open(&key, &creds, &node.bundle(), &orig.to_string(), &headers)
            .await?)
    })
    .await;
    // Not re-checked here: the waypoint judges (and re-judges) what goes through it.
    carry(node, tcp, tunnel, labels, std::future::pending()).await
}

/// Carries a plain connection to the pod itself, from `client` (the address the app sees,
/// else the pod's own).
#[allow(clippy::too_many_arguments)] // the connection's parts, each used once
async fn to_pod(
    node: &Arc<Node>,
    pod: &Arc<Pod>,
    tcp: &mut TcpStream,
    peer: SocketAddr,
    to: SocketAddr,
    client: Option<IpAddr>,
    labels: Labels,
    changes: watch::Receiver<u64>,
) -> Result<(u64, u64), ConnError> {
    let up = connect_app(pod, pod.source_for(client, to), peer.port(), to)
        .await
        .map_err(|e| ConnError::connect(to, e));
    if let Ok(up) = &up {
        ferry_runtime::sockets::tune_app_socket(up, node.idle_bound);
    }
    let held = Held {
        node: node.clone(),
        pod: pod.clone(),
        src: peer,
        port: to.port(),
        tunnel: None,
    };
    carry(node, tcp, up, labels, held.until_denied(changes)).await
}

#[cfg(test)]
mod tests;
