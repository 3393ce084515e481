//! Table tests for the routing decision: no sockets, no runtime.

use std::net::SocketAddr;

use super::decide::MAX_NESTING;
use super::*;
use crate::model::{
    AddressEndpoint, HBONE_PORT, Health, LoadBalancing, NetworkAddress, PortMapping, ServiceScope,
    TunnelProtocol, WaypointFor,
};
use crate::random::SplitMix64;
use crate::snapshot::Snapshot;
use crate::testing::{MeshBuilder, hostname, ip, key, waypoint_ref};

/// Two clusters on two networks, a gateway each, two nodes per cluster.
fn two_networks() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("east-1", "east", "us-east/us-east-1a/r1")
        .node("east-2", "east", "us-east/us-east-1b/r1")
        .node("west-1", "west", "us-west/us-west-1a/r1")
        .node("west-2", "west", "us-west/us-west-1b/r1");
    m.gateway("gw-east", "east", "198.18.255.1")
        .gateway("gw-west", "west", "198.19.255.1");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.pod("sleep-west", "west-1", "198.19.1.10");
    m
}

/// Two clusters sharing one flat network.
fn flat() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "us-east/a/r1")
        .node("west-1", "west", "us-west/a/r1");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.pod("sleep-west", "west-1", "198.18.2.10");
    m
}

fn decide(snap: &Snapshot, from: &str, to: &str) -> Decision {
    decide_seeded(snap, from, to, 1)
}

fn decide_seeded(snap: &Snapshot, from: &str, to: &str, seed: u64) -> Decision {
    let src = snap
        .workloads()
        .find(|w| w.name == from)
        .expect("source exists")
        .clone();
    let dst = match to.parse::<SocketAddr>() {
        Ok(a) => Destination::Addr(a),
        Err(_) => {
            let (h, p) = to.rsplit_once(':').expect("host:port");
            Destination::Host {
                hostname: h.to_string(),
                port: p.parse().expect("port"),
            }
        }
    };
    let decision = route(snap, Source::new(&src), &dst, &mut SplitMix64::new(seed));
    // Every scenario also checks the data path: the same plan, with no step ever built.
    let planned = plan(snap, Source::new(&src), &dst, &mut SplitMix64::new(seed));
    assert_eq!(planned, decision.outcome, "plan() and route() disagree");
    let mut off = Disabled::default();
    let traced = route_traced(
        snap,
        Source::new(&src),
        &dst,
        &Within::default(),
        &mut SplitMix64::new(seed),
        &mut off,
    );
    assert_eq!(traced, decision.outcome);
    assert_eq!(off.recorded, 0, "a disabled trace was handed steps");
    decision
}

/// A sink that is off, and counts the steps it is handed anyway.
#[derive(Default)]
struct Disabled {
    recorded: usize,
}

impl Trace for Disabled {
    fn enabled(&self) -> bool {
        false
    }

    fn record(&mut self, _: Step) {
        self.recorded += 1;
    }
}

fn landing(d: &Decision) -> String {
    let plan = d
        .outcome
        .as_ref()
        .unwrap_or_else(|e| panic!("expected a plan, got {e}"));
    plan.landing
        .as_ref()
        .expect("lands on a workload")
        .to_string()
}

fn dropped_for_scope(d: &Decision) -> Vec<String> {
    d.steps
        .iter()
        .filter_map(|s| match s {
            Step::Dropped {
                candidate,
                reason: DropReason::OutOfScope { .. },
                ..
            } => Some(candidate.clone()),
            _ => None,
        })
        .collect()
}

