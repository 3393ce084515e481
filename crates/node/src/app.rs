//! The composition root of `ferry node`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context;
use ferry_core::model::NodeName;
use ferry_hbone::pool::{Pool, PoolConfig};
use ferry_runtime::bootstrap::ControlPlane;
use ferry_runtime::telemetry::Metrics;
use parking_lot::Mutex;

use crate::state::{Node, PodDialer};

/// How a node proxy is run.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub cluster: String,
    /// The control plane, and this node's credential for it.
    pub control: ControlPlane,
    pub admin: SocketAddr,
    /// Istio's metrics port (`/stats/prometheus`, 15020), when set.
    pub stats: Option<SocketAddr>,
    /// Istio's readiness port (`/healthz/ready`, 15021), when set.
    pub readiness: Option<SocketAddr>,
    /// How long in-flight connections may finish after SIGTERM.
    pub drain: Duration,
    /// See [`Node::idle_bound`].
    pub idle_bound: Duration,
    /// Where the served pods are kept, the fallback when the node agent is not there to
    /// replay them ([`crate::enrollment`]).
    pub state_file: Option<PathBuf>,
    /// The node agent's ZDS socket ([`crate::zds`]), when pods are enrolled by one.
    pub zds_socket: Option<PathBuf>,
    /// Passive health: when connects that keep failing eject an endpoint ([`Node::health`]).
    pub outlier: ferry_core::outlier::OutlierConfig,
    /// Where DNS-captured pods' queries for names outside the mesh go; `None`: the first
    /// nameserver of the node's `/etc/resolv.conf`.
    pub dns_upstream: Option<SocketAddr>,
}

/// Runs the node proxy until SIGTERM or SIGINT, then drains.
pub async fn run(config: Config) -> anyhow::Result<()> {
    ferry_runtime::raise_fd_limit();
    let control = &config.control;
    let bundle = control.bundle()?;
    let mesh = control.subscribe(format!("ferry~{}", config.name), &config.cluster);
    let certs = control.certificates(&config.cluster)?;
    let by_ip = Arc::new(Mutex::new(HashMap::new()));
    let pool = Pool::new(PoolConfig {
        dialer: Arc::new(PodDialer(by_ip.clone())),
        ..PoolConfig::default()
    });
    let (trigger, drain) = ferry_runtime::drain::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let node = Arc::new(Node {
        name: NodeName::new(&config.name),
        store: mesh.store.clone(),
        changes: mesh.changes(),
        certs,
        bundle: Mutex::new(bundle),
        pool,
        metrics: Metrics::new(&mut registry),
        drain,
        hbone_conns: Arc::default(),
        state_file: config.state_file.clone(),
        agent_replayed: config
            .zds_socket
            .as_ref()
            .map(|_| std::sync::atomic::AtomicBool::new(false)),
        unserved: Mutex::default(),
        uncaptured: Mutex::default(),
        enrolling: Mutex::default(),
        capture_repairs: crate::admin::capture_repairs(&mut registry),
        connect_retries: crate::admin::connect_retries(&mut registry),
        health: crate::outlier::PassiveHealth::new(config.outlier, &mut registry),
        dns: crate::dns::Settings {
            upstream: config
                .dns_upstream
                .or_else(|| crate::dns::upstream_from(std::path::Path::new("/etc/resolv.conf"))),
            metrics: crate::dns::Metrics::new(&mut registry),
        },
        acceptor: Arc::new(ferry_runtime::accept::Acceptor::new(&mut registry)),
        idle_bound: config.idle_bound,
        pods: Mutex::new(HashMap::new()),
        by_ip,
        connections: AtomicU64::new(0),
        active: AtomicU64::new(0),
        peak_active: AtomicU64::new(0),
        halved: tokio::sync::Notify::new(),
    });
    let ready = mesh.ready();
    let admin = tokio::net::TcpListener::bind(config.admin)
        .await
        .with_context(|| format!("admin address {}", config.admin))?;
    let admin_addr = admin.local_addr()?;
    let bind = |addr: Option<SocketAddr>, what: &'static str| async move {
        match addr {
            Some(a) => tokio::net::TcpListener::bind(a)
                .await
                .map(Some)
                .with_context(|| format!("{what} address {a}")),
            None => Ok(None),
        }
    };
    let ports = crate::admin::Ports {
        admin,
        stats: bind(config.stats, "stats").await?,
        readiness: bind(config.readiness, "readiness").await?,
    };
    tokio::spawn(crate::admin::serve(
        node.clone(),
        ports,
        ready.clone(),
        registry,
    ));
    {
        // Once the mesh is known (the agent's adds and the state file's pods are looked up in
        // it): the agent's pods, or without one the state file's (the agent's client falls
        // back to it while the agent is not there).
        let (node, mut ready) = (node.clone(), ready.clone());
        let socket = config.zds_socket.clone();
        tokio::spawn(async move {
            let _ = ready.wait_for(|r| *r).await;
            match socket {
                Some(socket) => crate::zds::run(node, socket).await,
                None => {
                    crate::enrollment::restore(&node).await;
                    crate::memory::started();
                }
            }
        });
    }
    tokio::spawn(prefetch(node.clone(), ready));
    tokio::spawn(crate::enrollment::keep_retrying(node.clone()));
    tokio::spawn(crate::memory::give_back(node.clone()));
    tokio::spawn(crate::memory::release_when_idle());
    tracing::info!(
        node = %config.name,
        zds = ?config.zds_socket,
        admin = %admin_addr,
        "node proxy serving (admin: /ready /config_dump /certs /metrics)"
    );
    // The setup above ran on the thread that polls this future (the process's main thread,
    // which from here on only waits): what it cached goes back.
    crate::memory::release_thread_cache();
    // Listeners stop and HBONE peers get a GOAWAY; at the deadline what is still open ends with
    // a FIN (END_STREAM in tunnels) and the peers get a moment to finish their side.
    trigger.on_signal("node", config.drain).await;
    // Then the pooled HBONE connections close with close_notify.
    node.pool.shutdown(Duration::from_secs(2)).await;
    tracing::info!(left = node.active(), "node proxy stopped");
    Ok(())
}

/// Keeps certificates of this node's workloads fetched ahead of their first connection, and
/// drops those of workloads that left: on every new snapshot.
async fn prefetch(node: Arc<Node>, mut ready: tokio::sync::watch::Receiver<bool>) {
    let _ = ready.wait_for(|r| *r).await;
    let mut changes = node.changes.clone();
    loop {
        let snap = node.store.load();
        let ids: HashSet<_> = snap
            .workloads_on_node(&node.name)
            .iter()
            .filter_map(|u| snap.workload(u))
            .filter_map(|w| w.identity().ok())
            .collect();
        drop(snap);
        node.certs.prefetch(ids.iter());
        node.certs.retain(&ids);
        if changes.changed().await.is_err() {
            return;
        }
    }
}
