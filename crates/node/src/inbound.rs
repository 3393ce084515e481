//! Inbound: HBONE terminated with the pod's own certificate, authorized, forwarded to the pod;
//! and plain TCP from outside the mesh, authorized without an identity.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ferry_core::authz::{self, ConnInfo, Verdict};
use ferry_hbone::copy::{self, Failed};
use ferry_hbone::headers::{ConnectHeaders, Refusal, Target};
use ferry_hbone::pool::PoolKey;
use ferry_hbone::server::{ConnectRequest, Handler, reset_tcp};
use ferry_hbone::settings::Settings;
use socket2::SockRef;
use tokio::net::{TcpListener, TcpStream};

use crate::capture;
use crate::node::{Node, Pod};
use ferry_runtime::telemetry::{AccessLog, Labels, Reporter};

/// Authorizes a connection to `pod` on `port`.
fn authorize(
    node: &Node,
    pod: &Pod,
    peer: Option<&ferry_core::identity::Identity>,
    src: SocketAddr,
    port: u16,
    to_waypoint: bool,
) -> Result<Verdict, String> {
    let snap = node.store.load();
    let dst = snap.workload(&pod.uid).ok_or("the pod left the mesh")?;
    Ok(authz::authorize(
        &snap,
        dst,
        &ConnInfo {
            source_identity: peer,
            source_ip: src.ip(),
            destination_ip: pod.ip,
            destination_port: port,
            // HTTP facts are judged by the waypoint: the one this connection is about to be
            // sent through, or the one it came from.
            via_waypoint: to_waypoint || authz::is_waypoint_of(&snap, dst, peer),
        },
    ))
}

fn labels(
    node: &Node,
    pod: &Pod,
    peer: Option<&ferry_core::identity::Identity>,
    flags: &str,
    headers: Option<&http::HeaderMap>,
) -> Labels {
    // What the tunnel says about its source: baggage names the cluster; the inner request of
    // double HBONE names the network it came from.
    let h = headers.map(ConnectHeaders::read).unwrap_or_default();
    let src_cluster = h
        .baggage
        .iter()
        .find(|(k, _)| k == "k8s.cluster.name")
        .map_or_else(|| "unknown".to_string(), |(_, v)| v.clone());
    let src_network = h.forwarded_network;
    let snap = node.store.load();
    let (cluster, network) = snap.workload(&pod.uid).map_or_else(
        || ("unknown".into(), "unknown".into()),
        |w| (w.cluster.to_string(), w.network.to_string()),
    );
    Labels {
        reporter: Reporter::Destination,
        source_workload: "unknown".into(),
        source_principal: peer.map_or_else(|| "unknown".into(), ToString::to_string),
        source_cluster: src_cluster,
        source_network: src_network.unwrap_or_else(|| "unknown".into()),
        destination_workload: pod.name.clone(),
        destination_service: "unknown".into(),
        destination_principal: pod.identity.to_string(),
        destination_cluster: cluster,
        destination_network: network,
        response_flags: flags.into(),
    }
}

/// The HBONE handler of one pod.
struct Inbound {
    node: Arc<Node>,
    pod: Arc<Pod>,
}

impl Handler for Inbound {
    fn check(&self, req: &ConnectRequest) -> Result<(), Refusal> {
        let target = resolve(&self.node, &self.pod, &req.target)?;
        if [
            capture::OUTBOUND_PORT,
            capture::INBOUND_PORT,
            capture::HBONE_PORT,
        ]
        .contains(&target.port())
        {
            return Err(Refusal::BadRequest(
                "attempted recursive call to the proxy's own ports".into(),
            ));
        }
        let verdict = authorize(
            &self.node,
            &self.pod,
            Some(&req.peer),
            req.peer_addr,
            target.port(),
            false,
        )
        .map_err(Refusal::Unavailable)?;
        if verdict.is_allowed() {
            return Ok(());
        }
        let why = verdict.to_string();
        let l = labels(
            &self.node,
            &self.pod,
            Some(&req.peer),
            "DENY",
            Some(&req.headers),
        );
        self.node.metrics.opened(&l);
        self.node.metrics.closed(&l, 0, 0);
        AccessLog {
            direction: "inbound",
            src_addr: req.peer_addr.to_string(),
            src_workload: "",
            src_identity: req.peer.to_string(),
            dst_addr: target.to_string(),
            dst_workload: self.pod.uid.to_string(),
            dst_identity: self.pod.identity.to_string(),
            path: hbone_path(&self.node, &self.pod, &req.peer, &req.headers),
            error: Some(why.clone()),
            ..AccessLog::default()
        }
        .emit();
        Err(Refusal::Denied(why))
    }