/// The ztunnel RFC case: a local service served by a global waypoint.
fn local_service_global_waypoint(m: &mut MeshBuilder) {
    m.waypoint("shared-wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("shared-wp", "wp-east", "east-1", "198.18.1.50");
    m.waypoint_pod("shared-wp", "wp-west", "west-1", "198.18.2.50");
    let s = m.service("ledger", &[("net", "198.18.100.1")], 80, 8080);
    s.scope = ServiceScope::local();
    s.waypoint = Some(waypoint_ref("shared-wp"));
    m.pod("ledger-east", "east-1", "198.18.1.20");
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-east", "ledger")
        .backs("ledger-west", "ledger");
}

#[test]
fn local_service_never_uses_remote_waypoint_even_when_local_ones_are_down() {
    let mut m = flat();
    local_service_global_waypoint(&mut m);
    m.workload_mut("wp-east").health = Health::Unhealthy;
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    match &d.outcome {
        Err(RouteError::NoWaypointEndpoint { source_cluster, .. }) => {
            assert_eq!(source_cluster.as_str(), "east")
        }
        other => panic!("expected the connection to fail, got {other:?}"),
    }
    assert_eq!(
        dropped_for_scope(&d),
        vec!["west//v1/Pod/default/wp-west".to_string()]
    );
}

#[test]
fn global_service_fails_over_to_remote_waypoint() {
    let mut m = flat();
    local_service_global_waypoint(&mut m);
    m.workload_mut("wp-east").health = Health::Unhealthy;
    m.service_mut("ledger").scope = ServiceScope::global();
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert_eq!(landing(&d), "west//v1/Pod/default/wp-west");
    let plan = d.outcome.unwrap();
    assert_eq!(
        plan.waypoint.as_deref(),
        Some("default/shared-wp.default.svc.cluster.local")
    );
    match plan.transport {
        Transport::Hbone {
            connect_to,
            authority,
            identities,
        } => {
            assert_eq!(connect_to, SocketAddr::new(ip("198.18.2.50"), HBONE_PORT));
            assert_eq!(
                authority, "198.18.100.1:80",
                "a waypoint is asked for the service address"
            );
            assert_eq!(
                identities[0].to_string(),
                "spiffe://cluster.local/ns/default/sa/wp-west"
            );
        }
        other => panic!("expected HBONE, got {other:?}"),
    }
}

#[test]
fn local_waypoint_scope_narrows_a_global_service() {
    let mut m = flat();
    local_service_global_waypoint(&mut m);
    m.service_mut("ledger").scope = ServiceScope::global();
    m.service_mut("shared-wp").scope = ServiceScope::local();
    m.workload_mut("wp-east").health = Health::Unhealthy;
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(
        matches!(d.outcome, Err(RouteError::NoWaypointEndpoint { .. })),
        "{:?}",
        d.outcome
    );
}

#[test]
fn local_service_endpoints_stay_in_the_source_cluster() {
    let mut m = flat();
    m.service("ledger", &[("net", "198.18.100.1")], 80, 8080)
        .scope = ServiceScope::local();
    m.pod("ledger-east", "east-1", "198.18.1.20");
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-east", "ledger")
        .backs("ledger-west", "ledger");
    let snap = m.build();
    for seed in 0..50 {
        assert_eq!(
            landing(&decide_seeded(&snap, "sleep", "198.18.100.1:80", seed)),
            "east//v1/Pod/default/ledger-east"
        );
        assert_eq!(
            landing(&decide_seeded(&snap, "sleep-west", "198.18.100.1:80", seed)),
            "west//v1/Pod/default/ledger-west"
        );
    }
    // With the only local endpoint down, the connection fails instead of crossing clusters.
    m.workload_mut("ledger-east").health = Health::Unhealthy;
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(
        matches!(d.outcome, Err(RouteError::NoEndpoint { .. })),
        "{:?}",
        d.outcome
    );
}

#[test]
fn cluster_set_scope_is_an_allow_list_of_source_clusters() {
    let mut m = flat();
    m.cluster("north", "net")
        .node("north-1", "north", "eu/a/r1");
    m.pod("sleep-north", "north-1", "198.18.3.10");
    m.service("ledger", &[("net", "198.18.100.1")], 80, 8080)
        .scope = ServiceScope::clusters(["east".into(), "west".into()]);
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-west", "ledger");
    let snap = m.build();
    assert_eq!(
        landing(&decide(&snap, "sleep", "198.18.100.1:80")),
        "west//v1/Pod/default/ledger-west"
    );
    let d = decide(&snap, "sleep-north", "198.18.100.1:80");
    assert!(matches!(d.outcome, Err(RouteError::NoEndpoint { .. })));
    assert_eq!(
        dropped_for_scope(&d),
        vec!["west//v1/Pod/default/ledger-west".to_string()]
    );
}

#[test]
fn non_uniform_scope_is_looked_up_by_endpoint_cluster() {
    let mut m = flat();
    let s = m.service("ledger", &[("net", "198.18.100.1")], 80, 8080);
    s.scope = ServiceScope::local();
    s.scope
        .by_cluster
        .insert("west".into(), crate::model::ScopeRule::Global);
    m.pod("ledger-east", "east-1", "198.18.1.20");
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-east", "ledger")
        .backs("ledger-west", "ledger");
    m.workload_mut("ledger-west").health = Health::Unhealthy;
    // West exports its instance globally, east keeps its own local: a west source can't reach east.
    let d = decide(&m.build(), "sleep-west", "198.18.100.1:80");
    assert!(matches!(d.outcome, Err(RouteError::NoEndpoint { .. })));
    m.workload_mut("ledger-west").health = Health::Healthy;
    m.workload_mut("ledger-east").health = Health::Unhealthy;
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert_eq!(landing(&d), "west//v1/Pod/default/ledger-west");
}

#[test]
fn workload_waypoint_on_another_network_is_never_chosen() {
    let mut m = two_networks();
    m.waypoint("wl-wp", WaypointFor::Workload).scope = ServiceScope::global();
    m.waypoint_pod("wl-wp", "wl-wp-west", "west-1", "198.19.1.60");
    m.pod("db", "east-2", "198.18.2.30").waypoint = Some(waypoint_ref("wl-wp"));
    let d = decide(&m.build(), "sleep", "198.18.2.30:5432");
    assert!(
        matches!(d.outcome, Err(RouteError::NoWaypointEndpoint { .. })),
        "{:?}",
        d.outcome
    );
    assert!(d.steps.iter().any(|s| matches!(
        s,
        Step::Dropped {
            reason: DropReason::WaypointOnOtherNetwork { .. },
            ..
        }
    )));
    m.waypoint_pod("wl-wp", "wl-wp-east", "east-2", "198.18.2.60");
    let d = decide(&m.build(), "sleep", "198.18.2.30:5432");
    assert_eq!(landing(&d), "east//v1/Pod/default/wl-wp-east");
    match d.outcome.unwrap().transport {
        Transport::Hbone { authority, .. } => assert_eq!(authority, "198.18.2.30:5432"),
        other => panic!("expected HBONE, got {other:?}"),
    }
}

#[test]
fn nested_service_address_resolves_in_one_decision() {
    let mut m = flat();
    m.service("catalog", &[("net", "198.18.100.2")], 80, 9090)
        .scope = ServiceScope::local();
    m.pod("catalog-east", "east-1", "198.18.1.30");
    m.backs("catalog-east", "catalog");
    let mc = m.service("catalog-mc", &[("net", "198.18.100.3")], 80, 80);
    mc.address_endpoints.push(AddressEndpoint {
        address: NetworkAddress::new("net".into(), ip("198.18.100.2")),
        cluster: "east".into(),
        ports: vec![PortMapping {
            service_port: 80,
            target_port: 80,
        }],
    });
    let snap = m.build();
    let d = decide(&snap, "sleep", "198.18.100.3:80");
    assert_eq!(landing(&d), "east//v1/Pod/default/catalog-east");
    let plan = d.outcome.as_ref().unwrap();
    assert_eq!(plan.service, Some(key("catalog")));
    assert_eq!(plan.landing_port, 9090);
    match &plan.transport {
        Transport::Hbone {
            connect_to,
            authority,
            ..
        } => {
            assert_eq!(*connect_to, SocketAddr::new(ip("198.18.1.30"), HBONE_PORT));
            assert_eq!(
                authority, "198.18.1.30:9090",
                "straight to the pod: no second capture"
            );
        }
        other => panic!("expected HBONE to the pod, got {other:?}"),
    }
    assert!(
        d.steps
            .iter()
            .any(|s| matches!(s, Step::Nested { inner, .. } if *inner == key("catalog")))
    );
    // The inner service is local to east: a west source gets no east pod through the outer one.
    let d = decide(&snap, "sleep-west", "198.18.100.3:80");
    assert!(
        matches!(&d.outcome, Err(RouteError::NoEndpoint { service, .. }) if *service == key("catalog")),
        "{:?}",
        d.outcome
    );
}

#[test]
fn nested_service_applies_the_inner_waypoint() {
    let mut m = flat();
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-east", "east-1", "198.18.1.50");
    let s = m.service("catalog", &[("net", "198.18.100.2")], 80, 9090);
    s.waypoint = Some(waypoint_ref("wp"));
    m.pod("catalog-east", "east-1", "198.18.1.30");
    m.backs("catalog-east", "catalog");
    m.service("catalog-mc", &[("net", "198.18.100.3")], 80, 80)
        .address_endpoints
        .push(AddressEndpoint {
            address: NetworkAddress::new("net".into(), ip("198.18.100.2")),
            cluster: "east".into(),
            ports: vec![],
        });
    let d = decide(&m.build(), "sleep", "198.18.100.3:80");
    assert_eq!(landing(&d), "east//v1/Pod/default/wp-east");
    match d.outcome.unwrap().transport {
        Transport::Hbone { authority, .. } => assert_eq!(authority, "198.18.100.2:80"),
        other => panic!("expected HBONE to the waypoint, got {other:?}"),
    }
}

#[test]
fn cycle_of_service_addresses_fails_cleanly() {
    let mut m = flat();
    for (name, vip, next) in [
        ("a", "198.18.100.1", "198.18.100.2"),
        ("b", "198.18.100.2", "198.18.100.1"),
    ] {
        m.service(name, &[("net", vip)], 80, 80)
            .address_endpoints
            .push(AddressEndpoint {
                address: NetworkAddress::new("net".into(), ip(next)),
                cluster: "east".into(),
                ports: vec![],
            });
    }
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    match d.outcome {
        Err(RouteError::NestingCycle { chain }) => assert_eq!(
            chain,
            format!(
                "default/{} -> default/{} -> default/{}",
                hostname("a"),
                hostname("b"),
                hostname("a")
            )
        ),
        other => panic!("expected a cycle, got {other:?}"),
    }
}

#[test]
fn nesting_deeper_than_the_bound_fails() {
    let mut m = flat();
    let n = MAX_NESTING + 1;
    for i in 0..=n {
        let vip = format!("198.18.100.{}", i + 1);
        let next = format!("198.18.100.{}", i + 2);
        let s = m.service(&format!("s{i}"), &[("net", vip.as_str())], 80, 80);
        if i < n {
            s.address_endpoints.push(AddressEndpoint {
                address: NetworkAddress::new("net".into(), ip(&next)),
                cluster: "east".into(),
                ports: vec![],
            });
        }
    }
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(
        matches!(
            d.outcome,
            Err(RouteError::NestingTooDeep {
                limit: MAX_NESTING,
                ..
            })
        ),
        "{:?}",
        d.outcome
    );
}

#[test]
fn prefer_close_prefers_node_then_zone_then_region_then_network() {
    let mut m = two_networks();
    m.node("east-1-peer", "east", "us-east/us-east-1a/r1"); // same subzone as east-1, other node
    m.node("east-far", "east", "eu-central/eu-1a/r1");
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("wp", "wp-node", "east-1", "198.18.1.51");
    m.waypoint_pod("wp", "wp-zone", "east-1-peer", "198.18.1.52");
    m.waypoint_pod("wp", "wp-region", "east-2", "198.18.1.53");
    m.waypoint_pod("wp", "wp-network", "east-far", "198.18.1.54");
    m.waypoint_pod("wp", "wp-remote", "west-1", "198.19.1.55");
    let s = m.service("echo", &[("net-east", "198.18.100.1")], 80, 8080);
    s.waypoint = Some(waypoint_ref("wp"));
    let order = ["wp-node", "wp-zone", "wp-region", "wp-network", "wp-remote"];
    for (i, expected) in order.iter().enumerate() {
        let snap = m.build();
        for seed in 0..20 {
            let d = decide_seeded(&snap, "sleep", "198.18.100.1:80", seed);
            assert!(
                landing(&d).ends_with(expected),
                "step {i}: got {} instead of {expected}",
                landing(&d)
            );
        }
        m.workload_mut(expected).health = Health::Unhealthy;
    }
}

#[test]
fn strict_mode_and_capacity_zero() {
    let mut m = flat();
    let s = m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    s.load_balancing = Some(LoadBalancing {
        mode: crate::model::LbMode::Strict,
        routing_preference: vec![crate::model::LocalityScope::Cluster],
        health_policy: crate::model::HealthPolicy::OnlyHealthy,
        failover_minimum: None,
    });
    m.pod("echo-west", "west-1", "198.18.2.40");
    m.pod("echo-east", "east-1", "198.18.1.40").capacity = 0;
    m.backs("echo-west", "echo").backs("echo-east", "echo");
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(
        matches!(d.outcome, Err(RouteError::NoEndpoint { .. })),
        "{:?}",
        d.outcome
    );
}

#[test]
fn other_network_endpoint_goes_through_its_gateway_by_hostname() {
    let mut m = two_networks();
    m.service(
        "echo",
        &[("net-east", "198.18.100.1"), ("net-west", "198.19.100.1")],
        80,
        8080,
    );
    m.pod("echo-west-1", "west-1", "198.19.1.40");
    m.pod("echo-west-2", "west-2", "198.19.1.41");
    m.backs("echo-west-1", "echo").backs("echo-west-2", "echo");
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    match d.outcome.unwrap().transport {
        Transport::GatewayHbone {
            gateway,
            gateway_identity,
            authority,
            identities,
        } => {
            assert_eq!(gateway, SocketAddr::new(ip("198.19.255.1"), HBONE_PORT));
            assert_eq!(
                gateway_identity.to_string(),
                "spiffe://cluster.local/ns/istio-system/sa/gw-west"
            );
            assert_eq!(authority, "echo.default.svc.cluster.local:80");
            let ids: Vec<String> = identities.iter().map(ToString::to_string).collect();
            assert_eq!(
                ids,
                [
                    "spiffe://cluster.local/ns/default/sa/echo-west-1",
                    "spiffe://cluster.local/ns/default/sa/echo-west-2"
                ]
            );
        }
        other => panic!("expected double HBONE, got {other:?}"),
    }
}

#[test]
fn other_network_without_gateway_is_unreachable() {
    let mut m = two_networks();
    m.gateways.retain(|g| g.name != "gw-west");
    m.service("echo", &[("net-east", "198.18.100.1")], 80, 8080);
    m.pod("echo-west", "west-1", "198.19.1.40");
    m.backs("echo-west", "echo");
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(matches!(d.outcome, Err(RouteError::NoEndpoint { .. })));
    assert!(d.steps.iter().any(|s| matches!(
        s,
        Step::Dropped {
            reason: DropReason::Unreachable { .. },
            ..
        }
    )));
}

#[test]
fn transports_for_tcp_workloads_and_outside_addresses() {
    let mut m = flat();
    m.pod("legacy", "east-1", "198.18.1.70").tunnel = TunnelProtocol::Tcp;
    let snap = m.build();
    let d = decide(&snap, "sleep", "198.18.1.70:5000");
    assert_eq!(
        d.outcome.unwrap().transport,
        Transport::Tcp {
            connect_to: "198.18.1.70:5000".parse().unwrap()
        }
    );
    let d = decide(&snap, "sleep", "198.18.9.9:443");
    let plan = d.outcome.unwrap();
    assert_eq!(plan.class, Class::OutsideMesh);
    assert_eq!(
        plan.transport,
        Transport::Passthrough {
            connect_to: "198.18.9.9:443".parse().unwrap()
        }
    );
    let d = decide(&snap, "sleep", "198.18.2.10:8080");
    match d.outcome.unwrap().transport {
        Transport::Hbone {
            connect_to,
            authority,
            identities,
        } => {
            assert_eq!(connect_to, "198.18.2.10:15008".parse().unwrap());
            assert_eq!(authority, "198.18.2.10:8080");
            assert_eq!(identities.len(), 1);
        }
        other => panic!("expected HBONE, got {other:?}"),
    }
}

#[test]
fn waypoint_does_not_loop_back_to_itself() {
    let mut m = flat();
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-east", "east-1", "198.18.1.50");
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    m.pod("echo-east", "east-1", "198.18.1.40");
    m.backs("echo-east", "echo");
    let d = decide(&m.build(), "wp-east", "198.18.100.1:80");
    assert_eq!(landing(&d), "east//v1/Pod/default/echo-east");
    assert!(
        d.steps
            .iter()
            .any(|s| matches!(s, Step::WaypointSkipped { .. }))
    );
}

#[test]
fn waypoint_acting_for_a_remote_source_applies_the_origin_cluster_scope() {
    let mut m = flat();
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-west", "west-1", "198.18.2.50");
    let s = m.service("ledger", &[("net", "198.18.100.1")], 80, 8080);
    s.scope = ServiceScope::local();
    s.waypoint = Some(waypoint_ref("wp"));
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-west", "ledger");
    let snap = m.build();
    let wp = snap
        .workloads()
        .find(|w| w.name == "wp-west")
        .unwrap()
        .clone();
    let east = "east".into();
    let dst = Destination::Addr("198.18.100.1:80".parse().unwrap());
    let d = route(
        &snap,
        Source::on_behalf_of(&wp, &east),
        &dst,
        &mut SplitMix64::new(1),
    );
    assert!(
        matches!(d.outcome, Err(RouteError::NoEndpoint { .. })),
        "{:?}",
        d.outcome
    );
    let d = route(&snap, Source::new(&wp), &dst, &mut SplitMix64::new(1));
    assert_eq!(landing(&d), "west//v1/Pod/default/ledger-west");
}

#[test]
fn hostnames_ports_and_seeds() {
    let mut m = flat();
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    for (i, n) in ["e1", "e2", "e3", "e4"].iter().enumerate() {
        m.pod(n, "east-1", &format!("198.18.1.{}", 40 + i));
        m.backs(n, "echo");
    }
    let snap = m.build();
    let a = decide_seeded(&snap, "sleep", &format!("{}:80", hostname("echo")), 42);
    let b = decide_seeded(&snap, "sleep", &format!("{}:80", hostname("echo")), 42);
    assert_eq!(landing(&a), landing(&b), "same seed, same pick");
    let picks: std::collections::BTreeSet<String> = (0..64)
        .map(|s| landing(&decide_seeded(&snap, "sleep", "198.18.100.1:80", s)))
        .collect();
    assert_eq!(picks.len(), 4, "every endpoint gets picked under some seed");
    assert!(matches!(
        decide(&snap, "sleep", "nope.default.svc.cluster.local:80").outcome,
        Err(RouteError::UnknownHost { .. })
    ));
    assert!(matches!(
        decide(&snap, "sleep", "198.18.100.1:81").outcome,
        Err(RouteError::NoSuchPort { port: 81, .. })
    ));
}

/// An HTTP route's subset keeps only labelled endpoints, and the routed service's scope bounds
/// the backend's endpoints too: a global backend reached through a local service stays local.
#[test]
fn route_within_keeps_subset_and_parent_scope() {
    let mut m = flat();
    m.pod("v1", "east-1", "198.18.1.21");
    m.pod("v2", "east-1", "198.18.1.22");
    m.pod("v2-west", "west-1", "198.18.2.22");
    for (w, version) in [("v1", "v1"), ("v2", "v2"), ("v2-west", "v2")] {
        m.workload_mut(w)
            .labels
            .make_mut()
            .insert("version".into(), version.into());
    }
    m.service("app", &[("net", "198.18.200.1")], 80, 8080).scope = ServiceScope::local();
    m.service("backend", &[("net", "198.18.200.2")], 80, 8080);
    m.backs("v1", "backend")
        .backs("v2", "backend")
        .backs("v2-west", "backend");
    let snap = m.build();
    let src = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let parent = snap.service(&key("app")).unwrap().clone();
    let dst = Destination::Host {
        hostname: hostname("backend"),
        port: 80,
    };
    let subset: std::collections::BTreeMap<_, _> = [("version".to_string(), "v2".to_string())]
        .into_iter()
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let within = Within {
            subset: Some(&subset),
            parent: Some(&parent),
        };
        let d = route_within(
            &snap,
            Source::new(&src),
            &dst,
            &within,
            &mut SplitMix64::new(seed),
        );
        let planned = route_traced(
            &snap,
            Source::new(&src),
            &dst,
            &within,
            &mut SplitMix64::new(seed),
            &mut NoTrace,
        );
        assert_eq!(planned, d.outcome);
        seen.insert(landing(&d));
    }
    // v1 is not in the subset; v2-west is, but the local parent does not admit it from east.
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec!["east//v1/Pod/default/v2".to_string()]
    );
    // Without the parent, the west endpoint is a candidate.
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let within = Within {
            subset: Some(&subset),
            parent: None,
        };
        let d = route_within(
            &snap,
            Source::new(&src),
            &dst,
            &within,
            &mut SplitMix64::new(seed),
        );
        seen.insert(landing(&d));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    // A subset nobody carries: no endpoint, never a fallback.
    let none: std::collections::BTreeMap<_, _> = [("version".to_string(), "v9".to_string())]
        .into_iter()
        .collect();
    let within = Within {
        subset: Some(&none),
        parent: Some(&parent),
    };
    let d = route_within(
        &snap,
        Source::new(&src),
        &dst,
        &within,
        &mut SplitMix64::new(1),
    );
    assert!(matches!(d.outcome, Err(RouteError::NoEndpoint { .. })));
}

