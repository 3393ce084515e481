//! Table tests for the source address an app sees: no sockets, no runtime.

use super::*;
use crate::model::WaypointFor;
use crate::testing::{MeshBuilder, ip, waypoint_ref};

/// east (net-east): sleep 198.18.1.10, app 198.18.1.20 behind waypoint `wp` (instance
/// 198.18.1.50); west (net-west): sleep-west 198.19.1.10, gateway 198.19.255.1.
fn mesh() -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("east-1", "east", "r/z/s")
        .node("west-1", "west", "r/z/s");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.pod("app", "east-1", "198.18.1.20");
    m.pod("sleep-west", "west-1", "198.19.1.10");
    m.gateway("eastwest-west", "west", "198.19.255.1");
    m.waypoint("wp", WaypointFor::Workload);
    m.waypoint_pod("wp", "wp-1", "east-1", "198.18.1.50");
    m.workload_mut("app").waypoint = Some(waypoint_ref("wp"));
    m.build()
}

fn workload<'s>(snap: &'s Snapshot, name: &str) -> &'s Workload {
    snap.workloads().find(|w| w.name == name).expect("workload")
}

fn identity(snap: &Snapshot, name: &str) -> Identity {
    workload(snap, name).identity().expect("identity")
}

const APP: &str = "198.18.1.20";
/// An address outside the mesh (still in the benchmarking range).
const OUTSIDE: &str = "198.19.99.9";

/// A tunnel from `peer`'s certificate, over TCP from `peer_ip`, arriving on net-east.
fn tunnel<'a>(
    peer: &'a Identity,
    peer_ip: &str,
    forwarded: Option<&str>,
    network: &'a NetworkId,
) -> TunnelSource<'a> {
    TunnelSource {
        peer,
        peer_ip: ip(peer_ip),
        network,
        forwarded_for: forwarded.map(ip),
        forwarded_network: None,
    }
}

fn uses(ip_: &str, proof: Proof) -> AppSource {
    AppSource::Use { ip: ip(ip_), proof }
}

#[test]
fn a_tunnel_from_the_source_pods_own_address_is_delivered_from_it() {
    let snap = mesh();
    let (app, sleep) = (workload(&snap, "app"), identity(&snap, "sleep"));
    let east = NetworkId::new("net-east");
    let t = tunnel(&sleep, "198.18.1.10", None, &east);
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        uses("198.18.1.10", Proof::PeerAddress)
    );
    let t = tunnel(&sleep, "198.18.1.10", Some("198.18.1.10"), &east);
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        uses("198.18.1.10", Proof::Forwarded)
    );
}

#[test]
fn a_forged_forwarded_address_is_never_used() {
    let snap = mesh();
    let (app, sleep) = (workload(&snap, "app"), identity(&snap, "sleep"));
    let east = NetworkId::new("net-east");
    // sleep names app's own address, and an address outside the mesh: neither is sleep's. Its
    // own TCP address is proven, so that one is used.
    for forged in [APP, OUTSIDE, "198.18.1.50"] {
        let t = tunnel(&sleep, "198.18.1.10", Some(forged), &east);
        assert_eq!(
            for_destination(&snap, app, ip(APP), &t),
            uses("198.18.1.10", Proof::PeerAddress),
            "{forged}"
        );
    }
    // From an address that is not sleep's either: the pod's own address, and why.
    let t = tunnel(&sleep, "198.18.1.77", Some(APP), &east);
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        AppSource::Own(Unproven::NotThePeers {
            forwarded: Shown(Some(ip(APP))),
            peer_ip: ip("198.18.1.77"),
        })
    );
    // A waypoint's word is taken only for what it fronts: to app (behind wp) from wp yes, but
    // sleep is no waypoint of app, and a waypoint instance is nobody's source but its own.
    let wp = identity(&snap, "wp-1");
    let sleep_w = workload(&snap, "sleep");
    let t = tunnel(&wp, "198.18.1.50", Some(OUTSIDE), &east);
    assert_eq!(
        for_destination(&snap, sleep_w, ip("198.18.1.10"), &t),
        uses("198.18.1.50", Proof::PeerAddress)
    );
}

