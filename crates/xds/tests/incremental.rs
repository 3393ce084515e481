//! The node's incremental path: random sequences of pushes (workloads, services, policies and
//! now and then a gateway, added, changed and removed; some with duplicate addresses, wrong
//! networks, nodes of two clusters or unresolved waypoints) applied with `incremental::update`,
//! each against a full `assemble` of the same resources. The snapshots must be equal, the same
//! resources set aside, and the same resources held after.

use std::collections::BTreeSet;
use std::sync::Arc;

use ferry_core::model::{
    Action, GatewayDestination, GatewayRef, HBONE_PORT, NetworkAddress, Policy, PolicyKey,
    PolicyScope, PortMapping, ServiceKey, WorkloadUid,
};
use ferry_core::random::SplitMix64;
use ferry_core::snapshot::Snapshot;
use ferry_core::testing::Gen;
use ferry_core::testing::{MeshBuilder, ip};
use ferry_xds::assemble::{Held, assemble};
use ferry_xds::convert::Decoded;
use ferry_xds::incremental::{Changed, Update, update};
use proptest::prelude::*;

const WORKLOADS: usize = 16;
const SERVICES: usize = 4;
const POLICIES: usize = 3;

fn service_key(i: usize) -> ServiceKey {
    ServiceKey::new("default", format!("svc{i}.default.svc.cluster.local"))
}

fn policy_key(i: usize) -> PolicyKey {
    PolicyKey::new("default", format!("pol{i}"))
}

fn workload_name(i: usize) -> String {
    format!("c//v1/Pod/default/pod{i}")
}

fn waypoint(g: &mut Gen) -> Option<GatewayRef> {
    g.chance(8).then(|| GatewayRef {
        destination: GatewayDestination::Service(service_key(g.below(SERVICES + 1))),
        hbone_port: HBONE_PORT,
    })
}

/// One random address resource or policy, with its name.
enum Resource {
    Address(String, Decoded),
    Policy(String, Policy),
}

fn resource(g: &mut Gen, m: &mut MeshBuilder) -> Resource {
    match g.below(12) {
        0 | 1 => {
            let i = g.below(SERVICES);
            let mut s = m.services[0].clone();
            s.name = format!("svc{i}");
            s.hostname = format!("svc{i}.default.svc.cluster.local");
            s.vips = vec![NetworkAddress::new(
                format!("n{}", g.below(2)).as_str().into(),
                ip(&format!("198.18.1.{}", 1 + g.below(SERVICES + 1))),
            )];
            s.waypoint = waypoint(g);
            Resource::Address(s.key().to_string(), Decoded::Service(Arc::new(s)))
        }
        2 => {
            let i = g.below(POLICIES);
            let key = policy_key(i);
            let p = Policy {
                name: key.name.clone(),
                namespace: key.namespace.clone(),
                scope: [
                    PolicyScope::Mesh,
                    PolicyScope::Namespace,
                    PolicyScope::WorkloadSelector,
                ][g.below(3)],
                action: Action::Allow,
                rules: vec![],
                dry_run: false,
            };
            Resource::Policy(key.to_string(), p)
        }
        3 if g.chance(15) => {
            let mut gw = m.gateways[0].clone();
            gw.name = format!("gw{}", g.below(2));
            let name = format!("c0//v1/Pod/istio-system/{}", gw.name);
            Resource::Address(name, Decoded::Gateway(Arc::new(gw)))
        }
        _ => {
            let i = g.below(WORKLOADS);
            let c = g.below(3);
            let mut w = m.workloads[0].clone();
            w.uid = WorkloadUid::new(workload_name(i));
            w.name = format!("pod{i}");
            w.service_account = format!("sa{i}");
            w.cluster = format!("c{c}").as_str().into();
            // A cluster's network, mostly: c0 and c2 on n0, c1 on n1.
            let net = if g.chance(95) { c % 2 } else { (c + 1) % 2 };
            w.network = format!("n{net}").as_str().into();
            // Nodes mostly of one cluster each: node k in cluster k % 3.
            let k = g.below(6);
            w.node = g.chance(90).then(|| {
                let k = if g.chance(95) { k - k % 3 + c } else { k };
                format!("node{k}").as_str().into()
            });
            Arc::make_mut(&mut w.locality).zone = format!("z{}", g.below(2));
            w.addresses = vec![ip(&format!("198.18.0.{}", 1 + g.below(24)))];
            w.capacity = g.below(4) as u32;
            w.services = (0..SERVICES + 1)
                .filter(|_| g.chance(25))
                .map(|s| {
                    let ports = vec![PortMapping {
                        service_port: 80,
                        target_port: 8080,
                    }];
                    (service_key(s), ports)
                })
                .collect();
            w.authorization_policies = (0..POLICIES + 1)
                .filter(|_| g.chance(15))
                .map(policy_key)
                .collect();
            w.waypoint = waypoint(g);
            Resource::Address(workload_name(i), Decoded::Workload(Arc::new(w)))
        }
    }
}