#[test]
fn any_trace_sink_sees_the_steps_explain_prints() {
    let mut m = two_networks();
    m.pod("b", "east-2", "198.18.1.20");
    m.service("b", &[("net-east", "198.18.200.1")], 80, 8080);
    m.backs("b", "b");
    let snap = m.build();
    let d = decide(&snap, "sleep", "198.18.200.1:80");
    assert!(d.outcome.is_ok() && d.steps.len() >= 3, "{:?}", d.steps);
    let src = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let mut steps: Vec<Step> = Vec::new();
    let sink: &mut dyn Trace = &mut steps;
    let outcome = route_traced(
        &snap,
        Source::new(&src),
        &Destination::Addr("198.18.200.1:80".parse().unwrap()),
        &Within::default(),
        &mut SplitMix64::new(1),
        sink,
    );
    assert_eq!(outcome, d.outcome);
    assert_eq!(steps, d.steps);
}

#[test]
fn a_waypoint_reaches_endpoints_on_another_network_and_their_gateway_does_not_loop_back() {
    let mut m = two_networks();
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-east", "east-1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-west", "west-1", "198.19.1.50");
    let s = m.service(
        "echo",
        &[("net-east", "198.18.100.1"), ("net-west", "198.19.100.1")],
        80,
        8080,
    );
    s.waypoint = Some(waypoint_ref("wp"));
    m.pod("echo-west-1", "west-1", "198.19.1.40");
    m.backs("echo-west-1", "echo");
    let snap = m.build();
    let by_name = |n: &str| snap.workloads().find(|w| w.name == n).unwrap().clone();
    // The east instance, past itself, sends to the west pod through west's gateway.
    let d = decide(&snap, "wp-east", "198.18.100.1:80");
    assert!(
        matches!(d.outcome, Ok(Plan { transport: Transport::GatewayHbone { ref authority, .. }, .. }) if authority == "echo.default.svc.cluster.local:80"),
        "{:?}",
        d.outcome
    );
    // At the gateway (standing on net-west), a tunnel sent by an instance of echo's waypoint
    // lands on the pod, not on the waypoint again.
    let (gw, wp_east, sleep) = (by_name("sleep-west"), by_name("wp-east"), by_name("sleep"));
    let (wp_id, sleep_id) = (wp_east.identity().unwrap(), sleep.identity().unwrap());
    let east: crate::model::ClusterId = "east".into();
    let dst = Destination::Host {
        hostname: hostname("echo"),
        port: 80,
    };
    let at_gateway = |src: Source<'_>| route(&snap, src, &dst, &mut SplitMix64::new(1));
    let d = at_gateway(Source::on_behalf_of(&gw, &east).sent_by(&wp_id));
    assert_eq!(landing(&d), "west//v1/Pod/default/echo-west-1");
    assert!(matches!(
        d.outcome,
        Ok(Plan {
            waypoint: None,
            transport: Transport::Hbone { .. },
            ..
        })
    ));
    // Sent by anyone else (the source's own node proxy), the waypoint still applies.
    let d = at_gateway(Source::on_behalf_of(&gw, &east).sent_by(&sleep_id));
    assert_eq!(landing(&d), "west//v1/Pod/default/wp-west");
}

