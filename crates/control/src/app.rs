//! The composition root of `ferry control serve`, and the one-shot `token` and `bundle`
//! commands. The binary parses arguments, prints, and handles signals; everything else is here.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_core::store::Store;
use ferry_xds::resources::ResourceSet;
use tokio::net::TcpListener;

use crate::admission::PeerLimited;
use crate::ca::k8s::{K8sConfig, K8sTokens};
use crate::ca::service::{CaService, Lifetimes};
use crate::ca::signer::Ca;
use crate::ca::token::NodeTokens;
use crate::nodes::Connected;
use crate::source::{Reloads, TopologyWatch, WatchConfig};
use crate::xds_server::XdsServer;

/// The name node proxies expect in the control plane's certificate.
pub const SERVER_NAME: &str = "ferry-control";

/// How long open streams (node proxies' xDS) get to end after the shutdown signal.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// Lifetime of the control plane's own serving certificate.
const SERVER_CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// The mesh's source of truth.
#[derive(Clone, Debug)]
pub enum Source {
    /// A topology file, watched for edits.
    File(PathBuf),
    /// Kubernetes clusters, watched.
    Kubernetes(Box<crate::kube_source::KubeSource>),
}

/// What `ferry control serve` runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the mesh comes from.
    pub source: Source,
    /// Where the CA root, its key and the node-token secret live (created on first start).
    pub state_dir: PathBuf,
    /// Address to serve the CA and xDS on (port 0 picks one).
    pub listen: SocketAddr,
    /// A CA certificate and key (PEM files) to use instead of the state directory's own root.
    pub ca: Option<(PathBuf, PathBuf)>,
    /// Extra roots (PEM) to keep trusting, e.g. the previous root during a rotation.
    pub extra_roots: Option<PathBuf>,
    /// Longest certificate lifetime granted (also the default).
    pub max_lifetime: Duration,
    /// Where to serve Prometheus metrics.
    pub metrics_listen: SocketAddr,
    /// LOCAL EXPERIMENTS ONLY: no TLS, and xDS without node authentication.
    pub plaintext: bool,
    /// How the topology file is read: size and nesting limits, the parse's time budget.
    pub watch: WatchConfig,
    /// What one client may open.
    pub limits: ServeLimits,
    /// Kubernetes service-account tokens accepted as node credentials (none without issuers).
    pub k8s: K8sConfig,
    /// Names the serving certificate carries besides [`SERVER_NAME`], e.g.
    /// `istiod.istio-system.svc` where the control plane stands in for istiod.
    pub server_names: Vec<String>,
}

/// What one client may open on the gRPC port (CA and xDS alike), and how often its xDS stream
/// is pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Concurrent HTTP/2 streams on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`); a
    /// client queues the rest.
    pub streams_per_connection: u32,
    /// Open connections from one peer IP; more are closed at accept.
    pub connections_per_peer: usize,
    /// The least time between two pushes of changes on one xDS stream: a burst of edits within
    /// it reaches a node as one push (`XdsServer::with_push_interval`).
    pub push_interval: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            streams_per_connection: 32,
            connections_per_peer: 16,
            push_interval: crate::xds_server::DEFAULT_PUSH_INTERVAL,
        }
    }
}

/// Where the control plane listens, once both ports are bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listening {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub plaintext: bool,
}

// === impl Listening ===

impl fmt::Display for Listening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.plaintext { "PLAINTEXT" } else { "TLS" };
        write!(
            f,
            "serving the CA and xDS on {} ({mode}, server name {SERVER_NAME}); metrics on http://{}/metrics",
            self.addr, self.metrics_addr
        )
    }
}

/// What a view of the running control plane reads: the mesh map of `ferry control serve --ui`.
#[derive(Clone, Debug)]
pub struct Live {
    /// The mesh as the source last published it (each reload swaps it).
    pub store: Arc<Store>,
    /// The programs with an open xDS stream, with their admin addresses.
    pub connected: Arc<Connected>,
}

/// Serves the CA and xDS until `shutdown` resolves. `ready` is called once both ports are bound,
/// before the first connection is accepted.
pub async fn serve(
    config: &Config,
    ready: impl FnOnce(&Listening),
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_live(config, |l, _| ready(l), shutdown).await
}