/// Applies a push to `held`, returning what it changed (as the client collects it).
fn push(held: &mut Held, upserts: &[Resource], removed: &[(bool, String)]) -> Changed {
    let mut changed = Changed::default();
    for (address, name) in removed {
        if *address {
            let was = held.addresses.remove(name.as_str());
            changed.addresses.entry(name.clone()).or_insert(was);
        } else {
            let was = held.policies.remove(name);
            changed.policies.entry(name.clone()).or_insert(was);
        }
    }
    for r in upserts {
        match r {
            Resource::Address(name, d) => {
                let was = held.addresses.insert(name.as_str().into(), d.clone());
                changed.addresses.entry(name.clone()).or_insert(was);
            }
            Resource::Policy(name, p) => {
                let was = held.policies.insert(name.clone(), Arc::new(p.clone()));
                changed.policies.entry(name.clone()).or_insert(was);
            }
        }
    }
    changed
}

fn names(held: &Held) -> (BTreeSet<String>, BTreeSet<String>) {
    (
        held.addresses.keys().map(|n| n.to_string()).collect(),
        held.policies.keys().cloned().collect(),
    )
}

/// Runs `steps` pushes; returns how many set nothing aside and how many were applied
/// incrementally.
fn run(seed: u64, steps: usize) -> Result<(usize, usize), TestCaseError> {
    let mut m = MeshBuilder::new();
    m.cluster("c0", "n0").node("node0", "c0", "r/z/s");
    m.gateway("gw0", "c0", "198.19.255.1");
    m.pod("pod0", "node0", "198.18.0.1");
    m.service("svc0", &[("n0", "198.18.1.1")], 80, 8080);
    let mut g = Gen(SplitMix64::new(seed));
    let mut held = Held::default();
    let mut reference = Held::default();
    let mut current = Snapshot::default();
    let (mut clean, mut fast) = (0, 0);
    for step in 0..steps {
        let version = step as u64 + 1;
        // The first push brings many resources, as a first sync does.
        let n = if step == 0 { 20 } else { 1 + g.below(3) };
        let upserts: Vec<Resource> = (0..n).map(|_| resource(&mut g, &mut m)).collect();
        let removed: Vec<(bool, String)> = (0..g.below(2))
            .map(|_| match g.below(6) {
                0 => (true, service_key(g.below(SERVICES)).to_string()),
                1 => (false, policy_key(g.below(POLICIES)).to_string()),
                _ => (true, workload_name(g.below(WORKLOADS))),
            })
            .collect();
        let changed = push(&mut held, &upserts, &removed);
        push(&mut reference, &upserts, &removed);
        let Update {
            snapshot: snap,
            set_aside: aside,
            incremental,
        } = update(&mut held, &current, &changed, version);
        fast += usize::from(incremental);
        let (full, full_aside) = assemble(&reference, version);
        for bad in &full_aside {
            reference.addresses.remove(bad.name.as_str());
            reference.policies.remove(&bad.name);
        }
        let aside: BTreeSet<String> = aside.into_iter().map(|b| b.name).collect();
        let full_aside: BTreeSet<String> = full_aside.into_iter().map(|b| b.name).collect();
        prop_assert_eq!(
            &aside,
            &full_aside,
            "seed {} step {}: set aside",
            seed,
            step
        );
        prop_assert_eq!(
            names(&held),
            names(&reference),
            "seed {} step {}",
            seed,
            step
        );
        match (snap, full) {
            (Some(s), Some(f)) => {
                prop_assert!(s == f, "seed {seed} step {step}: snapshots differ");
                clean += usize::from(aside.is_empty());
                current = s;
            }
            (None, None) => {}
            (s, f) => prop_assert!(
                false,
                "seed {seed} step {step}: incremental {}, full {}",
                s.is_some(),
                f.is_some()
            ),
        }
    }
    Ok((clean, fast))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_push_applied_incrementally_equals_a_full_assembly(seed in any::<u64>()) {
        run(seed, 50)?;
    }
}

#[test]
fn the_generator_makes_clean_pushes_and_bad_ones() {
    let (mut clean, mut fast) = (0, 0);
    for seed in 0..10 {
        let (c, f) = run(seed, 50).expect("equal");
        clean += c;
        fast += f;
    }
    eprintln!("{clean} of 500 pushes set nothing aside, {fast} applied incrementally");
    assert!(
        clean > 200 && clean < 480 && fast > 150,
        "{clean} of 500 pushes set nothing aside, {fast} applied incrementally"
    );
}
