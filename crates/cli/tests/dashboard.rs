//! `deploy/grafana/ferry.json`, the Grafana dashboard for Ferry's metrics: valid JSON, panels
//! laid out without overlap, and every metric it queries one the code registers, under the name
//! the exposition gives it (a counter's samples end in `_total`, a histogram's in `_bucket`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prometheus_client::registry::Registry;

const DASHBOARD: &str = include_str!("../../../deploy/grafana/ferry.json");

/// What the brief of the dashboard asks it to show.
const REQUIRED: [&str; 9] = [
    "istio_tcp_connections_opened_total",
    "istio_tcp_connections_closed_total",
    "istio_tcp_connections_failed_total",
    "istio_tcp_sent_bytes_total",
    "istio_tcp_received_bytes_total",
    "ferry_policy_denied_total",
    "ferry_connect_retries_total",
    "ferry_capture_repairs_total",
    "ferry_xds_streams_open",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `expr` of every panel's targets, with the panel's title.
fn queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        let title = p["title"].as_str().unwrap_or_default().to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target has an expr");
            out.push((title.clone(), expr.to_string()));
        }
    }
    out
}

/// The `istio_*` and `ferry_*` metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // A label value is no metric name.
        if bytes[i] == b'"' {
            i = expr[i + 1..].find('"').map_or(expr.len(), |n| i + n + 2);
            continue;
        }
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        if starts_word && (expr[i..].starts_with("istio_") || expr[i..].starts_with("ferry_")) {
            let end = expr[i..]
                .find(|c: char| !is_ident(c as u8))
                .map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The families the code registers, by kind, from the registries the crates' public APIs
/// build (the node proxy's, the runtime's, the control plane's).
fn exposed_kinds() -> BTreeMap<String, String> {
    let mut registry = Registry::default();
    let _tcp = ferry_runtime::telemetry::Metrics::new(&mut registry);
    let _accept = ferry_runtime::accept::Acceptor::new(&mut registry);
    ferry_control::metrics::KubeMetrics::default().register(&mut registry);
    let mut text = ferry_runtime::admin::Response::metrics(&registry).body;
    let control = ferry_control::metrics::Metrics::default().registry();
    text.push_str(&ferry_runtime::admin::Response::metrics(&control).body);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// Every `"istio_..."` and `"ferry_..."` string literal in the crates' sources (tests left
/// out): the families registered by code the public APIs do not reach (the node proxy's
/// private counters, the waypoint's, the gateway's).
fn named_in_sources() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs = vec![workspace().join("crates")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "tests" | "target" | "fuzz" | "benches") {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for part in text.split('"').skip(1).step_by(2) {
                    let is_name = (part.starts_with("istio_") || part.starts_with("ferry_"))
                        && part.bytes().all(is_ident);
                    if is_name {
                        names.insert(part.to_string());
                    }
                }
            }
        }
    }
    names
}

/// The family a sample name belongs to, and the kind its suffix requires.
fn family_of(sample: &str) -> (&str, Option<&'static str>) {
    for (suffix, kind) in [
        ("_total", "counter"),
        ("_bucket", "histogram"),
        ("_sum", "histogram"),
        ("_count", "histogram"),
    ] {
        if let Some(family) = sample.strip_suffix(suffix) {
            return (family, Some(kind));
        }
    }
    (sample, None)
}

#[test]
fn the_dashboard_is_valid_json_with_panels_that_do_not_overlap() {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("valid JSON");
    assert_eq!(d["uid"], "ferry-mesh");
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for p in panels {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "id of {title} reused"
        );
        if p["type"] != "row" {
            assert!(
                !p["targets"].as_array().unwrap().is_empty(),
                "{title} has no query"
            );
        }
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is wider than the grid");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.to_string()) {
                    panic!("{title} overlaps {other} at {cx},{cy}");
                }
            }
        }
    }
}

#[test]
fn every_metric_the_dashboard_queries_is_one_the_code_registers() {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let kinds = exposed_kinds();
    let sources = named_in_sources();
    // The public registries are a part of what the sources name: the scan sees them.
    for family in kinds.keys() {
        assert!(
            sources.contains(family),
            "{family} not found in the sources"
        );
    }
    let mut queried = BTreeSet::new();
    for (title, expr) in queries(&d) {
        for sample in metric_names(&expr) {
            let (family, suffix_kind) = family_of(&sample);
            match kinds.get(family) {
                // Exposed here: the suffix must be the one its kind gives its samples.
                Some(kind) => assert_eq!(
                    suffix_kind.unwrap_or(kind.as_str()),
                    kind.as_str(),
                    "{title}: {sample} queried, but {family} is a {kind}"
                ),
                None => assert!(
                    sources.contains(family),
                    "{title}: {sample} queries {family}, which no crate registers"
                ),
            }
            queried.insert(sample);
        }
    }
    for want in REQUIRED {
        assert!(queried.contains(want), "the dashboard does not show {want}");
    }
}

#[test]
fn the_scan_finds_metric_names_and_nothing_else() {
    assert_eq!(
        metric_names(
            "sum by (le) (rate(istio_request_duration_milliseconds_bucket{x=\"ferry_no\"}[5m])) / my_ferry_x"
        ),
        BTreeSet::from(["istio_request_duration_milliseconds_bucket".to_string()])
    );
    assert_eq!(
        family_of("ferry_xds_streams_total"),
        ("ferry_xds_streams", Some("counter"))
    );
    assert_eq!(
        family_of("ferry_xds_streams_open"),
        ("ferry_xds_streams_open", None)
    );
}
