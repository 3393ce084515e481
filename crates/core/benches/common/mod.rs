//! The generated mesh the decision benchmarks share (`decisions`, timed by criterion, and
//! `instructions`, counted by callgrind): 10,000 workloads, 1,000 services, 1,000 policies, 2
//! clusters on 2 networks, and the connections they decide, chosen the same way in every run.

use std::net::SocketAddr;

use ferry_core::model::{
    Action, Clause, Match, Policy, PolicyScope, PortMapping, Rule, ServiceScope, StringMatch,
    WaypointFor, Workload, WorkloadUid,
};
use ferry_core::route::Destination;
use ferry_core::snapshot::Snapshot;
use ferry_core::testing::{MeshBuilder, waypoint_ref};

pub(crate) const WORKLOADS: usize = 10_000;
pub(crate) const SERVICES: usize = 1_000;
pub(crate) const POLICIES: usize = 1_000;
const NAMESPACES: usize = 100;

/// How many workloads connect, and how many others are connected to (authorization).
pub(crate) const SOURCES: usize = 512;

fn addr(net: usize, i: usize) -> String {
    format!("198.{}.{}.{}", 18 + net, i / 250, i % 250 + 1)
}

pub(crate) fn mesh() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.gateway("gw-east", "east", "198.18.255.1")
        .gateway("gw-west", "west", "198.19.255.1");
    for n in 0..50 {
        let c = if n % 2 == 0 { "east" } else { "west" };
        m.node(
            &format!("node{n}"),
            c,
            &format!("r{}/z{}/s{}", n % 2, n % 4, n % 8),
        );
    }
    for i in 0..WORKLOADS {
        let n = i % 50;
        let w = m.pod(
            &format!("pod{i}"),
            &format!("node{n}"),
            &addr(n % 2, 100 + i),
        );
        w.namespace = format!("ns{}", i % NAMESPACES);
    }
    m.waypoint("wp", WaypointFor::Service).scope = ServiceScope::global();
    for k in 0..4 {
        m.waypoint_pod(
            "wp",
            &format!("wp{k}"),
            &format!("node{k}"),
            &addr(k % 2, 12_000 + k),
        );
    }
    for s in 0..SERVICES {
        let name = format!("svc{s}");
        let vips = [
            ("net-east", addr(0, 20_000 + s)),
            ("net-west", addr(1, 20_000 + s)),
        ];
        let svc = m.service(
            &name,
            &[(vips[0].0, &vips[0].1), (vips[1].0, &vips[1].1)],
            80,
            8080,
        );
        svc.scope = if s % 2 == 0 {
            ServiceScope::global()
        } else {
            ServiceScope::local()
        };
        if s % 10 == 0 {
            svc.waypoint = Some(waypoint_ref("wp"));
        }
        // What `MeshBuilder::backs` does, by index: pod i is the ith workload pushed (its
        // search by name would make building this mesh quadratic).
        let key = svc.key();
        for k in 0..10 {
            m.workloads[(s * 10 + k) % WORKLOADS]
                .services
                .make_mut()
                .insert(
                    key.clone(),
                    vec![PortMapping {
                        service_port: 80,
                        target_port: 8080,
                    }],
                );
        }
    }
    for p in 0..POLICIES {
        let ns = format!("ns{}", p % NAMESPACES);
        let m_ = Match {
            principals: vec![StringMatch::Prefix(format!(
                "cluster.local/ns/{ns}/sa/pod{p}"
            ))],
            destination_ports: vec![8080, 9090],
            ..Match::default()
        };
        m.policy(Policy {
            name: format!("policy{p}"),
            namespace: ns,
            scope: PolicyScope::Namespace,
            action: if p % 5 == 0 {
                Action::Deny
            } else {
                Action::Allow
            },
            rules: vec![Rule {
                clauses: vec![Clause { matches: vec![m_] }],
            }],
            dry_run: false,
        });
    }
    m
}

/// `count` workloads spread evenly over all of them in uid order (so over both clusters and
/// every node), from the `offset`th: the same ones whatever order the snapshot's maps iterate
/// in. Offsets below the spacing (about 19) give disjoint sets.
pub(crate) fn workloads(snap: &Snapshot, offset: usize, count: usize) -> Vec<&Workload> {
    let mut uids: Vec<&WorkloadUid> = snap.workloads().map(|w| &w.uid).collect();
    uids.sort();
    let spacing = (uids.len() / count).max(1);
    uids.into_iter()
        .skip(offset)
        .step_by(spacing)
        .take(count)
        .filter_map(|u| snap.workload(u).map(|w| &**w))
        .collect()
}

/// The first VIP, port 80, of every service that is not a waypoint, in key order.
pub(crate) fn vips(snap: &Snapshot) -> Vec<Destination> {
    let mut services: Vec<_> = snap
        .services()
        .filter(|s| s.waypoint_for.is_none())
        .collect();
    services.sort_by_key(|s| s.key());
    services
        .iter()
        .filter_map(|s| s.vips.first())
        .map(|v| Destination::Addr(SocketAddr::new(v.ip, 80)))
        .collect()
}
