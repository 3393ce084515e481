//! The composition root of `ferry node`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context;
use ferry_core::model::NodeName;
use ferry_core::store::Store;
use ferry_hbone::pool::{Pool, PoolConfig};
use ferry_hbone::tls::TrustBundle;
use ferry_identity::client::GrpcCa;
use ferry_identity::manager::{CertManager, ManagerConfig};
use ferry_xds::client::{ClientConfig, XdsClient};
use parking_lot::Mutex;

use crate::node::{Node, PodDialer};
use ferry_runtime::telemetry::Metrics;

/// How a node proxy is run.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub cluster: String,
    /// The control plane, `https://ip:port`.
    pub control: String,
    pub token: String,
    pub bundle_pem: String,
    pub api_socket: PathBuf,
    pub admin: SocketAddr,
    /// How long in-flight connections may finish after SIGTERM.
    pub drain: Duration,
    /// See [`Node::idle_bound`].
    pub idle_bound: Duration,
    /// See [`Node::state_file`].
    pub state_file: Option<PathBuf>,
    pub plaintext: bool,
}

/// Runs the node proxy until SIGTERM or SIGINT, then drains.
pub async fn run(config: Config) -> anyhow::Result<()> {
    raise_fd_limit();
    let bundle = TrustBundle::from_pem(&config.bundle_pem).context("trust bundle")?;
    let store = Arc::new(Store::default());
    let xds = XdsClient::new(
        ClientConfig {
            endpoint: config.control.clone(),
            bundle_pem: config.bundle_pem.clone(),
            server_name: "ferry-control".into(),
            token: config.token.clone(),
            cluster: config.cluster.clone(),
            node_id: format!("ferry~{}", config.name),
            plaintext: config.plaintext,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(15),
        },
        store.clone(),
    );
    let ready = xds.ready();
    tokio::spawn(xds.run());
    let ca = GrpcCa::new(
        &config.control,
        &config.bundle_pem,
        "ferry-control",
        config.token.clone(),
        config.cluster.clone(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let certs = CertManager::new(Arc::new(ca), ManagerConfig::default());
    let by_ip = Arc::new(Mutex::new(HashMap::new()));
    let pool = Pool::new(PoolConfig {
        dialer: Arc::new(PodDialer(by_ip.clone())),
        ..PoolConfig::default()
    });
    let mut registry = prometheus_client::registry::Registry::default();
    let node = Arc::new(Node {
        name: NodeName::new(&config.name),
        store: store.clone(),
        certs,
        bundle: Mutex::new(bundle),
        pool,
        metrics: Metrics::new(&mut registry),
        conns: crate::conns::Conns::default(),
        drain: tokio::sync::watch::channel(false).0,
        finish: tokio::sync::watch::channel(false).0,
        hbone_conns: AtomicU64::new(0),
        state_file: config.state_file.clone(),
        unserved: Mutex::default(),
        enrolling: Mutex::default(),
        capture_repairs: crate::admin::capture_repairs(&mut registry),
        acceptor: ferry_runtime::accept::Acceptor::new(&mut registry),
        idle_bound: config.idle_bound,
        pods: Mutex::new(HashMap::new()),
        by_ip,
        connections: AtomicU64::new(0),
        active: AtomicU64::new(0),
        peak_active: AtomicU64::new(0),
    });
    let admin = tokio::net::TcpListener::bind(config.admin)
        .await
        .with_context(|| format!("admin address {}", config.admin))?;
    let admin_addr = admin.local_addr()?;
    tokio::spawn(crate::admin::serve(
        node.clone(),
        admin,
        ready.clone(),
        registry,
    ));
    let api_node = node.clone();
    let api_path = config.api_socket.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::api::serve(api_node, api_path.clone()).await {
            tracing::error!(path = %api_path.display(), error = %e, "the enrollment API stopped");
        }
    });
    {
        // Serve again the pods enrolled before a restart, once the mesh is known.
        let (node, mut ready) = (node.clone(), ready.clone());
        tokio::spawn(async move {
            let _ = ready.wait_for(|r| *r).await;
            crate::enrollment::restore(&node).await;
        });
    }
    tokio::spawn(prefetch(node.clone(), ready));
    tokio::spawn(recheck(node.clone()));
    tokio::spawn(reconcile(node.clone()));
    tokio::spawn(crate::memory::give_back(node.clone()));
    println!(
        "ferry node {}: enrollment API on {}, admin on http://{admin_addr}/ (ready, config_dump, certs, metrics)",
        config.name,
        config.api_socket.display()
    );
    shutdown_signal().await;
    tracing::info!(
        drain_s = config.drain.as_secs(),
        active = node.active(),
        "draining"
    );
    node.stop_accepting();
    let deadline = tokio::time::Instant::now() + config.drain;
    wait_until(deadline, || node.active() == 0).await;
    // The deadline: what is still open ends with a FIN (END_STREAM in tunnels), and the peers
    // get a moment to finish their side; then the HBONE connections close with close_notify.
    let left = node.active();
    if left > 0 {
        tracing::info!(
            left,
            "drain deadline: ending the remaining connections with FIN"
        );
        node.finish.send_replace(true);
        wait_until(tokio::time::Instant::now() + FINISH_GRACE, || {
            node.active() == 0
        })
        .await;
    }
    node.pool.shutdown(Duration::from_secs(2)).await;
    wait_until(tokio::time::Instant::now() + Duration::from_secs(2), || {
        node.hbone_conns.load(std::sync::atomic::Ordering::Relaxed) == 0
    })
    .await;
    tracing::info!(left = node.active(), "node proxy stopped");
    let _ = std::fs::remove_file(&config.api_socket);
    Ok(())
}

