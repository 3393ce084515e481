//! A minimal Prometheus endpoint for the control plane's xDS counters.
//!
//! Answers every HTTP/1.x request on its port with the counters in the Prometheus text format
//! and closes the connection. Bind it to loopback or a management network.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::xds_server::Metrics;

/// The exposition text.
pub fn render(m: &Metrics) -> String {
    let mut out = String::new();
    for (name, help, v) in [
        ("ferry_xds_streams", "xDS streams opened", &m.streams),
        ("ferry_xds_pushes", "xDS responses sent", &m.pushes),
        (
            "ferry_xds_resources_sent",
            "resources sent in xDS responses",
            &m.resources_sent,
        ),
        ("ferry_xds_acks", "xDS responses acknowledged", &m.acks),
        (
            "ferry_xds_nacks",
            "xDS responses rejected by a node (NACK)",
            &m.nacks,
        ),
        (
            "ferry_xds_refused",
            "xDS streams refused for a missing or bad node credential",
            &m.refused,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}.\n# TYPE {name}_total counter\n{name}_total {}",
            v.load(Ordering::Relaxed)
        );
    }
    out
}

/// Serves `render(metrics)` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let body = render(&metrics);
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(response.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}
