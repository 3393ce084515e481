//! Admin endpoint: `/ready`, `/config_dump`, `/certs`, `/metrics`, on the runtime's admin
//! server. Bind it to the node's loopback or management address.
//!
//! Istio's node-proxy chart also probes and scrapes two ports of their own: the metrics as
//! `/stats/prometheus` on 15020 and readiness as `/healthz/ready` on 15021. When they are
//! configured ([`Ports`]) each answers only its own paths, so binding them to every interface
//! shows nothing but the metrics and the readiness (never the config dump or the certificates).

use std::sync::Arc;

use ferry_runtime::admin::{Response, Routes};
use ferry_runtime::telemetry::registered;
use http::StatusCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::state::Node;

/// The listeners of the admin endpoint and of Istio's metrics and readiness ports.
#[derive(Debug)]
pub(crate) struct Ports {
    pub(crate) admin: TcpListener,
    /// `/stats/prometheus` (and `/metrics`) only: Istio's 15020.
    pub(crate) stats: Option<TcpListener>,
    /// `/healthz/ready` (and `/ready`) only: Istio's 15021.
    pub(crate) readiness: Option<TcpListener>,
}

type Handler = Arc<dyn Fn() -> Response + Send + Sync>;

pub(crate) async fn serve(
    node: Arc<Node>,
    ports: Ports,
    xds_ready: watch::Receiver<bool>,
    registry: Registry,
) {
    let (ready, metrics) = handlers(node.clone(), xds_ready, registry);
    if let Some(l) = ports.stats {
        tokio::spawn(ferry_runtime::admin::serve(l, stats_routes(&metrics)));
    }
    if let Some(l) = ports.readiness {
        tokio::spawn(ferry_runtime::admin::serve(l, readiness_routes(&ready)));
    }
    ferry_runtime::admin::serve(ports.admin, routes(node, &ready, &metrics)).await;
}

/// Istio's metrics port: the scrape only.
fn stats_routes(metrics: &Handler) -> Routes {
    let m = metrics.clone();
    Routes::new().route(&["/stats/prometheus", "/metrics"], move || m())
}

/// Istio's readiness port: the probe only.
fn readiness_routes(ready: &Handler) -> Routes {
    let r = ready.clone();
    Routes::new().route(&["/healthz/ready", "/ready"], move || r())
}

/// The capture repairs counter, registered in `registry`.
pub(crate) fn capture_repairs(registry: &mut Registry) -> Counter {
    registered(
        registry,
        "ferry_capture_repairs",
        "Capture rules found missing and put back",
    )
}

/// The connect retries counter, registered in `registry`.
pub(crate) fn connect_retries(registry: &mut Registry) -> Counter {
    let c = Counter::default();
    registry.register(
        "ferry_connect_retries",
        "Outbound connects that failed before any byte was sent and were tried on another endpoint",
        c.clone(),
    );
    c
}

/// The pods gauges, set from the node's state at each scrape.
#[derive(Debug)]
struct Pods {
    served: Gauge,
    unserved: Gauge,
}

/// The readiness and the metrics, shared by every port that answers them.
fn handlers(
    node: Arc<Node>,
    xds_ready: watch::Receiver<bool>,
    mut registry: Registry,
) -> (Handler, Handler) {
    let ready: Handler = {
        let node = node.clone();
        Arc::new(move || readiness(&node, *xds_ready.borrow()))
    };
    let pods = Pods::new(&mut registry);
    let metrics: Handler = Arc::new(move || {
        pods.set(&node);
        Response::metrics(&registry)
    });
    (ready, metrics)
}

fn routes(node: Arc<Node>, ready: &Handler, metrics: &Handler) -> Routes {
    let (ready, metrics) = (ready.clone(), metrics.clone());
    let dump = {
        let node = node.clone();
        move || Response::ok("application/json", config_dump(&node).to_string())
    };
    let certs = move || {
        let body = ferry_runtime::admin::cert_summary(&node.certs);
        Response::ok("application/json", body.to_string())
    };
    Routes::new()
        .route(&["/ready", "/healthz/ready"], move || ready())
        .route(&["/config_dump"], dump)
        .route(&["/certs"], certs)
        .route(&["/metrics", "/stats/prometheus"], move || metrics())
}

