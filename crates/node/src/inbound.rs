//! Inbound: HBONE terminated with the pod's own certificate, authorized, forwarded to the pod;
//! and plain TCP from outside the mesh, authorized without an identity.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferry_core::authz::{self, ConnInfo, Verdict};
use ferry_core::identity::Identity;
use ferry_core::inbound::{self, InboundPlan};
use ferry_core::model::Workload;
use ferry_core::ports;
use ferry_core::snapshot::Snapshot;
use ferry_hbone::copy;
use ferry_hbone::headers::{Baggage, ConnectHeaders, Refusal};
use ferry_hbone::pool::PoolKey;
use ferry_hbone::server::{ConnectRequest, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_hbone::socket::reset_tcp;
use ferry_hbone::upstream::Forward;
use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};

use crate::node::{Node, Pod};
use ferry_runtime::telemetry::{AccessLog, Labels, Reporter};

/// Authorizes a connection to `pod` (workload `dst` in `snap`) on `port`.
fn authorize(
    snap: &Snapshot,
    dst: &Workload,
    pod: &Pod,
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
            destination_ip: pod.ip,
            destination_port: port,
            // HTTP facts are judged by the waypoint: the one this connection is about to be
            // sent through, or the one it came from.
            via_waypoint: to_waypoint || authz::is_waypoint_of(snap, dst, peer),
        },
    )
}

/// The metric labels of a connection to `pod`, from what its tunnel says about its source
/// (`headers`: baggage names the cluster; the inner request of double HBONE names the network).
fn labels(
    dst: Option<&Workload>,
    pod: &Pod,
    peer: Option<&Identity>,
    flags: &str,
    headers: Option<&ConnectHeaders>,
) -> Labels {
    let unknown = || "unknown".to_string();
    let baggage = headers
        .map(ConnectHeaders::typed_baggage)
        .unwrap_or_default();
    Labels {
        reporter: Reporter::Destination,
        source_workload: unknown(),
        source_principal: peer.map_or_else(unknown, ToString::to_string),
        source_cluster: baggage.cluster.unwrap_or_else(unknown),
        source_network: headers
            .and_then(|h| h.forwarded_network.clone())
            .unwrap_or_else(unknown),
        destination_workload: pod.name.clone(),
        destination_service: unknown(),
        destination_principal: pod.identity.to_string(),
        destination_cluster: dst.map_or_else(unknown, |w| w.cluster.to_string()),
        destination_network: dst.map_or_else(unknown, |w| w.network.to_string()),
        response_flags: flags.into(),
    }
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
    /// Counted as opened under these; closed under the same.
    labels: Arc<Labels>,
    /// How the tunnel came, for the access log.
    path: String,
    /// The connection counted as open (for the drain and memory) until it is dropped.
    _open: Open,
}

/// One open proxied connection of the node, counted until dropped.
pub(crate) struct Open(Arc<Node>);

