//! Incremental snapshots: random sequences of deltas (workloads, services, policies, gateways,
//! nodes and clusters added, changed and removed, valid or not) applied one after another with
//! `Snapshot::apply`, each against a full build of the same objects made from scratch (in bulk,
//! and one object after another). They must be equal (every entry and index), decide every
//! sampled route alike, and reject an invalid delta with the same error.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ferry_core::model::{
    Action, AddressEndpoint, Cluster, ClusterId, Gateway, GatewayDestination, GatewayRef,
    HBONE_PORT, Locality, NetworkAddress, Node, NodeName, Policy, PolicyKey, PolicyScope,
    PortMapping, Service, ServiceKey, Workload, WorkloadUid,
};
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, route};
use ferry_core::snapshot::{Snapshot, SnapshotBuilder, SnapshotDelta, SnapshotError};
use ferry_core::testing::Gen;
use ferry_core::testing::{MeshBuilder, ip};
use proptest::prelude::*;

const CLUSTERS: usize = 3;
const NODES: usize = 5;
const SERVICES: usize = 5;
const POLICIES: usize = 4;
const GATEWAYS: usize = 2;
const WORKLOADS: usize = 14;
/// Few addresses, so that objects collide on them now and then.
const ADDRESSES: usize = 30;

/// Templates made once by the test mesh builder, so new model fields get their defaults.
struct Templates {
    workload: Workload,
    service: Service,
    gateway: Gateway,
}

fn templates() -> Templates {
    let mut m = MeshBuilder::new();
    m.cluster("c0", "n0").node("node0", "c0", "r/z/s");
    m.gateway("gw0", "c0", "198.19.255.1");
    let workload = m.pod("pod0", "node0", "198.18.0.1").clone();
    let service = m.service("svc0", &[("n0", "198.18.1.1")], 80, 8080).clone();
    Templates {
        workload,
        service,
        gateway: m.gateways[0].clone(),
    }
}

fn address(g: &mut Gen) -> std::net::IpAddr {
    ip(&format!("198.18.0.{}", 1 + g.below(ADDRESSES)))
}

fn network(i: usize) -> String {
    format!("n{}", i % 2)
}

/// Mostly the cluster's own network, sometimes another.
fn network_of(g: &mut Gen, cluster: usize) -> String {
    if g.chance(92) {
        network(cluster)
    } else {
        network(cluster + 1)
    }
}

fn service_key(i: usize) -> ServiceKey {
    ServiceKey::new("default", format!("svc{i}.default.svc.cluster.local"))
}

fn policy_key(i: usize) -> PolicyKey {
    PolicyKey::new(
        if i.is_multiple_of(2) {
            "default"
        } else {
            "other"
        },
        format!("pol{i}"),
    )
}

fn waypoint(g: &mut Gen) -> Option<GatewayRef> {
    let destination = match g.below(16) {
        0 => GatewayDestination::Service(service_key(g.below(SERVICES))),
        1 => GatewayDestination::Address(NetworkAddress::new(
            network(g.below(2)).as_str().into(),
            address(g),
        )),
        _ => return None,
    };
    Some(GatewayRef {
        destination,
        hbone_port: HBONE_PORT,
    })
}

fn cluster(g: &mut Gen) -> Cluster {
    let i = g.below(CLUSTERS);
    // The network of a cluster changes rarely: such a delta is applied by a full build.
    let net = if g.chance(90) { i } else { i + 1 };
    Cluster {
        name: format!("c{i}").as_str().into(),
        network: network(net).as_str().into(),
    }
}

fn node(g: &mut Gen) -> Node {
    let i = g.below(NODES);
    Node {
        name: format!("node{i}").as_str().into(),
        cluster: format!(
            "c{}",
            if g.chance(90) {
                i % CLUSTERS
            } else {
                g.below(CLUSTERS + 1)
            }
        )
        .as_str()
        .into(),
        locality: Locality {
            region: format!("r{}", g.below(2)),
            zone: format!("z{}", g.below(2)),
            subzone: String::new(),
        },
        address: None,
    }
}

fn service(g: &mut Gen, t: &Templates) -> Service {
    let i = g.below(SERVICES);
    service_n(g, t, i)
}