fn readiness(node: &Node, ready: bool) -> Response {
    if !ready {
        return Response::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the first xDS sync\n",
        );
    }
    if node
        .agent_replayed
        .as_ref()
        .is_some_and(|r| !r.load(std::sync::atomic::Ordering::Acquire))
    {
        return Response::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the node agent's first replay (snapshot_sent)\n",
        );
    }
    // Pods it cannot serve are named, but never hold the others back.
    let mut body = String::from("ready\n");
    for (uid, u) in node.unserved.lock().iter() {
        body.push_str(&format!(
            "not served: {uid} ({}): {}\n",
            u.netns.path.display(),
            u.reason
        ));
    }
    Response::ok("text/plain", body)
}

fn config_dump(node: &Node) -> serde_json::Value {
    let snap = node.store.load();
    let pods: Vec<_> = node.pods().iter().map(|p| json!({"uid": p.uid.to_string(), "ip": p.ip.to_string(), "identity": p.identity.to_string(), "netns": p.netns.path().display().to_string()})).collect();
    json!({
        "node": node.name.to_string(),
        "snapshot_version": snap.version(),
        "workloads": snap.workloads().count(),
        "services": snap.services().count(),
        "policies": snap.policies().count(),
        "pods": pods,
        "unserved_pods": node.unserved.lock().iter().map(|(uid, u)| json!({"uid": uid.to_string(), "netns": u.netns.path.display().to_string(), "reason": u.reason})).collect::<Vec<_>>(),
        "active_connections": node.active(),
        // Every open connection now re-checks itself on a policy change (no registry is kept):
        // the count of open connections.
        "tracked_connections": node.active(),
        "certificates": ferry_runtime::admin::cert_summary(&node.certs),
        "outlier_detection": node.health.dump(),
    })
}

// === impl Pods ===

impl Pods {
    fn new(registry: &mut Registry) -> Self {
        Self {
            served: registered(
                registry,
                "ferry_pods_served",
                "Enrolled pods this node proxy serves",
            ),
            unserved: registered(
                registry,
                "ferry_pods_unserved",
                "Enrolled pods it cannot serve (their traffic stays blocked)",
            ),
        }
    }

    fn set(&self, node: &Node) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.served.set(count(node.pods().len()));
        self.unserved.set(count(node.unserved.lock().len()));
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn istios_ports_answer_the_scrape_and_the_probe_and_nothing_else() {
        let mut registry = Registry::default();
        capture_repairs(&mut registry).inc();
        let registry = Arc::new(registry);
        let metrics: Handler = Arc::new(move || Response::metrics(&registry));
        let ready: Handler = Arc::new(|| Response::ok("text/plain", "ready\n"));
        let stats = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (s, p) = (stats.local_addr().unwrap(), probe.local_addr().unwrap());
        tokio::spawn(ferry_runtime::admin::serve(stats, stats_routes(&metrics)));
        tokio::spawn(ferry_runtime::admin::serve(probe, readiness_routes(&ready)));
        let scrape = get(s, "/stats/prometheus").await;
        assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
        assert!(scrape.contains("ferry_capture_repairs_total 1"), "{scrape}");
        let probed = get(p, "/healthz/ready").await;
        assert!(
            probed.starts_with("HTTP/1.1 200") && probed.ends_with("ready\n"),
            "{probed}"
        );
        // Neither shows what only the admin port does.
        for (addr, path) in [(s, "/config_dump"), (p, "/certs"), (s, "/healthz/ready")] {
            let r = get(addr, path).await;
            assert!(r.starts_with("HTTP/1.1 404"), "{path}: {r}");
        }
    }

    #[test]
    fn the_node_families_are_typed_in_the_scrape() {
        let mut registry = Registry::default();
        let repairs = capture_repairs(&mut registry);
        let pods = Pods::new(&mut registry);
        repairs.inc();
        pods.served.set(3);
        pods.unserved.set(1);
        let text = Response::metrics(&registry).body;
        for (family, kind) in [
            ("ferry_capture_repairs", "counter"),
            ("ferry_pods_served", "gauge"),
            ("ferry_pods_unserved", "gauge"),
        ] {
            assert!(
                text.lines().any(|l| l == format!("# TYPE {family} {kind}")),
                "no TYPE line for {family}:\n{text}"
            );
        }
        for sample in [
            "ferry_capture_repairs_total 1",
            "ferry_pods_served 3",
            "ferry_pods_unserved 1",
        ] {
            assert!(text.lines().any(|l| l == sample), "no {sample}:\n{text}");
        }
    }
}