#[test]
fn double_hbone_uses_the_source_pods_address_on_its_network_never_the_gateways() {
    let snap = mesh();
    let app = workload(&snap, "app");
    let sleep_west = identity(&snap, "sleep-west");
    let east = NetworkId::new("net-east");
    // The inner tunnel arrives from the gateway's address; it forwards sleep-west's address
    // and network.
    let mut t = tunnel(&sleep_west, "198.19.255.1", Some("198.19.1.10"), &east);
    t.forwarded_network = Some("net-west");
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        uses("198.19.1.10", Proof::Forwarded)
    );
    // Without the network, the address is looked up on this hop's: not sleep-west's.
    t.forwarded_network = None;
    assert!(matches!(
        for_destination(&snap, app, ip(APP), &t),
        AppSource::Own(Unproven::NotThePeers { .. })
    ));
    // Another network claimed for sleep's east address, by sleep-west's identity: not its own.
    let mut t = tunnel(&sleep_west, "198.19.255.1", Some("198.18.1.10"), &east);
    t.forwarded_network = Some("net-east");
    assert!(for_destination(&snap, app, ip(APP), &t).ip().is_none());
}

#[test]
fn the_destinations_own_waypoint_forwards_the_original_client() {
    let snap = mesh();
    let app = workload(&snap, "app");
    let wp = identity(&snap, "wp-1");
    let east = NetworkId::new("net-east");
    for original in ["198.18.1.10", OUTSIDE] {
        let t = tunnel(&wp, "198.18.1.50", Some(original), &east);
        assert_eq!(
            for_destination(&snap, app, ip(APP), &t),
            uses(original, Proof::FromWaypoint)
        );
    }
    // Without a forwarded address: the waypoint itself is the source.
    let t = tunnel(&wp, "198.18.1.50", None, &east);
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        uses("198.18.1.50", Proof::PeerAddress)
    );
}

#[test]
fn a_waypoint_takes_a_relayed_address_only_from_the_landing_workloads_identity() {
    let snap = mesh();
    let app = workload(&snap, "app");
    let (app_id, sleep) = (identity(&snap, "app"), identity(&snap, "sleep"));
    let east = NetworkId::new("net-east");
    // app's node proxy relays plain TCP from outside the mesh to app's waypoint.
    let t = tunnel(&app_id, APP, Some(OUTSIDE), &east);
    assert_eq!(
        for_waypoint(Some(app), &snap, ip(APP), &t, true),
        uses(OUTSIDE, Proof::RelayedPlain)
    );
    // Not said to be relayed plain TCP: app's own address (proven), not the forwarded one.
    assert_eq!(
        for_waypoint(Some(app), &snap, ip(APP), &t, false),
        uses(APP, Proof::PeerAddress)
    );
    // Said by another identity: never.
    let t = tunnel(&sleep, "198.18.1.10", Some(OUTSIDE), &east);
    assert_eq!(
        for_waypoint(Some(app), &snap, ip(APP), &t, true),
        uses("198.18.1.10", Proof::PeerAddress)
    );
    // A source pod's tunnel to the waypoint: its forwarded address, proven.
    let t = tunnel(&sleep, "198.18.1.10", Some("198.18.1.10"), &east);
    assert_eq!(
        for_waypoint(None, &snap, ip(APP), &t, false),
        uses("198.18.1.10", Proof::Forwarded)
    );
}

#[test]
fn plain_tcp_uses_its_peer_unless_no_socket_can_take_it() {
    assert_eq!(
        for_plain(ip(OUTSIDE), ip(APP)),
        uses(OUTSIDE, Proof::PlainPeer)
    );
    for bad in [
        "127.0.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "2001:db8::1",
    ] {
        assert_eq!(
            for_plain(ip(bad), ip(APP)),
            AppSource::Own(Unproven::Unusable(ip(bad))),
            "{bad}"
        );
    }
    // A forwarded address of another family than the target's is not used either.
    let snap = mesh();
    let (app, wp) = (workload(&snap, "app"), identity(&snap, "wp-1"));
    let east = NetworkId::new("net-east");
    let t = tunnel(&wp, "198.18.1.50", Some("2001:db8::1"), &east);
    assert_eq!(
        for_destination(&snap, app, ip(APP), &t),
        uses("198.18.1.50", Proof::PeerAddress)
    );
}
