//! Through a waypoint: L4, HTTP judged per request, pipelining, headers, not-HTTP bytes, routes,
//! the canary, request metrics, and around the waypoint.

use crate::harness::Has::{Field, Starts, Text};
use crate::harness::{CHANGING, MESH};

/// On [`CHANGING`], whose scenarios never send to beta: here beta must have seen nothing since
/// the lab came up, which [`MESH`] does not keep.
#[test]
fn a_local_service_whose_only_waypoint_endpoint_is_in_beta_is_refused_and_nothing_reaches_beta() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    // A local service whose only healthy waypoint endpoint is in beta: refused in alpha, and
    // nothing reaches beta.
    lab.send("sleep", "198.18.10.5:80", "x")
        .expect_err("no eligible waypoint endpoint");
    lab.log_line(
        "alpha-1",
        &[
            Field("dst.addr", "198.18.10.5:80"),
            Text("no waypoint endpoint is eligible for a source in cluster alpha"),
        ],
    );
    let beta = lab.metrics("beta-1", "198.19.254.12:15000");
    // A metrics answer (a TCP family appears with its first connection, and beta has none).
    assert!(
        beta.contains("# TYPE ferry_pods_served gauge"),
        "metrics answer: {beta}"
    );
    assert!(
        !beta.contains("audit-waypoint-beta"),
        "a connection reached beta's waypoint:\n{beta}"
    );
    assert!(
        !lab.log("beta-1").contains("198.18.10.5"),
        "beta saw the local service's traffic"
    );
}

/// legacy -> audit on 8080, through the waypoint process.
#[test]
fn plain_tcp_from_outside_the_mesh_goes_through_the_waypoint() {
    let Some(lab) = MESH.get() else { return };
    // From outside the mesh to a destination with a waypoint: through the waypoint process.
    let r = lab
        .send("legacy", "198.18.3.60:8080", "via the waypoint")
        .expect("through the waypoint");
    assert!(
        r.starts_with("audit-beta port 8080") && r.contains("via the waypoint"),
        "{r}"
    );
    lab.log_line(
        "beta-1",
        &[
            Field("dst.hbone_addr", "198.18.3.60:8080"),
            Starts("path", "plain tcp via waypoint default/audit-waypoint"),
        ],
    );
    let line = lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Field("direction", "waypoint"),
            Field("dst.addr", "198.18.3.60:8080"),
            Text("connection complete"),
        ],
    );
    // The waypoint serves the tunnel itself: it still counts the bytes both ways.
    assert!(
        !line.has(&Field("bytes_sent", "0")) && !line.has(&Field("bytes_recv", "0")),
        "the waypoint logged no bytes for a connection that carried some: {line:?}"
    );
}

/// legacy -> audit on 8081: a read passes, a write under /admin is refused.
#[test]
fn http_through_the_waypoint_is_judged_per_request_and_a_denied_write_never_reaches_the_pod() {
    let Some(lab) = MESH.get() else { return };
    // HTTP through the same waypoint is judged request by request: a read passes, a write
    // under /admin is refused with 403 by the waypoint and never reaches the pod.
    let get = "GET /admin/report HTTP/1.1\r\nHost: audit\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("legacy", "198.18.3.60:8081", get)
        .expect("an allowed request");
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("audit-beta http GET /admin/report"),
        "{r}"
    );
    let post = "POST /admin/report HTTP/1.1\r\nHost: audit\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("legacy", "198.18.3.60:8081", post)
        .expect("an answer from the waypoint");
    assert!(
        r.starts_with("HTTP/1.1 403") && !r.contains("audit-beta http"),
        "{r}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint denied the request"),
            // Judged as what it is: unauthenticated, not as the pod its node relayed it for.
            Field(
                "src.identity",
                "(none: plain TCP relayed by spiffe://cluster.local/ns/default/sa/audit)",
            ),
            Field("http.method", "POST"),
            Field("http.path", "/admin/report"),
        ],
    );
}