/// [`serve`], handing `ready` the live state too (called from within the runtime, so it may
/// spawn a task that reads it).
pub async fn serve_live(
    config: &Config,
    ready: impl FnOnce(&Listening, Live),
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (topology, source) = match &config.source {
        Source::File(path) => {
            // Watch first, so an edit made while the first state loads is not missed; the
            // content the load reads counts as seen (read once, and digested only when its text
            // is not kept: `First`).
            let watch = TopologyWatch::unread(path.clone(), config.watch)?;
            let (topology, first) =
                crate::source::load_kept(path, config.watch.limits, config.watch.budget).await?;
            (topology, Running::File(watch.with_kept(first)))
        }
        Source::Kubernetes(k) => {
            let (first, started) = crate::kube_source::start(k).await?;
            (first, Running::Kubernetes(started))
        }
    };
    let ca = Arc::new(load_ca(config, &topology.trust_domain)?);
    std::fs::create_dir_all(&config.state_dir)?;
    let tokens = Arc::new(
        NodeTokens::load_or_create(&config.state_dir.join("node-token.key"))
            .context("node-token secret")?,
    );
    let store = Arc::new(Store::new(topology.snapshot));
    let k8s = if config.k8s.issuers.is_empty() {
        None
    } else {
        Some(Arc::new(
            K8sTokens::new(config.k8s.clone(), store.clone())
                .context("Kubernetes token issuers")?,
        ))
    };
    let lifetimes = Lifetimes {
        default: config.max_lifetime,
        max: config.max_lifetime,
    };
    // The first set is encoded on a thread of its own while the listener comes up; xDS streams
    // wait for it (`with_first_set`), so a node only ever gets the complete first set.
    let first_snapshot = store.load();
    let encoding =
        tokio::task::spawn_blocking(move || crate::flatten::resource_set(&first_snapshot));
    let (res_tx, res_rx) = tokio::sync::watch::channel(Arc::new(ResourceSet::default()));
    let (first_tx, first_rx) = tokio::sync::watch::channel(false);

    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    let (reload_tx, _reloads) = tokio::sync::watch::channel(Reloads::default());
    let kubernetes_status = match &source {
        Running::File(_) => None,
        Running::Kubernetes(k) => Some(k.status.clone()),
    };
    let kube_metrics = crate::metrics::KubeMetrics::default();
    let is_kubernetes = matches!(source, Running::Kubernetes(_));
    let watcher = {
        let store = store.clone();
        let kube_metrics = kube_metrics.clone();
        tokio::spawn(async move {
            match encoding.await {
                Ok(set) => {
                    res_tx.send_replace(Arc::new(set));
                    let _ = first_tx.send(true);
                }
                Err(e) => {
                    tracing::error!(error = %e, "encoding the first resource set failed; serving no xDS");
                    return;
                }
            }
            // Sources start from the first set: an edit is encoded from it.
            match source {
                Running::File(watch) => watch.run(store, res_tx, reload_tx).await,
                Running::Kubernetes(k) => k.run(store, res_tx, reload_tx, kube_metrics).await,
            }
        })
    };
    let xds = XdsServer::new(res_rx, (!config.plaintext).then(|| tokens.clone()))
        .with_first_set(first_rx)
        .with_k8s(k8s.clone())
        .with_push_interval(config.limits.push_interval);
    let metrics = xds.metrics();
    let metrics_listener = TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding the metrics address {}", config.metrics_listen))?;
    let metrics_addr = metrics_listener.local_addr()?;
    let mut registry = metrics.registry();
    if is_kubernetes {
        kube_metrics.register(&mut registry);
    }
    tokio::spawn(crate::metrics::serve_with(
        metrics_listener,
        Arc::new(registry),
        kubernetes_status,
    ));
    let live = Live {
        store: store.clone(),
        connected: xds.connected(),
    };
    let ca_service = CaService::new(ca.clone(), tokens, store, lifetimes)
        .with_metrics(metrics.clone())
        .with_k8s(k8s)
        .into_server();
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(config.limits.streams_per_connection));
    if !config.plaintext {
        let ips = if addr.ip().is_unspecified() {
            vec![]
        } else {
            vec![addr.ip()]
        };
        let names: Vec<String> = std::iter::once(SERVER_NAME.to_string())
            .chain(config.server_names.iter().cloned())
            .collect();
        let (chain, key) = ca
            .issue_server_cert(&names, &ips, SERVER_CERT_LIFETIME)
            .map_err(|e| anyhow::anyhow!("control-plane certificate: {e}"))?;
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(chain, key));
        builder = builder.tls_config(tls)?;
    }
    if addr.port() == 0 {
        bail!("the kernel gave port 0");
    }
    ready(
        &Listening {
            addr,
            metrics_addr,
            plaintext: config.plaintext,
        },
        live,
    );
    let incoming = PeerLimited::new(
        listener,
        config.limits.connections_per_peer,
        metrics.connections_refused.clone(),
    );
    let (signalled_tx, signalled) = tokio::sync::oneshot::channel::<()>();
    let served = builder
        .add_service(ca_service)
        .add_service(xds.into_server())
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            // Ending the watcher drops the resources' sender: every xDS stream then ends, so
            // the graceful shutdown need not wait for node proxies to hang up.
            watcher.abort();
            let _ = signalled_tx.send(());
        });
    // Graceful shutdown waits for every stream to end: give what is left (a CA request in
    // flight, a stream that would not end) the drain deadline, then close it.
    let deadline = async move {
        if signalled.await.is_ok() {
            tokio::time::sleep(DRAIN_DEADLINE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = served => r?,
        () = deadline => tracing::warn!(deadline_s = DRAIN_DEADLINE.as_secs(), "streams still open at the drain deadline; closing them"),
    }
    Ok(())
}

/// A started source, before it publishes.
enum Running {
    File(TopologyWatch),
    Kubernetes(crate::kube_source::Started),
}

/// The bootstrap credential of `node` (created with the state directory's secret on first use).
pub fn node_token(state_dir: &Path, node: &str) -> anyhow::Result<String> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let tokens = NodeTokens::load_or_create(&state_dir.join("node-token.key"))
        .context("node-token secret")?;
    Ok(tokens.issue(&node.into()))
}

/// The trust bundle (PEM) of the state directory's CA (created on first use).
pub fn bundle(state_dir: &Path, trust_domain: &str) -> anyhow::Result<String> {
    Ok(Ca::load_or_create(state_dir, trust_domain)?
        .bundle()
        .concat())
}

fn load_ca(config: &Config, trust_domain: &str) -> anyhow::Result<Ca> {
    let ca = match &config.ca {
        Some((c, k)) => {
            let cert =
                std::fs::read_to_string(c).with_context(|| format!("reading {}", c.display()))?;
            let key =
                std::fs::read_to_string(k).with_context(|| format!("reading {}", k.display()))?;
            Ca::from_pem(&cert, &key).map_err(|e| anyhow::anyhow!("{}: {e}", c.display()))?
        }
        None => Ca::load_or_create(&config.state_dir, trust_domain)?,
    };
    Ok(match &config.extra_roots {
        Some(p) => {
            let pem =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            ca.with_extra_roots([pem])
        }
        None => ca,
    })
}
