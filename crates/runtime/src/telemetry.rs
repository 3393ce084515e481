//! Access logs and Istio-named TCP metrics.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_hbone::Side;
use parking_lot::Mutex;
use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Metric, Registry};

use ferry_core::authz::{Reason, Verdict};
use ferry_core::model::{Service, Workload};

use crate::conn::{ConnError, ConnErrorKind, Denial, ResponseFlag, side_name};
use crate::records::{self, Record};
use crate::text::Text;

/// A new metric, registered in `registry` as `name` with `help`.
pub fn registered<M: Metric + Clone + Default>(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> M {
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Which proxy reports a connection (Istio's `reporter` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reporter {
    Source,
    Destination,
}

/// How a connection was secured (Istio's `connection_security_policy` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecurityPolicy {
    /// In an HBONE tunnel (mutual TLS), at either end.
    MutualTls,
    /// Plain TCP: to a destination out of the mesh, or from a source out of it.
    None,
    /// Not known: refused before a transport was chosen.
    Unknown,
}

/// The labels of one connection's metrics: Istio's standard TCP label set, plus Ferry's
/// `source_network` and `destination_network`. A field that is not known is `unknown`.
///
/// [`EncodeLabelSet`] writes them in the order of Istio's metric reference: `reporter`,
/// `source_workload`, `source_workload_namespace`, `source_principal`, `source_app`,
/// `source_version`, `destination_workload`, `destination_workload_namespace`,
/// `destination_principal`, `destination_app`, `destination_version`, `destination_service`,
/// `destination_service_name`, `destination_service_namespace`, `request_protocol` (`tcp`),
/// `connection_security_policy`, `response_flags`, `source_canonical_service`,
/// `source_canonical_revision`, `destination_canonical_service`,
/// `destination_canonical_revision`, `destination_cluster`, `destination_network`,
/// `source_cluster`, `source_network`. `source_app` and `source_version` repeat the canonical
/// service and revision, as ztunnel's do (Envoy sidecars read the `app` and `version` labels
/// instead, which the canonical service falls back to), and so do the destination's: each is
/// kept once here.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels {
    pub reporter: Reporter,
    pub source_workload: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    /// Also exported as `source_app`.
    pub source_canonical_service: String,
    /// Also exported as `source_version`.
    pub source_canonical_revision: String,
    pub source_cluster: String,
    pub source_network: String,
    pub destination_workload: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    /// Also exported as `destination_app`.
    pub destination_canonical_service: String,
    /// Also exported as `destination_version`.
    pub destination_canonical_revision: String,
    /// The service's hostname (`echo.default.svc.cluster.local`).
    pub destination_service: String,
    pub destination_service_name: String,
    pub destination_service_namespace: String,
    pub destination_cluster: String,
    pub destination_network: String,
    pub connection_security_policy: SecurityPolicy,
    /// `-` when fine, else e.g. `DENY`, `ConnectionFailure`, `NoRoute`: a
    /// [`ResponseFlag`]'s string (kept a `String` for the programs that build their own).
    pub response_flags: String,
}

/// A label set as the families keep it: one allocation per distinct set, shared by the
/// families and by the connections that carry it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Shared(Arc<Labels>);

type Tcp = Family<Shared, Counter>;

/// TCP metrics of one node proxy: `istio_tcp_connections_opened_total`,
/// `istio_tcp_connections_closed_total`, `istio_tcp_sent_bytes_total`,
/// `istio_tcp_received_bytes_total`, `istio_tcp_connections_failed_total` (by response flag),
/// and the policy denials ([`Denials`]).
#[derive(Debug)]
pub struct Metrics {
    opened: Tcp,
    closed: Tcp,
    sent: Tcp,
    received: Tcp,
    /// Connections that ended with a response flag: refused (DENY, NoRoute), not connected
    /// (ConnectionFailure), or broken once up; under their labels with that flag.
    failed: Tcp,
    pub denials: Denials,
    /// Each label set once: what [`Metrics::opened_shared`] hands out, and the index of the
    /// families' series (a family cannot be listed).
    sets: Mutex<HashSet<Arc<Labels>>>,
}

