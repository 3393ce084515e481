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
        /// An extra argument for every node proxy (repeat), e.g. `--node-arg=--idle-bound-seconds=60`.
        #[arg(long = "node-arg", allow_hyphen_values = true)]
        node_args: Vec<String>,
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
    /// Measure A -> B through Ferry against A -> B direct, in the same run; and node proxy
    /// memory with many idle proxied connections.
    Bench {
        #[arg(long, default_value = "sleep")]
        from: String,
        #[arg(long, default_value = "echo-alpha-2")]
        to: String,
        #[arg(long, default_value_t = 512)]
        bulk_mib: usize,
        #[arg(long, default_value_t = 5000)]
        round_trips: usize,
        #[arg(long, default_value_t = 500)]
        conns: usize,
        /// Idle proxied connections to hold while measuring node proxy memory.
        #[arg(long, default_value_t = 10000)]
        idle: usize,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Compare two paths from one pod through Ferry, in the same run (e.g. same-network HBONE
    /// against double HBONE through a gateway).
    BenchPaths {
        #[arg(long)]
        from: String,
        #[arg(long)]
        near: SocketAddr,
        #[arg(long)]
        far: SocketAddr,
        #[arg(long, default_value_t = 128)]
        bulk_mib: usize,
        #[arg(long, default_value_t = 3000)]
        round_trips: usize,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) a hand-made HBONE request: get a certificate for `identity` with a node
    /// credential, then CONNECT to `authority` through `to`. Prints the outcome.
    #[command(hide = true)]
    Craft {
        #[arg(long)]
        control: String,
        #[arg(long)]
        token_file: PathBuf,
        #[arg(long)]
        bundle_file: PathBuf,
        #[arg(long)]
        identity: String,
        #[arg(long)]
        to: SocketAddr,
        #[arg(long)]
        peer_identity: String,
        #[arg(long)]
        authority: String,
        #[arg(long)]
        cluster: String,
        /// Dial the tunnel from this network namespace (a name under /run/netns) instead of
        /// the one the credential is fetched from.
        #[arg(long)]
        dial_netns: Option<String>,
    },
    /// (inside the lab) the path comparison client.
    #[command(hide = true)]
    PathsClient {
        near: SocketAddr,
        far: SocketAddr,
        #[arg(long)]
        bulk_mib: usize,
        #[arg(long)]
        round_trips: usize,
    },
    /// A node proxy handed over under load: new connections keep coming and long-lived ones
    /// stay busy; reports failed new connections and how the long-lived ones ended.
    BenchHandover {
        #[arg(long, default_value = "sleep")]
        from: String,
        #[arg(long, default_value = "echo-alpha-2")]
        to: String,
        /// The node to hand over (default: the source pod's).
        #[arg(long)]
        node: Option<String>,
        #[arg(long, default_value_t = 50)]
        streams: usize,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) keep connections busy until they end; report how they ended.
    #[command(hide = true)]
    Streams {
        to: SocketAddr,
        #[arg(long)]
        n: usize,
        #[arg(long, default_value_t = 120)]
        max_seconds: u64,
    },
    /// Node proxy memory per idle proxied connection (at each count), and after they are gone
    /// against the idle footprint, same run.
    BenchMemory {
        #[arg(long, default_value = "sleep")]
        from: String,
        #[arg(long, default_value = "echo-alpha-2")]
        to: String,
        #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
        counts: Vec<usize>,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// HTTP requests through a waypoint against the L4-only Ferry path and the direct path,
    /// same run, same pod; with the waypoints' CPU per 1,000 requests.
    BenchHttp {
        #[arg(long, default_value = "echo-beta")]
        from: String,
        /// A pod's HTTP port reached without a waypoint: the direct and L4 paths.
        #[arg(long, default_value = "198.18.3.30:8081")]
        l4: SocketAddr,
        /// A service's HTTP port served by a waypoint with per-request policy.
        #[arg(long, default_value = "198.18.10.5:81")]
        waypoint: SocketAddr,
        #[arg(long, default_value_t = 5000)]
        requests: usize,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) the HTTP benchmark client.
    #[command(hide = true)]
    HttpBenchClient {
        #[arg(long)]
        l4: SocketAddr,
        #[arg(long)]
        waypoint: SocketAddr,
        #[arg(long)]
        requests: usize,
    },
    /// (inside the lab) the benchmark client.
    #[command(hide = true)]
    BenchClient {
        #[arg(long)]
        target: std::net::IpAddr,
        #[arg(long)]
        bulk_mib: usize,
        #[arg(long)]
        round_trips: usize,
        #[arg(long)]
        conns: usize,
    },
    /// (inside the lab) hold idle connections until stdin closes (or one is closed).
    #[command(hide = true)]
    Hold {
        to: SocketAddr,
        #[arg(long)]
        n: usize,
        #[arg(long)]
        until_closed: bool,
        /// HTTP/1.1 connections upgraded to echoing bytes instead of plain TCP.
        #[arg(long)]
        upgrade: bool,
    },
    /// (inside the lab) open connections, then half-close them and wait for the far side.
    #[command(hide = true)]
    HalfClose {
        to: SocketAddr,
        #[arg(long)]
        n: usize,
        #[arg(long, default_value_t = 60)]
        max_seconds: u64,
    },
    /// Hand one node's pods over to a new node proxy process without refusing a connection.
    Handover {
        node: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) short connections one after another until a file appears.
    #[command(hide = true)]
    Churn {
        to: SocketAddr,
        #[arg(long)]
        until_file: PathBuf,
        #[arg(long, default_value_t = 120)]
        max_seconds: u64,
    },
    /// Restart one node proxy; its pods are enrolled again.
    RestartNode {
        node: String,
        /// SIGKILL instead of a drain (a crash).
        #[arg(long)]
        kill: bool,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Stop one node proxy and leave it stopped (its pods stay captured: their traffic is
    /// refused, never sent around the proxy); `start-node` brings it back.
    StopNode {
        node: String,
        /// SIGKILL instead of a drain (a crash).
        #[arg(long)]
        kill: bool,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Start a stopped node proxy; it serves its enrolled pods again from its own state.
    StartNode {
        node: String,
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
        LabCommand::Up {
            topology,
            node_args,
            lab,
        } => {
            let opts = Options {
                id: lab.id,
                state_dir: lab.state_dir,
                topology,
                node_args,
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
        LabCommand::Bench {
            from,
            to,
            bulk_mib,
            round_trips,
            conns,
            idle,
            lab,
        } => {
            bench(&lab, &from, &to, bulk_mib, round_trips, conns, idle)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::BenchHandover {
            from,
            to,
            node,
            streams,
            lab,
        } => {
            crate::lab_handover::run(&lab.state_dir, &from, &to, node, streams)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Streams { to, n, max_seconds } => {
            ferry_lab::apps::streams(to, n, Duration::from_secs(max_seconds))?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::BenchMemory {
            from,
            to,
            counts,
            lab,
        } => {
            crate::lab_memory::run(&lab.state_dir, &from, &to, &counts)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::BenchHttp {
            from,
            l4,
            waypoint,
            requests,
            lab,
        } => {
            let state = State::load(&lab.state_dir).context("no lab is up")?;
            let ns = netns_of(&state, &from)?;
            let waypoints: Vec<u32> = state
                .pids
                .iter()
                .copied()
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"waypoint".as_slice()))
                })
                .collect();
            let before: u64 = waypoints.iter().map(|p| cpu_ticks(*p)).sum();
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .arg(std::env::current_exe()?)
                .args(["lab", "http-bench-client", "--l4", &l4.to_string()])
                .args(["--waypoint", &waypoint.to_string()])
                .args(["--requests", &requests.to_string()])
                .status()?;
            if !status.success() {
                bail!("the HTTP benchmark client failed");
            }
            let ticks = waypoints.iter().map(|p| cpu_ticks(*p)).sum::<u64>() - before;
            // Kernel clock ticks are 10 ms on these machines (USER_HZ = 100).
            println!(
                "waypoint CPU: {:.1} ms per 1,000 requests ({} process(es), {requests} requests)",
                ticks as f64 * 10.0 * 1000.0 / requests as f64,
                waypoints.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::HttpBenchClient {
            l4,
            waypoint,
            requests,
        } => {
            ferry_lab::apps::http_bench(
                &[
                    ("direct (no proxy)".into(), l4, true),
                    ("ferry L4 (node proxy only)".into(), l4, false),
                    ("ferry + waypoint (HTTP policy)".into(), waypoint, false),
                ],
                requests,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::BenchClient {
            target,
            bulk_mib,
            round_trips,
            conns,
        } => {
            ferry_lab::apps::bench(target, bulk_mib, round_trips, conns)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::BenchPaths {
            from,
            near,
            far,
            bulk_mib,
            round_trips,
            lab,
        } => {
            let state = State::load(&lab.state_dir).context("no lab is up")?;
            let ns = netns_of(&state, &from)?;
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .arg(std::env::current_exe()?)
                .args(["lab", "paths-client", &near.to_string(), &far.to_string()])
                .args([
                    "--bulk-mib",
                    &bulk_mib.to_string(),
                    "--round-trips",
                    &round_trips.to_string(),
                ])
                .status()?;
            Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
        }
        LabCommand::Craft {
            control,
            token_file,
            bundle_file,
            identity,
            to,
            peer_identity,
            authority,
            cluster,
            dial_netns,
        } => {
            let token = std::fs::read_to_string(&token_file)?;
            let bundle = std::fs::read_to_string(&bundle_file)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                use ferry_identity::client::CertificateSource;
                let ca = ferry_identity::client::GrpcCa::new(
                    &control,
                    &bundle,
                    "ferry-control",
                    token.trim().to_string(),
                    cluster.clone(),
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                let creds = ca
                    .sign(&identity.parse()?, Duration::from_secs(3600))
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let trust = ferry_hbone::tls::TrustBundle::from_pem(&bundle)?;
                let dialer: Box<dyn ferry_hbone::client::Dialer> = match dial_netns {
                    Some(name) => Box::new(ferry_runtime::netns::NetnsDialer(std::sync::Arc::new(
                        ferry_runtime::netns::Netns::open(&PathBuf::from("/run/netns").join(name))?,
                    ))),
                    None => Box::new(ferry_hbone::client::DirectDialer),
                };
                let conn = ferry_hbone::client::Connection::connect_with(
                    dialer.as_ref(),
                    None,
                    to,
                    &creds,
                    &trust,
                    vec![peer_identity.parse()?],
                    &ferry_hbone::settings::Settings::default(),
                )
                .await?;
                let headers = ferry_hbone::headers::ConnectHeaders {
                    baggage: vec![("k8s.cluster.name".into(), cluster)],
                    ..Default::default()
                };
                match conn.open(&authority, &headers).await {
                    Ok(_) => println!("status 200: tunnel open"),
                    Err(e) => println!("refused: {e}"),
                }
                Ok::<_, anyhow::Error>(())
            })?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::PathsClient {
            near,
            far,
            bulk_mib,
            round_trips,
        } => {
            let [n, f] = ferry_lab::apps::paths(near, far, bulk_mib, round_trips)?;
            println!(
                "paths through Ferry from this pod, {bulk_mib} MiB echoed, {round_trips} round trips"
            );
            println!(
                "near {near}: {:.2} GB/s, 1 KiB p50 {:.0} us p99 {:.0} us",
                n.0, n.1, n.2
            );
            println!(
                "far  {far}: {:.2} GB/s, 1 KiB p50 {:.0} us p99 {:.0} us",
                f.0, f.1, f.2
            );
            println!(
                "far / near: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
                f.0 / n.0,
                f.1 / n.1,
                f.2 / n.2
            );
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Hold {
            to,
            n,
            until_closed,
            upgrade,
        } => {
            ferry_lab::apps::hold(to, n, until_closed, upgrade)?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::HalfClose { to, n, max_seconds } => {
            ferry_lab::apps::half_close(to, n, std::time::Duration::from_secs(max_seconds))?;
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Handover { node, lab } => {
            ferry_lab::ops::handover(&lab.state_dir, &node)?;
            println!("ferry lab: node {node} handed over to a new node proxy");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Churn {
            to,
            until_file,
            max_seconds,
        } => {
            let (ok, failed) =
                ferry_lab::apps::churn(to, &until_file, Duration::from_secs(max_seconds));
            println!("ok={ok} failed={failed}");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::RestartNode { node, kill, lab } => {
            ferry_lab::ops::restart_node(&lab.state_dir, &node, kill)?;
            println!("ferry lab: node {node} restarted; it serves its pods again");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::StopNode { node, kill, lab } => {
            ferry_lab::ops::stop_node(&lab.state_dir, &node, kill)?;
            println!("ferry lab: node {node} stopped; its pods stay captured");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::StartNode { node, lab } => {
            ferry_lab::ops::start_node(&lab.state_dir, &node)?;
            println!("ferry lab: node {node} started; it serves its pods again");
            Ok(ExitCode::SUCCESS)
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
    if let Some(g) = state.gateways.get(pod) {
        return Ok(g.clone());
    }
    let known: Vec<&str> = state.pods.keys().map(String::as_str).collect();
    bail!(
        "no pod or node {pod:?} in this lab (pods: {})",
        known.join(", ")
    )
}

/// User plus system CPU of `pid`, in clock ticks (0 if it is gone).
fn cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
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

#[allow(clippy::too_many_arguments)]
fn bench(
    lab: &LabArgs,
    from: &str,
    to: &str,
    bulk_mib: usize,
    round_trips: usize,
    conns: usize,
    idle: usize,
) -> anyhow::Result<()> {
    let state = State::load(&lab.state_dir).context("no lab is up")?;
    let src = state
        .pods
        .get(from)
        .with_context(|| format!("no pod {from}"))?;
    let dst = state.pods.get(to).with_context(|| format!("no pod {to}"))?;
    let exe = std::env::current_exe()?;
    let status = Command::new("ip")
        .args(["netns", "exec", &src.netns])
        .arg(&exe)
        .args([
            "lab",
            "bench-client",
            "--target",
            &dst.ip,
            "--bulk-mib",
            &bulk_mib.to_string(),
        ])
        .args([
            "--round-trips",
            &round_trips.to_string(),
            "--conns",
            &conns.to_string(),
        ])
        .status()?;
    if !status.success() {
        bail!("the benchmark client failed");
    }
    if idle == 0 {
        return Ok(());
    }
    // Memory with many idle proxied connections, as `bench-memory` measures it.
    crate::lab_memory::run(&lab.state_dir, from, to, &[idle])
}
