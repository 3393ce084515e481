//! Admin endpoint: `/ready`, `/config_dump`, `/certs`, `/metrics`, on the runtime's admin
//! server. Bind it to the node's loopback or management address.

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

pub(crate) async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    xds_ready: watch::Receiver<bool>,
    registry: Registry,
) {
    ferry_runtime::admin::serve(listener, routes(node, xds_ready, registry)).await;
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

fn routes(node: Arc<Node>, xds_ready: watch::Receiver<bool>, mut registry: Registry) -> Routes {
    let ready = {
        let node = node.clone();
        move || readiness(&node, *xds_ready.borrow())
    };
    let dump = {
        let node = node.clone();
        move || Response::ok("application/json", config_dump(&node).to_string())
    };
    let certs = {
        let node = node.clone();
        move || {
            let body = ferry_runtime::admin::cert_summary(&node.certs);
            Response::ok("application/json", body.to_string())
        }
    };
    let pods = Pods::new(&mut registry);
    let metrics = move || {
        pods.set(&node);
        Response::metrics(&registry)
    };
    Routes::new()
        .route(&["/ready", "/healthz/ready"], ready)
        .route(&["/config_dump"], dump)
        .route(&["/certs"], certs)
        .route(&["/metrics", "/stats/prometheus"], metrics)
}

fn readiness(node: &Node, ready: bool) -> Response {
    if !ready {
        return Response::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the first xDS sync\n",
        );
    }
    // Pods it cannot serve are named, but never hold the others back.
    let mut body = String::from("ready\n");
    for (uid, (netns, why)) in node.unserved.lock().iter() {
        body.push_str(&format!("not served: {uid} ({}): {why}\n", netns.display()));
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
        "unserved_pods": node.unserved.lock().iter().map(|(uid, (netns, why))| json!({"uid": uid.to_string(), "netns": netns.display().to_string(), "reason": why})).collect::<Vec<_>>(),
        "active_connections": node.active(),
        // Every open connection now re-checks itself on a policy change (no registry is kept):
        // the count of open connections.
        "tracked_connections": node.active(),
        "certificates": ferry_runtime::admin::cert_summary(&node.certs),
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
    use super::*;

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
