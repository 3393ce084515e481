//! The app sees the real client address: the destination's node proxy connects to it from the
//! original source (`IP_TRANSPARENT` and the pod's original-source rules), on every path.
//!
//! Every lab app answers `"<name> port <p> saw <peer>"` (HTTP: `"<name> http GET / saw <peer>"`),
//! `<peer>` being the address its socket's peer has.

use crate::gateway::NETWORKS;
use crate::harness::Has::{Field, Starts, Text};
use crate::harness::MESH;

/// The address `answer` says its app saw, without the port.
fn saw(answer: &str) -> &str {
    let peer = answer
        .lines()
        .next()
        .and_then(|l| l.split(" saw ").nth(1))
        .unwrap_or_else(|| panic!("no 'saw' in {answer:?}"));
    peer.rsplit_once(':').map_or(peer, |(ip, _)| ip)
}

/// sleep (alpha-1, 198.18.1.10) -> echo-alpha-1 (alpha-1) and echo-alpha-2 (alpha-2).
#[test]
fn the_app_sees_the_client_pods_address_on_the_same_node_and_across_nodes() {
    let Some(lab) = MESH.get() else { return };
    for (to, app) in [
        ("198.18.1.20:8080", "echo-alpha-1 port 8080"),
        ("198.18.2.20:8080", "echo-alpha-2 port 8080"),
        // A service: the tunnel's target is the picked pod (alpha-1's, closest).
        ("198.18.10.1:80", "echo-alpha-1 port 8080"),
    ] {
        let r = lab.send("sleep", to, "who").expect(to);
        assert!(r.starts_with(app), "{to}: {r}");
        assert_eq!(saw(&r), "198.18.1.10", "{to}: {r}");
        assert!(r.contains("who"), "{to}: bytes arrive: {r}");
    }
    // The decision record says nothing of the pod's own address.
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Field("dst.hbone_addr", "198.18.2.20:8080"),
            Field("path", "hbone"),
        ],
    );
}

/// sleep -> shop (HTTP, through audit-waypoint's instance on beta-1) -> shop-v1 or shop-v2.
#[test]
fn the_app_sees_the_client_pods_address_through_a_waypoint() {
    let Some(lab) = MESH.get() else { return };
    let r = lab
        .send(
            "sleep",
            "198.18.10.6:80",
            "GET / HTTP/1.1\r\nhost: shop\r\nconnection: close\r\n\r\n",
        )
        .expect("through the waypoint");
    let body = r.lines().last().unwrap_or_default();
    assert!(body.starts_with("shop-v"), "{r}");
    assert_eq!(saw(body), "198.18.1.10", "{r}");
    // The destination took the address the waypoint forwarded (the waypoint's word, from the
    // pod's own waypoint only).
    lab.log_line(
        "beta-1",
        &[
            Field("direction", "inbound"),
            Text("hbone from waypoint spiffe://cluster.local/ns/default/sa/audit-waypoint"),
        ],
    );
}

/// legacy (not in the mesh, beta-1, 198.18.3.90) -> echo-alpha-2: plain TCP captured on the
/// pod's inbound port; and -> audit-beta, through its waypoint.
#[test]
fn the_app_sees_a_plain_clients_address() {
    let Some(lab) = MESH.get() else { return };
    let r = lab
        .send("legacy", "198.18.2.20:8080", "plain")
        .expect("plain TCP into the mesh");
    assert!(r.starts_with("echo-alpha-2 port 8080"), "{r}");
    assert_eq!(saw(&r), "198.18.3.90", "{r}");
    // To a pod behind a waypoint (audit-beta, on legacy's node): its node proxy relays the
    // connection to the waypoint under audit-beta's identity, naming the client; the waypoint
    // takes that from audit-beta's own identity only and forwards it back to audit-beta.
    let r = lab
        .send("legacy", "198.18.3.60:8080", "relayed")
        .expect("plain TCP through the waypoint");
    assert!(r.starts_with("audit-beta port 8080"), "{r}");
    assert_eq!(saw(&r), "198.18.3.90", "{r}");
    // Its log names the client's own port; the app's socket has another (never the same: the
    // client's connection holds that pair).
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Starts("src.addr", "198.18.3.90:"),
            Field("path", "plain tcp"),
        ],
    );
}

/// sleep-east (net-east, 198.18.1.10) -> search (pods only in west): double HBONE through
/// west's gateway; and -> echo through the shared waypoint.
#[test]
fn the_app_sees_the_client_pods_address_through_the_east_west_gateway_and_a_waypoint() {
    let Some(lab) = NETWORKS.get() else { return };
    let r = lab
        .send("sleep-east", "198.18.10.5:80", "across")
        .expect("through the gateway");
    assert!(r.starts_with("search-west-1 port 7070"), "{r}");
    // The source pod's address from the inner tunnel, never the gateway's (198.19.255.1).
    assert_eq!(saw(&r), "198.18.1.10", "{r}");
    let r = lab
        .send("sleep-east", "198.18.10.1:80", "via waypoint")
        .expect("through the shared waypoint");
    assert!(r.starts_with("echo-east-"), "{r}");
    assert_eq!(saw(&r), "198.18.1.10", "{r}");
}

