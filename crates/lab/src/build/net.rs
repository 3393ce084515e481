//! Namespaces, bridges and veth links: the management network and one bridge per mesh network.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use ferry_core::snapshot::Snapshot;

use crate::CONTROL_IP;
use crate::state::State;

/// Runs `cmd` to completion; fails with its stderr if it fails.
pub(super) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub(super) fn ip(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new("ip").args(args))
}

/// Adds the namespace `name` (written down before anything else, so `down` removes it).
pub(super) fn netns(state: &mut State, name: String) -> anyhow::Result<String> {
    ip(&["netns", "add", &name])?;
    state.netns.push(name.clone());
    state.save()?;
    ip(&["-n", &name, "link", "set", "lo", "up"])?;
    Ok(name)
}

fn bridge(ns: &str) -> anyhow::Result<()> {
    ip(&["-n", ns, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", ns, "link", "set", "br0", "up"])
}

/// A veth from `host_ns` (as eth0, with `addr`) to the bridge in `bridge_ns` (as `port`).
pub(super) fn attach(host_ns: &str, addr: &str, bridge_ns: &str, port: &str) -> anyhow::Result<()> {
    attach_named(host_ns, "eth0", addr, bridge_ns, port)
}

/// A veth from `host_ns` (as `ifname`, with `addr`) to the bridge in `bridge_ns` (as `port`).
pub(super) fn attach_named(
    host_ns: &str,
    ifname: &str,
    addr: &str,
    bridge_ns: &str,
    port: &str,
) -> anyhow::Result<()> {
    ip(&[
        "link", "add", ifname, "netns", host_ns, "type", "veth", "peer", "name", port, "netns",
        bridge_ns,
    ])?;
    ip(&["-n", bridge_ns, "link", "set", port, "master", "br0", "up"])?;
    ip(&["-n", host_ns, "addr", "add", addr, "dev", ifname])?;
    ip(&["-n", host_ns, "link", "set", ifname, "up"])
}

/// Management network: the control plane and the node proxies. Returns the namespaces of its
/// bridge and of the control plane.
pub(super) fn management(state: &mut State, id: &str) -> anyhow::Result<(String, String)> {
    let mgmt = netns(state, format!("{id}-mgmt"))?;
    bridge(&mgmt)?;
    let ctl = netns(state, format!("{id}-ctl"))?;
    attach(&ctl, &format!("{CONTROL_IP}/24"), &mgmt, "ctl")?;
    Ok((mgmt, ctl))
}

/// One bridge per mesh network: network name to the namespace of its bridge.
pub(super) fn networks(
    state: &mut State,
    id: &str,
    snap: &Snapshot,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut networks: BTreeMap<String, String> = BTreeMap::new();
    for (k, c) in snap.clusters().enumerate() {
        if !networks.contains_key(c.network.as_str()) {
            let ns = netns(state, format!("{id}-net{k}"))?;
            bridge(&ns)?;
            networks.insert(c.network.to_string(), ns);
        }
    }
    Ok(networks)
}
