//! What a new tunnel costs the two proxies in CPU: a new stream on a warm pooled HBONE connection
//! against a new HBONE connection (TCP, mutual TLS 1.3, HTTP/2, then its one stream), on
//! loopback with real TLS. Each operation opens a tunnel to an echo target, sends one byte,
//! reads it back, and closes cleanly (END_STREAM one way, the target's FIN back as END_STREAM);
//! direct TCP doing the same is measured alongside.
//!
//! What each arm crosses, and whose CPU is counted. The HBONE client end (the pool, its
//! connections' drivers and the loop that opens, echoes and closes, which is what a node
//! proxy's outbound does with a captured connection, less the capture's own socket), the HBONE
//! server end (accept, TLS, HTTP/2, the upstream TCP connect and the relay to the target) and
//! the echo target each run on their own tokio runtime: two workers per proxy end, as a node
//! proxy has on this 2-core machine, and one for the target. Each runtime's threads are
//! measured apart (their scheduler run time, `/proc/self/task/<tid>/schedstat`, in
//! nanoseconds), so the **both ends** figure is the two proxies' CPU only, including their
//! thread wake-ups and the kernel's work in their system calls (on loopback the receiver's TCP
//! processing runs in the sender's context, as it does across a veth). The target's CPU is
//! shown apart and left out; the whole process (getrusage, also the target's and the idle main
//! thread's) is shown for comparison with earlier figures. The direct TCP arm crosses no proxy:
//! its client-end figure is the bench client's own TCP connect, echo and close.
//!
//! Prints, per arm, medians over alternating rounds of the CPU per operation and each proxy
//! end's thread runs (times one of its threads was scheduled in: its wake-ups) per operation,
//! and how many times a new connection costs what a pooled stream does, both ends (issue 21's
//! target: at least 10).
//!
//! Run: `cargo bench -p ferry-hbone --bench streams` (`FERRY_BENCH_OPS` operations per round,
//! default 500; `FERRY_BENCH_ROUNDS` rounds, default 5; `FERRY_BENCH_WORKERS` threads per proxy
//! end, default 2; `FERRY_BENCH_ARM=stream` or `connection` runs that arm alone, for a
//! profiler; `FERRY_BENCH_CPU`, see below).
//!
//! Every thread runs on one CPU (the last this process may use, or `FERRY_BENCH_CPU=<n>`), as
//! the issue's latency runs pin theirs: so pinned, the figures hold within a few percent from run
//! to run on a busy machine, where spread over its CPUs a whole run sometimes cost two to three
//! times as much (a wake-up crossing CPUs), arm for arm. `FERRY_BENCH_CPU=any` leaves them
//! unpinned.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_hbone::client::{Connection, DirectDialer};
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::Server;
use ferry_hbone::settings::Settings;
use ferry_tls::config::{Credentials, TrustBundle};
use ferry_tls::testkit::TestCa;
use nix::sys::resource::{UsageWho, getrusage};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

mod support;
use support::rig::{echo, echo_once};
use support::{AllowAll, CLIENT, SERVER, id};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The threads of one runtime, by their `schedstat` file, each with what it had run when last
/// read.
#[derive(Clone, Default)]
struct Threads(Arc<Mutex<Vec<(String, Cpu)>>>);

/// CPU time and times scheduled in, summed over some threads.
#[derive(Clone, Copy, Default)]
struct Cpu {
    ns: u64,
    runs: u64,
}

