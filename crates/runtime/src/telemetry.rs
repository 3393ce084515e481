//! Access logs and Istio-named TCP metrics.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// Which proxy reports a connection (Istio's `reporter` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reporter {
    Source,
    Destination,
}

impl Reporter {
    fn as_str(self) -> &'static str {
        match self {
            Self::Source => "source",
            Self::Destination => "destination",
        }
    }
}

/// The labels of one connection's metrics (a bounded subset of Istio's standard set).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Labels {
    pub reporter: Reporter,
    pub source_workload: String,
    pub source_principal: String,
    pub source_cluster: String,
    pub source_network: String,
    pub destination_workload: String,
    pub destination_service: String,
    pub destination_principal: String,
    pub destination_cluster: String,
    pub destination_network: String,
    /// `-` when fine, else e.g. `DENY`, `ConnectionFailure`, `NoRoute`.
    pub response_flags: String,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    opened: u64,
    closed: u64,
    sent: u64,
    received: u64,
}

/// TCP metrics of one node proxy.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Each label set once, shared by the connections that carry it.
    by_labels: Mutex<BTreeMap<Arc<Labels>, Counters>>,
}

impl Metrics {
    pub fn opened(&self, l: &Labels) {
        self.with(l, |c| c.opened += 1);
    }

    /// Counts one opened connection and returns its labels as the shared copy the metrics
    /// keep: a long connection holds a pointer, not eleven strings of its own.
    pub fn opened_shared(&self, l: Labels) -> Arc<Labels> {
        let mut m = self.by_labels.lock();
        if let Some(k) = m.get_key_value(&l).map(|(k, _)| k.clone()) {
            if let Some(c) = m.get_mut(&*k) {
                c.opened += 1;
            }
            return k;
        }
        let k = Arc::new(l);
        m.insert(
            k.clone(),
            Counters {
                opened: 1,
                ..Counters::default()
            },
        );
        k
    }

    pub fn closed(&self, l: &Labels, sent: u64, received: u64) {
        self.with(l, |c| {
            c.closed += 1;
            c.sent += sent;
            c.received += received;
        });
    }

    fn with(&self, l: &Labels, f: impl FnOnce(&mut Counters)) {
        let mut m = self.by_labels.lock();
        match m.get_mut(l) {
            Some(c) => f(c),
            None => f(m.entry(Arc::new(l.clone())).or_default()),
        }
    }

    /// Connections opened with labels matching `f` (tests and admin).
    pub fn opened_where(&self, f: impl Fn(&Labels) -> bool) -> u64 {
        self.by_labels
            .lock()
            .iter()
            .filter(|(l, _)| f(l))
            .map(|(_, c)| c.opened)
            .sum()
    }

    /// Prometheus text exposition, with Istio's metric names.
    pub fn render(&self) -> String {
        let m = self.by_labels.lock();
        let mut out = String::new();
        type Family = (&'static str, &'static str, fn(&Counters) -> u64);
        let families: [Family; 4] = [
            (
                "istio_tcp_connections_opened_total",
                "TCP connections opened",
                |c| c.opened,
            ),
            (
                "istio_tcp_connections_closed_total",
                "TCP connections closed",
                |c| c.closed,
            ),
            (
                "istio_tcp_sent_bytes_total",
                "bytes sent to the destination",
                |c| c.sent,
            ),
            (
                "istio_tcp_received_bytes_total",
                "bytes received from the destination",
                |c| c.received,
            ),
        ];
        for (name, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (l, c) in m.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{reporter=\"{}\",source_workload=\"{}\",source_principal=\"{}\",source_cluster=\"{}\",source_network=\"{}\",destination_workload=\"{}\",destination_service=\"{}\",destination_principal=\"{}\",destination_cluster=\"{}\",destination_network=\"{}\",request_protocol=\"tcp\",response_flags=\"{}\"}} {}",
                    l.reporter.as_str(),
                    l.source_workload,
                    l.source_principal,
                    l.source_cluster,
                    l.source_network,
                    l.destination_workload,
                    l.destination_service,
                    l.destination_principal,
                    l.destination_cluster,
                    l.destination_network,
                    l.response_flags,
                    get(c)
                );
            }
        }
        out
    }
}

/// One access-log line per connection, at its end.
#[derive(Debug, Default)]
pub struct AccessLog<'a> {
    pub direction: &'a str,
    pub src_addr: String,
    pub src_workload: &'a str,
    pub src_identity: String,
    pub dst_addr: String,
    pub dst_hbone_addr: String,
    pub dst_service: String,
    pub dst_workload: String,
    pub dst_identity: String,
    /// The path taken and why (e.g. "hbone", "waypoint default/wp", "passthrough").
    pub path: String,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub duration: Duration,
    pub error: Option<String>,
}

impl AccessLog<'_> {
    pub fn emit(&self) {
        let error = self.error.as_deref().unwrap_or("");
        let msg = if self.error.is_some() {
            "connection failed"
        } else {
            "connection complete"
        };
        tracing::info!(
            target: "access",
            direction = self.direction,
            src.addr = %self.src_addr,
            src.workload = self.src_workload,
            src.identity = %self.src_identity,
            dst.addr = %self.dst_addr,
            dst.hbone_addr = %self.dst_hbone_addr,
            dst.service = %self.dst_service,
            dst.workload = %self.dst_workload,
            dst.identity = %self.dst_identity,
            path = %self.path,
            bytes_sent = self.bytes_sent,
            bytes_recv = self.bytes_recv,
            duration_ms = self.duration.as_millis() as u64,
            error,
            "{msg}"
        );
    }
}
