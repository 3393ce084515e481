//! A killed pod (`ferry lab kill`: marked `healthy: false` in the lab's topology, applied by
//! every node proxy, then its app stopped) gets no new connection, and `ferry explain --lab`
//! says why; revived (`ferry lab revive`), it serves again. On its own lab (`rollout.yaml`, id
//! fF): it stops an app.

use std::time::Duration;

use crate::harness::{Lab, eventually, ferry};

/// web's VIP on rollout.yaml: web-1, web-2 and web-3 behind it, every healthy one eligible.
const VIP: &str = "198.18.10.1:80";

/// Which replica answered a connection to web.
fn answered_by(answer: &str) -> &'static str {
    ["web-1", "web-2", "web-3"]
        .into_iter()
        .find(|p| answer.starts_with(p))
        .unwrap_or_else(|| panic!("answered by no web replica: {answer}"))
}

/// `ferry lab <what> <pod>` on this lab; its output, which must have a line per step.
fn step(lab: &Lab, what: &str, pod: &str) -> String {
    let out = lab.output(&[what, pod]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ferry lab {what} {pod}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    stdout
}

/// web-1 is killed: every one of 60 new connections from sleep to web's VIP succeeds and none
/// lands on web-1, and `ferry explain --lab` drops web-1 as unhealthy. Revived, web-1 takes new
/// connections again. A pod that does not exist, or whose app is not running, is an error that
/// names it.
#[test]
fn a_killed_pod_gets_no_new_connection_and_serves_again_once_revived() {
    let Some(lab) = Lab::up_with(Some("rollout.yaml"), "fF") else {
        return;
    };
    let killed = step(&lab, "kill", "web-1");
    assert!(
        killed.contains("web-1: marked unhealthy, applied by every node proxy in"),
        "{killed}"
    );
    assert!(killed.contains("web-1: app stopped in"), "{killed}");

    const N: usize = 60;
    let counts = lab.count_answers("sleep", VIP, N, answered_by);
    eprintln!("new connections per replica with web-1 killed: {counts:?}");
    assert_eq!(counts.get("web-1"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), N);

    let out = ferry()
        .args(["explain", "--lab", "--state-dir"])
        .arg(&lab.dir)
        .args(["--from", "sleep", "--to", VIP])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ferry explain --lab: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let topology = lab.dir.join("topology.yaml");
    assert!(
        text.contains(&format!(
            "the running lab's topology ({})",
            topology.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("drop endpoint main//v1/Pod/default/web-1 (cluster main): unhealthy"),
        "{text}"
    );

    for (what, pod, error) in [
        ("kill", "web-9", "no pod web-9 in the lab"),
        ("kill", "web-1", "pod web-1 has no running app"),
        ("revive", "web-2", "pod web-2's app is already running"),
    ] {
        let out = lab.output(&[what, pod]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "ferry lab {what} {pod}: {stderr}"
        );
        assert!(stderr.contains(error), "ferry lab {what} {pod}: {stderr}");
    }

    let revived = step(&lab, "revive", "web-1");
    assert!(
        revived.contains("web-1: app started, answering after"),
        "{revived}"
    );
    assert!(
        revived.contains("web-1: marked healthy, applied by every node proxy in"),
        "{revived}"
    );
    assert!(
        eventually(Duration::from_secs(10), || lab
            .send("sleep", VIP, "back\n")
            .is_ok_and(|a| answered_by(&a) == "web-1")),
        "web-1 takes no new connection after it was revived"
    );
}
