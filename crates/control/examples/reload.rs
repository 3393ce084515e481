//! What one reload of a large topology file costs, phase by phase: read, YAML, convert (checks
//! and model), resources (`flatten::resource_set`: flatten, then encode); and the live heap the
//! served resource set holds.
//!
//! ```sh
//! cargo run --release -p ferry-control --example reload -- gen /tmp/t20k.yaml 20000 1000
//! cargo run --release -p ferry-control --example reload -- time /tmp/t20k.yaml 5
//! cargo run --release -p ferry-control --example reload -- start /tmp/t20k.yaml 3
//! ```
//!
//! `gen PATH WORKLOADS SERVICES` writes a generated mesh (two clusters, 100 nodes, a selector per
//! service, namespace and selector policies); `time PATH ROUNDS` reloads it ROUNDS times and
//! prints the median of each phase, wall and CPU time; `start PATH ROUNDS` starts `ferry
//! control` as it runs (`app::serve`, TLS, the file watched) ROUNDS times and prints the time
//! until it listens and until a node proxy connecting then has its first push of addresses,
//! and the CPU used until then.
//!
//! The allocator is jemalloc, as the `ferry` binary's, behind a counter ([`CountingWith`]); it
//! counts only for the resource set's heap, in a round of its own (counting costs a contended
//! atomic add).

use std::path::Path;
use std::time::{Duration, Instant};

use ferry_control::testing::{Counting, CountingWith};
use ferry_topology::Limits;
use tikv_jemallocator::Jemalloc;

/// jemalloc, as the `ferry` binary's.
#[global_allocator]
static GLOBAL: CountingWith<Jemalloc> = CountingWith(Jemalloc);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["gen", path, w, s] => {
            let text = ferry_control::testing::generated_topology(
                w.parse().unwrap(),
                s.parse().unwrap(),
                0,
            );
            std::fs::write(path, text).unwrap();
        }
        ["time", path, rounds] => time(Path::new(path), rounds.parse().unwrap()),
        ["start", path, rounds] => start(Path::new(path), rounds.parse().unwrap()),
        _ => {
            eprintln!(
                "usage: reload gen PATH WORKLOADS SERVICES | reload time PATH ROUNDS | reload start PATH ROUNDS"
            );
            std::process::exit(2);
        }
    }
}

fn time(path: &Path, rounds: usize) {
    let limits = Limits {
        max_bytes: usize::MAX,
        ..Limits::default()
    };
    // Timed with jemalloc alone, as `ferry control` runs; the heap is counted in a round of its
    // own after.
    Counting::pause();
    let mut phases: Vec<[(Duration, Duration); 4]> = Vec::new();
    for _ in 0..rounds {
        let mut marks = [(Instant::now(), ferry_control::testing::cpu_time()); 5];
        let mut mark = |i: usize| marks[i] = (Instant::now(), ferry_control::testing::cpu_time());
        let text = ferry_topology::read_file_within(path, &limits).unwrap();
        mark(1);
        let file = ferry_topology::parse_schema("generated", &text, &limits).unwrap();
        mark(2);
        let topo = ferry_topology::convert_file("generated", &file).unwrap();
        mark(3);
        drop(file);
        drop(text);
        let set = ferry_control::flatten::resource_set(&topo.snapshot);
        mark(4);
        drop(set);
        phases.push(std::array::from_fn(|i| {
            (marks[i + 1].0 - marks[i].0, marks[i + 1].1 - marks[i].1)
        }));
    }
    let held = {
        let text = ferry_topology::read_file_within(path, &limits).unwrap();
        let topo = ferry_topology::parse_within("generated", &text, &limits).unwrap();
        drop(text);
        Counting::resume();
        let before = Counting::live();
        let set = ferry_control::flatten::resource_set(&topo.snapshot);
        let held = Counting::live() - before;
        Counting::pause();
        drop(set);
        held
    };
    let median = |i: usize, cpu: bool| {
        let mut v: Vec<Duration> = phases
            .iter()
            .map(|p| if cpu { p[i].1 } else { p[i].0 })
            .collect();
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let total = |cpu: bool| -> f64 { (0..4).map(|i| median(i, cpu)).sum() };
    println!(
        "{}: read {:.0} ms, yaml {:.0} ms, convert {:.0} ms, resources (flatten + encode) {:.0} ms; total {:.0} ms; CPU (user + system, all threads) yaml {:.0} ms, convert {:.0} ms, resources {:.0} ms, total {:.0} ms (medians of {rounds}); resource set {:.1} MiB",
        path.display(),
        median(0, false),
        median(1, false),
        median(2, false),
        median(3, false),
        total(false),
        median(1, true),
        median(2, true),
        median(3, true),
        total(true),
        held as f64 / (1024.0 * 1024.0),
    );
}

/// Starts the control plane on `path` `rounds` times: the time until it listens, and until a
/// node proxy connecting as soon as it listens has its first address push.
fn start(path: &Path, rounds: usize) {
    use ferry_control::testing::sim::{Sim, SimConfig};

    // Timed with jemalloc alone, as `ferry control` runs.
    Counting::pause();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let state = std::env::temp_dir().join(format!("ferry-reload-start-{}", std::process::id()));
    let mut listening = Vec::new();
    let mut first_push = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..rounds {
        let mut config = ferry_control::testing::local_config(path, &state);
        config.watch.limits.max_bytes = usize::MAX;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let t0 = Instant::now();
        let cpu0 = ferry_control::testing::cpu_time();
        let (ready, pushed) = runtime.block_on(async {
            let served = tokio::spawn(async move {
                ferry_control::app::serve(
                    &config,
                    |l| {
                        let _ = ready_tx.send(*l);
                    },
                    async {
                        let _ = stop_rx.await;
                    },
                )
                .await
            });
            let l = ready_rx.await.expect("the control plane listens");
            let ready = t0.elapsed();
            let sim = SimConfig {
                addr: l.addr,
                bundle_pem: ferry_control::app::bundle(&state, "cluster.local").unwrap(),
                token: ferry_control::app::node_token(&state, "node0").unwrap(),
                node: "node0".into(),
                window: None,
            };
            let mut node = Sim::connect(&sim, &[]).await.expect("the node connects");
            while !node
                .next()
                .await
                .expect("a healthy stream")
                .expect("an open stream")
                .type_url
                .contains("Address")
            {}
            let pushed = t0.elapsed();
            let _ = stop.send(());
            let _ = served.await;
            (ready, pushed)
        });
        cpu.push(ferry_control::testing::cpu_time() - cpu0);
        listening.push(ready);
        first_push.push(pushed);
    }
    let _ = std::fs::remove_dir_all(&state);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    println!(
        "{}: listening after {:.0} ms, first address push at a node after {:.0} ms, CPU to then {:.0} ms (server and node, all threads; medians of {rounds}; each {:?} / {:?} / {:?})",
        path.display(),
        median(&mut listening),
        median(&mut first_push),
        median(&mut cpu),
        listening,
        first_push,
        cpu,
    );
}
