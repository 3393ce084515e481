//! The waypoint's HTTP filter over real loopback sockets: each request on one connection is
//! decided on its own, denied ones never reach the upstream, and non-HTTP bytes go nowhere.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::authz::{Effect, Reason, Verdict};
use ferry_runtime::conn::{ConnError, Denial};
use ferry_waypoint::l7::{self, Outcome, RequestCheck};
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

/// A loopback port nothing listens on, and the socket that holds it (bound, not listening:
/// a connection to it is refused) so that no socket of a test running alongside is given it.
fn dead_port() -> (std::net::SocketAddr, tokio::net::TcpSocket) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (held.local_addr().unwrap(), held)
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

#[test]
fn sniffing_tells_http_from_other_bytes_and_never_panics() {
    use l7::{Sniffed, sniff};
    assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Some(Sniffed::Http));
    assert_eq!(sniff(b"POST "), Some(Sniffed::Http));
    assert_eq!(sniff(b"PRI * HTTP/2.0\r\n\r\nSM"), Some(Sniffed::Http));
    assert_eq!(sniff(b"PRI"), None, "could still be the HTTP/2 preface");
    assert_eq!(sniff(b"GE"), None);
    assert_eq!(sniff(b""), None);
    assert_eq!(sniff(b"\x16\x03\x01"), Some(Sniffed::Other), "TLS");
    assert_eq!(sniff(b"get / HTTP/1.1"), Some(Sniffed::Other));
    assert_eq!(sniff(b" GET"), Some(Sniffed::Other));
    assert_eq!(sniff(&[b'A'; 40]), Some(Sniffed::Other));
    // Every byte string up to 3 bytes over a small alphabet, and long random ones: an answer
    // or "more", never a panic; and once decided, more bytes never change the answer.
    let alphabet = [b'G', b'P', b'R', b'I', b' ', b'*', b'\r', 0u8, 0xff];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let len = (rng % 40) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|i| alphabet[((rng >> (i % 56)) % alphabet.len() as u64) as usize])
            .collect();
        if let Some(kind) = sniff(&bytes) {
            let mut more = bytes.clone();
            more.extend_from_slice(b"XYZ /");
            assert_eq!(sniff(&more), Some(kind), "{bytes:?}");
        }
    }
}

/// A filter in front of a raw TCP echo server, deciding by sniffing; `l4` says whether a
/// connection that is not HTTP may pass.
async fn detecting_filter(
    up: std::net::SocketAddr,
    l4_allows: bool,
) -> (std::net::SocketAddr, tokio::sync::mpsc::Receiver<Outcome>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let check: RequestCheck = Arc::new(|r| {
        if r.method == "POST" && r.path.starts_with("/admin") {
            Err("no admin writes".into())
        } else {
            Ok(())
        }
    });
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let router = Arc::new(l7::Fixed::new(TcpStream::connect(up).await.unwrap(), check));
        let open_l4 = async move {
            TcpStream::connect(up)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(up, e))
        };
        let l4 = move || {
            if l4_allows {
                Ok(())
            } else {
                Err(ConnError::io(
                    ferry_hbone::Side::Local,
                    "denied at L4",
                    std::io::ErrorKind::PermissionDenied.into(),
                ))
            }
        };
        let outcome = l7::serve_detected(client, router, open_l4, l4, l7::Labels::default()).await;
        let _ = tx.send(outcome).await;
    });
    (addr, rx)
}

/// A raw TCP echo server; counts the bytes it received.
async fn tcp_echo(got: Arc<Mutex<usize>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let got = got.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    *got.lock() += n;
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_l4_upstream_that_cannot_be_reached_fails_the_connection_on_the_upstream_side() {
    // A port nothing listens on: the L4 connect fails.
    let (dead, _held) = dead_port();
    let http = upstream(Arc::default()).await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let check: RequestCheck = Arc::new(|_| Ok(()));
        let router = Arc::new(l7::Fixed::new(
            TcpStream::connect(http).await.unwrap(),
            check,
        ));
        let open_l4 = async move {
            TcpStream::connect(dead)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(dead, e))
        };
        l7::serve_detected(client, router, open_l4, || Ok(()), l7::Labels::default()).await
    });
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"\x16\x03\x01 hello").await.unwrap();
    let o = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("an outcome")
        .unwrap();
    let e = o.error.expect("the connection failed");
    assert_eq!(e.side, ferry_hbone::Side::Upstream, "{e}");
    assert_eq!(
        e.flag,
        ferry_runtime::conn::ResponseFlag::ConnectionFailure,
        "{e}"
    );
    assert_eq!(o.denied, 0);
}

