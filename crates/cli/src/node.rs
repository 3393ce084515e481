//! `ferry node`: run the node proxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// This node's name, as in the topology.
    #[arg(long)]
    name: String,
    /// This node's cluster.
    #[arg(long)]
    cluster: String,
    /// The control plane (CA and xDS), `https://ip:port`.
    #[arg(long)]
    control: String,
    /// File holding this node's credential (`ferry control token --node NAME`).
    #[arg(long)]
    token_file: PathBuf,
    /// File holding the trust bundle (`ferry control bundle`).
    #[arg(long)]
    bundle_file: PathBuf,
    /// The enrollment API's Unix socket.
    #[arg(long, default_value = "/run/ferry/node.sock")]
    api: PathBuf,
    /// Admin endpoint: /ready, /config_dump, /certs, /metrics.
    #[arg(long, default_value = "127.0.0.1:15000")]
    admin: SocketAddr,
    /// Seconds in-flight connections may finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    /// LOCAL EXPERIMENTS ONLY: talk to the control plane without TLS.
    #[arg(long)]
    plaintext: bool,
}

pub(crate) fn run(args: &NodeArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry node: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &NodeArgs) -> anyhow::Result<()> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("reading {}", args.token_file.display()))?;
    let bundle = std::fs::read_to_string(&args.bundle_file)
        .with_context(|| format!("reading {}", args.bundle_file.display()))?;
    let config = ferry_node::app::Config {
        name: args.name.clone(),
        cluster: args.cluster.clone(),
        control: args.control.clone(),
        token: token.trim().to_string(),
        bundle_pem: bundle,
        api_socket: args.api.clone(),
        admin: args.admin,
        drain: Duration::from_secs(args.drain_seconds),
        plaintext: args.plaintext,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(ferry_node::app::run(config))
}

#[derive(Debug, clap::Args)]
pub(crate) struct WaypointArgs {
    /// This instance's workload uid.
    #[arg(long)]
    uid: String,
    #[arg(long)]
    cluster: String,
    #[arg(long)]
    control: String,
    /// The credential of the node this instance runs on.
    #[arg(long)]
    token_file: PathBuf,
    #[arg(long)]
    bundle_file: PathBuf,
    #[arg(long, default_value = "0.0.0.0:15008")]
    listen: SocketAddr,
    /// Listen and dial inside this network namespace (the waypoint pod's).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Admin endpoint (`/ready`, `/metrics` with request counts and durations), in the same
    /// namespace as `--listen`.
    #[arg(long)]
    admin: Option<SocketAddr>,
}

pub(crate) fn run_waypoint(args: &WaypointArgs) -> ExitCode {
    let result = (|| -> anyhow::Result<()> {
        let token = std::fs::read_to_string(&args.token_file)
            .with_context(|| format!("reading {}", args.token_file.display()))?;
        let bundle = std::fs::read_to_string(&args.bundle_file)
            .with_context(|| format!("reading {}", args.bundle_file.display()))?;
        let config = ferry_node::waypoint::Config {
            uid: args.uid.clone(),
            cluster: args.cluster.clone(),
            control: args.control.clone(),
            token: token.trim().to_string(),
            bundle_pem: bundle,
            listen: args.listen,
            netns: args.netns.clone(),
            admin: args.admin,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(ferry_node::waypoint::run(config))
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry waypoint: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct GatewayArgs {
    /// The gateway's name in the topology.
    #[arg(long)]
    name: String,
    #[arg(long)]
    control: String,
    /// The gateway's credential (`ferry control token --node gateway.<name>`).
    #[arg(long)]
    token_file: PathBuf,
    #[arg(long)]
    bundle_file: PathBuf,
    #[arg(long, default_value = "0.0.0.0:15008")]
    listen: SocketAddr,
}

pub(crate) fn run_gateway(args: &GatewayArgs) -> ExitCode {
    let result = (|| -> anyhow::Result<()> {
        let token = std::fs::read_to_string(&args.token_file)
            .with_context(|| format!("reading {}", args.token_file.display()))?;
        let bundle = std::fs::read_to_string(&args.bundle_file)
            .with_context(|| format!("reading {}", args.bundle_file.display()))?;
        let config = ferry_node::gateway::Config {
            name: args.name.clone(),
            control: args.control.clone(),
            token: token.trim().to_string(),
            bundle_pem: bundle,
            listen: args.listen,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(ferry_node::gateway::run(config))
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry gateway: {e:#}");
            ExitCode::from(2)
        }
    }
}
