//! HBONE against plain TCP, measured side by side in one run on loopback.
//!
//! Run: `cargo bench -p ferry-hbone --bench hbone` (add `-- quick` for a short run, or
//! `-- bulk-only` for one bulk run of `FERRY_BENCH_MIB` MiB (default 64): what a profiler, such as
//! `valgrind --tool=callgrind`, is run on).
//!
//! - bulk: one tunnel (client lib -> TLS/HTTP/2 -> server -> TCP sink), and one TCP connection
//!   relayed into a tunnel as a node proxy's outbound does (TCP -> relay -> tunnel -> ...), vs
//!   one direct TCP connection to the same sink; GB/s, the ratio, and this process's CPU
//!   seconds per GB (both tunnel ends, the sink and the sender are all in it).
//! - rr: 1 KiB request / 1 KiB response round trips at concurrency 1 and 64; p50 / p99 added
//!   over direct TCP.
//! - handshakes: new HBONE connections per second (connect, TLS, HTTP/2, CONNECT, 1-byte echo,
//!   close) vs new TCP connections doing the same; and new streams on a pooled connection.
//! - idle: heap and RSS per idle tunnel with 10,000 tunnels open (both tunnel ends are in this
//!   process; the target runs in a child process so its sockets do not count).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_hbone::client::{Connection, DirectDialer};
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::settings::Settings;
use stats_alloc::StatsAlloc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::rig::{Env, echo, outbound, send_all, sink, tunnel};
use support::{CLIENT, SERVER, id};

/// Counts heap bytes, for the idle tunnels' memory, over the allocator the `ferry` binary runs
/// on (jemalloc).
#[global_allocator]
static GLOBAL: StatsAlloc<tikv_jemallocator::Jemalloc> =
    StatsAlloc::new(tikv_jemallocator::Jemalloc);

/// Live heap bytes.
fn live() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

const HOLD_TARGET: &str = "FERRY_BENCH_HOLD_TARGET";

fn main() {
    if std::env::var_os(HOLD_TARGET).is_some() {
        return hold_target();
    }
    let quick = std::env::args().any(|a| a == "quick");
    let bulk_only = std::env::args().any(|a| a == "bulk-only");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if bulk_only {
        let mib: usize = std::env::var("FERRY_BENCH_MIB")
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(64);
        return rt.block_on(async { bulk(&Env::new().await, mib << 20, 1).await });
    }
    rt.block_on(run(quick));
}

async fn run(quick: bool) {
    let env = Env::new().await;
    println!("HBONE vs direct TCP on loopback, 2 worker threads, release build");
    bulk(
        &env,
        if quick { 256 << 20 } else { 1 << 30 },
        if quick { 1 } else { 3 },
    )
    .await;
    rr(&env, 1, if quick { 2_000 } else { 20_000 }).await;
    rr(&env, 64, if quick { 100 } else { 1_000 }).await;
    handshakes(&env, if quick { 200 } else { 1_000 }).await;
    idle(&env, if quick { 1_000 } else { 10_000 }).await;
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This process's CPU time so far (user + system, all threads), from `/proc/self/stat`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which ends with the last ')'): utime, stime are the
    // 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

async fn bulk(env: &Env, total: usize, runs: usize) {
    let target = sink().await;
    let relay = outbound(env, target).await;
    let (pool, key, creds) = env.pool(100);
    let bundle = env.ca.bundle();
    let (mut direct, mut hbone, mut relayed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hbone_cpu, mut relayed_cpu) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..runs {
        let mut s = TcpStream::connect(target).await.unwrap();
        s.set_nodelay(true).unwrap();
        direct.push(total as f64 / send_all(&mut s, total).await.as_secs_f64() / 1e9);
        let cpu = cpu_time();
        let mut t = tunnel(&pool, &key, &creds, &bundle, target).await;
        hbone.push(total as f64 / send_all(&mut t, total).await.as_secs_f64() / 1e9);
        hbone_cpu += cpu_time() - cpu;
        let cpu = cpu_time();
        let mut s = TcpStream::connect(relay).await.unwrap();
        s.set_nodelay(true).unwrap();
        relayed.push(total as f64 / send_all(&mut s, total).await.as_secs_f64() / 1e9);
        relayed_cpu += cpu_time() - cpu;
    }
    let (d, h, r) = (median(direct), median(hbone), median(relayed));
    let gb = (total * runs) as f64 / 1e9;
    println!(
        "bulk       direct {d:.2} GB/s   hbone {h:.2} GB/s ({:.2}x direct, {:.2} s CPU/GB)   relayed into hbone {r:.2} GB/s ({:.2}x direct, {:.2} s CPU/GB)   ({} MiB x {runs}, medians; CPU: this whole process)",
        h / d,
        hbone_cpu.as_secs_f64() / gb,
        r / d,
        relayed_cpu.as_secs_f64() / gb,
        total >> 20
    );
}

