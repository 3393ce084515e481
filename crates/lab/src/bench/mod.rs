//! `ferry lab bench*`: measurements of a running lab, each against a baseline in the same run.
//! The runner here drives a client inside a pod (a hidden `ferry lab` subcommand) and reports.
//!
//! `ferry lab bench` measures one pod to another on two arms, interleaved measure by measure:
//! direct (a marked socket, which the source pod's capture lets pass, to ports the lab enrolls
//! every pod with left out of inbound capture: no proxy at either end, checked by both node
//! proxies' connection counters staying flat) and Ferry (captured at both ends). Around each
//! measure it reads both node proxies' CPU, so every figure comes with the proxies' CPU per
//! unit of work. Memory is read first, on quiet processes, before any load.

pub(crate) mod client;
pub(crate) mod gate;
pub(crate) mod handover;
pub(crate) mod http;
pub(crate) mod memory;
pub(crate) mod paths;
pub(crate) mod proxies;
pub(crate) mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use self::client::{Arm, Measure, Sample};
use self::proxies::{Proxies, moved};
use crate::apps::{DIRECT_ECHO_PORT, DIRECT_SINK_PORT, ECHO_PORT, SINK_PORT};
use crate::procs::{Pinned, app_of, pin};
use crate::state::State;

/// What `ferry lab bench` measures with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// MiB written to the sink in the bulk transfer.
    pub(crate) bulk_mib: usize,
    /// Round trips at each size (64 B and 1 KiB).
    pub(crate) round_trips: usize,
    /// Connections opened one after another (by one client thread, and again in all by
    /// `conn_threads` threads if more than one).
    pub(crate) conns: usize,
    pub(crate) conn_threads: usize,
    /// Idle proxied connections held while measuring node proxy memory (0: no memory run).
    pub(crate) idle: usize,
}

/// How `ferry lab bench` runs.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) sizes: Sizes,
    /// The arms, each measure taken on each in this order.
    pub(crate) arms: Vec<Arm>,
    /// Pin the client, both node proxies and the server app to this CPU for the round trips.
    pub(crate) pinned: Option<usize>,
    /// Where to write the report as JSON.
    pub(crate) json: Option<PathBuf>,
}

/// One step of the run: a measure with its size.
#[derive(Debug, Clone, Copy)]
enum Step {
    Bulk,
    Rr(usize),
    /// New connections from this many client threads.
    Conns(usize),
}

