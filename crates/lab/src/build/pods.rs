//! Pods: a namespace per workload with an address, the echo app in each, and the enrollment of
//! the captured ones with their node proxy.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, bail};
use ferry_core::model::{ServiceKey, TunnelProtocol, Workload};
use ferry_core::snapshot::Snapshot;

use super::net::{attach, ip, netns, run};
use super::{APP_PORTS, Lab, waypoints};
use crate::procs::spawn;
use crate::state::{Pod, State};

/// Pods: every workload with an address, on its network's bridge. Returns them sorted by uid.
pub(super) fn create(
    state: &mut State,
    id: &str,
    snap: &Snapshot,
    networks: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<Arc<Workload>>> {
    let mut workloads: Vec<_> = snap
        .workloads()
        .filter(|w| !w.addresses.is_empty())
        .cloned()
        .collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    for (j, w) in workloads.iter().enumerate() {
        let ns = netns(state, format!("{id}-p{j}"))?;
        let ipv6 = w.labels.get(IPV6_LABEL).map(String::as_str);
        if w.addresses[0].is_ipv6() {
            // An IPv6-only pod: its first address goes on with the link, usable at once (no
            // duplicate address detection, as `nodad` for the others).
            sysctl(&ns, "net.ipv6.conf.default.accept_dad=0")?;
        }
        attach(
            &ns,
            &with_prefix(w.addresses[0]),
            &networks[w.network.as_str()],
            &format!("p{j}"),
        )?;
        prepare_ipv6(&ns, ipv6, &w.addresses[1..])
            .with_context(|| format!("the namespace of {}", w.name))?;
        state.pods.insert(
            w.name.clone(),
            Pod {
                uid: w.uid.to_string(),
                namespace: w.namespace.to_string(),
                netns: ns,
                ip: w.addresses[0].to_string(),
                node: w.node.as_ref().map(ToString::to_string),
                cluster: w.cluster.to_string(),
                enrolled: false,
                waypoint: false,
                app: Vec::new(),
            },
        );
    }
    state.save()?;
    Ok(workloads)
}

/// A pod's label that has the lab prepare its namespace's IPv6 before it is enrolled:
/// `disabled` (`net.ipv6.conf.all.disable_ipv6=1`: no IPv6 at all) or `no-loopback` (`::1`
/// removed from `lo`), so the node proxy's handling of such pods can be tried.
pub(crate) const IPV6_LABEL: &str = "ferry.dev/lab-ipv6";

/// `addr` with the prefix of the lab's ranges, as `ip addr add` takes it: 198.18.0.0/15 for
/// IPv4, 2001:2::/48 for IPv6 (RFC 5180, the IPv6 benchmarking range). The pods of a network
/// share one bridge, so every address of the range is on-link: the namespaces have no other
/// route.
fn with_prefix(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(_) => format!("{addr}/15"),
        IpAddr::V6(_) => format!("{addr}/48"),
    }
}

/// Adds a pod's `more` addresses (after its first) to its eth0, as its [`IPV6_LABEL`] allows,
/// and prepares its IPv6 as the label says. IPv6 addresses skip duplicate address detection
/// (`nodad`): the lab assigns each once, and they are usable at once.
fn prepare_ipv6(ns: &str, label: Option<&str>, more: &[IpAddr]) -> anyhow::Result<()> {
    let disabled = match label {
        None => false,
        Some("disabled") => true,
        Some("no-loopback") => {
            ip(&["-n", ns, "-6", "addr", "del", "::1/128", "dev", "lo"])?;
            false
        }
        Some(other) => bail!("{IPV6_LABEL}: expected disabled or no-loopback, found {other:?}"),
    };
    if disabled {
        for conf in ["all", "default"] {
            sysctl(ns, &format!("net.ipv6.conf.{conf}.disable_ipv6=1"))?;
        }
    }
    for addr in more {
        if addr.is_ipv6() && disabled {
            continue;
        }
        let prefixed = with_prefix(*addr);
        let mut args = vec!["-n", ns, "addr", "add", &prefixed, "dev", "eth0"];
        if addr.is_ipv6() {
            args.push("nodad");
        }
        ip(&args)?;
    }
    Ok(())
}

/// Sets `setting` (`key=value`) inside the namespace `ns`.
fn sysctl(ns: &str, setting: &str) -> anyhow::Result<()> {
    run(Command::new("ip").args(["netns", "exec", ns, "sysctl", "-q", "-w", setting]))
}

/// Every port a service targets, so any service's traffic finds the app listening.
fn app_ports(snap: &Snapshot) -> String {
    let mut app_ports: BTreeSet<u16> = APP_PORTS.into_iter().collect();
    for s in snap.services() {
        app_ports.extend(s.ports.iter().map(|p| p.target_port));
    }
    for w in snap.workloads() {
        app_ports.extend(w.services.values().flatten().map(|p| p.target_port));
    }
    app_ports.retain(|p| {
        *p != 0
            && *p != crate::apps::SINK_PORT
            && *p != crate::apps::HTTP_PORT
            && *p != crate::grpc::GRPC_PORT
            && !crate::apps::DIRECT_PORTS.contains(p)
            && ![15001, 15006, 15008].contains(p)
    });
    app_ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Starts the echo app in every pod.
pub(super) fn start_apps(lab: &Lab<'_>, state: &mut State, snap: &Snapshot) -> anyhow::Result<()> {
    let ports = app_ports(snap);
    let pods: Vec<(String, String)> = state
        .pods
        .iter()
        .map(|(n, p)| (n.clone(), p.netns.clone()))
        .collect();
    for (name, ns) in pods {
        let log = lab.opts.state_dir.join(format!("app-{name}.log"));
        let args: [&str; 7] = [&lab.exe, "lab", "echo", "--name", &name, "--ports", &ports];
        spawn(state, &ns, &args, &log)?;
        if let Some(p) = state.pods.get_mut(&name) {
            p.app = args.iter().map(ToString::to_string).collect();
        }
        let (key, value) = crate::dns::UPSTREAM_LABEL;
        if snap
            .workloads()
            .any(|w| w.name == name && w.labels.get(key).map(String::as_str) == Some(value))
        {
            let log = lab.opts.state_dir.join(format!("dns-{name}.log"));
            spawn(state, &ns, &[&lab.exe, "lab", "dns-upstream"], &log)?;
        }
    }
    state.save()?;
    Ok(())
}

/// Enrolls every HBONE pod that is not a waypoint with its node's agent, which hands it to the
/// node proxy over ZDS, with the benchmark's direct ports left out of its inbound capture (see
/// [`crate::agent`]).
pub(super) fn enroll(
    state: &mut State,
    workloads: &[Arc<Workload>],
    waypoint_keys: &HashSet<ServiceKey>,
) -> anyhow::Result<()> {
    for (node, n) in &state.nodes {
        crate::agent::wait_ready(node, n)?;
    }
    for w in workloads {
        if w.node.is_none()
            || w.tunnel != TunnelProtocol::Hbone
            || waypoints::is_waypoint(w, waypoint_keys)
        {
            continue;
        }
        crate::agent::enroll(state, &w.name)?;
        if let Some(p) = state.pods.get_mut(&w.name) {
            p.enrolled = true;
        }
    }
    Ok(())
}