async fn round_trips<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    n: usize,
    out: &mut Vec<u32>,
) {
    let msg = [0x42u8; 1024];
    let mut back = [0u8; 1024];
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&msg).await.unwrap();
        s.read_exact(&mut back).await.unwrap();
        out.push(t.elapsed().as_micros() as u32);
    }
}

fn pct(v: &mut [u32], p: f64) -> u32 {
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

async fn rr(env: &Env, concurrency: usize, per_task: usize) {
    let target = echo().await;
    let (pool, key, creds) = env.pool(100);
    let pool = Arc::new((pool, key, creds, env.ca.bundle()));
    let mut direct_lat = Vec::new();
    let mut hbone_lat = Vec::new();
    for mode in ["direct", "hbone"] {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let pool = pool.clone();
            set.spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                if mode == "direct" {
                    let mut s = TcpStream::connect(target).await.unwrap();
                    s.set_nodelay(true).unwrap();
                    round_trips(&mut s, per_task, &mut lat).await;
                } else {
                    let (p, k, c, b) = &*pool;
                    let mut t = tunnel(p, k, c, b, target).await;
                    round_trips(&mut t, per_task, &mut lat).await;
                }
                lat
            });
        }
        while let Some(l) = set.join_next().await {
            if mode == "direct" {
                direct_lat.extend(l.unwrap())
            } else {
                hbone_lat.extend(l.unwrap())
            }
        }
    }
    let (d50, d99) = (pct(&mut direct_lat, 0.50), pct(&mut direct_lat, 0.99));
    let (h50, h99) = (pct(&mut hbone_lat, 0.50), pct(&mut hbone_lat, 0.99));
    println!(
        "rr 1KiB c={concurrency:<3} direct p50 {d50} us p99 {d99} us   hbone p50 {h50} us p99 {h99} us   added p50 +{} us p99 +{} us",
        h50.saturating_sub(d50),
        h99.saturating_sub(d99)
    );
}

async fn handshakes(env: &Env, n: usize) {
    let target = echo().await;
    let creds = env.ca.issue_str(CLIENT);
    let bundle = env.ca.bundle();
    let settings = Settings::default();
    let start = Instant::now();
    for _ in 0..n {
        let mut s = TcpStream::connect(target).await.unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    }
    let direct = n as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 0..n {
        let c = Connection::connect(
            &DirectDialer,
            None,
            env.hbone,
            &creds,
            &bundle,
            vec![id(SERVER)],
            &settings,
        )
        .await
        .unwrap();
        let mut t = c
            .open(&target.to_string(), &ConnectHeaders::default())
            .await
            .unwrap();
        t.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.unwrap();
    }
    let fresh = n as f64 / start.elapsed().as_secs_f64();
    let (pool, key, creds) = env.pool(1_000_000);
    let start = Instant::now();
    for _ in 0..n {
        let mut t = tunnel(&pool, &key, &creds, &bundle, target).await;
        t.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.unwrap();
    }
    let pooled = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "conns/s    direct TCP {direct:.0}/s   new HBONE connection {fresh:.0}/s ({:.2}x direct)   new stream on a pooled connection {pooled:.0}/s ({:.1}x a new connection)",
        fresh / direct,
        pooled / fresh
    );
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn idle(env: &Env, n: usize) {
    // The target holds every connection, in its own process.
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .env(HOLD_TARGET, "1")
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let target: SocketAddr = line.trim().parse().unwrap();
    let (pool, key, creds) = env.pool(100);
    let bundle = env.ca.bundle();
    // Warm up: one tunnel, so one-time allocations are not charged to the idle ones.
    drop(tunnel(&pool, &key, &creds, &bundle, target).await);
    let (heap0, rss0) = (live(), rss_bytes());
    let mut tunnels = Vec::with_capacity(n);
    for _ in 0..n {
        tunnels.push(tunnel(&pool, &key, &creds, &bundle, target).await);
    }
    // Let both ends settle (window updates, buffers) before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (heap1, rss1) = (live(), rss_bytes());
    println!(
        "idle       {n} tunnels over {} connections: heap {:.1} KB per tunnel, RSS {:.1} KB per tunnel (both ends)",
        pool.connections(),
        (heap1 - heap0) as f64 / n as f64 / 1024.0,
        (rss1.saturating_sub(rss0)) as f64 / n as f64 / 1024.0
    );
    drop(tunnels);
    let _ = child.kill();
    let _ = child.wait();
}

/// Child-process mode: accept connections and hold them open until stdin closes.
fn hold_target() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => return,
            }
        }
    });
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}