/// `ferry lab bench`: `from` -> `to` on each arm, memory first; prints the report, writes it
/// as JSON if asked; fails if the direct arm moved a node proxy's connection counter.
pub(crate) fn run(state_dir: &Path, from: &str, to: &str, opts: &Options) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let (src, dst) = state.pod_pair(from, to)?;
    for (name, pod) in [(from, src), (to, dst)] {
        if !pod.enrolled {
            bail!("{name} is not enrolled with a node proxy: its Ferry arm would cross none");
        }
    }
    let proxies = Proxies::of(&state, src, dst)?;
    let server = app_of(&state.pids, to).with_context(|| format!("no app running in {to}"))?;
    let memory = match opts.sizes.idle {
        0 => None,
        n => Some(memory::measure(
            &state,
            &proxies,
            from,
            &dst.ip,
            n,
            std::time::Duration::ZERO,
        )?),
    };
    let client = Client {
        netns: &src.netns,
        target: &dst.ip,
        exe: std::env::current_exe()?,
    };
    let mut arms: BTreeMap<String, report::Arm> = opts
        .arms
        .iter()
        .map(|a| {
            let crosses = crosses(*a, from, to, src.node.as_deref(), dst.node.as_deref());
            (
                a.name().to_string(),
                report::Arm {
                    crosses,
                    ..report::Arm::default()
                },
            )
        })
        .collect();
    let s = opts.sizes;
    let mut steps = vec![Step::Bulk, Step::Rr(64), Step::Rr(1024), Step::Conns(1)];
    if s.conn_threads > 1 {
        steps.push(Step::Conns(s.conn_threads));
    }
    for step in steps {
        for &arm in &opts.arms {
            let pinned = match (step, opts.pinned) {
                (Step::Rr(_), Some(cpu)) => {
                    let mut pids: Vec<u32> = proxies.pids().into_values().collect();
                    pids.push(server);
                    Some((pin(&pids, cpu)?, cpu))
                }
                _ => None,
            };
            let before = proxies.opened()?;
            let cpu0 = proxies.cpu_s();
            let (measure, count, size, threads) = match step {
                Step::Bulk => (Measure::Bulk, s.bulk_mib, 0, 1),
                Step::Rr(size) => (Measure::Rr, s.round_trips, size, 1),
                Step::Conns(threads) => (Measure::Conns, s.conns, 0, threads),
            };
            let sample = client.run(client::Job {
                arm,
                measure,
                count,
                size,
                threads,
                pin_cpu: pinned.as_ref().map(|p| p.1),
            })?;
            let cpu = proxies.cpu_s() - cpu0;
            drop::<Option<(Pinned, usize)>>(pinned);
            let opened = moved(&before, &proxies.opened()?);
            let fig = arms.get_mut(arm.name()).context("arm")?;
            for (n, k) in opened {
                *fig.proxy_connections_opened.entry(n).or_default() += k;
            }
            match step {
                Step::Bulk => fig.bulk = Some(report::bulk(&sample, cpu)),
                Step::Rr(64) => fig.rr_64b = Some(report::round_trips(&sample, 64, cpu)),
                Step::Rr(size) => fig.rr_1kib = Some(report::round_trips(&sample, size, cpu)),
                Step::Conns(1) => fig.conns = Some(report::conns(&sample, 1, cpu)),
                Step::Conns(n) => {
                    fig.conns_threads = Some(report::conns(&sample, n, cpu));
                }
            }
        }
    }
    let ferry_vs_direct = match (arms.get("direct"), arms.get("ferry")) {
        (Some(d), Some(f)) => report::ratios(d, f),
        _ => None,
    };
    let report = report::Report {
        commit: commit(),
        build_profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        topology: report::Topology {
            file: state.topology.display().to_string(),
            from_pod: from.into(),
            from_node: src.node.clone().unwrap_or_default(),
            from_ip: src.ip.clone(),
            to_pod: to.into(),
            to_node: dst.node.clone().unwrap_or_default(),
            to_ip: dst.ip.clone(),
            node_proxies: proxies.pids(),
        },
        pinned_cpu: opts.pinned,
        arms,
        ferry_vs_direct,
        memory,
    };
    print!("{}", report.text());
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("written to {}", path.display());
    }
    if let Some(d) = report.arms.get("direct")
        && d.proxy_connections_opened.values().any(|n| *n > 0)
    {
        bail!(
            "the direct arm was not direct: node proxies opened connections during it ({:?})",
            d.proxy_connections_opened
        );
    }
    Ok(())
}

/// What a connection of `arm` crosses from `from` (on `src`) to `to` (on `dst`).
fn crosses(arm: Arm, from: &str, to: &str, src: Option<&str>, dst: Option<&str>) -> String {
    let (src, dst) = (src.unwrap_or("?"), dst.unwrap_or("?"));
    match arm {
        Arm::Direct => format!(
            "{from}'s veth -> bridge -> {to}'s veth, no proxy ({from}'s socket is marked past its \
             outbound capture; {to}:{DIRECT_ECHO_PORT},{DIRECT_SINK_PORT} are left out of its \
             inbound capture at enrollment)"
        ),
        Arm::Ferry if src == dst => format!(
            "{from}'s outbound capture -> node proxy {src} (both ends, one node) -> {to}:{ECHO_PORT},{SINK_PORT}"
        ),
        Arm::Ferry => format!(
            "{from}'s outbound capture -> source node proxy {src} -> HBONE (mTLS, HTTP/2 CONNECT) \
             over the bridge -> destination node proxy {dst} -> {to}:{ECHO_PORT},{SINK_PORT}"
        ),
    }
}

/// `git rev-parse HEAD` here, if this is a checkout.
fn commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let c = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !c.is_empty()).then_some(c)
}

/// The benchmark client, run in the source pod once per measure.
struct Client<'a> {
    netns: &'a str,
    target: &'a str,
    exe: PathBuf,
}

// === impl Client ===

impl Client<'_> {
    fn run(&self, job: client::Job) -> anyhow::Result<Sample> {
        let client::Job {
            arm,
            measure,
            count,
            size,
            threads,
            pin_cpu,
        } = job;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.netns])
            .arg(&self.exe)
            .args(["lab", "bench-client", "--target", self.target])
            .args(["--arm", arm.name(), "--measure"])
            .arg(format!("{measure:?}").to_lowercase())
            .args(["--count", &count.to_string(), "--size", &size.to_string()])
            .args(["--threads", &threads.to_string()]);
        if let Some(cpu) = pin_cpu {
            cmd.args(["--pin-cpu", &cpu.to_string()]);
        }
        let out = cmd.output()?;
        if !out.status.success() {
            bail!(
                "the benchmark client ({} {measure:?}) failed: {}",
                arm.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        serde_json::from_slice(&out.stdout).context("the benchmark client's sample")
    }
}