impl Open {
    pub(crate) fn new(node: &Arc<Node>) -> Self {
        node.opened();
        Self(node.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Inbound {
    fn access_log(&self, req: &ConnectRequest, dst_addr: String, path: String) -> AccessLog<'_> {
        AccessLog {
            direction: "inbound",
            src_addr: req.peer_addr.to_string(),
            src_workload: "",
            src_identity: req.peer.to_string(),
            dst_addr,
            dst_workload: self.pod.uid.to_string(),
            dst_identity: self.pod.identity.to_string(),
            path,
            ..AccessLog::default()
        }
    }
}

impl Handler for Inbound {
    type Admit = Admitted;

    fn admit(&self, req: &ConnectRequest) -> Result<Admitted, Refusal> {
        let snap = self.node.store.load();
        let to = inbound::resolve_target(&snap, &self.pod.uid, self.pod.ip, &req.target).map_err(
            |e| {
                if e.is_bad_request() {
                    Refusal::BadRequest(e.to_string())
                } else {
                    Refusal::Unavailable(e.to_string())
                }
            },
        )?;
        ports::refuse_recursion(self.pod.ip, to).map_err(|e| Refusal::BadRequest(e.to_string()))?;
        let dst = snap
            .workload(&self.pod.uid)
            .ok_or_else(|| Refusal::Unavailable("the pod left the mesh".into()))?;
        let headers = ConnectHeaders::read(&req.headers);
        let path = hbone_path(&snap, dst, &req.peer, &headers);
        let verdict = authorize(
            &snap,
            dst,
            &self.pod,
            Some(&req.peer),
            req.peer_addr,
            to.port(),
            false,
        );
        if !verdict.is_allowed() {
            let why = verdict.to_string();
            let l = labels(
                Some(dst),
                &self.pod,
                Some(&req.peer),
                "DENY",
                Some(&headers),
            );
            self.node.metrics.opened(&l);
            self.node.metrics.closed(&l, 0, 0);
            let mut log = self.access_log(req, to.to_string(), path);
            log.error = Some(why.clone());
            log.emit();
            return Err(Refusal::Denied(why));
        }
        let labels = self.node.metrics.opened_shared(labels(
            Some(dst),
            &self.pod,
            Some(&req.peer),
            "-",
            Some(&headers),
        ));
        Ok(Admitted {
            to,
            labels,
            path,
            _open: Open::new(&self.node),
        })
    }

    fn connect(
        &self,
        req: &ConnectRequest,
        admitted: &mut Admitted,
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let (pod, node, peer, to) = (
            self.pod.clone(),
            self.node.clone(),
            req.peer.clone(),
            admitted.to,
        );
        let (id, src) = (req.id, req.peer_addr);
        async move {
            let up = pod
                .netns
                .connect(None, to)
                .await
                .map_err(|e| Refusal::Unavailable(format!("connect {to}: {e}")))?;
            ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
            node.conns
                .track(id, pod.clone(), Some(peer), src, to.port(), &up);
            Ok(up.into())
        }
    }

    fn finished(&self, req: &ConnectRequest, admitted: Admitted, outcome: &Outcome<'_>) {
        self.node.conns.forget(req.id);
        self.node
            .metrics
            .closed(&admitted.labels, outcome.sent, outcome.received);
        let mut log = self.access_log(req, req.target.to_string(), admitted.path);
        log.bytes_sent = outcome.sent;
        log.bytes_recv = outcome.received;
        log.error = outcome.error();
        log.emit();
    }
}

/// How a tunnel came: `hbone`, or, from the pod's own waypoint, `hbone from waypoint <id> for
/// <original source>` (the waypoint's word is taken only from the pod's waypoint).
fn hbone_path(
    snap: &Snapshot,
    dst: &Workload,
    peer: &Identity,
    headers: &ConnectHeaders,
) -> String {
    match headers.typed_baggage().source_principal {
        Some(original) if authz::is_waypoint_of(snap, dst, Some(peer)) => {
            format!("hbone from waypoint {peer} for {original}")
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

/// Serves plain TCP captured on the pod's inbound port (sources outside the mesh).
pub(crate) async fn serve_plain(node: Arc<Node>, pod: Arc<Pod>, listener: TcpListener) {
    loop {
        let (tcp, peer) = tokio::select! {
            c = node.acceptor.accept(&listener, "inbound plain") => c,
            () = node.drain.draining() => return,
        };
        let (n, pod) = (node.clone(), pod.clone());
        node.drain.spawn(plain(n, pod, tcp, peer));
    }
}

async fn plain(node: Arc<Node>, pod: Arc<Pod>, tcp: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    ferry_runtime::sockets::tune_app_socket(&tcp, node.idle_bound);
    // Counted as open, so a drain waits for it (and ends it at the deadline).
    let _open = Open::new(&node);
    let mut log = AccessLog {
        direction: "inbound",
        src_addr: peer.to_string(),
        src_identity: "(none: plain TCP)".into(),
        dst_workload: pod.uid.to_string(),
        dst_identity: pod.identity.to_string(),
        path: "plain tcp".into(),
        ..AccessLog::default()
    };
    let result = plain_relay(&node, &pod, tcp, peer, &mut log).await;
    match result {
        Ok((s, r)) => {
            log.bytes_sent = s;
            log.bytes_recv = r;
        }
        Err(e) => log.error = Some(e),
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
) -> Result<(u64, u64), String> {
    let Some(orig) = SockRef::from(&tcp)
        .original_dst_v4()
        .ok()
        .and_then(|a| a.as_socket())
    else {
        reset_tcp(&tcp);
        return Err("no original destination".into());
    };
    log.dst_addr = orig.to_string();
    let (plan, l) = {
        let snap = node.store.load();
        let plan = inbound::plan_inbound(&snap, &pod.uid, pod.ip, inbound::Arrival::Plain(orig));
        let dst = snap.workload(&pod.uid).map(|w| &**w);
        let verdict = match (&plan, dst) {
            (InboundPlan::Refuse(e), _) => Err(e.to_string()),
            (_, None) => Err("the pod left the mesh".to_string()),
            (plan, Some(dst)) => Ok(authorize(
                &snap,
                dst,
                pod,
                None,
                peer,
                orig.port(),
                matches!(plan, InboundPlan::ViaWaypoint(_)),
            )),
        };
        match verdict {
            Ok(v) if v.is_allowed() => {}
            Ok(v) => {
                let l = labels(dst, pod, None, "DENY", None);
                node.metrics.opened(&l);
                node.metrics.closed(&l, 0, 0);
                reset_tcp(&tcp);
                return Err(v.to_string());
            }
            Err(e) => {
                reset_tcp(&tcp);
                return Err(e);
            }
        }
        (
            plan,
            node.metrics
                .opened_shared(labels(dst, pod, None, "-", None)),
        )
    };
    let r = match plan {
        // A destination served by a waypoint: plain TCP from outside the mesh goes through it.
        InboundPlan::ViaWaypoint(wp) => {
            log.path = format!("plain tcp via waypoint {}", wp.waypoint);
            log.dst_hbone_addr = wp.hbone.to_string();
            via_waypoint(node, pod, &mut tcp, peer, orig, wp).await
        }
        InboundPlan::Deliver(to) => to_pod(node, pod, &mut tcp, peer, to).await,
        InboundPlan::Refuse(e) => Err(e.to_string()),
    };
    if r.is_err() {
        reset_tcp(&tcp);
    }
    let (s, rcv) = *r.as_ref().unwrap_or(&(0, 0));
    node.metrics.closed(&l, s, rcv);
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
) -> Result<(u64, u64), String> {
    let creds = node
        .certs
        .fetch(&pod.identity)
        .await
        .map_err(|e| e.to_string())?;
    let key = PoolKey::new(pod.identity.clone(), pod.ip, wp.hbone, vec![wp.identity]);
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
    let mut tunnel = node
        .pool
        .open(&key, &creds, &node.bundle(), &orig.to_string(), &headers)
        .await
        .map_err(|e| e.to_string())?;
    copy::relay(tcp, &mut tunnel, node.bounds())
        .await
        .map_err(|e| e.to_string())
}

/// Carries a plain connection to the pod itself.
async fn to_pod(
    node: &Node,
    pod: &Arc<Pod>,
    tcp: &mut TcpStream,
    peer: SocketAddr,
    to: SocketAddr,
) -> Result<(u64, u64), String> {
    let mut up = pod
        .netns
        .connect(None, to)
        .await
        .map_err(|e| e.to_string())?;
    ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
    let id = u64::MAX - node.connections.fetch_add(1, Ordering::Relaxed);
    node.conns
        .track(id, pod.clone(), None, peer, to.port(), &up);
    let r = copy::relay(tcp, &mut up, node.bounds())
        .await
        .map_err(|e| e.to_string());
    node.conns.forget(id);
    r
}