#[tokio::test]
async fn other_bytes_are_carried_at_l4_only_when_l4_policy_allows() {
    for allowed in [true, false] {
        let got = Arc::new(Mutex::new(0));
        let up = tcp_echo(got.clone()).await;
        let (addr, mut outcome) = detecting_filter(up, allowed).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"\x16\x03\x01 hello").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut back))
            .await
            .expect("the connection ends");
        let o = tokio::time::timeout(Duration::from_secs(10), outcome.recv())
            .await
            .expect("an outcome")
            .expect("an outcome");
        if allowed {
            assert_eq!(back, b"\x16\x03\x01 hello", "{o:?}");
            assert_eq!(*got.lock(), 9);
        } else {
            assert!(back.is_empty(), "{back:?}");
            assert_eq!(*got.lock(), 0, "denied bytes reached the upstream");
            assert_eq!(o.denied, 1, "{o:?}");
        }
    }
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_judged_request_by_request() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(seen.clone()).await;
    let (addr, mut outcome) = detecting_filter(up, false).await;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(s),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let mut send = |method: &'static str, path: &'static str| {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://echo.default.svc{path}"))
            .body(Full::new(Bytes::from_static(b"h2")))
            .unwrap();
        sender.send_request(req)
    };
    let ok = send("GET", "/admin/users").await.unwrap();
    assert_eq!(ok.status(), 200);
    let body = ok.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"seen GET /admin/users h2");
    let denied = send("POST", "/admin/users").await.unwrap();
    assert_eq!(denied.status(), 403);
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"RBAC: access denied\n");
    // The client goes away: its socket is closed.
    drop(sender);
    conn.abort();
    let _ = conn.await;
    let o = tokio::time::timeout(Duration::from_secs(10), outcome.recv())
        .await
        .expect("an outcome")
        .expect("an outcome");
    assert_eq!((o.allowed, o.denied), (1, 1), "{o:?}");
    assert_eq!(*seen.lock(), ["GET /admin/users"]);
}

#[test]
fn paths_are_judged_in_one_normal_form() {
    use l7::normalize_path as n;
    assert_eq!(n("/admin/users").unwrap(), "/admin/users");
    assert_eq!(n("/x/../admin/users").unwrap(), "/admin/users");
    assert_eq!(n("/./admin//users/").unwrap(), "/admin/users/");
    assert_eq!(n("/%61dmin/%7Eme").unwrap(), "/admin/~me");
    assert_eq!(n("/../../admin").unwrap(), "/admin");
    assert_eq!(n("/a/b/..").unwrap(), "/a/");
    assert_eq!(n("/a%3fb").unwrap(), "/a%3Fb", "reserved stays encoded");
    assert_eq!(n("/").unwrap(), "/");
    assert_eq!(n("*").unwrap(), "*");
    assert!(n("/a%2Fb").is_err());
    assert!(n("/a%5cb").is_err());
    assert!(n("/a\\b").is_err());
    assert!(n("/a%4").is_err());
    assert!(n("/a%zz").is_err());
    assert!(n("admin").is_err());
    // Random paths: never a panic; the normal form is stable and has no dot segments or
    // doubled slashes.
    let alphabet = [
        "/", ".", "..", "%", "2", "e", "a", "%2e", "%2E", "%41", "//", "%", "f",
    ];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        let mut p = String::from("/");
        for _ in 0..(rng % 12) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            p.push_str(alphabet[(rng % alphabet.len() as u64) as usize]);
        }
        if let Ok(norm) = n(&p) {
            assert_eq!(n(&norm).as_deref(), Ok(norm.as_str()), "{p}");
            assert!(!norm.contains("//"), "{p} -> {norm}");
            assert!(
                !norm.split('/').any(|s| s == "." || s == ".."),
                "{p} -> {norm}"
            );
        }
    }
}

#[tokio::test]
async fn a_path_that_dodges_the_rule_by_its_spelling_is_still_denied() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = upstream(seen.clone()).await;
    let (addr, _outcome) = filter(up).await;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    for path in [
        "/x/../admin/users",
        "/%61dmin/users",
        "//admin/users",
        "/./admin",
    ] {
        let (status, body) = request(&mut sender, "POST", path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let (status, _) = request(&mut sender, "POST", "/a%2Fadmin").await;
    assert_eq!(status, 400);
    // Allowed requests go on in the normal form the policy saw.
    let (status, body) = request(&mut sender, "GET", "/x/../%61dmin/users").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "seen GET /admin/users payload")
    );
    assert_eq!(*seen.lock(), ["GET /admin/users"]);
}

