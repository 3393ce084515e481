//! `ferry lab rollout`: a rolling restart of a service's replicas, one at a time (mark
//! terminating, wait until every node proxy applied it, stop the app, start it, wait until it
//! answers, mark it ready), while a client pod makes new connections to the service's VIP at a
//! steady rate. Reports the client's connections per replica and its failures.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::pods::{Mark, mark_applied, start_app, stop_app};
use crate::state::State;

/// What the rollout is asked to do.
pub(crate) struct Plan<'a> {
    pub(crate) service: &'a str,
    pub(crate) from: &'a str,
    pub(crate) rate: u32,
    pub(crate) seconds: u64,
}

/// Runs the rollout; exits 1 if any client connection failed.
pub(crate) fn run(state_dir: &Path, plan: &Plan<'_>) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let (vip, replicas) = service_of(&state, plan.service)?;
    let client = state
        .pods
        .get(plan.from)
        .with_context(|| format!("no pod {}", plan.from))?;
    let exe = std::env::current_exe()?;
    let stop = state_dir.join("stop-rollout-churn");
    let _ = std::fs::remove_file(&stop);
    let mut churn = Command::new("ip")
        .args(["netns", "exec", &client.netns])
        .arg(&exe)
        .args(["lab", "churn", &vip.to_string(), "--each", "--until-file"])
        .arg(&stop)
        // A cap only: the client is stopped through `stop` one slot after the last restart,
        // however long the restarts took.
        .args(["--max-seconds", &(plan.seconds * 10 + 60).to_string()])
        .args(["--rate", &plan.rate.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the client")?;
    // However `run` ends, the client stops (it reads `stop` between connections).
    let _stopper = StopOnDrop(&stop);
    let started = Instant::now();
    let out = churn.stdout.take().context("the client's output")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), l));
        }
    });
    // One replica every `slot`, so the last one restarted still takes connections afterwards.
    let slot = Duration::from_secs(plan.seconds) / u32::try_from(replicas.len() + 1)?;
    let mut ready_at = Windows::new();
    for (i, pod) in replicas.iter().enumerate() {
        let due = started + slot * u32::try_from(i + 1)?;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let (took, out, back) = restart(state_dir, pod)?;
        ready_at.insert(pod.clone(), (out, back, Instant::now()));
        println!(
            "restarted {pod}: terminating applied in {:.2?}, answering after {:.2?}, ready applied in {:.2?}",
            took[0], took[1], took[2]
        );
    }
    // The last replica restarted takes connections for one slot too.
    std::thread::sleep(slot);
    std::fs::write(&stop, b"").context("stopping the client")?;
    let status = churn.wait()?;
    let _ = reader.join();
    let lines: Vec<(Instant, String)> = rx.try_iter().collect();
    let (counts, summary) = tally(&lines, &ready_at);
    let summary = summary.with_context(|| format!("the client gave no summary ({status})"))?;
    for pod in &replicas {
        let [all, out, after] = counts.get(pod).copied().unwrap_or_default();
        println!(
            "replica {pod}: {all} connections, {out} while terminating, {after} after its restart"
        );
    }
    println!("{summary}");
    let failed: u64 = summary
        .rsplit_once("failed=")
        .and_then(|(_, n)| n.trim().parse().ok())
        .context("the client's failed count")?;
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Creates the client's stop file when dropped.
struct StopOnDrop<'a>(&'a Path);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, b"");
    }
}

/// Per restarted replica: when every node proxy had it terminating, when it was marked ready
/// again, and when every node proxy had that.
type Windows = BTreeMap<String, (Instant, Instant, Instant)>;

/// Per replica, the client's connections in all, while every node proxy had it terminating
/// (until it was marked ready again: none should land there but a few already on their way),
/// and after its restart (by when their greeting was read); and the client's `ok=N failed=M`.
fn tally(
    lines: &[(Instant, String)],
    windows: &Windows,
) -> (BTreeMap<String, [u64; 3]>, Option<String>) {
    let mut counts: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    let mut summary = None;
    for (at, line) in lines {
        if let Some(name) = line.strip_prefix("ok ") {
            let c = counts.entry(name.to_string()).or_default();
            c[0] += 1;
            match windows.get(name) {
                Some((_, _, ready)) if at > ready => c[2] += 1,
                Some((out, back, _)) if at > out && at < back => c[1] += 1,
                _ => {}
            }
        } else if line.starts_with("ok=") {
            summary = Some(line.clone());
        }
    }
    (counts, summary)
}

/// The service's first VIP and port, and the names of the workloads behind it.
fn service_of(state: &State, name: &str) -> anyhow::Result<(SocketAddr, Vec<String>)> {
    let text = std::fs::read_to_string(&state.topology)?;
    let topo = ferry_topology::parse(&state.topology.display().to_string(), &text)?;
    let snap = &topo.snapshot;
    let s = snap
        .services()
        .find(|s| s.name == name)
        .with_context(|| format!("no service {name}"))?;
    let vip = s.vips.first().context("the service has no VIP")?.ip;
    let port = s.ports.first().context("the service has no port")?.port;
    let key = s.key();
    let mut pods: Vec<String> = snap
        .workloads()
        .filter(|w| w.services.contains_key(&key))
        .map(|w| w.name.clone())
        .collect();
    pods.sort();
    anyhow::ensure!(!pods.is_empty(), "service {name} has no replicas");
    Ok((SocketAddr::new(vip, port), pods))
}

/// Restarts one replica: terminating (applied everywhere), stopped, started, answering, ready
/// (applied everywhere). Returns how long each of the three waits took, when every node proxy
/// had the pod terminating and when it was marked ready again.
fn restart(state_dir: &Path, pod: &str) -> anyhow::Result<([Duration; 3], Instant, Instant)> {
    let out_applied = mark_applied(state_dir, pod, Mark::Terminating, true)?;
    let out = Instant::now();
    stop_app(state_dir, pod)?;
    start_app(state_dir, pod, "restarted by ferry lab rollout")?;
    let answering = out.elapsed();
    let back = Instant::now();
    let back_applied = mark_applied(state_dir, pod, Mark::Terminating, false)?;
    Ok((
        [
            out_applied.unwrap_or_default(),
            answering,
            back_applied.unwrap_or_default(),
        ],
        out,
        back,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_before_while_out_and_after_each_restart() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let windows: Windows = [("a".to_string(), (at(10), at(18), at(20)))].into();
        let lines: Vec<(Instant, String)> = [
            (5, "ok a"),
            (15, "ok a"),
            (19, "ok a"),
            (25, "ok a"),
            (26, "ok a"),
            (15, "ok b"),
            (30, "ok=5 failed=0"),
        ]
        .into_iter()
        .map(|(ms, l)| (at(ms), l.to_string()))
        .collect();
        let (counts, summary) = tally(&lines, &windows);
        assert_eq!(counts["a"], [5, 1, 2], "19 ms: ready, not yet seen");
        assert_eq!(counts["b"], [1, 0, 0], "a replica never restarted");
        assert_eq!(summary.as_deref(), Some("ok=5 failed=0"));
    }
}
