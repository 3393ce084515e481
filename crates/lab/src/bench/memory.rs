//! `ferry lab bench-memory`: node proxy memory with many idle proxied connections, and how much
//! of it comes back once they are gone, against the idle footprint measured in the same run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::procs::{open_fds, rss_kib};
use crate::state::State;

/// Holds `n` idle connections from `from` to `to`:8080 through Ferry; returns the holder, which
/// lets them go when its stdin closes.
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
            &format!("{to_ip}:8080"),
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

/// Polls until every node's descriptors are back to (near) their idle count, for at most 30 s.
fn settle(pids: &[(String, u32)], idle_fds: &[usize]) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end
        && pids
            .iter()
            .zip(idle_fds)
            .any(|((_, pid), idle)| open_fds(*pid) > idle + 8)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints the idle footprint of the nodes of `from` and `to`, then, for each count, their
/// memory with that many idle connections and after they closed.
pub(crate) fn run(state_dir: &Path, from: &str, to: &str, counts: &[usize]) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let (src, dst) = state.pod_pair(from, to)?;
    let pids: Vec<(String, u32)> = [&src.node, &dst.node]
        .into_iter()
        .flatten()
        .filter_map(|n| state.nodes.get(n).map(|p| (n.clone(), p.pid)))
        .collect();
    let idle_fds: Vec<usize> = pids.iter().map(|(_, p)| open_fds(*p)).collect();
    let idle: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
    for (name, kib) in pids.iter().map(|(n, _)| n).zip(&idle) {
        println!("idle footprint   node {name}: RSS {kib} KiB");
    }
    for &n in counts {
        let mut holder = hold(&state, from, &dst.ip, n)?;
        let held: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
        drop(holder.stdin.take());
        let _ = holder.wait();
        settle(&pids, &idle_fds);
        // The release is measured once the connections are gone and the process had a moment
        // to give memory back.
        std::thread::sleep(Duration::from_secs(3));
        let after: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
        for (i, (name, _)) in pids.iter().enumerate() {
            println!(
                "{n:>5} idle conns node {name}: RSS {} KiB ({:.2} KiB per connection); after they closed {} KiB = idle {:+} KiB ({:.2}x idle)",
                held[i],
                held[i].saturating_sub(idle[i]) as f64 / n as f64,
                after[i],
                after[i] as i64 - idle[i] as i64,
                after[i] as f64 / idle[i].max(1) as f64
            );
        }
    }
    Ok(())
}
