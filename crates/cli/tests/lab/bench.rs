//! `ferry lab bench`'s arms cross what they say: the direct arm no node proxy at either end
//! (both node proxies' connection counters stay flat while it runs, and its packets reach the
//! destination pod on the uncaptured port), the Ferry arm both. On its own lab (id fB): it
//! counts every connection the two node proxies open.

use std::collections::BTreeMap;

use crate::harness::{Lab, ferry};

/// `istio_tcp_connections_opened_total`, summed over its label sets, at each node proxy.
fn opened(lab: &Lab) -> BTreeMap<&'static str, u64> {
    ["alpha-1", "alpha-2"]
        .into_iter()
        .map(|node| {
            let admin = lab.state(&["nodes", node, "admin"]);
            let scrape = lab.metrics(node, admin.as_str().unwrap());
            assert!(scrape.starts_with("HTTP/1.1 200"), "{node}: {scrape}");
            let n = scrape
                .lines()
                .filter(|l| l.starts_with("istio_tcp_connections_opened_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            (node, n as u64)
        })
        .collect()
}

/// The CPUs every thread of `pid` may run on, as `/proc` lists them.
fn cpus(pid: u64) -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.ok()?.path().join("status")).ok()?;
            status
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(str::to_string)
        })
        .collect();
    all.sort();
    all.dedup();
    all
}

/// Runs `ferry lab bench` sleep -> echo-alpha-2 with small sizes and `flags`; returns its JSON.
fn bench(lab: &Lab, flags: &[&str]) -> serde_json::Value {
    let json = lab.dir.join("bench-test.json");
    let out = ferry()
        .args(["lab", "bench", "--bulk-mib", "4", "--round-trips", "50"])
        .args(["--conns", "20", "--idle", "0", "--json"])
        .arg(&json)
        .args(flags)
        .arg("--state-dir")
        .arg(&lab.dir)
        .args(["--id", &lab.id])
        .output()
        .unwrap();
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{report}");
    assert!(out.status.success(), "ferry lab bench {flags:?}: {report}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn the_direct_arm_crosses_no_node_proxy_and_the_ferry_arm_both() {
    let Some(lab) = Lab::up_with(None, "fB") else {
        return;
    };
    // The direct arm: neither node proxy opens a connection, and its packets reach the pod's
    // app on the port left out of capture.
    let probe = lab.probe("echo-alpha-2", 18080);
    let before = opened(&lab);
    let direct = bench(&lab, &["--arms", "direct"]);
    assert_eq!(
        opened(&lab),
        before,
        "the direct arm moved a node proxy's counter"
    );
    assert!(probe.packets() > 0, "nothing reached echo-alpha-2:18080");
    let arm = &direct["arms"]["direct"];
    for node in ["alpha-1", "alpha-2"] {
        assert_eq!(arm["proxy_connections_opened"][node], 0, "{direct}");
    }
    assert!(
        arm["bulk"]["gbit_per_s"].as_f64().unwrap() > 0.0,
        "{direct}"
    );
    assert!(arm["crosses"].as_str().unwrap().contains("no proxy"));
    // The Ferry arm, pinned: both node proxies open every one of its connections, their CPU is
    // counted, and their affinity is given back after.
    let pids: Vec<u64> = ["alpha-1", "alpha-2"]
        .iter()
        .map(|n| lab.state(&["nodes", n, "pid"]).as_u64().unwrap())
        .collect();
    let affinity: Vec<Vec<String>> = pids.iter().map(|p| cpus(*p)).collect();
    let before = opened(&lab);
    let through = bench(&lab, &["--arms", "ferry", "--pinned"]);
    let after = opened(&lab);
    let arm = &through["arms"]["ferry"];
    for node in ["alpha-1", "alpha-2"] {
        // 20 new connections, plus the bulk and the two round-trip connections.
        assert!(
            after[node] >= before[node] + 23,
            "{node}: {before:?} -> {after:?}"
        );
        assert!(
            arm["proxy_connections_opened"][node].as_u64().unwrap() >= 23,
            "{through}"
        );
    }
    assert!(
        arm["conns"]["proxy_cpu_us_per_conn"].as_f64().unwrap() > 0.0,
        "{through}"
    );
    assert_eq!(through["pinned_cpu"], 0);
    let now: Vec<Vec<String>> = pids.iter().map(|p| cpus(*p)).collect();
    assert_eq!(now, affinity, "the node proxies' affinity is given back");
}
