//! Two networks that meet only through their gateways, and pods with the same address on both.

use crate::harness::Has::{Field, Text};
use crate::harness::{Lab, Shared};

pub(crate) static NETWORKS: Shared = Shared::new(Some("two-clusters.yaml"), "fU", &[]);

/// sleep-east -> search (pods only in west): double HBONE.
#[test]
fn a_global_service_across_networks_goes_through_the_gateway_with_the_original_identity() {
    let Some(lab) = NETWORKS.get() else { return };
    // A global service with pods only in west, from east: double HBONE through west's gateway.
    let r = lab
        .send("sleep-east", "198.18.10.5:80", "across")
        .expect("through the gateway");
    assert!(
        r.starts_with("search-west-1 port 7070") && r.contains("across"),
        "{r}"
    );
    // The destination's node proxy sees the original identity, not the gateway's.
    lab.log_line(
        "west-2",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("dst.hbone_addr", "search.default.svc.cluster.local:80"),
        ],
    );
    lab.log_line(
        "gateway-eastwest-west",
        &[
            Field("direction", "gateway"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("dst.addr", "search.default.svc.cluster.local:80"),
            Text("connection complete"),
        ],
    );
    // Metrics on the destination side label where the connection came from.
    let m = lab.metrics("west-2", "198.19.254.13:15000");
    assert!(
        m.lines()
            .any(|l| l.starts_with("istio_tcp_connections_opened_total")
                && l.contains("source_cluster=\"east\",source_network=\"net-east\"")
                && l.contains("destination_workload=\"search-west-1\"")
                && l.contains("destination_network=\"net-west\"")),
        "{m}"
    );
}

/// From an east identity, straight to west's gateway.
#[test]
fn the_gateway_refuses_a_crafted_tunnel_for_a_cluster_local_service_and_carries_a_global_one() {
    let Some(lab) = NETWORKS.get() else { return };
    // A crafted request straight to west's gateway for ledger, local to each cluster, from an
    // east identity: refused at the gateway (and counted in its log). The same request for the
    // global service passes.
    let craft = |authority: &str| {
        lab.craft(
            "eastwest-east",
            "east-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.19.255.1:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/istio-system/sa/eastwest-west",
                "--cluster",
                "east",
                "--authority",
                authority,
            ],
        )
    };
    let refused = craft("ledger.default.svc.cluster.local:80");
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "gateway-eastwest-west",
        &[
            Text("gateway refused the connection"),
            Field("dst.addr", "ledger.default.svc.cluster.local:80"),
        ],
    );
    let allowed = craft("search.default.svc.cluster.local:80");
    assert!(allowed.contains("status 200"), "{allowed}");
}

/// From a west identity, straight to east's gateway, claiming east (the baggage is the caller's
/// word; the certificate is the CA's).
#[test]
fn a_west_certificate_claiming_east_is_refused_at_east_gateway_and_nothing_reaches_the_pod() {
    let Some(lab) = NETWORKS.get() else { return };
    let craft = |authority: &str, claim: &str| {
        lab.craft(
            "eastwest-west",
            "west-1",
            &[
                "--identity",
                "spiffe://cluster.local/ns/default/sa/sleep",
                "--to",
                "198.18.255.1:15008",
                "--peer-identity",
                "spiffe://cluster.local/ns/istio-system/sa/eastwest-east",
                "--cluster",
                claim,
                "--authority",
                authority,
            ],
        )
    };
    let ledger = lab.probe("ledger-east-1", 9080);
    // The attack: a certificate west's node proxy holds, claiming east, for ledger
    // (local to each cluster). Refused at the gateway, which decides for west.
    let refused = craft("ledger.default.svc.cluster.local:80", "east");
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "gateway-eastwest-east",
        &[
            Text("the baggage claims another cluster than the certificate proves"),
            Field("origin.cluster", "west"),
            Field("claimed.cluster", "east"),
        ],
    );
    lab.log_line(
        "gateway-eastwest-east",
        &[
            Text("gateway refused the connection"),
            Field("dst.addr", "ledger.default.svc.cluster.local:80"),
        ],
    );
    assert_eq!(ledger.packets(), 0, "a packet reached ledger-east-1's app");
    // For a global service the same tunnels pass, the claim true or not.
    for claim in ["east", "west"] {
        let allowed = craft("echo.default.svc.cluster.local:80", claim);
        assert!(
            allowed.contains("status 200"),
            "claiming {claim}: {allowed}"
        );
    }
}

/// No way around the gateway.
#[test]
fn a_pod_address_of_another_network_is_unreachable() {
    let Some(lab) = NETWORKS.get() else { return };
    // A west pod's address means nothing on east's network: no way around the gateway.
    assert!(
        lab.send("sleep-east", "198.19.2.70:7070", "x").is_err(),
        "networks are separate"
    );
}

