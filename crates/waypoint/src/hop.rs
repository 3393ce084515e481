//! `ferry waypoint`: the HBONE hop in front of a service or workload.
//!
//! It terminates HBONE with its own identity, decides again for the tunnel's target *on behalf
//! of the original source's cluster* (proven by its certificate), so the service's scope is
//! enforced here too whatever the hop before did, and carries the bytes on in a new HBONE tunnel
//! under its own identity. When a policy on the destination names HTTP facts (methods, paths,
//! hosts), the bytes go through [`crate::l7`] instead, which judges each HTTP/1 request on its
//! own with the original source's identity, and routed on its own ([`crate::waypoint_router`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferry_core::app_source::{self, AppSource, TunnelSource};
use ferry_core::hop::{Hop, origin_cluster};
use ferry_core::identity::Identity;
use ferry_core::inbound::fronted_by;
use ferry_core::model::{ClusterId, NetworkId, WorkloadUid};
use ferry_core::random::SplitMix64;
use ferry_core::route::{self, Compact, Family, Plan, Source, Transport};
use ferry_hbone::headers::{ConnectHeaders, Refusal};
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::{ConnectRequest, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_hbone::upstream::{Forward, Upstream};
use ferry_hbone::{Error as HboneError, Side};
use ferry_runtime::bootstrap::ControlPlane;
use ferry_runtime::conn::{ConnError, ConnErrorKind};
use ferry_runtime::telemetry::AccessLog;
use ferry_runtime::text::Text;
use ferry_tls::config::{Credentials, TrustBundle};
use parking_lot::Mutex;

use crate::judge::Judge;
use crate::state::{Onward, Opened, Waypoint};

/// How a waypoint instance is run.
#[derive(Clone, Debug)]
pub struct Config {
    /// This instance's workload uid.
    pub uid: String,
    pub cluster: String,
    /// The control plane, with the credential of the node this instance runs on.
    pub control: ControlPlane,
    /// The HBONE listeners, one family each (an instance's IPv4 and IPv6 addresses, or
    /// `0.0.0.0:15008` and `[::]:15008`).
    pub listen: Vec<SocketAddr>,
    /// Listen and dial inside this network namespace (the waypoint pod's), while talking to
    /// the control plane from the process's own.
    pub netns: Option<std::path::PathBuf>,
    /// Admin endpoint (`/ready`, `/metrics`), in the same namespace as `listen`.
    pub admin: Option<SocketAddr>,
    /// How long open tunnels may finish after SIGTERM.
    pub drain: Duration,
}

/// The denial that closed an open tunnel (a policy change), in the words of the policy.
fn closed_by_policy(e: &ConnError) -> Option<&ferry_runtime::conn::Denial> {
    match &e.kind {
        ConnErrorKind::PolicyChanged { denial, .. } => Some(denial),
        _ => None,
    }
}

/// One admitted tunnel: the decision taken for it and its original source's cluster, carried
/// to `connect`; how it failed, carried to `finished`.
pub(crate) struct Admitted {
    plan: Option<Plan>,
    origin: ClusterId,
    /// The original client, as far as it is proven ([`original_client`]): forwarded to the next
    /// hop, and the source address policies judge.
    client: Option<SocketAddr>,
    /// Why `connect` failed, if it did (the server reports only the refusal).
    error: Option<Box<ConnError>>,
    /// How a tunnel served here (HTTP, or L4 after detection) ended, told by its server.
    served: Arc<Mutex<Option<ConnError>>>,
    /// What its record says of the decision, when records are kept.
    noted: Option<Box<Noted>>,
}

/// A tunnel's decision as its connection record tells it.
struct Noted {
    started: Instant,
    route: String,
    dst_workload: String,
    dst_service: String,
    dst_cluster: String,
    decision: Duration,
    connect: Option<Duration>,
}

impl Noted {
    /// The decision `planned` took for the tunnel admitted at `started`, on `snap`.
    fn of(
        snap: &ferry_core::snapshot::Snapshot,
        planned: &Result<Plan, route::RouteError>,
        started: Instant,
        trace: &Compact,
    ) -> Self {
        let plan = planned.as_ref().ok();
        let landing = plan
            .and_then(|p| p.landing.as_ref())
            .and_then(|u| snap.workload(u));
        Self {
            started,
            route: trace.summary(),
            dst_workload: landing.map(|w| w.uid.to_string()).unwrap_or_default(),
            dst_service: plan
                .and_then(|p| p.service.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default(),
            dst_cluster: landing.map(|w| w.cluster.to_string()).unwrap_or_default(),
            decision: started.elapsed(),
            connect: None,
        }
    }

    /// Fills the record's decision fields of `log`.
    fn into_log(self, log: &mut AccessLog<'_>) {
        log.route = self.route.into();
        log.dst_workload = self.dst_workload.into();
        log.dst_service = self.dst_service.into();
        log.dst_cluster = self.dst_cluster.into();
        log.phases.decision = Some(self.decision);
        log.phases.connect = self.connect;
    }
}

/// Logs and records a tunnel this waypoint refused before deciding where it goes (its origin
/// unproven, or a target this instance does not front for it): a denial at this hop.
fn refused(mut log: AccessLog<'_>, reason: &str, started: Instant) {
    log.path = "refused by this waypoint".into();
    log.error = Some(reason.to_string());
    log.error_side = Some(Side::Downstream);
    log.response_flags = ferry_runtime::conn::ResponseFlag::Deny;
    log.phases.decision = Some(started.elapsed());
    log.emit_as(REFUSED);
}

/// What the access-log line of a tunnel this waypoint refused says.
const REFUSED: &str = "waypoint refused the connection";

/// The record of a tunnel this waypoint ends, before its decision is added.
fn waypoint_log<'a>(req: &ConnectRequest, origin: &ClusterId) -> AccessLog<'a> {
    AccessLog {
        direction: "waypoint",
        src_addr: req.peer_addr.into(),
        src_workload: "",
        src_identity: (&*req.peer).into(),
        src_cluster: origin.into(),
        dst_addr: req.target.to_string().into(),
        path: "hbone via this waypoint".into(),
        trace_id: req.trace_id.map_or(Text::Empty, Text::trace),
        ..AccessLog::default()
    }
}

impl Handler for Waypoint {
    type Admit = Admitted;

    fn admit(&self, req: &ConnectRequest) -> Result<Admitted, Refusal> {
        let started = Instant::now();
        let dst = &req.target;
        let headers = ConnectHeaders::read(&req.headers);
        let snap = self.store.load();
        let me = snap
            .workload(&self.uid)
            .ok_or_else(|| Refusal::Unavailable("this waypoint left the mesh".into()))?;
        // The origin cluster is the one the peer's certificate proves (core's rule); the
        // baggage's claim is only logged when it disagrees.
        let claim = headers.typed_baggage().cluster.map(ClusterId::new);
        let hop = Hop {
            cluster: &self.cluster,
            network: &me.network,
        };
        let origin = match origin_cluster(&snap, hop, &req.peer_cluster, claim.as_ref(), dst) {
            Ok(o) => {
                if let Some(claimed) = &o.disputed_claim {
                    tracing::info!(src.identity = %req.peer, src.addr = %req.peer_addr, origin.cluster = %o.cluster, claimed.cluster = %claimed, "the baggage claims another cluster than the certificate proves; ignored");
                }
                o.cluster
            }
            Err(e) => {
                let reason = e.to_string();
                self.metrics.refused.inc();
                refused(waypoint_log(req, &ClusterId::new("")), &reason, started);
                return Err(Refusal::Denied(reason));
            }
        };
        // Only what this instance fronts, and only where routing could have picked it for this
        // origin: whatever a hop before decided (a gateway, a crafted tunnel).
        let source_network = headers
            .forwarded_network
            .as_deref()
            .map_or_else(|| me.network.clone(), NetworkId::new);
        if let Err(e) = fronted_by(&snap, me, dst, &origin, &source_network) {
            self.metrics.refused.inc();
            let reason = e.to_string();
            refused(waypoint_log(req, &origin), &reason, started);
            return Err(Refusal::Denied(reason));
        }
        let mut rng = SplitMix64::new(req.id);
        let src = Source::on_behalf_of(me, &origin);
        // Traced, within a fixed budget, only for the tunnel's record.
        let (planned, noted) = if ferry_runtime::records::global().keeps() {
            let mut trace = Compact::new();
            let within = route::Within::default();
            let planned = route::plan_compact(&snap, src, dst, &within, &mut rng, &mut trace);
            let noted = Noted::of(&snap, &planned, started, &trace);
            (planned, Some(Box::new(noted)))
        } else {
            (route::plan(&snap, src, dst, &mut rng), None)
        };
        match planned {
            Ok(plan) => Ok(Admitted {
                client: original_client(&snap, me, req, &headers, &plan),
                plan: Some(plan),
                origin,
                error: None,
                served: Arc::default(),
                noted,
            }),
            Err(e) => {
                self.metrics.refused.inc();
                let e = ConnError::from(e);
                // Its record (and access-log line) names the candidates the decision set aside.
                let mut log = waypoint_log(req, &origin);
                log.path = "refused by this waypoint".into();
                if let Some(n) = noted {
                    n.into_log(&mut log);
                }
                log.fail(&e);
                log.emit_as(REFUSED);
                Err(e.refusal())
            }
        }
    }

    fn connect(
        &self,
        req: &ConnectRequest,
        admitted: &mut Admitted,
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let (plan, origin_cluster) = (admitted.plan.take(), admitted.origin.clone());
        let served = admitted.served.clone();
        // The original client, forwarded on (none when unproven), and the address judged.
        let peer = admitted.client;
        let source_ip = peer.map_or(req.peer_addr.ip(), |c| c.ip());
        let headers = ConnectHeaders::read(&req.headers);
        let mut baggage = headers.typed_baggage();
        // The connection's trace goes on with it (the source's node proxy starts one).
        let traceparent = headers.traceparent;
        let source = (*req.peer).clone();
        let relayed_plaintext = baggage.plaintext;
        let peer_identity = if relayed_plaintext {
            format!("(none: plain TCP relayed by {})", req.peer)
        } else {
            req.peer.to_string()
        };
        let target = req.target.clone();
        let seed = req.id;
        let carrying = async move {
            let plan = plan.ok_or_else(|| {
                ConnError::io(
                    Side::Local,
                    "connecting",
                    std::io::Error::other("no decision for this tunnel"),
                )
            })?;
            let filter = self.http_filter(&plan, source.clone(), relayed_plaintext, source_ip);
            // The original source travels on in the tunnel's metadata (for the destination's
            // logs; it authorizes the waypoint), replacing whatever the peer claimed.
            let original = match &filter {
                Some((judge, _)) => judge
                    .source
                    .as_ref()
                    .map_or("none".into(), ToString::to_string),
                None => source.to_string(),
            };
            // And the cluster this waypoint decided for: a hint for the next hop's logs (it
            // checks scope against this waypoint's own certificate).
            baggage.source_principal = Some(original);
            baggage.plaintext = false;
            baggage.cluster = Some(origin_cluster.to_string());
            let origin = Onward {
                baggage: baggage.to_pairs(),
                traceparent,
            };
            let Some((judge, dst)) = filter else {
                let opened = self.open_upstream(plan, peer, origin).await?;
                return Ok(opened.into_forward(self.finish.clone(), served));
            };
            let wp = self.this.upgrade().ok_or_else(|| {
                ConnError::io(
                    Side::Local,
                    "connecting",
                    std::io::Error::other("the waypoint is stopping"),
                )
            })?;
            // HTTP: every request is routed and judged on its own. Anything else goes where
            // this tunnel's decision says.
            let router = Arc::new(crate::router::TunnelRouter {
                wp: wp.clone(),
                target,
                service: match &plan.class {
                    route::Class::Service { service, port } => Some((service.clone(), *port)),
                    _ => None,
                },
                origin: origin_cluster,
                baggage: origin.clone(),
                peer,
                source: judge.source.clone(),
                source_ip,
                rng: Mutex::new(SplitMix64::new(seed ^ 0x5EED)),
            });
            // Answered only once its far side is connected, HTTP or not: the decision's upstream
            // is dialled now, before the `200` (HTTP requests routed to that backend use it).
            let dialed = crate::l7::Dialed {
                key: crate::router::key(&plan),
                protocol: ferry_core::protocol::http_upstream(&self.store.load(), &plan),
                link: self.open_upstream(plan, peer, origin).await?.into_link(),
            };
            // Not HTTP after all: the connection as a whole, at L4 (an HTTP-naming DENY holds
            // on its other fields), and again whenever the policy changes.
            let l4 = {
                let changes = self.changes.clone();
                move || {
                    // Taken before the snapshot it is judged in: no change is missed.
                    let changes = ferry_runtime::recheck::from_now(&changes);
                    judge.judge(None)?;
                    Ok(ferry_runtime::recheck::until_denied(changes, move || {
                        judge.recheck(None)
                    }))
                }
            };
            let (metrics, finish) = (self.metrics.clone(), self.finish.clone());
            // The filter reads the tunnel itself: no copy between the tunnel and the filter.
            let serve: ferry_hbone::upstream::Serve = Box::new(move |tunnel| {
                Box::pin(async move {
                    let labels = crate::l7::Labels {
                        src_identity: peer_identity,
                        dst_workload: dst.to_string(),
                        metrics: Some(metrics),
                    };
                    // At L4 and for upgraded requests, a policy change or the drain deadline ends
                    // the copy; HTTP requests are judged one by one anyway.
                    let outcome = crate::l7::serve_dialed_until(
                        tunnel,
                        router,
                        dialed,
                        l4,
                        labels,
                        Some(finish),
                    )
                    .await;
                    if let Some(denial) = outcome.error.as_ref().and_then(closed_by_policy) {
                        tracing::info!(target: "access", direction = "waypoint", dst.workload = %dst, reason = %denial, "policy change closed a tunnel");
                    }
                    let error = outcome.error.as_ref().map(|e| e.kind.to_string());
                    tracing::info!(target: "access", direction = "waypoint", dst.workload = %dst, http.allowed = outcome.allowed, http.denied = outcome.denied, error = error.as_deref().unwrap_or(""), "waypoint http connection closed");
                    *served.lock() = outcome.error;
                })
            });
            Ok(Forward::Serve(serve))
        };
        async move {
            let carried = carrying.await;
            if let Some(n) = admitted.noted.as_mut() {
                n.connect = carried.is_ok().then(|| n.started.elapsed());
            }
            carried.map_err(|e: ConnError| {
                let refusal = e.refusal();
                admitted.error = Some(Box::new(e));
                refusal
            })
        }
    }

    fn finished(&self, req: &ConnectRequest, admitted: Admitted, outcome: &Outcome<'_>) {
        let error = admitted
            .error
            .map(|e| *e)
            .or_else(|| admitted.served.lock().take())
            .or_else(|| ConnError::from_outcome(outcome));
        let mut log = waypoint_log(req, &admitted.origin);
        log.bytes_sent = outcome.sent;
        log.bytes_recv = outcome.received;
        if let Some(n) = admitted.noted {
            n.into_log(&mut log);
        }
        if let Some(e) = &error {
            log.fail(e);
        }
        log.emit();
    }
}

/// The original client of a tunnel this waypoint carries on `plan`, by core's rule
/// ([`app_source::for_waypoint`]): an address of the peer's own identity (its forwarded one on
/// the network it names, else its TCP peer's on this waypoint's), or the one the landing
/// workload's node proxy forwards when it relays plain TCP from outside the mesh. The port is
/// the forwarded one with a forwarded address, else the TCP peer's. `None` (logged): unproven,
/// nothing is forwarded and the destination's app sees its own pod's address.
fn original_client(
    snap: &ferry_core::snapshot::Snapshot,
    me: &ferry_core::model::Workload,
    req: &ConnectRequest,
    headers: &ConnectHeaders,
    plan: &Plan,
) -> Option<SocketAddr> {
    let landing = plan
        .landing
        .as_ref()
        .and_then(|u| snap.workload(u))
        .map(|w| &**w);
    // The landing's address the tunnel goes on to: of the family dialled, as routing picks it.
    let target = landing
        .and_then(|w| Family::of(&req.target).pick(&w.addresses))
        .unwrap_or(req.peer_addr.ip());
    let facts = TunnelSource {
        peer: &req.peer,
        peer_ip: req.peer_addr.ip(),
        network: &me.network,
        forwarded_for: headers.forwarded_for.map(|a| a.ip()),
        forwarded_network: headers.forwarded_network.as_deref(),
    };
    let plaintext = headers.typed_baggage().plaintext;
    match app_source::for_waypoint(landing, snap, target, &facts, plaintext) {
        AppSource::Use { ip, .. } => Some(match headers.forwarded_for {
            Some(f) if f.ip() == ip => f,
            _ => SocketAddr::new(ip, req.peer_addr.port()),
        }),
        AppSource::Own(why) => {
            tracing::info!(src.identity = %req.peer, src.addr = %req.peer_addr, reason = %why, "the original client is not proven; none is forwarded");
            None
        }
    }
}

impl Waypoint {
    /// Every tunnel to a workload is inspected: HTTP is judged request by request, anything
    /// else once at L4, both with the original source (`None`: plain TCP from outside the mesh,
    /// relayed by the destination's node proxy).
    fn http_filter(
        &self,
        plan: &Plan,
        source: Identity,
        relayed_plaintext: bool,
        source_ip: IpAddr,
    ) -> Option<(Arc<Judge>, WorkloadUid)> {
        let uid = plan.landing.clone()?;
        let snap = self.store.load();
        let dst = snap.workload(&uid)?;
        // The destination's node proxy relays plain TCP from outside the mesh under the
        // destination's own identity and says so; only that identity may say so.
        let source = if relayed_plaintext && dst.identity().ok().as_ref() == Some(&source) {
            None
        } else {
            Some(source)
        };
        let port = plan.landing_port;
        let judge = Arc::new(Judge {
            store: self.store.clone(),
            landing: uid.clone(),
            source,
            source_ip,
            port,
            denials: self.metrics.denials.clone(),
        });
        Some((judge, uid))
    }

    /// Opens the next hop of `plan`, forwarding `peer` (the original client, if proven).
    pub(crate) async fn open_upstream(
        &self,
        plan: Plan,
        peer: Option<SocketAddr>,
        origin: Onward,
    ) -> Result<Opened, ConnError> {
        let service = plan.service.as_ref().map(|s| s.hostname.clone());
        match plan.transport {
            Transport::Hbone {
                connect_to,
                authority,
                identities,
            } => {
                let headers = tunnel_headers(origin, peer, service);
                let (t, ..) = self
                    .pooled(connect_to, identities, &authority, &headers)
                    .await
                    .map_err(|e| e.into_conn(None))?;
                Ok(Opened::Direct(Upstream::from(t)))
            }
            Transport::Tcp { connect_to } | Transport::Passthrough { connect_to } => {
                let stream = match &self.netns {
                    Some(ns) => ns.connect(None, connect_to).await,
                    None => tokio::net::TcpStream::connect(connect_to).await,
                };
                stream
                    .map(|s| Opened::Direct(Upstream::from(s)))
                    .map_err(|e| ConnError::connect(connect_to, e))
            }
            Transport::GatewayHbone {
                gateway,
                gateway_identity,
                authority,
                identities,
            } => {
                // Double HBONE: the outer tunnel (pooled) asks the endpoint network's gateway for
                // `hostname:port`, which decides again (scope, for the cluster in the baggage);
                // the inner one, end to end, must reach one of the endpoints' identities.
                let headers = tunnel_headers(origin, peer, service);
                let (outer, creds, bundle) = self
                    .pooled(gateway, vec![gateway_identity], &authority, &headers)
                    .await
                    .map_err(|e| e.into_conn(Some("outer tunnel to the gateway")))?;
                let inner_headers = ConnectHeaders {
                    forwarded_network: Some(self.network.to_string()),
                    ..headers
                };
                ferry_hbone::double::open_inner(
                    outer,
                    gateway,
                    &creds,
                    &bundle,
                    identities,
                    &authority,
                    &inner_headers,
                    &Settings::default(),
                )
                .await
                .map(Opened::Double)
                .map_err(|e| ConnError::tunnel("inner tunnel through the gateway", e))
            }
        }
    }
}

/// The CONNECT metadata of a tunnel onward from the waypoint: as a node proxy's, the original
/// source's baggage, its address when proven (`forwarded: for=`, what the destination's app
/// sees), the trace it continues and the service it is for (`forwarded ;host=`), so the
/// destination attributes the connection to that service.
fn tunnel_headers(
    onward: Onward,
    peer: Option<SocketAddr>,
    service: Option<String>,
) -> ConnectHeaders {
    ConnectHeaders {
        baggage: onward.baggage,
        forwarded_for: peer,
        forwarded_host: service,
        traceparent: onward.traceparent,
        ..ConnectHeaders::default()
    }
}

impl Waypoint {
    /// A pooled tunnel to `to` under the waypoint's own identity, accepting `identities`; with
    /// the credentials and trust bundle it was opened with (an inner tunnel reuses them).
    async fn pooled(
        &self,
        to: SocketAddr,
        identities: Vec<Identity>,
        authority: &str,
        headers: &ConnectHeaders,
    ) -> Result<(ferry_hbone::pool::Tunnel, Credentials, TrustBundle), Pooled> {
        let creds = self
            .certs
            .fetch(&self.identity)
            .await
            .map_err(Pooled::Certificate)?;
        let from = Family::of_ip(to.ip())
            .pick(&self.addresses)
            .unwrap_or(to.ip());
        let key = PoolKey::new(self.identity.clone(), from, to, identities);
        let bundle = self
            .certs
            .trust_bundle()
            .unwrap_or_else(|| self.bundle.clone());
        let t = self
            .pool
            .open(&key, &creds, &bundle, authority, headers)
            .await
            .map_err(Pooled::Tunnel)?;
        Ok((t, creds, bundle))
    }
}

/// Why a pooled tunnel could not be opened.
enum Pooled {
    /// No certificate of the waypoint's own.
    Certificate(ferry_tls::certs::CertError),
    Tunnel(HboneError),
}

// === impl Pooled ===

impl Pooled {
    /// As a connection's failure; `hop` names the tunnel when it is one of several.
    fn into_conn(self, hop: Option<&'static str>) -> ConnError {
        match (self, hop) {
            (Self::Certificate(e), _) => ConnError::from(e),
            (Self::Tunnel(e), Some(hop)) => ConnError::tunnel(hop, e),
            (Self::Tunnel(e), None) => ConnError::from(e),
        }
    }
}

/// `/ready`, `/config_dump`, `/certs` and `/metrics`, on the runtime's admin server.
async fn serve_admin(
    listener: tokio::net::TcpListener,
    wp: Arc<Waypoint>,
    registry: prometheus_client::registry::Registry,
) {
    use ferry_runtime::admin::{Response, Routes};
    let dump = {
        let wp = wp.clone();
        move || {
            let snap = wp.store.load();
            let body = serde_json::json!({
                "waypoint": wp.uid.to_string(),
                "identity": wp.identity.to_string(),
                "cluster": wp.cluster.to_string(),
                "snapshot_version": snap.version(),
                "workloads": snap.workloads().count(),
                "services": snap.services().count(),
                "policies": snap.policies().count(),
                "certificates": ferry_runtime::admin::cert_summary(&wp.certs),
            });
            Response::ok("text/plain", body.to_string())
        }
    };
    let certs = {
        let wp = wp.clone();
        move || {
            let body = ferry_runtime::admin::cert_summary(&wp.certs);
            Response::ok("text/plain", body.to_string())
        }
    };
    let metrics = move || Response::metrics(&registry);
    let routes = Routes::new()
        .route(&["/ready", "/healthz/ready"], || {
            Response::ok("text/plain", "ready\n")
        })
        .route(&["/config_dump"], dump)
        .route(&["/certs"], certs)
        .route(&["/metrics", "/stats/prometheus"], metrics);
    ferry_runtime::admin::serve(listener, routes).await;
}

/// Runs a waypoint instance until SIGTERM, then drains.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let control = &config.control;
    let bundle = control.bundle()?;
    let mesh = control.subscribe(format!("ferry-waypoint~{}", config.uid), &config.cluster);
    mesh.wait_ready(&control.endpoint).await?;
    let uid = WorkloadUid::new(&config.uid);
    let me = mesh
        .store
        .load()
        .workload(&uid)
        .cloned()
        .with_context(|| format!("no workload {} in the mesh", config.uid))?;
    let identity = me.identity()?;
    anyhow::ensure!(!me.addresses.is_empty(), "the waypoint has no address");
    anyhow::ensure!(!config.listen.is_empty(), "no address to listen on");
    let certs = control.certificates(&config.cluster)?;
    certs.fetch(&identity).await?;
    let netns = match &config.netns {
        Some(p) => Some(Arc::new(
            ferry_runtime::netns::Netns::open(p)
                .with_context(|| format!("network namespace {}", p.display()))?,
        )),
        None => None,
    };
    let pool_config = match &netns {
        Some(ns) => PoolConfig {
            dialer: Arc::new(ferry_runtime::netns::NetnsDialer(ns.clone())),
            ..PoolConfig::default()
        },
        None => PoolConfig::default(),
    };
    let (trigger, drain) = ferry_runtime::drain::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let wp = Arc::new_cyclic(|this| Waypoint {
        store: mesh.store.clone(),
        certs: certs.clone(),
        pool: Pool::new(pool_config),
        bundle: bundle.clone(),
        uid,
        identity: identity.clone(),
        addresses: me.addresses.clone(),
        cluster: ClusterId::new(&config.cluster),
        network: me.network.clone(),
        metrics: Arc::new(crate::metrics::RequestMetrics::new(&mut registry)),
        changes: mesh.changes(),
        netns: netns.clone(),
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        finish: drain.finish_signal(),
        this: this.clone(),
    });
    let listeners = match &netns {
        Some(ns) => {
            let mut each = Vec::new();
            for a in &config.listen {
                let l = ns.listen_one_family(*a).await;
                each.push(l.with_context(|| format!("binding {a}"))?);
            }
            each
        }
        None => ferry_runtime::sockets::listen_each(&config.listen)?,
    };
    if let Some(addr) = config.admin {
        let admin = match &netns {
            Some(ns) => ns.listen(addr).await,
            None => tokio::net::TcpListener::bind(addr).await,
        }
        .with_context(|| format!("binding the admin endpoint {addr}"))?;
        tokio::spawn(serve_admin(admin, wp.clone(), registry));
    }
    let hbone = ferry_runtime::serve::Hbone {
        what: "waypoint hbone",
        identity: identity.clone(),
        certs,
        bundle,
        settings: Settings::default(),
        acceptor: wp.acceptor.clone(),
        drain,
        open: Arc::default(),
    };
    let serving = tokio::spawn(ferry_runtime::serve::serve_hbone_each(
        listeners,
        hbone,
        wp.clone(),
    ));
    tracing::info!(
        waypoint = %config.uid,
        listen = ?config.listen,
        identity = %identity,
        "ferry waypoint {}: serving HBONE on {:?} as {identity}",
        config.uid,
        config.listen
    );
    trigger.on_signal("waypoint", config.drain).await;
    let _ = serving.await;
    wp.pool.shutdown(Duration::from_secs(2)).await;
    tracing::info!("waypoint stopped");
    Ok(())
}

#[cfg(test)]
#[path = "hop_tests.rs"]
mod tests;