/// A retry after a failed connect: the same decision with the failed landings set aside.
fn retry(snap: &Snapshot, from: &str, to: SocketAddr, failed: &[WorkloadUid]) -> Decision {
    let src = snap.workloads().find(|w| w.name == from).unwrap().clone();
    let dst = Destination::Addr(to);
    let d = route(
        snap,
        Source::new(&src).excluding(failed),
        &dst,
        &mut SplitMix64::new(1),
    );
    let planned = plan(
        snap,
        Source::new(&src).excluding(failed),
        &dst,
        &mut SplitMix64::new(1),
    );
    assert_eq!(planned, d.outcome, "plan() and route() disagree");
    d
}

#[test]
fn a_retry_picks_another_endpoint_of_the_same_decision_never_one_out_of_scope() {
    let mut m = flat();
    m.service("ledger", &[("net", "198.18.100.1")], 80, 8080)
        .scope = ServiceScope::local();
    m.pod("ledger-east", "east-1", "198.18.1.20");
    m.pod("ledger-east-2", "east-1", "198.18.1.21");
    m.pod("ledger-west", "west-1", "198.18.2.20");
    m.backs("ledger-east", "ledger")
        .backs("ledger-east-2", "ledger")
        .backs("ledger-west", "ledger");
    let snap = m.build();
    let to: SocketAddr = "198.18.100.1:80".parse().unwrap();
    let first = landing(&retry(&snap, "sleep", to, &[]));
    let failed = [WorkloadUid::new(first.clone())];
    let second = retry(&snap, "sleep", to, &failed);
    let other = landing(&second);
    assert_ne!(other, first);
    assert!(
        other.starts_with("east//"),
        "{other}: out of the local scope"
    );
    assert!(second.steps.iter().any(|s| matches!(
        s,
        Step::Dropped { candidate, reason: DropReason::FailedBefore, .. } if *candidate == first
    )));
    // Both local endpoints failed: the connection fails; west's endpoint is never tried.
    let both = [WorkloadUid::new(first), WorkloadUid::new(other)];
    assert!(matches!(
        retry(&snap, "sleep", to, &both).outcome,
        Err(RouteError::NoEndpoint { .. })
    ));
}

