//! The lab's node agents: one `ferry cni agent` per node, beside its node proxy, as on
//! Kubernetes. It holds the node's pods' network namespaces open and hands each to the node
//! proxy over ZDS (`istio.workload.zds`, the namespace as a descriptor), and replays them all
//! whenever a node proxy connects: after a restart, a crash or beside the old one in a handover.
//!
//! The lab enrolls a pod as the CNI plugin does, with one JSON question on the agent's Unix
//! socket ([`ferry_cni::wire`]), answered once the node proxy took the pod; with the benchmarks'
//! direct ports left out of its inbound capture (see [`crate::apps::DIRECT_ECHO_PORT`]), a setting
//! of the node's enroller (the socket is root's only) that no pod can make for itself.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_cni::spec::PodRef;
use ferry_cni::wire::{Answer, Ask};

use crate::procs::wait_for;
use crate::state::{NodeProc, State};

/// How long a node proxy may take to be ready: its first xDS sync and the agent's replay.
const READY_WAIT: Duration = Duration::from_secs(60);

/// How long a restarted node proxy may take to serve the node's pods again.
const SERVED_WAIT: Duration = Duration::from_secs(30);

/// The command line of `node`'s agent: its sockets and pod list in the lab's state directory.
/// Every namespace is enrolled (the lab asks only for the pods it captures).
pub(crate) fn command(exe: &str, state_dir: &Path, node: &str) -> Vec<String> {
    let file = |suffix: &str| {
        state_dir
            .join(format!("{node}.{suffix}"))
            .display()
            .to_string()
    };
    [
        exe,
        "cni",
        "agent",
        "--plugin-socket",
        &file("agent.sock"),
        "--zds-socket",
        &file("zds.sock"),
        "--state-file",
        &pod_list(state_dir, node).display().to_string(),
        "--all-namespaces",
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// Where `node`'s agent keeps its pods (its `--state-file`).
pub(crate) fn pod_list(state_dir: &Path, node: &str) -> std::path::PathBuf {
    state_dir.join(format!("{node}.agent-pods.json"))
}

/// Where `node`'s agent listens for the node proxy (its `--zds-socket`).
pub(crate) fn zds_socket(state_dir: &Path, node: &str) -> std::path::PathBuf {
    state_dir.join(format!("{node}.zds.sock"))
}

/// Where `node`'s agent listens for enrollments.
pub(crate) fn plugin_socket(state_dir: &Path, node: &str) -> std::path::PathBuf {
    state_dir.join(format!("{node}.agent.sock"))
}

/// Hands pod `name` to its node's agent, which hands it to the node proxy; done once the node
/// proxy took it (its capture is in place). A pod enrolled already in the same namespace stays
/// as it is; in a new namespace (created again), the node proxy serves the new one.
pub(crate) fn enroll(state: &State, name: &str) -> anyhow::Result<()> {
    let pod = state
        .pods
        .get(name)
        .with_context(|| format!("no pod {name}"))?;
    let node = pod
        .node
        .as_deref()
        .with_context(|| format!("pod {name} is on no node"))?;
    let socket = &state.node(node)?.agent;
    let answer = ask(
        socket,
        &Ask::Add {
            pod: PodRef {
                namespace: pod.namespace.clone(),
                name: name.to_string(),
                uid: pod.uid.clone(),
            },
            container_id: pod.netns.clone(),
            netns: format!("/var/run/netns/{}", pod.netns).into(),
            uncaptured: crate::apps::DIRECT_PORTS.to_vec(),
        },
    )
    .with_context(|| format!("enrolling {name} with {node}'s node agent"))?;
    if !answer.error.is_empty() {
        bail!("enrolling {name} on {node}: {}", answer.error);
    }
    if !answer.enrolled {
        bail!("enrolling {name} on {node}: the node agent left it alone");
    }
    Ok(())
}

/// One question to an agent, and its answer.
fn ask(socket: &Path, question: &Ask) -> anyhow::Result<Answer> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    // The agent answers once the node proxy acked (it waits up to 10 s for the workload).
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut line = serde_json::to_string(question)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    serde_json::from_str(&answer).with_context(|| format!("the agent answered {answer:?}"))
}

/// The uids of the pods the node proxy with admin address `admin` in `netns` serves, from its
/// `/config_dump`.
fn served(netns: &str, admin: &str) -> anyhow::Result<Vec<String>> {
    let dump = crate::admin_get(
        &crate::Component {
            name: format!("the node proxy at {admin}"),
            netns: netns.to_string(),
            admin: admin.to_string(),
        },
        "/config_dump",
    )?;
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    Ok(dump["pods"]
        .as_array()
        .context("no pods in /config_dump")?
        .iter()
        .filter_map(|p| p["uid"].as_str().map(str::to_string))
        .collect())
}

/// Waits until `node`'s proxy is ready: synced with the control plane and past its agent's
/// first replay, so that the agent has a node proxy to hand pods to.
pub(crate) fn wait_ready(node: &str, n: &NodeProc) -> anyhow::Result<()> {
    let proxy = crate::Component {
        name: format!("node/{node}"),
        netns: n.netns.clone(),
        admin: n.admin.clone(),
    };
    wait_for(
        &format!("the node proxy of {node} to be ready"),
        READY_WAIT,
        || crate::admin_get(&proxy, "/ready").is_ok(),
    )
}

/// Waits until the node proxy at `admin` in `netns` serves every pod enrolled on `node` (the
/// agent's replay; nothing is enrolled again).
pub(crate) fn wait_served(
    state: &State,
    node: &str,
    netns: &str,
    admin: &str,
) -> anyhow::Result<()> {
    let expected: Vec<&str> = state
        .pods
        .values()
        .filter(|p| p.enrolled && p.node.as_deref() == Some(node))
        .map(|p| p.uid.as_str())
        .collect();
    wait_for(
        "the node proxy to serve its enrolled pods again",
        SERVED_WAIT,
        || served(netns, admin).is_ok_and(|s| expected.iter().all(|u| s.iter().any(|x| x == u))),
    )
}