/// sleep-west -> ledger in west.
#[test]
fn same_network_traffic_in_each_cluster_works_as_before() {
    let Some(lab) = NETWORKS.get() else { return };
    // Same-network traffic in each cluster still works as before.
    let r = lab
        .send("sleep-west", "198.19.10.2:80", "local")
        .expect("ledger in west");
    assert!(r.starts_with("ledger-west-1"), "{r}");
}

/// Its own lab (overlap.yaml).
#[test]
fn pods_with_the_same_address_on_two_networks_are_never_confused() {
    let Some(lab) = Lab::up_with(Some("overlap.yaml"), "fV") else {
        return;
    };
    // 198.18.1.20 is app-east on east's network and hello-west on west's.
    let r = lab
        .send("sleep-east", "198.18.1.20:8080", "x")
        .expect("east's own pod");
    assert!(r.starts_with("app-east port 8080"), "{r}");
    let r = lab
        .send("sleep-east", "198.18.10.1:80", "x")
        .expect("west's pod through the gateway");
    assert!(r.starts_with("hello-west port 8080"), "{r}");
    let r = lab
        .send("sleep-west", "198.18.1.20:8080", "x")
        .expect("west's own pod");
    assert!(r.starts_with("hello-west port 8080"), "{r}");
    lab.log_line(
        "gateway-gw-west",
        &[
            Field("direction", "gateway"),
            Field("dst.addr", "hello.default.svc.cluster.local:80"),
            Text("connection"),
        ],
    );
}

/// A waypoint whose service has pods only on another network (waypoint-across-networks.yaml).
static ACROSS: Shared = Shared::new(Some("waypoint-across-networks.yaml"), "fW", &[]);

/// sleep-east -> search (waypoint in both clusters, pods only in west).
#[test]
fn a_waypoint_sends_to_another_network_through_its_gateway_which_checks_scope_again() {
    let Some(lab) = ACROSS.get() else { return };
    const WAYPOINT: &str = "spiffe://cluster.local/ns/default/sa/search-waypoint";
    // Bytes: the east waypoint instance decides again and sends through west's gateway.
    let r = lab
        .send("sleep-east", "198.18.10.5:80", "across")
        .expect("through the waypoint and the gateway");
    assert!(
        r.starts_with("search-west-1 port 7070") && r.contains("across"),
        "{r}"
    );
    // The gateway carried the waypoint's tunnel to the pod, not back to the west waypoint.
    lab.log_line(
        "gateway-eastwest-west",
        &[
            Field("direction", "gateway"),
            Field("src.identity", WAYPOINT),
            Field("dst.addr", "search.default.svc.cluster.local:80"),
            Text("connection complete"),
        ],
    );
    lab.log_line(
        "west-1",
        &[
            Field("direction", "inbound"),
            Field("src.identity", WAYPOINT),
            Field("dst.hbone_addr", "search.default.svc.cluster.local:80"),
        ],
    );
    // HTTP: each request routed by the waypoint, through the gateway too.
    let r = lab
        .send(
            "sleep-east",
            "198.18.10.5:8081",
            "GET /across HTTP/1.1\r\nhost: search\r\n\r\n",
        )
        .expect("HTTP through the waypoint and the gateway");
    assert!(
        r.contains("200") && r.contains("search-west-1 http GET /across"),
        "{r}"
    );
    // Scope is the gateway's to check again: a tunnel from the waypoint's identity that claims
    // an east source, for a service local to west, is refused there.
    let refused = lab.craft(
        "eastwest-east",
        "east-1",
        &[
            "--identity",
            WAYPOINT,
            "--to",
            "198.19.255.1:15008",
            "--peer-identity",
            "spiffe://cluster.local/ns/istio-system/sa/eastwest-west",
            "--cluster",
            "east",
            "--authority",
            "ledger.default.svc.cluster.local:80",
        ],
    );
    assert!(
        refused.contains("refused") && refused.contains("401"),
        "{refused}"
    );
    lab.log_line(
        "gateway-eastwest-west",
        &[
            Text("gateway refused the connection"),
            Field("src.identity", WAYPOINT),
            Field("dst.addr", "ledger.default.svc.cluster.local:80"),
        ],
    );
}

/// `ferry trace` through a waypoint and an east-west gateway: the source node proxy, the east
/// waypoint instance, west's gateway and west's node proxy each record the connection under one
/// trace id, printed in that order.
#[test]
fn ferry_trace_joins_the_hops_through_a_waypoint_and_a_gateway() {
    let Some(lab) = ACROSS.get() else { return };
    let (_, hops) = lab.traced_hops("sleep-east", "198.18.10.5:80");
    assert_eq!(
        hops,
        [
            "node/east-1 outbound",
            "waypoint/search-waypoint-east waypoint",
            "gateway/eastwest-west gateway",
            "node/west-1 inbound",
        ],
        "{hops:?}"
    );
}
