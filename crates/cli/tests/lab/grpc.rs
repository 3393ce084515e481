//! gRPC through a waypoint: audit's port 82 is named `grpc`, so its waypoint speaks HTTP/2 to
//! the pods, and a call's status and trailers come back intact.

use crate::harness::Has::{Field, Text};
use crate::harness::MESH;

/// echo-beta -> audit VIP:82 (`grpc`) through audit-waypoint-beta, to audit-beta's
/// grpc.health.v1 server (HTTP/2 only).
#[test]
fn a_grpc_call_through_the_waypoint_returns_its_status_and_trailers() {
    let Some(lab) = MESH.get() else { return };
    // A known service: SERVING, with grpc-status 0 in the trailers (the client fails a call
    // whose trailers lack it).
    let out = lab.output(&["grpc", "echo-beta", "198.18.10.5:82"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "grpc-status: 0 (OK)",
        "serving: SERVING",
        "metadata grpc-status: 0",
        "metadata content-type: application/grpc",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    // An unknown one: NOT_FOUND and its message, in a trailers-only answer.
    let out = lab.output(&["grpc", "echo-beta", "198.18.10.5:82", "no.such.Service"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in [
        "grpc-status: 5 (NotFound)",
        "grpc-message: service not registered",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    // The waypoint judged each call as a request and sent it on as HTTP/2.
    let line = lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("request"),
            Field("http.path", "/grpc.health.v1.Health/Check"),
            Field("http.method", "POST"),
            Field("http.status", "200"),
            Field("request_protocol", "grpc"),
            Field("upstream.protocol", "HTTP/2"),
        ],
    );
    assert!(
        line.has(&Field(
            "src.identity",
            "spiffe://cluster.local/ns/default/sa/echo"
        )),
        "{line:?}"
    );
    // And counted them as gRPC requests (two at least: other tests share this lab).
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    let counted: u64 = m
        .lines()
        .filter(|l| {
            l.starts_with("istio_requests_total{")
                && l.contains("request_protocol=\"grpc\"")
                && l.contains("response_code=\"200\"")
                && l.contains("source_principal=\"spiffe://cluster.local/ns/default/sa/echo\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert!(counted >= 2, "{counted} gRPC requests counted:\n{m}");
}
