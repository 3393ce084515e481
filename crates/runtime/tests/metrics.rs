//! The runtime's metrics through one `prometheus-client` registry: Istio's TCP families with
//! its standard label set (and Ferry's two networks), the accept counters, and the memory a
//! connection keeps for its labels.

use std::sync::Arc;

use ferry_runtime::accept::Acceptor;
use ferry_runtime::admin::{OPENMETRICS, Response};
use ferry_runtime::telemetry::{Labels, Metrics, Reporter, SecurityPolicy};
use prometheus_client::registry::Registry;

fn labels(flags: &str) -> Labels {
    Labels {
        reporter: Reporter::Source,
        source_workload: "sleep".into(),
        source_workload_namespace: "a".into(),
        source_principal: "spiffe://td/ns/a/sa/sleep".into(),
        source_canonical_service: "sleep-app".into(),
        source_canonical_revision: "latest".into(),
        source_cluster: "alpha".into(),
        source_network: "net-a".into(),
        destination_workload: "echo".into(),
        destination_workload_namespace: "b".into(),
        destination_principal: "spiffe://td/ns/b/sa/echo".into(),
        destination_canonical_service: "echo-app".into(),
        destination_canonical_revision: "v2".into(),
        destination_service: "echo.b.svc.cluster.local".into(),
        destination_service_name: "echo".into(),
        destination_service_namespace: "b".into(),
        destination_cluster: "beta".into(),
        destination_network: "net-b".into(),
        connection_security_policy: SecurityPolicy::MutualTls,
        response_flags: flags.into(),
    }
}

/// Istio's standard TCP labels in the order of its metric reference, then Ferry's networks
/// beside the clusters.
const LABELS: &str = concat!(
    "reporter=\"source\",",
    "source_workload=\"sleep\",",
    "source_workload_namespace=\"a\",",
    "source_principal=\"spiffe://td/ns/a/sa/sleep\",",
    "source_app=\"sleep-app\",",
    "source_version=\"latest\",",
    "destination_workload=\"echo\",",
    "destination_workload_namespace=\"b\",",
    "destination_principal=\"spiffe://td/ns/b/sa/echo\",",
    "destination_app=\"echo-app\",",
    "destination_version=\"v2\",",
    "destination_service=\"echo.b.svc.cluster.local\",",
    "destination_service_name=\"echo\",",
    "destination_service_namespace=\"b\",",
    "request_protocol=\"tcp\",",
    "connection_security_policy=\"mutual_tls\",",
    "response_flags=\"-\",",
    "source_canonical_service=\"sleep-app\",",
    "source_canonical_revision=\"latest\",",
    "destination_canonical_service=\"echo-app\",",
    "destination_canonical_revision=\"v2\",",
    "destination_cluster=\"beta\",",
    "destination_network=\"net-b\",",
    "source_cluster=\"alpha\",",
    "source_network=\"net-a\"",
);

#[test]
fn unknown_labels_say_unknown_and_the_security_policy_has_istio_s_words() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    for policy in [
        SecurityPolicy::MutualTls,
        SecurityPolicy::None,
        SecurityPolicy::Unknown,
    ] {
        metrics.opened(&Labels::new(Reporter::Destination, policy));
    }
    let text = Response::metrics(&registry).body;
    let opened: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total{"))
        .collect();
    assert_eq!(opened.len(), 3, "{text}");
    for word in ["mutual_tls", "none", "unknown"] {
        assert!(
            opened
                .iter()
                .any(|l| l.contains(&format!("connection_security_policy=\"{word}\""))),
            "{word}:\n{text}"
        );
    }
    for l in opened {
        // Every label but these three is unknown.
        let (set, _) = l.split_once("} ").unwrap();
        for pair in set.split_once('{').unwrap().1.split(',') {
            let (name, value) = pair.split_once('=').unwrap();
            match name {
                "reporter" => assert_eq!(value, "\"destination\""),
                "request_protocol" => assert_eq!(value, "\"tcp\""),
                "response_flags" => assert_eq!(value, "\"-\""),
                "connection_security_policy" => {}
                _ => assert_eq!(value, "\"unknown\"", "{name} in {l}"),
            }
        }
    }
}

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

#[test]
fn failures_are_counted_by_flag_and_denials_by_policy_and_rule() {
    use ferry_core::authz::{Effect, Reason, RuleRef, Verdict};
    use ferry_core::model::PolicyKey;
    use ferry_runtime::conn::ResponseFlag;
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    // A refusal (its labels carry the flag), a connection that broke once up, a clean one.
    let refused = labels("DENY");
    metrics.opened(&refused);
    metrics.closed(&refused, 0, 0);
    let up = metrics.opened_shared(labels("-"));
    metrics.closed(&up, 5, 5);
    metrics.failed_after_open(&up, ResponseFlag::UpstreamTermination);
    metrics.failed_after_open(&up, ResponseFlag::None);
    let clean = metrics.opened_shared(labels("-"));
    metrics.closed(&clean, 1, 1);
    let verdict = |reason| Verdict {
        effect: Effect::Deny,
        reason,
        audited: Vec::new(),
        dry_run: Vec::new(),
    };
    let by_rule = verdict(Reason::DeniedBy(RuleRef {
        policy: PolicyKey::new("default", "deny-debug"),
        rule: 1,
    }));
    metrics.denials.count(Reporter::Destination, &by_rule);
    metrics.denials.count(Reporter::Destination, &by_rule);
    metrics.denials.count(
        Reporter::Destination,
        &verdict(Reason::NoAllowMatched { allow_policies: 2 }),
    );
    // An allow is no denial.
    metrics.denials.count(
        Reporter::Destination,
        &Verdict {
            effect: Effect::Allow,
            reason: Reason::NoAllowPolicies,
            audited: Vec::new(),
            dry_run: Vec::new(),
        },
    );
    let text = Response::metrics(&registry).body;
    let flagged = |flag: &str| {
        LABELS.replace(
            "response_flags=\"-\"",
            &format!("response_flags=\"{flag}\""),
        )
    };
    for sample in [
        format!("istio_tcp_connections_failed_total{{{}}} 1", flagged("DENY")),
        format!(
            "istio_tcp_connections_failed_total{{{}}} 1",
            flagged("UpstreamConnectionTermination")
        ),
        "ferry_policy_denied_total{reporter=\"destination\",policy=\"default/deny-debug\",rule=\"1\"} 2".to_string(),
        "ferry_policy_denied_total{reporter=\"destination\",policy=\"-\",rule=\"-\"} 1".to_string(),
    ] {
        assert!(text.lines().any(|l| l == sample), "no {sample}:\n{text}");
    }
    // The clean connections are not failures, and each denial family line is one of those.
    assert!(
        !text
            .lines()
            .any(|l| l == format!("istio_tcp_connections_failed_total{{{LABELS}}} 1")),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("ferry_policy_denied_total{"))
            .count(),
        2,
        "{text}"
    );
}
