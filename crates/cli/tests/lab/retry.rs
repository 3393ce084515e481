//! A connect that fails before any byte was sent is tried once more on another endpoint of the
//! same decision, never outside the service's scope. One at a time on [`CHANGING`]: each
//! scenario makes one pod's HBONE port refuse (an nft rule in its namespace, removed however the
//! test ends).

use std::time::Duration;

use crate::harness::Has::{Field, Starts, Text};
use crate::harness::{CHANGING, Lab, eventually};

/// `ferry_connect_retries_total` on alpha-1 (the node of `sleep` and `echo-alpha-1`), at its
/// admin address now (a handover on this lab moves it).
fn retries(lab: &Lab) -> u64 {
    let admin = lab.state(&["nodes", "alpha-1", "admin"]);
    let m = lab.metrics("alpha-1", admin.as_str().unwrap());
    m.lines()
        .find_map(|l| l.strip_prefix("ferry_connect_retries_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ferry_connect_retries_total in:\n{m}"))
}

/// sleep -> echo (global, prefer_close): its closest endpoint, echo-alpha-1 on sleep's own
/// node, refuses every connection to its HBONE port, so each connection is tried on it, then
/// on echo-alpha-2; the app sees each one succeed.
#[test]
fn a_connect_refused_before_the_first_byte_is_tried_on_another_endpoint() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    let before = retries(lab);
    let refused = lab.refuse("echo-alpha-1", 15008);
    const N: u64 = 20;
    for i in 0..N {
        let answer = lab
            .send("sleep", "198.18.10.1:80", "retry\n")
            .unwrap_or_else(|e| panic!("connection {i} failed: {e}"));
        assert!(
            answer.contains("echo-alpha-2"),
            "connection {i} answered by another endpoint than echo-alpha-2: {answer}"
        );
    }
    assert!(refused.packets() >= N, "the refusing endpoint was tried");
    let after = retries(lab);
    assert!(
        after - before >= N,
        "{N} connections were retried, the counter went {before} -> {after}"
    );
    lab.log_line(
        "alpha-1",
        &[
            Starts(
                "message",
                "connect failed before any byte was sent; trying another endpoint",
            ),
            Starts("dst.workload", "alpha//v1/Pod/default/echo-alpha-1"),
        ],
    );
    lab.log_line(
        "alpha-1",
        &[
            Field("direction", "outbound"),
            // Dialled: the endpoint that took it (echo-alpha-2).
            Field("dst.addr", "198.18.2.20:15008"),
            Text("(after a failed connect to alpha//v1/Pod/default/echo-alpha-1)"),
        ],
    );
    // Restored: the closest endpoint serves again.
    drop(refused);
    assert!(
        eventually(Duration::from_secs(10), || lab
            .send("sleep", "198.18.10.1:80", "back\n")
            .is_ok_and(|a| a.contains("echo-alpha-1"))),
        "echo-alpha-1 does not serve again once its port is open"
    );
}

/// sleep -> ledger (local): its only endpoint in alpha, ledger-alpha, refuses; ledger-beta in
/// beta is never tried (a retry never leaves the scope), and no retry is counted.
#[test]
fn a_local_service_whose_only_endpoint_in_scope_refuses_still_fails() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    let before = retries(lab);
    let refused = lab.refuse("ledger-alpha", 15008);
    let beta = lab.probe("ledger-beta", 15008);
    lab.send("sleep", "198.18.10.2:80", "x\n")
        .expect_err("no endpoint of ledger in alpha takes it");
    assert!(refused.packets() > 0, "ledger-alpha was tried");
    assert_eq!(beta.packets(), 0, "ledger-beta was never tried");
    assert_eq!(retries(lab), before, "no retry without another endpoint");
    lab.log_line(
        "alpha-1",
        &[
            Field("direction", "outbound"),
            // Dialled: ledger-alpha, the only endpoint in scope.
            Field("dst.addr", "198.18.2.30:15008"),
            Field("response_flags", "ConnectionFailure"),
        ],
    );
}
