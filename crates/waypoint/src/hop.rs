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
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use ferry_core::hop::{Hop, origin_cluster};
use ferry_core::identity::Identity;
use ferry_core::model::{ClusterId, WorkloadUid};
use ferry_core::random::SplitMix64;
use ferry_core::route::{self, Plan, Source, Transport};
use ferry_hbone::headers::{ConnectHeaders, Refusal};
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::{ConnectRequest, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_hbone::upstream::{Forward, Upstream};
use ferry_runtime::bootstrap::ControlPlane;
use ferry_tls::config::{Credentials, TrustBundle};
use parking_lot::Mutex;

use ferry_runtime::telemetry::AccessLog;

use crate::judge::Judge;
use crate::state::{Opened, Waypoint};

/// How a waypoint instance is run.
#[derive(Clone, Debug)]
pub struct Config {
    /// This instance's workload uid.
    pub uid: String,
    pub cluster: String,
    /// The control plane, with the credential of the node this instance runs on.
    pub control: ControlPlane,
    pub listen: SocketAddr,
    /// Listen and dial inside this network namespace (the waypoint pod's), while talking to
    /// the control plane from the process's own.
    pub netns: Option<std::path::PathBuf>,
    /// Admin endpoint (`/ready`, `/metrics`), in the same namespace as `listen`.
    pub admin: Option<SocketAddr>,
    /// How long open tunnels may finish after SIGTERM.
    pub drain: Duration,
}

/// What one tunnel re-judges itself with when a new snapshot is applied.
struct Rejudge {
    judge: Arc<Judge>,
    /// Its HTTP decisions, and the upgraded requests to judge again.
    router: Arc<crate::router::TunnelRouter>,
    /// Carried at L4 (not HTTP), so judged as a whole.
    is_l4: Arc<std::sync::atomic::AtomicBool>,
    changes: tokio::sync::watch::Receiver<u64>,
}

// === impl Rejudge ===

impl Rejudge {
    /// Resolves, with the reason, once a snapshot no longer allows the bytes this tunnel
    /// carries as they are (at L4, or as an upgraded request allowed them); HTTP requests are
    /// judged one by one anyway. Never resolves if the snapshots stop coming.
    async fn until_denied(mut self) -> String {
        self.changes.borrow_and_update();
        while self.changes.changed().await.is_ok() {
            let verdict = if self.is_l4.load(Ordering::Relaxed) {
                self.judge.judge(None)
            } else if self.router.has_upgrades() {
                self.router.recheck_upgrades()
            } else {
                continue;
            };
            if let Err(reason) = verdict {
                return reason;
            }
        }
        std::future::pending().await
    }
}

/// One admitted tunnel: the decision taken for it and its original source's cluster.
pub(crate) struct Admitted {
    plan: Option<Plan>,
    origin: ClusterId,
}

impl Handler for Waypoint {
    type Admit = Admitted;

    fn admit(&self, req: &ConnectRequest) -> Result<Admitted, Refusal> {
        let dst = &req.target;
        let headers = ConnectHeaders::read(&req.headers);
        let snap = self.store.load();
        let me = snap
            .workload(&self.uid)
            .cloned()
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
                tracing::warn!(target: "access", direction = "waypoint", src.identity = %req.peer, src.addr = %req.peer_addr, reason = %reason, "waypoint refused the connection");
                return Err(Refusal::Denied(reason));
            }
        };
        let mut rng = SplitMix64::new(req.id);
        match route::plan(&snap, Source::on_behalf_of(&me, &origin), dst, &mut rng) {
            Ok(plan) => Ok(Admitted {
                plan: Some(plan),
                origin,
            }),
            Err(e) => {
                self.metrics.refused.inc();
                let (peer, reason) = (req.peer.to_string(), e.to_string());
                tracing::info!(target: "access", direction = "waypoint", src.identity = %peer, origin.cluster = %origin, dst.addr = %dst.to_string(), reason = %reason, "waypoint refused the connection");
                Err(Refusal::Unavailable(e.to_string()))
            }
        }
    }

    fn connect(
        &self,
        req: &ConnectRequest,
        admitted: &mut Admitted,
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let (plan, origin_cluster) = (admitted.plan.take(), admitted.origin.clone());
        let peer = req.peer_addr;
        let headers = ConnectHeaders::read(&req.headers);
        let source_ip = headers.forwarded_for.unwrap_or(peer).ip();
        let mut baggage = headers.typed_baggage();
        let source = req.peer.clone();
        let relayed_plaintext = baggage.plaintext;
        let peer_identity = if relayed_plaintext {
            format!("(none: plain TCP relayed by {})", req.peer)
        } else {
            req.peer.to_string()
        };
        let target = req.target.clone();
        let seed = req.id;
        async move {
            let plan =
                plan.ok_or_else(|| Refusal::Unavailable("no decision for this tunnel".into()))?;
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
            let origin = baggage.to_pairs();
            let Some((judge, dst)) = filter else {
                let opened = self.open_upstream(plan, peer, origin).await?;
                return Ok(opened.into_forward(self.finish.clone()));
            };
            let wp = self
                .this
                .upgrade()
                .ok_or_else(|| Refusal::Unavailable("the waypoint is stopping".into()))?;
            // HTTP: every request is routed and judged on its own. Anything else goes where
            // this tunnel's decision says, opened only then.
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
                upgrades: Mutex::default(),
            });
            let rejudge = Rejudge {
                judge: judge.clone(),
                router: router.clone(),
                is_l4: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                changes: self.changes.clone(),
            };
            let open_l4 = async move {
                wp.open_upstream(plan, peer, origin)
                    .await
                    .map(Opened::into_link)
                    .map_err(|e| e.to_string())
            };
            // Not HTTP after all: the connection as a whole, at L4 (an HTTP-naming DENY holds
            // on its other fields), and again whenever the policy changes.
            let l4 = {
                let (judge, is_l4) = (judge, rejudge.is_l4.clone());
                move || {
                    let verdict = judge.judge(None);
                    is_l4.store(verdict.is_ok(), Ordering::Relaxed);
                    verdict
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
                    let serving = crate::l7::serve_detected_until(
                        tunnel,
                        router,
                        open_l4,
                        l4,
                        labels,
                        Some(finish),
                    );
                    let outcome = tokio::select! {
                        o = serving => o,
                        reason = rejudge.until_denied() => {
                            tracing::info!(target: "access", direction = "waypoint", dst.workload = %dst, reason = %reason, "policy change closed a tunnel");
                            crate::l7::Outcome {
                                error: Some("closed: no longer allowed by policy".into()),
                                ..crate::l7::Outcome::default()
                            }
                        }
                    };
                    tracing::info!(target: "access", direction = "waypoint", dst.workload = %dst, http.allowed = outcome.allowed, http.denied = outcome.denied, error = outcome.error.as_deref().unwrap_or(""), "waypoint http connection closed");
                })
            });
            Ok(Forward::Serve(serve))
        }
    }

    fn finished(&self, req: &ConnectRequest, _: Admitted, outcome: &Outcome<'_>) {
        AccessLog {
            direction: "waypoint",
            src_addr: req.peer_addr.to_string(),
            src_workload: "",
            src_identity: req.peer.to_string(),
            dst_addr: req.target.to_string(),
            path: "hbone via this waypoint".into(),
            bytes_sent: outcome.sent,
            bytes_recv: outcome.received,
            error: outcome.error(),
            ..AccessLog::default()
        }
        .emit();
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
        });
        Some((judge, uid))
    }

    pub(crate) async fn open_upstream(
        &self,
        plan: Plan,
        peer: SocketAddr,
        origin: Vec<(String, String)>,
    ) -> Result<Opened, Refusal> {
        match plan.transport {
            Transport::Hbone {
                connect_to,
                authority,
                identities,
            } => {
                let headers = tunnel_headers(origin, peer);
                let (t, ..) = self
                    .pooled(connect_to, identities, &authority, &headers)
                    .await
                    .map_err(Refusal::Unavailable)?;
                Ok(Opened::Direct(Upstream::from(t)))
            }
            Transport::Tcp { connect_to } | Transport::Passthrough { connect_to } => {
                let stream = match &self.netns {
                    Some(ns) => ns.connect(None, connect_to).await,
                    None => tokio::net::TcpStream::connect(connect_to).await,
                };
                stream
                    .map(|s| Opened::Direct(Upstream::from(s)))
                    .map_err(|e| Refusal::Unavailable(format!("connect {connect_to}: {e}")))
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
                let headers = tunnel_headers(origin, peer);
                let (outer, creds, bundle) = self
                    .pooled(gateway, vec![gateway_identity], &authority, &headers)
                    .await
                    .map_err(|e| {
                        Refusal::Unavailable(format!("outer tunnel to the gateway {gateway}: {e}"))
                    })?;
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
                .map_err(|e| {
                    Refusal::Unavailable(format!("inner tunnel through the gateway {gateway}: {e}"))
                })
            }
        }
    }
}