// === impl Reporter ===

impl Reporter {
    fn as_str(self) -> &'static str {
        match self {
            Self::Source => "source",
            Self::Destination => "destination",
        }
    }
}

impl EncodeLabelValue for Reporter {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

// === impl SecurityPolicy ===

impl SecurityPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MutualTls => "mutual_tls",
            Self::None => "none",
            Self::Unknown => "unknown",
        }
    }
}

// === impl Labels ===

/// What a label says when it is not known (and what an empty value is exported as).
pub const UNKNOWN: &str = "unknown";

fn known(value: &str) -> String {
    if value.is_empty() { UNKNOWN } else { value }.to_string()
}

impl Labels {
    /// Every label `unknown`, by `reporter`, security `policy`, response flag `-`.
    pub fn new(reporter: Reporter, policy: SecurityPolicy) -> Self {
        let unknown = || UNKNOWN.to_string();
        Self {
            reporter,
            source_workload: unknown(),
            source_workload_namespace: unknown(),
            source_principal: unknown(),
            source_canonical_service: unknown(),
            source_canonical_revision: unknown(),
            source_cluster: unknown(),
            source_network: unknown(),
            destination_workload: unknown(),
            destination_workload_namespace: unknown(),
            destination_principal: unknown(),
            destination_canonical_service: unknown(),
            destination_canonical_revision: unknown(),
            destination_service: unknown(),
            destination_service_name: unknown(),
            destination_service_namespace: unknown(),
            destination_cluster: unknown(),
            destination_network: unknown(),
            connection_security_policy: policy,
            response_flags: ResponseFlag::None.into(),
        }
    }

    /// The source labels of workload `w` (its name, namespace, canonical service and revision,
    /// cluster and network); the principal is the caller's to set (what was proven).
    pub fn with_source(mut self, w: &Workload) -> Self {
        let c = ferry_core::telemetry::canonical(w);
        self.source_workload = known(&w.name);
        self.source_workload_namespace = known(&w.namespace);
        self.source_canonical_service = known(c.service);
        self.source_canonical_revision = known(c.revision);
        self.source_cluster = known(w.cluster.as_str());
        self.source_network = known(w.network.as_str());
        self
    }

    /// The destination labels of workload `w`, likewise (the principal is the caller's).
    pub fn with_destination(mut self, w: &Workload) -> Self {
        let c = ferry_core::telemetry::canonical(w);
        self.destination_workload = known(&w.name);
        self.destination_workload_namespace = known(&w.namespace);
        self.destination_canonical_service = known(c.service);
        self.destination_canonical_revision = known(c.revision);
        self.destination_cluster = known(w.cluster.as_str());
        self.destination_network = known(w.network.as_str());
        self
    }

    /// The destination service labels of `s`: its hostname, name and namespace.
    pub fn with_service(mut self, s: &Service) -> Self {
        self.destination_service = known(&s.hostname);
        self.destination_service_name = known(&s.name);
        self.destination_service_namespace = known(&s.namespace);
        self
    }
}

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        [
            ("reporter", self.reporter.as_str()),
            ("source_workload", &self.source_workload),
            ("source_workload_namespace", &self.source_workload_namespace),
            ("source_principal", &self.source_principal),
            ("source_app", &self.source_canonical_service),
            ("source_version", &self.source_canonical_revision),
            ("destination_workload", &self.destination_workload),
            (
                "destination_workload_namespace",
                &self.destination_workload_namespace,
            ),
            ("destination_principal", &self.destination_principal),
            ("destination_app", &self.destination_canonical_service),
            ("destination_version", &self.destination_canonical_revision),
            ("destination_service", &self.destination_service),
            ("destination_service_name", &self.destination_service_name),
            (
                "destination_service_namespace",
                &self.destination_service_namespace,
            ),
            ("request_protocol", "tcp"),
            (
                "connection_security_policy",
                self.connection_security_policy.as_str(),
            ),
            ("response_flags", &self.response_flags),
            ("source_canonical_service", &self.source_canonical_service),
            ("source_canonical_revision", &self.source_canonical_revision),
            (
                "destination_canonical_service",
                &self.destination_canonical_service,
            ),
            (
                "destination_canonical_revision",
                &self.destination_canonical_revision,
            ),
            ("destination_cluster", &self.destination_cluster),
            ("destination_network", &self.destination_network),
            ("source_cluster", &self.source_cluster),
            ("source_network", &self.source_network),
        ]
        .encode(encoder)
    }
}