impl Threads {
    /// A runtime of `workers` threads, each recorded here when it starts.
    fn runtime(&self, name: &str, workers: usize) -> Runtime {
        let threads = self.0.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .on_thread_start(move || {
                let task = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
                threads.lock().push((
                    format!("/proc/{}/schedstat", task.display()),
                    Cpu::default(),
                ));
            })
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// What these threads have run so far (one that has ended, what it had run when last read:
    /// the sum never goes back).
    fn cpu(&self) -> Cpu {
        let mut sum = Cpu::default();
        for (path, last) in self.0.lock().iter_mut() {
            if let Ok(stat) = std::fs::read_to_string(&*path) {
                let mut fields = stat
                    .split_whitespace()
                    .map(|f| f.parse::<u64>().unwrap_or(0));
                last.ns = fields.next().unwrap_or(0);
                last.runs = fields.nth(1).unwrap_or(0);
            }
            sum.ns += last.ns;
            sum.runs += last.runs;
        }
        sum
    }
}

/// This whole process's CPU (user + system) so far, in nanoseconds.
fn process_ns() -> u64 {
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let ns =
        |v: nix::sys::time::TimeVal| v.tv_sec() as u64 * 1_000_000_000 + v.tv_usec() as u64 * 1_000;
    ns(u.user_time()) + ns(u.system_time())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Tcp,
    Stream,
    Connection,
}

/// Per operation, in microseconds (runs: per operation).
#[derive(Clone, Copy, Default)]
struct Costs {
    client: f64,
    server: f64,
    target: f64,
    process: f64,
    client_runs: f64,
    server_runs: f64,
}

struct Env {
    hbone: SocketAddr,
    target: SocketAddr,
    creds: Credentials,
    bundle: TrustBundle,
    pool: Pool,
    key: PoolKey,
    client: Threads,
    server: Threads,
    echo: Threads,
}

impl Env {
    /// Runs `arm` `ops` times, one after another: its costs per operation.
    async fn round(&self, arm: Arm, ops: usize) -> Costs {
        let before = (
            self.client.cpu(),
            self.server.cpu(),
            self.echo.cpu(),
            process_ns(),
        );
        for _ in 0..ops {
            self.once(arm).await;
        }
        // What the closes set off (the server's stream and connection tasks ending) is charged
        // to this round, not the next.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (client, server, echo, process) = (
            self.client.cpu(),
            self.server.cpu(),
            self.echo.cpu(),
            process_ns(),
        );
        let per = |ns: u64| ns as f64 / 1e3 / ops as f64;
        Costs {
            client: per(client.ns - before.0.ns),
            server: per(server.ns - before.1.ns),
            target: per(echo.ns - before.2.ns),
            process: per(process - before.3),
            client_runs: (client.runs - before.0.runs) as f64 / ops as f64,
            server_runs: (server.runs - before.1.runs) as f64 / ops as f64,
        }
    }

