//! What `ferry lab` does to a running lab: hand a node proxy over, stop, start, restart it;
//! mark a pod terminating.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::api::api_list;
use crate::procs::{signal_and_wait, spawn_append, stop_and_wait, wait_for};
use crate::state::State;

/// Restarts one node proxy (SIGTERM and drain, or with `kill`, SIGKILL at once). The new
/// process serves the node's pods again from its own enrollment state: nothing is re-enrolled.
pub(crate) fn restart_node(state_dir: &Path, node: &str, kill: bool) -> anyhow::Result<()> {
    stop_node(state_dir, node, kill)?;
    start_node(state_dir, node)
}

/// Stops one node proxy: SIGTERM and wait for its drain, or SIGKILL. Its pods stay enrolled
/// and captured: their traffic is refused until a node proxy serves them again.
pub(crate) fn stop_node(state_dir: &Path, node: &str, kill: bool) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let n = state.node(node)?;
    if kill {
        signal_and_wait(
            n.pid,
            Signal::SIGKILL,
            "the killed node proxy to exit",
            Duration::from_secs(10),
        )
    } else {
        stop_and_wait(n.pid, "the old node proxy to exit", Duration::from_secs(40))
    }
}

/// Starts a node proxy for `node` (which must not be running) and waits until it serves every
/// pod enrolled on the node.
pub(crate) fn start_node(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    let mut state = State::up(state_dir)?;
    let n = state.node(node)?;
    let (netns, api, log, args) = (
        n.netns.clone(),
        n.api.clone(),
        n.log.clone(),
        n.args.clone(),
    );
    let _ = std::fs::remove_file(&api);
    let pid = spawn_append(
        &mut state,
        &netns,
        &args,
        &log,
        "started again by ferry lab",
    )?;
    if let Some(n) = state.nodes.get_mut(node) {
        n.pid = pid;
    }
    state.save()?;
    wait_for("the restarted node proxy", Duration::from_secs(20), || {
        api.exists()
    })?;
    wait_served(&state, node, &api)
}

/// Waits until the node proxy behind `api` serves every pod enrolled on `node` (restored from
/// its own state; nothing is enrolled again).
fn wait_served(state: &State, node: &str, api: &Path) -> anyhow::Result<()> {
    let expected: Vec<String> = state
        .pods
        .values()
        .filter(|p| p.enrolled && p.node.as_deref() == Some(node))
        .map(|p| p.uid.clone())
        .collect();
    wait_for(
        "the node proxy to serve its enrolled pods again",
        Duration::from_secs(30),
        || {
            api_list(api)
                .is_ok_and(|served| expected.iter().all(|u| served.iter().any(|(s, _)| s == u)))
        },
    )
}

/// Hands a node's pods over to a new node proxy process without refusing a connection: the new
/// process reads the node's enrollment state, opens its listeners beside the old one's
/// (SO_REUSEPORT) and keeps the capture rules as they are; only then does the old one drain and
/// exit (its queued connections migrate).
pub(crate) fn handover(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    let mut state = State::up(state_dir)?;
    let n = state.node(node)?;
    let (old, netns, log, mut args) = (n.pid, n.netns.clone(), n.log.clone(), n.args.clone());
    let api = state_dir.join(format!("{node}.{}.sock", state.pids.len()));
    if let Some(i) = args.iter().position(|a| a == "--api") {
        args[i + 1] = api.display().to_string();
    }
    // The old process still holds its admin port: the new one takes the next.
    let mut admin = None;
    if let Some(i) = args.iter().position(|a| a == "--admin") {
        let (ip, port) = args[i + 1].rsplit_once(':').context("admin address")?;
        let next = format!("{ip}:{}", port.parse::<u16>()? + 1);
        args[i + 1].clone_from(&next);
        admin = Some(next);
    }
    let pid = spawn_append(
        &mut state,
        &netns,
        &args,
        &log,
        "handover: a new node proxy starts beside the old one",
    )?;
    wait_for("the new node proxy", Duration::from_secs(20), || {
        api.exists()
    })?;
    // It serves the node's pods from the shared enrollment state, beside the old one.
    wait_served(&state, node, &api)?;
    // Only now does the old one stop accepting and drain.
    stop_and_wait(
        old,
        "the old node proxy to drain and exit",
        Duration::from_secs(60),
    )?;
    if let Some(n) = state.nodes.get_mut(node) {
        n.pid = pid;
        n.api = api;
        n.args = args;
        if let Some(a) = admin {
            n.admin = a;
        }
    }
    state.save()?;
    Ok(())
}

/// Marks the workload `pod` terminating in the lab's topology file (or, with `undo`, no longer
/// terminating). The control plane watches that file: every node proxy then sends the pod no
/// new connection and keeps the open ones. The file is replaced whole (a rename), so the
/// watcher never reads half of it; comments in it are not kept.
pub(crate) fn terminate(state_dir: &Path, pod: &str, undo: bool) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    let path = &state.topology;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {path:?}"))?;
    mark_terminating(&mut doc, pod, !undo)?;
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, serde_yaml_ng::to_string(&doc)?)
        .with_context(|| format!("writing {tmp:?}"))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {path:?}"))?;
    Ok(())
}

/// Sets (or removes) `terminating: true` on the workload named `pod` in a topology document.
fn mark_terminating(doc: &mut serde_yaml_ng::Value, pod: &str, on: bool) -> anyhow::Result<()> {
    let workloads = doc
        .get_mut("workloads")
        .and_then(serde_yaml_ng::Value::as_sequence_mut)
        .context("the topology has no workloads")?;
    let w = workloads
        .iter_mut()
        .filter_map(serde_yaml_ng::Value::as_mapping_mut)
        .find(|w| w.get("name").and_then(serde_yaml_ng::Value::as_str) == Some(pod))
        .with_context(|| format!("no workload {pod} in the topology"))?;
    if on {
        w.insert("terminating".into(), true.into());
    } else {
        w.remove("terminating");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marking_a_pod_terminating_sets_and_clears_its_field_only() {
        let text = "workloads:\n  - {name: a, node: n, healthy: false}\n  - {name: b, node: n}\n";
        let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
        mark_terminating(&mut doc, "a", true).unwrap();
        let w = &doc["workloads"];
        assert_eq!(w[0]["terminating"], serde_yaml_ng::Value::Bool(true));
        assert_eq!(w[0]["healthy"], serde_yaml_ng::Value::Bool(false));
        assert!(w[1].get("terminating").is_none());
        mark_terminating(&mut doc, "a", false).unwrap();
        assert!(doc["workloads"][0].get("terminating").is_none());
        assert!(mark_terminating(&mut doc, "c", true).is_err());
    }
}
