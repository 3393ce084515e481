//! Outbound: a pod's captured connection -> the routing decision -> HBONE, or plain TCP.
//!
//! In three phases: [`plan`] (pure: the routing decision, and everything the connection is
//! labelled, logged and tunnelled with, derived once from one snapshot), [`open`] (one arm per
//! transport), then one [`copy::relay`] (which resets the side that did not fail).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferry_core::identity::Identity;
use ferry_core::model::{Workload, WorkloadUid};
use ferry_core::outlier::Ejected;
use ferry_core::random::{Random, SplitMix64};
use ferry_core::route::{self, Compact, Destination, Source, Transport, Within};
use ferry_core::snapshot::Snapshot;
use ferry_hbone::Error as HboneError;
use ferry_hbone::copy::{self, Reset};
use ferry_hbone::first_byte::FirstByte;
use ferry_hbone::headers::{Baggage, ConnectHeaders, WorkloadKind, WorkloadName};
use ferry_hbone::pool::{PoolKey, Tunnel};
use ferry_hbone::socket::reset_tcp;
use ferry_runtime::conn::ConnError;
use ferry_runtime::sockets::original_dst;
use ferry_runtime::telemetry::{AccessLog, Labels, Reporter, SecurityPolicy};
use ferry_runtime::text::Text;
use ferry_tls::config::{Credentials, TrustBundle};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::state::{Node, Open, Pod};

/// Serves one connection captured on the pod's outbound port.
pub(crate) async fn handle(node: Arc<Node>, pod: Arc<Pod>, mut tcp: TcpStream, peer: SocketAddr) {
    // DNS over TCP of a DNS-captured pod: its DNS proxy's.
    if let Some(dns) = pod.dns.clone()
        && crate::dns::is_dns(&tcp)
    {
        let egress = Arc::new(crate::state::PodEgress(pod.clone()));
        return dns.serve_tcp(egress, tcp).await;
    }
    let started = Instant::now();
    ferry_runtime::sockets::tune_app_socket(&tcp, node.idle_bound);
    let n = node.connections.fetch_add(1, Ordering::Relaxed);
    let _open = Open::new(&node);
    // Held as found for the connection's life, written out only at its end.
    let mut log = AccessLog {
        direction: "outbound",
        src_addr: peer.into(),
        src_workload: &pod.name,
        src_identity: (&pod.identity).into(),
        ..AccessLog::default()
    };
    if let Err(e) = proxy(&node, &pod, &mut tcp, peer, n, started, &mut log).await {
        reset_tcp(&tcp);
        log.fail(&e);
    }
    log.duration = started.elapsed();
    log.emit();
}

/// A byte stream to the next hop: a TCP connection, a tunnel, or a tunnel in a tunnel.
trait Io: AsyncRead + AsyncWrite + Reset + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Reset + Unpin + Send> Io for T {}

/// One outbound connection, decided once: how it goes, and what it is labelled and logged with.
#[derive(Debug)]
struct Ctx {
    transport: Transport,
    /// Counted under these once the next hop is reached (or the connection failed on its way).
    labels: Labels,
    /// The CONNECT metadata of its tunnel (unused by plain TCP).
    headers: ConnectHeaders,
    log: LogFields,
    /// The workload it lands on (an endpoint, or a waypoint instance), if it lands on one.
    landing: Option<WorkloadUid>,
}

/// What the access log says about where a connection goes, with ztunnel's meanings:
/// `dst_addr` is the address dialled (a tunnel's HBONE port, a waypoint's, a gateway's, or a
/// plain destination), `dst_hbone_addr` the target a tunnel asks for (its CONNECT authority).
/// Held as addresses and names shared with the snapshot, not copies: a connection keeps them
/// for as long as it lives.
#[derive(Debug, Default, PartialEq, Eq)]
struct LogFields {
    dst_workload: Text,
    dst_service: Text,
    dst_addr: Text,
    dst_hbone_addr: Text,
    dst_identity: Text,
    /// The cluster of the workload it lands on.
    dst_cluster: Text,
    path: Text,
}

/// A connection the routing decision refused: why, and the labels it is counted under.
#[derive(Debug)]
struct Refused {
    error: ConnError,
    labels: Labels,
}

async fn proxy(
    node: &Node,
    pod: &Pod,
    tcp: &mut TcpStream,
    peer: SocketAddr,
    n: u64,
    started: Instant,
    log: &mut AccessLog<'_>,
) -> Result<(), ConnError> {
    // The set-up runs boxed, its state freed once done: the connection's task keeps only what
    // the copy needs while it lives (measured: 7.3 KB inline, 2.8 KB boxed).
    let (labels, up) = Box::pin(set_up(node, pod, tcp, peer, n, started, log)).await?;
    let mut up = FirstByte::new(up);
    let relayed = copy::relay(tcp, &mut up, node.bounds())
        .await
        .map_err(ConnError::from);
    log.phases.first_byte = up.at().map(|t| t.saturating_duration_since(started));
    let (sent, recv) = match &relayed {
        Ok(moved) => *moved,
        Err(e) => e.moved(),
    };
    log.bytes_sent = sent;
    log.bytes_recv = recv;
    node.metrics.closed(&labels, sent, recv);
    if let Err(e) = &relayed {
        node.metrics.failed_after_open(&labels, e.flag);
    }
    relayed.map(drop)
}

