//! Bad topology files are rejected with every problem, each located and saying what was
//! expected and what was found.

use ferry_topology::{Location, TopologyError, parse};

/// A small valid mesh that the cases below break in one way each.
const BASE: &str = "\
clusters:
  - {name: east, network: net-east}
  - {name: west, network: net-west}
nodes:
  - {name: east-1, cluster: east}
  - {name: west-1, cluster: west}
";

fn reject(doc: &str) -> TopologyError {
    match parse("bad.yaml", doc) {
        Ok(_) => panic!("expected an error, found a valid topology for:\n{doc}"),
        Err(e) => e,
    }
}

fn accept(doc: &str) {
    if let Err(e) = parse("good.yaml", doc) {
        panic!("expected a valid topology, found errors:\n{e}\nfor:\n{doc}");
    }
}

/// Each case: a name, a document, and substrings the error text must contain, in order, on
/// one line each.
const CASES: &[(&str, &str, &[&str])] = &[
    (
        "unknown top-level field",
        "clusters: [{name: east, network: n}]\nservise: []\n",
        &["bad.yaml:2:1: servise: unknown field `servise`, expected one of"],
    ),
    (
        "unknown nested field, with line and column",
        "clusters:\n  - name: east\n    network: net-east\n    netwrk: x\n",
        &["bad.yaml:4:5: clusters[0].netwrk: unknown field `netwrk`, expected `name` or `network`"],
    ),
    (
        "missing required field",
        "clusters:\n  - name: east\n",
        &[
            "bad.yaml:2:5: clusters[0].network: expected a value for this required field, found none",
        ],
    ),
    (
        "wrong type",
        "clusters: [{name: east, network: n}]\nservices:\n  - name: s\n    ports: [{port: http, target_port: 80}]\n",
        &["bad.yaml:4:20: services[0].ports[0].port: invalid type: string \"http\", expected"],
    ),
    (
        "port out of range",
        "clusters: [{name: east, network: n}]\nservices:\n  - {name: s, ports: [{port: 70000, target_port: 80}]}\n",
        &[
            "services[0].ports[0].port: invalid value: integer `70000`, expected an integer from 0 to 65535",
        ],
    ),
    (
        "bad scope keyword",
        "clusters: [{name: east, network: n}]\nservices:\n  - {name: s, scope: globl}\n",
        &[
            "bad.yaml:3:22: services[0].scope: invalid value: string \"globl\", expected `global`, `local` or `{clusters:",
        ],
    ),
    (
        "syntax error",
        "clusters: [\n",
        &[
            "bad.yaml:2:1: clusters: expected well-formed YAML, found a syntax problem: did not find expected node content",
        ],
    ),
    (
        "no clusters at all",
        "",
        &["bad.yaml:1:1: clusters: expected a value for this required field, found none"],
    ),
    (
        "workload on an unknown node",
        "workloads:\n  - {name: sleep, node: east-9, address: 198.18.1.10}\n",
        &[
            "bad.yaml: workloads[0] (sleep).node: expected one of the nodes [east-1, west-1], found \"east-9\"",
        ],
    ),
    (
        "workload with neither node nor cluster",
        "workloads:\n  - {name: sleep}\n",
        &[
            "workloads[0] (sleep): expected `node` (or `cluster`, for a workload outside any node proxy), found neither",
        ],
    ),
    (
        "workload node and cluster disagree",
        "workloads:\n  - {name: sleep, node: east-1, cluster: west}\n",
        &[
            "workloads[0] (sleep).cluster: expected east (the cluster of node east-1), found \"west\"",
        ],
    ),
    (
        "unknown waypoint",
        "services:\n  - {name: echo, waypoint: nowhere}\n",
        &[
            "services[0] (echo).waypoint: expected the name of a waypoint in namespace \"default\" or <namespace>/<name> of one of the declared waypoints (there are none), found \"nowhere\"",
        ],
    ),
    (
        "gateway in an unknown cluster",
        "gateways:\n  - {name: gw, cluster: north, address: 198.18.255.1}\n",
        &["gateways[0] (gw).cluster: expected one of the clusters [east, west], found \"north\""],
    ),
    (
        "two gateways on one network",
        "gateways:\n  - {name: gw1, cluster: east, address: 198.18.255.1}\n  - {name: gw2, cluster: east, address: 198.18.255.2}\n",
        &[
            "gateways[1] (gw2): expected at most one east-west gateway per network, found a second one on network net-east (the first is gateways[0] (gw1))",
        ],
    ),
    (
        "port without a target",
        "services:\n  - name: echo\n    ports: [{port: 80}]\n",
        &[
            "services[0] (echo).ports[0].target_port: expected the port the endpoints listen on, found none",
        ],
    ),
    (
        "port zero",
        "services:\n  - {name: echo, ports: [{port: 0, target_port: 8080}, {port: 80, target_port: 0}]}\n",
        &[
            "services[0] (echo).ports[0].port: expected a port from 1 to 65535, found 0",
            "services[0] (echo).ports[1].target_port: expected a target port from 1 to 65535, found 0",
        ],
    ),
    (
        "scope with an empty cluster list",
        "services:\n  - {name: echo, scope: {clusters: []}}\n",
        &["services[0] (echo).scope.clusters: expected at least one cluster, found an empty list"],
    ),
    (
        "scope with an unknown cluster",
        "services:\n  - {name: echo, scope: {clusters: [east, north]}}\n",
        &[
            "services[0] (echo).scope.clusters[1]: expected one of the clusters [east, west], found \"north\"",
        ],
    ),
    (
        "selector_clusters with an unknown cluster",
        "services:\n  - {name: echo, selector: {app: echo}, selector_clusters: [east, north]}\n",
        &[
            "services[0] (echo).selector_clusters[1]: expected one of the clusters [east, west], found \"north\"",
        ],
    ),
    (
        "scope_by_cluster with an unknown cluster",
        "services:\n  - {name: echo, scope_by_cluster: {north: global}}\n",
        &[
            "services[0] (echo).scope_by_cluster.north: expected a key that is one of the clusters [east, west], found \"north\"",
        ],
    ),
    (
        "bad CIDR",
        "policies:\n  - name: p\n    rules: [{from: [{ip_blocks: [198.18.0.0/33, 10.0.0.0/8, banana]}]}]\n",
        &[
            "policies[0] (p).rules[0].from[0].ip_blocks[0]: expected an IP address or CIDR block such as 198.18.0.0/15, found \"198.18.0.0/33\"",
            "policies[0] (p).rules[0].from[0].ip_blocks[2]: expected an IP address or CIDR block such as 198.18.0.0/15, found \"banana\"",
        ],
    ),
    (
        "bad IP address",
        "workloads:\n  - {name: sleep, node: east-1, addresses: [198.18.1.10, 198.18.1.999]}\n",
        &[
            "workloads[0] (sleep).addresses[1]: expected an IP address such as 198.18.0.1, found \"198.18.1.999\"",
        ],
    ),
    (
        "service uses a waypoint that only serves workloads",
        "waypoints:\n  - {name: wp, for: workload}\nservices:\n  - {name: echo, waypoint: wp}\n",
        &[
            "services[0] (echo).waypoint: expected a waypoint that serves services (`for: service` or `for: all`), found \"wp\", which is `for: workload` (waypoints[0] (wp))",
        ],
    ),
    (
        "workload uses a waypoint that only serves services",
        "waypoints:\n  - {name: wp}\nworkloads:\n  - {name: db, node: east-1, waypoint: default/wp}\n",
        &[
            "workloads[0] (db).waypoint: expected a waypoint that serves workloads (`for: workload` or `for: all`), found \"default/wp\", which is `for: service`",
        ],
    ),
    (
        "duplicate address on one network",
        "services:\n  - {name: echo, vips: [{network: net-east, address: 198.18.10.1}]}\nworkloads:\n  - {name: sleep, node: east-1, address: 198.18.10.1}\n",
        &[
            "workloads[0] (sleep).address: expected an address not used elsewhere on network net-east, found 198.18.10.1, already used by services[0] (echo)",
        ],
    ),
    (
        "duplicate address between a waypoint instance and a gateway",
        "gateways:\n  - {name: gw, cluster: east, address: 198.18.255.1}\nwaypoints:\n  - name: wp\n    instances: [{name: wp-1, node: east-1, address: 198.18.255.1}]\n",
        &[
            "waypoints[0] (wp).instances[0] (wp-1).address: expected an address not used elsewhere on network net-east, found 198.18.255.1, already used by gateways[0] (gw)",
        ],
    ),
    (
        "duplicate names",
        "  - {name: east, network: other}\nnodes:\n  - {name: east-1, cluster: west}\n",
        &[
            "clusters[2] (east): expected a unique cluster name, found \"east\" again (first declared at clusters[0] (east))",
        ],
    ),
    (
        "duplicate services and workloads",
        "services:\n  - {name: echo}\n  - {name: other, hostname: echo.default.svc.cluster.local}\nworkloads:\n  - {name: a, node: east-1}\n  - {name: a, node: east-1}\n",
        &[
            "services[1] (other): expected a unique service namespace/hostname, found \"default/echo.default.svc.cluster.local\" again (first declared at services[0] (echo))",
            "workloads[1] (a): expected a unique namespace/name in cluster east, found \"default/a\" again (first declared at workloads[0] (a))",
        ],
    ),
    (
        "bad identity parts",
        "workloads:\n  - {name: a, node: east-1, namespace: \"my ns\", service_account: \"a/b\"}\n",
        &[
            "workloads[0] (a).namespace: expected a valid namespace for a SPIFFE identity, found \"my ns\"",
            "workloads[0] (a).service_account: expected a valid service account for a SPIFFE identity, found \"a/b\"",
        ],
    ),
    (
        "waypoint instance addresses",
        "waypoints:\n  - name: wp\n    instances:\n      - {name: a, node: east-1, address: 198.18.1.5, addresses: [198.18.1.6]}\n      - {name: b, node: east-1}\n      - {name: c, node: east-1, addresses: [198.18.1.7, \"2001:2::1:zz\"]}\n",
        &[
            "waypoints[0] (wp).instances[0] (a): expected either `address` or `addresses`, found both",
            "waypoints[0] (wp).instances[1] (b): expected `address` or `addresses`, found neither",
            "waypoints[0] (wp).instances[2] (c).addresses[1]: expected an IP address such as 198.18.0.1, found \"2001:2::1:zz\"",
        ],
    ),
    (
        "policy selector problems",
        "policies:\n  - {name: p1, selector: {}}\n  - {name: p2, mesh: true, selector: {app: x}}\n",
        &[
            "policies[0] (p1).selector: expected at least one label, found an empty map",
            "policies[1] (p2): expected at most one of `mesh: true` and `selector`, found both",
        ],
    ),
    (
        "HTTP route problems",
        "waypoints:\n  - {name: wp}\nservices:\n  - name: shop\n    ports: [{port: 80, target_port: 8080}]\n    waypoint: wp\n    routes:\n      - name: r\n        match: [{path: /a, path_prefix: /b}, {path_prefix: v2}]\n        backends: [{service: nowhere}, {service: shop, port: 81, weight: 0}]\n      - name: r\n        backends: []\n        retries: 11\n  - name: plain\n    routes: [{name: x, backends: [{service: shop}]}]\n",
        &[
            "services[0] (shop).routes[0] (r).match[0]: expected one of `path` and `path_prefix`, found both",
            "services[0] (shop).routes[0] (r).match[1].path_prefix: expected a path starting with /, found \"v2\"",
            "services[0] (shop).routes[0] (r).backends[0].service: expected one of the services [default/shop, default/plain], found \"nowhere\"",
            "services[0] (shop).routes[0] (r).backends[1].port: expected a port of shop ([80]), found 81",
            "services[0] (shop).routes[1] (r).name: expected a unique, non-empty route name, found \"r\"",
            "services[0] (shop).routes[1] (r).backends: expected at least one backend, found none",
            "services[0] (shop).routes[1] (r).retries: expected at most 10 retries, found 11",
            "services[1] (plain).routes: expected a `waypoint` on the service (its waypoint applies the routes), found none",
        ],
    ),
    (
        "HTTP route method, query and header edit problems",
        "waypoints:\n  - {name: wp}\nservices:\n  - name: shop\n    ports: [{port: 80, target_port: 8080}]\n    waypoint: wp\n    routes:\n      - name: r\n        match: [{method: get, query: {'': x}}]\n        backends: [{service: shop}]\n        request_headers: {set: {Host: evil}}\n        response_headers: {remove: [x-a, ':status']}\n      - name: s\n        backends: [{service: shop}]\n        request_headers: {add: {x-a: \"a\\r\\nb\"}}\n        response_headers: {set: {transfer-encoding: chunked}}\n",
        &[
            "services[0] (shop).routes[0] (r).match[0].method: expected one of GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH, found \"get\"",
            "services[0] (shop).routes[0] (r).match[0].query: expected a parameter name, found \"\"",
            "services[0] (shop).routes[0] (r).request_headers.set[0].name: expected a header a route may edit, found \"host\"",
            "services[0] (shop).routes[0] (r).response_headers.remove[1]: expected a header name, found the pseudo-header \":status\"",
            "services[0] (shop).routes[1] (s).request_headers.add[0].value: expected a valid header value",
            "services[0] (shop).routes[1] (s).response_headers.set[0].name: expected a header a route may edit, found \"transfer-encoding\"",
        ],
    ),
    (
        "graduated failover minimums",
        "services:\n  - {name: a, load_balancing: {mode: standard, min_healthy: 2}}\n  - {name: b, load_balancing: {mode: failover, prefer: [zone], min_healthy: 0}}\n  - {name: c, load_balancing: {mode: failover, min_healthy: \"120%\"}}\n  - {name: d, load_balancing: {mode: failover, min_healthy: lots}}\n",
        &[
            "services[0] (a).load_balancing.min_healthy: expected `mode: failover` for a graduated minimum, found mode standard",
            "services[1] (b).load_balancing.min_healthy: expected a failover minimum of at least 1 endpoint, found 0",
            "services[2] (c).load_balancing.min_healthy: expected a failover minimum of 1 to 100 percent, found 120%",
            "services[3] (d).load_balancing.min_healthy: expected a count of endpoints or a percentage like \"60%\", found \"lots\"",
        ],
    ),
    (
        "peer authentication problems",
        "policies:\n  - {name: istio_converted_static_strict, namespace: istio-system, action: deny, rules: [{}]}\npeer_authentication:\n  - {name: a, mesh: true, namespace: other, mode: strict}\n  - {name: b, mesh: true, selector: {app: x}}\n  - {name: c, selector: {}}\n  - {name: d, namespace: istio-system, selector: {app: x}}\n  - {name: e, mode: strict}\n  - {name: f, mode: permissive}\n  - {name: g, namespace: other2, port_level_mtls: {9090: strict}}\n  - {name: h, selector: {app: x}, port_level_mtls: {0: strict}}\n  - {name: e, selector: {app: y}}\n",
        &[
            "peer_authentication[0] (a).namespace: expected the root namespace \"istio-system\" (or none) with `mesh: true`, found \"other\"",
            "peer_authentication[1] (b): expected at most one of `mesh: true` and `selector`, found both",
            "peer_authentication[2] (c).selector: expected at least one label, found an empty map",
            "peer_authentication[3] (d).selector: expected no selector in the root namespace \"istio-system\"",
            "peer_authentication[5] (f): expected one peer authentication without selector per namespace, found another in \"default\" (first at peer_authentication[4] (e))",
            "peer_authentication[6] (g).port_level_mtls: expected port-level modes only with a `selector`",
            "peer_authentication[7] (h).port_level_mtls.0: expected a port from 1 to 65535, found 0",
            "peer_authentication[8] (e): expected a unique peer authentication namespace/name, found \"default/e\" again (first declared at peer_authentication[4] (e))",
            "peer_authentication: expected a unique policy namespace/name (one derived from peer authentications), found \"istio-system/istio_converted_static_strict\" again (first declared at policies[0] (istio_converted_static_strict))",
        ],
    ),
    (
        "named target ports and services a workload backs by name",
        "services:\n  - name: web\n    ports: [{port: 80, target_port: 8080, target_port_name: http}, {port: 81, target_port_name: \"\"}, {port: 82, target_port_name: http}]\nworkloads:\n  - {name: a, node: east-1, address: 198.18.1.1, services: {nowhere: {80: 8080}, web: {83: 8080, 82: 0}}}\n",
        &[
            "services[0] (web).ports[0].target_port_name: expected either `target_port` or `target_port_name`, found both",
            "services[0] (web).ports[1].target_port_name: expected a port name, found \"\"",
            "workloads[0] (a).services.nowhere: expected a service (name or hostname) of namespace default, found \"nowhere\"",
            "workloads[0] (a).services.web.82: expected a target port from 1 to 65535, found 0",
            "workloads[0] (a).services.web.83: expected a key that is one of the service's ports [82], found 83",
        ],
    ),
    (
        "a bad root namespace",
        "root_namespace: Bad/NS\npeer_authentication: [{name: a, mesh: true, mode: strict}]\n",
        &[
            "root_namespace: expected a valid namespace for a SPIFFE identity, found \"Bad/NS\"",
            "peer_authentication[0] (a).namespace: expected a valid namespace",
        ],
    ),
    (
        "several errors at once",
        "gateways:\n  - {name: gw, cluster: north, address: 198.18.255.1}\nservices:\n  - name: echo\n    ports: [{port: 80}]\n    scope: {clusters: []}\n    waypoint: nowhere\nworkloads:\n  - {name: sleep, node: east-9}\n",
        &[
            "gateways[0] (gw).cluster: expected one of the clusters",
            "services[0] (echo).ports[0].target_port: expected the port the endpoints listen on, found none",
            "services[0] (echo).scope.clusters: expected at least one cluster, found an empty list",
            "services[0] (echo).waypoint: expected the name of a waypoint",
            "workloads[0] (sleep).node: expected one of the nodes [east-1, west-1], found \"east-9\"",
        ],
    ),
];

