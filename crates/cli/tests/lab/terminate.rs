//! A pod marked terminating (`ferry lab terminate`, an edit of the lab's topology the control
//! plane picks up) takes no new connections, while the ones it has keep flowing. On
//! [`CHANGING`], one at a time; the topology is written back however the test ends.

use std::time::{Duration, Instant};

use crate::harness::{CHANGING, Held, Lab, eventually, ferry};

/// How long an edit of the topology may take to reach every node proxy.
const EDIT_BOUND: Duration = Duration::from_secs(10);

/// The lab's topology file as it was, written back when dropped (however the test ends).
struct Restore {
    path: std::path::PathBuf,
    text: String,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.text);
    }
}

/// `ferry lab terminate POD [--undo]` on this lab.
fn terminate(lab: &Lab, pod: &str, undo: bool) {
    let mut cmd = ferry();
    cmd.args(["lab", "terminate", pod, "--state-dir"])
        .arg(&lab.dir)
        .args(["--id", &lab.id]);
    if undo {
        cmd.arg("--undo");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "ferry lab terminate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Which echo pod answered a connection from sleep to the echo service.
fn answered_by(answer: &str) -> &'static str {
    ["echo-alpha-1", "echo-alpha-2", "echo-beta"]
        .into_iter()
        .find(|p| answer.contains(p))
        .unwrap_or_else(|| panic!("answered by no echo pod: {answer}"))
}

/// Waits for `n` more pings (each an echoed line) on `held`, failing on anything else.
fn pings(held: &Held, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < n {
        let left = end.saturating_duration_since(Instant::now());
        match held.lines.recv_timeout(left) {
            Ok((_, l)) if l.starts_with("ping ") => seen += 1,
            Ok((_, l)) => panic!("the held connection ended: {l}"),
            Err(e) => panic!("{seen} of {n} pings in 10 s on the held connection: {e}"),
        }
    }
}

/// Every line `held` printed so far is a ping: the connection never closed.
fn still_open(held: &Held) {
    for (_, l) in held.lines.try_iter() {
        assert!(l.starts_with("ping "), "the held connection ended: {l}");
    }
}

/// sleep -> echo (global, prefer_close) lands on echo-alpha-1, on sleep's own node. Held open
/// and pinging, echo-alpha-1 is marked terminating: within the edit bound new connections go
/// to the other replicas only (counted per pod), and the held one keeps flowing. Unmarked, it
/// serves new connections again.
#[test]
fn a_terminating_pod_keeps_its_open_connections_and_gets_no_new_ones() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    let path = lab.dir.join("topology.yaml");
    let _restore = Restore {
        text: std::fs::read_to_string(&path).unwrap(),
        path,
    };
    const VIP: &str = "198.18.10.1:80";
    let first = lab.send("sleep", VIP, "before\n").unwrap();
    assert_eq!(answered_by(&first), "echo-alpha-1", "the closest endpoint");
    let held = lab.hold_pinging("sleep", VIP);
    pings(&held, 3);

    terminate(lab, "echo-alpha-1", false);
    let marked = Instant::now();
    assert!(
        eventually(EDIT_BOUND, || lab
            .send("sleep", VIP, "after\n")
            .is_ok_and(|a| answered_by(&a) != "echo-alpha-1")),
        "new connections still go to the terminating echo-alpha-1 after {EDIT_BOUND:?}"
    );
    let took = marked.elapsed();
    const N: usize = 20;
    let counts = lab.count_answers("sleep", VIP, N, answered_by);
    eprintln!("marked terminating, seen in {took:?}; new connections per pod: {counts:?}");
    assert_eq!(counts.get("echo-alpha-1"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), N);
    // The held connection to echo-alpha-1 kept flowing the whole time.
    still_open(&held);
    pings(&held, 5);

    terminate(lab, "echo-alpha-1", true);
    assert!(
        eventually(EDIT_BOUND, || lab
            .send("sleep", VIP, "back\n")
            .is_ok_and(|a| answered_by(&a) == "echo-alpha-1")),
        "echo-alpha-1 does not take new connections again once unmarked"
    );
    still_open(&held);
}
