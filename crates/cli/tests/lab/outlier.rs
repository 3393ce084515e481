//! Passive health in the lab: a pod whose HBONE port refuses is ejected from picks after
//! `--outlier-consecutive-failures` connects in a row fail, and comes back once its ejection
//! is over. On a lab of its own (its node proxies take short outlier settings).

use std::time::Duration;

use crate::harness::Has::{Field, Text};
use crate::harness::{Lab, eventually};

const ARGS: &[&str] = &[
    "--outlier-consecutive-failures=3",
    // Long enough for every check below to run while it is ejected, on a loaded machine.
    "--outlier-base-ejection-seconds=20",
];

/// A counter or gauge of alpha-1 (the node of `sleep` and `echo-alpha-1`).
fn metric(lab: &Lab, name: &str) -> u64 {
    let admin = lab.state(&["nodes", "alpha-1", "admin"]);
    let m = lab.metrics("alpha-1", admin.as_str().unwrap());
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{m}"))
}

/// sleep -> echo (global, prefer_close): echo-alpha-1, the closest, refuses. The first three
/// connections try it, then echo-alpha-2 (three retries); then it is ejected and the rest go
/// to echo-alpha-2 at once (no more retries). Open again, it serves again once its 20 s are over.
#[test]
fn an_endpoint_whose_connects_keep_failing_is_ejected_then_comes_back() {
    let Some(lab) = Lab::up_with_args(None, "fE", ARGS) else {
        return;
    };
    const VIP: &str = "198.18.10.1:80";
    // (No connection before the refusal: a pooled tunnel to echo-alpha-1 would send to the
    // port the refusal counts. That echo-alpha-1 is the closest shows at the end.)
    let retries = metric(&lab, "ferry_connect_retries_total");
    let refused = lab.refuse("echo-alpha-1", 15008);
    const N: usize = 10;
    for i in 0..N {
        let a = lab
            .send("sleep", VIP, "eject\n")
            .unwrap_or_else(|e| panic!("connection {i} failed: {e}"));
        assert!(a.contains("echo-alpha-2"), "connection {i}: {a}");
    }
    assert_eq!(
        metric(&lab, "ferry_connect_retries_total") - retries,
        3,
        "only the connections before the ejection were retried"
    );
    assert_eq!(metric(&lab, "ferry_outlier_ejections_total"), 1);
    assert_eq!(metric(&lab, "ferry_outlier_ejected"), 1);
    assert!(refused.packets() >= 3);
    let admin = lab.state(&["nodes", "alpha-1", "admin"]);
    let answer = lab.admin_get("alpha-1", admin.as_str().unwrap(), "/config_dump");
    // The body, after the response's head.
    let body = answer.split_once("\r\n\r\n").map_or(&*answer, |(_, b)| b);
    let dump: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(
        dump["outlier_detection"]["ejected"],
        serde_json::json!(["alpha//v1/Pod/default/echo-alpha-1"]),
        "{dump}"
    );
    lab.log_line(
        "alpha-1",
        &[
            Text("outlier detection: endpoint ejected"),
            Field("dst.workload", "alpha//v1/Pod/default/echo-alpha-1"),
        ],
    );
    drop(refused);
    assert!(
        eventually(Duration::from_secs(40), || lab
            .send("sleep", VIP, "back\n")
            .is_ok_and(|a| a.contains("echo-alpha-1"))),
        "echo-alpha-1 does not serve again once its ejection is over"
    );
    assert_eq!(metric(&lab, "ferry_outlier_ejected"), 0);
}
