//! L4 in the mesh: same node, another node, a DENY on a port, out of the mesh, a nested VIP.

use crate::harness::Has::{Field, Starts, Text};
use crate::harness::MESH;

/// 2,000 bytes that show whether they arrive intact.
fn payload() -> String {
    (0..2000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect()
}

/// sleep (alpha-1) -> echo-alpha-1 (alpha-1).
#[test]
fn same_node_traffic_goes_in_hbone_with_the_source_identity_checked() {
    let Some(lab) = MESH.get() else { return };
    let payload = payload();
    // Same node: sleep (alpha-1) -> echo-alpha-1 (alpha-1), in HBONE, identity checked at B.
    let r = lab
        .send("sleep", "198.18.1.20:8080", &payload)
        .expect("same node");
    assert!(r.starts_with("echo-alpha-1 port 8080"), "{r}");
    assert!(r.ends_with(&payload), "bytes arrive intact");
    lab.log_line(
        "alpha-1",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            // ztunnel's meanings: the address the tunnel arrived at, the target it asked for.
            Field("dst.addr", "198.18.1.20:15008"),
            Field("dst.hbone_addr", "198.18.1.20:8080"),
            // The source workload, proven by its certificate and its address.
            Field("src.workload", "sleep"),
            Text("connection complete"),
        ],
    );
    lab.log_line(
        "alpha-1",
        &[
            Field("direction", "outbound"),
            // ztunnel's meanings: the address dialled, the target asked for in the tunnel.
            Field("dst.addr", "198.18.1.20:15008"),
            Field("dst.hbone_addr", "198.18.1.20:8080"),
            Field("path", "hbone"),
        ],
    );
}

/// sleep (alpha-1) -> echo-alpha-2 (alpha-2).
#[test]
fn traffic_to_another_node_arrives_intact_with_the_source_identity() {
    let Some(lab) = MESH.get() else { return };
    let payload = payload();
    // Another node.
    let r = lab
        .send("sleep", "198.18.2.20:8080", &payload)
        .expect("other node");
    assert!(
        r.starts_with("echo-alpha-2 port 8080") && r.ends_with(&payload),
        "{r}"
    );
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("dst.hbone_addr", "198.18.2.20:8080"),
            Text("connection complete"),
        ],
    );
}

/// sleep -> echo on 9090, denied at the destination.
#[test]
fn a_deny_on_port_9090_refuses_the_connection_and_the_log_names_the_policy() {
    let Some(lab) = MESH.get() else { return };
    // DENY for sleep -> echo on port 9090: refused at B, the log names the policy.
    let e = lab
        .send("sleep", "198.18.2.20:9090", "x")
        .expect_err("denied");
    assert!(e.contains("reset") || e.contains("refused"), "{e}");
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Field("dst.hbone_addr", "198.18.2.20:9090"),
            Text("denied by policy default/deny-admin-port"),
        ],
    );
    // Counted at the destination by the policy and rule that denied, and as a failed
    // connection with the DENY flag at both ends.
    let mut dst = String::new();
    let counted = crate::harness::eventually(std::time::Duration::from_secs(10), || {
        dst = lab.metrics("alpha-2", "198.19.254.11:15000");
        dst.lines().any(|l| {
            l.starts_with("ferry_policy_denied_total{reporter=\"destination\",policy=\"default/deny-admin-port\",rule=\"0\"} ")
        }) && dst.lines().any(|l| {
            l.starts_with("istio_tcp_connections_failed_total{reporter=\"destination\"")
                && l.contains("response_flags=\"DENY\"")
        })
    });
    assert!(counted, "no denial or failed connection counted:\n{dst}");
    // `ferry observe --verdict denied` finds the record at the hop that refused it, naming the
    // policy and rule, with the id its access-log line carries; allowed records are left out.
    let observe = |args: &[&str]| {
        let out = crate::harness::ferry()
            .args(["observe", "--lab", "--state-dir"])
            .arg(&lab.dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let denied = observe(&[
        "--verdict",
        "denied",
        "--to",
        "198.18.2.20:9090",
        "-o",
        "json",
    ]);
    let records: Vec<serde_json::Value> = denied
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect();
    let r = records
        .iter()
        .find(|r| r["component"] == "node/alpha-2" && r["direction"] == "inbound")
        .unwrap_or_else(|| panic!("no denied inbound record at alpha-2:\n{denied}"));
    assert_eq!(r["policy"], "default/deny-admin-port", "{r}");
    assert_eq!(r["rule"], "0", "{r}");
    assert_eq!(r["response_flags"], "DENY", "{r}");
    assert!(records.iter().all(|r| r["verdict"] == "denied"), "{denied}");
    let id = r["id"].as_str().expect("an id").to_string();
    lab.log_line(
        "alpha-2",
        &[Field("conn.id", &id), Field("direction", "inbound")],
    );
    let text = observe(&["--verdict", "denied", "--from", "sleep"]);
    assert!(
        text.lines().any(|l| l.contains("node/alpha-2 inbound")
            && l.contains("DENIED by policy default/deny-admin-port rule 0")),
        "{text}"
    );
}

/// sleep -> legacy (not in the mesh).
#[test]
fn traffic_out_of_the_mesh_is_plain_tcp_and_shows_the_real_source() {
    let Some(lab) = MESH.get() else { return };
    // Out of the mesh: plain TCP, the destination sees the real source.
    let r = lab
        .send("sleep", "198.18.3.90:8080", "x")
        .expect("passthrough");
    assert!(r.starts_with("legacy port 8080 saw 198.18.1.10:"), "{r}");
    lab.log_line(
        "alpha-1",
        &[
            Field("dst.addr", "198.18.3.90:8080"),
            Starts("path", "plain tcp"),
        ],
    );
}

/// A nested VIP: one tunnel, no second capture.
#[test]
fn a_service_whose_endpoint_is_a_local_vip_is_one_hop_to_the_pod() {
    let Some(lab) = MESH.get() else { return };
    // A multi-cluster service whose endpoint is alpha's own catalog VIP: one hop to the pod.
    let r = lab.send("sleep", "198.18.10.4:80", "x").expect("nested");
    assert!(r.starts_with("catalog-alpha port 8080"), "{r}");
    let line = lab.log_line(
        "alpha-1",
        &[
            Field("direction", "outbound"),
            Field("dst.addr", "198.18.2.40:15008"),
        ],
    );
    assert!(
        line.has(&Field("dst.hbone_addr", "198.18.2.40:8080")) && line.has(&Field("path", "hbone")),
        "one tunnel, to the pod: {line:?}"
    );
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Field("dst.hbone_addr", "198.18.2.40:8080"),
        ],
    );
    assert!(
        !lab.log_lines("alpha-2")
            .iter()
            .any(|l| l.has(&Field("direction", "outbound")) && l.has(&Text("198.18.10.3"))),
        "no second capture"
    );
}

