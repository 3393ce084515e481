//! Admin endpoint: `/ready`, `/config_dump`, `/certs`, `/metrics`, on the runtime's admin
//! server. Bind it to the node's loopback or management address.

use std::sync::Arc;

use ferry_runtime::admin::{Response, Routes};
use http::StatusCode;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::node::Node;

pub(crate) async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    xds_ready: watch::Receiver<bool>,
) {
    ferry_runtime::admin::serve(listener, routes(node, xds_ready)).await;
}

fn routes(node: Arc<Node>, xds_ready: watch::Receiver<bool>) -> Routes {
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
    let metrics = move || Response::ok("text/plain; version=0.0.4", metrics_text(&node));
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

fn metrics_text(node: &Node) -> String {
    let mut text = node.metrics.render();
    text.push_str(&format!(
        "# HELP ferry_capture_repairs_total Capture rules found missing and put back.\n# TYPE ferry_capture_repairs_total counter\nferry_capture_repairs_total {}\n",
        node.capture_repairs.load(std::sync::atomic::Ordering::Relaxed)
    ));
    text.push_str(&ferry_runtime::accept::render(&node.acceptor));
    text.push_str(&format!(
        "# HELP ferry_pods_served Enrolled pods this node proxy serves.\n# TYPE ferry_pods_served gauge\nferry_pods_served {}\n# HELP ferry_pods_unserved Enrolled pods it cannot serve (their traffic stays blocked).\n# TYPE ferry_pods_unserved gauge\nferry_pods_unserved {}\n",
        node.pods().len(),
        node.unserved.lock().len()
    ));
    text
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
        "tracked_connections": node.conns.len(),
        "certificates": ferry_runtime::admin::cert_summary(&node.certs),
    })
}