#[test]
fn bad_documents_are_rejected_with_located_problems() {
    for (name, doc, expected) in CASES {
        // Semantic cases extend the base mesh; syntax cases (which define clusters) stand alone.
        let doc = if doc.is_empty() || doc.starts_with("clusters") {
            (*doc).to_string()
        } else if doc.starts_with("  - ") {
            format!("{}{doc}", BASE.split("nodes:").next().unwrap_or_default())
        } else {
            format!("{BASE}{doc}")
        };
        let err = reject(&doc);
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines.is_empty(), "{name}: no problem reported");
        let mut from = 0;
        for want in *expected {
            let found = lines.iter().skip(from).position(|l| l.contains(want));
            let Some(i) = found else {
                panic!(
                    "{name}: expected a line containing\n  {want}\nafter line {from} of:\n{text}"
                );
            };
            from += i + 1;
        }
        assert_eq!(
            lines.len(),
            err.problems.len(),
            "{name}: one line per problem"
        );
        // Every message says what it expected and what it found.
        for p in &err.problems {
            assert!(
                p.message.contains("expected")
                    && (p.message.contains("found")
                        || p.message.contains("invalid")
                        || p.message.contains("unknown field")),
                "{name}: message without expected/found: {}",
                p.message
            );
        }
    }
}

