//! Admin endpoint: `/ready`, `/config_dump`, `/certs`, `/metrics` (plain HTTP/1.1, one request
//! per connection). Bind it to the node's loopback or management address.

use std::sync::Arc;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::node::Node;

pub(crate) async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    xds_ready: watch::Receiver<bool>,
) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let (node, ready) = (node.clone(), *xds_ready.borrow());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = route(&node, path, ready);
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}

fn route(node: &Node, path: &str, ready: bool) -> (&'static str, &'static str, String) {
    match path {
        "/ready" | "/healthz/ready" => {
            if ready {
                // Pods it cannot serve are named, but never hold the others back.
                let mut body = String::from("ready\n");
                for (uid, (netns, why)) in node.unserved.lock().iter() {
                    body.push_str(&format!("not served: {uid} ({}): {why}\n", netns.display()));
                }
                ("200 OK", "text/plain", body)
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "waiting for the first xDS sync\n".into(),
                )
            }
        }
        "/metrics" | "/stats/prometheus" => {
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
            ("200 OK", "text/plain; version=0.0.4", text)
        }
        "/config_dump" => {
            let snap = node.store.load();
            let pods: Vec<_> = node.pods().iter().map(|p| json!({"uid": p.uid.to_string(), "ip": p.ip.to_string(), "identity": p.identity.to_string(), "netns": p.netns.path().display().to_string()})).collect();
            let body = json!({
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
            });
            ("200 OK", "application/json", body.to_string())
        }
        "/certs" => (
            "200 OK",
            "application/json",
            ferry_runtime::admin::cert_summary(&node.certs).to_string(),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "paths: /ready /config_dump /certs /metrics\n".into(),
        ),
    }
}
