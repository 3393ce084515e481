//! Flows past the idle bound: half-closed, abandoned, vanished. Node proxies with a 2 s idle
//! bound and a 1 s drain deadline ([`SHORT_BOUNDS`]); the destination app reads to EOF and then
//! never answers nor closes. One at a time: they count the node proxies' descriptors.

use std::io::{BufReader, Lines};
use std::process::{Child, ChildStdout, Command};
use std::time::Duration;

use crate::harness::{Lab, SHORT_BOUNDS, eventually, ferry};

const FLOWS: usize = 50;
const SRC: &str = "alpha-1";
const DST: &str = "alpha-2";

/// Opens `n` flows from sleep to echo-alpha-2's half-close app; returns once they are open.
fn start(lab: &Lab, n: usize) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut c = ferry()
        .args(["lab", "exec", "sleep", "--state-dir"])
        .arg(&lab.dir)
        .args(["--id", &lab.id, "--"])
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "lab",
            "half-close",
            "198.18.2.20:7171",
            "--n",
            &n.to_string(),
        ])
        .args(["--max-seconds", "30"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(c.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), format!("open {n}"));
    (c, lines)
}

/// Descriptors of the source's and the destination's node proxies, before any flow.
fn base(lab: &Lab) -> (usize, usize) {
    (lab.node_fds(SRC), lab.node_fds(DST))
}

/// Descriptors a previous scenario may leave behind a while (its ended flows' pooled tunnels):
/// counted in a base, they can close while the next flows open.
const LINGERING: usize = 4;

/// Whether the destination holds the `FLOWS` flows opened after `base` was taken: each is one
/// descriptor there (its tunnels share pooled connections), less what may have lingered in the
/// base and closed since.
fn holds_the_flows(lab: &Lab, base: (usize, usize)) -> bool {
    lab.node_fds(DST) + LINGERING >= base.1 + FLOWS
}

/// Half-closed by the client, never finished by the server.
#[test]
fn live_flows_cost_two_descriptors_each_and_half_closed_ones_end_after_the_idle_bound() {
    let Some((lab, _one_at_a_time)) = SHORT_BOUNDS.one_at_a_time() else {
        return;
    };
    let (src, dst) = (SRC, DST);
    let base = base(lab);
    let start = |n| start(lab, n);
    // Live flows: descriptors grow by at most two per flow (plus a few pooled tunnels).
    let (mut client, mut lines) = start(FLOWS);
    assert!(
        eventually(Duration::from_secs(10), || holds_the_flows(lab, base)),
        "the destination node never held the flows: {} descriptors, {} before",
        lab.node_fds(dst),
        base.1
    );
    let live = (lab.node_fds(src), lab.node_fds(dst));
    for (node, b, l) in [(src, base.0, live.0), (dst, base.1, live.1)] {
        assert!(
            l <= b + 2 * FLOWS + 8,
            "{node}: {l} descriptors with {FLOWS} flows, {b} idle"
        );
    }

    // Half-closed by the client, never finished by the server: every one is ended after the
    // bound, on both node proxies, with nothing left in CLOSE-WAIT or FIN-WAIT-2.
    std::io::Write::write_all(client.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let report = lines.next().unwrap().unwrap();
    assert!(
        report.starts_with(&format!("closed {FLOWS} of {FLOWS} in")),
        "{report}"
    );
    let _ = client.wait();
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(10), || lab.node_fds(node)
                <= b + LINGERING),
            "{node}: {} descriptors after the bound, {b} before the flows",
            lab.node_fds(node)
        );
    }
    for pod in ["sleep", "echo-alpha-2"] {
        let mut left = Vec::new();
        assert!(
            eventually(Duration::from_secs(10), || {
                left = lab.lingering_sockets(pod);
                left.is_empty()
            }),
            "{pod}: {left:?}"
        );
    }
}

/// The client process is killed with its connections open.
#[test]
fn abandoned_flows_end_within_the_idle_bound() {
    let Some((lab, _one_at_a_time)) = SHORT_BOUNDS.one_at_a_time() else {
        return;
    };
    let (src, dst) = (SRC, DST);
    let base = base(lab);
    let start = |n| start(lab, n);
    // Abandoned: the client process is killed with its connections open (the kernel closes
    // them); the server never finishes; both proxies let go within the bound.
    let (mut client, _lines) = start(FLOWS);
    assert!(
        eventually(Duration::from_secs(10), || holds_the_flows(lab, base)),
        "the destination node never held the flows: {} descriptors, {} before",
        lab.node_fds(dst),
        base.1
    );
    let _ = client.kill();
    let _ = client.wait();
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(15), || lab.node_fds(node)
                <= b + LINGERING),
            "{node}: {} descriptors after abandoned flows, {b} before",
            lab.node_fds(node)
        );
    }
}

/// The client's packets stop, both ways, without a FIN or a reset.
#[test]
fn flows_whose_peer_vanished_end_by_keepalive_within_the_idle_bound() {
    let Some((lab, _one_at_a_time)) = SHORT_BOUNDS.one_at_a_time() else {
        return;
    };
    let (src, dst) = (SRC, DST);
    let base = base(lab);
    let start = |n| start(lab, n);
    // Vanished: the client's packets stop, both ways, without a FIN or a reset (dropped between
    // the app and its node proxy inside the pod). Keepalive ends the connections within the
    // bound on the source's proxy, and the tunnels with them on the destination's.
    let (mut client, _lines) = start(FLOWS);
    assert!(
        eventually(Duration::from_secs(10), || holds_the_flows(lab, base)),
        "the destination node never held the flows: {} descriptors, {} before",
        lab.node_fds(dst),
        base.1
    );
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let sleep_ns = sleep_ns.as_str().unwrap();
    let drop_rule = |op: &str, dir: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", sleep_ns, "iptables", "-w", op, "OUTPUT", "-p", "tcp",
            ])
            .args([dir, "15001", "-j", "DROP"])
            .status()
            .unwrap()
            .success()
    };
    assert!(drop_rule("-I", "--dport") && drop_rule("-I", "--sport"));
    for (node, b) in [(src, base.0), (dst, base.1)] {
        assert!(
            eventually(Duration::from_secs(20), || lab.node_fds(node)
                <= b + LINGERING),
            "{node}: {} descriptors after the peers vanished, {b} before",
            lab.node_fds(node)
        );
    }
    assert!(drop_rule("-D", "--dport") && drop_rule("-D", "--sport"));
    let _ = client.kill();
    let _ = client.wait();
}
