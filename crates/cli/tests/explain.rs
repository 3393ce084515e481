//! Runs the built `ferry` binary the way a user does.

use std::path::PathBuf;
use std::process::{Command, Output};

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .output()
        .expect("ferry runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
        .display()
        .to_string()
}

/// A topology file written for one test, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ferry-cli-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write temp topology");
        Self(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_tour_runs_on_the_built_in_example() {
    let o = ferry(&["explain"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.matches("\nresult      CONNECTED").count(), 7, "{out}");
    // The local service from east never picks west's waypoint or pod.
    assert!(out.contains("drop waypoint endpoint west//v1/Pod/default/shared-waypoint-west-1 (cluster west): scope of default/ledger.default.svc.cluster.local is local"), "{out}");
    assert!(
        out.contains("CONNECTED to east//v1/Pod/default/ledger-east-1 via waypoint"),
        "{out}"
    );
    // The nested address resolves in one decision.
    assert!(out.contains("nested     endpoint 198.18.10.3:80"), "{out}");
    assert!(
        out.contains("CONNECTED to east//v1/Pod/default/catalog-east-1\n"),
        "{out}"
    );
    // Cross-network goes through the gateway by hostname.
    assert!(
        out.contains("double HBONE: outer tunnel to east-west gateway 198.19.255.1:15008"),
        "{out}"
    );
}

#[test]
fn one_connection_as_json() {
    let o = ferry(&[
        "explain",
        "--from",
        "west/default/sleep-west",
        "--to",
        "ledger.default.svc.cluster.local:80",
        "--output",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    let hops = v["hops"].as_array().expect("hops");
    assert_eq!(hops.len(), 2, "source node proxy, then the waypoint");
    assert_eq!(
        hops[1]["decision"]["outcome"]["Ok"]["landing"],
        "west//v1/Pod/default/ledger-west-1"
    );
    assert_eq!(hops[1]["authorization"]["kind"], "checked");
}

/// A source that backs services (a map keyed by service) is JSON too.
#[test]
fn a_service_member_source_as_json() {
    let lab = example("lab.yaml");
    let o = ferry(&[
        "explain",
        "-t",
        &lab,
        "--from",
        "echo-beta",
        "--to",
        "198.18.10.5:80",
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    assert!(
        v["source"]["workload"]["services"]["default/echo.default.svc.cluster.local"].is_array(),
        "{v}"
    );
}

#[test]
fn source_by_ip_and_explicit_topology() {
    let o = ferry(&[
        "explain",
        "-t",
        &example("single-cluster.yaml"),
        "--from",
        "198.18.1.10",
        "--to",
        "198.18.9.9:80",
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("outside the mesh"), "{}", stdout(&o));
}

#[test]
fn unknown_source_or_destination_exits_2_with_a_clear_message() {
    let o = ferry(&["explain", "--from", "nobody", "--to", "198.18.10.1:80"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("source \"nobody\": no such workload"),
        "{}",
        stderr(&o)
    );
    let o = ferry(&["explain", "--from", "sleep-east", "--to", "nope.example:80"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no service has hostname \"nope.example\""),
        "{}",
        stderr(&o)
    );
    let o = ferry(&["explain", "--from", "sleep-east", "--to", "198.18.10.1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("expected IP:port or hostname:port"),
        "{}",
        stderr(&o)
    );
    let o = ferry(&["explain", "--from", "sleep", "--to", "198.18.10.1:80"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "sleep is not a workload name in the example"
    );
}

#[test]
fn ambiguous_source_lists_the_candidates() {
    let o = ferry(&[
        "explain",
        "--from",
        "default/shared-waypoint-east-1",
        "--to",
        "198.18.10.1:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = TempFile::new(
        "ambiguous.yaml",
        "clusters: [{name: a, network: n1}, {name: b, network: n2}]\n\
         nodes: [{name: a1, cluster: a}, {name: b1, cluster: b}]\n\
         workloads:\n  - {name: app, node: a1, address: 198.18.1.1}\n  - {name: app, node: b1, address: 198.18.1.1}\n",
    );
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "198.18.1.1",
        "--to",
        "198.18.9.9:80",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is ambiguous: a/default/app on n1, b/default/app on n2"),
        "{}",
        stderr(&o)
    );
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "n2/198.18.1.1",
        "--to",
        "198.18.9.9:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn refused_connections_exit_3_and_say_why() {
    let t = TempFile::new(
        "refused.yaml",
        "clusters: [{name: a, network: n}, {name: b, network: n}]\n\
         nodes: [{name: a1, cluster: a}, {name: b1, cluster: b}]\n\
         services:\n  - {name: ledger, vips: [{network: n, address: 198.18.10.1}], ports: [{port: 80, target_port: 8080}], selector: {app: ledger}, scope: local}\n  - {name: open, vips: [{network: n, address: 198.18.10.2}], ports: [{port: 80, target_port: 8080}], selector: {app: open}, scope: global}\n\
         workloads:\n  - {name: client, node: a1, address: 198.18.1.1}\n  - {name: ledger-b, node: b1, address: 198.18.2.1, labels: {app: ledger}}\n  - {name: open-b, node: b1, address: 198.18.2.2, labels: {app: open}}\n\
         policies:\n  - {name: only-admin, selector: {app: open}, action: allow, rules: [{from: [{principals: [cluster.local/ns/default/sa/admin]}]}]}\n",
    );
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "client",
        "--to",
        "198.18.10.1:80",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("scope of default/ledger.default.svc.cluster.local is local (only its own cluster); the source is in cluster a"), "{out}");
    assert!(out.contains("REFUSED at the source node proxy"), "{out}");
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "client",
        "--to",
        "198.18.10.2:80",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("denied: 1 ALLOW policies apply and none matches"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_bad_topology_is_reported_with_its_location() {
    let t = TempFile::new("bad.yaml", "clusters:\n  - {name: a, netwrk: n}\n");
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "x",
        "--to",
        "198.18.1.1:80",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("bad.yaml:2:") && e.contains("netwrk"), "{e}");
}

#[test]
fn the_waypoint_hop_lists_the_http_routes_it_applies() {
    let o = ferry(&[
        "explain",
        "-t",
        &example("lab.yaml"),
        "--from",
        "sleep",
        "--to",
        "198.18.10.6:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("canary: x-canary: yes -> 100% shop.default.svc.cluster.local {version=v2}"),
        "{out}"
    );
    assert!(
        out.contains("split: every request -> 75% shop.default.svc.cluster.local {version=v1}, 25% shop.default.svc.cluster.local {version=v2}, timeout 5000 ms, 2 retries"),
        "{out}"
    );
    let o = ferry(&[
        "explain",
        "-t",
        &example("lab.yaml"),
        "--from",
        "sleep",
        "--to",
        "198.18.10.6:80",
        "--output",
        "json",
    ]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        json["hops"][1]["http_routes"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
}

#[test]
fn the_waypoint_hop_shows_method_query_matches_and_header_edits() {
    let lab = std::fs::read_to_string(example("lab.yaml")).expect("lab.yaml");
    let canary = "match: [{headers: {x-canary: \"yes\"}}]";
    let edits = "response_headers: {set: {x-route: canary}}";
    assert!(
        lab.contains(canary) && lab.contains(edits),
        "lab.yaml's canary route moved"
    );
    let edited = lab
        .replace(
            canary,
            "match: [{method: GET, headers: {x-canary: \"yes\"}, query: {v: '2'}}]\n        request_headers: {remove: [x-debug], set: {x-env: prod}, add: {x-hop: wp}}",
        )
        .replace(
            edits,
            "response_headers: {remove: [server], set: {x-route: canary}}",
        );
    let t = TempFile::new("route-filters.yaml", &edited);
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "sleep",
        "--to",
        "198.18.10.6:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("canary: method GET and x-canary: yes and query v=\"2\" -> 100% shop.default.svc.cluster.local {version=v2}, request headers: remove x-debug, set x-env: prod, add x-hop: wp, response headers: remove server, set x-route: canary"),
        "{out}"
    );
}

#[test]
fn a_terminating_endpoint_is_dropped_as_terminating() {
    let t = TempFile::new(
        "terminating.yaml",
        "clusters: [{name: a, network: n}]\n\
         nodes: [{name: a1, cluster: a}, {name: a2, cluster: a}]\n\
         services:\n  - {name: echo, vips: [{network: n, address: 198.18.10.1}], ports: [{port: 80, target_port: 8080}], selector: {app: echo}}\n\
         workloads:\n  - {name: client, node: a1, address: 198.18.1.1}\n  - {name: echo-1, node: a1, address: 198.18.1.2, labels: {app: echo}, terminating: true}\n  - {name: echo-2, node: a2, address: 198.18.2.2, labels: {app: echo}}\n",
    );
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "client",
        "--to",
        "198.18.10.1:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("drop endpoint a//v1/Pod/default/echo-1 (cluster a): terminating"),
        "{out}"
    );
    assert!(
        out.contains("CONNECTED to a//v1/Pod/default/echo-2"),
        "{out}"
    );
}

#[test]
fn explain_on_the_lab_needs_a_running_lab_and_from_to_and_no_topology() {
    let no_lab = std::env::temp_dir().join(format!("ferry-cli-{}-no-lab", std::process::id()));
    let dir = no_lab.to_str().expect("utf-8 path");
    let o = ferry(&[
        "explain",
        "--lab",
        "--state-dir",
        dir,
        "--from",
        "sleep",
        "--to",
        "198.18.10.1:80",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains(&format!("no lab is up in {dir}")),
        "{}",
        stderr(&o)
    );
    let o = ferry(&["explain", "--lab", "--state-dir", dir]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--from and --to are required with --lab"),
        "{}",
        stderr(&o)
    );
    let o = ferry(&["explain", "--lab", "-t", &example("rollout.yaml")]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--lab and --topology exclude each other"
    );
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    let o = ferry(&["explain", "--state-dir", dir]);
    assert_eq!(o.status.code(), Some(2), "--state-dir goes with --lab");
}

#[test]
fn the_waypoint_hop_shows_a_route_s_redirect() {
    let lab = std::fs::read_to_string(example("lab.yaml")).expect("lab.yaml");
    let split = "      - name: split\n";
    assert!(lab.contains(split), "lab.yaml's split route moved");
    let edited = lab.replacen(
        split,
        "      - name: moved\n        match: [{path_prefix: /old}]\n        redirect: {scheme: https, hostname: new.example, port: 8443, replace_prefix_match: /new, status: 301}\n      - name: split\n",
        1,
    );
    let t = TempFile::new("route-redirect.yaml", &edited);
    let o = ferry(&[
        "explain",
        "-t",
        t.path(),
        "--from",
        "sleep",
        "--to",
        "198.18.10.6:80",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("moved: path /old/* -> redirect 301 (scheme https, hostname new.example, port 8443, matched prefix -> /new, the rest as requested, query kept; answered by the waypoint once authorized)"),
        "{out}"
    );
}
