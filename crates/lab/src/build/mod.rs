//! `up` and `down`: namespaces, links, addresses, processes.
//!
//! `up` builds in this order, each step in its own module: the management network and one
//! bridge per mesh network ([`net`]), the pods ([`pods`]), the control plane ([`control`]; with
//! `--kubernetes`, first the API servers of the recorded objects it reads: [`kubernetes`]), the
//! node proxies ([`nodes`]), the east-west gateways ([`gateways`]), the apps, the waypoints
//! ([`waypoints`]) and last the enrollment of every captured pod.

mod control;
mod gateways;
mod kubernetes;
mod net;
mod nodes;
mod pods;
mod waypoints;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_core::snapshot::Snapshot;

use crate::MGMT_PREFIX;
use crate::state::State;

/// The built-in default mesh.
pub(crate) const DEFAULT_TOPOLOGY: &str = include_str!("../../../../examples/lab.yaml");

/// The ports every lab pod's echo app serves.
pub(crate) const APP_PORTS: [u16; 2] = [8080, 9090];

/// How to bring a lab up.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Prefix of every namespace name; lets several labs coexist.
    pub(crate) id: String,
    pub(crate) state_dir: PathBuf,
    pub(crate) topology: Option<PathBuf>,
    /// The `ferry` binary to run inside the lab.
    pub(crate) ferry: PathBuf,
    /// Extra arguments for every node proxy.
    pub(crate) node_args: Vec<String>,
    /// Extra arguments for every waypoint instance and east-west gateway.
    pub(crate) hop_args: Vec<String>,
    /// The control plane reads Kubernetes: each cluster's recorded objects in
    /// `<dir>/<cluster>.yaml` (see [`kubernetes`]), not the topology file.
    pub(crate) kubernetes: Option<PathBuf>,
}

/// What every build step shares: the options, and the strings argument lists are made of.
struct Lab<'a> {
    opts: &'a Options,
    /// The `ferry` binary.
    exe: String,
    /// The state directory.
    dir: String,
}

/// Checks what the lab needs, and says exactly what is missing.
pub(crate) fn preflight() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "ferry lab needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces, veth \
             links and iptables rules; run it as root, or inside a user namespace made with \
             `unshare --user --map-root-user --net --mount`"
        );
    }
    let missing = || TOOLS.iter().copied().find(|t| !on_path(t));
    if let Some(tool) = missing() {
        // A fresh machine lacks them: install them once, saying so (Debian's packages).
        if on_path("apt-get") {
            eprintln!(
                "ferry lab: `{tool}` is missing; installing {}",
                PACKAGES.join(" ")
            );
            let ok = Command::new("sh")
                .args([
                    "-c",
                    "apt-get update -qq && apt-get install -y -qq \"$@\"",
                    "sh",
                ])
                .args(PACKAGES)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                bail!("installing {} with apt-get failed", PACKAGES.join(" "));
            }
        }
        if let Some(tool) = missing() {
            bail!(
                "ferry lab needs `{tool}` (Debian packages: {})",
                PACKAGES.join(", ")
            );
        }
    }
    Ok(())
}

/// What the lab runs, and the Debian packages that bring them.
const TOOLS: [&str; 5] = ["ip", "iptables", "iptables-restore", "nsenter", "setsid"];
const PACKAGES: [&str; 4] = ["iproute2", "iptables", "nftables", "util-linux"];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Brings a lab up; on failure, takes down whatever was made.
pub(crate) fn up(opts: &Options) -> anyhow::Result<State> {
    preflight()?;
    if State::load(&opts.state_dir).is_some() {
        bail!(
            "a lab is already up in {} (run `ferry lab down` first)",
            opts.state_dir.display()
        );
    }
    let mut state = State {
        id: opts.id.clone(),
        dir: opts.state_dir.clone(),
        ..State::default()
    };
    std::fs::create_dir_all(&opts.state_dir)?;
    state.save()?;
    match build(opts, &mut state) {
        Ok(()) => Ok(state),
        Err(e) => {
            let _ = down(&opts.state_dir);
            Err(e)
        }
    }
}

fn build(opts: &Options, state: &mut State) -> anyhow::Result<()> {
    let text = match &opts.topology {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => DEFAULT_TOPOLOGY.to_string(),
    };
    let topo_path = opts.state_dir.join("topology.yaml");
    std::fs::write(&topo_path, &text)?;
    state.topology = topo_path.clone();
    let topo = ferry_topology::parse(&topo_path.display().to_string(), &text)?;
    let snap = &topo.snapshot;
    check_reserved(snap)?;
    let lab = Lab {
        opts,
        exe: opts.ferry.display().to_string(),
        dir: opts.state_dir.display().to_string(),
    };
    let id = &opts.id;
    let (mgmt, ctl) = net::management(state, id)?;
    let networks = net::networks(state, id, snap)?;
    let workloads = pods::create(state, id, snap, &networks)?;
    let source = match &opts.kubernetes {
        Some(dir) => {
            let mut args = kubernetes::start(&lab, state, &ctl, snap, dir)?;
            args.extend(["--trust-domain".into(), topo.trust_domain.to_string()]);
            args
        }
        None => vec!["--topology".into(), topo_path.display().to_string()],
    };
    let control = control::start(&lab, state, &ctl, &topo.trust_domain, &source)?;
    nodes::start(&lab, state, snap, &mgmt, &control)?;
    gateways::start(&lab, state, snap, &mgmt, &networks, &control)?;
    pods::start_apps(&lab, state, snap)?;
    let waypoint_keys = waypoints::keys(snap);
    waypoints::start(&lab, state, &workloads, &waypoint_keys, &control)?;
    pods::enroll(state, &workloads, &waypoint_keys)?;
    state.save()?;
    Ok(())
}

/// Refuses a topology with a workload inside the lab's reserved management network.
fn check_reserved(snap: &Snapshot) -> anyhow::Result<()> {
    for w in snap.workloads() {
        for a in &w.addresses {
            if a.to_string().starts_with(&format!("{MGMT_PREFIX}.")) {
                bail!(
                    "workload {} uses {a}, inside the lab's reserved management network {MGMT_PREFIX}.0/24",
                    w.uid
                );
            }
        }
    }
    Ok(())
}

/// Removes everything a lab made. Safe to run twice, and after a partial `up`.
pub(crate) fn down(state_dir: &Path) -> anyhow::Result<bool> {
    let Some(state) = State::load(state_dir) else {
        return Ok(false);
    };
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for &pid in &state.pids {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(5);
    for &pid in &state.pids {
        while kill(Pid::from_raw(pid as i32), None).is_ok() && Instant::now() < end {
            // Reap if it is our child; otherwise just wait for it to go.
            let _ = nix::sys::wait::waitpid(
                Pid::from_raw(pid as i32),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    for ns in state.netns.iter().rev() {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    std::fs::remove_dir_all(state_dir)
        .with_context(|| format!("removing {}", state_dir.display()))?;
    Ok(true)
}
