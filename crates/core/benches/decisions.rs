//! Decision throughput on a large generated mesh: 10,000 workloads, 1,000 services, 1,000
//! policies, 2 clusters on 2 networks. Reports routing decisions/s (with the data path's
//! `NoTrace` sink and with `ferry explain`'s recording one, and their ratio, measured in the same
//! run over the same connections), authorization checks/s and the snapshot's heap size.
//!
//! Run: `cargo bench -p ferry-core --bench decisions`. `FERRY_BENCH_DECISIONS` sets how many
//! decisions each side of the ratio times (default 200,000).

use std::alloc::System;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferry_core::authz::{ConnInfo, authorize};
use ferry_core::identity::Identity;
use ferry_core::model::Workload;
use ferry_core::random::{Random, SplitMix64};
use ferry_core::route::{Compact, Destination, Source, Step, Within, plan, plan_compact, route};
use ferry_core::snapshot::Snapshot;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

mod common;
use common::{POLICIES, SERVICES, SOURCES, WORKLOADS, mesh};

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

    let sources = common::workloads(&snap, 0, SOURCES);
    let vips = common::vips(&snap);

    let conns: Vec<(&Workload, Destination)> = {
        let mut rng = SplitMix64::new(11);
        (0..4096)
            .map(|_| {
                let src = sources[rng.below(sources.len() as u64) as usize];
                let dst = vips[rng.below(vips.len() as u64) as usize].clone();
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
            let dst = &vips[rng.below(vips.len() as u64) as usize];
            black_box(plan(&snap, Source::new(src), dst, &mut rng).is_ok())
        })
    });
    g.bench_function("route_service_vip", |b| {
        b.iter(|| {
            let src = sources[rng.below(sources.len() as u64) as usize];
            let dst = &vips[rng.below(vips.len() as u64) as usize];
            black_box(
                route(&snap, Source::new(src), dst, &mut rng)
                    .outcome
                    .is_ok(),
            )
        })
    });
    let dsts = common::workloads(&snap, 1, SOURCES);
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
