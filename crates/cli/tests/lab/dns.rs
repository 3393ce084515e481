//! The DNS proxy on its own lab (`examples/dns.yaml`): `sleep` (alpha) opted into DNS capture;
//! its queries to any server are answered by its node proxy for mesh names, with the scope
//! rules applied, and forwarded to the node's upstream (`resolver`, outside the mesh, serving
//! `outside.test`) for other names, over UDP and over TCP. `plain` did not opt in: its queries
//! reach the server itself. With its node proxy gone, `sleep`'s queries meet a closed port,
//! never the upstream (fail closed).

use std::time::Duration;

use crate::harness::{Lab, eventually};

/// The lab's upstream resolver (`resolver`'s pod), every query's `--server`.
const UPSTREAM: &str = "198.18.3.53";

/// alpha-1's node proxy's admin address (the lab's first node).
const ALPHA_1_ADMIN: &str = "198.19.254.10:15000";

/// `ferry lab dig <pod> <name> --type <ty> --server UPSTREAM [--tcp]`: its output, or why it
/// failed.
fn dig(lab: &Lab, pod: &str, name: &str, ty: &str, tcp: bool) -> Result<String, String> {
    let mut args = vec!["dig", pod, name, "--type", ty, "--server", UPSTREAM];
    if tcp {
        args.push("--tcp");
    }
    let out = lab.output(&args);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn answer(lab: &Lab, pod: &str, name: &str, ty: &str, tcp: bool) -> String {
    dig(lab, pod, name, ty, tcp).unwrap_or_else(|e| panic!("{pod} asking {name} {ty}: {e}"))
}

/// The value of `ferry_dns_queries_total{outcome, protocol}` in `metrics`, 0 if absent.
fn queries(metrics: &str, outcome: &str, protocol: &str) -> u64 {
    let series =
        format!("ferry_dns_queries_total{{outcome=\"{outcome}\",protocol=\"{protocol}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

#[test]
fn a_pod_resolves_mesh_names_by_scope_and_outside_names_through_its_upstream() {
    let Some(lab) = Lab::up_with_args(
        Some("dns.yaml"),
        "fZ",
        &[&format!("--dns-upstream={UPSTREAM}")],
    ) else {
        return;
    };
    // The upstream resolver is up (the lab started it with the pods): `plain`, not captured,
    // asks it directly.
    assert!(
        eventually(Duration::from_secs(10), || dig(
            &lab,
            "plain",
            "www.outside.test",
            "A",
            false
        )
        .is_ok_and(|a| a.contains("198.18.200.80"))),
        "the lab's upstream resolver answers"
    );

    for tcp in [false, true] {
        let via = if tcp { "via tcp" } else { "via udp" };
        // A global service that runs only in beta: its name exists only remotely, and resolves.
        let a = answer(&lab, "sleep", "echo.default.svc.cluster.local", "A", tcp);
        assert!(a.starts_with("rcode No Error via"), "{a}");
        assert!(a.contains(via) && a.contains("198.18.10.1"), "{a}");
        // Its cluster-set name.
        let a = answer(&lab, "sleep", "echo.default.svc.clusterset.local", "A", tcp);
        assert!(a.contains(via) && a.contains("198.18.10.11"), "{a}");
        // A local service of beta: not for alpha's pods.
        let a = answer(&lab, "sleep", "ledger.default.svc.cluster.local", "A", tcp);
        assert!(a.contains("Non-Existent Domain") && a.contains(via), "{a}");
        assert!(!a.contains("198.18.10.2"), "{a}");
        // An outside name: forwarded to the upstream, its answer.
        let a = answer(&lab, "sleep", "www.outside.test", "A", tcp);
        assert!(a.contains(via) && a.contains("198.18.200.80"), "{a}");
    }
    // Other types of outside names are the upstream's too.
    let a = answer(&lab, "sleep", "www.outside.test", "AAAA", false);
    assert!(a.contains("2001:db8::80"), "{a}");
    let a = answer(&lab, "sleep", "_http._tcp.outside.test", "SRV", false);
    assert!(a.contains("www.outside.test"), "{a}");
    // beta's own pod (opted in too) resolves beta's local service.
    let a = answer(
        &lab,
        "ledger-beta",
        "ledger.default.svc.cluster.local",
        "A",
        false,
    );
    assert!(a.contains("198.18.10.2"), "{a}");
    // A pod that did not opt in reaches the server itself, which serves no mesh name (it
    // refuses a zone it does not hold).
    let a = answer(&lab, "plain", "echo.default.svc.cluster.local", "A", false);
    assert!(a.starts_with("rcode Query Refused"), "{a}");
    assert!(!a.contains("198.18.10.1"), "{a}");

    // alpha-1 counted what it answered and what it forwarded, by protocol.
    let m = lab.metrics("alpha-1", ALPHA_1_ADMIN);
    for protocol in ["udp", "tcp"] {
        assert!(queries(&m, "answered", protocol) >= 3, "{protocol}:\n{m}");
        assert!(queries(&m, "forwarded", protocol) >= 1, "{protocol}:\n{m}");
    }

    // Fail closed: with alpha-1's node proxy killed its rules stay, and sleep's queries meet a
    // closed port; none reaches the upstream, which would answer this name.
    lab.run(&["stop-node", "alpha-1", "--kill"]);
    for tcp in [false, true] {
        let r = dig(&lab, "sleep", "www.outside.test", "A", tcp);
        assert!(
            r.is_err(),
            "a query with its node proxy gone must fail: {r:?}"
        );
    }
    lab.run(&["start-node", "alpha-1"]);
    assert!(
        eventually(Duration::from_secs(20), || dig(
            &lab,
            "sleep",
            "echo.default.svc.cluster.local",
            "A",
            false
        )
        .is_ok_and(|a| a.contains("198.18.10.1"))),
        "the restarted node proxy answers sleep's queries again"
    );
}