fn service_n(g: &mut Gen, t: &Templates, i: usize) -> Service {
    let mut s = t.service.clone();
    s.name = format!("svc{i}");
    s.hostname = format!("svc{i}.default.svc.cluster.local");
    s.vips = (0..g.below(2))
        .map(|_| {
            NetworkAddress::new(
                network(g.below(2)).as_str().into(),
                ip(&format!("198.18.1.{}", 1 + g.below(SERVICES + 2))),
            )
        })
        .collect();
    s.waypoint = waypoint(g);
    s.address_endpoints = (0..g.below(2))
        .map(|_| AddressEndpoint {
            address: NetworkAddress::new(network(g.below(2)).as_str().into(), address(g)),
            cluster: format!("c{}", g.below(CLUSTERS + 1)).as_str().into(),
            ports: vec![],
        })
        .collect();
    s
}

fn policy(g: &mut Gen) -> Policy {
    let i = g.below(POLICIES);
    let key = policy_key(i);
    Policy {
        name: key.name,
        namespace: key.namespace,
        scope: [
            PolicyScope::Mesh,
            PolicyScope::Namespace,
            PolicyScope::WorkloadSelector,
        ][g.below(3)],
        action: if g.chance(50) {
            Action::Allow
        } else {
            Action::Deny
        },
        rules: vec![],
        dry_run: false,
    }
}

fn gateway(g: &mut Gen, t: &Templates) -> Gateway {
    let i = g.below(GATEWAYS);
    let c = g.below(CLUSTERS);
    let mut gw = t.gateway.clone();
    gw.name = format!("gw{i}");
    gw.cluster = format!("c{c}").as_str().into();
    gw.network = network_of(g, c).as_str().into();
    gw.address = ip(&format!("198.19.255.{}", 1 + g.below(3)));
    gw
}

fn workload(g: &mut Gen, t: &Templates) -> Workload {
    let i = g.below(WORKLOADS);
    let mut w = t.workload.clone();
    let n = g.below(NODES);
    // The cluster of the node it names, mostly.
    let c = if g.chance(92) {
        n % CLUSTERS
    } else {
        g.below(CLUSTERS)
    };
    w.uid = WorkloadUid::new(format!("c//v1/Pod/default/pod{i}"));
    w.name = format!("pod{i}");
    w.namespace = if g.chance(70) { "default" } else { "other" }.into();
    w.service_account = if g.chance(97) {
        format!("sa{i}")
    } else {
        String::new()
    };
    w.cluster = format!("c{c}").as_str().into();
    w.network = network_of(g, c).as_str().into();
    w.node = g
        .chance(90)
        .then(|| NodeName::from(format!("node{n}").as_str()));
    w.addresses = (0..g.below(3)).map(|_| address(g)).collect();
    w.capacity = g.below(3) as u32;
    w.services = (0..SERVICES)
        .filter(|_| g.chance(30))
        .map(|s| {
            (
                service_key(s),
                vec![PortMapping {
                    service_port: 80,
                    target_port: 8080,
                }],
            )
        })
        .collect();
    w.authorization_policies = (0..POLICIES)
        .filter(|_| g.chance(10))
        .map(policy_key)
        .collect();
    w.waypoint = waypoint(g);
    w.network_gateway = g.chance(20).then(|| GatewayRef {
        destination: GatewayDestination::Address(NetworkAddress::new(
            network(g.below(2)).as_str().into(),
            ip(&format!("198.19.255.{}", 1 + g.below(3))),
        )),
        hbone_port: HBONE_PORT,
    });
    w
}

/// The objects of the current snapshot, by key.
#[derive(Clone, Default)]
struct Objects {
    clusters: BTreeMap<ClusterId, Cluster>,
    nodes: BTreeMap<NodeName, Node>,
    services: BTreeMap<ServiceKey, Arc<Service>>,
    gateways: BTreeMap<String, Arc<Gateway>>,
    policies: BTreeMap<PolicyKey, Arc<Policy>>,
    workloads: BTreeMap<WorkloadUid, Arc<Workload>>,
}