#[test]
fn syntax_errors_carry_a_location_and_semantic_errors_a_path() {
    let err = reject("clusters:\n  - {name: east, network: n, color: red}\n");
    assert_eq!(err.file, "bad.yaml");
    assert_eq!(err.problems.len(), 1);
    assert_eq!(
        err.problems[0].location,
        Some(Location {
            line: 2,
            column: 30
        })
    );
    assert_eq!(err.problems[0].path, "clusters[0].color");

    let err = reject(&format!(
        "{BASE}workloads:\n  - {{name: sleep, node: east-9}}\n"
    ));
    assert_eq!(err.problems[0].location, None);
    assert_eq!(err.problems[0].path, "workloads[0] (sleep).node");
}

#[test]
fn same_address_on_two_networks_is_fine() {
    accept(&format!(
        "{BASE}services:
  - name: echo
    vips: [{{network: net-east, address: 198.18.10.1}}, {{network: net-west, address: 198.18.10.1}}]
workloads:
  - {{name: a, node: east-1, address: 198.18.1.10}}
  - {{name: b, node: west-1, address: 198.18.1.10}}
"
    ));
}

#[test]
fn same_workload_name_in_two_clusters_is_fine() {
    accept(&format!(
        "{BASE}workloads:
  - {{name: sleep, node: east-1}}
  - {{name: sleep, node: west-1}}
  - {{name: sleep, namespace: other, node: west-1}}
"
    ));
}

