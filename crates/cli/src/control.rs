//! `ferry control`: the arguments; the control plane itself is `ferry_control::app`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use ferry_control::app::{Config, Listening, ServeLimits, Source};
use ferry_control::ca::k8s::{K8sConfig, ServiceAccount};
use ferry_control::kube_source::KubeSource;
use ferry_control::source::WatchConfig;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ControlCommand {
    /// Serve the CA and xDS (gRPC over TLS) for the mesh a topology file or Kubernetes
    /// clusters describe.
    Serve(Box<ServeArgs>),
    /// Print the bootstrap credential of a node (give it to that node's proxy only).
    Token {
        #[arg(long, default_value = "ferry-state")]
        state_dir: PathBuf,
        #[arg(long)]
        node: String,
    },
    /// Print the trust bundle (PEM) node proxies verify peers and the control plane against.
    Bundle {
        #[arg(long, default_value = "ferry-state")]
        state_dir: PathBuf,
        #[arg(long, default_value = "cluster.local")]
        trust_domain: String,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Topology file: the mesh's source of truth (or the Kubernetes clusters: --cluster-id).
    #[arg(
        long,
        short,
        required_unless_present = "cluster_id",
        conflicts_with = "cluster_id"
    )]
    topology: Option<PathBuf>,
    /// Read the mesh from Kubernetes: this cluster's ID (Istio's CLUSTER_ID). Its API server is
    /// found through --kubeconfig, else KUBECONFIG, ~/.kube/config or the pod's service account.
    #[arg(long, env = "CLUSTER_ID")]
    cluster_id: Option<String>,
    /// A kubeconfig for the local cluster.
    #[arg(long, requires = "cluster_id")]
    kubeconfig: Option<PathBuf>,
    /// The local cluster's network (default: its istio-system namespace's
    /// topology.istio.io/network label, else the cluster ID).
    #[arg(long, requires = "cluster_id")]
    network: Option<String>,
    /// A remote cluster's Istio remote secret (`istioctl create-remote-secret` output), one file
    /// per secret. Repeatable.
    #[arg(long, requires = "cluster_id")]
    remote_secret: Vec<PathBuf>,
    /// Watch the Istio remote secrets (Secrets labelled istio/multiCluster: "true") of this
    /// namespace of the local cluster: a Secret added reads its clusters, a changed one
    /// reconnects, a deleted one removes them. Needs get, list and watch on Secrets there.
    #[arg(long, requires = "cluster_id")]
    remote_secrets_namespace: Option<String>,
    /// Several replicas: only the holder of this coordination.k8s.io/v1 Lease of the local
    /// cluster (NAMESPACE/NAME, created if missing) writes to the clusters (ServiceImports,
    /// ServiceExport status); every replica watches and serves. Needs get, create and update on
    /// leases there. Without it this control plane writes as if it were the only one.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "cluster_id")]
    lease: Option<String>,
    /// This replica's name in the Lease, unique among the replicas (default: the host name and
    /// the process ID).
    #[arg(long, env = "POD_NAME")]
    lease_identity: Option<String>,
    /// How long a holder's claim lasts: another replica takes the Lease once it saw no renewal
    /// for this long. The holder renews every sixth of it and stops writing after two thirds of
    /// it without a renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// The scope of a Kubernetes service that declares none (ferry.dev/scope or
    /// istio.io/global): local or global.
    #[arg(long, default_value = "local", value_parser = ["local", "global"])]
    default_scope: String,
    /// The trust domain of workload identities read from Kubernetes.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// Where the CA root, its key and the node-token secret live (created on first start).
    #[arg(long, default_value = "ferry-state")]
    state_dir: PathBuf,
    /// Address to serve on (port 0 picks one; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:15012")]
    listen: SocketAddr,
    /// Use this CA certificate and key instead of the state directory's own root.
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// Extra roots (PEM) to keep trusting, e.g. the previous root during a rotation.
    #[arg(long)]
    extra_roots: Option<PathBuf>,
    /// Longest certificate lifetime granted, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    max_lifetime: u64,
    /// Where to serve Prometheus metrics (xDS pushes, ACKs, NACKs, refused streams).
    #[arg(long, default_value = "127.0.0.1:15014")]
    metrics_listen: SocketAddr,
    /// LOCAL EXPERIMENTS ONLY: serve without TLS, and xDS without node authentication.
    #[arg(long)]
    plaintext: bool,
    /// Largest topology file read, in bytes; a larger edit is rejected before it is parsed.
    #[arg(long, default_value_t = ferry_topology::Limits::DEFAULT_MAX_BYTES)]
    topology_max_bytes: usize,
    /// Deepest nesting of the topology file (flow collections `[`, `{` and indented blocks
    /// together), checked in one linear pass before the YAML parser runs; real files nest 6-8.
    #[arg(long, default_value_t = ferry_topology::Limits::DEFAULT_MAX_DEPTH)]
    topology_max_depth: usize,
    /// Longest a topology edit may take to read and parse, in seconds, before it is rejected
    /// (parsing runs off the serving threads; the last good state keeps being served).
    #[arg(long, default_value_t = 30)]
    topology_parse_budget: u64,
    /// Concurrent HTTP/2 streams one connection may have open (CA requests and xDS streams);
    /// a client queues the rest.
    #[arg(long, default_value_t = ServeLimits::default().streams_per_connection)]
    max_streams_per_connection: u32,
    /// Connections one peer IP may have open; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = ServeLimits::default().connections_per_peer)]
    max_connections_per_peer: usize,
    /// The least time between two xDS pushes of changes to one node, in milliseconds: edits
    /// within it reach the node as one push (the latest state), and a node that reads slowly
    /// is sent the latest state when it catches up, never each version in between. A change
    /// after a quiet interval is pushed at once.
    #[arg(long, default_value_t = ServeLimits::default().push_interval.as_millis() as u64)]
    xds_push_interval_ms: u64,
    /// Accept Kubernetes service-account tokens of cluster CLUSTER, issued by URL (the API
    /// server's `--service-account-issuer`), as node credentials; its keys come from
    /// `URL/.well-known/openid-configuration` unless --k8s-jwks says otherwise. Repeatable.
    #[arg(long, value_name = "CLUSTER=URL")]
    k8s_issuer: Vec<String>,
    /// Read cluster CLUSTER's token keys from this JWKS file (e.g. `kubectl get --raw
    /// /openid/v1/jwks`) or http(s) URL instead of OIDC discovery. Repeatable.
    #[arg(long, value_name = "CLUSTER=FILE|URL")]
    k8s_jwks: Vec<String>,
    /// Verify cluster CLUSTER's https key source against these roots (PEM) instead of the
    /// system's. Repeatable.
    #[arg(long, value_name = "CLUSTER=FILE")]
    k8s_ca: Vec<String>,
    /// An audience a service-account token must carry (Istio's node proxy asks for istio-ca).
    #[arg(long, default_value = ferry_control::ca::k8s::config::DEFAULT_AUDIENCE)]
    k8s_audience: Vec<String>,
    /// A service account node proxies run as (NAMESPACE/NAME); only its tokens act for a node.
    #[arg(long, default_value = "istio-system/ztunnel")]
    k8s_node_proxy_account: Vec<ServiceAccount>,
    /// Another name for the serving certificate, besides `ferry-control` (e.g.
    /// `istiod.istio-system.svc` where Istio's node proxies expect istiod). Repeatable.
    #[arg(long)]
    server_name: Vec<String>,
    /// Also serve the mesh map on this address (default 127.0.0.1:15300): the page `ferry ui
    /// --lab` serves, drawn from this control plane's current mesh, explaining on it, with the
    /// connection records of every node proxy, waypoint and gateway connected over xDS (read
    /// from the admin address each gives in its node metadata). Loopback only unless
    /// --ui-allow-remote.
    #[arg(long, value_name = "IP:PORT", num_args = 0..=1, default_missing_value = "127.0.0.1:15300")]
    ui: Option<SocketAddr>,
    /// Let --ui listen on an address other than loopback. The map has no authentication:
    /// whoever reaches it reads the mesh and its connections.
    #[arg(long, requires = "ui")]
    ui_allow_remote: bool,
}

