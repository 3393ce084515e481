//! Node proxies: one namespace on the management network per topology node, running
//! `ferry node` with its join token and, beside it, the node's agent (`ferry cni agent`), which
//! hands the node's pods to it over ZDS.

use std::time::Duration;

use ferry_core::model::Node;
use ferry_core::snapshot::Snapshot;

use super::Lab;
use super::control::{self, Control};
use super::net::{attach, netns};
use crate::MGMT_PREFIX;
use crate::procs::{spawn, wait_for};
use crate::state::{NodeProc, State};

/// Starts every node's agent and node proxy, then waits until each agent listens and each node
/// proxy answers on its admin port.
pub(super) fn start(
    lab: &Lab<'_>,
    state: &mut State,
    snap: &Snapshot,
    mgmt: &str,
    control: &Control,
) -> anyhow::Result<()> {
    for (i, n) in snap.nodes().enumerate() {
        start_one(lab, state, i, n, mgmt, control)?;
    }
    for n in state.nodes.values() {
        wait_for(
            &format!("the node agent in {}", n.netns),
            Duration::from_secs(20),
            || n.agent.exists(),
        )?;
    }
    Ok(())
}

fn start_one(
    lab: &Lab<'_>,
    state: &mut State,
    i: usize,
    n: &Node,
    mgmt: &str,
    control: &Control,
) -> anyhow::Result<()> {
    let state_dir = &lab.opts.state_dir;
    let ns = netns(state, format!("{}-h{i}", lab.opts.id))?;
    let mgmt_ip = format!("{MGMT_PREFIX}.{}", 10 + i);
    attach(&ns, &format!("{mgmt_ip}/24"), mgmt, &format!("h{i}"))?;
    let token_file = format!("{}/{}.token", lab.dir, n.name);
    control::token(
        lab,
        control,
        n.name.as_str(),
        &format!("node {}", n.name),
        &token_file,
    )?;
    let log = state_dir.join(format!("{}.log", n.name));
    // The agent first: the node proxy connects to it once synced with the control plane. It
    // starts with no pods: a pod list left in the directory (by a lab whose lab.json is gone)
    // would name this lab's namespaces under another lab's uids.
    let _ = std::fs::remove_file(crate::agent::pod_list(state_dir, n.name.as_str()));
    let agent = crate::agent::command(&lab.exe, state_dir, n.name.as_str());
    let agent_argv: Vec<&str> = agent.iter().map(String::as_str).collect();
    spawn(
        state,
        &ns,
        &agent_argv,
        &state_dir.join(format!("{}.agent.log", n.name)),
    )?;
    let admin = format!("{mgmt_ip}:15000");
    let args: Vec<String> = [
        lab.exe.as_str(),
        "node",
        "--name",
        n.name.as_str(),
        "--cluster",
        n.cluster.as_str(),
        "--admin",
        &admin,
        "--state-file",
        &state_dir
            .join(format!("{}.pods", n.name))
            .display()
            .to_string(),
        "--zds-socket",
        &crate::agent::zds_socket(state_dir, n.name.as_str())
            .display()
            .to_string(),
    ]
    .iter()
    .map(ToString::to_string)
    .chain(control.join_args(&token_file))
    .chain(lab.opts.node_args.iter().cloned())
    .collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let pid = spawn(state, &ns, &argv, &log)?;
    state.nodes.insert(
        n.name.to_string(),
        NodeProc {
            pid,
            args,
            netns: ns,
            mgmt_ip,
            agent: crate::agent::plugin_socket(state_dir, n.name.as_str()),
            admin,
            log,
            cluster: n.cluster.to_string(),
        },
    );
    state.save()?;
    Ok(())
}