#[test]
fn selector_policy_matching_nothing_is_fine() {
    accept(&format!(
        "{BASE}policies:\n  - {{name: p, selector: {{app: nobody}}, rules: [{{}}]}}\n"
    ));
}

#[test]
fn missing_file_is_a_topology_error() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("no-such-topology.yaml");
    let err = ferry_topology::load_file(&path).expect_err("a missing file is an error");
    assert_eq!(err.file, path.display().to_string());
    let text = err.to_string();
    assert!(
        text.contains("expected a readable UTF-8 topology file, found an error"),
        "{text}"
    );
}

#[test]
fn terminating_wins_over_healthy() {
    use ferry_core::model::Health;
    let doc = format!(
        "{BASE}workloads:
  - {{name: a, node: east-1, address: 198.18.1.10}}
  - {{name: b, node: east-1, address: 198.18.1.11, healthy: false}}
  - {{name: c, node: east-1, address: 198.18.1.12, terminating: true}}
  - {{name: d, node: east-1, address: 198.18.1.13, healthy: false, terminating: true}}
"
    );
    let snap = parse("good.yaml", &doc).unwrap().snapshot;
    let health = |n: &str| snap.workloads().find(|w| w.name == n).unwrap().health;
    assert_eq!(health("a"), Health::Healthy);
    assert_eq!(health("b"), Health::Unhealthy);
    assert_eq!(health("c"), Health::Terminating);
    assert_eq!(health("d"), Health::Terminating);
}

