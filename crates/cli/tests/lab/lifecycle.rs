//! Node proxies replaced and restarted; capture rules removed; a pod's namespace re-created; the
//! control plane gone. Each runs alone on a lab of its group ([`CHANGING`] with default node
//! proxies, [`SHORT_BOUNDS`] with a 1 s drain deadline), or on its own lab (the control plane,
//! which does not come back). kill -9 is in `crash.rs`.

use std::process::Command;
use std::time::Duration;

use crate::harness::Has::{Field, Text};
use crate::harness::{CHANGING, Lab, SHORT_BOUNDS, eventually, ferry};

/// Short connections keep coming from sleep to echo-alpha-2 while alpha-1 and alpha-2 hand over.
#[test]
fn handovers_of_both_nodes_on_the_path_refuse_no_connection() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    // Handovers of both nodes on the path while short connections keep coming: none refused.
    let stop = lab.dir.join("stop-churn");
    let churn = ferry()
        .args(["lab", "exec", "sleep", "--state-dir"])
        .arg(&lab.dir)
        .args(["--id", &lab.id, "--"])
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(["lab", "churn", "198.18.2.20:8080", "--until-file"])
        .arg(&stop)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for node in ["alpha-1", "alpha-2"] {
        lab.run(&["handover", node]);
    }
    std::fs::write(&stop, "").unwrap();
    let out = churn.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let counts: Vec<u64> = summary
        .split(' ')
        .filter_map(|kv| kv.split('=').nth(1)?.parse().ok())
        .collect();
    assert_eq!(
        counts.len(),
        2,
        "churn summary {summary:?} ({}), stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(counts[0] > 0, "no connection made it: {summary}");
    assert_eq!(
        counts[1],
        0,
        "connections refused during the handovers: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = lab
        .send("sleep", "198.18.10.2:80", "after handover")
        .expect("served by the new node proxies");
    assert!(r.contains("after handover"), "{r}");
}

/// `restart-node alpha-2`.
#[test]
fn new_connections_work_once_a_restarted_node_proxy_is_back() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    // A node proxy restart: new connections work once it is back.
    lab.run(&["restart-node", "alpha-2"]);
    let r = lab
        .send("sleep", "198.18.10.2:80", "after restart")
        .expect("served after the restart");
    assert!(
        r.starts_with("ledger-alpha port 8080") && r.contains("after restart"),
        "{r}"
    );
}

