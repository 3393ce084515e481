//! What `ferry lab` does to one pod of a running lab, step by step: mark it in the lab's
//! topology (terminating, or unhealthy) and wait until every node proxy applied the edit; stop
//! its app; start the app again and wait until it answers. `kill` and `revive` (a crash with a
//! failing readiness probe, and the way back) and `rollout`'s restart are built from them.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::procs::{app_of, spawn_append, stop_and_wait, wait_for};
use crate::state::State;

/// How long a topology edit may take to reach every node proxy.
const EDIT_BOUND: Duration = Duration::from_secs(15);

/// A mark on a workload of the topology file, each a field of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// `terminating: true`: no new connections, the open ones kept.
    Terminating,
    /// `healthy: false`: what a failing readiness probe makes of a pod (no new connections).
    Unhealthy,
}

// === impl Mark ===

impl Mark {
    /// The field and the value that set the mark; without the field, it is cleared.
    fn field(self) -> (&'static str, bool) {
        match self {
            Self::Terminating => ("terminating", true),
            Self::Unhealthy => ("healthy", false),
        }
    }
}

/// `ferry lab kill`: a crash plus a failing readiness probe. Marks `pod` unhealthy, waits until
/// every node proxy applied it (so no new connection is sent to it), then stops its app.
/// Prints one line per step.
pub(crate) fn kill(state_dir: &Path, pod: &str) -> anyhow::Result<()> {
    // Fails, naming the pod, before anything is changed.
    running_app(&State::up(state_dir)?, pod)?;
    print_marked(
        pod,
        "unhealthy",
        mark_applied(state_dir, pod, Mark::Unhealthy, true)?,
    );
    let took = stop_app(state_dir, pod)?;
    println!("ferry lab: {pod}: app stopped in {took:.2?}");
    Ok(())
}

/// `ferry lab revive`: starts `pod`'s app again, waits until it answers, then clears the
/// unhealthy mark and waits until every node proxy applied that. Prints one line per step.
pub(crate) fn revive(state_dir: &Path, pod: &str) -> anyhow::Result<()> {
    let took = start_app(state_dir, pod, "started again by ferry lab revive")?;
    println!("ferry lab: {pod}: app started, answering after {took:.2?}");
    let applied = mark_applied(state_dir, pod, Mark::Unhealthy, false)?;
    print_marked(pod, "healthy", applied);
    Ok(())
}

/// One step's line: the mark and how long every node proxy took to apply it.
fn print_marked(pod: &str, now: &str, applied: Option<Duration>) {
    match applied {
        Some(took) => {
            println!("ferry lab: {pod}: marked {now}, applied by every node proxy in {took:.2?}")
        }
        None => println!("ferry lab: {pod}: already {now} in the topology"),
    }
}

/// Sets (`on`) or clears `mark` on the workload `pod` in the lab's topology file. The control
/// plane watches that file; it is replaced whole (a rename), so the watcher never reads half of
/// it, and comments in it are not kept. Returns whether it changed: an edit that changes
/// nothing is not written (the control plane would publish no new snapshot for it).
pub(crate) fn mark(state_dir: &Path, pod: &str, mark: Mark, on: bool) -> anyhow::Result<bool> {
    let state = State::up(state_dir)?;
    let path = &state.topology;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {path:?}"))?;
    if !set_mark(&mut doc, pod, mark, on)? {
        return Ok(false);
    }
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, serde_yaml_ng::to_string(&doc)?)
        .with_context(|| format!("writing {tmp:?}"))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {path:?}"))?;
    Ok(true)
}

/// [`mark`], then waits until every node proxy runs a newer snapshot. Returns how long the edit
/// took to be applied everywhere, or `None` when the mark was already so (nothing to apply).
pub(crate) fn mark_applied(
    state_dir: &Path,
    pod: &str,
    m: Mark,
    on: bool,
) -> anyhow::Result<Option<Duration>> {
    let start = Instant::now();
    let before = versions(state_dir)?;
    if !mark(state_dir, pod, m, on)? {
        return Ok(None);
    }
    wait_applied(state_dir, &before)?;
    Ok(Some(start.elapsed()))
}

