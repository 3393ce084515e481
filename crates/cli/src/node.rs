//! `ferry node`: run the node proxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ferry_runtime::bootstrap::ControlPlane;

/// Waypoints and gateways always talk to the control plane over TLS.
const PLAINTEXT_NEVER: bool = false;

#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// This node's name, as in the topology (Istio's `NODE_NAME`).
    #[arg(long, env = "NODE_NAME")]
    name: String,
    /// This node's cluster (Istio's `CLUSTER_ID`).
    #[arg(long, env = "CLUSTER_ID")]
    cluster: String,
    #[command(flatten)]
    control: ControlArgs,
    /// Admin endpoint: /ready, /config_dump, /certs, /metrics.
    #[arg(long, default_value = "127.0.0.1:15000")]
    admin: SocketAddr,
    /// Also serve the metrics as /stats/prometheus here, and nothing else (Istio's chart
    /// scrapes `[::]:15020`).
    #[arg(long)]
    stats: Option<SocketAddr>,
    /// Also serve the readiness as /healthz/ready here, and nothing else (Istio's chart probes
    /// `[::]:15021`).
    #[arg(long)]
    readiness: Option<SocketAddr>,
    /// Seconds in-flight connections may finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    /// Runtime worker threads that carry the connections (ztunnel's default is 2 too).
    #[arg(long, default_value_t = WORKERS, value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: u16,
    /// Seconds after which a half-closed connection that moves no bytes is ended, and within
    /// which an app peer that vanished is noticed (TCP keepalive, user timeout).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_bound_seconds: u64,
    /// Outlier detection: connects to one endpoint that fail this many times in a row (refused,
    /// reset, timed out, a failed handshake, HBONE 502/503/504) eject it from picks; 0 turns it
    /// off.
    #[arg(long, default_value_t = 5)]
    outlier_consecutive_failures: u32,
    /// Outlier detection: the first ejection's seconds; the k-th lasts k times this.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    outlier_base_ejection_seconds: u64,
    /// Outlier detection: no ejection lasts longer than this many seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    outlier_max_ejection_seconds: u64,
    /// Outlier detection: at most this percent of a service's endpoints is ejected at once.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    outlier_max_ejected_percent: u8,
    /// Where the served pods are kept (0600): a node proxy restarted while its node agent is
    /// away serves them again until the agent replays (its replay decides). Each pod is kept
    /// by the path its namespace is mounted at under /var/run/netns, with the namespace's inode:
    /// one created again under that name is not taken for it.
    #[arg(long, default_value = "/run/ferry/node.pods")]
    state_file: PathBuf,
    /// The node agent's ZDS socket (Istio's `istio.workload.zds`): connect to it and serve the
    /// pods it hands over with their network namespaces (Istio's `INPOD_UDS`; Istio's CNI agent
    /// listens on `/var/run/ztunnel/ztunnel.sock`). It is how pods are enrolled; without it,
    /// only the pods of the state file are served.
    #[arg(long, env = "INPOD_UDS")]
    zds_socket: Option<PathBuf>,
    /// The upstream resolver of DNS-captured pods (`dns_capture`): their queries for names
    /// outside the mesh go there as they are, from inside the pod's namespace. Default: the
    /// first nameserver of this node's /etc/resolv.conf.
    #[arg(long, value_parser = ferry_core::dns::server_address)]
    dns_upstream: Option<SocketAddr>,
    /// LOCAL EXPERIMENTS ONLY: talk to the control plane without TLS.
    #[arg(long)]
    plaintext: bool,
    #[command(flatten)]
    records: RecordsArgs,
}

