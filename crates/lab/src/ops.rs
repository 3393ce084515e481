//! What `ferry lab` does to a running lab's node proxies: hand one over, stop, start, restart
//! it. The node's agent stays up throughout and replays the node's pods to each node proxy that
//! connects. What it does to a pod is in `pods`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::agent::wait_served;
use crate::procs::{signal_and_wait, spawn_append, stop_and_wait};
use crate::state::State;

/// Restarts one node proxy (SIGTERM and drain, or with `kill`, SIGKILL at once). The new
/// process serves the node's pods again from the agent's replay: nothing is re-enrolled.
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
    let (netns, admin, log, args) = (
        n.netns.clone(),
        n.admin.clone(),
        n.log.clone(),
        n.args.clone(),
    );
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
    wait_served(&state, node, &netns, &admin)
}

/// Hands a node's pods over to a new node proxy process without refusing a connection: the new
/// process takes the agent's replay, opens its listeners beside the old one's
/// (SO_REUSEPORT) and keeps the capture rules as they are; only then does the old one drain and
/// exit (its queued connections migrate).
pub(crate) fn handover(state_dir: &Path, node: &str) -> anyhow::Result<()> {
    let mut state = State::up(state_dir)?;
    let n = state.node(node)?;
    let (old, netns, log, mut args) = (n.pid, n.netns.clone(), n.log.clone(), n.args.clone());
    // Its own state file: the old process still writes its own until it exits.
    let pods = state_dir.join(format!("{node}.{}.pods", state.pids.len()));
    if let Some(i) = args.iter().position(|a| a == "--state-file") {
        args[i + 1] = pods.display().to_string();
    }
    // The old process still holds its admin port: the new one takes the next.
    let i = args
        .iter()
        .position(|a| a == "--admin")
        .context("no --admin in the node proxy's command line")?;
    let (ip, port) = args[i + 1].rsplit_once(':').context("admin address")?;
    let admin = format!("{ip}:{}", port.parse::<u16>()? + 1);
    args[i + 1].clone_from(&admin);
    let pid = spawn_append(
        &mut state,
        &netns,
        &args,
        &log,
        "handover: a new node proxy starts beside the old one",
    )?;
    // It serves the node's pods from the agent's replay, beside the old one.
    wait_served(&state, node, &netns, &admin)?;
    // Only now does the old one stop accepting and drain.
    stop_and_wait(
        old,
        "the old node proxy to drain and exit",
        Duration::from_secs(60),
    )?;
    if let Some(n) = state.nodes.get_mut(node) {
        n.pid = pid;
        n.args = args;
        n.admin = admin;
    }
    state.save()?;
    Ok(())
}