/// Phases one and two: the plan, then the next hop opened. Returns the labels the connection
/// was counted opened under. A connection that fails before is counted opened and closed under
/// its failure's flag.
async fn set_up(
    node: &Node,
    pod: &Pod,
    tcp: &TcpStream,
    peer: SocketAddr,
    n: u64,
    started: Instant,
    log: &mut AccessLog<'_>,
) -> Result<(Arc<Labels>, Box<dyn Io>), ConnError> {
    let orig = original_dst(tcp).map_err(ConnError::no_original_dst)?;
    log.dst_addr = orig.into();
    ferry_core::ports::refuse_recursion(pod.ip_like(orig.ip()), orig)?;
    // The landings a connect failed to, before any byte was sent: a retry sets them aside.
    let mut failed: Vec<WorkloadUid> = Vec::new();
    let mut last: Option<(ConnError, Labels)> = None;
    loop {
        let planned = {
            // Not held while the connection lives: a long connection must not pin an old
            // snapshot.
            let snap = node.store.load();
            let src = snap.workload(&pod.uid).ok_or_else(ConnError::source_left)?;
            let mut rng = SplitMix64::new(n ^ (started_nanos() << 20));
            let health = node.health.current(Instant::now());
            let avoid = Avoid {
                failed: &failed,
                ejected: &health.ejected,
            };
            log.src_cluster = (&src.cluster).into();
            // The decision is traced, within a fixed budget, only for the connection's record.
            let mut compact = ferry_runtime::records::global().keeps().then(Compact::new);
            let planned = plan(
                &snap,
                src,
                &pod.identity,
                (peer, orig),
                avoid,
                &mut rng,
                compact.as_mut(),
            );
            log.phases.decision = Some(started.elapsed());
            if let Some(c) = compact {
                log.route = c.summary().into();
            }
            planned
        };
        let ctx = match next_attempt(planned, last.take()) {
            Attempt::First(ctx) => ctx,
            Attempt::Retry(ctx, e) => {
                let failed_to = failed.last().map(ToString::to_string).unwrap_or_default();
                tracing::info!(src.workload = %pod.name, dst.addr = %orig, dst.workload = %failed_to, retry.workload = %ctx.log.dst_workload, error = %e, "connect failed before any byte was sent; trying another endpoint");
                node.connect_retries.inc();
                ctx
            }
            Attempt::Failed(e, labels) => {
                count_failed(node, &labels);
                return Err(e);
            }
            Attempt::Refused(refused) => {
                count_failed(node, &refused.labels);
                log.path = "refused at the source".into();
                return Err(refused.error);
            }
        };
        let Ctx {
            transport,
            mut labels,
            headers,
            log: fields,
            landing,
        } = ctx;
        log.dst_cluster = fields.dst_cluster;
        log.dst_workload = fields.dst_workload;
        log.dst_service = fields.dst_service;
        log.dst_addr = fields.dst_addr;
        log.dst_hbone_addr = fields.dst_hbone_addr;
        log.dst_identity = fields.dst_identity;
        log.trace_id = headers
            .traceparent
            .as_deref()
            .and_then(ferry_hbone::headers::trace_id_of)
            .and_then(|t| u128::from_str_radix(t, 16).ok())
            .map_or(Text::Empty, Text::trace);
        log.path = match failed.as_slice() {
            [] => fields.path,
            tried => format!(
                "{} (after a failed connect to {})",
                fields.path,
                join(tried)
            )
            .into(),
        };
        match open(node, pod, &transport, &headers, &labels.source_network).await {
            // Opened and closed are counted under one label set, shared with the other
            // connections that carry it.
            Ok((up, handshake)) => {
                log.phases.connect = Some(started.elapsed());
                log.phases.tls = handshake;
                if let Some(l) = &landing {
                    node.health.success(l);
                }
                return Ok((node.metrics.opened_shared(labels), up));
            }
            // Nothing was read from the app yet, so nothing is replayed: the same decision
            // again, without the landing that failed.
            Err(e) => {
                labels.response_flags = e.flag.into();
                // The failures a retry is for are the ones outlier detection counts.
                if let Some(l) = landing.as_ref().filter(|_| e.retryable()) {
                    node.health.failure(&node.store.load(), l, Instant::now());
                }
                match landing.filter(|_| e.retryable() && failed.len() + 1 < CONNECT_ATTEMPTS) {
                    // Counted and logged as a retry once another endpoint is planned.
                    Some(landing) => {
                        failed.push(landing);
                        last = Some((e, labels));
                    }
                    None => {
                        count_failed(node, &labels);
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// What a connection does with a plan, given how its last attempt failed (if it made one).
#[derive(Debug)]
enum Attempt {
    /// Its first attempt.
    First(Ctx),
    /// Another endpoint of the same decision, after this failure: counted and logged as a
    /// retry.
    Retry(Ctx, ConnError),
    /// No other endpoint: it fails as its last attempt did (no retry is counted).
    Failed(ConnError, Labels),
    /// Refused by the routing decision before any attempt.
    Refused(Refused),
}

fn next_attempt(planned: Result<Ctx, Refused>, last: Option<(ConnError, Labels)>) -> Attempt {
    match (planned, last) {
        (Ok(ctx), None) => Attempt::First(ctx),
        (Ok(ctx), Some((e, _))) => Attempt::Retry(ctx, e),
        (Err(_), Some((e, labels))) => Attempt::Failed(e, labels),
        (Err(refused), None) => Attempt::Refused(refused),
    }
}

/// The landings a plan sets aside: those an earlier attempt of this connection failed to
/// connect to, and those outlier detection has ejected.
#[derive(Clone, Copy, Debug)]
struct Avoid<'a> {
    failed: &'a [WorkloadUid],
    ejected: &'a Ejected,
}

/// How many endpoints one outbound connection tries before it fails: one retry.
const CONNECT_ATTEMPTS: usize = 2;

fn join(uids: &[WorkloadUid]) -> String {
    uids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A connection that failed before it was counted opened: opened and closed at once.
fn count_failed(node: &Node, labels: &Labels) {
    node.metrics.opened(labels);
    node.metrics.closed(labels, 0, 0);
}

/// Phase one, pure: classifies the connection from `src` (via `peer`) to `orig`, plans it with
/// `route::plan`, and derives its labels, log fields and tunnel headers. `rng` picks endpoints
/// and the trace id; the decision's steps go to `trace`, if given.
fn plan(
    snap: &Snapshot,
    src: &Workload,
    identity: &Identity,
    (peer, orig): (SocketAddr, SocketAddr),
    avoid: Avoid<'_>,
    rng: &mut dyn Random,
    trace: Option<&mut Compact>,
) -> Result<Ctx, Refused> {
    // Refused before a transport is chosen: its security is not known.
    let mut labels = Labels::new(Reporter::Source, SecurityPolicy::Unknown).with_source(src);
    labels.source_principal = identity.to_string();
    // Traced into `trace` (a fixed budget) when the connection's record is kept; else no
    // step is built.
    let source = Source::new(src)
        .excluding(avoid.failed)
        .ejecting(avoid.ejected);
    let dst = Destination::Addr(orig);
    let planned = match trace {
        Some(t) => route::plan_compact(snap, source, &dst, &Within::default(), rng, t),
        None => route::plan(snap, source, &dst, rng),
    };
    let plan = match planned {
        Ok(p) => p,
        Err(e) => {
            let error = ConnError::from(e);
            labels.response_flags = error.flag.into();
            return Err(Refused { error, labels });
        }
    };
    let mut log = LogFields::default();
    if let Some(l) = plan.landing.as_ref().and_then(|u| snap.workload(u)) {
        labels = labels.with_destination(l);
        log.dst_workload = (&l.uid).into();
        if !l.cluster.as_str().is_empty() {
            log.dst_cluster = (&l.cluster).into();
        }
    }
    if let Some(key) = &plan.service {
        labels = match snap.service(key) {
            Some(s) => labels.with_service(s),
            None => Labels {
                destination_service: key.hostname.clone(),
                destination_service_namespace: key.namespace.clone(),
                ..labels
            },
        };
        log.dst_service = key.to_string().into();
    }
    labels.connection_security_policy = match &plan.transport {
        Transport::Hbone { .. } | Transport::GatewayHbone { .. } => SecurityPolicy::MutualTls,
        Transport::Tcp { .. } | Transport::Passthrough { .. } => SecurityPolicy::None,
    };
    log.path = match (&plan.waypoint, &plan.transport) {
        (Some(w), _) => format!("hbone via waypoint {w}").into(),
        (None, Transport::Hbone { .. }) => "hbone".into(),
        (None, Transport::GatewayHbone { .. }) => "double hbone via east-west gateway".into(),
        (None, Transport::Tcp { .. }) => "plain tcp (destination not in the mesh)".into(),
        (None, Transport::Passthrough { .. }) => "passthrough".into(),
    };
    // Where it goes: the address dialled; for a tunnel, the target it asks for and the
    // identities it accepts.
    log.dst_addr = plan.transport.dial().into();
    let hbone = match &plan.transport {
        Transport::Hbone {
            authority,
            identities,
            ..
        }
        | Transport::GatewayHbone {
            authority,
            identities,
            ..
        } => Some((authority, identities)),
        Transport::Tcp { .. } | Transport::Passthrough { .. } => None,
    };
    if let Some((authority, identities)) = hbone {
        log.dst_hbone_addr = Text::addr_or_owned(authority);
        labels.destination_principal = identities
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        log.dst_identity = match identities.as_slice() {
            [one] => one.into(),
            _ => labels.destination_principal.clone().into(),
        };
    }
    let canonical = ferry_core::telemetry::canonical(src);
    let baggage = Baggage {
        cluster: Some(src.cluster.to_string()),
        namespace: Some(src.namespace.clone()),
        workload: Some(WorkloadName {
            kind: WorkloadKind::Pod,
            name: src.name.clone(),
        }),
        service: Some(canonical.service.to_string()),
        revision: Some(canonical.revision.to_string()),
        ..Baggage::default()
    };
    let headers = ConnectHeaders {
        baggage: baggage.to_pairs(),
        forwarded_for: Some(peer),
        forwarded_host: plan.service.as_ref().map(|s| s.hostname.clone()),
        traceparent: Some(traceparent(rng)),
        forwarded_network: None,
    };
    Ok(Ctx {
        transport: plan.transport,
        labels,
        headers,
        log,
        landing: plan.landing,
    })
}

/// Phase two: opens the next hop of `transport`, from inside the pod's namespace.
/// `src_network` is what the inner tunnel of double HBONE tells the destination.
async fn open(
    node: &Node,
    pod: &Pod,
    transport: &Transport,
    headers: &ConnectHeaders,
    src_network: &str,
) -> Result<(Box<dyn Io>, Option<Duration>), ConnError> {
    match transport {
        Transport::Hbone {
            connect_to,
            authority,
            identities,
        } => {
            let (tunnel, handshake, ..) = pooled(
                node,
                pod,
                *connect_to,
                identities.clone(),
                authority,
                headers,
                ConnError::from,
            )
            .await?;
            Ok((Box::new(tunnel), handshake))
        }
        Transport::GatewayHbone {
            gateway,
            gateway_identity,
            authority,
            identities,
        } => {
            let (outer, handshake, creds, bundle) = pooled(
                node,
                pod,
                *gateway,
                vec![gateway_identity.clone()],
                authority,
                headers,
                |e| ConnError::tunnel("outer tunnel to the gateway", e),
            )
            .await?;
            let inner_headers = ConnectHeaders {
                forwarded_network: Some(src_network.to_string()),
                ..headers.clone()
            };
            let inner = ferry_hbone::double::open_inner(
                outer,
                *gateway,
                &creds,
                &bundle,
                identities.clone(),
                authority,
                &inner_headers,
                &ferry_hbone::settings::Settings::default(),
            )
            .await
            .map_err(|e| ConnError::tunnel("inner tunnel through the gateway", e))?;
            Ok((Box::new(inner), handshake))
        }
        Transport::Tcp { connect_to } | Transport::Passthrough { connect_to } => {
            let up = pod
                .netns
                .connect(None, *connect_to)
                .await
                .map_err(|e| ConnError::connect(*connect_to, e))?;
            ferry_runtime::sockets::tune_app_socket(&up, node.idle_bound);
            Ok((Box::new(up), None))
        }
    }
}

/// Opens a pooled tunnel from the pod, under its identity, to `to` (which must prove one of
/// `identities`); returns it with the handshake time of a new connection (if it needed one) and
/// the credentials and roots it was opened with (the inner tunnel of double HBONE is opened
/// with them again). `failed` types a failed set-up.
async fn pooled(
    node: &Node,
    pod: &Pod,
    to: SocketAddr,
    identities: Vec<Identity>,
    authority: &str,
    headers: &ConnectHeaders,
    failed: fn(HboneError) -> ConnError,
) -> Result<(Tunnel, Option<Duration>, Credentials, TrustBundle), ConnError> {
    let creds = node.certs.fetch(&pod.identity).await?;
    let bundle = node.bundle();
    let key = PoolKey::new(pod.identity.clone(), pod.ip_like(to.ip()), to, identities);
    let (tunnel, handshake) = node
        .pool
        .open_timed(&key, &creds, &bundle, authority, headers)
        .await
        .map_err(failed)?;
    Ok((tunnel, handshake, creds, bundle))
}

fn started_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A W3C traceparent, random per downstream connection.
fn traceparent(r: &mut dyn Random) -> String {
    format!(
        "00-{:016x}{:016x}-{:016x}-01",
        r.next_u64() | 1,
        r.next_u64(),
        r.next_u64() | 1
    )
}

#[cfg(test)]
mod tests;