#[test]
fn the_judged_host_is_the_one_the_app_sees() {
    let req = |uri: &str, hosts: &[&[u8]]| {
        let mut b = http::Request::builder().uri(uri);
        for h in hosts {
            b = b.header("host", http::HeaderValue::from_bytes(h).unwrap());
        }
        b.body(()).unwrap()
    };
    // An absolute target wins over the host header (and is what `forward` sends as host).
    assert_eq!(
        l7::request_host(&req("http://Admin.svc:8080/x", &[b"public.svc"])).unwrap(),
        "admin.svc:8080"
    );
    assert_eq!(
        l7::request_host(&req("/x", &[b"Public.SVC"])).unwrap(),
        "public.svc"
    );
    assert_eq!(l7::request_host(&req("/x", &[])).unwrap(), "");
    assert!(l7::request_host(&req("/x", &[b"a.svc", b"b.svc"])).is_err());
    assert!(l7::request_host(&req("/x", &[b"caf\xc3\xa9.svc"])).is_err());
}

#[test]
fn absolute_targets_reach_the_upstream_in_origin_form_with_the_judged_host() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let up = upstream(seen.clone()).await;
        let (addr, _outcome) = filter(up).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST http://api.svc/admin/x HTTP/1.1\r\nHost: other.svc\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 403"), "{text}");
        assert!(seen.lock().is_empty());
    });
}

/// Routes by path: `/b*` to b, `/retry*` first to a closed port then (avoiding it) to a,
/// `/slow*` to a server that never answers (200 ms deadline), the rest to a.
struct PathRouter {
    a: std::net::SocketAddr,
    b: std::net::SocketAddr,
    dead: std::net::SocketAddr,
    hang: std::net::SocketAddr,
    opens: Mutex<Vec<&'static str>>,
}

impl l7::Router for PathRouter {
    type Ticket = (&'static str, std::net::SocketAddr);

    fn decide(
        &self,
        req: &ferry_core::authz::HttpRequest<'_>,
        avoid: &[String],
    ) -> Result<l7::Choice<Self::Ticket>, l7::Refused> {
        let (name, addr) = if req.path.starts_with("/b") {
            ("b", self.b)
        } else if req.path.starts_with("/retry") && avoid.is_empty() {
            ("dead", self.dead)
        } else if req.path.starts_with("/slow") {
            ("hang", self.hang)
        } else if req.path.starts_with("/nowhere") {
            return Err(l7::Refused::Unroutable("no endpoint in scope".into()));
        } else {
            ("a", self.a)
        };
        Ok(l7::Choice {
            key: name.into(),
            backend: name.into(),
            route: Some("by-path".into()),
            timeout: Some(Duration::from_millis(200)).filter(|_| name == "hang"),
            retries: 1,
            protocol: l7::HttpUpstream::Http1,
            headers: l7::HeaderEdits::default(),
            redirect: None,
            ticket: (name, addr),
        })
    }

    fn open(
        &self,
        ticket: &Self::Ticket,
    ) -> impl std::future::Future<Output = Result<l7::Link, ConnError>> + Send {
        self.opens.lock().push(ticket.0);
        let addr = ticket.1;
        async move {
            TcpStream::connect(addr)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(addr, e))
        }
    }
}

/// A routed filter on one loopback connection, with its upstreams.
async fn routed() -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    Arc<PathRouter>,
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<Vec<String>>>,
) {
    let (seen_a, seen_b) = (Arc::default(), Arc::default());
    let a = upstream(Arc::clone(&seen_a)).await;
    let b = upstream(Arc::clone(&seen_b)).await;
    let (dead, held) = dead_port();
    // Held for the rest of the process: the routes below name the port for the whole test.
    std::mem::forget(held);
    let hang_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang = hang_l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang_l.accept().await {
            held.push(s);
        }
    });
    let router = Arc::new(PathRouter {
        a,
        b,
        dead,
        hang,
        opens: Mutex::default(),
    });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let r = router.clone();
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        l7::serve_routed(client, r, l7::Labels::default()).await
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    (sender, router, seen_a, seen_b)
}

