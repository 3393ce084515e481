//! The waypoint's HTTP filter over real loopback sockets: each request on one connection is
//! decided on its own, denied ones never reach the upstream, and non-HTTP bytes go nowhere.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_node::l7::{self, Outcome, RequestCheck};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/1 server that answers `seen <method> <path>` and records every request it got.
async fn upstream(seen: Arc<Mutex<Vec<String>>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let line = format!("{} {}", req.method(), req.uri().path());
                            seen.lock().push(line.clone());
                            let body = req.into_body().collect().await?.to_bytes();
                            let text = format!("seen {line} {}", String::from_utf8_lossy(&body));
                            Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(text))))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A waypoint filter on a loopback listener in front of `up`, denying POSTs under /admin.
async fn filter(
    up: std::net::SocketAddr,
) -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<Outcome>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let check: RequestCheck = Arc::new(|r| {
        if r.method == "POST" && r.path.starts_with("/admin") {
            Err(format!("denied {} {}", r.method, r.path))
        } else {
            Ok(())
        }
    });
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let upstream = TcpStream::connect(up).await.unwrap();
        let _ = tx
            .send(l7::serve(client, upstream, check, l7::Labels::default()).await)
            .await;
    });
    (addr, rx)
}

async fn request(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    method: &str,
    path: &str,
) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "echo.default.svc")
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn each_request_is_decided_and_denied_ones_never_reach_the_upstream() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(seen.clone()).await;
    let (addr, mut outcome) = filter(up).await;

    let s = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);

    assert_eq!(
        request(&mut sender, "GET", "/admin/users").await,
        (200, "seen GET /admin/users payload".into())
    );
    let (status, body) = request(&mut sender, "POST", "/admin/users").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("access denied"), "{body}");
    // The same connection goes on serving allowed requests after a denial.
    assert_eq!(
        request(&mut sender, "POST", "/orders").await,
        (200, "seen POST /orders payload".into())
    );
    drop(sender);
    let _ = conn.await;

    let got = tokio::time::timeout(Duration::from_secs(10), outcome.recv())
        .await
        .expect("the filter finishes when the client leaves")
        .expect("an outcome");
    assert_eq!((got.allowed, got.denied), (2, 1), "{got:?}");
    assert_eq!(*seen.lock(), ["GET /admin/users", "POST /orders"]);
}

#[tokio::test]
async fn bytes_that_are_not_http_go_nowhere() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(seen.clone()).await;
    let (addr, mut outcome) = filter(up).await;

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"\x16\x03\x01 not an http request at all\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    // The filter answers (400) or closes; either way the connection ends.
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the filter ends the connection");
    let got = tokio::time::timeout(Duration::from_secs(10), outcome.recv())
        .await
        .expect("an outcome")
        .expect("an outcome");
    assert!(got.error.is_some(), "{got:?}");
    assert_eq!((got.allowed, got.denied), (0, 0));
    assert!(seen.lock().is_empty(), "the upstream got {:?}", seen.lock());
}