    fn connect(
        &self,
        req: &ConnectRequest,
    ) -> impl std::future::Future<Output = Result<ferry_hbone::upstream::Upstream, Refusal>> + Send
    {
        let (pod, node, target, peer) = (
            self.pod.clone(),
            self.node.clone(),
            req.target.clone(),
            req.peer.clone(),
        );
        let (id, src, headers) = (req.id, req.peer_addr, req.headers.clone());
        async move {
            let addr = resolve(&node, &pod, &target)?;
            node.metrics
                .opened(&labels(&node, &pod, Some(&peer), "-", Some(&headers)));
            node.opened();
            let up = pod.netns.connect(None, addr).await.map_err(|e| {
                node.active.fetch_sub(1, Ordering::Relaxed);
                Refusal::Unavailable(format!("connect {addr}: {e}"))
            })?;
            ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
            node.conns
                .track(id, pod.clone(), Some(peer), src, addr.port(), &up);
            Ok(up.into())
        }
    }

    fn finished(&self, req: &ConnectRequest, sent: u64, received: u64, error: Option<&str>) {
        self.node.conns.forget(req.id);
        self.node.active.fetch_sub(1, Ordering::Relaxed);
        self.node.metrics.closed(
            &labels(
                &self.node,
                &self.pod,
                Some(&req.peer),
                "-",
                Some(&req.headers),
            ),
            sent,
            received,
        );
        AccessLog {
            direction: "inbound",
            src_addr: req.peer_addr.to_string(),
            src_workload: "",
            src_identity: req.peer.to_string(),
            dst_addr: req.target.to_string(),
            dst_workload: self.pod.uid.to_string(),
            dst_identity: self.pod.identity.to_string(),
            path: hbone_path(&self.node, &self.pod, &req.peer, &req.headers),
            bytes_sent: sent,
            bytes_recv: received,
            error: error.map(str::to_string),
            ..AccessLog::default()
        }
        .emit();
    }
}

