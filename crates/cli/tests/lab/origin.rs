//! The last hop checks scope too: crafted tunnels straight to a destination's HBONE port, with
//! a real certificate from the lab's CA, are judged by the cluster that certificate proves (the
//! baggage's claim is ignored), and nothing reaches the protected pod.

use crate::harness::Has::{Field, Text};
use crate::harness::MESH;

const SLEEP: &str = "spiffe://cluster.local/ns/default/sa/sleep";
const LEDGER: &str = "spiffe://cluster.local/ns/default/sa/ledger";
const ECHO: &str = "spiffe://cluster.local/ns/default/sa/echo";

/// alpha's sleep straight to ledger-beta (ledger is local to each cluster), on the flat network.
#[test]
fn a_tunnel_from_another_cluster_to_a_pod_of_a_local_service_is_refused_at_the_destination() {
    let Some(lab) = MESH.get() else { return };
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let legacy_ns = lab.state(&["pods", "legacy", "netns"]);
    // (node whose credential fetches the certificate, identity, netns to dial from, claim)
    let craft = |node: &str,
                 identity: &str,
                 from: &str,
                 to: &str,
                 peer: &str,
                 authority: &str,
                 claim: &str| {
        lab.craft(
            node,
            node,
            &[
                "--identity",
                identity,
                "--to",
                to,
                "--peer-identity",
                peer,
                "--authority",
                authority,
                "--dial-netns",
                from,
                "--cluster",
                claim,
            ],
        )
    };
    let ledger = lab.probe("ledger-beta", 8080);
    // The attack: a certificate alpha's node proxy holds, whose baggage claims beta, by pod
    // address and by service name. The destination's node proxy takes the cluster from the
    // certificate (alpha), which ledger's scope does not admit to beta's pod.
    for authority in ["198.18.3.30:8080", "ledger.default.svc.cluster.local:80"] {
        let refused = craft(
            "alpha-1",
            SLEEP,
            sleep_ns.as_str().unwrap(),
            "198.18.3.30:15008",
            LEDGER,
            authority,
            "beta",
        );
        assert!(
            refused.contains("refused") && refused.contains("401"),
            "{authority}: {refused}"
        );
    }
    lab.log_line(
        "beta-1",
        &[
            Field("direction", "inbound"),
            Field("src.identity", SLEEP),
            Text("does not admit a source in cluster alpha"),
        ],
    );
    assert_eq!(ledger.packets(), 0, "a packet reached ledger-beta's app");
    // Honest and admissible: a certificate beta's node proxy holds reaches ledger-beta, and
    // alpha's reaches echo (global) on beta, by address and by name.
    let carried = craft(
        "beta-1",
        ECHO,
        legacy_ns.as_str().unwrap(),
        "198.18.3.30:15008",
        LEDGER,
        "198.18.3.30:8080",
        "beta",
    );
    assert!(carried.contains("status 200"), "{carried}");
    assert!(
        ledger.packets() > 0,
        "the counter counts what reaches ledger-beta"
    );
    let echo = lab.probe("echo-beta", 8080);
    for authority in ["198.18.3.20:8080", "echo.default.svc.cluster.local:80"] {
        let carried = craft(
            "alpha-1",
            SLEEP,
            sleep_ns.as_str().unwrap(),
            "198.18.3.20:15008",
            ECHO,
            authority,
            "alpha",
        );
        assert!(carried.contains("status 200"), "{authority}: {carried}");
    }
    assert!(echo.packets() > 0, "echo-beta was reached");
}
