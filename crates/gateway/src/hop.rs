//! `ferry gateway`: the east-west gateway of one network.
//!
//! It accepts outer HBONE tunnels from other networks, verifies the caller (mutual TLS), accepts
//! only `hostname:port` targets (never a raw pod address), checks that the service exists and
//! that its scope admits the caller's cluster, picks an endpoint (or the service's waypoint) *on
//! its own network*, and forwards the inner tunnel's bytes to that endpoint's HBONE port without
//! terminating them: the destination sees the original identity end to end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferry_core::hop::{Hop, origin_cluster};
use ferry_core::model::ClusterId;
use ferry_core::random::SplitMix64;
use ferry_core::route::{self, Compact, Destination, Source, Transport, Within};
use ferry_core::store::Store;
use ferry_hbone::Side;
use ferry_hbone::headers::{ConnectHeaders, Refusal, Target};
use ferry_hbone::server::{ConnectRequest, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_hbone::upstream::Forward;
use ferry_runtime::bootstrap::ControlPlane;
use ferry_runtime::conn::{ConnError, ResponseFlag};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use ferry_runtime::telemetry::AccessLog;
use ferry_runtime::text::Text;

/// How a gateway is run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The gateway's name in the topology.
    pub name: String,
    /// The control plane, with the gateway's credential (`ferry control token --node
    /// gateway.<name>`).
    pub control: ControlPlane,
    /// The HBONE listeners, one family each (e.g. `0.0.0.0:15008` and `[::]:15008`).
    pub listen: Vec<SocketAddr>,
    /// How long open tunnels may finish after SIGTERM.
    pub drain: Duration,
    /// Admin endpoint (`/ready`, `/metrics`).
    pub admin: Option<SocketAddr>,
}

struct Gateway {
    store: Arc<Store>,
    name: String,
    /// Tunnels refused (`ferry_gateway_refused_total`).
    refused: Counter,
}

impl Gateway {
    fn refuse(&self, req: &ConnectRequest, why: String) -> Refusal {
        self.refuse_noted(req, why, Noted::default())
    }

    /// Refuses the tunnel, and logs and records the refusal with what was decided before it.
    fn refuse_noted(&self, req: &ConnectRequest, why: String, noted: Noted) -> Refusal {
        self.refused.inc();
        // Every refusal here is of what the caller asked for, before anything was dialled.
        let mut log = gateway_log(req);
        log.path = "refused by this gateway".into();
        log.error = Some(why.clone());
        log.error_side = Some(Side::Downstream);
        log.response_flags = ResponseFlag::Deny;
        noted.into_log(&mut log);
        log.emit_as("gateway refused the connection");
        Refusal::Denied(why)
    }
}

/// One admitted tunnel: where it goes, carried to `connect`; how it failed, to `finished`.
struct Admitted {
    /// The endpoint's HBONE address the inner tunnel goes to.
    to: SocketAddr,
    /// Why `connect` failed, if it did (the server reports only the refusal).
    error: Option<Box<ConnError>>,
    /// What its record says of the decision.
    noted: Box<Noted>,
}

/// A tunnel's decision as its connection record tells it.
#[derive(Debug, Default)]
struct Noted {
    started: Option<Instant>,
    origin: String,
    /// The decision in short, when records are kept.
    route: String,
    dst_service: String,
    dst_workload: String,
    dst_cluster: String,
    decision: Option<Duration>,
    connect: Option<Duration>,
}

impl Noted {
    fn into_log(self, log: &mut AccessLog<'_>) {
        log.src_cluster = self.origin.into();
        log.route = self.route.into();
        log.dst_service = self.dst_service.into();
        log.dst_workload = self.dst_workload.into();
        log.dst_cluster = self.dst_cluster.into();
        log.phases.decision = self.decision;
        log.phases.connect = self.connect;
    }
}

/// The record of a tunnel this gateway ends, before its decision is added.
fn gateway_log<'a>(req: &ConnectRequest) -> AccessLog<'a> {
    AccessLog {
        direction: "gateway",
        src_addr: req.peer_addr.into(),
        src_workload: "",
        src_identity: (&*req.peer).into(),
        dst_addr: req.target.to_string().into(),
        path: "forwarded to its network, inner tunnel untouched".into(),
        trace_id: req.trace_id.map_or(Text::Empty, Text::trace),
        ..AccessLog::default()
    }
}

