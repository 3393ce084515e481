//! What one reload of a large topology file costs, phase by phase: read, YAML, convert (checks
//! and model), resources (`flatten::resource_set`: flatten, then encode); and the live heap the
//! served resource set holds.
//!
//! ```sh
//! cargo run --release -p ferry-control --example reload -- gen /tmp/t20k.yaml 20000 1000
//! cargo run --release -p ferry-control --example reload -- time /tmp/t20k.yaml 5
//! ```
//!
//! `gen PATH WORKLOADS SERVICES` writes a generated mesh (two clusters, 100 nodes, a selector per
//! service, namespace and selector policies); `time PATH ROUNDS` reloads it ROUNDS times and
//! prints the median of each phase.

use std::path::Path;
use std::time::{Duration, Instant};

use ferry_control::testing::Counting;
use ferry_topology::Limits;

#[global_allocator]
static GLOBAL: Counting = Counting;

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
        _ => {
            eprintln!("usage: reload gen PATH WORKLOADS SERVICES | reload time PATH ROUNDS");
            std::process::exit(2);
        }
    }
}

fn time(path: &Path, rounds: usize) {
    let limits = Limits {
        max_bytes: usize::MAX,
        ..Limits::default()
    };
    let mut phases: Vec<[Duration; 4]> = Vec::new();
    let mut held = 0isize;
    for _ in 0..rounds {
        let t0 = Instant::now();
        let text = ferry_topology::read_file_within(path, &limits).unwrap();
        let t1 = Instant::now();
        let de = serde_yaml_ng::Deserializer::from_str(&text);
        let file: ferry_topology::schema::File = serde::Deserialize::deserialize(de).unwrap();
        let t2 = Instant::now();
        let topo = ferry_topology::convert_file("generated", &file).unwrap();
        let t3 = Instant::now();
        drop(file);
        drop(text);
        let before = Counting::live();
        let set = ferry_control::flatten::resource_set(&topo.snapshot);
        let t4 = Instant::now();
        held = Counting::live() - before;
        drop(set);
        phases.push([t1 - t0, t2 - t1, t3 - t2, t4 - t3]);
    }
    let median = |i: usize| {
        let mut v: Vec<Duration> = phases.iter().map(|p| p[i]).collect();
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let total: f64 = (0..4).map(median).sum();
    println!(
        "{}: read {:.0} ms, yaml {:.0} ms, convert {:.0} ms, resources (flatten + encode) {:.0} ms; total {:.0} ms (medians of {rounds}); resource set {:.1} MiB",
        path.display(),
        median(0),
        median(1),
        median(2),
        median(3),
        total,
        held as f64 / (1024.0 * 1024.0),
    );
}
