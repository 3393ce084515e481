//! Graduated failover through the routing decision, and waypoints chosen by what they reach.

use super::{decide_seeded, landing};
use crate::lb::{LbDrop, TierShare};
use crate::model::{
    FailoverMinimum, Health, HealthPolicy, LbMode, LoadBalancing, LocalityScope, ServiceScope,
    WaypointFor,
};
use crate::outlier::{OutlierConfig, Outliers};
use crate::random::SplitMix64;
use crate::route::{Destination, DropReason, Near, Source, Step, route};
use crate::snapshot::Snapshot;
use crate::testing::{MeshBuilder, waypoint_ref};

/// One cluster, one network; nodes in zones z1 and z2 of region r1 and in z1 of region r2; a
/// client `sleep` in r1/z1.
fn zones() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("main", "net");
    m.node("n-z1", "main", "r1/z1")
        .node("n-z2", "main", "r1/z2")
        .node("n-z3", "main", "r1/z3")
        .node("n-r2", "main", "r2/z1");
    m.pod("sleep", "n-z1", "198.18.1.10");
    m
}

/// Where `n` decisions from `from` to `to` land, by workload name.
fn landings(
    snap: &Snapshot,
    from: &str,
    to: &str,
    n: u64,
) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for seed in 0..n {
        let l = landing(&decide_seeded(snap, from, to, seed));
        let name = l.rsplit('/').next().unwrap_or(&l).to_string();
        *out.entry(name).or_default() += 1;
    }
    out
}

fn graduated(min: FailoverMinimum) -> LoadBalancing {
    LoadBalancing {
        mode: LbMode::Failover,
        routing_preference: vec![LocalityScope::Region, LocalityScope::Zone],
        health_policy: HealthPolicy::OnlyHealthy,
        failover_minimum: Some(min),
    }
}

/// `web` at 198.18.100.1:80 with three pods in z1 and two in z2.
fn web(m: &mut MeshBuilder, lb: Option<LoadBalancing>) {
    m.service("web", &[("net", "198.18.100.1")], 80, 8080)
        .load_balancing = lb;
    for (name, node, addr) in [
        ("web-a1", "n-z1", "198.18.1.21"),
        ("web-a2", "n-z1", "198.18.1.22"),
        ("web-a3", "n-z1", "198.18.1.23"),
        ("web-b1", "n-z2", "198.18.2.21"),
        ("web-b2", "n-z2", "198.18.2.22"),
    ] {
        m.pod(name, node, addr);
        m.backs(name, "web");
    }
}

fn near_share(l: &std::collections::BTreeMap<String, u64>) -> u64 {
    l.iter()
        .filter(|(k, _)| k.starts_with("web-a"))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn the_near_tier_keeps_everything_while_it_has_its_minimum() {
    let mut m = zones();
    web(&mut m, Some(graduated(FailoverMinimum::Endpoints(2))));
    m.workload_mut("web-a1").health = Health::Unhealthy;
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 300);
    assert_eq!(near_share(&l), 300, "{l:?}");
}

#[test]
fn below_its_minimum_the_near_tier_spills_in_proportion_and_comes_back() {
    let mut m = zones();
    web(&mut m, Some(graduated(FailoverMinimum::Endpoints(2))));
    m.workload_mut("web-a1").health = Health::Unhealthy;
    m.workload_mut("web-a2").health = Health::Unhealthy;
    let snap = m.build();
    let l = landings(&snap, "sleep", "198.18.100.1:80", 2000);
    // One usable of a minimum of 2: half stays (all on web-a3), half spills to z2.
    assert!((850..1150).contains(&near_share(&l)), "{l:?}");
    assert_eq!(l.get("web-a1"), None);
    assert_eq!(l.get("web-a2"), None);
    let d = decide_seeded(&snap, "sleep", "198.18.100.1:80", 1);
    let tiers: Vec<&Vec<TierShare>> = d
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Tiers { tiers, .. } => Some(tiers),
            _ => None,
        })
        .collect();
    assert_eq!(tiers.len(), 1, "{:#?}", d.steps);
    let shares: Vec<(usize, u32)> = tiers[0].iter().map(|t| (t.rank, t.share_ppm)).collect();
    assert_eq!(shares, vec![(2, 500_000), (1, 500_000)]);
    // Istio's failover (no minimum) on the same mesh keeps everything near.
    m.service_mut("web")
        .load_balancing
        .as_mut()
        .unwrap()
        .failover_minimum = None;
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 300);
    assert_eq!(near_share(&l), 300, "{l:?}");
    // Restored: everything near again.
    m.service_mut("web").load_balancing = Some(graduated(FailoverMinimum::Endpoints(2)));
    m.workload_mut("web-a1").health = Health::Healthy;
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 300);
    assert_eq!(near_share(&l), 300, "{l:?}");
}