#[test]
fn a_retry_after_a_failed_waypoint_instance_picks_another_instance_in_scope() {
    let mut m = flat();
    local_service_global_waypoint(&mut m);
    m.waypoint_pod("shared-wp", "wp-east-2", "east-1", "198.18.1.51");
    let snap = m.build();
    let to: SocketAddr = "198.18.100.1:80".parse().unwrap();
    let first = landing(&retry(&snap, "sleep", to, &[]));
    assert!(first.starts_with("east//"), "{first}");
    let failed = [WorkloadUid::new(first.clone())];
    let other = landing(&retry(&snap, "sleep", to, &failed));
    assert_ne!(other, first);
    assert!(other.starts_with("east//v1/Pod/default/wp-east"), "{other}");
    // Both east instances failed: the local service fails rather than use west's instance.
    let both = [WorkloadUid::new(first), WorkloadUid::new(other)];
    assert!(matches!(
        retry(&snap, "sleep", to, &both).outcome,
        Err(RouteError::NoWaypointEndpoint { .. })
    ));
}

#[test]
fn a_hop_that_is_no_workload_routes_from_where_it_stands() {
    let mut m = two_networks();
    m.waypoint("wp", WaypointFor::Service);
    m.waypoint_pod("wp", "wp-east", "east-1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-west", "west-1", "198.19.1.50");
    let s = m.service(
        "echo",
        &[("net-east", "198.18.100.1"), ("net-west", "198.19.100.1")],
        80,
        8080,
    );
    s.waypoint = Some(waypoint_ref("wp"));
    m.pod("echo-west-1", "west-1", "198.19.1.40");
    m.backs("echo-west-1", "echo");
    let snap = m.build();
    let by_name = |n: &str| snap.workloads().find(|w| w.name == n).unwrap().clone();
    let (wp_east, sleep_west) = (by_name("wp-east"), by_name("sleep-west"));
    let wp_id = wp_east.identity().unwrap();
    let gw_id: Identity = "spiffe://cluster.local/ns/default/sa/eastwest"
        .parse()
        .unwrap();
    let east: crate::model::ClusterId = "east".into();
    let dst = Destination::Host {
        hostname: hostname("echo"),
        port: 80,
    };
    // A gateway standing on net-west in west's cluster, no workload of the mesh.
    let gw = Source::hop(&sleep_west.network, &sleep_west.cluster, &gw_id, &east);
    assert!(gw.workload.is_none());
    assert_eq!(gw.namespace, "default");
    let at_gateway = |src: Source<'_>| route(&snap, src, &dst, &mut SplitMix64::new(1));
    // Past echo's waypoint (sent by an instance): the pod on the gateway's own network.
    let d = at_gateway(gw.sent_by(&wp_id));
    assert_eq!(landing(&d), "west//v1/Pod/default/echo-west-1");
    assert!(matches!(
        d.outcome,
        Ok(Plan {
            waypoint: None,
            transport: Transport::Hbone { .. },
            ..
        })
    ));
    // Sent by anyone else: echo's waypoint on that network, as a workload standing there gets.
    let d = at_gateway(gw);
    assert_eq!(landing(&d), "west//v1/Pod/default/wp-west");
    let as_workload = at_gateway(Source::on_behalf_of(&sleep_west, &east));
    assert_eq!(d.outcome, as_workload.outcome);
    // A pod address on the gateway's network is classified there.
    let d = route(
        &snap,
        gw,
        &Destination::Addr("198.19.1.40:8080".parse().unwrap()),
        &mut SplitMix64::new(1),
    );
    assert!(
        matches!(
            d.outcome,
            Ok(Plan {
                class: Class::Workload { .. },
                ..
            })
        ),
        "{:?}",
        d.outcome
    );
}