impl Handler for Gateway {
    type Admit = Admitted;

    fn admit(&self, req: &ConnectRequest) -> Result<Admitted, Refusal> {
        let started = Instant::now();
        let Target::Host { hostname, port } = &req.target else {
            return Err(self.refuse(
                req,
                "a gateway serves service hostnames, never pod addresses".into(),
            ));
        };
        // One snapshot for the whole decision: where the gateway stands, and the route.
        let snap = self.store.load();
        let me = snap
            .gateways()
            .find(|g| g.name == self.name)
            .ok_or_else(|| {
                Refusal::Unavailable(format!("gateway {} is not in the mesh", self.name))
            })?;
        let dst = Destination::Host {
            hostname: hostname.clone(),
            port: *port,
        };
        // The cluster the caller's certificate proves (core's rule; a waypoint's own, for a
        // tunnel a waypoint sends), which scope is checked against; the baggage's claim is only
        // logged when it disagrees.
        let claim = ConnectHeaders::read(&req.headers)
            .typed_baggage()
            .cluster
            .map(ClusterId::new);
        let hop = Hop {
            cluster: &me.cluster,
            network: &me.network,
        };
        let origin = origin_cluster(&snap, hop, &req.peer_cluster, claim.as_ref(), &dst)
            .map_err(|e| self.refuse(req, e.to_string()))?;
        if let Some(claimed) = &origin.disputed_claim {
            tracing::info!(src.identity = %req.peer, src.addr = %req.peer_addr, origin.cluster = %origin.cluster, claimed.cluster = %claimed, "the baggage claims another cluster than the certificate proves; ignored");
        }
        let origin = origin.cluster;
        // The gateway is no workload: it routes from where it stands (its network and
        // cluster). A tunnel a waypoint instance sent has passed that waypoint: not sent back
        // to it.
        let src = Source::hop(&me.network, &me.cluster, &me.identity, &origin).sent_by(&req.peer);
        let mut rng = SplitMix64::new(req.id);
        // Traced, within a fixed budget, only for the tunnel's record.
        let mut trace = ferry_runtime::records::global().keeps().then(Compact::new);
        let planned = match trace.as_mut() {
            Some(t) => route::plan_compact(&snap, src, &dst, &Within::default(), &mut rng, t),
            None => route::plan(&snap, src, &dst, &mut rng),
        };
        let landing = planned
            .as_ref()
            .ok()
            .and_then(|p| p.landing.as_ref())
            .and_then(|u| snap.workload(u));
        let noted = Noted {
            started: Some(started),
            origin: origin.to_string(),
            route: trace.map(|t| t.summary()).unwrap_or_default(),
            dst_service: planned
                .as_ref()
                .ok()
                .and_then(|p| p.service.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default(),
            dst_workload: landing.map(|w| w.uid.to_string()).unwrap_or_default(),
            dst_cluster: landing.map(|w| w.cluster.to_string()).unwrap_or_default(),
            decision: Some(started.elapsed()),
            connect: None,
        };
        match planned {
            Ok(plan) => match plan.transport {
                Transport::Hbone { connect_to, .. } => Ok(Admitted {
                    to: connect_to,
                    error: None,
                    noted: Box::new(noted),
                }),
                _ => Err(self.refuse_noted(
                    req,
                    format!(
                        "no endpoint of {hostname} on this gateway's network for cluster {origin}"
                    ),
                    noted,
                )),
            },
            Err(e) => Err(self.refuse_noted(req, e.to_string(), noted)),
        }
    }

    fn connect(
        &self,
        _req: &ConnectRequest,
        admitted: &mut Admitted,
    ) -> impl std::future::Future<Output = Result<Forward, Refusal>> + Send {
        let to = admitted.to;
        async move {
            // The inner tunnel's bytes go to the endpoint's HBONE port untouched.
            match tokio::net::TcpStream::connect(to).await {
                Ok(tcp) => {
                    let noted = &mut admitted.noted;
                    noted.connect = noted.started.map(|t| t.elapsed());
                    Ok(Forward::from(tcp))
                }
                Err(e) => {
                    let e = ConnError::connect(to, e);
                    let refusal = e.refusal();
                    admitted.error = Some(Box::new(e));
                    Err(refusal)
                }
            }
        }
    }

    fn finished(&self, req: &ConnectRequest, admitted: Admitted, outcome: &Outcome<'_>) {
        let error = admitted
            .error
            .map(|e| *e)
            .or_else(|| ConnError::from_outcome(outcome));
        let mut log = gateway_log(req);
        log.dst_hbone_addr = admitted.to.into();
        log.bytes_sent = outcome.sent;
        log.bytes_recv = outcome.received;
        admitted.noted.into_log(&mut log);
        if let Some(e) = &error {
            log.fail(e);
        }
        log.emit();
    }
}

/// The refused tunnels counter, registered in `registry`.
fn refused_counter(registry: &mut Registry) -> Counter {
    let c = Counter::default();
    registry.register(
        "ferry_gateway_refused",
        "Tunnels refused (a pod address, an unknown service, out of scope)",
        c.clone(),
    );
    c
}

/// `/ready` (the gateway serves once it has its configuration and certificate) and `/metrics`.
fn admin_routes(registry: Registry) -> ferry_runtime::admin::Routes {
    use ferry_runtime::admin::{Response, Routes};
    Routes::new()
        .route(&["/ready", "/healthz/ready"], || {
            Response::ok("text/plain", "ready\n")
        })
        .route(&["/metrics", "/stats/prometheus"], move || {
            Response::metrics(&registry)
        })
}

/// Runs the gateway until SIGTERM, then drains.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let control = &config.control;
    let bundle = control.bundle()?;
    let mesh = control.subscribe(format!("ferry-gateway~{}", config.name), "");
    mesh.wait_ready(&control.endpoint).await?;
    let g = mesh
        .store
        .load()
        .gateways()
        .find(|g| g.name == config.name)
        .cloned()
        .with_context(|| format!("no gateway {} in the mesh", config.name))?;
    let certs = control.certificates(g.cluster.as_str())?;
    certs.fetch(&g.identity).await?;
    let mut registry = Registry::default();
    let gw = Arc::new(Gateway {
        store: mesh.store.clone(),
        name: config.name.clone(),
        refused: refused_counter(&mut registry),
    });
    let acceptor = Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry));
    if let Some(addr) = config.admin {
        let admin = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the admin endpoint {addr}"))?;
        tokio::spawn(ferry_runtime::admin::serve(admin, admin_routes(registry)));
    }
    anyhow::ensure!(!config.listen.is_empty(), "no address to listen on");
    let listeners = ferry_runtime::sockets::listen_each(&config.listen)?;
    let (trigger, drain) = ferry_runtime::drain::new();
    let hbone = ferry_runtime::serve::Hbone {
        what: "gateway",
        identity: g.identity.clone(),
        certs,
        bundle,
        settings: Settings::default(),
        acceptor,
        drain,
        open: Arc::default(),
    };
    let serving = tokio::spawn(ferry_runtime::serve::serve_hbone_each(listeners, hbone, gw));
    tracing::info!(
        gateway = %config.name,
        listen = ?config.listen,
        identity = %g.identity,
        network = %g.network,
        "ferry gateway {}: serving HBONE on {:?} as {} for network {}",
        config.name,
        config.listen,
        g.identity,
        g.network
    );
    trigger.on_signal("gateway", config.drain).await;
    let _ = serving.await;
    tracing::info!("gateway stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_metrics_show_refused_tunnels_and_accept_errors() {
        let mut registry = Registry::default();
        let refused = refused_counter(&mut registry);
        let _acceptor = ferry_runtime::accept::Acceptor::new(&mut registry);
        refused.inc();
        let routes = admin_routes(registry);
        let text = routes.respond("/metrics").body;
        for family in [
            "ferry_gateway_refused",
            "ferry_accept_refused",
            "ferry_accept_errors",
        ] {
            assert!(
                text.lines()
                    .any(|l| l == format!("# TYPE {family} counter")),
                "no TYPE line for {family}:\n{text}"
            );
        }
        assert!(
            text.lines().any(|l| l == "ferry_gateway_refused_total 1"),
            "{text}"
        );
        assert_eq!(routes.respond("/stats/prometheus").body, text);
        assert_eq!(routes.respond("/ready").body, "ready\n");
        let missing = routes.respond("/config_dump");
        assert_eq!(missing.status.as_u16(), 404);
        assert_eq!(missing.body, "paths: /ready /metrics /records\n");
    }
}