/// echo-beta -> audit on 8081: three requests on one connection, then the request metrics.
#[test]
fn pipelined_requests_are_judged_one_by_one_and_counted_by_response_code() {
    let Some(lab) = MESH.get() else { return };
    // A mesh source to audit's HTTP port: through the waypoint, three pipelined requests on one
    // connection, each judged on its own; the waypoint logs the original source, the pod's node
    // proxy sees the waypoint.
    let three = "GET /admin/a HTTP/1.1\r\nHost: audit\r\n\r\nPOST /admin/b HTTP/1.1\r\nHost: audit\r\nContent-Length: 0\r\n\r\nGET /ok HTTP/1.1\r\nHost: audit\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("echo-beta", "198.18.10.5:81", three)
        .expect("one connection, three answers");
    let statuses: Vec<&str> = r
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(|l| &l[9..12])
        .collect();
    assert_eq!(statuses, ["200", "403", "200"], "{r}");
    assert!(
        r.contains("audit-beta http GET /admin/a") && r.contains("audit-beta http GET /ok"),
        "{r}"
    );
    assert!(
        !r.contains("audit-beta http POST"),
        "the denied request reached the pod: {r}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint denied the request"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/echo"),
            Field("http.path", "/admin/b"),
            Field("http.status", "403"),
            Field(
                "reason",
                "denied by policy default/deny-audit-admin-writes rule 0",
            ),
        ],
    );
    lab.log_line(
        "beta-1",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/audit-waypoint"),
            Field("dst.hbone_addr", "198.18.3.60:8081"),
            // The original source rides in the tunnel's metadata, for the log.
            Field("path", "hbone from waypoint spiffe://cluster.local/ns/default/sa/audit-waypoint for spiffe://cluster.local/ns/default/sa/echo"),
            Text("connection complete"),
        ],
    );

    // The waypoint's request metrics count the allowed and denied requests by response code,
    // labelled with the original source.
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    for code in ["200", "403"] {
        assert!(
            m.lines().any(|l| l.starts_with("istio_requests_total{")
                && l.contains(&format!("response_code=\"{code}\""))
                && l.contains("source_principal=\"spiffe://cluster.local/ns/default/sa/echo\"")),
            "no {code} line:\n{m}"
        );
    }
    assert!(
        m.contains("istio_request_duration_milliseconds_bucket{"),
        "{m}"
    );
}

/// echo-beta -> audit on 8081, not HTTP.
#[test]
fn bytes_that_are_not_http_on_an_http_port_are_judged_once_at_l4() {
    let Some(lab) = MESH.get() else { return };
    // Bytes that are not HTTP on that port: judged once at L4, where the DENY holds on its
    // port alone; nothing reaches the pod.
    let r = lab.send("echo-beta", "198.18.10.5:81", "not http at all\n");
    assert!(
        r.as_ref().map_or(true, |r| !r.contains("audit-beta")),
        "{r:?}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint denied a connection that is not HTTP"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/echo"),
            Field(
                "reason",
                "denied by policy default/deny-audit-admin-writes rule 0",
            ),
        ],
    );
}

/// A header match in a DENY rule.
#[test]
fn a_request_with_an_x_debug_header_is_refused() {
    let Some(lab) = MESH.get() else { return };
    // A header match: any request with `x-debug` is refused.
    let r = lab
        .send(
            "echo-beta",
            "198.18.10.5:81",
            "GET /ok HTTP/1.1\r\nX-Debug: 1\r\nConnection: close\r\n\r\n",
        )
        .expect("an answer from the waypoint");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint denied the request"),
            Field("http.path", "/ok"),
            Field(
                "reason",
                "denied by policy default/deny-audit-admin-writes rule 1",
            ),
        ],
    );
}

/// sleep -> shop: 400 requests on one connection, routed one by one.
#[test]
fn http_routes_split_requests_on_one_connection_75_25() {
    let Some(lab) = MESH.get() else { return };
    // HTTP routes at the waypoint: 400 requests on ONE connection from sleep (alpha) to shop,
    // each routed on its own, split 75/25 between the v1 and v2 subsets. Binomial standard
    // deviation 8.7 requests: v1 must get 260..=340 (about 4.6 deviations either side).
    let mut data = "GET /split HTTP/1.1\r\nHost: shop\r\n\r\n".repeat(399);
    data.push_str("GET /split HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n");
    let r = lab
        .send("sleep", "198.18.10.6:80", &data)
        .expect("400 answers on one connection");
    let v1 = r.matches("shop-v1 http GET /split").count();
    let v2 = r.matches("shop-v2 http GET /split").count();
    assert_eq!(v1 + v2, 400, "v1 {v1}, v2 {v2}:\n{r}");
    assert!((260..=340).contains(&v1), "v1 got {v1} of 400, v2 {v2}");
    // Each answer carries the route's response header edit (examples/lab.yaml), set by the
    // waypoint on the backend's response, over the mesh's xDS.
    let named = r
        .to_ascii_lowercase()
        .matches("\r\nx-route: split\r\n")
        .count();
    assert_eq!(named, 400, "answers naming their route:\n{r}");
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Field("http.route", "split"),
            Field("dst.workload", "beta//v1/Pod/default/shop-v1"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("http.status", "200"),
        ],
    );
}

/// sleep -> shop with `X-Canary`.
#[test]
fn the_canary_header_sends_every_request_to_v2() {
    let Some(lab) = MESH.get() else { return };
    // The canary route: a header sends every request to v2.
    let data = "GET /canary HTTP/1.1\r\nHost: shop\r\nX-Canary: yes\r\n\r\n".repeat(20)
        + "GET /canary HTTP/1.1\r\nHost: shop\r\nX-Canary: yes\r\nConnection: close\r\n\r\n";
    let r = lab
        .send("sleep", "198.18.10.6:80", &data)
        .expect("21 answers on one connection");
    assert_eq!(r.matches("shop-v2 http GET /canary").count(), 21, "{r}");
    let named = r
        .to_ascii_lowercase()
        .matches("\r\nx-route: canary\r\n")
        .count();
    assert_eq!(named, 21, "answers naming their route:\n{r}");
}

