//! Table tests for the inbound decisions: no sockets, no runtime.

use std::net::SocketAddr;

use super::*;
use crate::model::{ServiceScope, WaypointFor};
use crate::ports::{HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT, RecursiveCall};
use crate::testing::{MeshBuilder, hostname, ip, key, waypoint_ref};

fn at(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

/// A pod `app` serving `app` (port 80 -> 8080) and `other` (port 90 -> 9090, remapped by the pod
/// to 9191), and `sleep`, serving nothing.
fn mesh() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("east-1", "east", "r/z/s")
        .node("west-1", "west", "r/z/s");
    m.pod("app", "east-1", "198.18.1.20");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.service("app", &[("net-east", "198.18.200.1")], 80, 8080);
    m.service("other", &[("net-east", "198.18.200.2")], 90, 9090);
    m.backs("app", "app").backs("app", "other");
    for p in m
        .workload_mut("app")
        .services
        .get_mut(&key("other"))
        .unwrap()
    {
        p.target_port = 9191;
    }
    m
}

fn uid(snap: &Snapshot, name: &str) -> WorkloadUid {
    snap.workloads()
        .find(|w| w.name == name)
        .expect("workload")
        .uid
        .clone()
}

fn host(name: &str, port: u16) -> Destination {
    Destination::Host {
        hostname: hostname(name),
        port,
    }
}

#[test]
fn tunnel_targets_resolve_to_the_pods_own_ports() {
    let snap = mesh().build();
    let app = uid(&snap, "app");
    let pod = ip("198.18.1.20");
    let table: Vec<(Destination, Result<SocketAddr, InboundError>)> = vec![
        (
            Destination::Addr(at("198.18.1.20:8080")),
            Ok(at("198.18.1.20:8080")),
        ),
        (
            Destination::Addr(at("198.18.1.10:8080")),
            Err(InboundError::NotThisPod {
                target: at("198.18.1.10:8080"),
                pod,
            }),
        ),
        // The service's target port, unless the pod maps the port itself.
        (host("app", 80), Ok(at("198.18.1.20:8080"))),
        (host("other", 90), Ok(at("198.18.1.20:9191"))),
        (
            host("app", 81),
            Err(InboundError::NoSuchPort {
                service: key("app"),
                port: 81,
            }),
        ),
        (
            host("nope", 80),
            Err(InboundError::NoSuchService {
                hostname: hostname("nope"),
            }),
        ),
    ];
    for (target, want) in table {
        assert_eq!(resolve_target(&snap, &app, pod, &target), want, "{target}");
    }
    // A pod that does not serve the service is not its endpoint.
    let sleep = uid(&snap, "sleep");
    assert_eq!(
        resolve_target(&snap, &sleep, ip("198.18.1.10"), &host("app", 80)),
        Err(InboundError::NoSuchService {
            hostname: hostname("app")
        })
    );
    // A pod the snapshot no longer has.
    let gone = WorkloadUid::new("east//v1/Pod/default/gone");
    assert_eq!(
        resolve_target(&snap, &gone, pod, &host("app", 80)),
        Err(InboundError::LeftMesh)
    );
}

#[test]
fn a_zero_target_port_is_not_a_port() {
    let mut m = mesh();
    m.service("zero", &[("net-east", "198.18.200.3")], 70, 0);
    m.backs("app", "zero");
    let snap = m.build();
    assert_eq!(
        resolve_target(
            &snap,
            &uid(&snap, "app"),
            ip("198.18.1.20"),
            &host("zero", 70)
        ),
        Err(InboundError::PortNotMapped {
            service: key("zero"),
            port: 70
        })
    );
}

#[test]
fn tunnels_and_plain_tcp_never_land_on_the_proxys_own_ports() {
    let snap = mesh().build();
    let app = uid(&snap, "app");
    let pod = ip("198.18.1.20");
    for port in [OUTBOUND_PORT, INBOUND_PORT, HBONE_PORT] {
        let to = SocketAddr::new(pod, port);
        let refused = InboundPlan::Refuse(InboundError::Recursive(RecursiveCall(to)));
        let target = Destination::Addr(to);
        assert_eq!(
            plan_inbound(&snap, &app, pod, Arrival::Tunnel(&target)),
            refused
        );
        assert_eq!(plan_inbound(&snap, &app, pod, Arrival::Plain(to)), refused);
    }
    let target = Destination::Addr(at("198.18.1.20:8080"));
    assert_eq!(
        plan_inbound(&snap, &app, pod, Arrival::Tunnel(&target)),
        InboundPlan::Deliver(at("198.18.1.20:8080"))
    );
    // Plain TCP keeps its original port, whatever address it was sent to.
    assert_eq!(
        plan_inbound(&snap, &app, pod, Arrival::Plain(at("198.18.200.1:8080"))),
        InboundPlan::Deliver(at("198.18.1.20:8080"))
    );
    assert!(
        InboundError::Recursive(RecursiveCall(at("198.18.1.20:15008"))).is_bad_request()
            && !InboundError::LeftMesh.is_bad_request()
    );
}