/// Sets (or removes) `mark`'s field on the workload named `pod` in a topology document, leaving
/// every other field as it was. Returns whether the document changed.
fn set_mark(
    doc: &mut serde_yaml_ng::Value,
    pod: &str,
    mark: Mark,
    on: bool,
) -> anyhow::Result<bool> {
    let workloads = doc
        .get_mut("workloads")
        .and_then(serde_yaml_ng::Value::as_sequence_mut)
        .context("the topology has no workloads")?;
    let w = workloads
        .iter_mut()
        .filter_map(serde_yaml_ng::Value::as_mapping_mut)
        .find(|w| w.get("name").and_then(serde_yaml_ng::Value::as_str) == Some(pod))
        .with_context(|| format!("no workload {pod} in the topology"))?;
    let (field, value) = mark.field();
    let before = w.get(field).cloned();
    if on {
        w.insert(field.into(), value.into());
    } else {
        w.remove(field);
    }
    Ok(w.get(field) != before.as_ref())
}

/// The pid of `pod`'s running app; an error naming the pod when the lab has no such pod or no
/// app runs in it.
fn running_app(state: &State, pod: &str) -> anyhow::Result<u32> {
    anyhow::ensure!(state.pods.contains_key(pod), "no pod {pod} in the lab");
    app_of(&state.pids, pod).with_context(|| format!("pod {pod} has no running app"))
}

/// Stops `pod`'s app (SIGTERM) and waits until it is gone; returns how long that took.
pub(crate) fn stop_app(state_dir: &Path, pod: &str) -> anyhow::Result<Duration> {
    let pid = running_app(&State::up(state_dir)?, pod)?;
    let start = Instant::now();
    stop_and_wait(
        pid,
        &format!("{pod}'s app to exit"),
        Duration::from_secs(10),
    )?;
    Ok(start.elapsed())
}

/// Starts `pod`'s app again with the command line `up` started it with, its log appended after
/// `banner`, and waits until it answers on its first port; returns how long that took.
pub(crate) fn start_app(state_dir: &Path, pod: &str, banner: &str) -> anyhow::Result<Duration> {
    let mut state = State::up(state_dir)?;
    let p = state
        .pods
        .get(pod)
        .with_context(|| format!("no pod {pod} in the lab"))?;
    if let Some(pid) = app_of(&state.pids, pod) {
        bail!("pod {pod}'s app is already running (pid {pid})");
    }
    let (netns, ip, args) = (p.netns.clone(), p.ip.clone(), p.app.clone());
    anyhow::ensure!(
        !args.is_empty(),
        "no app command line recorded for pod {pod} (the lab was brought up by an older ferry)"
    );
    let port = args
        .iter()
        .position(|a| a == "--ports")
        .and_then(|i| args.get(i + 1)?.split(',').next()?.parse::<u16>().ok())
        .with_context(|| format!("the ports of pod {pod}'s app"))?;
    let start = Instant::now();
    let log = state_dir.join(format!("app-{pod}.log"));
    spawn_append(&mut state, &netns, &args, &log, banner)?;
    let exe = std::env::current_exe()?;
    let to = format!("{ip}:{port}");
    wait_for(
        &format!("{pod}'s app to answer"),
        Duration::from_secs(10),
        || {
            Command::new("ip")
                .args(["netns", "exec", &netns])
                .arg(&exe)
                .args(["lab", "connect", &to, "--data", ""])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with(pod))
        },
    )?;
    Ok(start.elapsed())
}