/// A terminating endpoint takes no new connection (another of the service does), and the
/// trace says why, apart from unhealthy; with no other endpoint, the decision fails rather
/// than choose it.
#[test]
fn a_terminating_endpoint_is_never_picked_and_the_trace_says_terminating() {
    let mut m = flat();
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    m.pod("echo-east", "east-1", "198.18.1.20");
    m.pod("echo-west", "west-1", "198.18.2.20");
    m.backs("echo-east", "echo").backs("echo-west", "echo");
    m.workload_mut("echo-east").health = Health::Terminating;
    let snap = m.build();
    for seed in 0..50 {
        let d = decide_seeded(&snap, "sleep", "198.18.100.1:80", seed);
        assert_eq!(landing(&d), "west//v1/Pod/default/echo-west", "seed {seed}");
        assert!(
            d.steps.iter().any(|s| matches!(s,
                Step::Dropped {
                    candidate,
                    reason: DropReason::Balancer(crate::lb::LbDrop::Terminating),
                    ..
                } if candidate == "east//v1/Pod/default/echo-east")),
            "seed {seed}: {:?}",
            d.steps
        );
    }
    m.workload_mut("echo-west").health = Health::Unhealthy;
    let d = decide(&m.build(), "sleep", "198.18.100.1:80");
    assert!(
        matches!(d.outcome, Err(RouteError::NoEndpoint { .. })),
        "{:?}",
        d.outcome
    );
}

