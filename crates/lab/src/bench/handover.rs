//! `ferry lab bench-handover`: a node proxy replaced under load. New connections keep coming
//! from one pod (as fast as one client makes them) while long-lived connections stay busy; the
//! node is handed over; the report counts failed new connections and how the long-lived ones
//! ended (FIN or reset, and when, against the drain deadline).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::ops;
use crate::state::State;

/// Hands `node` (default: the node of `from`) over while `from` churns new connections to
/// `to` and keeps `streams` long-lived ones busy; prints the report.
pub(crate) fn run(
    state_dir: &Path,
    from: &str,
    to: &str,
    node: Option<String>,
    streams: usize,
) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let (src, dst) = state.pod_pair(from, to)?;
    let node = node
        .or_else(|| src.node.clone())
        .context("which node to hand over")?;
    let drain = state
        .nodes
        .get(&node)
        .and_then(|n| drain_seconds(&n.args))
        .unwrap_or(30);
    let exe = std::env::current_exe()?;
    let target = format!("{}:8080", dst.ip);
    let in_pod = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &src.netns]).arg(&exe).args(args);
        c
    };
    let mut holder = in_pod(&[
        "lab",
        "streams",
        &target,
        "--n",
        &streams.to_string(),
        "--max-seconds",
        &(drain + 60).to_string(),
    ])
    .stdout(Stdio::piped())
    .spawn()?;
    let mut lines = BufReader::new(holder.stdout.take().context("stdout")?).lines();
    match lines.next() {
        Some(Ok(l)) if l.starts_with("held") => {}
        other => {
            let _ = holder.kill();
            bail!("holding {streams} streams failed: {other:?}");
        }
    }
    let stop = state_dir.join("stop-bench-churn");
    let _ = std::fs::remove_file(&stop);
    let churn = in_pod(&["lab", "churn", &target, "--until-file"])
        .arg(&stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let started = Instant::now();
    let handed = ops::handover(state_dir, &node);
    let took = started.elapsed();
    std::fs::write(&stop, "")?;
    let churned = churn.wait_with_output()?;
    let ended = lines.next().and_then(Result::ok).unwrap_or_default();
    let _ = holder.wait();
    handed?;
    println!(
        "handover of {node}: {:.1} s (drain deadline {drain} s after SIGTERM to the old process)",
        took.as_secs_f64()
    );
    println!(
        "new connections during it ({from} -> {target}, one after another): {}",
        String::from_utf8_lossy(&churned.stdout).trim()
    );
    println!(
        "long-lived streams ({streams}, busy every 100 ms; times since they were up, just before the handover): {ended}"
    );
    Ok(())
}

/// The `--drain-seconds` a node proxy was started with (`--drain-seconds N` or `=N`).
fn drain_seconds(args: &[String]) -> Option<u64> {
    args.iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--drain-seconds") {
            Some("") => args.get(i + 1)?.parse::<u64>().ok(),
            Some(v) => v.strip_prefix('=')?.parse::<u64>().ok(),
            None => None,
        })
}

/// `ferry lab churn` (inside the lab): short connections one after another until `until_file`
/// appears; prints `ok=<n> failed=<n>`.
pub(crate) fn churn(
    to: SocketAddr,
    until_file: &Path,
    max: Duration,
    pace: crate::apps::Pace,
) -> anyhow::Result<()> {
    let (ok, failed) = crate::apps::churn(to, until_file, max, pace);
    println!("ok={ok} failed={failed}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::drain_seconds;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn drain_seconds_reads_both_spellings_and_nothing_else() {
        assert_eq!(
            drain_seconds(&args(&["node", "--drain-seconds", "5"])),
            Some(5)
        );
        assert_eq!(
            drain_seconds(&args(&["node", "--drain-seconds=7"])),
            Some(7)
        );
        assert_eq!(drain_seconds(&args(&["node", "--drain-seconds"])), None);
        assert_eq!(drain_seconds(&args(&["node", "--drain-secondsx"])), None);
        assert_eq!(drain_seconds(&args(&["node", "--admin", "1"])), None);
    }
}