impl EncodeLabelSet for Shared {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }
}

// === impl Metrics ===

impl Metrics {
    /// The four families, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let mut family = |name, help| registered(registry, name, help);
        Self {
            opened: family("istio_tcp_connections_opened", "TCP connections opened"),
            closed: family("istio_tcp_connections_closed", "TCP connections closed"),
            sent: family("istio_tcp_sent_bytes", "bytes sent to the destination"),
            received: family(
                "istio_tcp_received_bytes",
                "bytes received from the destination",
            ),
            failed: family(
                "istio_tcp_connections_failed",
                "TCP connections that failed, by response flag",
            ),
            denials: Denials::new(registry),
            sets: Mutex::default(),
        }
    }

    pub fn opened(&self, l: &Labels) {
        self.opened.get_or_create(&self.shared(l)).inc();
    }

    /// Counts one opened connection and returns its labels as the shared copy the metrics
    /// keep: a long connection holds a pointer, not twenty strings of its own.
    pub fn opened_shared(&self, l: Labels) -> Arc<Labels> {
        let key = {
            let mut sets = self.sets.lock();
            match sets.get(&l) {
                Some(k) => Shared(k.clone()),
                None => self.insert(&mut sets, Arc::new(l)),
            }
        };
        self.opened.get_or_create(&key).inc();
        key.0
    }

    /// Counts one closed connection and its bytes; one whose labels carry a response flag (a
    /// refusal, a failed connect) is also counted failed.
    pub fn closed(&self, l: &Labels, sent: u64, received: u64) {
        let key = self.shared(l);
        self.closed.get_or_create(&key).inc();
        self.sent.get_or_create(&key).inc_by(sent);
        self.received.get_or_create(&key).inc_by(received);
        if l.response_flags != ResponseFlag::None.as_str() {
            self.failed.get_or_create(&key).inc();
        }
    }

    /// Counts a connection that was up under `l` (no flag) and then failed with `flag` (one
    /// side broke, the idle bound, a policy change): `istio_tcp_connections_failed_total` under
    /// `l` with that flag. A flag of `-` counts nothing.
    pub fn failed_after_open(&self, l: &Labels, flag: ResponseFlag) {
        if flag == ResponseFlag::None {
            return;
        }
        let flagged = Labels {
            response_flags: flag.as_str().to_string(),
            ..l.clone()
        };
        self.failed.get_or_create(&Shared(Arc::new(flagged))).inc();
    }

    /// Connections opened with labels matching `f` (tests and admin).
    pub fn opened_where(&self, f: impl Fn(&Labels) -> bool) -> u64 {
        let sets: Vec<Arc<Labels>> = self.sets.lock().iter().filter(|l| f(l)).cloned().collect();
        sets.into_iter()
            .filter_map(|l| self.opened.get(&Shared(l)).map(|c| c.get()))
            .sum()
    }

    /// The one shared copy of `l` (made on its first use).
    fn shared(&self, l: &Labels) -> Shared {
        let mut sets = self.sets.lock();
        match sets.get(l) {
            Some(k) => Shared(k.clone()),
            None => self.insert(&mut sets, Arc::new(l.clone())),
        }
    }

    /// A new label set, with its series in all four families from the start (at zero), as
    /// a scrape has always shown them.
    fn insert(&self, sets: &mut HashSet<Arc<Labels>>, l: Arc<Labels>) -> Shared {
        sets.insert(l.clone());
        let key = Shared(l);
        for family in [&self.opened, &self.closed, &self.sent, &self.received] {
            drop(family.get_or_create(&key));
        }
        key
    }
}