pub(crate) fn run(cmd: ControlCommand) -> ExitCode {
    let result = match cmd {
        ControlCommand::Serve(args) => serve(*args),
        ControlCommand::Token { state_dir, node } => {
            // No newline: the token is a header value as written, and a file made with `>`
            // must hold nothing else (Istio's node proxy sends a token file verbatim).
            ferry_control::app::node_token(&state_dir, &node).map(|t| print!("{t}"))
        }
        ControlCommand::Bundle {
            state_dir,
            trust_domain,
        } => ferry_control::app::bundle(&state_dir, &trust_domain).map(|pem| print!("{pem}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry control: {e:#}");
            ExitCode::from(2)
        }
    }
}

// === impl ServeArgs ===

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<Config> {
        let issuers = K8sConfig::from_args(&self.k8s_issuer, &self.k8s_jwks, &self.k8s_ca)
            .map_err(|e| anyhow!(e))?;
        let lease = self
            .lease
            .as_deref()
            .map(|l| {
                let (ns, name) = l
                    .split_once('/')
                    .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
                    .ok_or_else(|| anyhow!("--lease {l:?}: expected NAMESPACE/NAME"))?;
                let identity = self.lease_identity.clone().unwrap_or_else(default_identity);
                let lease = ferry_k8s::lease::LeaseConfig::new(
                    ns,
                    name,
                    identity,
                    Duration::from_secs(self.lease_duration_seconds),
                );
                lease
                    .check()
                    .map_err(|e| anyhow!("--lease-duration-seconds: {e}"))?;
                Ok::<_, anyhow::Error>(lease)
            })
            .transpose()?;
        let source = match (self.topology, self.cluster_id) {
            (Some(path), _) => Source::File(path),
            (None, Some(cluster_id)) => Source::Kubernetes(Box::new(KubeSource {
                cluster_id,
                network: self.network,
                kubeconfig: self.kubeconfig,
                remote_secrets: self.remote_secret,
                remote_secrets_namespace: self.remote_secrets_namespace,
                mesh: ferry_k8s::MeshConfig {
                    trust_domain: self.trust_domain,
                    default_scope: if self.default_scope == "global" {
                        ferry_k8s::Scope::Global
                    } else {
                        ferry_k8s::Scope::Local
                    },
                    ..ferry_k8s::MeshConfig::default()
                },
                lease,
                initial_sync: Duration::from_secs(30),
            })),
            (None, None) => return Err(anyhow!("expected --topology or --cluster-id")),
        };
        Ok(Config {
            source,
            state_dir: self.state_dir,
            listen: self.listen,
            ca: self.ca_cert.zip(self.ca_key),
            extra_roots: self.extra_roots,
            max_lifetime: Duration::from_secs(self.max_lifetime),
            metrics_listen: self.metrics_listen,
            plaintext: self.plaintext,
            watch: WatchConfig {
                limits: ferry_topology::Limits {
                    max_bytes: self.topology_max_bytes,
                    max_depth: self.topology_max_depth,
                },
                budget: Duration::from_secs(self.topology_parse_budget),
                ..WatchConfig::default()
            },
            limits: ServeLimits {
                streams_per_connection: self.max_streams_per_connection,
                connections_per_peer: self.max_connections_per_peer,
                push_interval: Duration::from_millis(self.xds_push_interval_ms),
            },
            k8s: K8sConfig {
                issuers,
                audiences: self.k8s_audience,
                node_proxy_accounts: self.k8s_node_proxy_account,
                ..K8sConfig::default()
            },
            server_names: self.server_name,
        })
    }
}

