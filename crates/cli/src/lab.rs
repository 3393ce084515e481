//! `ferry lab`: up, down, status, exec, send; and the apps the lab runs inside pods.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_lab::build::{self, Options};
use ferry_lab::state::State;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum LabCommand {
    /// Build the mesh of a topology file (default: examples/lab.yaml, two clusters on one flat
    /// network) in network namespaces, and start the control plane, node proxies and apps.
    Up {
        topology: Option<PathBuf>,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Remove everything `up` made (safe to run twice).
    Down {
        #[command(flatten)]
        lab: LabArgs,
    },
    /// What runs where.
    Status {
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Run a command inside a pod's network namespace.
    Exec {
        pod: String,
        #[command(flatten)]
        lab: LabArgs,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Connect from a pod to IP:port, send a line, print what comes back.
    Send {
        pod: String,
        to: SocketAddr,
        #[arg(long, default_value = "hello\n")]
        data: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) the echo app a pod runs.
    #[command(hide = true)]
    Echo {
        #[arg(long)]
        name: String,
        #[arg(long, value_delimiter = ',')]
        ports: Vec<u16>,
    },
    /// (inside the lab) connect, send, print the answer.
    #[command(hide = true)]
    Connect {
        to: SocketAddr,
        #[arg(long, default_value = "hello\n")]
        data: String,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct LabArgs {
    /// Where the lab keeps its state, logs and sockets.
    #[arg(long, default_value = "/run/ferry-lab")]
    state_dir: PathBuf,
    /// Prefix of the lab's namespace names (several labs can coexist).
    #[arg(long, default_value = "fl")]
    id: String,
}

pub(crate) fn run(cmd: LabCommand) -> ExitCode {
    match run_inner(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry lab: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(cmd: LabCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        LabCommand::Up { topology, lab } => {
            let opts = Options {
                id: lab.id,
                state_dir: lab.state_dir,
                topology,
                ferry: std::env::current_exe()?,
            };
            let state = build::up(&opts)?;
            print_status(&state);
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Down { lab } => {
            if build::down(&lab.state_dir)? {
                println!("ferry lab: removed the lab in {}", lab.state_dir.display());
            } else {
                println!("ferry lab: no lab in {}", lab.state_dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Status { lab } => {
            let state = State::load(&lab.state_dir).context("no lab is up")?;
            print_status(&state);
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Exec { pod, lab, command } => {
            let state = State::load(&lab.state_dir).context("no lab is up")?;
            let ns = netns_of(&state, &pod)?;
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(&command)
                .status()?;
            Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
        }
        LabCommand::Send { pod, to, data, lab } => {
            let state = State::load(&lab.state_dir).context("no lab is up")?;
            let ns = netns_of(&state, &pod)?;
            let exe = std::env::current_exe()?;
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .arg(exe)
                .args(["lab", "connect", &to.to_string(), "--data", &data])
                .status()?;
            Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
        }
        LabCommand::Echo { name, ports } => {
            ferry_lab::apps::echo(&name, &ports)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Connect { to, data } => {
            match ferry_lab::apps::connect(to, data.as_bytes(), Duration::from_secs(5)) {
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
    }
}

fn netns_of(state: &State, pod: &str) -> anyhow::Result<String> {
    if let Some(p) = state.pods.get(pod) {
        return Ok(p.netns.clone());
    }
    if let Some(n) = state.nodes.get(pod) {
        return Ok(n.netns.clone());
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
            "  node {name:<10} cluster {:<8} netns {:<10} admin http://{}/ (log {})",
            n.cluster,
            n.netns,
            n.admin,
            n.log.display()
        );
    }
    for (name, p) in &state.pods {
        let how = if p.enrolled {
            "in the mesh"
        } else {
            "not in the mesh"
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