/// The policy (`namespace/name`) and rule (its index) that made `verdict` a denial; `-` and `-`
/// when ALLOW policies apply and none matched; `None` for an allow.
fn deciding_rule(verdict: &Verdict) -> Option<(String, String)> {
    match &verdict.reason {
        Reason::DeniedBy(r) => Some((r.policy.to_string(), r.rule.to_string())),
        Reason::NoAllowMatched { .. } => Some(("-".into(), "-".into())),
        Reason::AllowedBy(_) | Reason::NoAllowPolicies => None,
    }
}

/// The labels of one denial: who reported it, and the policy and rule that decided.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DenialLabels {
    reporter: Reporter,
    policy: String,
    rule: String,
}

impl EncodeLabelSet for DenialLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        [
            ("reporter", self.reporter.as_str()),
            ("policy", &self.policy),
            ("rule", &self.rule),
        ]
        .encode(encoder)
    }
}

/// Denials by the policy and rule that decided them: `ferry_policy_denied_total{reporter,
/// policy, rule}`, `policy` as `namespace/name` and `rule` the rule's index in it. A denial
/// because ALLOW policies apply and none matched has no deciding rule: `policy="-"`, `rule="-"`.
/// Counted at the hop that decided (a destination node proxy, a waypoint), once per refused
/// connection, request, or connection closed by a policy change.
#[derive(Clone, Debug, Default)]
pub struct Denials(Family<DenialLabels, Counter>);

// === impl Denials ===

impl Denials {
    pub fn new(registry: &mut Registry) -> Self {
        registered(
            registry,
            "ferry_policy_denied",
            "Connections and requests denied, by the policy and rule that decided",
        )
    }

    /// Counts `verdict` if it denies.
    pub fn count(&self, reporter: Reporter, verdict: &Verdict) {
        let Some((policy, rule)) = deciding_rule(verdict) else {
            return;
        };
        self.0
            .get_or_create(&DenialLabels {
                reporter,
                policy,
                rule,
            })
            .inc();
    }

    /// Counts the denial `e` carries, if it is one (refused by policy, or closed by a change).
    pub fn count_error(&self, reporter: Reporter, e: &ConnError) {
        match &e.kind {
            ConnErrorKind::Denied(Denial(v))
            | ConnErrorKind::PolicyChanged {
                denial: Denial(v), ..
            } => {
                self.count(reporter, v);
            }
            _ => {}
        }
    }
}

impl prometheus_client::encoding::EncodeMetric for Denials {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }
}

/// One access-log line per connection, at its end. Its text fields are [`Text`]: held as they
/// were found (addresses, names shared with the snapshot) for as long as the connection lives,
/// and written out only when the line is.
#[derive(Debug, Default)]
pub struct AccessLog<'a> {
    pub direction: &'a str,
    pub src_addr: Text,
    pub src_workload: &'a str,
    pub src_identity: Text,
    /// The source's cluster as this hop knows it (from the peer's certificate past the first
    /// hop).
    pub src_cluster: Text,
    pub dst_addr: Text,
    pub dst_hbone_addr: Text,
    pub dst_service: Text,
    pub dst_workload: Text,
    pub dst_identity: Text,
    /// The cluster of the workload it landed on.
    pub dst_cluster: Text,
    /// The path taken and why (e.g. "hbone", "waypoint default/wp", "passthrough").
    pub path: Text,
    /// The routing decision in short ([`ferry_core::route::Compact::summary`]), when records
    /// are kept and this hop routed.
    pub route: Text,
    /// When each phase was reached, from the connection's start.
    pub phases: Phases,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub duration: Duration,
    pub error: Option<String>,
    /// How the connection ended, as the metrics' `response_flags` say it.
    pub response_flags: ResponseFlag,
    /// Which side failed, if one did.
    pub error_side: Option<Side>,
    /// The policy and rule that denied it, if a policy did (`-` when no ALLOW matched).
    pub denied_by: Option<(String, String)>,
    /// The W3C trace id every hop of the connection records (the source starts it).
    pub trace_id: Text,
}

