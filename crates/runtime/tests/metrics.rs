//! The runtime's metrics through one `prometheus-client` registry: Istio's TCP families with
//! their twelve labels, the accept counters, and the memory a connection keeps for its labels.

use std::sync::Arc;

use ferry_runtime::accept::Acceptor;
use ferry_runtime::admin::{OPENMETRICS, Response};
use ferry_runtime::telemetry::{Labels, Metrics, Reporter};
use prometheus_client::registry::Registry;

fn labels(flags: &str) -> Labels {
    Labels {
        reporter: Reporter::Source,
        source_workload: "sleep".into(),
        source_principal: "spiffe://td/ns/a/sa/sleep".into(),
        source_cluster: "alpha".into(),
        source_network: "net-a".into(),
        destination_workload: "echo".into(),
        destination_service: "echo.default.svc".into(),
        destination_principal: "spiffe://td/ns/a/sa/echo".into(),
        destination_cluster: "beta".into(),
        destination_network: "net-b".into(),
        response_flags: flags.into(),
    }
}

const LABELS: &str = "reporter=\"source\",source_workload=\"sleep\",source_principal=\"spiffe://td/ns/a/sa/sleep\",source_cluster=\"alpha\",source_network=\"net-a\",destination_workload=\"echo\",destination_service=\"echo.default.svc\",destination_principal=\"spiffe://td/ns/a/sa/echo\",destination_cluster=\"beta\",destination_network=\"net-b\",request_protocol=\"tcp\",response_flags=\"-\"";

#[test]
fn the_scrape_has_every_family_typed_with_its_samples() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let acceptor = Acceptor::new(&mut registry);
    let l = metrics.opened_shared(labels("-"));
    metrics.opened(&labels("-"));
    metrics.closed(&l, 10, 20);
    metrics.closed(&l, 1, 2);
    acceptor.errors.inc();

    let r = Response::metrics(&registry);
    assert_eq!(r.content_type, OPENMETRICS);
    let text = r.body;
    for (family, kind) in [
        ("istio_tcp_connections_opened", "counter"),
        ("istio_tcp_connections_closed", "counter"),
        ("istio_tcp_sent_bytes", "counter"),
        ("istio_tcp_received_bytes", "counter"),
        ("ferry_accept_refused", "counter"),
        ("ferry_accept_errors", "counter"),
    ] {
        assert!(
            text.lines().any(|l| l == format!("# TYPE {family} {kind}")),
            "no TYPE line for {family}:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {family} "))),
            "no HELP line for {family}:\n{text}"
        );
    }
    for sample in [
        format!("istio_tcp_connections_opened_total{{{LABELS}}} 2"),
        format!("istio_tcp_connections_closed_total{{{LABELS}}} 2"),
        format!("istio_tcp_sent_bytes_total{{{LABELS}}} 11"),
        format!("istio_tcp_received_bytes_total{{{LABELS}}} 22"),
        "ferry_accept_refused_total{reason=\"fd_limit\"} 0".to_string(),
        "ferry_accept_errors_total 1".to_string(),
    ] {
        assert!(text.lines().any(|l| l == sample), "no {sample}:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(
        metrics.opened_where(|l| l.destination_workload == "echo"),
        2
    );
    assert_eq!(metrics.opened_where(|l| l.response_flags == "DENY"), 0);
}

#[test]
fn connections_share_one_label_set() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let a = metrics.opened_shared(labels("-"));
    let b = metrics.opened_shared(labels("-"));
    assert!(Arc::ptr_eq(&a, &b), "two copies of one label set");
    // What a connection keeps for its metrics is one pointer, however long its labels.
    assert_eq!(std::mem::size_of_val(&a), std::mem::size_of::<usize>());
    // A label set seen first by `closed` (a refusal) is the one handed out later.
    let refused = labels("NoRoute");
    metrics.opened(&refused);
    metrics.closed(&refused, 0, 0);
    let c = metrics.opened_shared(labels("NoRoute"));
    let d = metrics.opened_shared(labels("NoRoute"));
    assert!(Arc::ptr_eq(&c, &d));
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(metrics.opened_where(|l| l.response_flags == "NoRoute"), 3);
}
