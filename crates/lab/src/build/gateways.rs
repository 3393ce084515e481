//! East-west gateways: on their own network, and reachable at their address from every other
//! network (an interface on each other network's bridge, with a route back to its pods).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use ferry_core::model::Gateway;
use ferry_core::snapshot::Snapshot;

use super::Lab;
use super::control::{self, Control};
use super::net::{attach_named, ip, netns, run};
use crate::MGMT_PREFIX;
use crate::procs::{spawn, wait_for_log};
use crate::state::State;

/// Builds every gateway's namespace and starts `ferry gateway` in it.
pub(super) fn start(
    lab: &Lab<'_>,
    state: &mut State,
    snap: &Snapshot,
    mgmt: &str,
    networks: &BTreeMap<String, String>,
    control: &Control,
) -> anyhow::Result<()> {
    let gateways: Vec<_> = snap.gateways().cloned().collect();
    for (k, g) in gateways.iter().enumerate() {
        let gns = netns(state, format!("{}-g{k}", lab.opts.id))?;
        state.gateways.insert(g.name.clone(), gns.clone());
        interfaces(&gns, k, g, mgmt, networks)?;
        // Admin (`/ready`, `/metrics`, `/records`) on its management address.
        let admin = format!("{MGMT_PREFIX}.{}:15000", 100 + k);
        state.gateway_admins.insert(g.name.clone(), admin.clone());
        start_one(lab, state, &gns, g, control, &admin)?;
    }
    Ok(())
}

/// The gateway's interfaces: on the management network, on its own network, and one on each
/// other network's bridge.
fn interfaces(
    gns: &str,
    k: usize,
    g: &Gateway,
    mgmt: &str,
    networks: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    attach_named(
        gns,
        "mgmt",
        &format!("{MGMT_PREFIX}.{}/24", 100 + k),
        mgmt,
        &format!("g{k}"),
    )?;
    let own = networks
        .get(g.network.as_str())
        .context("gateway network")?
        .clone();
    attach_named(
        gns,
        "own",
        &format!("{}/15", g.address),
        &own,
        &format!("g{k}"),
    )?;
    // Replies go back out of the interface a connection came in on, so pod addresses may
    // repeat across networks: each interface marks what it receives, accepted sockets take
    // the mark of their SYN, and each mark routes through its own interface. So do the
    // kernel's own replies (a reset for a closed port, as while the gateway drains), which
    // belong to no socket: without the mark they are lost, and a dial times out instead of
    // being refused.
    for sysctl in ["net.ipv4.tcp_fwmark_accept=1", "net.ipv4.fwmark_reflect=1"] {
        run(Command::new("ip").args(["netns", "exec", gns, "sysctl", "-q", "-w", sysctl]))?;
    }
    for (m, (net, net_ns)) in networks.iter().enumerate() {
        if net == g.network.as_str() {
            continue;
        }
        let ifname = format!("n{m}");
        attach_named(
            gns,
            &ifname,
            &format!("{}/32", g.address),
            net_ns,
            &format!("g{k}n{m}"),
        )?;
        route_back(gns, &ifname, m)?;
    }
    Ok(())
}

/// Marks what `ifname` (the interface to network number `m`) receives, and routes that mark's
/// replies to the pods back through it.
fn route_back(gns: &str, ifname: &str, m: usize) -> anyhow::Result<()> {
    let mark = (m + 1).to_string();
    let table = (100 + m).to_string();
    run(Command::new("ip").args([
        "netns",
        "exec",
        gns,
        "iptables",
        "-w",
        "-t",
        "mangle",
        "-A",
        "PREROUTING",
        "-i",
        ifname,
        "-j",
        "MARK",
        "--set-mark",
        &mark,
    ]))?;
    ip(&["-n", gns, "rule", "add", "fwmark", &mark, "lookup", &table])?;
    ip(&[
        "-n",
        gns,
        "route",
        "add",
        "198.18.0.0/15",
        "dev",
        ifname,
        "table",
        &table,
    ])
}

/// Starts `ferry gateway` in `gns` with its own join token and waits until it serves HBONE.
fn start_one(
    lab: &Lab<'_>,
    state: &mut State,
    gns: &str,
    g: &Gateway,
    control: &Control,
    admin: &str,
) -> anyhow::Result<()> {
    let token_file = format!("{}/gateway-{}.token", lab.dir, g.name);
    control::token(
        lab,
        control,
        &format!("gateway.{}", g.name),
        &format!("gateway {}", g.name),
        &token_file,
    )?;
    let log = lab.opts.state_dir.join(format!("gateway-{}.log", g.name));
    let join = control.join_args(&token_file);
    let mut args = vec![
        lab.exe.as_str(),
        "gateway",
        "--name",
        &g.name,
        "--admin",
        admin,
    ];
    args.extend(join.iter().map(String::as_str));
    args.extend(lab.opts.hop_args.iter().map(String::as_str));
    spawn(state, gns, &args, &log)?;
    wait_for_log(
        &format!("gateway {}", g.name),
        Duration::from_secs(30),
        &log,
        "serving HBONE",
    )
}