#[test]
fn an_ejected_endpoint_is_lost_capacity_of_its_tier() {
    let mut m = zones();
    web(&mut m, Some(graduated(FailoverMinimum::Percent(100))));
    m.workload_mut("web-a3").health = Health::Unhealthy;
    let snap = m.build();
    // web-a1 ejected by this node's outlier detection: the near tier has 1 of 3 usable.
    let mut o = Outliers::new(OutlierConfig {
        consecutive_failures: 1,
        ..OutlierConfig::default()
    });
    let a1 = snap
        .workloads()
        .find(|w| w.name == "web-a1")
        .unwrap()
        .uid
        .clone();
    o.failure(&snap, &a1, std::time::Instant::now());
    let ejected = o.ejected();
    assert!(ejected.contains(&a1));
    let src = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let dst = Destination::Addr("198.18.100.1:80".parse().unwrap());
    let mut rng = SplitMix64::new(3);
    let (mut near, n) = (0, 3000);
    for _ in 0..n {
        let d = route(&snap, Source::new(&src).ejecting(&ejected), &dst, &mut rng);
        let l = landing(&d);
        assert!(!l.ends_with("web-a1"), "an ejected endpoint was picked");
        near += u32::from(l.ends_with("web-a2"));
    }
    // Health 1/3 of a 100% minimum: a third stays near.
    assert!((850..1150).contains(&near), "{near} of {n}");
}

#[test]
fn a_spill_never_leaves_the_scope() {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "r1/z1")
        .node("west-1", "west", "r1/z1");
    m.node("east-2", "east", "r1/z2");
    m.pod("sleep", "east-1", "198.18.1.10");
    let s = m.service("web", &[("net", "198.18.100.1")], 80, 8080);
    s.load_balancing = Some(graduated(FailoverMinimum::Endpoints(3)));
    s.scope = ServiceScope::local();
    // Near tier (z1): one in east, two in west (same zone, out of scope); next tier: east-2.
    for (name, node, addr) in [
        ("web-e1", "east-1", "198.18.1.21"),
        ("web-w1", "west-1", "198.18.3.21"),
        ("web-w2", "west-1", "198.18.3.22"),
        ("web-e2", "east-2", "198.18.2.21"),
    ] {
        m.pod(name, node, addr);
        m.backs(name, "web");
    }
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 600);
    assert!(l.keys().all(|k| k.starts_with("web-e")), "{l:?}");
    // The out-of-scope pods are not in the near tier either: it has 1 of 3, and so has the
    // next tier: a third each, two thirds together, scaled up to the whole: half each.
    // Counted with the west pods, the near tier would have kept everything.
    let near = l.get("web-e1").copied().unwrap_or(0);
    assert!((240..360).contains(&near), "{l:?}");
}

