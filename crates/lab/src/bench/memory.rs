//! `ferry lab bench-memory` (and `bench`'s memory step): node proxy memory with many idle
//! proxied connections, and how much of it comes back once they are gone, against the idle
//! footprint read in the same run on quiet processes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::proxies::Proxies;
use super::report::{Memory, memory_figures, memory_text};
use crate::apps::ECHO_PORT;
use crate::procs::{anon_kib, rss_kib, wait_quiet};
use crate::state::State;

/// How long processes may take to be quiet (CPU and RSS steady) before memory is read anyway
/// (and reported as not quiet).
const QUIET_WITHIN: Duration = Duration::from_secs(20);

/// How long the node proxies must have been quiet, CPU and RSS steady, for their idle
/// footprint. Longer than a node proxy waits, quiet, before it gives back the pages start-up
/// touched (two 5 s checks, `ferry_node::memory::idle`): read sooner after `ferry lab up`, idle
/// held those pages, and the reading 60 s after a spike, by then given back, came out at
/// 0.44x "idle". So idle is the footprint a proxy settles in.
const IDLE_WINDOW: Duration = Duration::from_secs(15);

/// How long the idle footprint may take to settle (an idle release included).
const IDLE_WITHIN: Duration = Duration::from_secs(60);

/// The window over which processes count as quiet right after the connections closed.
const CLOSED_WINDOW: Duration = Duration::from_secs(1);

/// Holds `n` idle connections from `from` to `to`'s echo port through Ferry; returns the
/// holder, which lets them go when its stdin closes.
fn hold(state: &State, from: &str, to_ip: &str, n: usize) -> anyhow::Result<std::process::Child> {
    let src = state
        .pods
        .get(from)
        .with_context(|| format!("no pod {from}"))?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &src.netns])
        .arg(std::env::current_exe()?)
        .args([
            "lab",
            "hold",
            &format!("{to_ip}:{ECHO_PORT}"),
            "--n",
            &n.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    if !line.starts_with("held") {
        let _ = child.kill();
        bail!("holding {n} connections failed: {line:?}");
    }
    Ok(child)
}

fn read(pids: &BTreeMap<String, u32>, kib: fn(u32) -> u64) -> BTreeMap<String, u64> {
    pids.iter().map(|(n, p)| (n.clone(), kib(*p))).collect()
}

/// Idle RSS of the node proxies once they are quiet, then with a fifth of `n` idle proxied
/// connections from `from` to `to_ip`, then with all `n`, then once those closed and the proxies are quiet again, and, if
/// `settle` is not zero, again `settle` after they closed (what the allocator gave back by
/// then: the targets' "back within 10% of idle 60 s after a spike").
pub(crate) fn measure(
    state: &State,
    proxies: &Proxies<'_>,
    from: &str,
    to_ip: &str,
    n: usize,
    settle: Duration,
) -> anyhow::Result<Memory> {
    let pids = proxies.pids();
    let all: Vec<u32> = pids.values().copied().collect();
    let (idle_quiet, waited) = wait_quiet(&all, IDLE_WITHIN, IDLE_WINDOW);
    let mut m = Memory {
        idle_quiet,
        idle_wait_s: waited.as_secs_f64(),
        idle_rss_kib: read(&pids, rss_kib),
        idle_anon_kib: read(&pids, anon_kib),
        held_conns: n,
        ..Memory::default()
    };
    // A fifth first, then the rest: what the rest add is a connection's cost with the code
    // that serves connections resident.
    m.first_conns = n / 5;
    let mut holders = Vec::new();
    if m.first_conns > 0 {
        holders.push(hold(state, from, to_ip, m.first_conns)?);
        m.first_rss_kib = read(&pids, rss_kib);
    }
    holders.push(hold(state, from, to_ip, n - m.first_conns)?);
    m.held_rss_kib = read(&pids, rss_kib);
    m.held_anon_kib = read(&pids, anon_kib);
    for holder in &mut holders {
        drop(holder.stdin.take());
    }
    for mut holder in holders {
        let _ = holder.wait();
    }
    let closed = Instant::now();
    let (after_quiet, waited) = wait_quiet(&all, QUIET_WITHIN, CLOSED_WINDOW);
    m.after_close_quiet = after_quiet;
    m.after_close_wait_s = waited.as_secs_f64();
    m.after_close_rss_kib = read(&pids, rss_kib);
    if !settle.is_zero() {
        // A reading at a fixed time after the close, whatever happens meanwhile: a wait, not
        // a synchronization.
        std::thread::sleep(settle.saturating_sub(closed.elapsed()));
        m.settled_after_s = closed.elapsed().as_secs();
        m.settled_rss_kib = read(&pids, rss_kib);
        m.settled_anon_kib = read(&pids, anon_kib);
    }
    memory_figures(&mut m);
    Ok(m)
}

/// Prints, for each count, the idle footprint of the nodes of `from` and `to`, their memory
/// with that many idle connections, after they closed, and `settle` after they closed.
pub(crate) fn run(
    state_dir: &Path,
    from: &str,
    to: &str,
    counts: &[usize],
    settle: Duration,
) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let (src, dst) = state.pod_pair(from, to)?;
    let proxies = Proxies::of(&state, src, dst)?;
    for &n in counts {
        let m = measure(&state, &proxies, from, &dst.ip, n, settle)?;
        let mut text = String::new();
        memory_text(&mut text, &m);
        print!("{text}");
    }
    Ok(())
}