/// An ejected endpoint is set aside like an unhealthy one, and the trace says "ejected"; the
/// others of the service take the connection.
#[test]
fn an_ejected_endpoint_is_set_aside_and_the_trace_says_ejected() {
    let mut m = flat();
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    m.pod("echo-east", "east-1", "198.18.1.20");
    m.pod("echo-west", "west-1", "198.18.2.20");
    m.backs("echo-east", "echo").backs("echo-west", "echo");
    let snap = m.build();
    let ejected: crate::outlier::Ejected = [crate::model::WorkloadUid::new(
        "east//v1/Pod/default/echo-east",
    )]
    .into_iter()
    .collect();
    let sleep = snap.workloads().find(|w| w.name == "sleep").unwrap();
    let dst = Destination::Addr("198.18.100.1:80".parse().unwrap());
    for seed in 0..50 {
        let src = Source::new(sleep).ejecting(&ejected);
        let d = route(&snap, src, &dst, &mut SplitMix64::new(seed));
        assert_eq!(landing(&d), "west//v1/Pod/default/echo-west", "seed {seed}");
        assert!(
            d.steps.iter().any(|s| matches!(s,
                Step::Dropped { candidate, reason: DropReason::Ejected, .. }
                    if candidate == "east//v1/Pod/default/echo-east")),
            "seed {seed}: {:?}",
            d.steps
        );
    }
}