/// How every data-plane process reaches the control plane. Each option falls back to the
/// environment variable Istio's node-proxy chart sets, so the chart can run Ferry's image; a
/// flag wins over its variable.
#[derive(Debug, clap::Args)]
struct ControlArgs {
    /// The control plane's xDS, `https://host:port` (Istio's `XDS_ADDRESS`); also its CA unless
    /// --ca-address says otherwise. Without a scheme, `https://` is meant.
    #[arg(long, env = "XDS_ADDRESS", visible_alias = "xds-address")]
    control: String,
    /// The CA, when it is not at --control (Istio's `CA_ADDRESS`).
    #[arg(long, env = "CA_ADDRESS")]
    ca_address: Option<String>,
    /// File holding the credential: a Ferry node token (`ferry control token --node NAME`: a
    /// node's own; a waypoint uses its node's, a gateway `gateway.<name>`) or a Kubernetes
    /// service-account token (audience `istio-ca`), where Istio's chart mounts it.
    #[arg(long, default_value = "/var/run/secrets/tokens/istio-token")]
    token_file: PathBuf,
    /// File holding the trust bundle (`ferry control bundle`) the control plane's certificate
    /// is verified against (Istio's `XDS_ROOT_CA`).
    #[arg(
        long,
        env = "XDS_ROOT_CA",
        default_value = "/var/run/secrets/istio/root-cert.pem"
    )]
    bundle_file: PathBuf,
    /// Roots for the CA's certificate, when not --bundle-file (Istio's `CA_ROOT_CA`).
    #[arg(long, env = "CA_ROOT_CA")]
    ca_bundle_file: Option<PathBuf>,
    /// The name the xDS server's certificate must carry. Default: `istiod.<ns>.svc` when the
    /// address's host is an istiod service, else `ferry-control`.
    #[arg(long)]
    xds_server_name: Option<String>,
    /// The name the CA's certificate must carry; the same default, by the CA's address.
    #[arg(long)]
    ca_server_name: Option<String>,
}

impl ControlArgs {
    /// The control plane, with the credential and the trust bundles read from their files.
    fn read(&self, plaintext: bool) -> anyhow::Result<ControlPlane> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let mut cp = ControlPlane::new(
            with_scheme(&self.control, plaintext),
            read(&self.token_file)?.trim().to_string(),
            read(&self.bundle_file)?,
            plaintext,
        );
        cp.token_file = Some(self.token_file.clone());
        if let Some(ca) = &self.ca_address {
            let ca = with_scheme(ca, plaintext);
            cp.ca_server_name = ferry_runtime::bootstrap::server_name_for(&ca);
            cp.ca_endpoint = Some(ca);
        }
        if let Some(p) = &self.ca_bundle_file {
            cp.ca_bundle_pem = Some(read(p)?);
        }
        if let Some(n) = &self.xds_server_name {
            cp.xds_server_name.clone_from(n);
        }
        if let Some(n) = &self.ca_server_name {
            cp.ca_server_name.clone_from(n);
        }
        Ok(cp)
    }
}

/// `address` with a scheme: Istio's chart gives `istiod.istio-system.svc:15012`.
fn with_scheme(address: &str, plaintext: bool) -> String {
    if address.contains("://") {
        address.to_string()
    } else if plaintext {
        format!("http://{address}")
    } else {
        format!("https://{address}")
    }
}

/// Runtime worker threads of each program, unless told otherwise.
const WORKERS: u16 = 2;

/// Runs `main` on a runtime of `workers` threads that run `on_park` as they go idle; an error
/// is printed as `ferry <what>: ...`, exit 2.
fn run_process<F>(
    what: &str,
    workers: u16,
    on_park: fn(),
    main: impl FnOnce() -> anyhow::Result<F>,
) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let result = main().and_then(|fut| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(workers))
            .on_thread_park(on_park)
            .enable_all()
            .build()?
            .block_on(fut)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry {what}: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// What a worker of the waypoint's and gateway's runtimes does as it goes idle: nothing.
fn idle_as_is() {}

pub(crate) fn run(args: &NodeArgs) -> ExitCode {
    ferry_runtime::records::configure(args.records.records);
    // After a load spike the node gives freed memory back, the workers' caches included.
    run_process(
        "node",
        args.worker_threads,
        ferry_node::on_worker_park,
        || {
            let mut control = args.control.read(args.plaintext)?;
            control.admin = Some(args.admin);
            Ok(ferry_node::run(ferry_node::Config {
                name: args.name.clone(),
                cluster: args.cluster.clone(),
                control,
                admin: args.admin,
                stats: args.stats,
                readiness: args.readiness,
                drain: Duration::from_secs(args.drain_seconds),
                idle_bound: Duration::from_secs(args.idle_bound_seconds),
                outlier: ferry_core::outlier::OutlierConfig {
                    consecutive_failures: args.outlier_consecutive_failures,
                    base_ejection: Duration::from_secs(args.outlier_base_ejection_seconds),
                    max_ejection: Duration::from_secs(args.outlier_max_ejection_seconds),
                    max_ejected_percent: args.outlier_max_ejected_percent,
                },
                state_file: Some(args.state_file.clone()),
                zds_socket: args.zds_socket.clone(),
                dns_upstream: args.dns_upstream,
            }))
        },
    )
}