/// `metric{labels} value` lines of one family in a metrics answer, by label set.
fn samples(metrics: &str, family: &str) -> std::collections::BTreeMap<String, u64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once("} ")?;
            Some((labels.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// sleep -> echo-alpha-2 on a port nothing listens on: the destination's dial to the pod fails.
/// The connection is counted closed under the labels it was opened with, and logged.
#[test]
fn a_failed_dial_to_the_pod_is_counted_closed_and_logged() {
    let Some((lab, _one_at_a_time)) = crate::harness::CHANGING.one_at_a_time() else {
        return;
    };
    lab.send("sleep", "198.18.2.20:7999", "x")
        .expect_err("nothing listens on 7999");
    lab.log_line(
        "alpha-2",
        &[
            Field("direction", "inbound"),
            Field("dst.hbone_addr", "198.18.2.20:7999"),
            Text("connection failed"),
        ],
    );
    let mut last = String::new();
    let balanced = crate::harness::eventually(std::time::Duration::from_secs(10), || {
        last = lab.metrics("alpha-2", "198.19.254.11:15000");
        let opened = samples(&last, "istio_tcp_connections_opened_total");
        let closed = samples(&last, "istio_tcp_connections_closed_total");
        !opened.is_empty()
            && opened
                .iter()
                .filter(|(l, _)| l.contains("reporter=\"destination\""))
                .all(|(l, n)| closed.get(l) == Some(n))
    });
    assert!(
        balanced,
        "every connection the destination opened is closed under the same labels:\n{last}"
    );
}

/// The label sets of `family` in a metrics answer, each as a map (values unescaped).
fn label_sets(metrics: &str, family: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    samples(metrics, family)
        .into_keys()
        .map(|set| {
            let mut labels = std::collections::BTreeMap::new();
            let mut rest = set.as_str();
            while let Some((name, after)) = rest.split_once("=\"") {
                let mut value = String::new();
                let mut chars = after.char_indices();
                let mut end = after.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next().map(|(_, c)| c)),
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                labels.insert(name.trim_start_matches(',').to_string(), value);
                rest = &after[end..];
            }
            labels
        })
        .collect()
}

/// sleep (alpha-1) -> echo-alpha-2 (alpha-2): the destination's metrics name the source
/// workload its certificate and address prove, with Istio's standard labels (what Kiali's graph
/// reads), and so do the source's.
#[test]
fn the_destination_s_metrics_name_the_proven_source_workload_with_istio_s_labels() {
    let Some(lab) = MESH.get() else { return };
    lab.send("sleep", "198.18.2.20:8080", "x")
        .expect("other node");
    let want = |reporter: &str| {
        [
            ("reporter", reporter.to_string()),
            ("source_workload", "sleep".into()),
            ("source_workload_namespace", "default".into()),
            (
                "source_principal",
                "spiffe://cluster.local/ns/default/sa/sleep".into(),
            ),
            ("source_canonical_service", "sleep".into()),
            ("source_canonical_revision", "latest".into()),
            ("source_app", "sleep".into()),
            ("source_version", "latest".into()),
            ("source_cluster", "alpha".into()),
            ("destination_workload", "echo-alpha-2".into()),
            ("destination_workload_namespace", "default".into()),
            ("destination_canonical_service", "echo".into()),
            ("destination_app", "echo".into()),
            ("destination_cluster", "alpha".into()),
            ("connection_security_policy", "mutual_tls".into()),
            ("request_protocol", "tcp".into()),
            ("response_flags", "-".into()),
        ]
    };
    for (node, admin, reporter) in [
        ("alpha-2", "198.19.254.11:15000", "destination"),
        ("alpha-1", "198.19.254.10:15000", "source"),
    ] {
        let mut last = String::new();
        let found = crate::harness::eventually(std::time::Duration::from_secs(10), || {
            last = lab.metrics(node, admin);
            label_sets(&last, "istio_tcp_connections_opened_total")
                .iter()
                .any(|l| {
                    want(reporter)
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v.as_str()))
                })
        });
        assert!(
            found,
            "no {reporter} series naming sleep and echo-alpha-2 with Istio's labels at {node}:\n{last}"
        );
    }
}