mod failover;

/// A dual-stack mesh: `echo` has an IPv4 and an IPv6 address, `old` only IPv4; the service
/// `echo` has a VIP of each family.
fn dual_stack() -> Snapshot {
    let mut m = flat();
    m.pod("echo", "west-1", "198.18.2.20")
        .addresses
        .push(ip("2001:2::2:20"));
    m.pod("old", "west-1", "198.18.2.30");
    m.service(
        "echo",
        &[("net", "198.18.100.1"), ("net", "2001:2::100:1")],
        80,
        8080,
    );
    m.backs("echo", "echo");
    m.build()
}

fn hbone(d: &Decision) -> (SocketAddr, String) {
    match &d.outcome {
        Ok(Plan {
            transport:
                Transport::Hbone {
                    connect_to,
                    authority,
                    ..
                },
            ..
        }) => (*connect_to, authority.clone()),
        other => panic!("expected HBONE, got {other:?}"),
    }
}

#[test]
fn a_dual_stack_endpoint_is_reached_in_the_family_dialled() {
    let snap = dual_stack();
    let table = [
        // (dialled, HBONE address, authority)
        (
            "[2001:2::2:20]:8080",
            "[2001:2::2:20]:15008",
            "[2001:2::2:20]:8080",
        ),
        ("198.18.2.20:8080", "198.18.2.20:15008", "198.18.2.20:8080"),
        (
            "[2001:2::100:1]:80",
            "[2001:2::2:20]:15008",
            "[2001:2::2:20]:8080",
        ),
        ("198.18.100.1:80", "198.18.2.20:15008", "198.18.2.20:8080"),
        // A hostname goes over IPv4, the first address.
        (
            "echo.default.svc.cluster.local:80",
            "198.18.2.20:15008",
            "198.18.2.20:8080",
        ),
    ];
    for (dialled, connect_to, authority) in table {
        let d = decide(&snap, "sleep", dialled);
        assert_eq!(landing(&d), "west//v1/Pod/default/echo", "{dialled}");
        let (to, auth) = hbone(&d);
        assert_eq!(to, connect_to.parse::<SocketAddr>().unwrap(), "{dialled}");
        assert_eq!(auth, authority, "{dialled}");
    }
}

#[test]
fn an_ipv4_only_endpoint_is_reached_over_ipv4_from_an_ipv6_vip() {
    let mut m = flat();
    m.pod("old", "west-1", "198.18.2.30");
    m.service("old", &[("net", "2001:2::100:2")], 80, 8080);
    m.backs("old", "old");
    let d = decide(&m.build(), "sleep", "[2001:2::100:2]:80");
    assert_eq!(
        hbone(&d),
        (
            "198.18.2.30:15008".parse().unwrap(),
            "198.18.2.30:8080".into()
        )
    );
}
