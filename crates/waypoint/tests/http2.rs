//! The waypoint's HTTP filter in front of a backend whose port speaks HTTP/2 (`http2`, `grpc`):
//! requests go on as HTTP/2 with prior knowledge over one reused connection, bodies and
//! trailers pass both ways, and a trailers-only answer (gRPC's error form) arrives as it left.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ferry_runtime::conn::ConnError;
use ferry_waypoint::l7::{self, HttpUpstream};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};

type Body = BoxBody<Bytes, std::convert::Infallible>;

/// What the backend saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    version: http::Version,
    authority: Option<String>,
    host: Option<HeaderValue>,
    te: Option<HeaderValue>,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

/// Trailers made of `pairs`.
fn header_map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(n, v)| {
            (
                http::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            )
        })
        .collect()
}

/// `data`, then `trailers`.
fn with_trailers(data: Bytes, trailers: HeaderMap) -> Body {
    Full::new(data)
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed()
}

/// An HTTP/2-only backend (prior knowledge, as a gRPC server): `/echo` answers with the
/// request's body and the trailers `grpc-status: 0` and `x-echoed` (the request's
/// `x-request-trailer` trailer); `/trailers-only` answers with headers alone, gRPC's error form
/// (`grpc-status: 5`, `grpc-message`). Records what it saw.
async fn backend(seen: Arc<Mutex<Vec<Seen>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let got = body.collect().await?;
                    let trailers = got.trailers().cloned();
                    let body = got.to_bytes();
                    seen.lock().push(Seen {
                        version: parts.version,
                        authority: parts.uri.authority().map(ToString::to_string),
                        host: parts.headers.get(http::header::HOST).cloned(),
                        te: parts.headers.get(http::header::TE).cloned(),
                        body: body.clone(),
                        trailers: trailers.clone(),
                    });
                    let resp = if parts.uri.path() == "/trailers-only" {
                        let mut r = Response::new(Empty::new().boxed());
                        r.headers_mut().extend(header_map(&[
                            ("content-type", "application/grpc"),
                            ("grpc-status", "5"),
                            ("grpc-message", "not here"),
                        ]));
                        r
                    } else {
                        let echoed = trailers
                            .as_ref()
                            .and_then(|t| t.get("x-request-trailer").cloned())
                            .unwrap_or(HeaderValue::from_static("none"));
                        let mut t = header_map(&[("grpc-status", "0")]);
                        t.insert("x-echoed", echoed);
                        Response::new(with_trailers(body, t))
                    };
                    Ok::<_, hyper::Error>(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc),
            );
        }
    });
    addr
}

/// Sends every request to the backend as HTTP/2; counts the connections it opens.
struct Http2Router {
    backend: SocketAddr,
    opens: Mutex<usize>,
}

impl l7::Router for Http2Router {
    type Ticket = ();

    fn decide(
        &self,
        _: &ferry_core::authz::HttpRequest<'_>,
        _: &[String],
    ) -> Result<l7::Choice<()>, l7::Refused> {
        Ok(l7::Choice {
            key: "grpc".into(),
            backend: "grpc".into(),
            route: None,
            timeout: None,
            retries: 0,
            protocol: HttpUpstream::Http2,
            headers: l7::HeaderEdits::default(),
            redirect: None,
            ticket: (),
        })
    }

    fn open(&self, _: &()) -> impl Future<Output = Result<l7::Link, ConnError>> + Send {
        *self.opens.lock() += 1;
        let addr = self.backend;
        async move {
            TcpStream::connect(addr)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(addr, e))
        }
    }
}

/// The filter on a loopback listener in front of an HTTP/2 backend: its address, the router
/// and what the backend saw.
async fn filter() -> (SocketAddr, Arc<Http2Router>, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = Arc::new(Http2Router {
        backend: backend(seen.clone()).await,
        opens: Mutex::new(0),
    });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let r = router.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let r = r.clone();
            tokio::spawn(l7::serve_routed(client, r, l7::Labels::default()));
        }
    });
    (addr, router, seen)
}

