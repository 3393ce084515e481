//! `ferry`: one binary, one subcommand per component.

#![forbid(unsafe_code)]

mod control;
mod explain;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Ferry: a sidecarless service mesh for multi-cluster Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Trace a connection through the mesh, hop by hop, as the data path would decide it.
    ///
    /// Without --from/--to, walks through a tour of the example topology's interesting paths.
    Explain(ExplainArgs),
    /// The control plane: the mesh CA (and, with later work, xDS) over TLS.
    #[command(subcommand)]
    Control(control::ControlCommand),
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// Topology file (YAML). Default: the built-in two-cluster example (examples/two-clusters.yaml).
    #[arg(long, short)]
    topology: Option<PathBuf>,
    /// Source workload: `name`, `namespace/name`, `cluster/namespace/name`, an IP, or `network/IP`.
    #[arg(long, short, requires = "to")]
    from: Option<String>,
    /// Destination: `IP:port` or `hostname:port`.
    #[arg(long, short = 'd', requires = "from")]
    to: Option<String>,
    /// Seed for the load-balancing choice (the same seed gives the same pick).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Explain(args) => explain::run(&args),
        Command::Control(cmd) => control::run(cmd),
    }
}