/// Every node proxy's snapshot version, from its /config_dump; a read that fails (a loaded
/// machine, a proxy that restarts) is tried again, within the edit's bound.
fn versions(state_dir: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let state = State::up(state_dir)?;
    let mut got = None;
    let mut last_error = None;
    wait_for("every node proxy's snapshot version", EDIT_BOUND, || {
        let read: anyhow::Result<BTreeMap<String, u64>> = state
            .nodes
            .iter()
            .map(|(name, n)| {
                let v = version(&n.netns, &n.admin).with_context(|| format!("node {name}"))?;
                Ok((name.clone(), v))
            })
            .collect();
        match read {
            Ok(v) => got = Some(v),
            Err(e) => last_error = Some(e),
        }
        got.is_some()
    })
    .map_err(|timeout| match last_error.take() {
        Some(e) => e.context(timeout.to_string()),
        None => timeout,
    })?;
    got.context("no snapshot version read")
}

/// Waits until every node proxy runs a snapshot newer than `before`.
fn wait_applied(state_dir: &Path, before: &BTreeMap<String, u64>) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    wait_for(
        "every node proxy to apply the topology edit",
        EDIT_BOUND,
        || {
            state.nodes.iter().all(|(name, n)| {
                version(&n.netns, &n.admin).is_ok_and(|v| before.get(name).is_none_or(|b| v > *b))
            })
        },
    )
}

/// One node proxy's snapshot version (a GET of /config_dump from its namespace).
fn version(netns: &str, admin: &str) -> anyhow::Result<u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(std::env::current_exe()?)
        .args([
            "lab",
            "connect",
            admin,
            "--data",
            "GET /config_dump HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (_, body) = text.split_once("\r\n\r\n").context("no HTTP answer")?;
    let dump: serde_json::Value = serde_json::from_str(body.trim())?;
    dump["snapshot_version"]
        .as_u64()
        .context("no snapshot_version in /config_dump")
}

#[cfg(test)]
mod tests {
    use serde_yaml_ng::Value;

    use super::*;

    fn doc() -> Value {
        let text = "workloads:\n  - {name: a, node: n, healthy: false}\n  - {name: b, node: n, labels: {app: web}}\n";
        serde_yaml_ng::from_str(text).unwrap()
    }

    #[test]
    fn marking_a_pod_terminating_sets_and_clears_its_field_only() {
        let mut doc = doc();
        assert!(set_mark(&mut doc, "a", Mark::Terminating, true).unwrap());
        let w = &doc["workloads"];
        assert_eq!(w[0]["terminating"], Value::Bool(true));
        assert_eq!(w[0]["healthy"], Value::Bool(false));
        assert!(w[1].get("terminating").is_none());
        assert!(set_mark(&mut doc, "a", Mark::Terminating, false).unwrap());
        assert!(doc["workloads"][0].get("terminating").is_none());
        assert!(set_mark(&mut doc, "c", Mark::Terminating, true).is_err());
    }

    #[test]
    fn marking_a_pod_unhealthy_sets_and_clears_healthy_only() {
        let mut doc = doc();
        assert!(set_mark(&mut doc, "b", Mark::Unhealthy, true).unwrap());
        let b = &doc["workloads"][1];
        assert_eq!(b["healthy"], Value::Bool(false));
        assert_eq!(b["name"], Value::from("b"));
        assert_eq!(b["node"], Value::from("n"));
        assert_eq!(b["labels"]["app"], Value::from("web"));
        assert!(b.get("terminating").is_none());
        assert_eq!(
            doc["workloads"][0],
            self::doc()["workloads"][0],
            "a untouched"
        );
        assert!(
            !set_mark(&mut doc, "b", Mark::Unhealthy, true).unwrap(),
            "already unhealthy: no change"
        );
        assert!(set_mark(&mut doc, "b", Mark::Unhealthy, false).unwrap());
        assert_eq!(doc, self::doc(), "cleared: every field as it was");
        assert!(
            !set_mark(&mut doc, "b", Mark::Unhealthy, false).unwrap(),
            "already healthy: no change"
        );
        let err = set_mark(&mut doc, "web-9", Mark::Unhealthy, true).unwrap_err();
        assert!(err.to_string().contains("web-9"), "{err}");
    }
}
