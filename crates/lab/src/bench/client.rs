//! `ferry lab bench-client` (inside the source pod): one measure of one arm, printed as one
//! JSON line ([`Sample`]) for the runner, which reads the proxies' CPU around it.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::apps::{
    DIRECT_ECHO_PORT, DIRECT_SINK_PORT, ECHO_PORT, SINK_PORT, dial, greeted, timed_round_trips,
};

/// The path a measure takes from the source pod to the destination pod's app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    /// A marked socket (the source pod's capture lets it pass) to the destination's
    /// uncaptured ports: no proxy at either end.
    Direct,
    /// Captured at both ends: the source node proxy, HBONE, the destination node proxy.
    Ferry,
}

// === impl Arm ===

impl Arm {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Ferry => "ferry",
        }
    }

    /// The destination's echo and sink ports on this arm.
    fn ports(self) -> (u16, u16) {
        match self {
            Self::Direct => (DIRECT_ECHO_PORT, DIRECT_SINK_PORT),
            Self::Ferry => (ECHO_PORT, SINK_PORT),
        }
    }
}

/// What one client run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Measure {
    /// `count` MiB written to the sink on one connection, its byte count read back.
    Bulk,
    /// `count` round trips of `size` bytes on one echo connection.
    Rr,
    /// `count` new connections one after another on each of `threads` client threads:
    /// connect, read the greeting, close.
    Conns,
}

/// One measure's outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Sample {
    /// Wall time of the measured part.
    pub(crate) secs: f64,
    /// Bytes the sink counted (bulk).
    pub(crate) bytes: u64,
    /// Units of work done: MiB, round trips or connections.
    pub(crate) units: u64,
    /// Round-trip latency percentiles (rr).
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// One client run: what it measures, how much, how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub(crate) arm: Arm,
    pub(crate) measure: Measure,
    /// MiB (bulk), round trips (rr) or connections in all (conns).
    pub(crate) count: usize,
    /// Bytes per round trip (rr).
    pub(crate) size: usize,
    /// Client threads (conns).
    pub(crate) threads: usize,
    pub(crate) pin_cpu: Option<usize>,
}

/// Runs one measure from this pod to `target` (pinned to `job.pin_cpu` if given) and prints
/// its [`Sample`] as JSON.
pub(crate) fn run(target: IpAddr, job: Job) -> anyhow::Result<()> {
    if let Some(cpu) = job.pin_cpu {
        let mut one = nix::sched::CpuSet::new();
        one.set(cpu)?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one)?;
    }
    // One thread unless connections are opened from several: otherwise the client's work is
    // one connection at a time, and pinned it shares the CPU.
    let threads = job.threads.max(1);
    let rt = match (job.measure, threads) {
        (Measure::Conns, n) if n > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    let sample = rt.block_on(measured(target, Job { threads, ..job }))?;
    println!("{}", serde_json::to_string(&sample)?);
    Ok(())
}

async fn measured(target: IpAddr, job: Job) -> std::io::Result<Sample> {
    let Job {
        arm,
        measure,
        count,
        size,
        threads,
        ..
    } = job;
    let direct = arm == Arm::Direct;
    let (echo, sink) = arm.ports();
    let (echo, sink) = (SocketAddr::new(target, echo), SocketAddr::new(target, sink));
    let mut out = Sample {
        units: count as u64,
        ..Sample::default()
    };
    match measure {
        Measure::Bulk => {
            let chunk = vec![0x5au8; 256 * 1024];
            let mut s = dial(sink, direct).await?;
            let start = Instant::now();
            for _ in 0..(count * 4) {
                s.write_all(&chunk).await?;
            }
            s.shutdown().await?;
            let mut n = [0u8; 8];
            s.read_exact(&mut n).await?;
            out.secs = start.elapsed().as_secs_f64();
            out.bytes = u64::from_le_bytes(n);
        }
        Measure::Rr => {
            let mut s = greeted(echo, direct).await?;
            // A few unmeasured round trips first: the connection (and a pooled tunnel) warm.
            timed_round_trips(&mut s, 16, size).await?;
            let start = Instant::now();
            (out.p50_us, out.p99_us) = timed_round_trips(&mut s, count, size).await?;
            out.secs = start.elapsed().as_secs_f64();
        }
        Measure::Conns => {
            let each = count.div_ceil(threads);
            out.units = (each * threads) as u64;
            let start = Instant::now();
            let mut all = tokio::task::JoinSet::new();
            for _ in 0..threads {
                all.spawn(async move {
                    for _ in 0..each {
                        drop(greeted(echo, direct).await?);
                    }
                    Ok::<(), std::io::Error>(())
                });
            }
            while let Some(done) = all.join_next().await {
                done.map_err(std::io::Error::other)??;
            }
            out.secs = start.elapsed().as_secs_f64();
        }
    }
    Ok(out)
}
