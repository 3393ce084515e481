//! `ferry control serve` under churn, as a process of its own with the binary's allocator
//! (jemalloc), its resident memory read from `/proc`.
//!
//! ```sh
//! cargo run --release -p ferry-control --example reload -- gen /tmp/t.yaml 20000 1000
//! cargo run --release -p ferry-control --example churn -- serve /tmp/t.yaml /tmp/state &
//! cargo run --release -p ferry-control --example churn -- drive /tmp/t.yaml /tmp/state ADDR PID 14 10
//! ```
//!
//! `serve` prints the address it serves on. `drive` connects N node proxies and keeps them,
//! then makes R one-workload edits, each applied at every node, then disconnects them all,
//! printing the server's RSS after each step (`FERRY_CHURN_HOLD_SECS` keeps them connected
//! that long before).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_control::source::WatchConfig;
use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_xds::client::{ClientConfig, XdsClient};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", path, state] => rt.block_on(serve(path.into(), state.into())),
        ["drive", path, state, addr, pid, n, r] => rt.block_on(drive(
            Path::new(path),
            Path::new(state),
            addr,
            pid.parse().unwrap(),
            n.parse().unwrap(),
            r.parse().unwrap(),
        )),
        _ => {
            eprintln!("usage: churn serve PATH STATE | churn drive PATH STATE ADDR PID N R");
            std::process::exit(2);
        }
    }
}

async fn serve(path: PathBuf, state: PathBuf) {
    let mut config = ferry_control::testing::local_config(&path, &state);
    config.watch = WatchConfig::default();
    ferry_control::app::serve(
        &config,
        |l| println!("{} {}", l.addr, std::process::id()),
        std::future::pending(),
    )
    .await
    .unwrap();
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// "server RSS X MiB".
fn memory(pid: u32) -> String {
    format!("server RSS {:.0} MiB", rss_mib(pid))
}

fn capacity(store: &Store) -> Option<u32> {
    store
        .load()
        .workload(&WorkloadUid::new("east//v1/Pod/default/pod0"))
        .map(|w| w.capacity)
}

async fn until(patience: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + patience;
    while !cond() {
        assert!(Instant::now() < end, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn drive(path: &Path, state: &Path, addr: &str, pid: u32, n: usize, rounds: u32) {
    let text = std::fs::read_to_string(path).unwrap();
    let workloads = text.matches("\n  - {name: pod").count();
    let services = text.matches("\n  - {name: svc").count();
    println!("start: {}", memory(pid));
    let bundle = ferry_control::app::bundle(state, "cluster.local").unwrap();
    let mut clients = Vec::new();
    let started = Instant::now();
    for i in 0..n {
        let store = Arc::new(Store::default());
        let node = format!("node{i}");
        let c = XdsClient::new(
            ClientConfig {
                endpoint: format!("https://{addr}"),
                bundle_pem: bundle.clone(),
                server_name: ferry_control::app::SERVER_NAME.into(),
                token: ferry_control::app::node_token(state, &node).unwrap(),
                cluster: "east".into(),
                node_id: format!("ferry~{node}"),
                plaintext: false,
                backoff_initial: Duration::from_millis(50),
                backoff_max: Duration::from_secs(1),
            },
            store.clone(),
        );
        clients.push((tokio::spawn(c.run()), store));
        let s = clients.last().unwrap().1.clone();
        until(Duration::from_secs(120), || capacity(&s).is_some()).await;
    }
    println!(
        "{n} nodes connected and synced in {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        memory(pid)
    );
    let original_capacity = capacity(&clients[0].1).unwrap_or(1);
    for r in 0..rounds {
        let edit = original_capacity + r + 1;
        let next = ferry_control::testing::generated_topology(workloads, services, edit);
        let aside = path.with_extension("yaml.tmp");
        std::fs::write(&aside, next).unwrap();
        let t = Instant::now();
        std::fs::rename(&aside, path).unwrap();
        until(Duration::from_secs(120), || {
            clients.iter().all(|(_, s)| capacity(s) == Some(edit + 1))
        })
        .await;
        println!(
            "edit {} applied at every node in {:.0} ms: {}",
            r + 1,
            t.elapsed().as_secs_f64() * 1e3,
            memory(pid)
        );
    }
    // FERRY_CHURN_HOLD_SECS: stay connected that long first (the allocator's dirty pages decay
    // within about 10 s), printing the memory every 5 s.
    let hold: u64 = std::env::var("FERRY_CHURN_HOLD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for waited in (5..=hold).step_by(5) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        println!("{n} nodes connected, {waited} s later: {}", memory(pid));
    }
    for (task, _) in clients.drain(..) {
        task.abort();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("all disconnected (3 s later): {}", memory(pid));
}