/// A replica's name in the Lease when none is given: the host name and the process ID.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{host}_{}", std::process::id())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Bound before anything starts: a bad --ui address is an error at once.
    let ui = args
        .ui
        .map(|addr| crate::ui::bind(addr, args.ui_allow_remote))
        .transpose()
        .map_err(|e| anyhow!("--ui {e:#} (--ui-allow-remote lets it listen elsewhere)"))?;
    let config = args.into_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(ferry_control::app::serve_live(
        &config,
        |listening, live| {
            announce(listening);
            if let Some(listener) = ui {
                serve_ui(listener, live);
            }
        },
        ferry_runtime::shutdown_signal(),
    ))
}

/// Serves the mesh map of `live` on `listener`, on this runtime.
fn serve_ui(listener: std::net::TcpListener, live: ferry_control::app::Live) {
    match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => {
            if let Ok(addr) = listener.local_addr() {
                println!("ferry control: serving the mesh map on http://{addr}/");
                let _ = std::io::stdout().flush();
            }
            tokio::spawn(crate::ui::serve(listener, crate::ui::Source::Control(live)));
        }
        Err(e) => eprintln!("ferry control: the mesh map cannot be served: {e}"),
    }
}

/// What a user (and the tests and the lab, which read the address from it) sees on start.
fn announce(listening: &Listening) {
    if listening.plaintext {
        eprintln!(
            "ferry control: WARNING: --plaintext: no TLS; xDS is served without node authentication. \
             Anyone who can reach this port can read the mesh's configuration, and node credentials \
             travel in clear. Use only for local experiments."
        );
    }
    println!("ferry control: {listening}");
    let _ = std::io::stdout().flush();
}
