//! Strict mutual TLS (Istio's PeerAuthentication) on its own lab (`examples/strict-mtls.yaml`):
//! plain TCP from outside the mesh is refused at the destination's node proxy where the
//! workload's mode is STRICT, named in the access log and the metrics; PERMISSIVE (the mesh's
//! mode there, and ledger's port 9090) accepts it; HBONE from a mesh workload is accepted.

use std::time::Duration;

use crate::harness::Has::{Field, Text};
use crate::harness::{Lab, eventually};

/// main-b's node proxy's admin address (the lab's second node).
const MAIN_B_ADMIN: &str = "198.19.254.11:15000";

#[test]
fn plain_tcp_to_a_strict_workload_is_refused_and_permissive_accepts_it() {
    let Some(lab) = Lab::up_with(Some("strict-mtls.yaml"), "fX") else {
        return;
    };
    // PERMISSIVE (the mesh-wide mode): plain TCP from outside the mesh is answered.
    let r = lab
        .send("legacy", "198.18.1.20:8080", "x")
        .expect("plain TCP to a PERMISSIVE workload");
    assert!(r.starts_with("echo port 8080"), "{r}");

    // STRICT (namespace payments): refused at vault's node proxy, by the policy istiod would
    // send ztunnel, rule 0; the access log and the metrics name it.
    let e = lab
        .send("legacy", "198.18.2.30:8080", "x")
        .expect_err("plain TCP to a STRICT workload");
    assert!(
        e.contains("reset") || e.contains("refused") || e.contains("closed"),
        "{e}"
    );
    lab.log_line(
        "main-b",
        &[
            Field("direction", "inbound"),
            Field("path", "plain tcp"),
            Field("dst.addr", "198.18.2.30:8080"),
            Field("response_flags", "DENY"),
            Text("denied by policy istio-system/istio_converted_static_strict rule 0"),
        ],
    );

    // ledger: STRICT except port 9090, one converted policy (not the static one beside an
    // exception: any matching DENY denies).
    let e = lab
        .send("legacy", "198.18.2.40:8080", "x")
        .expect_err("plain TCP to ledger's strict port");
    assert!(
        e.contains("reset") || e.contains("refused") || e.contains("closed"),
        "{e}"
    );
    lab.log_line(
        "main-b",
        &[
            Field("dst.addr", "198.18.2.40:8080"),
            Field("response_flags", "DENY"),
            Text("denied by policy payments/converted_peer_authentication_ledger-metrics rule 0"),
        ],
    );
    let r = lab
        .send("legacy", "198.18.2.40:9090", "x")
        .expect("plain TCP to ledger's PERMISSIVE port");
    assert!(r.starts_with("ledger port 9090"), "{r}");

    // HBONE from a mesh workload has an identity: accepted on every port.
    for to in ["198.18.2.30:8080", "198.18.2.40:8080", "198.18.2.40:9090"] {
        let r = lab
            .send("sleep", to, "x")
            .unwrap_or_else(|e| panic!("HBONE to {to}: {e}"));
        assert!(r.contains(" saw "), "{to}: {r}");
    }
    lab.log_line(
        "main-b",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("dst.hbone_addr", "198.18.2.30:8080"),
            Text("connection complete"),
        ],
    );

    // Counted by policy and rule, and as failed connections with the DENY flag.
    let mut m = String::new();
    let counted = eventually(Duration::from_secs(10), || {
        m = lab.metrics("main-b", MAIN_B_ADMIN);
        let denied = |policy: &str| {
            m.lines().any(|l| {
                l.starts_with(&format!(
                    "ferry_policy_denied_total{{reporter=\"destination\",policy=\"{policy}\",rule=\"0\"}} "
                ))
            })
        };
        denied("istio-system/istio_converted_static_strict")
            && denied("payments/converted_peer_authentication_ledger-metrics")
            && m.lines().any(|l| {
                l.starts_with("istio_tcp_connections_failed_total{reporter=\"destination\"")
                    && l.contains("response_flags=\"DENY\"")
            })
    });
    assert!(counted, "the denials are not counted:\n{m}");
}