#[tokio::test]
async fn requests_on_one_connection_are_routed_one_by_one_over_reused_upstreams() {
    let (mut sender, router, seen_a, seen_b) = routed().await;
    for _ in 0..3 {
        assert_eq!(request(&mut sender, "GET", "/a").await.0, 200);
        assert_eq!(request(&mut sender, "GET", "/b").await.0, 200);
    }
    assert_eq!(seen_a.lock().len(), 3);
    assert_eq!(seen_b.lock().len(), 3);
    // One upstream connection per backend, reused by later requests.
    assert_eq!(*router.opens.lock(), ["a", "b"]);
    let (status, body) = request(&mut sender, "GET", "/nowhere").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no endpoint in scope"), "{body}");
}

#[tokio::test]
async fn idempotent_requests_that_failed_before_a_response_are_retried_elsewhere() {
    let (mut sender, router, seen_a, _) = routed().await;
    // GET without a body: the closed port fails it, the retry goes to a.
    let req = http::Request::builder()
        .uri("/retry")
        .header("host", "echo")
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(*router.opens.lock(), ["dead", "a"]);
    // A POST with a body is not sent twice: 502, and a never sees it.
    let (status, body) = request(&mut sender, "POST", "/retry").await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(*seen_a.lock(), ["GET /retry"]);
}

#[tokio::test]
async fn a_backend_that_does_not_answer_in_time_gets_504_and_the_connection_goes_on() {
    let (mut sender, _, seen_a, _) = routed().await;
    let (status, body) = request(&mut sender, "GET", "/slow").await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(request(&mut sender, "GET", "/after").await.0, 200);
    assert_eq!(*seen_a.lock(), ["GET /after"]);
}

/// An HTTP/1.1 server that agrees to `Upgrade: shout` and then answers every byte in upper case.
async fn shouting_upstream() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |mut req: http::Request<hyper::body::Incoming>| async move {
                        let upgraded = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let Ok(u) = upgraded.await else { return };
                            let mut u = TokioIo::new(u);
                            let mut buf = [0u8; 64];
                            while let Ok(n) = u.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                let _ = u.write_all(&buf[..n].to_ascii_uppercase()).await;
                            }
                        });
                        let resp = http::Response::builder()
                            .status(101)
                            .header("connection", "upgrade")
                            .header("upgrade", "shout")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        Ok::<_, hyper::Error>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upgraded_connection_carries_bytes_both_ways_after_101() {
    let up = shouting_upstream().await;
    let (addr, _outcome) = filter(up).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: echo\r\nConnection: upgrade\r\nUpgrade: shout\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "{head:?}");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"hello through the waypoint").await.unwrap();
    let mut got = vec![0u8; 26];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("the upgraded bytes come back")
        .unwrap();
    assert_eq!(got, b"HELLO THROUGH THE WAYPOINT");
}

#[tokio::test]
async fn headers_for_one_connection_only_are_not_sent_on() {
    // An upstream that answers with the names of the headers it got.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let svc =
            hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let mut names: Vec<String> = req.headers().keys().map(|k| k.to_string()).collect();
                names.sort();
                Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(names.join(",")))))
            });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), svc)
            .await;
    });
    let (addr, _outcome) = filter(up).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: keep-alive, x-secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Kept: 1\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("x-kept") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
    let body = String::from_utf8_lossy(&got);
    let names = body.rsplit("\r\n\r\n").next().unwrap();
    assert_eq!(names, "host,x-kept", "{body}");
}

/// One upstream for every request (an upgrade agreed to by `up`), whose upgraded connections
/// end when `recheck` fires (a policy change, as the waypoint's router re-judges them).
struct UpgradeRouter {
    up: std::net::SocketAddr,
    recheck: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

impl l7::Router for UpgradeRouter {
    type Ticket = ();

    fn decide(
        &self,
        _req: &ferry_core::authz::HttpRequest<'_>,
        _avoid: &[String],
    ) -> Result<l7::Choice<()>, l7::Refused> {
        Ok(l7::Choice {
            key: "up".into(),
            backend: "up".into(),
            route: None,
            timeout: None,
            retries: 0,
            protocol: l7::HttpUpstream::Http1,
            headers: l7::HeaderEdits::default(),
            redirect: None,
            ticket: (),
        })
    }

    fn open(
        &self,
        _: &(),
    ) -> impl std::future::Future<Output = Result<l7::Link, ConnError>> + Send {
        let up = self.up;
        async move {
            TcpStream::connect(up)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(up, e))
        }
    }

