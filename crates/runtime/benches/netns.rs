//! What opening a connection to a pod's app costs the node proxy: `Netns::connect_from` (a
//! socket created on the calling thread, which enters the pod's namespace for the `socket()`
//! call alone) against the former way, a hop to the namespace's own thread and back
//! (`Netns::run`) for the same socket. Each iteration connects to a listener in a fresh
//! network namespace from an address that is not the caller's own socket's (`IP_TRANSPARENT`),
//! accepts and closes both ends (with a reset: no TIME_WAIT piles up). Prints, besides
//! criterion's wall time, the process's CPU (user + system, getrusage) and context switches per
//! connection of each arm. Needs root; skipped otherwise.
//!
//! Run: `cargo bench -p ferry-runtime --bench netns`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use ferry_runtime::netns::{MARK, Netns};
use nix::sys::resource::{UsageWho, getrusage};
use parking_lot::Mutex;
use socket2::{Domain, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

#[path = "../tests/support/namespace.rs"]
mod namespace;
use namespace::{INSIDE, fresh_namespace};

/// The former `connect_from`: the socket made on the namespace's thread.
async fn connect_by_hop(ns: &Netns, src: SocketAddr, dst: SocketAddr) -> TcpStream {
    let s = ns
        .run(move || -> std::io::Result<std::net::TcpStream> {
            let s = Socket::new(Domain::for_address(dst), Type::STREAM, None)?;
            s.set_mark(MARK)?;
            s.set_ip_transparent_v4(true)?;
            s.set_nonblocking(true)?;
            s.set_tcp_nodelay(true)?;
            s.bind(&SocketAddr::new(src.ip(), 0).into())?;
            Ok(s.into())
        })
        .await
        .unwrap()
        .unwrap();
    TcpSocket::from_std_stream(s).connect(dst).await.unwrap()
}

/// The process's CPU (user + system) and context switches (voluntary and not) so far.
fn usage() -> (Duration, u64) {
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let us = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    (
        us(u.user_time()) + us(u.system_time()),
        (u.voluntary_context_switches() + u.involuntary_context_switches()) as u64,
    )
}

/// Per arm: CPU, context switches and connections, summed over criterion's runs.
static TOTALS: Mutex<Vec<(&'static str, Duration, u64, u64)>> = Mutex::new(Vec::new());

fn count(arm: &'static str, (spent, switches): (Duration, u64), n: u64) {
    let mut t = TOTALS.lock();
    match t.iter_mut().find(|(a, ..)| *a == arm) {
        Some(e) => {
            e.1 += spent;
            e.2 += switches;
            e.3 += n;
        }
        None => t.push((arm, spent, switches, n)),
    }
}

/// Closing `s` will reset the connection (no TIME_WAIT).
fn reset_on_close(s: &TcpStream) {
    let _ = SockRef::from(&s).set_linger(Some(Duration::ZERO));
}

fn bench(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: entering a network namespace needs root");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ns = fresh_namespace();
    let listener: TcpListener = rt
        .block_on(ns.listen(SocketAddr::from((INSIDE, 0))))
        .unwrap();
    let to = listener.local_addr().unwrap();
    let from = SocketAddr::from((INSIDE, 40_000));
    let mut g = c.benchmark_group("connect_from");
    g.measurement_time(Duration::from_secs(4)).sample_size(30);
    for arm in ["hop", "here"] {
        g.bench_function(arm, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let (t0, (c0, s0)) = (Instant::now(), usage());
                    for _ in 0..iters {
                        let s = match arm {
                            "hop" => connect_by_hop(&ns, from, to).await,
                            _ => ns.connect_from(from, to).await.unwrap(),
                        };
                        let (peer, _) = listener.accept().await.unwrap();
                        reset_on_close(&s);
                        reset_on_close(&peer);
                    }
                    let (c1, s1) = usage();
                    count(arm, (c1 - c0, s1 - s0), iters);
                    t0.elapsed()
                })
            })
        });
    }
    g.finish();
    for (arm, spent, switches, n) in TOTALS.lock().iter() {
        println!(
            "connect_from/{arm}: CPU {:.1} us and {:.2} context switches per connection (both \
             ends, {n} connections)",
            spent.as_secs_f64() * 1e6 / *n as f64,
            *switches as f64 / *n as f64
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
