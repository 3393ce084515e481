//! Waypoint instances: `ferry waypoint` in their node's namespace (with its credential), serving
//! inside their pod's; they terminate HBONE themselves and are not captured.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_core::model::{ServiceKey, Workload};
use ferry_core::ports::HBONE_PORT;
use ferry_core::snapshot::Snapshot;

use super::Lab;
use super::control::Control;
use crate::procs::{spawn, wait_for_log};
use crate::state::State;

/// The services that are some other service's waypoint.
pub(super) fn keys(snap: &Snapshot) -> HashSet<ServiceKey> {
    snap.services()
        .filter(|s| s.waypoint_for.is_some())
        .map(|s| s.key())
        .collect()
}

/// Whether `w` backs a waypoint service.
pub(super) fn is_waypoint(w: &Workload, keys: &HashSet<ServiceKey>) -> bool {
    w.services.keys().any(|k| keys.contains(k))
}

/// Starts every waypoint instance and waits until each serves HBONE.
pub(super) fn start(
    lab: &Lab<'_>,
    state: &mut State,
    workloads: &[Arc<Workload>],
    keys: &HashSet<ServiceKey>,
    control: &Control,
) -> anyhow::Result<()> {
    for w in workloads.iter().filter(|w| is_waypoint(w, keys)) {
        let Some(node) = &w.node else { continue };
        start_one(lab, state, w, node.as_str(), control)?;
    }
    Ok(())
}

fn start_one(
    lab: &Lab<'_>,
    state: &mut State,
    w: &Workload,
    node: &str,
    control: &Control,
) -> anyhow::Result<()> {
    let pod = state.pods.get(&w.name).context("pod state")?;
    let pod_ns = format!("/var/run/netns/{}", pod.netns);
    // In its node's namespace (to reach the control plane), serving inside the pod's.
    let ns = state.nodes.get(node).context("node state")?.netns.clone();
    let log = lab.opts.state_dir.join(format!("waypoint-{}.log", w.name));
    let token_file = format!("{}/{node}.token", lab.dir);
    // Admin (`/metrics`) on the pod's own address, port 15020.
    let admin = format!("{}:15020", pod.ip);
    let join = control.join_args(&token_file);
    // HBONE on each of the instance's addresses: a dual-stack instance is dialled in the family
    // of the connection it carries.
    let listen: Vec<String> = w
        .addresses
        .iter()
        .map(|a| SocketAddr::new(*a, HBONE_PORT).to_string())
        .collect();
    let mut args = vec![
        lab.exe.as_str(),
        "waypoint",
        "--uid",
        w.uid.as_str(),
        "--cluster",
        w.cluster.as_str(),
        "--netns",
        &pod_ns,
        "--admin",
        &admin,
    ];
    for l in &listen {
        args.extend(["--listen", l.as_str()]);
    }
    args.extend(join.iter().map(String::as_str));
    args.extend(lab.opts.hop_args.iter().map(String::as_str));
    spawn(state, &ns, &args, &log)?;
    if let Some(p) = state.pods.get_mut(&w.name) {
        p.waypoint = true;
    }
    wait_for_log(
        &format!("waypoint {}", w.name),
        Duration::from_secs(30),
        &log,
        "serving HBONE",
    )
}
