//! Decision throughput on a large generated mesh: 10,000 workloads, 1,000 services, 1,000
//! policies, 2 clusters on 2 networks. Reports routing decisions/s (with the data path's
//! `NoTrace` sink and with `ferry explain`'s recording one, and their ratio, measured in the same
//! run over the same connections), authorization checks/s and the snapshot's heap size.
//!
//! Run: `cargo bench -p ferry-core --bench decisions`. `FERRY_BENCH_DECISIONS` sets how many
//! decisions each side of the ratio times (default 200,000).

use std::alloc::System;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferry_core::authz::{ConnInfo, authorize};
use ferry_core::identity::Identity;
use ferry_core::model::{
    Action, Clause, Match, Policy, PolicyScope, Rule, ServiceScope, StringMatch, WaypointFor,
    Workload,
};
use ferry_core::random::{Random, SplitMix64};
use ferry_core::route::{Compact, Destination, Source, Step, Within, plan, plan_compact, route};
use ferry_core::snapshot::Snapshot;
use ferry_core::testing::{MeshBuilder, waypoint_ref};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts live heap bytes so the snapshot's size can be reported, and allocations so a
/// decision's can.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live heap bytes.
fn live() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

/// Allocations so far (a reallocation counts as one, as it may move).
fn allocs() -> usize {
    let s = GLOBAL.stats();
    s.allocations + s.reallocations
}

const WORKLOADS: usize = 10_000;
const SERVICES: usize = 1_000;
const POLICIES: usize = 1_000;
const NAMESPACES: usize = 100;

fn addr(net: usize, i: usize) -> String {
    format!("198.{}.{}.{}", 18 + net, i / 250, i % 250 + 1)
}

fn mesh() -> MeshBuilder {
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
        for k in 0..10 {
            m.backs(&format!("pod{}", (s * 10 + k) % WORKLOADS), &name);
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

fn bench(c: &mut Criterion) {
    let m = mesh();
    let before = live();
    let snap: Snapshot = m.build();
    let bytes = live() - before;
    eprintln!(
        "snapshot: {WORKLOADS} workloads, {SERVICES} services, {POLICIES} policies: {:.1} MiB heap ({} bytes per workload)",
        bytes as f64 / (1024.0 * 1024.0),
        bytes / WORKLOADS as isize
    );
    drop(m);

    let sources: Vec<&Workload> = snap.workloads().map(|w| &**w).take(512).collect();
    let vips: Vec<SocketAddr> = snap
        .services()
        .filter(|s| s.waypoint_for.is_none())
        .filter_map(|s| s.vips.first().map(|v| SocketAddr::new(v.ip, 80)))
        .collect();

    let conns: Vec<(&Workload, Destination)> = {
        let mut rng = SplitMix64::new(11);
        (0..4096)
            .map(|_| {
                let src = sources[rng.below(sources.len() as u64) as usize];
                let dst = Destination::Addr(vips[rng.below(vips.len() as u64) as usize]);
                (src, dst)
            })
            .collect()
    };
    trace_ratio(&snap, &conns);

    let mut g = c.benchmark_group("decisions");
    g.throughput(Throughput::Elements(1));
    let mut rng = SplitMix64::new(7);
    g.bench_function("plan_service_vip_no_trace", |b| {
        b.iter(|| {
            let src = sources[rng.below(sources.len() as u64) as usize];
            let dst = Destination::Addr(vips[rng.below(vips.len() as u64) as usize]);
            black_box(plan(&snap, Source::new(src), &dst, &mut rng).is_ok())
        })
    });
    g.bench_function("route_service_vip", |b| {
        b.iter(|| {
            let src = sources[rng.below(sources.len() as u64) as usize];
            let dst = Destination::Addr(vips[rng.below(vips.len() as u64) as usize]);
            black_box(
                route(&snap, Source::new(src), &dst, &mut rng)
                    .outcome
                    .is_ok(),
            )
        })
    });
    let dsts: Vec<&Workload> = snap.workloads().map(|w| &**w).skip(512).take(512).collect();
    let ids: Vec<Identity> = sources.iter().map(|w| w.identity().unwrap()).collect();
    g.bench_function("authorize", |b| {
        b.iter(|| {
            let i = rng.below(ids.len() as u64) as usize;
            let dst = dsts[rng.below(dsts.len() as u64) as usize];
            let conn = ConnInfo {
                source_identity: Some(&ids[i]),
                source_ip: sources[i].addresses[0],
                destination_ip: dst.addresses[0],
                destination_port: 8080,
                via_waypoint: false,
            };
            black_box(authorize(&snap, dst, &conn).is_allowed())
        })
    });
    g.finish();
}

/// Times the same decisions with the no-op sink and with the recording one, interleaved in
/// rounds so both see the same machine, and prints decisions/s for each and their ratio.
fn trace_ratio(snap: &Snapshot, conns: &[(&Workload, Destination)]) {
    let n: usize = std::env::var("FERRY_BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let rounds = 10;
    let per_round = n.div_ceil(rounds).max(1);
    let (mut untraced, mut traced, mut compact) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut untraced_allocs, mut traced_allocs, mut compact_allocs) = (0, 0, 0);
    let mut steps = 0usize;
    for round in 0..rounds {
        let mut rng = SplitMix64::new(round as u64);
        let a = allocs();
        let t = Instant::now();
        for i in 0..per_round {
            let (src, dst) = &conns[i % conns.len()];
            black_box(plan(snap, Source::new(src), dst, &mut rng).is_ok());
        }
        untraced += t.elapsed();
        untraced_allocs += allocs() - a;
        let mut rng = SplitMix64::new(round as u64);
        let a = allocs();
        let t = Instant::now();
        for i in 0..per_round {
            let (src, dst) = &conns[i % conns.len()];
            let d = route(snap, Source::new(src), dst, &mut rng);
            steps += d.steps.len();
            black_box((d.outcome.is_ok(), &d.steps as &[Step]));
        }
        traced += t.elapsed();
        traced_allocs += allocs() - a;
        // What a connection record costs the decision: the bounded trace and its summary line.
        let mut rng = SplitMix64::new(round as u64);
        let a = allocs();
        let t = Instant::now();
        for i in 0..per_round {
            let (src, dst) = &conns[i % conns.len()];
            let mut c = Compact::new();
            let ok = plan_compact(
                snap,
                Source::new(src),
                dst,
                &Within::default(),
                &mut rng,
                &mut c,
            )
            .is_ok();
            black_box((ok, c.summary()));
        }
        compact += t.elapsed();
        compact_allocs += allocs() - a;
    }
    let total = (per_round * rounds) as f64;
    let rate = |d: Duration| total / d.as_secs_f64();
    eprintln!(
        "route, {} decisions each: no-op sink {:.0} decisions/s ({:.1} allocations each), recording sink {:.0} decisions/s ({:.1} allocations, {:.1} steps each), ratio {:.2}x",
        per_round * rounds,
        rate(untraced),
        untraced_allocs as f64 / total,
        rate(traced),
        traced_allocs as f64 / total,
        steps as f64 / total,
        traced.as_secs_f64() / untraced.as_secs_f64()
    );
    eprintln!(
        "record's trace (plan_compact + summary): {:.0} decisions/s ({:.1} allocations each), {:.2} us more per decision than the no-op sink, ratio {:.2}x",
        rate(compact),
        compact_allocs as f64 / total,
        (compact.as_secs_f64() - untraced.as_secs_f64()) / total * 1e6,
        compact.as_secs_f64() / untraced.as_secs_f64()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