/// A random delta of one to five changes; one in three also removes something.
fn delta(g: &mut Gen, t: &Templates, version: u64) -> SnapshotDelta {
    let mut d = SnapshotDelta::new(version);
    for _ in 0..1 + g.below(5) {
        let remove = g.chance(20);
        match g.below(20) {
            0 if remove && g.chance(30) => d
                .removed_clusters
                .push(format!("c{}", g.below(CLUSTERS)).as_str().into()),
            0 | 1 => d.clusters.push(cluster(g)),
            2 | 3 if remove => d
                .removed_nodes
                .push(format!("node{}", g.below(NODES)).as_str().into()),
            2 | 3 => d.nodes.push(node(g)),
            4..=6 if remove => d.removed_services.push(service_key(g.below(SERVICES))),
            4..=6 => d.services.push(Arc::new(service(g, t))),
            7 if remove => d.removed_gateways.push(format!("gw{}", g.below(GATEWAYS))),
            7 => d.gateways.push(Arc::new(gateway(g, t))),
            8 | 9 if remove => d.removed_policies.push(policy_key(g.below(POLICIES))),
            8 | 9 => d.policies.push(Arc::new(policy(g))),
            _ if remove => d.removed_workloads.push(WorkloadUid::new(format!(
                "c//v1/Pod/default/pod{}",
                g.below(WORKLOADS)
            ))),
            _ => d.workloads.push(Arc::new(workload(g, t))),
        }
    }
    d
}

/// The first delta: every cluster and node, a few services and policies, mostly valid.
fn start(g: &mut Gen, t: &Templates) -> SnapshotDelta {
    let mut d = SnapshotDelta::new(1);
    d.clusters = (0..CLUSTERS)
        .map(|i| Cluster {
            name: format!("c{i}").as_str().into(),
            network: network(i).as_str().into(),
        })
        .collect();
    d.nodes = (0..NODES)
        .map(|i| Node {
            name: format!("node{i}").as_str().into(),
            cluster: format!("c{}", i % CLUSTERS).as_str().into(),
            ..node(g)
        })
        .collect();
    // Valid services: one VIP each, their own; no references.
    d.services = (0..SERVICES)
        .map(|i| {
            let mut s = service_n(g, t, i);
            s.vips = vec![NetworkAddress::new(
                "n0".into(),
                ip(&format!("198.18.1.{}", i + 1)),
            )];
            s.waypoint = None;
            s.address_endpoints.clear();
            Arc::new(s)
        })
        .collect();
    d.policies = (0..2).map(|_| Arc::new(policy(g))).collect();
    d
}

/// The objects after `d`, and the full build of them: the objects kept in key order, then the
/// delta's in its order (what `Snapshot::apply` promises to equal).
fn full_build(before: &Objects, d: &SnapshotDelta) -> (Objects, Result<Snapshot, SnapshotError>) {
    let mut after = before.clone();
    let mut b = SnapshotBuilder::new(d.version);
    macro_rules! kind {
        ($map:ident, $removed:ident, $given:ident, $key:expr, $add:ident) => {{
            for k in &d.$removed {
                after.$map.remove(k);
            }
            for o in &d.$given {
                after.$map.remove(&$key(o));
            }
            for o in after.$map.values() {
                b.$add(o.clone());
            }
            for o in &d.$given {
                b.$add(o.clone());
                after.$map.insert($key(o), o.clone());
            }
        }};
    }
    kind!(
        clusters,
        removed_clusters,
        clusters,
        |c: &Cluster| c.name.clone(),
        cluster
    );
    kind!(nodes, removed_nodes, nodes, |n: &Node| n.name.clone(), node);
    kind!(
        services,
        removed_services,
        services,
        |s: &Arc<Service>| s.key(),
        service_shared
    );
    kind!(
        gateways,
        removed_gateways,
        gateways,
        |g: &Arc<Gateway>| g.name.clone(),
        gateway_shared
    );
    kind!(
        policies,
        removed_policies,
        policies,
        |p: &Arc<Policy>| p.key(),
        policy_shared
    );
    kind!(
        workloads,
        removed_workloads,
        workloads,
        |w: &Arc<Workload>| w.uid.clone(),
        workload_shared
    );
    // The bulk build and the one that adds object after object agree too.
    let one_by_one = b.clone().build_one_by_one();
    let full = b.build();
    assert_eq!(full, one_by_one, "bulk and one-by-one builds differ");
    (after, full)
}