    fn upgraded(&self, _: &(), _req: &ferry_core::authz::HttpRequest<'_>) -> l7::Recheck {
        let rx = self.recheck.lock().take();
        Box::pin(async move {
            let fired = match rx {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            if !fired {
                std::future::pending::<()>().await;
            }
            Denial(Verdict {
                effect: Effect::Deny,
                reason: Reason::NoAllowMatched { allow_policies: 1 },
                audited: Vec::new(),
                dry_run: Vec::new(),
            })
        })
    }
}

/// An HTTP/1.1 server that agrees to every upgrade (101), then echoes what it gets.
async fn upgrading_echo() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let _ = s
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n")
                    .await;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A routed filter with a drain deadline (`finish`) in front of `router`, and a raw client.
async fn draining_filter<R: l7::Router>(
    router: Arc<R>,
) -> (
    TcpStream,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<Outcome>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (finish_tx, finish) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        l7::serve_routed_until(client, router, l7::Labels::default(), Some(finish)).await
    });
    (TcpStream::connect(addr).await.unwrap(), finish_tx, serving)
}

/// Reads from `s` until `want` has come (or the stream ends).
async fn read_until(s: &mut TcpStream, want: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(want.len()).any(|w| w == want) {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

const UPGRADE: &[u8] =
    b"GET /ws HTTP/1.1\r\nHost: echo.default.svc\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n";

#[tokio::test]
async fn at_the_drain_deadline_an_idle_http_connection_is_closed_after_its_last_response() {
    let up = upstream(Arc::default()).await;
    let check: RequestCheck = Arc::new(|_| Ok(()));
    let router = Arc::new(l7::Fixed::new(TcpStream::connect(up).await.unwrap(), check));
    let (mut s, finish, serving) = draining_filter(router).await;
    s.write_all(b"GET /a HTTP/1.1\r\nHost: echo.default.svc\r\n\r\n")
        .await
        .unwrap();
    let got = read_until(&mut s, b"seen GET /a").await;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
    finish.send_replace(true);
    // Closed gracefully: an end of stream (a FIN), not a reset, and the filter is done.
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the connection ends at the deadline");
    assert!(end.is_ok(), "{end:?}");
    let o = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the filter ends")
        .unwrap();
    assert_eq!(o.allowed, 1, "{o:?}");
    assert!(o.error.is_none(), "{o:?}");
}

#[tokio::test]
async fn an_upgraded_connection_ends_cleanly_at_the_drain_deadline() {
    let router = Arc::new(UpgradeRouter {
        up: upgrading_echo().await,
        recheck: Mutex::default(),
    });
    let (mut s, finish, serving) = draining_filter(router).await;
    s.write_all(UPGRADE).await.unwrap();
    let got = read_until(&mut s, b"\r\n\r\n").await;
    assert!(got.starts_with(b"HTTP/1.1 101"), "{got:?}");
    s.write_all(b"ping").await.unwrap();
    assert_eq!(read_until(&mut s, b"ping").await, b"ping");
    finish.send_replace(true);
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the upgraded connection ends at the deadline");
    assert!(end.is_ok(), "ended with a FIN, not a reset: {end:?}");
    let o = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the filter ends")
        .unwrap();
    assert!(o.error.is_none(), "{o:?}");
}

#[tokio::test]
async fn a_policy_change_resets_an_upgraded_connection_and_says_why() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let router = Arc::new(UpgradeRouter {
        up: upgrading_echo().await,
        recheck: Mutex::new(Some(rx)),
    });
    let (mut s, _finish, serving) = draining_filter(router).await;
    s.write_all(UPGRADE).await.unwrap();
    let got = read_until(&mut s, b"\r\n\r\n").await;
    assert!(got.starts_with(b"HTTP/1.1 101"), "{got:?}");
    s.write_all(b"ping").await.unwrap();
    assert_eq!(read_until(&mut s, b"ping").await, b"ping");
    tx.send(()).unwrap();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("the upgraded connection ends on the policy change");
    assert!(end.is_err(), "reset, not a clean end: {end:?}");
    let o = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the filter ends")
        .unwrap();
    let e = o.error.expect("ended by the policy change");
    assert_eq!(e.flag, ferry_runtime::conn::ResponseFlag::Deny, "{e}");
    assert_eq!(e.moved(), (4, 4), "{e}");
}
