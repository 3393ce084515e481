//! Graduated failover and waypoints chosen by what they reach, in the lab (`failover.yaml`, id
//! fG): pods are killed with `ferry lab kill` (marked unhealthy everywhere, then stopped) and
//! brought back with `ferry lab revive`; new connections are counted by the pod that answers.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::{Has, Lab, eventually, ferry};

/// `spill`: failover by zone with a minimum of 2 usable endpoints per tier.
const SPILL: &str = "198.18.10.1:80";
/// `web`: behind waypoint `web-wp` (wp-a in z1 beside the client, wp-b in z2).
const WEB: &str = "198.18.10.2:80";

const PODS: &[&str] = &[
    "spill-a1", "spill-a2", "spill-a3", "spill-b1", "spill-b2", "web-a1", "web-a2", "web-b1",
];

fn answered_by(answer: &str) -> &'static str {
    PODS.iter()
        .copied()
        .find(|p| answer.starts_with(p))
        .unwrap_or_else(|| panic!("answered by no pod of the example: {answer}"))
}

fn step(lab: &Lab, what: &str, pod: &str) {
    let out = lab.output(&[what, pod]);
    assert!(
        out.status.success(),
        "ferry lab {what} {pod}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ferry lab count sleep <to> -n <n>`: the answers by pod; every connection must succeed.
fn count(lab: &Lab, to: &str, n: usize) -> BTreeMap<String, usize> {
    let out = lab.output(&["count", "sleep", to, "-n", &n.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ferry lab count: {text}");
    let mut counts: BTreeMap<String, usize> = text
        .lines()
        .filter_map(|l| {
            let (pod, c) = l.split_once(' ')?;
            Some((pod.to_string(), c.parse().ok()?))
        })
        .collect();
    assert_eq!(counts.remove("failed"), Some(0), "{text}");
    assert_eq!(counts.values().sum::<usize>(), n, "{text}");
    counts
}

fn near<K: AsRef<str>>(counts: &BTreeMap<K, usize>, prefix: &str) -> usize {
    counts
        .iter()
        .filter(|(k, _)| k.as_ref().starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

fn explain(lab: &Lab, to: &str) -> String {
    let out = ferry()
        .args(["explain", "--lab", "--state-dir"])
        .arg(&lab.dir)
        .args(["--from", "sleep", "--to", to])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ferry explain --lab: {text}");
    text
}

/// With all but one of the near tier's three killed and a minimum of 2, half of the new
/// connections spill to the next zone (each tier within wide bounds of its share), none lands
/// on a killed pod; revived, every connection stays near again.
#[test]
fn below_its_minimum_the_near_zone_spills_half_and_takes_it_back_when_restored() {
    let Some(lab) = Lab::up_with(Some("failover.yaml"), "fG") else {
        return;
    };
    const N: usize = 200;
    let all = lab.count_answers("sleep", SPILL, 40, answered_by);
    assert_eq!(near(&all, "spill-a"), 40, "all alive, all near: {all:?}");

    step(&lab, "kill", "spill-a1");
    step(&lab, "kill", "spill-a2");
    let counts = count(&lab, SPILL, N);
    eprintln!("spill with 1 of 2 usable near: {counts:?}");
    assert_eq!(counts.get("spill-a1"), None, "{counts:?}");
    assert_eq!(counts.get("spill-a2"), None, "{counts:?}");
    // Half stays near (binomial, 200 draws: the bounds are about 5 standard deviations).
    let stayed = near(&counts, "spill-a3");
    assert!((65..=135).contains(&stayed), "{counts:?}");
    assert_eq!(near(&counts, "spill-b"), N - stayed, "{counts:?}");
    let text = explain(&lab, SPILL);
    assert!(
        text.contains("1 usable, 50.0% of new connections; tier sharing 1 preference(s): 2 usable, 50.0% of new connections"),
        "{text}"
    );

    step(&lab, "revive", "spill-a1");
    step(&lab, "revive", "spill-a2");
    let back = count(&lab, SPILL, 100);
    assert_eq!(
        near(&back, "spill-a"),
        100,
        "restored, all near again: {back:?}"
    );

    // A waypoint near dead backends: the far one, in front of live ones, takes every connection.
    step(&lab, "kill", "web-a1");
    step(&lab, "kill", "web-a2");
    let counts = lab.count_answers("sleep", WEB, 30, answered_by);
    assert_eq!(counts.get("web-b1"), Some(&30), "{counts:?}");
    let tunnels = |wp: &str| {
        lab.log_lines("main-a")
            .iter()
            .filter(|l| l.has(&Has::Field("dst.addr", wp)))
            .count()
    };
    eprintln!(
        "{}",
        lab.log("main-a")
            .lines()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The last access line is written as its connection closes, about when `lab send` exits.
    eventually(Duration::from_secs(10), || {
        tunnels("198.18.2.50:15008") >= 30
    });
    let (to_a, to_b) = (tunnels("198.18.1.50:15008"), tunnels("198.18.2.50:15008"));
    assert!(
        to_b >= 30 && to_a == 0,
        "tunnels to wp-a {to_a}, to wp-b {to_b}"
    );
    let text = explain(&lab, WEB);
    assert!(
        text.contains("drop waypoint endpoint main//v1/Pod/default/wp-a (cluster main): in front of dead backends: the endpoints of default/web.default.svc.cluster.local in its zone are all down"),
        "{text}"
    );
    assert!(
        text.contains("pick       waypoint endpoint main//v1/Pod/default/wp-b"),
        "{text}"
    );

    step(&lab, "revive", "web-a1");
    assert!(
        eventually(Duration::from_secs(10), || {
            lab.send("sleep", WEB, "back\n").is_ok() && tunnels("198.18.1.50:15008") > 0
        }),
        "the near waypoint takes no connection once a backend near it is back"
    );
}
