//! The commands run from outside the lab: up, down, status, exec and send; and `connect`, which
//! `send` runs inside the pod.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::bail;

use crate::build::{self, Options};
use crate::state::State;

/// Which lab a command is about.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// Where the lab keeps its state, logs and sockets.
    #[arg(long, default_value = crate::DEFAULT_STATE_DIR)]
    pub(crate) state_dir: PathBuf,
    /// Prefix of the lab's namespace names (several labs can coexist).
    #[arg(long, default_value = "fl")]
    pub(crate) id: String,
}

/// `ferry lab up`: builds the lab and prints what runs where.
pub(crate) fn up(
    lab: LabArgs,
    topology: Option<PathBuf>,
    node_args: Vec<String>,
    hop_args: Vec<String>,
    kubernetes: Option<PathBuf>,
) -> anyhow::Result<()> {
    let opts = Options {
        id: lab.id,
        state_dir: lab.state_dir,
        topology,
        node_args,
        hop_args,
        kubernetes,
        ferry: std::env::current_exe()?,
    };
    let state = build::up(&opts)?;
    print_status(&state);
    Ok(())
}

/// `ferry lab down`.
pub(crate) fn down(state_dir: &Path) -> anyhow::Result<()> {
    if build::down(state_dir)? {
        println!("ferry lab: removed the lab in {}", state_dir.display());
    } else {
        println!("ferry lab: no lab in {}", state_dir.display());
    }
    Ok(())
}

/// `ferry lab status`.
pub(crate) fn status(state_dir: &Path) -> anyhow::Result<()> {
    let state = State::up(state_dir)?;
    print_status(&state);
    Ok(())
}

/// `ferry lab exec`: runs `command` in the namespace of `pod`; exits with its code.
pub(crate) fn exec(state_dir: &Path, pod: &str, command: &[String]) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, pod)?;
    // Replaced by the command, not its parent: a signal to this process (a test that kills the
    // client it started) reaches the command itself.
    let e = std::os::unix::process::CommandExt::exec(
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(command),
    );
    Err(anyhow::Error::new(e).context("cannot run ip netns exec"))
}

/// `ferry lab send`: `ferry lab connect` inside `pod`; exits with its code.
pub(crate) fn send(
    state_dir: &Path,
    pod: &str,
    to: SocketAddr,
    data: &str,
) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, pod)?;
    let exe = std::env::current_exe()?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(exe)
        .args(["lab", "connect", &to.to_string(), "--data", data])
        .status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `ferry lab grpc`: `grpc-check` inside `pod`'s namespace.
pub(crate) fn grpc(
    state_dir: &Path,
    pod: &str,
    to: SocketAddr,
    service: &str,
) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, pod)?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args(["lab", "grpc-check", &to.to_string(), service])
        .status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `ferry lab count`: `tally` inside `pod`'s namespace.
pub(crate) fn count(
    state_dir: &Path,
    pod: &str,
    to: SocketAddr,
    n: u32,
) -> anyhow::Result<ExitCode> {
    let state = State::up(state_dir)?;
    let ns = netns_of(&state, pod)?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args(["lab", "tally", &to.to_string(), "--n", &n.to_string()])
        .status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

/// `ferry lab tally` (inside the lab): `n` new connections to `to`, one after another; prints
/// `<pod> <count>` per answering pod (the first word of the echo app's answer), then
/// `failed <count>`.
pub(crate) fn tally(to: SocketAddr, n: u32) -> anyhow::Result<()> {
    let mut by_pod: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut failed = 0u32;
    for _ in 0..n {
        match crate::apps::connect(to, b"count\n", Duration::from_secs(5)) {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out);
                let pod = text.split_whitespace().next().unwrap_or("(empty answer)");
                *by_pod.entry(pod.to_string()).or_default() += 1;
            }
            Err(_) => failed += 1,
        }
    }
    for (pod, c) in &by_pod {
        println!("{pod} {c}");
    }
    println!("failed {failed}");
    Ok(())
}

/// `ferry lab connect` (inside the lab): prints the answer, or why the connection failed
/// (exit code 1).
pub(crate) fn connect(to: SocketAddr, data: &str, local: bool) -> anyhow::Result<ExitCode> {
    let shown = |addr: SocketAddr| {
        if local {
            eprintln!("local {addr}");
        }
    };
    match crate::apps::connect_then(to, data.as_bytes(), Duration::from_secs(5), shown) {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("connection to {to} failed: {e} ({:?})", e.kind());
            Ok(ExitCode::from(1))
        }
    }
}

/// The network namespace of a pod, a node or a gateway.
pub(crate) fn netns_of(state: &State, pod: &str) -> anyhow::Result<String> {
    if let Some(p) = state.pods.get(pod) {
        return Ok(p.netns.clone());
    }
    if let Some(n) = state.nodes.get(pod) {
        return Ok(n.netns.clone());
    }
    if let Some(g) = state.gateways.get(pod) {
        return Ok(g.clone());
    }
    let known: Vec<&str> = state.pods.keys().map(String::as_str).collect();
    bail!(
        "no pod or node {pod:?} in this lab (pods: {})",
        known.join(", ")
    )
}

fn print_status(state: &State) {
    println!(
        "ferry lab {} is up (state, logs and sockets in {})",
        state.id,
        state.dir.display()
    );
    println!(
        "  control plane   {} (log {})",
        state.control_addr,
        state.control_log.display()
    );
    for (name, n) in &state.nodes {
        println!(
            "  node {name:<10} cluster {:<8} netns {:<10} admin http://{}/ (log {}; its node agent's {})",
            n.cluster,
            n.netns,
            n.admin,
            n.log.display(),
            n.agent.with_extension("log").display()
        );
    }
    for (name, p) in &state.pods {
        let how = match (p.enrolled, p.waypoint) {
            (_, true) => "waypoint (ferry waypoint)",
            (true, false) => "in the mesh",
            (false, false) => "not in the mesh",
        };
        println!(
            "  pod  {name:<22} {:<13} cluster {:<8} node {:<9} netns {:<8} {how}",
            p.ip,
            p.cluster,
            p.node.as_deref().unwrap_or("-"),
            p.netns
        );
    }
    println!(
        "send traffic:   ferry lab send <pod> <ip:port>          e.g. ferry lab send sleep 198.18.10.1:80"
    );
    println!("run a command:  ferry lab exec <pod> -- <command>");
    println!(
        "trace a path:   ferry explain -t {} --from <pod> --to <ip:port>",
        state.topology.display()
    );
    println!("tear down:      ferry lab down");
}