/// The app's side of a connection from the client's address has loopback's MSS: its socket,
/// accepted from the node proxy's marked SYN, routes by table 133 (`lo`) from its SYN-ACK on,
/// not by the pod's interface (MTU 1500, MSS 1448: bulk data to the app in 45 times as many
/// segments, and each of the app's packets routed again; `node::transparent`).
#[test]
fn the_apps_side_of_a_connection_from_the_client_address_has_loopbacks_mss() {
    use std::time::Duration;
    let Some(lab) = MESH.get() else { return };
    let _held = lab.hold_pinging("sleep", "198.18.2.20:8080");
    // `ss -ti` prints each socket on one line, its TCP details on the next.
    let app_sockets = || {
        let (_, out) = in_pod(
            lab,
            "echo-alpha-2",
            &["ss", "-tinH", "state", "established", "( sport = :8080 )"],
        );
        let lines: Vec<String> = out.lines().map(str::to_string).collect();
        lines
            .chunks(2)
            .filter(|s| s[0].contains(" 198.18.1.10:"))
            .map(|s| s.join(" "))
            .collect::<Vec<String>>()
    };
    let mut found = Vec::new();
    assert!(
        crate::harness::eventually(Duration::from_secs(15), || {
            found = app_sockets();
            !found.is_empty()
        }),
        "no connection from 198.18.1.10 at echo-alpha-2's app"
    );
    for s in &found {
        let advmss: u32 = s
            .split_whitespace()
            .find_map(|w| w.strip_prefix("advmss:"))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no advmss in {s}"));
        assert!(
            advmss > 1460,
            "the app's socket has the interface's MSS: {s}"
        );
    }
}

/// Runs `args` in `pod`'s network namespace: whether it succeeded, and its output.
fn in_pod(lab: &crate::harness::Lab, pod: &str, args: &[&str]) -> (bool, String) {
    let ns = lab.state(&["pods", pod, "netns"]);
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.as_str().unwrap()])
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Someone deletes echo-alpha-1's routing rule, then its mangle jump, then flushes its local
/// route: each is put back by its node proxy (on the namespace's rtnetlink and nf_tables
/// events), and the app sees the client again.
#[test]
fn removed_original_source_rules_are_put_back_by_the_node_proxy() {
    use std::time::Duration;
    let Some((lab, _one_at_a_time)) = crate::harness::CHANGING.one_at_a_time() else {
        return;
    };
    let pod = "echo-alpha-1";
    let rule = || in_pod(lab, pod, &["ip", "-4", "rule", "show"]).1;
    let jump = || {
        in_pod(
            lab,
            pod,
            &[
                "iptables",
                "-w",
                "-t",
                "mangle",
                "-C",
                "OUTPUT",
                "-p",
                "tcp",
                "-j",
                "FERRY_ORIG_OUT",
            ],
        )
        .0
    };
    let route = || in_pod(lab, pod, &["ip", "-4", "route", "show", "table", "133"]).1;
    let all_back = || {
        crate::harness::eventually(Duration::from_secs(15), || {
            rule().contains("fwmark 0x111/0xfff lookup 133")
                && jump()
                && route().contains("local default dev lo")
        })
    };
    assert!(all_back(), "the rules were in place: {}", rule());
    let del_rule = [
        "ip",
        "-4",
        "rule",
        "del",
        "fwmark",
        "0x111/0xfff",
        "pref",
        "32764",
        "lookup",
        "133",
    ];
    assert!(in_pod(lab, pod, &del_rule).0, "the rule was deleted");
    assert!(all_back(), "the routing rule was not put back");
    let del_jump = [
        "iptables",
        "-w",
        "-t",
        "mangle",
        "-D",
        "OUTPUT",
        "-p",
        "tcp",
        "-j",
        "FERRY_ORIG_OUT",
    ];
    assert!(in_pod(lab, pod, &del_jump).0, "the jump was deleted");
    assert!(all_back(), "the mangle jump was not put back");
    let flush = ["ip", "-4", "route", "flush", "table", "133"];
    assert!(in_pod(lab, pod, &flush).0, "the table was flushed");
    assert!(all_back(), "the local route was not put back");
    // The log line reaches the log through the writer thread, after the repair.
    let repairs = || {
        lab.log_lines("alpha-1")
            .into_iter()
            .filter(|l| l.has(&Text("original-source rules were missing or altered")))
            .count()
    };
    crate::harness::eventually(Duration::from_secs(10), || repairs() >= 3);
    let repairs = repairs();
    assert!(repairs >= 3, "{repairs} repairs logged");
    let r = lab
        .send("sleep", "198.18.1.20:8080", "again")
        .expect("again");
    assert_eq!(saw(&r), "198.18.1.10", "{r}");
}
