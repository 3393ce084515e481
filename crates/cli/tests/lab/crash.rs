//! A node proxy killed with SIGKILL: nothing goes around it while it is down, and it serves its
//! pods again from its node agent's replay. The longest scenario, on its own lab; its module sorts first so
//! that libtest, which starts tests in name order, starts it first and fits the others around it.

use std::time::Duration;

use crate::harness::Has::Text;
use crate::harness::{Lab, SHORT_BOUNDS_ARGS, eventually};

/// `stop-node --kill`, then `start-node`, node proxies as in [`crate::harness::SHORT_BOUNDS`].
#[test]
fn a_killed_node_proxy_lets_nothing_through_and_serves_again_from_its_node_agents_replay() {
    let Some(lab) = Lab::up_with_args(None, "fK", SHORT_BOUNDS_ARGS) else {
        return;
    };
    let (src, dst) = ("alpha-1", "alpha-2");
    // kill -9 of the source's node proxy: while it is down, the pod's connections are refused
    // and nothing reaches the destination around the proxy (its node proxy, which captures the
    // destination pod's inbound traffic, sees nothing from the pod).
    lab.run(&["stop-node", src, "--kill"]);
    let mark = lab.log(dst).len();
    for to in ["198.18.2.20:8080", "198.18.10.1:80", "198.18.3.90:8080"] {
        lab.send("sleep", to, "while down")
            .expect_err("no connection while the node proxy is down");
    }
    assert!(
        !lab.log(dst)[mark..].contains("198.18.1.10"),
        "traffic from sleep reached {dst} while its node proxy was down:\n{}",
        &lab.log(dst)[mark..]
    );
    // Restarted, it serves the pod again from its node agent's replay (ZDS), without
    // re-enrollment. Its own state file, the fallback were the agent away too, records the pod
    // by the path its namespace is mounted at and the namespace's identity.
    let state_file = lab.dir.join(format!("{src}.pods"));
    let pods = std::fs::read_to_string(&state_file).unwrap_or_default();
    assert!(
        pods.lines()
            .any(|l| l.contains("/Pod/default/sleep /var/run/netns/") && l.contains(" ns=")),
        "{pods}"
    );
    // Its capture chain emptied while it is down: a node proxy starting up rewrites it.
    assert!(lab.pod_nat("sleep", &["-F", "FERRY_OUT"]).is_some());
    lab.run(&["start-node", src]);
    assert!(
        eventually(Duration::from_secs(10), || lab.pod_chain_has(
            "sleep",
            "FERRY_OUT",
            "-p tcp -j REDIRECT --to-ports 15001"
        )),
        "the started node proxy did not rewrite the flushed chain"
    );
    let r = lab
        .send("sleep", "198.18.2.20:8080", "back")
        .expect("served again");
    assert!(r.contains("back"), "{r}");
    // Handed over by the agent twice: when the lab came up, and in its replay to the new process.
    let handed = lab
        .log_lines(src)
        .iter()
        .filter(|l| l.has(&Text("node agent adds a pod")) && l.has(&Text("/Pod/default/sleep")))
        .count();
    assert_eq!(handed, 2, "sleep's adds by the node agent in {src}.log");
    let admin = lab.state(&["nodes", src, "admin"]);
    let admin = admin.as_str().unwrap();
    let mut ready = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            ready = lab.admin_get(src, admin, "/ready");
            ready.starts_with("HTTP/1.1 200")
        }),
        "{ready}"
    );
    assert!(
        lab.metrics(src, admin).contains("ferry_pods_unserved 0"),
        "a pod is counted unserved"
    );
}
