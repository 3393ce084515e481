//! The metrics endpoint over a real socket: any path, every counter, connection closed after.

use std::sync::Arc;

use ferry_control::metrics::{Metrics, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    // Reading to the end proves the server closes the connection after one response.
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_string(&mut text),
    )
    .await
    .expect("the server closes the connection")
    .unwrap();
    text
}

#[tokio::test]
async fn every_counter_is_served_on_any_path_under_its_old_name() {
    let metrics = Metrics::default();
    metrics.streams.inc();
    metrics.resources_sent.inc_by(7);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(serve(listener, Arc::new(metrics.registry())));
    // Increments after registration are seen: the registry shares the counters.
    metrics.nacks.inc();
    for path in ["/metrics", "/"] {
        let text = get(addr, path).await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{text}"
        );
        for (name, value) in [
            ("ferry_xds_streams", 1),
            ("ferry_xds_pushes", 0),
            ("ferry_xds_resources_sent", 7),
            ("ferry_xds_acks", 0),
            ("ferry_xds_nacks", 1),
            ("ferry_xds_refused", 0),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} counter\n")),
                "{name}: {text}"
            );
            assert!(
                text.contains(&format!("\n{name}_total {value}\n")),
                "{name}: {text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
    task.abort();
}
