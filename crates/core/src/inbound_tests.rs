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
        .make_mut()
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
    waypoint_instance(&snap, &app, Family::V4).map(|i| {
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
fn plain_traffic_reaches_a_dual_stack_waypoint_instance_in_the_connections_family() {
    let mut m = behind_waypoint();
    m.workload_mut("app")
        .addresses
        .push("2001:2::1:20".parse().unwrap());
    m.workload_mut("wp-east-a")
        .addresses
        .push("2001:2::1:5".parse().unwrap());
    let snap = m.build();
    let app = uid(&snap, "app");
    let via = |pod_ip: &str, orig: &str| match plan_inbound(
        &snap,
        &app,
        ip(pod_ip),
        Arrival::Plain(at(orig)),
    ) {
        InboundPlan::ViaWaypoint(via) => via.hbone,
        other => panic!("expected the waypoint, got {other:?}"),
    };
    // The instance's address of the family the connection came in on.
    assert_eq!(
        via("2001:2::1:20", "[2001:2::1:20]:8080"),
        at("[2001:2::1:5]:15008")
    );
    assert_eq!(
        via("198.18.1.20", "198.18.1.20:8080"),
        at("198.18.1.5:15008")
    );
    // An IPv4-only instance is reached over IPv4 whatever the connection's family.
    m.workload_mut("wp-east-a").addresses.truncate(1);
    let snap = m.build();
    let InboundPlan::ViaWaypoint(v) = plan_inbound(
        &snap,
        &app,
        ip("2001:2::1:20"),
        Arrival::Plain(at("[2001:2::1:20]:8080")),
    ) else {
        panic!("expected the waypoint")
    };
    assert_eq!(v.hbone, at("198.18.1.5:15008"));
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

/// Two clusters on one flat network (as the lab's), waypoint `wp` with an instance in each,
/// `front` (global) and `near` (local) behind it, `bare` with no waypoint, `elsewhere` behind
/// another waypoint; pods `app` (serving `front`), `solo` (its own waypoint `wp`), `plain`
/// (none).
fn fronting() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat").cluster("beta", "flat");
    m.node("alpha-1", "alpha", "r/z/s")
        .node("beta-1", "beta", "r/z/s");
    m.waypoint("wp", WaypointFor::All);
    m.waypoint_pod("wp", "wp-alpha", "alpha-1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-beta", "beta-1", "198.18.3.50");
    m.waypoint("other-wp", WaypointFor::All);
    m.waypoint_pod("other-wp", "other-wp-1", "alpha-1", "198.18.1.60");
    m.pod("app", "beta-1", "198.18.3.20");
    m.pod("solo", "beta-1", "198.18.3.21").waypoint = Some(waypoint_ref("wp"));
    m.pod("plain", "beta-1", "198.18.3.22");
    m.service("front", &[("flat", "198.18.10.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    let near = m.service("near", &[("flat", "198.18.10.2")], 80, 8080);
    near.waypoint = Some(waypoint_ref("wp"));
    near.scope = ServiceScope::local();
    m.service("bare", &[("flat", "198.18.10.3")], 80, 8080);
    m.service("elsewhere", &[("flat", "198.18.10.4")], 80, 8080)
        .waypoint = Some(waypoint_ref("other-wp"));
    m.backs("app", "front").backs("app", "near");
    m
}

#[test]
fn a_waypoint_serves_only_what_it_fronts_and_only_where_it_is_admissible() {
    let snap = fronting().build();
    let by = |name: &str| snap.workloads().find(|w| w.name == name).unwrap().clone();
    let (alpha, beta): (ClusterId, ClusterId) = ("alpha".into(), "beta".into());
    let flat: NetworkId = "flat".into();
    let other: NetworkId = "elsewhere".into();
    let addr = |s: &str| Destination::Addr(at(s));
    let host = |n: &str| Destination::Host {
        hostname: hostname(n),
        port: 80,
    };
    let wp_beta = by("wp-beta");
    let check = |target: &Destination, origin: &ClusterId, network: &NetworkId| {
        fronted_by(&snap, &wp_beta, target, origin, network)
    };
    let not_ours = |t: &Destination| NotFronted::NotThisWaypoint {
        target: t.to_string(),
    };
    let cases: Vec<(
        Destination,
        &ClusterId,
        &NetworkId,
        Result<Fronted, NotFronted>,
    )> = vec![
        // A global service it fronts, by VIP or hostname, for either cluster.
        (
            addr("198.18.10.1:80"),
            &alpha,
            &flat,
            Ok(Fronted::Service(key("front"))),
        ),
        (
            host("front"),
            &beta,
            &flat,
            Ok(Fronted::Service(key("front"))),
        ),
        // A local service it fronts: only for its own cluster's sources.
        (
            addr("198.18.10.2:80"),
            &beta,
            &flat,
            Ok(Fronted::Service(key("near"))),
        ),
        (
            addr("198.18.10.2:80"),
            &alpha,
            &flat,
            Err(NotFronted::OutOfScope {
                target: "198.18.10.2:80".into(),
                instance: beta.clone(),
                origin: alpha.clone(),
            }),
        ),
        // Services it does not front: none, or another waypoint.
        (
            addr("198.18.10.3:80"),
            &beta,
            &flat,
            Err(not_ours(&addr("198.18.10.3:80"))),
        ),
        (
            addr("198.18.10.4:80"),
            &beta,
            &flat,
            Err(not_ours(&addr("198.18.10.4:80"))),
        ),
        // Pods: its own workload waypoint's, or behind a service it fronts; not one with none.
        (
            addr("198.18.3.21:8080"),
            &beta,
            &flat,
            Ok(Fronted::Workload(uid(&snap, "solo"))),
        ),
        (
            addr("198.18.3.20:8080"),
            &alpha,
            &flat,
            Ok(Fronted::Workload(uid(&snap, "app"))),
        ),
        (
            addr("198.18.3.22:8080"),
            &beta,
            &flat,
            Err(not_ours(&addr("198.18.3.22:8080"))),
        ),
        // A pod's waypoint serves its own network's sources only.
        (
            addr("198.18.3.21:8080"),
            &beta,
            &other,
            Err(NotFronted::OtherNetwork {
                target: "198.18.3.21:8080".into(),
                instance: flat.clone(),
                workload: flat.clone(),
                from_network: other.clone(),
            }),
        ),
        // Nothing of the mesh.
        (
            addr("198.18.9.9:80"),
            &beta,
            &flat,
            Err(NotFronted::Unknown {
                target: "198.18.9.9:80".into(),
            }),
        ),
        (
            host("nowhere"),
            &beta,
            &flat,
            Err(NotFronted::Unknown {
                target: host("nowhere").to_string(),
            }),
        ),
    ];
    for (target, origin, network, want) in cases {
        assert_eq!(
            check(&target, origin, network),
            want,
            "{target} for {origin} on {network}"
        );
    }
    // Another waypoint's instance fronts none of these.
    let stranger = by("other-wp-1");
    assert_eq!(
        fronted_by(&snap, &stranger, &addr("198.18.10.1:80"), &alpha, &flat),
        Err(not_ours(&addr("198.18.10.1:80")))
    );
}

#[test]
fn a_waypoint_instance_its_own_scope_leaves_out_is_not_admissible() {
    let mut m = fronting();
    m.service_mut("wp").scope = ServiceScope::local();
    let snap = m.build();
    let wp_beta = snap.workloads().find(|w| w.name == "wp-beta").unwrap();
    let target = Destination::Addr(at("198.18.10.1:80"));
    let (alpha, beta): (ClusterId, ClusterId) = ("alpha".into(), "beta".into());
    let flat: NetworkId = "flat".into();
    assert_eq!(
        fronted_by(&snap, wp_beta, &target, &beta, &flat),
        Ok(Fronted::Service(key("front")))
    );
    assert_eq!(
        fronted_by(&snap, wp_beta, &target, &alpha, &flat),
        Err(NotFronted::OutOfScope {
            target: target.to_string(),
            instance: beta,
            origin: alpha,
        })
    );
}