/// Every routing decision from every workload to every address and hostname, with one seed.
fn decisions(snap: &Snapshot, seed: u64) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    let mut dests: Vec<Destination> = (1..=ADDRESSES)
        .map(|i| Destination::Addr(SocketAddr::new(ip(&format!("198.18.0.{i}")), 8080)))
        .chain(
            (1..=SERVICES + 2)
                .map(|i| Destination::Addr(SocketAddr::new(ip(&format!("198.18.1.{i}")), 80))),
        )
        .collect();
    dests.extend((0..SERVICES).map(|i| Destination::Host {
        hostname: format!("svc{i}.default.svc.cluster.local"),
        port: 80,
    }));
    let mut sources: Vec<_> = snap.workloads().cloned().collect();
    sources.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut out = Vec::new();
    for src in &sources {
        for d in &dests {
            let decision = route(snap, Source::new(src), d, &mut rng);
            out.push(format!("{} -> {d:?}: {:?}", src.uid, decision.outcome));
        }
    }
    out
}

/// Runs `steps` random deltas from an empty mesh; returns how many applied, how many were
/// rejected and the most workloads a snapshot had, so the generator can be checked.
fn run(seed: u64, steps: usize) -> Result<(usize, usize, usize), TestCaseError> {
    let t = templates();
    let mut g = Gen(SplitMix64::new(seed));
    let mut snap = Snapshot::default();
    let mut objects = Objects::default();
    let (mut applied, mut rejected, mut largest) = (0, 0, 0);
    for step in 0..steps {
        let d = if step == 0 {
            start(&mut g, &t)
        } else {
            delta(&mut g, &t, step as u64 + 1)
        };
        let incremental = snap.apply(&d);
        let (after, full) = full_build(&objects, &d);
        match (incremental, full) {
            (Ok(inc), Ok(full)) => {
                prop_assert!(
                    inc == full,
                    "seed {seed} step {step}: snapshots differ after {d:#?}"
                );
                prop_assert_eq!(
                    decisions(&inc, seed),
                    decisions(&full, seed),
                    "seed {} step {}",
                    seed,
                    step
                );
                largest = largest.max(inc.workloads().count());
                snap = inc;
                objects = after;
                applied += 1;
            }
            (Err(a), Err(b)) => {
                prop_assert_eq!(a, b, "seed {} step {}: {:#?}", seed, step, d);
                rejected += 1;
            }
            (a, b) => prop_assert!(
                false,
                "seed {seed} step {step}: apply {:?}, full build {:?}, delta {d:#?}",
                a.err(),
                b.err()
            ),
        }
    }
    Ok((applied, rejected, largest))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn applying_deltas_equals_a_full_build(seed in any::<u64>()) {
        run(seed, 60)?;
    }
}

#[test]
fn the_generator_both_applies_and_rejects() {
    let (mut applied, mut rejected, mut largest) = (0, 0, 0);
    for seed in 0..20 {
        let (a, r, l) = run(seed, 60).expect("equal");
        applied += a;
        rejected += r;
        largest = largest.max(l);
    }
    eprintln!("applied {applied}, rejected {rejected}, largest {largest}");
    assert!(
        applied > 400 && rejected > 100 && largest >= 8,
        "applied {applied}, rejected {rejected}, largest mesh {largest} workloads"
    );
}

/// An applied delta shares what it did not touch: the untouched workload is the same
/// allocation in both snapshots.
#[test]
fn an_applied_delta_shares_untouched_entries() {
    let mut m = MeshBuilder::new();
    m.cluster("c", "n").node("n1", "c", "r/z/s");
    m.pod("a", "n1", "198.18.0.1");
    m.pod("b", "n1", "198.18.0.2");
    let old = m.build();
    let a = old.workloads().find(|w| w.name == "a").unwrap().clone();
    let mut b = (**old.workloads().find(|w| w.name == "b").unwrap()).clone();
    b.capacity = 7;
    let mut d = SnapshotDelta::new(2);
    d.workloads.push(Arc::new(b.clone()));
    let new = old.apply(&d).expect("valid");
    assert!(
        Arc::ptr_eq(new.workload(&a.uid).unwrap(), &a),
        "untouched workload copied"
    );
    assert_eq!(new.workload(&b.uid).unwrap().capacity, 7);
    assert_eq!(
        old.workload(&b.uid).unwrap().capacity,
        1,
        "the old snapshot changed"
    );
    assert_eq!(new.version(), 2);
}
