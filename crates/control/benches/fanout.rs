//! Fan-out at scale: one `ferry control` (its own composition, `app::serve`: the watched topology
//! file, real TLS) and many simulated node proxies in a second process, each a real delta-xDS
//! client over its own TLS connection (`ferry_control::testing::sim`: decodes every resource,
//! keeps names and versions, ACKs), plus one real node-proxy client (`ferry_xds::XdsClient`,
//! snapshot applied). The topology file is edited as a user edits it (written aside, renamed
//! over; one workload's capacity changes) and the time from the start of that write to the edit
//! applied at EVERY client is measured, with the server's CPU and both sides' memory.
//!
//! Run: `cargo bench -p ferry-control --bench fanout` (release). Knobs (environment):
//! `FERRY_FANOUT_SIZES` (workloads, default `10000,100000`), `FERRY_FANOUT_CLIENTS` (simulated
//! nodes, default 100), `FERRY_FANOUT_EDITS` (default 20), `FERRY_FANOUT_EACH=1` (each edit's
//! times on stderr). `FERRY_FANOUT_SIZES=100000
//! FERRY_FANOUT_CLIENTS=0` measures the file edit to the real node client alone (issue 22's
//! target at 100,000 workloads); the default, every one of 100 nodes at 10,000 (the other).
//! Loopback only; bounded in time (every wait has a deadline) and count.
//!
//! Output, per size: the server's start; the initial sync of all clients; per edit, the time
//! until applied at every client (the slowest client) and at each client, p50/p99, and how much
//! of it was the writer's (writing the file aside, renaming it over: a rename over a file on
//! ext4 starts the new file's writeback) and from the rename's start; the server's
//! CPU per edit (all of it: parse, flatten, encode, fan-out) and its fan-out threads' CPU per
//! edit per client; the heap and RSS of the server and of the node side. The allocator is
//! jemalloc, as the `ferry` binary's, behind a counter.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_control::app::Listening;
use ferry_control::testing::sim::{Sim, SimConfig};
use ferry_control::testing::{Counting, CountingWith};
use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_xds::client::{ClientConfig, XdsClient};
use parking_lot::Mutex;
use tikv_jemallocator::Jemalloc;

/// jemalloc, as the `ferry` binary's, behind the heap counter.
#[global_allocator]
static GLOBAL: CountingWith<Jemalloc> = CountingWith(Jemalloc);

const SERVICES: usize = 1_000;
const POD0: &str = "east//v1/Pod/default/pod0";
/// The longest any one step may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(600);
/// Linux reports CPU times in these (USER_HZ).
const TICKS_PER_S: f64 = 100.0;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "fanout-nodes") {
        nodes_process(&args[i + 1..]);
        return;
    }
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let sizes: Vec<usize> = env("FERRY_FANOUT_SIZES", "10000,100000")
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("FERRY_FANOUT_SIZES: workload counts, comma-separated")
        })
        .collect();
    let clients: usize = env("FERRY_FANOUT_CLIENTS", "100")
        .parse()
        .expect("FERRY_FANOUT_CLIENTS: a count");
    let edits: u32 = env("FERRY_FANOUT_EDITS", "20")
        .parse()
        .expect("FERRY_FANOUT_EDITS: a count");
    let each = env("FERRY_FANOUT_EACH", "0") == "1";
    for workloads in sizes {
        run(workloads, clients, edits, each);
    }
}

/// A directory removed when the run ends, pass or fail.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The node-side process, killed when the run ends, pass or fail.
struct Nodes(Child);

impl Drop for Nodes {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mib(b: f64) -> f64 {
    b / (1024.0 * 1024.0)
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// utime + stime of a `/proc/.../stat` line, in ticks, and the command name.
fn stat_ticks(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_string();
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((comm, ticks))
}

/// CPU ticks of process `pid` (all its threads, ended ones included).
fn process_ticks(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0, |(_, t)| t)
}

/// CPU ticks of this process's live threads named `prefix...`.
fn thread_ticks(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|s| stat_ticks(&s))
        .filter(|(comm, _)| comm.starts_with(prefix))
        .map(|(_, t)| t)
        .sum()
}

/// Resident set of process `pid` in bytes (`VmRSS`).
fn rss(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb * 1024.0)
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) * p).div_ceil(100)]
}