    /// One operation of `arm`: open, one byte there and back, close cleanly.
    async fn once(&self, arm: Arm) {
        let target = self.target.to_string();
        let headers = ConnectHeaders::default();
        match arm {
            Arm::Tcp => {
                let mut s = TcpStream::connect(self.target).await.expect("connect");
                s.set_nodelay(true).expect("nodelay");
                echo_once(&mut s).await;
            }
            Arm::Stream => {
                let mut t = self
                    .pool
                    .open(&self.key, &self.creds, &self.bundle, &target, &headers)
                    .await
                    .expect("a pooled tunnel");
                echo_once(&mut t).await;
            }
            Arm::Connection => {
                let c = Connection::connect(
                    &DirectDialer,
                    None,
                    self.hbone,
                    &self.creds,
                    &self.bundle,
                    vec![id(SERVER)],
                    &Settings::default(),
                )
                .await
                .expect("a new HBONE connection");
                let mut t = c.open(&target, &headers).await.expect("a tunnel");
                echo_once(&mut t).await;
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Keeps this thread, and so every thread it starts, on one CPU (see the module docs); says
/// which.
fn pin() -> String {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let chosen = std::env::var("FERRY_BENCH_CPU").ok();
    if chosen.as_deref() == Some("any") {
        return "unpinned".into();
    }
    let allowed = sched_getaffinity(Pid::from_raw(0)).expect("this thread's CPUs");
    let cpu = chosen
        .and_then(|c| c.parse().ok())
        .or_else(|| {
            (0..CpuSet::count())
                .rev()
                .find(|&c| allowed.is_set(c).unwrap_or(false))
        })
        .expect("a CPU to run on");
    let mut one = CpuSet::new();
    one.set(cpu).expect("a CPU in range");
    sched_setaffinity(Pid::from_raw(0), &one).expect("pinned to one CPU");
    format!("all threads on CPU {cpu}")
}

fn main() {
    let pinned = pin();
    let ops = env_or("FERRY_BENCH_OPS", 500);
    let rounds = env_or("FERRY_BENCH_ROUNDS", 5);
    let arms: Vec<Arm> = match std::env::var("FERRY_BENCH_ARM").as_deref() {
        Ok("stream") => vec![Arm::Stream],
        Ok("connection") => vec![Arm::Connection],
        _ => vec![Arm::Tcp, Arm::Stream, Arm::Connection],
    };
    let (client, server, echo_threads) =
        (Threads::default(), Threads::default(), Threads::default());
    let workers = env_or("FERRY_BENCH_WORKERS", 2);
    let client_rt = client.runtime("hbone-client", workers);
    let server_rt = server.runtime("hbone-server", workers);
    let echo_rt = echo_threads.runtime("echo-target", 1);

    let target = echo_rt.block_on(async { tokio::spawn(echo()).await.expect("the echo server") });
    let ca = TestCa::new("bench");
    let hbone = server_rt.block_on(async {
        let settings = Settings {
            max_concurrent_streams: 1000,
            ..Settings::default()
        };
        let server =
            Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), settings).expect("a server"));
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let hbone = l.local_addr().expect("bound");
        tokio::spawn(server.serve(l, Arc::new(AllowAll)));
        hbone
    });
    let env = Env {
        hbone,
        target,
        creds: ca.issue_str(CLIENT),
        bundle: ca.bundle(),
        pool: Pool::new(PoolConfig {
            max_streams: 1_000_000,
            ..PoolConfig::default()
        }),
        key: PoolKey::new(
            id(CLIENT),
            "127.0.0.1".parse().expect("an address"),
            hbone,
            vec![id(SERVER)],
        ),
        client,
        server,
        echo: echo_threads,
    };
    // The whole loop runs as a task on the client end's runtime (not on this thread, which
    // only waits for it).
    let looped = client_rt.spawn(async move {
        // Warm: the pooled connection opened, the first-use allocations made.
        for arm in [Arm::Tcp, Arm::Stream, Arm::Connection] {
            for _ in 0..20 {
                env.once(arm).await;
            }
        }
        let mut got: Vec<(Arm, Vec<Costs>)> = arms.iter().map(|a| (*a, Vec::new())).collect();
        for _ in 0..rounds {
            for (arm, costs) in &mut got {
                costs.push(env.round(*arm, ops).await);
            }
        }
        got
    });
    let got = client_rt.block_on(looped).expect("the bench loop");
    report(&got, rounds, ops, &pinned);
}

fn report(got: &[(Arm, Vec<Costs>)], rounds: usize, ops: usize, pinned: &str) {
    let per = |arm: Arm| {
        got.iter().find(|(a, _)| *a == arm).map(|(_, c)| {
            let m = |f: fn(&Costs) -> f64| median(c.iter().map(f).collect());
            Costs {
                client: m(|c| c.client),
                server: m(|c| c.server),
                target: m(|c| c.target),
                process: m(|c| c.process),
                client_runs: m(|c| c.client_runs),
                server_runs: m(|c| c.server_runs),
            }
        })
    };
    let both = |c: &Costs| c.client + c.server;
    println!(
        "CPU per operation in us (open, 1-byte echo, clean close), medians of {rounds} rounds of {ops}, {pinned}; both ends = the two proxies only:"
    );
    println!(
        "  {:<38} {:>10} {:>10} {:>10} {:>8} {:>9} {:>12}",
        "arm", "client end", "server end", "both ends", "target", "process", "runs c+s"
    );
    let (tcp, stream, connection) = (per(Arm::Tcp), per(Arm::Stream), per(Arm::Connection));
    for (name, v) in [
        ("direct TCP (no proxy: the client only)", tcp),
        ("new stream on a pooled connection", stream),
        ("new HBONE connection (TLS + HTTP/2)", connection),
    ] {
        if let Some(c) = v {
            println!(
                "  {name:<38} {:>10.1} {:>10.1} {:>10.1} {:>8.1} {:>9.1} {:>12}",
                c.client,
                c.server,
                both(&c),
                c.target,
                c.process,
                format!("{:.1}+{:.1}", c.client_runs, c.server_runs)
            );
        }
    }
    if let (Some(s), Some(c)) = (stream, connection) {
        println!(
            "  a new connection costs the proxies {:.1}x a pooled stream ({:.1} us against {:.1} us, both ends; whole process {:.1}x)",
            both(&c) / both(&s),
            both(&c),
            both(&s),
            c.process / s.process
        );
    }
}
