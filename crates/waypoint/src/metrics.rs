//! The waypoint's request metrics, in Istio's names: `istio_requests_total` by response code
//! and `istio_request_duration_milliseconds` (a histogram), labelled with the original source
//! and the destination workload; plus the tunnels the waypoint refused.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Upper bounds of the duration histogram, in milliseconds.
const BUCKETS_MS: [f64; 12] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    code: u16,
    source_principal: String,
    destination_workload: String,
}

#[derive(Debug, Default)]
struct Series {
    count: u64,
    sum_ms: f64,
    buckets: [u64; BUCKETS_MS.len()],
}

/// Counters shared by every connection of one waypoint.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    series: Mutex<BTreeMap<Key, Series>>,
    /// Tunnels refused before any byte moved (no eligible backend, scope).
    pub refused: AtomicU64,
}

impl RequestMetrics {
    /// Records one request's answer.
    pub fn record(&self, code: u16, source: &str, destination: &str, ms: f64) {
        let key = Key {
            code,
            source_principal: source.to_string(),
            destination_workload: destination.to_string(),
        };
        let mut map = self.series.lock();
        let s = map.entry(key).or_default();
        s.count += 1;
        s.sum_ms += ms;
        for (i, le) in BUCKETS_MS.iter().enumerate() {
            if ms <= *le {
                s.buckets[i] += 1;
            }
        }
    }

    /// Requests answered with `code` so far.
    pub fn requests_with(&self, code: u16) -> u64 {
        self.series
            .lock()
            .iter()
            .filter(|(k, _)| k.code == code)
            .map(|(_, s)| s.count)
            .sum()
    }

    /// Prometheus text format.
    pub fn render(&self) -> String {
        let map = self.series.lock();
        let mut out = String::new();
        let labels = |k: &Key| {
            format!(
                "reporter=\"destination\",response_code=\"{}\",source_principal=\"{}\",destination_workload=\"{}\"",
                k.code,
                escape(&k.source_principal),
                escape(&k.destination_workload)
            )
        };
        out.push_str("# HELP istio_requests_total Requests answered by this waypoint.\n# TYPE istio_requests_total counter\n");
        for (k, s) in map.iter() {
            let _ = writeln!(out, "istio_requests_total{{{}}} {}", labels(k), s.count);
        }
        out.push_str("# HELP istio_request_duration_milliseconds Time to the response's headers.\n# TYPE istio_request_duration_milliseconds histogram\n");
        for (k, s) in map.iter() {
            let l = labels(k);
            for (i, le) in BUCKETS_MS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "istio_request_duration_milliseconds_bucket{{{l},le=\"{le}\"}} {}",
                    s.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "istio_request_duration_milliseconds_bucket{{{l},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "istio_request_duration_milliseconds_sum{{{l}}} {}",
                s.sum_ms
            );
            let _ = writeln!(
                out,
                "istio_request_duration_milliseconds_count{{{l}}} {}",
                s.count
            );
        }
        let _ = write!(
            out,
            "# HELP ferry_waypoint_refused_total Tunnels refused (no eligible backend, scope).\n# TYPE ferry_waypoint_refused_total counter\nferry_waypoint_refused_total {}\n",
            self.refused.load(Ordering::Relaxed)
        );
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = RequestMetrics::default();
        m.record(200, "spiffe://td/ns/a/sa/b", "w1", 0.5);
        m.record(200, "spiffe://td/ns/a/sa/b", "w1", 30.0);
        m.record(403, "spiffe://td/ns/a/sa/b", "w1", 0.1);
        m.refused.fetch_add(2, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("istio_requests_total{reporter=\"destination\",response_code=\"200\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 2"), "{text}");
        assert!(text.contains("response_code=\"403\""), "{text}");
        assert!(text.contains("response_code=\"200\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\",le=\"1\"} 1"), "{text}");
        assert!(text.contains("le=\"50\"} 2"), "{text}");
        assert!(text.contains("ferry_waypoint_refused_total 2"), "{text}");
        assert_eq!(m.requests_with(403), 1);
    }
}