/// `app` behind waypoint `wp` with instances in both clusters of one flat network and one on
/// another network.
fn behind_waypoint() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net")
        .cluster("west", "net")
        .cluster("far", "net-far");
    m.node("east-1", "east", "r/z/s")
        .node("west-1", "west", "r/z/s")
        .node("far-1", "far", "r/z/s");
    m.pod("app", "east-1", "198.18.1.20");
    m.waypoint("wp", WaypointFor::Workload);
    m.waypoint_pod("wp", "wp-west", "west-1", "198.18.2.5")
        .waypoint_pod("wp", "wp-east-b", "east-1", "198.18.1.6")
        .waypoint_pod("wp", "wp-east-a", "east-1", "198.18.1.5")
        .waypoint_pod("wp", "wp-far", "far-1", "198.19.1.5");
    m.workload_mut("app").waypoint = Some(waypoint_ref("wp"));
    m
}

fn pick(m: &MeshBuilder) -> Option<String> {
    let snap = m.build();
    let app = snap.workloads().find(|w| w.name == "app").unwrap().clone();
    waypoint_instance(&snap, &app).map(|i| {
        assert_eq!(i.waypoint, key("wp"));
        assert_eq!(i.cluster, ClusterId::new("east"));
        let inst = snap.workload(&i.instance).unwrap();
        assert_eq!(i.identity, inst.identity().unwrap());
        assert_eq!(i.hbone, SocketAddr::new(inst.addresses[0], HBONE_PORT));
        inst.name.clone()
    })
}

#[test]
fn plain_traffic_goes_through_a_waypoint_instance_own_cluster_first() {
    let mut m = behind_waypoint();
    // Own cluster first, then the lowest uid.
    assert_eq!(pick(&m).as_deref(), Some("wp-east-a"));
    m.workload_mut("wp-east-a").health = Health::Unhealthy;
    assert_eq!(pick(&m).as_deref(), Some("wp-east-b"));
    m.workload_mut("wp-east-b").addresses.clear();
    // Then another cluster on the pod's network; never another network.
    assert_eq!(pick(&m).as_deref(), Some("wp-west"));
    m.workload_mut("wp-west").health = Health::Unhealthy;
    assert_eq!(pick(&m), None);
}

#[test]
fn the_waypoint_scope_limits_the_instances_for_the_pods_cluster() {
    let mut m = behind_waypoint();
    m.workload_mut("wp-east-a").health = Health::Unhealthy;
    m.workload_mut("wp-east-b").health = Health::Unhealthy;
    assert_eq!(pick(&m).as_deref(), Some("wp-west"));
    m.service_mut("wp").scope = ServiceScope::local();
    assert_eq!(pick(&m), None);
}

#[test]
fn a_service_waypoint_serves_plain_traffic_to_its_endpoints() {
    let mut m = behind_waypoint();
    m.workload_mut("app").waypoint = None;
    m.service("app", &[("net", "198.18.200.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    m.backs("app", "app");
    assert_eq!(pick(&m).as_deref(), Some("wp-east-a"));
    let snap = m.build();
    let app = uid(&snap, "app");
    let plan = plan_inbound(
        &snap,
        &app,
        ip("198.18.1.20"),
        Arrival::Plain(at("198.18.1.20:8080")),
    );
    let InboundPlan::ViaWaypoint(via) = plan else {
        panic!("expected the waypoint, got {plan:?}")
    };
    assert_eq!(via.hbone, at("198.18.1.5:15008"));
    // Without a waypoint: delivered.
    m.service_mut("app").waypoint = None;
    assert_eq!(pick(&m), None);
    let snap = m.build();
    assert_eq!(
        plan_inbound(
            &snap,
            &app,
            ip("198.18.1.20"),
            Arrival::Plain(at("198.18.1.20:8080"))
        ),
        InboundPlan::Deliver(at("198.18.1.20:8080"))
    );
    let gone = WorkloadUid::new("east//v1/Pod/default/gone");
    assert_eq!(
        plan_inbound(
            &snap,
            &gone,
            ip("198.18.1.20"),
            Arrival::Plain(at("198.18.1.20:8080"))
        ),
        InboundPlan::Refuse(InboundError::LeftMesh)
    );
}
