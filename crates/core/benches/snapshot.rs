//! What an edit costs the snapshot: a one-workload delta applied with `Snapshot::apply` against
//! a full build of the same mesh, at 10,000 and 100,000 workloads (1,000 services, 100 nodes,
//! 2 clusters on 2 networks). Also prints the snapshot's heap and what one applied delta adds
//! to it (the entries and buckets it could not share).
//!
//! Run: `cargo bench -p ferry-core --bench snapshot` (`FERRY_BENCH_QUICK=1` skips 100,000).

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use ferry_core::model::PortMapping;
use ferry_core::snapshot::{Snapshot, SnapshotBuilder, SnapshotDelta};
use ferry_core::testing::MeshBuilder;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

const SERVICES: usize = 1_000;

fn mesh(workloads: usize) -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.gateway("gw-east", "east", "198.18.255.1")
        .gateway("gw-west", "west", "198.19.255.1");
    for n in 0..100 {
        let c = if n % 2 == 0 { "east" } else { "west" };
        m.node(&format!("node{n}"), c, &format!("r{}/z{}/s", n % 2, n % 4));
    }
    for s in 0..SERVICES {
        let net = ["net-east", "net-west"][s % 2];
        let a = format!("198.{}.{}.{}", 18 + (s % 2), 200 + s / 250, s % 250 + 1);
        m.service(&format!("svc{s}"), &[(net, a.as_str())], 80, 8080);
    }
    let keys: Vec<_> = m.services.iter().map(|s| s.key()).collect();
    for i in 0..workloads {
        let n = i % 100;
        let j = i / 2;
        let a = format!("198.{}.{}.{}", 18 + (n % 2), j / 250, j % 250 + 1);
        let w = m.pod(&format!("pod{i}"), &format!("node{n}"), &a);
        w.services.make_mut().insert(
            keys[i % SERVICES].clone(),
            vec![PortMapping {
                service_port: 80,
                target_port: 8080,
            }],
        );
    }
    m
}

fn bench_size(c: &mut Criterion, workloads: usize) {
    let m = mesh(workloads);
    let before = live();
    let snap = m.build();
    let heap = live() - before;
    // The edit the sync bench makes: one workload's capacity.
    let mut edited = (**snap.workloads().next().expect("a workload")).clone();
    edited.capacity += 1;
    let mut delta = SnapshotDelta::new(2);
    delta.workloads.push(Arc::new(edited));
    let before = live();
    let next = snap.apply(&delta).expect("valid delta");
    let added = live() - before;
    eprintln!(
        "{workloads} workloads: snapshot heap {:.1} MiB ({} bytes per workload); one applied one-workload delta adds {} bytes",
        heap as f64 / (1024.0 * 1024.0),
        heap / workloads as isize,
        added
    );
    drop(next);

    let mut g = c.benchmark_group(format!("snapshot_{workloads}"));
    g.sample_size(10);
    g.bench_function("apply_one_workload", |b| {
        b.iter(|| black_box(snap.apply(&delta).map(|s| s.version())))
    });
    // What the node did before: every object into a builder, every index made again.
    let workloads: Vec<_> = snap.workloads().cloned().collect();
    let services: Vec<_> = snap.services().cloned().collect();
    g.bench_function("full_build", |b| {
        b.iter(|| {
            let mut b = SnapshotBuilder::new(2);
            snap.clusters().cloned().for_each(|c| {
                b.cluster(c);
            });
            snap.nodes().cloned().for_each(|n| {
                b.node(n);
            });
            services.iter().cloned().for_each(|s| {
                b.service_shared(s);
            });
            snap.gateways().cloned().for_each(|g| {
                b.gateway_shared(g);
            });
            workloads.iter().cloned().for_each(|w| {
                b.workload_shared(w);
            });
            black_box(b.build().map(|s: Snapshot| s.version()))
        })
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    bench_size(c, 10_000);
    if std::env::var_os("FERRY_BENCH_QUICK").is_none() {
        bench_size(c, 100_000);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