/// `web` behind waypoint `wp` with instances in z1 (near the client) and z2; backends: two in
/// z1, one in z2.
fn web_behind_waypoints() -> MeshBuilder {
    let mut m = zones();
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("wp", "wp-z1", "n-z1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-z2", "n-z2", "198.18.2.50");
    m.service("web", &[("net", "198.18.100.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    for (name, node, addr) in [
        ("web-a1", "n-z1", "198.18.1.21"),
        ("web-a2", "n-z1", "198.18.1.22"),
        ("web-b1", "n-z2", "198.18.2.21"),
    ] {
        m.pod(name, node, addr);
        m.backs(name, "web");
    }
    m
}

#[test]
fn a_near_waypoint_in_front_of_dead_backends_loses_to_a_far_one_in_front_of_live_ones() {
    let mut m = web_behind_waypoints();
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-z1"), Some(&100), "all alive: the near waypoint");
    m.workload_mut("web-a1").health = Health::Unhealthy;
    m.workload_mut("web-a2").health = Health::Terminating;
    let snap = m.build();
    let l = landings(&snap, "sleep", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-z2"), Some(&100), "{l:?}");
    let d = decide_seeded(&snap, "sleep", "198.18.100.1:80", 1);
    assert!(
        d.steps.iter().any(|s| matches!(s,
            Step::Dropped { candidate, reason: DropReason::NoLiveBackendsNear { near: Near::Zone, .. }, .. }
                if candidate.ends_with("wp-z1"))),
        "{:#?}",
        d.steps
    );
    assert!(
        d.steps.iter().any(|s| matches!(s,
            Step::WaypointReach { instances, .. }
                if instances.iter().map(|(_, r)| *r).collect::<Vec<_>>() == [0, 1])),
        "{:#?}",
        d.steps
    );
    // One comes back: the near waypoint again.
    m.workload_mut("web-a1").health = Health::Healthy;
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-z1"), Some(&100), "{l:?}");
}

#[test]
fn the_region_decides_when_no_zone_holds_both_and_an_instance_near_no_backend_keeps_its_turn() {
    let mut m = zones();
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("wp", "wp-r2", "n-r2", "198.18.4.50");
    m.waypoint_pod("wp", "wp-z2", "n-z2", "198.18.2.50");
    m.service("web", &[("net", "198.18.100.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    // Live: one backend in r1/z3, where no waypoint runs. A client in r2.
    m.pod("web-c1", "n-z3", "198.18.5.21");
    m.backs("web-c1", "web");
    m.pod("client", "n-r2", "198.18.4.10");
    // No backend in r2 at all: wp-r2 is in front of nothing dead; it is nearest, it goes.
    let l = landings(&m.build(), "client", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-r2"), Some(&100), "{l:?}");
    // A dead backend in r2: wp-r2 is in front of it, and r1 (wp-z2) holds the live one.
    m.pod("web-r2", "n-r2", "198.18.4.21").health = Health::Unhealthy;
    m.backs("web-r2", "web");
    let snap = m.build();
    let l = landings(&snap, "client", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-z2"), Some(&100), "the region decides: {l:?}");
    let d = decide_seeded(&snap, "client", "198.18.100.1:80", 1);
    assert!(
        d.steps.iter().any(|s| matches!(s,
            Step::Dropped { candidate, reason: DropReason::NoLiveBackendsNear { near: Near::Region, .. }, .. }
                if candidate.ends_with("wp-r2"))),
        "{:#?}",
        d.steps
    );
    // All dead: reachability says nothing, the nearest waypoint is chosen as before.
    m.workload_mut("web-c1").health = Health::Unhealthy;
    let l = landings(&m.build(), "client", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-r2"), Some(&100), "{l:?}");
}

#[test]
fn a_waypoint_with_no_backend_on_its_network_still_sends_across_it() {
    // Pods only on the other network: the near instance forwards through the gateway, as
    // before; it is in front of no dead backend.
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("east-1", "east", "r1/z1")
        .node("west-1", "west", "r2/z1");
    m.gateway("gw-west", "west", "198.19.255.1");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("wp", "wp-east", "east-1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-west", "west-1", "198.19.1.50");
    m.service("web", &[("net-east", "198.18.100.1")], 80, 8080)
        .waypoint = Some(waypoint_ref("wp"));
    m.pod("web-w", "west-1", "198.19.1.21");
    m.backs("web-w", "web");
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 50);
    assert_eq!(l.get("wp-east"), Some(&50), "{l:?}");
}

#[test]
fn backends_out_of_scope_give_a_waypoint_no_reach() {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "r1/z1")
        .node("east-2", "east", "r1/z2");
    m.node("west-2", "west", "r1/z2");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    m.waypoint_pod("wp", "wp-z1", "east-1", "198.18.1.50");
    m.waypoint_pod("wp", "wp-z2", "east-2", "198.18.2.50");
    let s = m.service("web", &[("net", "198.18.100.1")], 80, 8080);
    s.waypoint = Some(waypoint_ref("wp"));
    s.scope = ServiceScope::local();
    // Live in z2, but in west: out of scope for east. The z1 backend in east is dead.
    m.pod("web-w", "west-2", "198.18.3.21");
    m.pod("web-e", "east-1", "198.18.1.21").health = Health::Unhealthy;
    m.backs("web-w", "web").backs("web-e", "web");
    let l = landings(&m.build(), "sleep", "198.18.100.1:80", 100);
    assert_eq!(l.get("wp-z1"), Some(&100), "{l:?}");
}

#[test]
fn lb_drops_in_another_tier_say_so() {
    let mut m = zones();
    web(&mut m, Some(graduated(FailoverMinimum::Endpoints(2))));
    m.workload_mut("web-a1").health = Health::Unhealthy;
    m.workload_mut("web-a2").health = Health::Unhealthy;
    let snap = m.build();
    let other_tier = (0..50).any(|seed| {
        decide_seeded(&snap, "sleep", "198.18.100.1:80", seed)
            .steps
            .iter()
            .any(|s| {
                matches!(
                    s,
                    Step::Dropped {
                        reason: DropReason::Balancer(LbDrop::OtherTier { .. }),
                        ..
                    }
                )
            })
    });
    assert!(other_tier);
}