/// How a tunnel came: `hbone`, or, from the pod's own waypoint, `hbone from waypoint <id> for
/// <original source>` (the waypoint's word is taken only from the pod's waypoint).
fn hbone_path(
    node: &Node,
    pod: &Pod,
    peer: &ferry_core::identity::Identity,
    headers: &http::HeaderMap,
) -> String {
    let original = ConnectHeaders::read(headers)
        .baggage
        .into_iter()
        .find(|(k, _)| k == ferry_runtime::baggage::SOURCE_PRINCIPAL_KEY)
        .map(|(_, v)| v);
    let snap = node.store.load();
    match (original, snap.workload(&pod.uid)) {
        (Some(original), Some(w)) if ferry_core::authz::is_waypoint_of(&snap, w, Some(peer)) => {
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

async fn plain(node: Arc<Node>, pod: Arc<Pod>, mut tcp: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    ferry_runtime::sockets::tune_app_socket(&tcp, node.idle_bound);
    // Counted as open, so a drain waits for it (and ends it at the deadline).
    node.opened();
    let mut log = AccessLog {
        direction: "inbound",
        src_addr: peer.to_string(),
        src_identity: "(none: plain TCP)".into(),
        dst_workload: pod.uid.to_string(),
        dst_identity: pod.identity.to_string(),
        path: "plain tcp".into(),
        ..AccessLog::default()
    };
    let result: Result<(u64, u64), String> = async {
        let orig = SockRef::from(&tcp)
            .original_dst_v4()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or("no original destination")?;
        log.dst_addr = orig.to_string();
        let via = {
            let snap = node.store.load();
            snap.workload(&pod.uid)
                .and_then(|w| waypoint_instance(&snap, w))
        };
        let verdict = authorize(&node, &pod, None, peer, orig.port(), via.is_some())?;
        if !verdict.is_allowed() {
            let l = labels(&node, &pod, None, "DENY", None);
            node.metrics.opened(&l);
            node.metrics.closed(&l, 0, 0);
            return Err(verdict.to_string());
        }
        let l = labels(&node, &pod, None, "-", None);
        node.metrics.opened(&l);
        // A destination served by a waypoint: plain TCP from outside the mesh goes through it.
        if let Some((wp_addr, wp_id, wp_name, cluster)) = via {
            log.path = format!("plain tcp via waypoint {wp_name}");
            log.dst_hbone_addr = wp_addr.to_string();
            let creds = node
                .certs
                .fetch(&pod.identity)
                .await
                .map_err(|e| e.to_string())?;
            let key = PoolKey::new(pod.identity.clone(), pod.ip, wp_addr, vec![wp_id]);
            let headers = ConnectHeaders {
                baggage: vec![
                    ("k8s.cluster.name".into(), cluster),
                    (ferry_runtime::baggage::PLAINTEXT_KEY.into(), "true".into()),
                ],
                forwarded_for: Some(peer),
                ..ConnectHeaders::default()
            };
            let mut tunnel = node
                .pool
                .open(&key, &creds, &node.bundle(), &orig.to_string(), &headers)
                .await
                .map_err(|e| e.to_string())?;
            let r = copy::bidirectional_bounded(&mut tcp, &mut tunnel, node.bounds())
                .await
                .map_err(|e| {
                    if e.failed == Failed::A || e.timed_out() {
                        tunnel.abort();
                    }
                    e.to_string()
                });
            let (s, rcv) = *r.as_ref().unwrap_or(&(0, 0));
            node.metrics.closed(&l, s, rcv);
            return r;
        }
        let mut up = pod
            .netns
            .connect(None, SocketAddr::new(pod.ip, orig.port()))
            .await
            .map_err(|e| e.to_string())?;
        ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
        let id = u64::MAX - node.connections.fetch_add(1, Ordering::Relaxed);
        node.conns
            .track(id, pod.clone(), None, peer, orig.port(), &up);
        let r = match copy::bidirectional_bounded(&mut tcp, &mut up, node.bounds()).await {
            Ok(v) => Ok(v),
            Err(e) => {
                if e.failed == Failed::A || e.timed_out() {
                    reset_tcp(&up);
                }
                Err(e.to_string())
            }
        };
        node.conns.forget(id);
        let (s, rcv) = *r.as_ref().unwrap_or(&(0, 0));
        node.metrics.closed(&l, s, rcv);
        r
    }
    .await;
    match result {
        Ok((s, r)) => {
            log.bytes_sent = s;
            log.bytes_recv = r;
        }
        Err(e) => {
            reset_tcp(&tcp);
            log.error = Some(e);
        }
    }
    log.duration = started.elapsed();
    log.emit();
    node.active.fetch_sub(1, Ordering::Relaxed);
}

/// The waypoint instance that plain traffic to `dst` must go through, if `dst` has a waypoint:
/// a healthy instance on `dst`'s network that the waypoint's scope admits for `dst`'s cluster,
/// `dst`'s own cluster first. Returns (HBONE address, identity, waypoint name, `dst`'s cluster).
fn waypoint_instance(
    snap: &ferry_core::snapshot::Snapshot,
    dst: &ferry_core::model::Workload,
) -> Option<(SocketAddr, ferry_core::identity::Identity, String, String)> {
    use ferry_core::model::{GatewayDestination, Health};
    use ferry_core::snapshot::{AddressOwner, Endpoint};
    let wp = dst.waypoint.clone().or_else(|| {
        dst.services
            .keys()
            .filter_map(|k| snap.service(k))
            .find_map(|s| s.waypoint.clone())
    })?;
    let key = match &wp.destination {
        GatewayDestination::Service(k) => k.clone(),
        GatewayDestination::Address(a) => match snap.owner(a) {
            Some(AddressOwner::Service(k)) => k.clone(),
            _ => return None,
        },
    };
    let ws = snap.service(&key)?;
    let mut instances: Vec<_> = snap
        .endpoints(&key)
        .iter()
        .filter_map(|e| match e {
            Endpoint::Workload(u) => snap.workload(u),
            Endpoint::Address(_) => None,
        })
        .filter(|i| {
            i.health == Health::Healthy
                && i.network == dst.network
                && ws.scope.admits(&i.cluster, &dst.cluster)
        })
        .collect();
    instances.sort_by_key(|i| (i.cluster != dst.cluster, i.uid.clone()));
    let i = instances.first()?;
    Some((
        SocketAddr::new(*i.addresses.first()?, wp.hbone_port),
        i.identity().ok()?,
        key.to_string(),
        dst.cluster.to_string(),
    ))
}

/// Where a tunnel to `pod` goes: its own `ip:port`, or, for a `hostname:port` target (the inner
/// tunnel of double HBONE), the port of that service which this pod serves.
fn resolve(node: &Node, pod: &Pod, target: &Target) -> Result<SocketAddr, Refusal> {
    match target {
        Target::Addr(a) if a.ip() == pod.ip => Ok(*a),
        Target::Addr(a) => Err(Refusal::BadRequest(format!(
            "{a} is not this pod ({})",
            pod.ip
        ))),
        Target::Host { hostname, port } => {
            let snap = node.store.load();
            let w = snap
                .workload(&pod.uid)
                .ok_or_else(|| Refusal::Unavailable("the pod left the mesh".into()))?;
            let key = snap
                .services_by_hostname(hostname)
                .iter()
                .find(|k| w.services.contains_key(*k))
                .ok_or_else(|| {
                    Refusal::Unavailable(format!("this pod serves no service {hostname}"))
                })?;
            let svc = snap
                .service(key)
                .ok_or_else(|| Refusal::Unavailable(format!("no service {key}")))?;
            let sp = svc
                .port(*port)
                .ok_or_else(|| Refusal::BadRequest(format!("service {key} has no port {port}")))?;
            let target = w
                .target_port(key, *port)
                .filter(|p| *p != 0)
                .unwrap_or(sp.target_port);
            Ok(SocketAddr::new(pod.ip, target))
        }
    }
}