#[test]
fn graduated_failover_minimums_are_read() {
    use ferry_core::model::FailoverMinimum;
    let t = parse(
        "good.yaml",
        &format!(
            "{BASE}services:\n  - {{name: a, load_balancing: {{mode: failover, prefer: [zone], min_healthy: 2}}}}\n  - {{name: b, load_balancing: {{mode: failover, min_healthy: \"60%\"}}}}\n  - {{name: c, load_balancing: {{mode: failover}}}}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let min = |name: &str| {
        t.snapshot
            .services()
            .find(|s| s.name == name)
            .and_then(|s| s.load_balancing.as_ref())
            .and_then(|lb| lb.failover_minimum)
    };
    assert_eq!(min("a"), Some(FailoverMinimum::Endpoints(2)));
    assert_eq!(min("b"), Some(FailoverMinimum::Percent(60)));
    assert_eq!(min("c"), None);
}

#[test]
fn peer_authentication_keys_come_after_the_workloads_own_policies() {
    let t = parse(
        "good.yaml",
        &format!(
            "{BASE}workloads:\n  - {{name: a, node: east-1, address: 198.18.1.1, labels: {{app: a}}}}\n  - {{name: b, node: east-1, address: 198.18.1.2, labels: {{app: b}}}}\npolicies:\n  - {{name: p, selector: {{app: a}}, rules: [{{}}]}}\npeer_authentication:\n  - {{name: default, mode: strict}}\n  - {{name: b-open, selector: {{app: b}}, mode: permissive, port_level_mtls: {{\"8080\": strict}}}}\n  - {{name: mesh, mesh: true, mode: permissive}}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let listed = |name: &str| {
        t.snapshot
            .workloads()
            .find(|w| w.name == name)
            .unwrap()
            .authorization_policies
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed("a"),
        ["default/p", "istio-system/istio_converted_static_strict"]
    );
    assert_eq!(
        listed("b"),
        ["default/converted_peer_authentication_b-open"]
    );
}

#[test]
fn route_methods_queries_and_header_edits_reach_the_model() {
    use ferry_core::model::{HeaderModifier, ServiceKey};
    let t = parse(
        "good.yaml",
        &format!(
            "{BASE}waypoints:
  - {{name: wp}}
services:
  - name: shop
    ports: [{{port: 80, target_port: 8080}}]
    waypoint: wp
    routes:
      - name: r
        match: [{{method: POST, path_prefix: /orders, query: {{v: '2', q: a b}}}}]
        backends: [{{service: shop}}]
        request_headers: {{set: {{X-Env: prod}}, add: {{x-hop: wp}}, remove: [X-Debug]}}
        response_headers: {{add: {{x-served-by: wp}}}}
"
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shop = t
        .snapshot
        .service(&ServiceKey::new(
            "default",
            "shop.default.svc.cluster.local",
        ))
        .expect("shop");
    let r = &shop.http_routes[0];
    assert_eq!(r.matches[0].method.as_deref(), Some("POST"));
    assert_eq!(
        r.matches[0].query,
        [
            ("q".to_string(), "a b".to_string()),
            ("v".into(), "2".into())
        ]
    );
    assert_eq!(
        *r.request_headers,
        HeaderModifier {
            set: vec![("x-env".into(), "prod".into())],
            add: vec![("x-hop".into(), "wp".into())],
            remove: vec!["x-debug".into()],
        }
    );
    assert_eq!(
        r.response_headers.add,
        [("x-served-by".to_string(), "wp".to_string())]
    );
}

#[test]
fn a_route_s_redirect_reaches_the_model_and_bad_ones_are_refused_naming_the_field() {
    use ferry_core::model::{RedirectPath, RedirectScheme, RequestRedirect, ServiceKey};
    let doc = |routes: &str| {
        format!(
            "{BASE}waypoints:\n  - {{name: wp}}\nservices:\n  - name: shop\n    ports: [{{port: 80, target_port: 8080}}]\n    waypoint: wp\n    routes:\n{routes}"
        )
    };
    let t = parse(
        "good.yaml",
        &doc("      - {name: r, match: [{path_prefix: /old}], redirect: {scheme: https, hostname: New.Example, replace_prefix_match: /new, status: 301}}\n      - {name: d, redirect: {}}\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shop = t
        .snapshot
        .service(&ServiceKey::new(
            "default",
            "shop.default.svc.cluster.local",
        ))
        .expect("shop");
    assert!(shop.http_routes[0].backends.is_empty());
    assert_eq!(
        shop.http_routes[0].redirect.as_deref(),
        Some(&RequestRedirect {
            scheme: Some(RedirectScheme::Https),
            hostname: Some("new.example".into()),
            port: None,
            path: Some(RedirectPath::PrefixMatch("/new".into())),
            status: 301,
        })
    );
    assert_eq!(
        shop.http_routes[1].redirect.as_deref(),
        Some(&RequestRedirect::default())
    );
    for (route, want) in [
        (
            "{name: r, redirect: {status: 307}}",
            "routes[0] (r).redirect.status: expected 301 or 302, found 307",
        ),
        (
            "{name: r, redirect: {scheme: HTTPS}}",
            "routes[0] (r).redirect.scheme: expected http or https, found \"HTTPS\"",
        ),
        (
            "{name: r, redirect: {hostname: \"a\\r\\nb\"}}",
            "routes[0] (r).redirect.hostname: expected a DNS name",
        ),
        (
            "{name: r, redirect: {hostname: \"*.example\"}}",
            "routes[0] (r).redirect.hostname: expected a DNS name",
        ),
        (
            "{name: r, redirect: {port: 0}}",
            "routes[0] (r).redirect.port: expected a port from 1 to 65535, found 0",
        ),
        (
            "{name: r, redirect: {replace_full_path: rel}}",
            "routes[0] (r).redirect.replace_full_path: expected a path starting with one '/'",
        ),
        (
            "{name: r, redirect: {replace_full_path: \"/a\\nb\"}}",
            "routes[0] (r).redirect.replace_full_path: expected a path starting with one '/'",
        ),
        (
            "{name: r, match: [{path: /a}], redirect: {replace_prefix_match: /b}}",
            "routes[0] (r).redirect.replace_prefix_match: expected only path prefix matches, found an exact path in matches[0]",
        ),
        (
            "{name: r, redirect: {replace_full_path: /a, replace_prefix_match: /b}}",
            "routes[0] (r).redirect: expected one of `replace_full_path` and `replace_prefix_match`, found both",
        ),
        (
            "{name: r, redirect: {}, backends: [{service: shop}]}",
            "routes[0] (r).backends: expected no backends on a route with a redirect",
        ),
    ] {
        let e = parse("bad.yaml", &doc(&format!("      - {route}\n")))
            .err()
            .unwrap_or_else(|| panic!("accepted {route}"))
            .to_string();
        assert!(e.contains(want), "{route}: {e}");
    }
}
