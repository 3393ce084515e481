//! `ferry`: one binary, one subcommand per component.

#![deny(unsafe_code)]

mod cni;
mod control;
mod explain;
mod lab;
mod logging;
mod node;
mod observe;
mod trace;
mod ui;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// jemalloc, not glibc's malloc: a tunnel's buffers (HTTP/2 frames up to 1 MiB, windows of
/// several MiB) are allocated and freed over and over, and glibc maps every allocation above a
/// threshold afresh and trims its heap's top, thresholds raised only when a large mapped block
/// happens to be freed. Which history a process had decided, for its whole life, whether it
/// page-faulted for every few KiB it carried (1.4x the CPU per GB, issue 21 finding 1: the slow
/// state of a proxy whose pool opened under load). jemalloc reuses freed pages and returns them
/// after a few idle seconds. `crates/hbone/tests/pool_under_load.rs` checks the faults.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once as it starts (`_RJEM_MALLOC_CONF` in the environment still
/// overrides them): one arena per CPU, each thread allocating from its CPU's, instead of four
/// per CPU handed out to threads in turn. A node proxy's threads (two workers, the main thread,
/// one per enrolled pod's namespace) each took an arena of their own, with its own metadata
/// and partly used slabs: measured in `ferry lab` (bench profile), an idle node proxy's
/// jemalloc memory 2.2 MB -> 1.8 MB, 2.8 -> 2.2 MB with six pods (issue 21). Programs using
/// every core (the control plane's decoding) keep an arena per core.
#[allow(unsafe_code)]
// SAFETY: jemalloc reads this NUL-terminated string, once, as it initializes; the name is the
// one tikv-jemalloc-sys's prefixed build looks up (`_rjem_` + `malloc_conf`).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 20] = b"percpu_arena:percpu\0";

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
    /// The connection records of node proxies, waypoints and gateways (a running lab's, or
    /// any by admin address), filtered: the last ones each keeps, merged in time order, or
    /// with --follow a live stream.
    Observe(observe::ObserveArgs),
    /// In a running lab: open one connection from a pod and print every hop it took, each
    /// with its record, joined by the trace id the source started; or, with --id, the hops of
    /// a connection already made.
    Trace(trace::TraceArgs),
    /// The mesh map in the browser: a running lab's clusters, nodes, workloads, services,
    /// waypoints and gateways, its live connections as flows, each with its hops, and explain.
    /// (`ferry lab ui` is the same; `ferry control serve --ui` serves a control plane's.)
    Ui(ui::UiArgs),
    /// The control plane: the mesh CA and delta xDS on one gRPC port over TLS.
    #[command(subcommand)]
    Control(control::ControlCommand),
    /// The node proxy: one per node, serving every enrolled pod on it.
    Node(node::NodeArgs),
    /// A waypoint instance: routes, authorizes and balances each HTTP request (other bytes at
    /// L4), deciding again on behalf of the original source's cluster.
    Waypoint(node::WaypointArgs),
    /// An east-west gateway: the entry of a network for double-HBONE traffic from others.
    Gateway(node::GatewayArgs),
    /// A whole multi-cluster mesh in network namespaces on this machine.
    #[command(subcommand)]
    Lab(lab::LabCli),
    /// The CNI side: the chained plugin the container runtime runs for each pod (also as
    /// `ferry-cni`, a link to this binary) and the node agent that hands pods to the node proxy.
    #[command(subcommand)]
    Cni(cni::CniCommand),
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
    /// Explain on the running lab's live topology: the file its control plane serves, with
    /// every edit `ferry lab terminate` and `ferry lab kill` made. Needs --from and --to, or
    /// --conn (whose record is then looked for in every component of the lab).
    #[arg(long, conflicts_with = "topology")]
    lab: bool,
    /// With --lab: where the lab keeps its state (default: /run/ferry-lab, as `ferry lab`).
    #[arg(long, requires = "lab", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    control: explain::ControlSource,
    /// Source workload: `name`, `namespace/name`, `cluster/namespace/name`, an IP, or `network/IP`.
    #[arg(long, short, requires = "to")]
    from: Option<String>,
    /// Destination: `IP:port` or `hostname:port`.
    #[arg(long, short = 'd', requires = "from")]
    to: Option<String>,
    /// Explain one connection the data path carried: the id of its record (the access log's
    /// `conn.id`, the first word of a `ferry observe` line), read from the lab's components
    /// (--lab) or from --admin endpoints. Prints what that hop recorded (path, routing
    /// decision, verdict, timings, outcome) and its trace's other hops, then the explanation
    /// of the same flow on the current state (--lab, --control or --topology; --from/--to
    /// override the flow derived from the record).
    #[arg(long, value_name = "ID")]
    conn: Option<String>,
    /// With --conn: an admin endpoint (`IP:port`) to read records from. Repeatable.
    #[arg(
        long,
        value_name = "IP:PORT",
        requires = "conn",
        conflicts_with = "lab"
    )]
    admin: Vec<std::net::SocketAddr>,
    /// Seed for the load-balancing choice (the same seed gives the same pick).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    output: Output,
}

fn main() -> ExitCode {
    // The runtime runs a CNI plugin by its name, with no arguments.
    if cni::started_as_plugin() {
        return cni::run_plugin();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Explain(args) => explain::run(&args),
        Command::Observe(args) => observe::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Ui(args) => ui::run(&args),
        Command::Control(cmd) => {
            let _logs = logging::init();
            control::run(cmd)
        }
        Command::Node(args) => {
            let _logs = logging::init();
            node::run(&args)
        }
        Command::Waypoint(args) => {
            let _logs = logging::init();
            node::run_waypoint(&args)
        }
        Command::Gateway(args) => {
            let _logs = logging::init();
            node::run_gateway(&args)
        }
        Command::Lab(cmd) => lab::run(cmd),
        Command::Cni(cmd) => cni::run(cmd),
    }
}

#[cfg(test)]
mod tests {
    /// One of jemalloc's options or a thread's settings, read through mallctl (its value is
    /// `T`'s size and shape).
    #[allow(unsafe_code)]
    pub(crate) fn option<T: Copy>(name: &std::ffi::CStr, mut value: T) -> T {
        let mut len = std::mem::size_of::<T>();
        // SAFETY: a NUL-terminated name, read into a value of the option's size; jemalloc
        // writes at most `len` bytes.
        let read = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&raw mut value).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(read, 0, "{name:?} is read");
        value
    }

    /// jemalloc took the options above: an arena per CPU, as many as it sees.
    #[test]
    #[allow(unsafe_code)]
    fn jemalloc_runs_one_arena_per_cpu() {
        let mode: *const std::ffi::c_char = option(c"opt.percpu_arena", std::ptr::null());
        // SAFETY: jemalloc returned a pointer to one of its static option names.
        let mode = unsafe { std::ffi::CStr::from_ptr(mode) };
        assert_eq!(mode.to_str(), Ok("percpu"), "{:?}", super::MALLOC_CONF);
        let arenas: u32 = option(c"opt.narenas", 0);
        // jemalloc counts the CPUs the process may run on, not a cgroup's quota (which
        // `available_parallelism` applies): the CPUs the machine has bound it.
        let cpus = std::fs::read_to_string("/proc/cpuinfo")
            .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
            .unwrap_or(0)
            .max(std::thread::available_parallelism().map_or(1, usize::from));
        assert!(
            usize::try_from(arenas).is_ok_and(|a| a <= cpus.max(1) * 2),
            "{arenas} arenas for {cpus} CPUs (the default is four per CPU)"
        );
    }
}