/// The CONNECT metadata of a tunnel the waypoint opens: the original source's baggage and
/// address.
fn tunnel_headers(baggage: Vec<(String, String)>, peer: SocketAddr) -> ConnectHeaders {
    ConnectHeaders {
        baggage,
        forwarded_for: Some(peer),
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
    ) -> Result<(ferry_hbone::pool::Tunnel, Credentials, TrustBundle), String> {
        let creds = self
            .certs
            .fetch(&self.identity)
            .await
            .map_err(|e| e.to_string())?;
        let key = PoolKey::new(self.identity.clone(), self.ip, to, identities);
        let bundle = self
            .certs
            .trust_bundle()
            .unwrap_or_else(|| self.bundle.clone());
        let t = self
            .pool
            .open(&key, &creds, &bundle, authority, headers)
            .await
            .map_err(|e| e.to_string())?;
        Ok((t, creds, bundle))
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
    let ip = *me
        .addresses
        .first()
        .context("the waypoint has no address")?;
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
        ip,
        cluster: ClusterId::new(&config.cluster),
        network: me.network.clone(),
        metrics: Arc::new(crate::metrics::RequestMetrics::new(&mut registry)),
        changes: mesh.changes(),
        netns: netns.clone(),
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        finish: drain.finish_signal(),
        this: this.clone(),
    });
    let listener = match &netns {
        Some(ns) => ns.listen(config.listen).await,
        None => tokio::net::TcpListener::bind(config.listen).await,
    }
    .with_context(|| format!("binding {}", config.listen))?;
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
    let serving = tokio::spawn(ferry_runtime::serve::serve_hbone(
        listener,
        hbone,
        wp.clone(),
    ));
    tracing::info!(
        waypoint = %config.uid,
        listen = %config.listen,
        identity = %identity,
        "ferry waypoint {}: serving HBONE on {} as {identity}",
        config.uid,
        config.listen
    );
    trigger.on_signal("waypoint", config.drain).await;
    let _ = serving.await;
    wp.pool.shutdown(Duration::from_secs(2)).await;
    tracing::info!("waypoint stopped");
    Ok(())
}
