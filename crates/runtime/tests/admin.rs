//! The admin server speaks real HTTP/1.1: a route's answer, a 404 naming the paths, a 400 for
//! a request it cannot parse, and the server goes on serving after each of them.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use ferry_runtime::admin::{self, Response, Routes};
use http::StatusCode;

async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = Routes::new()
        .route(&["/ready", "/healthz/ready"], || {
            Response::ok("text/plain", "ready\n")
        })
        .route(&["/busy"], || {
            Response::new(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not yet\n")
        });
    tokio::spawn(admin::serve(listener, routes));
    addr
}

/// Sends `request`, closes the sending side (as `ferry lab connect` does), reads to the end.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

async fn get(addr: SocketAddr, request: &'static str) -> String {
    tokio::task::spawn_blocking(move || exchange(addr, request.as_bytes()))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_route_answers_with_its_status_type_and_body() {
    let addr = server().await;
    let r = get(
        addr,
        "GET /ready HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("content-type: text/plain\r\n"), "{r}");
    assert!(r.contains("content-length: 6\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\nready\n"), "{r}");
    let r = get(addr, "GET /healthz/ready HTTP/1.1\r\nhost: a\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("ready\n"),
        "{r}"
    );
    let r = get(addr, "GET /busy HTTP/1.1\r\nhost: a\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
    assert!(r.ends_with("not yet\n"), "{r}");
}

#[tokio::test]
async fn an_unknown_path_gets_404_naming_the_paths() {
    let addr = server().await;
    let r = get(addr, "GET /nope HTTP/1.1\r\nhost: a\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\npaths: /ready /busy /records\n"), "{r}");
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let addr = server().await;
    let r = get(
        addr,
        "GET /ready HTTP/1.1\r\nhost: a\r\n\r\nGET /busy HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .await;
    assert_eq!(r.matches("HTTP/1.1 ").count(), 2, "{r}");
    assert!(r.contains("ready\n") && r.ends_with("not yet\n"), "{r}");
}

#[tokio::test]
async fn a_malformed_request_gets_400_and_the_server_goes_on() {
    let addr = server().await;
    // Kept open, never finished: it must hold no one else up.
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /ready HTT").unwrap();
    let r = get(addr, "GARBAGE\x01 / nonsense\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
    let r = get(addr, "GET /ready HTTP/1.1\r\nhost: a\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("ready\n"),
        "{r}"
    );
    drop(stalled);
}

#[tokio::test]
async fn an_http_1_0_request_is_answered_in_http_1_0_and_closed() {
    let addr = server().await;
    let r = get(addr, "GET /ready HTTP/1.0\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.0 200 OK\r\n") && r.ends_with("ready\n"),
        "{r}"
    );
}

#[tokio::test]
async fn metrics_are_scraped_over_http_with_every_family_typed() {
    use ferry_runtime::accept::Acceptor;
    use ferry_runtime::telemetry::{Labels, Metrics, Reporter, SecurityPolicy};
    use prometheus_client::registry::Registry;

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let _acceptor = Acceptor::new(&mut registry);
    metrics.opened(&Labels {
        source_workload: "a".into(),
        source_principal: "spiffe://td/ns/a/sa/a".into(),
        destination_workload: "b".into(),
        destination_service: "b.svc".into(),
        destination_principal: "spiffe://td/ns/a/sa/b".into(),
        ..Labels::new(Reporter::Destination, SecurityPolicy::MutualTls)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = Routes::new().route(&["/metrics", "/stats/prometheus"], move || {
        Response::metrics(&registry)
    });
    tokio::spawn(admin::serve(listener, routes));
    for path in ["/metrics", "/stats/prometheus"] {
        let request: &'static str = if path == "/metrics" {
            "GET /metrics HTTP/1.1\r\nhost: a\r\n\r\n"
        } else {
            "GET /stats/prometheus HTTP/1.1\r\nhost: a\r\n\r\n"
        };
        let r = get(addr, request).await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains(&format!("content-type: {}\r\n", admin::OPENMETRICS)),
            "{r}"
        );
        for family in [
            "istio_tcp_connections_opened",
            "istio_tcp_connections_closed",
            "istio_tcp_sent_bytes",
            "istio_tcp_received_bytes",
            "ferry_accept_refused",
            "ferry_accept_errors",
        ] {
            assert!(
                r.lines().any(|l| l == format!("# TYPE {family} counter")),
                "no TYPE line for {family}:\n{r}"
            );
        }
        assert!(
            r.lines().any(|l| l
                .starts_with("istio_tcp_connections_opened_total{reporter=\"destination\",")
                && l.contains(
                    "request_protocol=\"tcp\",connection_security_policy=\"mutual_tls\",response_flags=\"-\","
                )
                && l.ends_with(" 1")),
            "{r}"
        );
        assert!(r.lines().any(|l| l == "ferry_accept_errors_total 0"), "{r}");
    }
}
