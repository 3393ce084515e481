//! Crafted tunnels straight to a waypoint (origin claims), and the waypoint's admin endpoints.

use crate::harness::Has::{Field, Text};
use crate::harness::MESH;

/// For audit, local to each cluster, fronted by audit-waypoint (whose instance in alpha is down).
#[test]
fn a_crafted_tunnel_is_decided_for_the_cluster_its_certificate_proves_and_the_claim_is_only_logged()
{
    let Some(lab) = MESH.get() else { return };
    // A crafted tunnel straight to beta's waypoint instance for audit (local to each cluster).
    // The waypoint decides for the cluster the certificate proves, never the one the baggage
    // claims (issue 20: this test asserted, before, that a claim was believed): alpha's
    // certificate claiming beta is refused, since beta's instance is out of scope for an alpha
    // source of a local service; beta's certificate claiming alpha is carried.
    let legacy_ns = lab.state(&["pods", "legacy", "netns"]);
    let craft = |node: &str, identity: &str, cluster: &str| {
        lab.craft(
            node,
            node,
            &[
                "--identity",
                identity,
                "--to",
                "198.18.3.50:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/default/sa/audit-waypoint",
                "--authority",
                "198.18.10.5:80",
                "--dial-netns",
                legacy_ns.as_str().unwrap(),
                "--cluster",
                cluster,
            ],
        )
    };
    let refused = craft(
        "alpha-1",
        "spiffe://cluster.local/ns/default/sa/sleep",
        "beta",
    );
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("waypoint refused the connection"),
            Field("src.cluster", "alpha"),
            Field("dst.addr", "198.18.10.5:80"),
            Text("is out of scope for"),
        ],
    );
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("the baggage claims another cluster than the certificate proves"),
            Field("origin.cluster", "alpha"),
            Field("claimed.cluster", "beta"),
        ],
    );
    let m = lab.metrics("audit-waypoint-beta", "198.18.3.50:15020");
    let refused_total: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ferry_waypoint_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused_total >= 1, "the refusal is not counted:\n{m}");
    // beta's certificate claiming alpha: decided for beta, carried to audit-beta.
    let carried = craft(
        "beta-1",
        "spiffe://cluster.local/ns/default/sa/echo",
        "alpha",
    );
    assert!(carried.contains("status 200"), "{carried}");
}

/// From sleep's own address with sleep's identity, claiming beta.
#[test]
fn a_tunnel_claiming_another_cluster_than_its_certificate_is_decided_for_the_certificates() {
    let Some(lab) = MESH.get() else { return };
    // sleep's certificate (alpha) claiming a source in beta, for shop (global, behind this
    // waypoint): the claim changes nothing, the tunnel is carried for alpha and the claim is
    // logged (issue 20: before, the waypoint refused it with 401 because the claim contradicted
    // the peer's address; the certificate now says which cluster it is, wherever it dials from).
    let sleep_ns = lab.state(&["pods", "sleep", "netns"]);
    let carried = lab.craft(
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
    assert!(carried.contains("status 200"), "{carried}");
    lab.log_line(
        "waypoint-audit-waypoint-beta",
        &[
            Text("the baggage claims another cluster than the certificate proves"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("origin.cluster", "alpha"),
            Field("claimed.cluster", "beta"),
        ],
    );
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

/// The credentials the lab hands its node proxies and gateways.
#[test]
fn the_labs_credentials_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let Some(lab) = MESH.get() else { return };
    let tokens: Vec<_> = std::fs::read_dir(&lab.dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "token"))
        .collect();
    // (Gateways' tokens are written the same way; this lab has none.)
    assert!(
        tokens.iter().any(|p| p.ends_with("alpha-1.token")),
        "{tokens:?}"
    );
    for t in tokens {
        let mode = std::fs::metadata(&t).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:o}", t.display());
    }
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
