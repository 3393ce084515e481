//! `ferry lab`'s arguments, and the one `match` that runs each subcommand. The `ferry` binary
//! parses [`LabCommand`] and calls [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::session::LabArgs;
use crate::{apps, bench, craft, ops, pods, rollout, session};

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Build the mesh of a topology file (default: examples/lab.yaml, two clusters on one flat
    /// network) in network namespaces, and start the control plane, node proxies and apps.
    Up {
        topology: Option<PathBuf>,
        /// An extra argument for every node proxy (repeat), e.g. `--node-arg=--idle-bound-seconds=60`.
        #[arg(long = "node-arg", allow_hyphen_values = true)]
        node_args: Vec<String>,
        /// An extra argument for every waypoint instance and east-west gateway (repeat), e.g.
        /// `--hop-arg=--drain-seconds=5`.
        #[arg(long = "hop-arg", allow_hyphen_values = true)]
        hop_args: Vec<String>,
        /// The control plane reads Kubernetes instead of the topology file: the recorded
        /// objects of each cluster of the topology in DIR/<cluster>.yaml (`kubectl get -o
        /// yaml` lists; their Pods must be the topology's workloads: same node, service
        /// account and address), served by an API server per cluster in the control plane's
        /// namespace. The first cluster by name is the local one, the others join by remote
        /// secret. `kill`, `terminate` and `rollout` edit the topology file, which it then
        /// does not read. Example: `ferry lab up examples/mcs.yaml --kubernetes
        /// examples/kubernetes/mcs`.
        #[arg(long, value_name = "DIR")]
        kubernetes: Option<PathBuf>,
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
    /// A DNS query from a pod, as a stub resolver sends it (UDP, then TCP if the answer is
    /// truncated) to `--server`: its answer code and records. A pod whose workload says
    /// `dns_capture` has it answered by its node proxy for mesh names.
    Dig {
        pod: String,
        name: String,
        /// The record type: A, AAAA, SRV, PTR, ...
        #[arg(long = "type", default_value = "A")]
        record_type: String,
        /// Where the pod sends it (`IP` or `IP:PORT`).
        #[arg(long, value_parser = ferry_core::dns::server_address)]
        server: SocketAddr,
        /// Over TCP from the start.
        #[arg(long)]
        tcp: bool,
        /// Ask this many times, one after another, and print the round trips' percentiles.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        count: u32,
        #[command(flatten)]
        lab: LabArgs,
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
    /// One gRPC call from a pod to IP:port: `grpc.health.v1.Health/Check` of SERVICE (every lab
    /// pod serves it on 50051 and knows `ferry.lab.Echo`); prints the status and the metadata
    /// (headers and trailers) that came back. Exit code 0 for OK, 1 for another status.
    Grpc {
        pod: String,
        to: SocketAddr,
        #[arg(default_value = "ferry.lab.Echo")]
        service: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Make N new connections from a pod to IP:port, one after another, and print how many each
    /// pod answered and how many failed (where graduated failover spills, for instance).
    Count {
        pod: String,
        to: SocketAddr,
        #[arg(long, short, default_value_t = 100)]
        n: u32,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Measure A -> B through Ferry against A -> B direct (no proxy at either end), measure by
    /// measure in the same run, each with both node proxies' CPU per unit of work; and, first,
    /// node proxy memory idle and with many idle proxied connections.
    Bench {
        #[arg(long, default_value = "sleep")]
        from: String,
        #[arg(long, default_value = "echo-alpha-2")]
        to: String,
        /// MiB written to the sink on one connection.
        #[arg(long, default_value_t = 256)]
        bulk_mib: usize,
        /// Round trips at each size (64 B and 1 KiB).
        #[arg(long, default_value_t = 2000)]
        round_trips: usize,
        /// New connections, one after another.
        #[arg(long, default_value_t = 300)]
        conns: usize,
        /// Then as many again from this many client threads at once (1: not).
        #[arg(long, default_value_t = 4)]
        conn_threads: usize,
        /// Idle proxied connections to hold while measuring node proxy memory (0: none).
        #[arg(long, default_value_t = 1000)]
        idle: usize,
        /// The arms to measure, in order.
        #[arg(long, value_delimiter = ',', default_value = "direct,ferry")]
        arms: Vec<bench::client::Arm>,
        /// Pin the client, both node proxies and the server app to one CPU (default 0) for the
        /// round trips; their affinity is given back after.
        #[arg(long, num_args = 0..=1, default_missing_value = "0")]
        pinned: Option<usize>,
        /// Write every figure (units in the key names), the commit and the topology as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// The node proxies' CPU per unit of work in `bench --json` reports (the median of each
    /// figure over them) against a baseline report: exits 1 if a figure is more than the margin
    /// above the baseline's. Needs no lab.
    BenchGate {
        /// The committed baseline (a `bench --json` report of the same build profile).
        #[arg(long)]
        baseline: PathBuf,
        /// The reports to judge.
        #[arg(required = true)]
        reports: Vec<PathBuf>,
        /// How much worse than the baseline a figure may be (0.25: 25%).
        #[arg(long, default_value_t = 0.25)]
        margin: f64,
        /// Write the reports' medians as the baseline instead of judging them.
        #[arg(long)]
        write: bool,
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
    Craft(craft::Request),
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
        /// Read memory again this many seconds after the connections closed (0: not).
        #[arg(long, default_value_t = 60)]
        settle_seconds: u64,
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
    /// (inside the lab) the benchmark client: one measure of one arm, printed as JSON.
    #[command(hide = true)]
    BenchClient {
        #[arg(long)]
        target: std::net::IpAddr,
        #[arg(long)]
        arm: bench::client::Arm,
        #[arg(long)]
        measure: bench::client::Measure,
        /// MiB (bulk), round trips (rr) or connections (conns).
        #[arg(long)]
        count: usize,
        /// Bytes per round trip (rr).
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Client threads (conns).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long)]
        pin_cpu: Option<usize>,
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
        /// With `--until-closed`: send a line every this many ms, wait for its echo and print
        /// `ping <k>`, so the connection is seen to work until it closes.
        #[arg(long)]
        ping_ms: Option<u64>,
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
        /// New connections per second at most (default: one after another).
        #[arg(long)]
        rate: Option<u32>,
        /// Print `ok <pod>` for each connection (who answered).
        #[arg(long)]
        each: bool,
    },
    /// A rolling restart of a service's replicas, one at a time (terminating, stopped, started,
    /// ready), while a client pod makes new connections to its VIP at a steady rate. Prints the
    /// connections per replica and `failed=N`; exits 1 if any failed.
    Rollout {
        service: String,
        /// The client pod.
        #[arg(long, default_value = "sleep")]
        from: String,
        /// New connections per second.
        #[arg(long, default_value_t = 50)]
        rate: u32,
        /// How the restarts are spread: one every `seconds / (replicas + 1)`; the client runs until
        /// one such slot after the last restart is done (longer when a restart takes longer).
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Restart one node proxy; its node agent replays the node's pods to the new process.
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
    /// Start a stopped node proxy; it serves its enrolled pods again from its node agent's
    /// replay.
    StartNode {
        node: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Enroll a pod with its node's agent again, as a container runtime's CNI ADD does for a
    /// new sandbox: served in the same network namespace, nothing changes; in a new one (its
    /// namespace created again), the node proxy serves the new one.
    Enroll {
        pod: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Mark a pod terminating in the lab's topology (the control plane watches it): no new
    /// connections go to it, its open ones keep flowing. `--undo` clears the mark.
    Terminate {
        pod: String,
        #[arg(long)]
        undo: bool,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// A pod crashes and fails its readiness probe: it is marked `healthy: false` in the lab's
    /// topology, and once every node proxy applied that, its app is stopped. `revive` undoes it.
    Kill {
        pod: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Start a killed pod's app again and, once it answers, clear its `healthy: false` (and
    /// wait until every node proxy applied that).
    Revive {
        pod: String,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// (inside the lab) recorded Kubernetes objects served over the API's list/watch
    /// protocol, one API server per --serve ADDR=FILE (for `up --kubernetes`).
    #[command(hide = true)]
    ApiServer {
        #[arg(long = "serve", value_name = "ADDR=FILE", required = true)]
        serve: Vec<String>,
    },
    /// (inside the lab) the echo app a pod runs.
    #[command(hide = true)]
    Echo {
        #[arg(long)]
        name: String,
        #[arg(long, value_delimiter = ',')]
        ports: Vec<u16>,
    },
    /// (inside the lab) N connections one after another; prints the answers counted by pod.
    #[command(hide = true)]
    Tally {
        to: SocketAddr,
        #[arg(long)]
        n: u32,
    },
    /// (inside the lab) one gRPC health check; prints its status and metadata.
    #[command(hide = true)]
    GrpcCheck { to: SocketAddr, service: String },
    /// (inside the lab) one DNS query as a stub resolver sends it; prints its answer.
    #[command(hide = true)]
    DnsQuery {
        name: String,
        #[arg(long = "type", default_value = "A")]
        record_type: String,
        #[arg(long)]
        server: SocketAddr,
        #[arg(long)]
        tcp: bool,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// (inside the lab) the upstream resolver of DNS-captured pods: serves `outside.test`.
    #[command(hide = true)]
    DnsUpstream {
        #[arg(long, default_value = "0.0.0.0:53")]
        listen: SocketAddr,
    },
    /// (inside the lab) connect, send, print the answer.
    #[command(hide = true)]
    Connect {
        to: SocketAddr,
        #[arg(long, default_value = "hello\n")]
        data: String,
        /// Print `local <addr>` on stderr once connected (`ferry trace` finds its record by it).
        #[arg(long)]
        local: bool,
    },
}

/// Runs one `ferry lab` subcommand; an error is printed as `ferry lab: <error>`, exit code 2.
pub fn run(cmd: LabCommand) -> ExitCode {
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
            hop_args,
            kubernetes,
            lab,
        } => done(session::up(lab, topology, node_args, hop_args, kubernetes)),
        LabCommand::Down { lab } => done(session::down(&lab.state_dir)),
        LabCommand::Status { lab } => done(session::status(&lab.state_dir)),
        LabCommand::Exec { pod, lab, command } => session::exec(&lab.state_dir, &pod, &command),
        LabCommand::Send { pod, to, data, lab } => session::send(&lab.state_dir, &pod, to, &data),
        LabCommand::Dig {
            pod,
            name,
            record_type,
            server,
            tcp,
            count,
            lab,
        } => crate::dns::dig(
            &lab.state_dir,
            &pod,
            &crate::dns::Ask {
                name,
                record_type,
                server,
                tcp,
                count,
            },
        ),
        LabCommand::DnsQuery {
            name,
            record_type,
            server,
            tcp,
            count,
        } => crate::dns::query(&crate::dns::Ask {
            name,
            record_type,
            server,
            tcp,
            count,
        }),
        LabCommand::DnsUpstream { listen } => crate::dns::upstream(listen),
        LabCommand::Connect { to, data, local } => session::connect(to, &data, local),
        LabCommand::Count { pod, to, n, lab } => session::count(&lab.state_dir, &pod, to, n),
        LabCommand::Grpc {
            pod,
            to,
            service,
            lab,
        } => session::grpc(&lab.state_dir, &pod, to, &service),
        LabCommand::GrpcCheck { to, service } => {
            crate::grpc::check(&crate::apps::runtime()?, to, &service)
        }
        LabCommand::Tally { to, n } => done(session::tally(to, n)),
        LabCommand::Bench {
            from,
            to,
            bulk_mib,
            round_trips,
            conns,
            conn_threads,
            idle,
            arms,
            pinned,
            json,
            lab,
        } => done(bench::run(
            &lab.state_dir,
            &from,
            &to,
            &bench::Options {
                sizes: bench::Sizes {
                    bulk_mib,
                    round_trips,
                    conns,
                    conn_threads,
                    idle,
                },
                arms,
                pinned,
                json,
            },
        )),
        LabCommand::BenchClient {
            target,
            arm,
            measure,
            count,
            size,
            threads,
            pin_cpu,
        } => done(bench::client::run(
            target,
            bench::client::Job {
                arm,
                measure,
                count,
                size,
                threads,
                pin_cpu,
            },
        )),
        LabCommand::BenchGate {
            baseline,
            reports,
            margin,
            write,
        } => bench::gate::run(&baseline, &reports, margin, write),
        LabCommand::BenchPaths {
            from,
            near,
            far,
            bulk_mib,
            round_trips,
            lab,
        } => bench::paths::run(&lab.state_dir, &from, near, far, bulk_mib, round_trips),
        LabCommand::PathsClient {
            near,
            far,
            bulk_mib,
            round_trips,
        } => done(bench::paths::client(near, far, bulk_mib, round_trips)),
        LabCommand::BenchHandover {
            from,
            to,
            node,
            streams,
            lab,
        } => done(bench::handover::run(
            &lab.state_dir,
            &from,
            &to,
            node,
            streams,
        )),
        LabCommand::Streams { to, n, max_seconds } => {
            done(apps::streams(to, n, Duration::from_secs(max_seconds)))
        }
        LabCommand::Churn {
            to,
            until_file,
            max_seconds,
            rate,
            each,
        } => done(bench::handover::churn(
            to,
            &until_file,
            Duration::from_secs(max_seconds),
            apps::Pace { rate, each },
        )),
        LabCommand::Rollout {
            service,
            from,
            rate,
            seconds,
            lab,
        } => rollout::run(
            &lab.state_dir,
            &rollout::Plan {
                service: &service,
                from: &from,
                rate,
                seconds,
            },
        ),
        LabCommand::BenchMemory {
            from,
            to,
            counts,
            settle_seconds,
            lab,
        } => done(bench::memory::run(
            &lab.state_dir,
            &from,
            &to,
            &counts,
            std::time::Duration::from_secs(settle_seconds),
        )),
        LabCommand::BenchHttp {
            from,
            l4,
            waypoint,
            requests,
            lab,
        } => done(bench::http::run(
            &lab.state_dir,
            &from,
            l4,
            waypoint,
            requests,
        )),
        LabCommand::HttpBenchClient {
            l4,
            waypoint,
            requests,
        } => done(bench::http::client(l4, waypoint, requests)),
        LabCommand::Craft(req) => done(craft::run(req)),
        LabCommand::Hold {
            to,
            n,
            until_closed,
            upgrade,
            ping_ms,
        } => done(apps::hold(
            to,
            n,
            until_closed,
            upgrade,
            ping_ms.map(Duration::from_millis),
        )),
        LabCommand::HalfClose { to, n, max_seconds } => {
            done(apps::half_close(to, n, Duration::from_secs(max_seconds)))
        }
        LabCommand::Echo { name, ports } => done(apps::echo(&name, &ports)),
        LabCommand::ApiServer { serve } => done(crate::api_server::run(&serve)),
        LabCommand::Handover { node, lab } => {
            ops::handover(&lab.state_dir, &node)?;
            println!("ferry lab: node {node} handed over to a new node proxy");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::RestartNode { node, kill, lab } => {
            ops::restart_node(&lab.state_dir, &node, kill)?;
            println!("ferry lab: node {node} restarted; it serves its pods again");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::StopNode { node, kill, lab } => {
            ops::stop_node(&lab.state_dir, &node, kill)?;
            println!("ferry lab: node {node} stopped; its pods stay captured");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Terminate { pod, undo, lab } => {
            let changed = pods::mark(&lab.state_dir, &pod, pods::Mark::Terminating, !undo)?;
            let now = if undo {
                "no longer terminating"
            } else {
                "terminating"
            };
            let how = if changed { "marked" } else { "already" };
            println!("ferry lab: pod {pod} {how} {now} in the topology");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Kill { pod, lab } => done(pods::kill(&lab.state_dir, &pod)),
        LabCommand::Revive { pod, lab } => done(pods::revive(&lab.state_dir, &pod)),
        LabCommand::StartNode { node, lab } => {
            ops::start_node(&lab.state_dir, &node)?;
            println!("ferry lab: node {node} started; it serves its pods again");
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Enroll { pod, lab } => {
            let state = crate::state::State::up(&lab.state_dir)?;
            if !state.pods.get(&pod).is_some_and(|p| p.enrolled) {
                anyhow::bail!("{pod} is not one of the lab's enrolled pods");
            }
            crate::agent::enroll(&state, &pod)?;
            println!("ferry lab: pod {pod} enrolled with its node agent");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A subcommand that succeeded exits 0.
fn done(r: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    r.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Lab {
        #[command(subcommand)]
        cmd: LabCommand,
    }

    #[test]
    fn the_arguments_are_consistent() {
        Lab::command().debug_assert();
    }

    #[test]
    fn grpc_checks_the_lab_service_unless_told_another() {
        let parse = |args: &[&str]| match Lab::try_parse_from(args).expect("parses").cmd {
            LabCommand::Grpc {
                pod, to, service, ..
            } => (pod, to.to_string(), service),
            other => panic!("parsed as {other:?}"),
        };
        assert_eq!(
            parse(&["lab", "grpc", "echo-beta", "198.18.10.5:82"]),
            (
                "echo-beta".into(),
                "198.18.10.5:82".into(),
                "ferry.lab.Echo".into()
            )
        );
        assert_eq!(
            parse(&["lab", "grpc", "echo-beta", "198.18.10.5:82", "no.Such"]).2,
            "no.Such"
        );
        assert!(Lab::try_parse_from(["lab", "grpc", "echo-beta", "not-an-address"]).is_err());
    }

    #[test]
    fn send_takes_the_lab_flags_and_defaults() {
        let lab = Lab::try_parse_from(["lab", "send", "sleep", "198.18.10.1:80", "--id", "fW"])
            .expect("parses");
        match lab.cmd {
            LabCommand::Send { pod, to, data, lab } => {
                assert_eq!(pod, "sleep");
                assert_eq!(to.to_string(), "198.18.10.1:80");
                assert_eq!(data, "hello\n");
                assert_eq!(lab.id, "fW");
                assert_eq!(lab.state_dir, PathBuf::from("/run/ferry-lab"));
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn rollout_defaults_to_50_connections_a_second_for_30_s_from_sleep() {
        let lab = Lab::try_parse_from(["lab", "rollout", "web"]).expect("parses");
        match lab.cmd {
            LabCommand::Rollout {
                service,
                from,
                rate,
                seconds,
                ..
            } => {
                assert_eq!((service.as_str(), from.as_str()), ("web", "sleep"));
                assert_eq!((rate, seconds), (50, 30));
            }
            other => panic!("parsed as {other:?}"),
        }
        let lab = Lab::try_parse_from(["lab", "rollout", "web", "--rate", "30", "--seconds", "6"])
            .expect("parses");
        assert!(matches!(
            lab.cmd,
            LabCommand::Rollout {
                rate: 30,
                seconds: 6,
                ..
            }
        ));
    }

    #[test]
    fn bench_defaults_are_small_and_pinned_takes_an_optional_cpu() {
        let lab = Lab::try_parse_from(["lab", "bench"]).expect("parses");
        match lab.cmd {
            LabCommand::Bench {
                bulk_mib,
                round_trips,
                conns,
                idle,
                arms,
                pinned,
                json,
                ..
            } => {
                assert_eq!((bulk_mib, round_trips, conns, idle), (256, 2000, 300, 1000));
                assert_eq!(
                    arms,
                    [bench::client::Arm::Direct, bench::client::Arm::Ferry]
                );
                assert_eq!((pinned, json), (None, None));
            }
            other => panic!("parsed as {other:?}"),
        }
        let pinned = |args: &[&str]| match Lab::try_parse_from(args).expect("parses").cmd {
            LabCommand::Bench { pinned, arms, .. } => (pinned, arms),
            other => panic!("parsed as {other:?}"),
        };
        assert_eq!(pinned(&["lab", "bench", "--pinned"]).0, Some(0));
        assert_eq!(pinned(&["lab", "bench", "--pinned", "1"]).0, Some(1));
        assert_eq!(
            pinned(&["lab", "bench", "--arms", "ferry", "--pinned"]),
            (Some(0), vec![bench::client::Arm::Ferry])
        );
    }
}
