//! Crafted tunnels straight to a waypoint (origin claims), and the waypoint's admin endpoints.

use crate::harness::Has::{Field, Text};
use crate::harness::MESH;

/// For catalog, local to each cluster (only alpha has a pod).
#[test]
fn a_crafted_tunnel_claiming_a_source_in_beta_is_refused_and_one_from_alpha_is_carried() {
    let Some(lab) = MESH.get() else { return };
    // A crafted tunnel straight to beta's waypoint claiming a source in beta, for catalog (local
    // to each cluster, only alpha has a pod): whatever the hop before decided, the waypoint
    // refuses and logs it. The same tunnel for a source in alpha is carried.
    let legacy_ns = {
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(lab.dir.join("lab.json")).unwrap())
                .unwrap();
        state["pods"]["legacy"]["netns"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let craft = |cluster: &str| {
        lab.craft(
            "alpha-1",
            "alpha-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.18.3.50:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/default/sa/audit-waypoint",
                "--authority",
                "198.18.10.3:80",
                "--dial-netns",
                &legacy_ns,
                "--cluster",
                cluster,
            ],
        )
    };
    let refused = craft("beta");
    assert!(
        refused.contains("refused") && refused.contains("503"),
        "{refused}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint refused the connection"),
            Field("origin.cluster", "beta"),
            Field("dst.addr", "198.18.10.3:80"),
            Text("no endpoint is eligible for a source in cluster beta"),
        ],
    );
    let carried = craft("alpha");
    assert!(carried.contains("status 200"), "{carried}");
}

/// From sleep's own address with sleep's identity, claiming beta.
#[test]
fn a_tunnel_claiming_another_cluster_than_its_source_is_refused_and_counted() {
    let Some(lab) = MESH.get() else { return };
    // Where the waypoint can check the claim, it does: a tunnel from sleep's own address with
    // sleep's identity that claims a source in beta is refused (401) and counted.
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let forged = lab.craft(
        "alpha-1",
        "alpha-1",
        &[
            "--identity",
            "spiffe://cluster.local/ns/default/sa/sleep",
            "--to",
            "198.18.3.50:15008",
            "--peer-identity",
            "spiffe://cluster.local/ns/default/sa/audit-waypoint",
            "--authority",
            "198.18.10.6:80",
            "--dial-netns",
            sleep_ns.as_str().unwrap(),
            "--cluster",
            "beta",
        ],
    );
    assert!(
        forged.contains("refused") && forged.contains("401"),
        "{forged}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint refused the connection"),
            Text("the tunnel claims a source in cluster beta, but it comes from alpha//v1/Pod/default/sleep in cluster alpha"),
        ],
    );
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    let refused_total: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ferry_waypoint_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused_total >= 1, "the refusal is not counted:\n{m}");
}

/// config_dump and certs.
#[test]
fn the_waypoint_serves_the_node_admin_endpoints_without_private_keys() {
    let Some(lab) = MESH.get() else { return };
    // The same admin endpoints as a node proxy: its identity and its certificate (no keys).
    let dump = lab.admin_get("audit-waypoint-beta", "198.18.3.50:15020", "/config_dump");
    assert!(
        dump.contains("\"identity\":\"spiffe://cluster.local/ns/default/sa/audit-waypoint\"")
            && dump.contains("\"state\":\"ready\"")
            && !dump.contains("PRIVATE KEY"),
        "{dump}"
    );
    let certs = lab.admin_get("beta-1", "198.19.254.12:15000", "/certs");
    assert!(
        certs.contains("\"state\":\"ready\"") && !certs.contains("PRIVATE KEY"),
        "{certs}"
    );
}

/// To echo-beta's pod address (no waypoint), and to shop (fronted by audit-waypoint).
#[test]
fn a_crafted_tunnel_for_a_target_the_waypoint_does_not_front_is_refused_and_counted() {
    let Some(lab) = MESH.get() else { return };
    // A crafted tunnel straight to beta's waypoint for a pod address it does not front (echo has
    // no waypoint): the waypoint is no open relay, whatever the claim. For shop, which it
    // fronts, the same tunnel is carried.
    let legacy_ns = lab.state(&["pods", "legacy", "netns"]);
    let craft = |authority: &str| {
        lab.craft(
            "alpha-1",
            "alpha-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.18.3.50:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/default/sa/audit-waypoint",
                "--authority",
                authority,
                "--dial-netns",
                legacy_ns.as_str().unwrap(),
                "--cluster",
                "beta",
            ],
        )
    };
    let refused = craft("198.18.3.20:8080");
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint refused the connection"),
            Field("dst.addr", "198.18.3.20:8080"),
            Text("is not served by this waypoint"),
        ],
    );
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    let refused_total: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ferry_waypoint_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused_total >= 1, "the refusal is not counted:\n{m}");
    let carried = craft("198.18.10.6:80");
    assert!(carried.contains("status 200"), "{carried}");
}
