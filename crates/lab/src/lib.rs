//! `ferry lab`: a multi-cluster mesh on one machine, built from a topology file.
//!
//! ```text
//!  <id>-mgmt  bridge: the control plane and every node proxy (198.19.254.0/24, reserved)
//!     |-- <id>-ctl   ferry control (CA + xDS) on 198.19.254.1:15012
//!     |-- <id>-hN    ferry node, one per topology node, 198.19.254.(10+N)
//!  <id>-netK  bridge: one per topology network; pods of that network are on-link (198.18.0.0/15)
//!     |-- <id>-pJ    one per workload: eth0 with its address, an echo app on 8080 and 9090
//! ```
//! Node proxies enter their pods' namespaces to capture traffic. Nothing has a default route:
//! the lab reaches nothing but itself. `ferry lab down` removes every namespace and process it
//! made, also after a partial `up`, and is safe to run twice.

use std::path::{Path, PathBuf};

use anyhow::Context;

mod agent;
mod api_server;
mod apps;
mod bench;
mod build;
pub mod cli;
mod craft;
mod dns;
mod grpc;
mod ops;
mod pods;
mod procs;
mod rollout;
mod session;
mod state;

/// Where a lab keeps its state, logs and sockets unless `--state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/run/ferry-lab";

/// The topology file that the control plane of the lab in `state_dir` serves (it watches the
/// file): the lab's own copy, with every edit `ferry lab terminate` and `kill` made to it.
pub fn live_topology(state_dir: &Path) -> anyhow::Result<PathBuf> {
    let state = state::State::load(state_dir)
        .with_context(|| format!("no lab is up in {}", state_dir.display()))?;
    Ok(state.topology)
}

/// One component of a running lab whose admin endpoint serves connection records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    /// `node/<name>` or `waypoint/<name>`.
    pub name: String,
    pub netns: String,
    pub admin: String,
}

/// The node proxies, waypoint instances and east-west gateways of the lab in `state_dir`, with
/// their admin endpoints.
pub fn components(state_dir: &Path) -> anyhow::Result<Vec<Component>> {
    let state = state::State::up(state_dir)?;
    let mut out: Vec<Component> = state
        .nodes
        .iter()
        .map(|(name, n)| Component {
            name: format!("node/{name}"),
            netns: n.netns.clone(),
            admin: n.admin.clone(),
        })
        .collect();
    out.extend(
        state
            .pods
            .iter()
            .filter(|(_, p)| p.waypoint)
            .map(|(name, p)| Component {
                name: format!("waypoint/{name}"),
                netns: p.netns.clone(),
                admin: format!("{}:15020", p.ip),
            }),
    );
    out.extend(state.gateway_admins.iter().filter_map(|(name, admin)| {
        Some(Component {
            name: format!("gateway/{name}"),
            netns: state.gateways.get(name)?.clone(),
            admin: admin.clone(),
        })
    }));
    Ok(out)
}

/// The network namespace of `pod` in the lab in `state_dir`.
pub fn pod_netns(state_dir: &Path, pod: &str) -> anyhow::Result<String> {
    let state = state::State::up(state_dir)?;
    state
        .pods
        .get(pod)
        .map(|p| p.netns.clone())
        .with_context(|| format!("no pod {pod} in the lab"))
}

/// The body of a GET of `path` on `c`'s admin endpoint, asked from inside its namespace.
pub fn admin_get(c: &Component, path: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &c.netns])
        .arg(std::env::current_exe()?)
        .args(["lab", "connect", &c.admin, "--data"])
        .arg(format!(
            "GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"
        ))
        .output()
        .with_context(|| format!("asking {} for {path}", c.name))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{} answered no HTTP response to {path}", c.name))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "{} answered {path} with {}",
        c.name,
        head.lines().next().unwrap_or("nothing")
    );
    Ok(body.to_string())
}

/// The reserved management network.
pub(crate) const MGMT_PREFIX: &str = "198.19.254";
/// The control plane's address on the management network.
pub(crate) const CONTROL_IP: &str = "198.19.254.1";