/// An HTTP/2 client (prior knowledge) of the filter at `addr`.
async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Body> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// A gRPC-looking POST to `path`, with a body and a trailer.
fn grpc_request(path: &str) -> Request<Body> {
    let mut req = Request::builder()
        .method("POST")
        .uri(format!("http://echo.default.svc{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(with_trailers(
            Bytes::from_static(b"ping"),
            header_map(&[("x-request-trailer", "from-the-client")]),
        ))
        .unwrap();
    *req.version_mut() = http::Version::HTTP_2;
    req
}

#[tokio::test]
async fn trailers_pass_both_ways_over_http2_to_the_backend() {
    let (addr, router, seen) = filter().await;
    let mut client = h2_client(addr).await;
    let resp = client.send_request(grpc_request("/echo")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = resp.into_body().collect().await.unwrap();
    let trailers = got.trailers().cloned().expect("the backend's trailers");
    assert_eq!(got.to_bytes(), "ping");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    // The request's trailer reached the backend, which sent it back in its own.
    assert_eq!(trailers.get("x-echoed").unwrap(), "from-the-client");
    let s = seen.lock()[0].clone();
    assert_eq!(s.version, http::Version::HTTP_2, "{s:?}");
    assert_eq!(s.authority.as_deref(), Some("echo.default.svc"), "{s:?}");
    assert_eq!(
        s.host, None,
        "HTTP/2 names the host in :authority only: {s:?}"
    );
    assert_eq!(s.te.as_ref().unwrap(), "trailers", "{s:?}");
    assert_eq!(s.body, "ping");
    assert_eq!(
        s.trailers.unwrap().get("x-request-trailer").unwrap(),
        "from-the-client"
    );
    assert_eq!(*router.opens.lock(), 1);
}

#[tokio::test]
async fn a_trailers_only_answer_arrives_as_headers_alone() {
    let (addr, _, _) = filter().await;
    let mut client = h2_client(addr).await;
    let resp = client
        .send_request(grpc_request("/trailers-only"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("grpc-status").unwrap(), "5");
    assert_eq!(resp.headers().get("grpc-message").unwrap(), "not here");
    let mut body = resp.into_body();
    // No data, no trailers: the stream ended with the headers.
    assert!(
        hyper::body::Body::is_end_stream(&body),
        "the answer's headers did not end the stream"
    );
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn requests_share_one_http2_connection_to_the_backend_even_at_once() {
    let (addr, router, seen) = filter().await;
    let mut client = h2_client(addr).await;
    let first = client.send_request(grpc_request("/echo")).await.unwrap();
    assert_eq!(first.status(), 200);
    // Two more at once: both on the connection the first one opened.
    let (a, b) = tokio::join!(
        client.clone().send_request(grpc_request("/echo")),
        client.send_request(grpc_request("/trailers-only")),
    );
    assert_eq!(a.unwrap().status(), 200);
    assert_eq!(b.unwrap().headers().get("grpc-status").unwrap(), "5");
    assert_eq!(seen.lock().len(), 3);
    assert_eq!(
        *router.opens.lock(),
        1,
        "one HTTP/2 connection to the backend"
    );
}

#[tokio::test]
async fn an_http1_client_is_sent_on_as_http2_with_its_host_as_the_authority() {
    let (addr, _, seen) = filter().await;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method("POST")
        .uri("/echo")
        .header("host", "echo.default.svc:80")
        .header("connection", "keep-alive")
        .body(Full::new(Bytes::from_static(b"over http/1.1")))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "over http/1.1");
    let s = seen.lock()[0].clone();
    assert_eq!(s.version, http::Version::HTTP_2, "{s:?}");
    assert_eq!(s.authority.as_deref(), Some("echo.default.svc:80"), "{s:?}");
    assert_eq!(s.host, None, "{s:?}");
    // The client did not ask for trailers: none asked of the backend either.
    assert_eq!(s.te, None, "{s:?}");
}
