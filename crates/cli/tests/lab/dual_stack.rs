//! Dual-stack on its own lab (`examples/dual-stack.yaml`): `sleep` (main-a) and `echo` (main-b)
//! have an IPv4 and an IPv6 address (2001:2::/48), the service `echo` a VIP of each family. An
//! IPv6 connection crosses nodes over HBONE to `[v6]:15008` and the app sees the IPv6 client;
//! the same pods still talk over IPv4. Beside them, pods the node proxy must start cleanly: one
//! with IPv4 only, one whose namespace has IPv6 disabled, one whose loopback has no `::1`; and
//! one with IPv6 only. `sleep`'s DNS queries, over either family, get A and AAAA answers.
//!
//! Every lab app answers `"<name> port <p> saw <peer>"`.

use crate::harness::Has::{Field, Starts, Text};
use crate::harness::Lab;

/// main-b's node proxy's admin address (the lab's second node).
const MAIN_B_ADMIN: &str = "198.19.254.11:15000";

/// The address `answer` says its app saw, without the port (an IPv6 one without brackets).
fn saw(answer: &str) -> &str {
    let peer = answer
        .lines()
        .next()
        .and_then(|l| l.split(" saw ").nth(1))
        .unwrap_or_else(|| panic!("no 'saw' in {answer:?}"));
    let ip = peer.rsplit_once(':').map_or(peer, |(ip, _)| ip);
    ip.trim_start_matches('[').trim_end_matches(']')
}