/// When a connection reached each phase, measured from its start; `None` when it did not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// The routing decision (or the admission decision at a destination) was taken.
    pub decision: Option<Duration>,
    /// The next hop was reached: its tunnel answered 200, or its TCP connection was up.
    pub connect: Option<Duration>,
    /// How long the handshake of a new HBONE connection took (TCP, TLS, HTTP/2), when the
    /// tunnel needed one (a duration, not a moment).
    pub tls: Option<Duration>,
    /// The first byte came back from the next hop.
    pub first_byte: Option<Duration>,
}

fn micros(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl AccessLog<'_> {
    /// Records `e` as how the connection ended: `error` is what failed, `error.side` the side
    /// that failed, `response_flags` its flag.
    pub fn fail(&mut self, e: &ConnError) {
        self.error = Some(e.kind.to_string());
        self.error_side = Some(e.side);
        self.response_flags = e.flag;
        if let ConnErrorKind::Denied(Denial(v))
        | ConnErrorKind::PolicyChanged {
            denial: Denial(v), ..
        } = &e.kind
        {
            self.denied_by = deciding_rule(v);
        }
    }

    /// Logs the line and keeps it as this process's connection record ([`records`]), both
    /// under one new connection id.
    pub fn emit(self) {
        let msg = if self.error.is_some() {
            "connection failed"
        } else {
            "connection complete"
        };
        self.emit_as(msg);
    }

    /// [`AccessLog::emit`], the line saying `msg` (e.g. "waypoint refused the connection").
    pub fn emit_as(self, msg: &'static str) {
        let records = records::global();
        let id = records.next_id();
        self.log(&id, msg);
        if !records.keeps() {
            return;
        }
        // The line is written: its fields are written out into the record.
        let (policy, rule) = self.denied_by.unwrap_or_default();
        records.push(Record {
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            id,
            trace_id: self.trace_id.to_string(),
            direction: self.direction.to_string(),
            src_addr: self.src_addr.to_string(),
            src_workload: self.src_workload.to_string(),
            src_identity: self.src_identity.to_string(),
            src_cluster: self.src_cluster.to_string(),
            dst_addr: self.dst_addr.to_string(),
            dst_hbone_addr: self.dst_hbone_addr.to_string(),
            dst_service: self.dst_service.to_string(),
            dst_workload: self.dst_workload.to_string(),
            dst_identity: self.dst_identity.to_string(),
            dst_cluster: self.dst_cluster.to_string(),
            path: self.path.to_string(),
            route: self.route.to_string(),
            decision_us: micros(self.phases.decision),
            connect_us: micros(self.phases.connect),
            tls_us: micros(self.phases.tls),
            first_byte_us: micros(self.phases.first_byte),
            verdict: if policy.is_empty() {
                "allowed"
            } else {
                "denied"
            },
            policy,
            rule,
            response_flags: self.response_flags.as_str(),
            error: self.error.unwrap_or_default(),
            bytes_sent: self.bytes_sent,
            bytes_recv: self.bytes_recv,
            duration_ms: u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
        });
    }

    fn log(&self, id: &str, msg: &str) {
        let error = self.error.as_deref().unwrap_or("");
        tracing::info!(
            target: "access",
            direction = self.direction,
            conn.id = %id,
            trace.id = %self.trace_id,
            src.addr = %self.src_addr,
            src.workload = self.src_workload,
            src.identity = %self.src_identity,
            src.cluster = %self.src_cluster,
            dst.addr = %self.dst_addr,
            dst.hbone_addr = %self.dst_hbone_addr,
            dst.service = %self.dst_service,
            dst.workload = %self.dst_workload,
            dst.identity = %self.dst_identity,
            dst.cluster = %self.dst_cluster,
            path = %self.path,
            route = %self.route,
            bytes_sent = self.bytes_sent,
            bytes_recv = self.bytes_recv,
            duration_ms = self.duration.as_millis() as u64,
            error,
            error.side = self.error_side.map_or("", side_name),
            response_flags = self.response_flags.as_str(),
            "{msg}"
        );
    }
}
