//! The waypoint's request metrics, in Istio's names: `istio_requests_total` by response code
//! and `istio_request_duration_milliseconds` (a histogram), labelled with the request's
//! protocol (Istio's `request_protocol`: `grpc` or `http`), the original source and the
//! destination workload; plus the tunnels the waypoint refused
//! (`ferry_waypoint_refused_total`).

use ferry_runtime::telemetry::{Denials, Reporter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the duration histogram, in milliseconds.
const BUCKETS_MS: [f64; 12] = [
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// One request's labels. The waypoint always reports as the destination.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    reporter: Reporter,
    response_code: u16,
    request_protocol: &'static str,
    source_principal: String,
    destination_workload: String,
}

type Durations = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// Counters shared by every connection of one waypoint.
#[derive(Debug)]
pub struct RequestMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
    /// Tunnels refused before any byte moved (no eligible backend, scope).
    pub refused: Counter,
    /// Requests and tunnels denied by policy, by policy and rule.
    pub denials: Denials,
}

// === impl RequestMetrics ===

impl RequestMetrics {
    /// The waypoint's families, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            durations: Durations::new_with_constructor(|| Histogram::new(BUCKETS_MS)),
            refused: Counter::default(),
            denials: Denials::new(registry),
        };
        registry.register(
            "istio_requests",
            "Requests answered by this waypoint",
            m.requests.clone(),
        );
        registry.register(
            "istio_request_duration_milliseconds",
            "Time to the response's headers",
            m.durations.clone(),
        );
        registry.register(
            "ferry_waypoint_refused",
            "Tunnels refused (no eligible backend, scope)",
            m.refused.clone(),
        );
        m
    }

    /// Records one request's answer; `protocol` is its [`request_protocol`].
    pub fn record(
        &self,
        code: u16,
        protocol: &'static str,
        source: &str,
        destination: &str,
        ms: f64,
    ) {
        let labels = RequestLabels {
            reporter: Reporter::Destination,
            response_code: code,
            request_protocol: protocol,
            source_principal: escape(source),
            destination_workload: escape(destination),
        };
        self.requests.get_or_create(&labels).inc();
        self.durations.get_or_create(&labels).observe(ms);
    }

    /// Requests answered with `code` so far, read back from the exposition.
    #[cfg(test)]
    pub(crate) fn requests_with(&self, code: u16) -> u64 {
        let mut registry = Registry::default();
        registry.register("istio_requests", "", self.requests.clone());
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        let code = format!("response_code=\"{code}\"");
        text.lines()
            .filter(|l| l.starts_with("istio_requests_total{") && l.contains(&code))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    }
}

/// A request's protocol as Istio's `request_protocol` says it: `grpc` for a gRPC request (its
/// `content-type` is `application/grpc`, or `application/grpc+<codec>`), else `http`.
pub(crate) fn request_protocol(headers: &http::HeaderMap) -> &'static str {
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.to_ascii_lowercase();
            v == "application/grpc"
                || v.starts_with("application/grpc+")
                || v.starts_with("application/grpc;")
        });
    if grpc { "grpc" } else { "http" }
}

/// A label value as the exposition format needs it (`prometheus-client` writes values as
/// given): an identity or a name from a peer must not end the label early.
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
        let mut registry = Registry::default();
        let m = RequestMetrics::new(&mut registry);
        m.record(200, "http", "spiffe://td/ns/a/sa/b", "w1", 0.5);
        m.record(200, "http", "spiffe://td/ns/a/sa/b", "w1", 30.0);
        m.record(403, "grpc", "spiffe://td/ns/a/sa/b", "w1", 0.1);
        m.refused.inc_by(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("istio_requests_total{reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 2"), "{text}");
        assert!(
            text.contains("response_code=\"403\",request_protocol=\"grpc\""),
            "{text}"
        );
        // prometheus-client writes a bucket's bound first and as a float: `le="1.0",...` for
        // the old `...,le="1"`.
        assert!(text.contains("{le=\"1.0\",reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 1"), "{text}");
        assert!(text.contains("{le=\"50.0\",reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 2"), "{text}");
        assert!(text.contains("ferry_waypoint_refused_total 2"), "{text}");
        assert_eq!(m.requests_with(403), 1);
        for (family, kind) in [
            ("istio_requests", "counter"),
            ("istio_request_duration_milliseconds", "histogram"),
            ("ferry_waypoint_refused", "counter"),
        ] {
            assert!(
                text.lines().any(|l| l == format!("# TYPE {family} {kind}")),
                "no TYPE line for {family}:\n{text}"
            );
        }
        for sample in [
            "istio_request_duration_milliseconds_sum{reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 30.5",
            "istio_request_duration_milliseconds_count{reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 2",
            "istio_request_duration_milliseconds_bucket{le=\"+Inf\",reporter=\"destination\",response_code=\"200\",request_protocol=\"http\",source_principal=\"spiffe://td/ns/a/sa/b\",destination_workload=\"w1\"} 2",
        ] {
            assert!(text.lines().any(|l| l == sample), "no {sample}:\n{text}");
        }
    }

    #[test]
    fn a_quote_in_a_label_value_is_escaped() {
        let mut registry = Registry::default();
        let m = RequestMetrics::new(&mut registry);
        m.record(200, "http", "spiffe://td/ns/a/sa/b\"x", "w1", 1.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("source_principal=\"spiffe://td/ns/a/sa/b\\\"x\""),
            "{text}"
        );
    }

    #[test]
    fn grpc_requests_are_told_by_their_content_type() {
        let with = |ct: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            request_protocol(&h)
        };
        assert_eq!(with("application/grpc"), "grpc");
        assert_eq!(with("application/grpc+proto"), "grpc");
        assert_eq!(with("Application/GRPC"), "grpc");
        assert_eq!(with("application/grpc-web"), "http");
        assert_eq!(with("application/json"), "http");
        assert_eq!(request_protocol(&http::HeaderMap::new()), "http");
    }
}