/// Someone deletes sleep's capture jump, then empties its chain, then edits a rule of it.
#[test]
fn removed_or_altered_capture_rules_are_rewritten_by_the_node_proxy() {
    let Some((lab, _one_at_a_time)) = CHANGING.one_at_a_time() else {
        return;
    };
    let redirect = "-p tcp -j REDIRECT --to-ports 15001";
    let rewritten = || {
        eventually(Duration::from_secs(15), || {
            lab.pod_nat("sleep", &["-C", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"])
                .is_some()
                && lab.pod_chain_has("sleep", "FERRY_OUT", redirect)
                && lab
                    .pod_nat("sleep", &["-S", "FERRY_OUT"])
                    .is_some_and(|s| !s.contains("15009"))
        })
    };
    // The jump removed: put back.
    assert!(
        lab.pod_nat("sleep", &["-D", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"])
            .is_some(),
        "rules were in place"
    );
    assert!(rewritten(), "the jump was not put back");
    // The chain emptied (the jump left in place): rewritten.
    assert!(lab.pod_nat("sleep", &["-F", "FERRY_OUT"]).is_some());
    assert!(!lab.pod_chain_has("sleep", "FERRY_OUT", redirect));
    assert!(rewritten(), "the flushed FERRY_OUT chain was not rewritten");
    // A rule of it edited to send traffic elsewhere: rewritten.
    assert!(
        lab.pod_nat(
            "sleep",
            &[
                "-R",
                "FERRY_OUT",
                "3",
                "-p",
                "tcp",
                "-j",
                "REDIRECT",
                "--to-ports",
                "15009"
            ]
        )
        .is_some()
    );
    assert!(rewritten(), "the edited FERRY_OUT chain was not rewritten");
    // The log line reaches the log through the writer thread, after the repair.
    let repairs = || {
        lab.log_lines("alpha-1")
            .into_iter()
            .filter(|l| l.has(&Text("capture rules were missing or altered; rewritten")))
            .count()
    };
    eventually(Duration::from_secs(10), || repairs() >= 3);
    let repairs = repairs();
    assert!(repairs >= 3, "{repairs} repairs logged");
    // Each found on the ruleset's change event (compared once it settled), none by the
    // safety check every 30 s (the lab's iptables is iptables-nft, whose events are heard).
    let by_check: Vec<_> = lab
        .log_lines("alpha-1")
        .into_iter()
        .filter(|l| {
            l.has(&Text("capture rules were missing or altered; rewritten"))
                && !l.has(&Field("capture.found_by", "event"))
        })
        .collect();
    assert!(
        by_check.is_empty(),
        "repairs not found by an event: {by_check:?}"
    );
    // And the pod's traffic is captured again.
    let r = lab
        .send("sleep", "198.18.10.2:80", "after repair")
        .expect("served after the repair");
    assert!(r.contains("after repair"), "{r}");
}

/// Its own lab: the control plane does not come back.
#[test]
fn the_node_keeps_serving_without_the_control_plane() {
    let Some(lab) = Lab::up_with(None, "fC") else {
        return;
    };
    // The control plane goes away: the node keeps serving its last good configuration.
    let control = lab.pids()[0];
    let _ = Command::new("kill").arg(control.to_string()).status();
    let r = lab
        .send("sleep", "198.18.10.2:80", "after")
        .expect("still served without the control plane");
    assert!(r.contains("after"), "{r}");
}

/// ledger-alpha's namespace deleted and added again. The new one is empty (no app, no link), so
/// this runs where no other scenario uses ledger-alpha: on [`SHORT_BOUNDS`].
#[test]
fn a_re_created_pod_namespace_is_served_again_rules_first() {
    let Some((lab, _one_at_a_time)) = SHORT_BOUNDS.one_at_a_time() else {
        return;
    };
    let dst = "alpha-2";
    // A pod's namespace deleted and created again under the same name, and the pod added again
    // as a runtime's CNI ADD does for a new sandbox: the node agent hands the new namespace over
    // and the node proxy serves it in place of the old one, rules first.
    let ns = lab.state(&["pods", "ledger-alpha", "netns"]);
    let ns = ns.as_str().unwrap();
    for args in [["netns", "del", ns], ["netns", "add", ns]] {
        assert!(Command::new("ip").args(args).status().unwrap().success());
    }
    lab.run(&["enroll", "ledger-alpha"]);
    let rules = || {
        Command::new("ip")
            .args(["netns", "exec", ns, "iptables", "-w", "-t", "nat"])
            .args(["-C", "OUTPUT", "-p", "tcp", "-j", "FERRY_OUT"])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(
        eventually(Duration::from_secs(15), rules),
        "no capture rules in the re-created namespace"
    );
    lab.log_line(
        dst,
        &[Text(
            "node agent adds a pod in a new network namespace: serving the new one",
        )],
    );
}

/// The destination's node proxy hands over, then the source's.
#[test]
fn held_connections_past_a_handover_drain_deadline_end_with_fin() {
    let Some((lab, _one_at_a_time)) = SHORT_BOUNDS.one_at_a_time() else {
        return;
    };
    let (src, dst) = ("alpha-1", "alpha-2");
    // Long-lived connections past a handover's drain deadline end with a FIN, never a reset:
    // the destination's node proxy handed over, then the source's.
    for node in [dst, src] {
        let ended = lab.hold_until("sleep", "198.18.2.20:8080", || {
            lab.run(&["handover", node]);
        });
        assert_eq!(
            ended.as_deref(),
            Some("closed"),
            "a connection held across the handover of {node}"
        );
        lab.log_line(
            node,
            &[Text(
                "drain deadline: ending the remaining connections with FIN",
            )],
        );
    }
}