/// Fail closed where nobody judges the HTTP.
#[test]
fn straight_to_the_pod_around_the_waypoint_is_refused() {
    let Some(lab) = MESH.get() else { return };
    // Straight to the pod, around the waypoint: nobody judges the HTTP, so the DENY applies on
    // its port alone and the node proxy refuses the connection (fail closed).
    lab.send("echo-beta", "198.18.3.60:8081", "GET / HTTP/1.1\r\n\r\n")
        .expect_err("refused around the waypoint");
    lab.log_line(
        "beta-1",
        &[
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/echo"),
            Field("dst.hbone_addr", "198.18.3.60:8081"),
            Field(
                "error",
                "denied by policy default/deny-audit-admin-writes rule 0",
            ),
        ],
    );
}

/// `ferry trace`: echo-beta -> audit through beta's waypoint yields one record per hop (source
/// node proxy, waypoint, destination node proxy) with one trace id, printed in hop order; a
/// connection refused by scope at the source shows that hop and why.
#[test]
fn ferry_trace_prints_every_hop_joined_by_one_trace_id_and_the_hop_that_refused() {
    let Some(lab) = MESH.get() else { return };
    let (id, hops) = lab.traced_hops("echo-beta", "198.18.10.5:80");
    assert_eq!(
        hops,
        [
            "node/beta-1 outbound",
            "waypoint/audit-waypoint-beta waypoint",
            "node/beta-1 inbound",
        ],
    );
    // The same trace id is in each hop's access-log line.
    lab.log_line(
        "beta-1",
        &[Field("trace.id", &id), Field("direction", "inbound")],
    );

    let out = lab.trace("sleep", "198.18.10.5:80", "text");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("refused or failed"), "{text}");
    assert!(
        text.contains("node/alpha-1 outbound") && text.contains("flags=NoRoute"),
        "{text}"
    );
    assert!(
        text.contains("no waypoint endpoint is eligible for a source in cluster alpha"),
        "{text}"
    );
}

/// Each hop's record carries its decision in short and its phases: the source names the
/// waypoint and the transport, the waypoint its pick; a connection refused by scope names the
/// candidates the decision set aside and why.
#[test]
fn each_hop_records_its_decision_and_phases_and_a_scope_refusal_names_what_it_dropped() {
    let Some(lab) = MESH.get() else { return };
    let out = lab.trace("echo-beta", "198.18.10.5:80", "json");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let hops = v["hops"].as_array().expect("hops");
    let hop = |direction: &str| {
        hops.iter()
            .find(|h| h["direction"] == direction)
            .unwrap_or_else(|| panic!("no {direction} hop in {v}"))
    };
    let source = hop("outbound");
    let route = source["route"].as_str().unwrap_or_default();
    assert!(
        route.starts_with("service default/audit.default.svc.cluster.local:80")
            && route.contains("waypoint ")
            && route.contains("picked ")
            && route.contains("hbone to "),
        "{source}"
    );
    assert_eq!(source["src_cluster"], "beta", "{source}");
    assert_eq!(source["dst_cluster"], "beta", "{source}");
    for phase in ["decision_us", "connect_us", "first_byte_us"] {
        assert!(source[phase].as_u64().unwrap_or(0) > 0, "{phase}: {source}");
    }
    let d = source["decision_us"].as_u64().unwrap_or(0);
    let c = source["connect_us"].as_u64().unwrap_or(0);
    let f = source["first_byte_us"].as_u64().unwrap_or(0);
    assert!(d <= c && c <= f, "phases in order: {source}");
    let waypoint = hop("waypoint");
    let route = waypoint["route"].as_str().unwrap_or_default();
    assert!(
        route.contains("picked ") && route.contains("hbone to "),
        "{waypoint}"
    );
    assert_eq!(waypoint["src_cluster"], "beta", "{waypoint}");
    assert!(
        waypoint["connect_us"].as_u64().unwrap_or(0) > 0,
        "{waypoint}"
    );
    let dest = hop("inbound");
    assert_eq!(dest["src_cluster"], "beta", "the proven cluster: {dest}");
    assert!(dest["decision_us"].as_u64().unwrap_or(0) > 0, "{dest}");

    // Refused by scope at the source: its record names what was set aside and why.
    let out = lab.trace("sleep", "198.18.10.5:80", "json");
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let refused = &v["hops"][0];
    assert_eq!(refused["component"], "node/alpha-1", "{v}");
    let route = refused["route"].as_str().unwrap_or_default();
    assert!(
        route.contains("dropped ")
            && route.contains("(out of scope of ")
            && route.contains("source cluster alpha"),
        "{refused}"
    );
}