/// The connection records a process keeps (`/records`, `ferry observe`).
#[derive(Debug, clap::Args)]
struct RecordsArgs {
    /// Connection records kept in memory, newest last (about 1.2 KiB each); 0 keeps none.
    #[arg(long, default_value_t = ferry_runtime::records::DEFAULT_CAPACITY)]
    records: usize,
}

#[derive(Debug, clap::Args)]
pub(crate) struct WaypointArgs {
    /// This instance's workload uid.
    #[arg(long)]
    uid: String,
    #[arg(long)]
    cluster: String,
    #[command(flatten)]
    control: ControlArgs,
    /// Where to serve HBONE, repeatable: each address gets a listener of its family alone, so
    /// `--listen 0.0.0.0:15008 --listen [::]:15008` serves both (as do the instance's IPv4 and
    /// IPv6 addresses, given one by one).
    #[arg(long, default_value = "0.0.0.0:15008")]
    listen: Vec<SocketAddr>,
    /// Listen and dial inside this network namespace (the waypoint pod's).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Admin endpoint (`/ready`, `/metrics` with request counts and durations), in the same
    /// namespace as `--listen`.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Seconds open tunnels may finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    #[command(flatten)]
    records: RecordsArgs,
}

pub(crate) fn run_waypoint(args: &WaypointArgs) -> ExitCode {
    ferry_runtime::records::configure(args.records.records);
    run_process("waypoint", WORKERS, idle_as_is, || {
        let mut control = args.control.read(PLAINTEXT_NEVER)?;
        control.admin = args.admin;
        Ok(ferry_waypoint::run(ferry_waypoint::Config {
            uid: args.uid.clone(),
            cluster: args.cluster.clone(),
            control,
            listen: args.listen.clone(),
            netns: args.netns.clone(),
            admin: args.admin,
            drain: Duration::from_secs(args.drain_seconds),
        }))
    })
}

#[derive(Debug, clap::Args)]
pub(crate) struct GatewayArgs {
    /// The gateway's name in the topology.
    #[arg(long)]
    name: String,
    #[command(flatten)]
    control: ControlArgs,
    /// Where to serve HBONE, repeatable, one family per address (`--listen 0.0.0.0:15008
    /// --listen [::]:15008` serves both).
    #[arg(long, default_value = "0.0.0.0:15008")]
    listen: Vec<SocketAddr>,
    /// Seconds open tunnels may finish after SIGTERM.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
    /// Admin endpoint (`/ready`, `/metrics` with refused tunnels and accept errors).
    #[arg(long)]
    admin: Option<SocketAddr>,
    #[command(flatten)]
    records: RecordsArgs,
}

pub(crate) fn run_gateway(args: &GatewayArgs) -> ExitCode {
    ferry_runtime::records::configure(args.records.records);
    run_process("gateway", WORKERS, idle_as_is, || {
        let mut control = args.control.read(PLAINTEXT_NEVER)?;
        control.admin = args.admin;
        Ok(ferry_gateway::run(ferry_gateway::Config {
            name: args.name.clone(),
            control,
            listen: args.listen.clone(),
            drain: Duration::from_secs(args.drain_seconds),
            admin: args.admin,
        }))
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    fn node(extra: &[&str]) -> Result<u16, clap::Error> {
        let args = [
            "ferry",
            "node",
            "--name",
            "n",
            "--cluster",
            "c",
            "--control",
            "cp:15012",
        ];
        let cli = Cli::try_parse_from(args.iter().chain(extra))?;
        match cli.command {
            Command::Node(a) => Ok(a.worker_threads),
            other => panic!("parsed as {other:?}"),
        }
    }

    /// The node proxy's runtime has two workers unless told, at least one.
    #[test]
    fn the_node_runs_two_workers_unless_told() {
        assert_eq!(node(&[]).unwrap(), 2);
        assert_eq!(node(&["--worker-threads", "1"]).unwrap(), 1);
        assert!(
            node(&["--worker-threads", "0"]).is_err(),
            "no worker at all"
        );
    }
}