/// Replaces the file in one step (write aside, rename), as editors and config managers do;
/// gives when the rename began and when it returned (wall-clock ns): the file changes in it.
fn replace(path: &Path, text: &str) -> (u128, u128) {
    let aside = path.with_extension("yaml.tmp");
    std::fs::write(&aside, text).expect("writing the edited topology aside");
    let renaming = wall_ns();
    std::fs::rename(&aside, path).expect("renaming the edited topology over the file");
    (renaming, wall_ns())
}

fn run(workloads: usize, clients: usize, edits: u32, print_each: bool) {
    let dir = TempDir(
        std::env::temp_dir().join(format!("ferry-fanout-{}-{workloads}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("a temporary directory");
    let topology = dir.0.join("topology.yaml");
    let generated = |edit| ferry_control::testing::generated_topology(workloads, SERVICES, edit);
    std::fs::write(&topology, generated(0)).expect("writing the topology");
    let state = dir.0.join("state");

    // The server: its own runtime, threads named `ctl` (the fan-out's CPU is theirs).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ctl")
        .enable_all()
        .build()
        .expect("the server's runtime");
    let heap0 = Counting::live() as f64;
    let config = ferry_control::testing::local_config(&topology, &state);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Listening>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let server = rt.spawn(async move {
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
    let listening = ready_rx
        .recv_timeout(PATIENCE)
        .expect("the control plane starts");
    let start = started.elapsed();
    let bundle = dir.0.join("bundle.pem");
    std::fs::write(
        &bundle,
        ferry_control::app::bundle(&state, "cluster.local").expect("the bundle"),
    )
    .expect("writing the bundle");
    std::thread::sleep(Duration::from_millis(300)); // transient buffers freed before measuring
    let server_heap_idle = Counting::live() as f64 - heap0;
    let server_rss_idle = rss("self");

    // The node side: a process of its own.
    let exe = std::env::current_exe().expect("this bench's path");
    let child = Command::new(exe)
        .arg("fanout-nodes")
        .arg(listening.addr.to_string())
        .arg(&state)
        .arg(&bundle)
        .arg(clients.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the node-side process");
    let mut nodes = Nodes(child);
    let pid = nodes.0.id().to_string();
    let mut lines = BufReader::new(nodes.0.stdout.take().expect("its stdout")).lines();
    let mut line = |want: &str| -> Vec<String> {
        loop {
            let l = lines
                .next()
                .expect("the node-side process ended early")
                .expect("reading the node-side process");
            let words: Vec<String> = l.split_whitespace().map(String::from).collect();
            if words.first().map(String::as_str) == Some(want) {
                return words[1..].to_vec();
            }
            eprintln!("nodes: {l}");
        }
    };
    let synced = line("synced");
    let (sync_ms, node_heap, sim_heap) = (
        synced[0].parse::<f64>().unwrap_or(f64::NAN),
        synced[1].parse::<f64>().unwrap_or(f64::NAN),
        synced[2].parse::<f64>().unwrap_or(f64::NAN),
    );
    std::thread::sleep(Duration::from_millis(300)); // transient buffers freed before measuring
    let server_heap_synced = Counting::live() as f64 - heap0;
    let server_rss_synced = rss("self");
    let nodes_rss = rss(&pid);

    // Edits: pod0's capacity becomes edit + 1 in the file.
    let mut every = Vec::new();
    let mut each = Vec::new();
    // From the rename's start (the file changes in it), and the writer's two steps.
    let (mut from_rename, mut writes, mut renames) = (Vec::new(), Vec::new(), Vec::new());
    let (mut server_ticks, mut fanout_ticks, mut node_ticks) = (0u64, 0u64, 0u64);
    for edit in 1..=edits {
        let text = generated(edit);
        let (cpu0, ctl0, nodes0) = (
            process_ticks("self"),
            thread_ticks("ctl"),
            process_ticks(&pid),
        );
        let t0 = wall_ns();
        let (renaming, renamed) = replace(&topology, &text);
        let applied = line("applied");
        let (cpu1, ctl1, nodes1) = (
            process_ticks("self"),
            thread_ticks("ctl"),
            process_ticks(&pid),
        );
        assert_eq!(
            applied[0],
            (edit + 1).to_string(),
            "every client applied this edit"
        );
        let lat: Vec<f64> = applied[1]
            .split(',')
            .filter_map(|ns| ns.parse::<u128>().ok())
            .map(|ns| ns.saturating_sub(t0) as f64 / 1e6)
            .collect();
        let slowest = lat.iter().copied().fold(0.0, f64::max);
        every.push(slowest);
        each.extend(lat);
        let ms = |ns: u128| ns as f64 / 1e6;
        let (write, rename) = (ms(renaming.saturating_sub(t0)), ms(renamed - renaming));
        if print_each {
            eprintln!(
                "edit {edit}: write aside {write:.1} ms, rename {rename:.1} ms, then {:.1} ms to every client",
                slowest - write
            );
        }
        from_rename.push(slowest - write);
        writes.push(write);
        renames.push(rename);
        server_ticks += cpu1 - cpu0;
        fanout_ticks += ctl1 - ctl0;
        node_ticks += nodes1 - nodes0;
    }
    for v in [
        &mut every,
        &mut each,
        &mut from_rename,
        &mut writes,
        &mut renames,
    ] {
        v.sort_by(f64::total_cmp);
    }
    let n = f64::from(edits);
    let receivers = (clients + 1) as f64;
    println!(
        "{workloads} workloads, {SERVICES} services, {clients} simulated nodes + 1 node client, {edits} one-workload edits of the file:\n\
         \x20 server: ready in {:.0} ms; heap {:.1} MiB idle, {:.1} MiB with every client synced ({:.2} MiB per client); RSS {:.0} -> {:.0} MiB\n\
         \x20 initial sync of every client {:.0} ms; node side: real node client heap {:.1} MiB, per simulated node {:.2} MiB, process RSS {:.0} MiB\n\
         \x20 edit -> applied at EVERY client: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; at each client: p50 {:.1} ms, p99 {:.1} ms\n\
         \x20 of which the writer: write aside p50 {:.1} ms, max {:.1} ms; rename p50 {:.1} ms, max {:.1} ms; from the rename's start to EVERY client: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n\
         \x20 server CPU per edit {:.1} ms (fan-out threads {:.1} ms = {:.3} ms per client); node side CPU per edit {:.1} ms",
        start.as_secs_f64() * 1e3,
        mib(server_heap_idle),
        mib(server_heap_synced),
        mib((server_heap_synced - server_heap_idle) / receivers),
        mib(server_rss_idle),
        mib(server_rss_synced),
        sync_ms,
        mib(node_heap),
        mib(sim_heap),
        mib(nodes_rss),
        percentile(&every, 50),
        percentile(&every, 99),
        every.last().copied().unwrap_or(f64::NAN),
        percentile(&each, 50),
        percentile(&each, 99),
        percentile(&writes, 50),
        writes.last().copied().unwrap_or(f64::NAN),
        percentile(&renames, 50),
        renames.last().copied().unwrap_or(f64::NAN),
        percentile(&from_rename, 50),
        percentile(&from_rename, 99),
        from_rename.last().copied().unwrap_or(f64::NAN),
        server_ticks as f64 / TICKS_PER_S * 1e3 / n,
        fanout_ticks as f64 / TICKS_PER_S * 1e3 / n,
        fanout_ticks as f64 / TICKS_PER_S * 1e3 / n / receivers,
        node_ticks as f64 / TICKS_PER_S * 1e3 / n,
    );
    drop(nodes);
    let _ = stop_tx.send(());
    let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), server).await });
    rt.shutdown_timeout(Duration::from_secs(5));
}

/// What every client last applied of pod0: its capacity and when (wall-clock ns).
#[derive(Debug, Default)]
struct Board {
    capacity: Vec<Option<u32>>,
    at: Vec<u128>,
}

/// The node side: `fanout-nodes ADDR STATE_DIR BUNDLE CLIENTS`. Prints `synced MS NODE_HEAP
/// SIM_HEAP` once every client holds the mesh, then `applied CAPACITY NS,NS,...` whenever every
/// client holds a new capacity of pod0; exits when stdin closes.
fn nodes_process(args: &[String]) {
    let addr: std::net::SocketAddr = args[0].parse().expect("ADDR");
    let state = PathBuf::from(&args[1]);
    let bundle_pem = std::fs::read_to_string(&args[2]).expect("BUNDLE");
    let clients: usize = args[3].parse().expect("CLIENTS");
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sim")
        .enable_all()
        .build()
        .expect("the node side's runtime");
    rt.block_on(async move {
        let board = Arc::new(Mutex::new(Board {
            capacity: vec![None; clients + 1],
            at: vec![0; clients + 1],
        }));
        let changed = Arc::new(tokio::sync::Notify::new());
        let started = Instant::now();
        let heap0 = Counting::live() as f64;

        // The real node client first (its heap alone), as the last slot of the board.
        let store = Arc::new(Store::default());
        let client = XdsClient::new(
            ClientConfig {
                endpoint: format!("https://{addr}"),
                bundle_pem: bundle_pem.clone(),
                server_name: ferry_control::app::SERVER_NAME.into(),
                token: ferry_control::app::node_token(&state, "node-real").expect("a token"),
                cluster: "east".into(),
                node_id: "ferry~node-real".into(),
                plaintext: false,
                backoff_initial: Duration::from_millis(50),
                backoff_max: Duration::from_secs(1),
            },
            store.clone(),
        );
        let mut ready = client.ready();
        let mut changes = client.changes();
        tokio::spawn(client.run());
        tokio::time::timeout(PATIENCE, ready.wait_for(|r| *r))
            .await
            .expect("the real node client syncs in time")
            .expect("the real node client runs");
        let uid = WorkloadUid::new(POD0);
        {
            let (board, changed) = (board.clone(), changed.clone());
            tokio::spawn(async move {
                loop {
                    let cap = store.load().workload(&uid).map(|w| w.capacity);
                    {
                        let mut b = board.lock();
                        if b.capacity[clients] != cap {
                            b.capacity[clients] = cap;
                            b.at[clients] = wall_ns();
                            changed.notify_one();
                        }
                    }
                    if changes.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
        // Transient buffers freed before the heap is read; the pause is left out of the time
        // every client took to sync.
        let pause = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let paused = pause.elapsed();
        let node_heap = Counting::live() as f64 - heap0;

        // The simulated nodes, ten connecting at a time.
        let heap1 = Counting::live() as f64;
        let mut sims = Vec::with_capacity(clients);
        for batch in (0..clients).collect::<Vec<_>>().chunks(10) {
            let joins: Vec<_> = batch
                .iter()
                .map(|&i| {
                    let config = SimConfig {
                        addr,
                        bundle_pem: bundle_pem.clone(),
                        token: ferry_control::app::node_token(&state, &format!("sim{i}"))
                            .expect("a token"),
                        node: format!("sim{i}"),
                        window: None,
                    };
                    tokio::spawn(async move {
                        let mut sim = Sim::connect(&config, &[POD0])
                            .await
                            .expect("a simulated node connects");
                        while !sim.synced() {
                            sim.next()
                                .await
                                .expect("the initial sync")
                                .expect("the stream stays open");
                        }
                        sim
                    })
                })
                .collect();
            for j in joins {
                let sim = tokio::time::timeout(PATIENCE, j)
                    .await
                    .expect("a simulated node syncs in time")
                    .expect("a simulated node runs");
                sims.push(sim);
            }
        }
        let synced_ms = (started.elapsed() - paused).as_secs_f64() * 1e3;
        tokio::time::sleep(Duration::from_millis(200)).await; // transient buffers freed
        let sim_heap = (Counting::live() as f64 - heap1) / clients.max(1) as f64;
        for (i, mut sim) in sims.into_iter().enumerate() {
            board.lock().capacity[i] = sim.capacity(POD0);
            let (board, changed) = (board.clone(), changed.clone());
            tokio::spawn(async move {
                while let Ok(Some(r)) = sim.next().await {
                    if r.watched {
                        let mut b = board.lock();
                        b.capacity[i] = sim.capacity(POD0);
                        b.at[i] = wall_ns();
                        changed.notify_one();
                    }
                }
                eprintln!("simulated node {i}: the stream ended");
            });
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "synced {synced_ms:.0} {node_heap:.0} {sim_heap:.0}").expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        let mut reported = board.lock().capacity[clients];
        loop {
            changed.notified().await;
            let b = board.lock();
            let first = b.capacity[0];
            if first != reported && b.capacity.iter().all(|c| *c == first) {
                reported = first;
                let at: Vec<String> = b.at.iter().map(ToString::to_string).collect();
                let line = format!("applied {} {}", first.unwrap_or(0), at.join(","));
                drop(b);
                let mut out = std::io::stdout().lock();
                writeln!(out, "{line}").expect("stdout");
                out.flush().expect("stdout");
            }
        }
    });
}