/// The connections main-b's node proxy counted opened as the destination of `sleep` -> `echo`
/// over mutual TLS (HBONE).
fn hbone_opened(lab: &Lab) -> u64 {
    lab.metrics("main-b", MAIN_B_ADMIN)
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total{"))
        .filter(|l| {
            [
                "reporter=\"destination\"",
                "connection_security_policy=\"mutual_tls\"",
                "source_workload=\"sleep\"",
                "destination_workload=\"echo\"",
            ]
            .iter()
            .all(|label| l.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn ipv6_and_ipv4_pod_to_pod_over_hbone_and_pods_without_ipv6_start_cleanly() {
    let Some(lab) = Lab::up_with(Some("dual-stack.yaml"), "f6") else {
        return;
    };
    let before = hbone_opened(&lab);

    // IPv6, across nodes: to echo's IPv6 address, and to the service's IPv6 VIP.
    for to in ["[2001:2::2:20]:8080", "[2001:2::10:1]:80"] {
        let r = lab.send("sleep", to, "over v6").expect(to);
        assert!(r.starts_with("echo port 8080 saw ["), "{to}: {r}");
        assert_eq!(
            saw(&r),
            "2001:2::1:10",
            "{to}: the app sees the IPv6 client: {r}"
        );
        assert!(r.contains("over v6"), "{to}: bytes arrive: {r}");
    }
    // The tunnels went to echo's IPv6 HBONE address, asking for its IPv6 target; the VIP's
    // too.
    lab.log_line(
        "main-a",
        &[
            Field("direction", "outbound"),
            Starts("src.addr", "[2001:2::1:10]:"),
            Field("dst.addr", "[2001:2::2:20]:15008"),
            Field("dst.hbone_addr", "[2001:2::2:20]:8080"),
            Field("dst.service", "default/echo.default.svc.cluster.local"),
            Field("path", "hbone"),
        ],
    );
    lab.log_line(
        "main-b",
        &[
            Field("direction", "inbound"),
            Starts("src.addr", "[2001:2::1:10]:"),
            Field("dst.hbone_addr", "[2001:2::2:20]:8080"),
            Starts("path", "hbone"),
        ],
    );

    // sleep's DNS queries (captured) for echo's name, sent over IPv4 and over IPv6 to a server
    // that does not exist: its node proxy answers A with the IPv4 VIP, AAAA with the IPv6 one.
    for server in ["198.18.0.53", "2001:2::53"] {
        for (ty, vip) in [("A", "198.18.10.1"), ("AAAA", "2001:2::10:1")] {
            let out = lab.output(&[
                "dig",
                "sleep",
                "echo.default.svc.cluster.local",
                "--type",
                ty,
                "--server",
                server,
            ]);
            let a = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{ty} via {server}: {out:?}");
            assert!(
                a.starts_with("rcode No Error via udp"),
                "{ty} via {server}: {a}"
            );
            assert!(a.contains(vip), "{ty} via {server}: {a}");
        }
    }

    // The same pods over IPv4.
    for to in ["198.18.2.20:8080", "198.18.10.1:80"] {
        let r = lab.send("sleep", to, "over v4").expect(to);
        assert!(r.starts_with("echo port 8080 saw "), "{to}: {r}");
        assert_eq!(saw(&r), "198.18.1.10", "{to}: {r}");
    }
    // main-b counted all four as the destination of mutual-TLS (HBONE) connections.
    let after = hbone_opened(&lab);
    assert!(
        after >= before + 4,
        "HBONE connections counted: {before} -> {after}"
    );

    // A pod with IPv4 only, one whose namespace has IPv6 disabled, one whose loopback has no
    // ::1: each was enrolled, and carries IPv4 through the mesh.
    for (pod, ip) in [
        ("v4only", "198.18.1.11"),
        ("nov6", "198.18.1.12"),
        ("nolo6", "198.18.1.13"),
    ] {
        lab.log_line(
            "main-a",
            &[
                Text("pod enrolled"),
                Field("pod", &format!("main//v1/Pod/default/{pod}")),
            ],
        );
        let r = lab.send(pod, "198.18.10.1:80", pod).expect(pod);
        assert!(r.starts_with("echo port 8080 saw "), "{pod}: {r}");
        assert_eq!(saw(&r), ip, "{pod}: {r}");
    }
    // Each said why it has no (working) IPv6, and none is an error.
    lab.log_line(
        "main-a",
        &[
            Text("IPv6 is disabled in the pod's namespace"),
            Field("pod", "main//v1/Pod/default/nov6"),
        ],
    );
    lab.log_line(
        "main-a",
        &[
            Text("no ::1 on the pod's loopback"),
            Field("pod", "main//v1/Pod/default/nolo6"),
        ],
    );
    let log = lab.log("main-a");
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .collect();
    assert!(errors.is_empty(), "main-a logged errors: {errors:#?}");
    // A pod with IPv6 only: to the service's IPv6 VIP, seen as itself.
    let r = lab
        .send("v6only", "[2001:2::10:1]:80", "v6 only")
        .expect("v6only");
    assert!(r.starts_with("echo port 8080 saw ["), "{r}");
    assert_eq!(saw(&r), "2001:2::1:14", "{r}");
    // IPv6 from the pod without ::1 is captured all the same: it never reaches echo past the
    // proxy (its redirect to ::1 has nowhere to land).
    let r = lab.send("nolo6", "[2001:2::2:20]:8080", "past the proxy?");
    assert!(r.is_err(), "IPv6 from nolo6 must fail closed: {r:?}");
}

/// shop (main-b) behind shop-waypoint, whose instance has an IPv4 and an IPv6 address and
/// listens on both: `sleep` to shop's IPv6 VIP goes to the waypoint at its IPv6 address and on
/// to shop's; plain TCP from `legacy` (not in the mesh) to shop's IPv6 address is relayed by
/// main-b's node proxy to the waypoint's IPv6 address; both still work over IPv4.
#[test]
fn a_dual_stack_waypoint_carries_ipv6_and_ipv4() {
    let Some(lab) = Lab::up_with(Some("dual-stack.yaml"), "f7") else {
        return;
    };
    const WAYPOINT_LOG: &str = "waypoint-shop-waypoint-b";
    // It serves HBONE on both of its addresses.
    lab.log_line(
        WAYPOINT_LOG,
        &[
            Text("serving HBONE"),
            Text("198.18.2.50:15008"),
            Text("[2001:2::2:50]:15008"),
        ],
    );

    // In the mesh, over IPv6: to the waypoint's IPv6 address, then to shop's.
    let r = lab
        .send("sleep", "[2001:2::10:2]:80", "via the waypoint")
        .expect("sleep to shop's IPv6 VIP");
    assert!(r.starts_with("shop port 8080 saw ["), "{r}");
    assert_eq!(
        saw(&r),
        "2001:2::1:10",
        "the app sees sleep's IPv6 address: {r}"
    );
    lab.log_line(
        "main-a",
        &[
            Field("direction", "outbound"),
            Starts("src.addr", "[2001:2::1:10]:"),
            Field("dst.addr", "[2001:2::2:50]:15008"),
        ],
    );
    lab.log_line(
        WAYPOINT_LOG,
        &[
            Field("direction", "waypoint"),
            Starts("src.addr", "[2001:2::1:10]:"),
            Field("dst.addr", "[2001:2::10:2]:80"),
            Field("dst.workload", "main//v1/Pod/default/shop"),
            Text("hbone to [2001:2::2:30]:15008"),
        ],
    );
    lab.log_line(
        "main-b",
        &[
            Field("direction", "inbound"),
            Starts("src.addr", "[2001:2::2:50]:"),
            Field("dst.hbone_addr", "[2001:2::2:30]:8080"),
        ],
    );

    // Plain TCP from outside the mesh to shop's IPv6 address: main-b's node proxy sends it to
    // the waypoint's IPv6 address (its first, IPv4, one before).
    let r = lab
        .send("legacy", "[2001:2::2:30]:8080", "plain v6")
        .expect("legacy to shop over IPv6");
    assert!(r.starts_with("shop port 8080 saw ["), "{r}");
    assert_eq!(saw(&r), "2001:2::1:90", "{r}");
    lab.log_line(
        WAYPOINT_LOG,
        &[
            Field("direction", "waypoint"),
            Starts("src.addr", "[2001:2::2:30]:"),
            Field("dst.addr", "[2001:2::2:30]:8080"),
        ],
    );

    // The same over IPv4.
    let r = lab
        .send("sleep", "198.18.10.2:80", "v4 via the waypoint")
        .expect("sleep to shop's IPv4 VIP");
    assert_eq!(saw(&r), "198.18.1.10", "{r}");
    let r = lab
        .send("legacy", "198.18.2.30:8080", "plain v4")
        .expect("legacy to shop over IPv4");
    assert_eq!(saw(&r), "198.18.1.90", "{r}");
    lab.log_line(
        WAYPOINT_LOG,
        &[
            Field("direction", "waypoint"),
            Starts("src.addr", "198.18.1.10:"),
            Field("dst.addr", "198.18.10.2:80"),
        ],
    );
}