/// How long, past the drain deadline, peers get to finish their side of connections that were
/// ended with a FIN (a tunnel waits up to 5 s for its peer's END_STREAM).
const FINISH_GRACE: Duration = Duration::from_secs(6);

/// Polls `done` every 20 ms until it holds or `deadline` passes.
async fn wait_until(deadline: tokio::time::Instant, done: impl Fn() -> bool) {
    while !done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Keeps certificates of this node's workloads fetched ahead of their first connection, and
/// drops those of workloads that left.
async fn prefetch(node: Arc<Node>, mut ready: tokio::sync::watch::Receiver<bool>) {
    let _ = ready.wait_for(|r| *r).await;
    loop {
        let snap = node.store.load();
        let ids: HashSet<_> = snap
            .workloads_on_node(&node.name)
            .iter()
            .filter_map(|u| snap.workload(u))
            .filter_map(|w| w.identity().ok())
            .collect();
        node.certs.prefetch(ids.iter());
        node.certs.retain(&ids);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn shutdown_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Re-authorizes open connections whenever a new snapshot is applied.
async fn recheck(node: Arc<Node>) {
    let mut last = node.store.load().version();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let snap = node.store.load();
        if snap.version() != last {
            last = snap.version();
            tracing::debug!(
                version = last,
                tracked = node.conns.len(),
                "re-checking open connections"
            );
            let closed = node.conns.recheck(&snap);
            if closed > 0 {
                tracing::info!(closed, version = last, "policy change closed connections");
            }
        }
    }
}

/// Raises the soft file-descriptor limit to the hard one: every proxied connection holds two.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the file-descriptor limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the file-descriptor limit"),
        },
        _ => {}
    }
}

/// Keeps every enrolled pod's capture rules in place: rules removed by someone else are put
/// back (and counted), so a pod's traffic does not go around the proxy for longer than one
/// check interval. A pod whose namespace is gone is reported.
async fn reconcile(node: Arc<Node>) {
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        crate::enrollment::retry_unserved(&node).await;
        for pod in node.pods() {
            let path = pod.netns.path().to_path_buf();
            if !path.exists() {
                tracing::error!(pod = %pod.uid, netns = %path.display(), "the pod's network namespace is gone; remove the pod or enroll it again");
                continue;
            }
            if pod.netns.replaced() {
                tracing::warn!(pod = %pod.uid, netns = %path.display(), "the pod's network namespace was created again: serving the new one");
                if let Err(e) = node.reenroll(&pod.uid).await {
                    tracing::error!(pod = %pod.uid, error = %e, "cannot serve the re-created namespace; its traffic stays blocked");
                    node.unserved
                        .lock()
                        .insert(pod.uid.clone(), (path.clone(), e.to_string()));
                }
                continue;
            }
            if !crate::capture::installed(&path).await {
                node.capture_repairs.inc();
                match crate::capture::install(&path).await {
                    Ok(()) => {
                        tracing::warn!(pod = %pod.uid, "capture rules were missing; restored")
                    }
                    Err(e) => {
                        tracing::error!(pod = %pod.uid, error = %e, "capture rules are missing and cannot be restored")
                    }
                }
            }
        }
    }
}
