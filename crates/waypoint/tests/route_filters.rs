//! A service's HTTP routes at the waypoint's filter, over real loopback sockets: requests are
//! routed by method and by query parameter with Ferry's own matcher, a route's header edits
//! reach the backend (request) and the client (response), and a request is authorized on what
//! the client sent: a route's edit can neither grant nor dodge a policy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ferry_core::authz::HttpRequest;
use ferry_core::model::{HeaderModifier, HttpRoute, PathMatch, RouteBackend, RouteMatch};
use ferry_core::route::http::select;
use ferry_runtime::conn::ConnError;
use ferry_waypoint::l7;
use http::Response;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};

/// A backend that records `<backend> <method> <path?query>` and then every request header as
/// `name: value` (in the order received) for each request, and answers with `server: up`,
/// `x-up: 1` and `x-drop: yes`.
async fn backend(name: &'static str, seen: Arc<Mutex<Vec<Vec<String>>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let seen = seen.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let mut lines = vec![format!("{name} {} {}", req.method(), req.uri())];
                    lines.extend(
                        req.headers()
                            .iter()
                            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?"))),
                    );
                    seen.lock().push(lines);
                    async move {
                        let resp = Response::builder()
                            .header("server", "up")
                            .header("x-up", "1")
                            .header("x-drop", "yes")
                            .body(Full::new(Bytes::from(name)))
                            .unwrap();
                        Ok::<_, hyper::Error>(resp)
                    }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn pair(n: &str, v: &str) -> (String, String) {
    (n.into(), v.into())
}

fn route(name: &str, m: Option<RouteMatch>, to: &str) -> HttpRoute {
    HttpRoute {
        name: name.into(),
        matches: m.into_iter().collect(),
        backends: vec![RouteBackend {
            service: ferry_core::model::ServiceKey::new("default", to),
            port: None,
            subset: BTreeMap::new(),
            weight: 1,
        }],
        timeout_ms: 0,
        retries: 0,
        request_headers: Default::default(),
        response_headers: Default::default(),
        redirect: None,
    }
}

/// The routes under test, in order.
fn routes() -> Vec<HttpRoute> {
    let posts = route(
        "posts",
        Some(RouteMatch {
            method: Some("POST".into()),
            path: Some(PathMatch::Prefix("/orders".into())),
            ..RouteMatch::default()
        }),
        "b",
    );
    let mut v2 = route(
        "v2",
        Some(RouteMatch {
            query: vec![pair("v", "2")],
            ..RouteMatch::default()
        }),
        "b",
    );
    v2.request_headers = HeaderModifier {
        set: vec![pair("x-version", "2")],
        add: vec![pair("x-hop", "wp")],
        remove: vec!["x-debug".into()],
    }
    .into();
    v2.response_headers = HeaderModifier {
        set: vec![pair("server", "ferry")],
        add: vec![pair("x-route", "v2")],
        remove: vec!["x-drop".into()],
    }
    .into();
    // Would grant the policy's condition and dodge its denial, were edits made before it.
    let mut admin = route(
        "admin",
        Some(RouteMatch {
            path: Some(PathMatch::Prefix("/admin".into())),
            ..RouteMatch::default()
        }),
        "a",
    );
    admin.request_headers = HeaderModifier {
        set: vec![pair("x-user", "alice")],
        remove: vec!["x-block".into()],
        ..HeaderModifier::default()
    }
    .into();
    vec![posts, v2, admin, route("rest", None, "a")]
}

/// Routes as the waypoint's router does (Ferry's matcher, then the backend), then authorizes
/// the request as it came: under `/admin` only `x-user: alice`, and never with `x-block`.
struct Routed {
    routes: Vec<HttpRoute>,
    a: SocketAddr,
    b: SocketAddr,
}

impl l7::Router for Routed {
    type Ticket = SocketAddr;

    fn decide(
        &self,
        req: &HttpRequest<'_>,
        _avoid: &[String],
    ) -> Result<l7::Choice<SocketAddr>, l7::Refused> {
        let r = select(&self.routes, req).expect("the last route takes every request");
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
        };
        if req.path.starts_with("/admin")
            && (header("x-user") != Some("alice") || header("x-block").is_some())
        {
            return Err(l7::Refused::Denied("not alice, or blocked".into()));
        }
        let to = &r.backends[0].service.hostname;
        Ok(l7::Choice {
            key: to.clone(),
            backend: to.clone(),
            route: Some(r.name.clone()),
            timeout: None,
            retries: 0,
            protocol: l7::HttpUpstream::Http1,
            headers: l7::HeaderEdits {
                request: r.request_headers.clone(),
                response: r.response_headers.clone(),
            },
            redirect: None,
            ticket: if to == "b" { self.b } else { self.a },
        })
    }

    fn open(
        &self,
        addr: &SocketAddr,
    ) -> impl std::future::Future<Output = Result<l7::Link, ConnError>> + Send {
        let addr = *addr;
        async move {
            TcpStream::connect(addr)
                .await
                .map(|s| Box::new(s) as l7::Link)
                .map_err(|e| ConnError::connect(addr, e))
        }
    }
}

struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    seen: Arc<Mutex<Vec<Vec<String>>>>,
}

/// One client connection through the filter, in front of backends `a` and `b`.
async fn client() -> Client {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let a = backend("a", seen.clone()).await;
    let b = backend("b", seen.clone()).await;
    let router = Arc::new(Routed {
        routes: routes(),
        a,
        b,
    });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (c, _) = l.accept().await.unwrap();
        l7::serve_routed(c, router, l7::Labels::default()).await
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    Client { sender, seen }
}

impl Client {
    /// Sends one request; the response's status, headers and body.
    async fn send(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
    ) -> (u16, http::HeaderMap, String) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(target)
            .header("host", "shop");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        self.sender.ready().await.unwrap();
        let resp = self
            .sender
            .send_request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (
            parts.status.as_u16(),
            parts.headers,
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    /// The first line the backends recorded of each request: which backend, method, target.
    fn took(&self) -> Vec<String> {
        self.seen.lock().iter().map(|r| r[0].clone()).collect()
    }
}

#[tokio::test]
async fn requests_are_routed_by_method() {
    let mut c = client().await;
    assert_eq!(c.send("POST", "/orders/1", &[]).await.2, "b");
    assert_eq!(c.send("GET", "/orders/1", &[]).await.2, "a");
    assert_eq!(c.send("POST", "/other", &[]).await.2, "a");
    assert_eq!(
        c.took(),
        ["b POST /orders/1", "a GET /orders/1", "a POST /other"]
    );
}

#[tokio::test]
async fn requests_are_routed_by_query_parameter_decoded_on_its_first_value() {
    let mut c = client().await;
    for (target, want) in [
        ("/x?v=2", "b"),
        ("/x?a=1&%76=%32", "b"),
        ("/x?v=1&v=2", "a"),
        ("/x?v=2&v=1", "b"),
        ("/x?v=20", "a"),
        ("/x?V=2", "a"),
        ("/x", "a"),
    ] {
        assert_eq!(c.send("GET", target, &[]).await.2, want, "{target}");
    }
    // The query goes on as the client sent it.
    assert_eq!(c.took()[1], "b GET /x?a=1&%76=%32");
}

#[tokio::test]
async fn the_backend_sees_the_edited_request_and_the_client_the_edited_response() {
    let mut c = client().await;
    let (status, headers, body) = c
        .send(
            "GET",
            "/x?v=2",
            &[("x-version", "1"), ("x-debug", "on"), ("x-hop", "client")],
        )
        .await;
    assert_eq!((status, body.as_str()), (200, "b"));
    let got = c.seen.lock()[0].clone();
    let has = |line: &str| got.iter().filter(|l| *l == line).count();
    // Set replaced the client's value; add kept the client's and added one; remove removed.
    assert_eq!(has("x-version: 2"), 1, "{got:?}");
    assert_eq!(has("x-version: 1"), 0, "{got:?}");
    assert_eq!((has("x-hop: client"), has("x-hop: wp")), (1, 1), "{got:?}");
    assert!(!got.iter().any(|l| l.starts_with("x-debug")), "{got:?}");
    let values = |n: &str| -> Vec<&str> {
        headers
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(values("server"), ["ferry"]);
    assert_eq!(values("x-route"), ["v2"]);
    assert_eq!(values("x-up"), ["1"]);
    assert!(values("x-drop").is_empty());
    // A route without edits leaves both as they were.
    let (_, headers, _) = c.send("GET", "/x", &[("x-debug", "on")]).await;
    assert_eq!(headers.get("x-drop").unwrap(), "yes");
    assert!(c.seen.lock()[1].iter().any(|l| l == "x-debug: on"));
    // The client's `x-hop` was for its connection only and is not sent on; the route's is.
    c.send(
        "GET",
        "/x?v=2",
        &[("connection", "x-hop"), ("x-hop", "client")],
    )
    .await;
    let got = c.seen.lock()[2].clone();
    let hops: Vec<&String> = got.iter().filter(|l| l.starts_with("x-hop")).collect();
    assert_eq!(hops, ["x-hop: wp"], "{got:?}");
}

#[tokio::test]
async fn a_route_s_request_edit_cannot_change_the_authorization_outcome() {
    let mut c = client().await;
    // The route would set `x-user: alice`: the request is still judged without it.
    let (status, _, body) = c.send("GET", "/admin/users", &[]).await;
    assert_eq!(status, 403, "{body}");
    // The route would remove `x-block`: the request is still judged with it.
    let (status, _, body) = c
        .send(
            "GET",
            "/admin/users",
            &[("x-user", "alice"), ("x-block", "1")],
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(c.took().is_empty(), "denied requests never reach a backend");
    // Allowed as sent: then edited on its way.
    let (status, _, _) = c.send("GET", "/admin/users", &[("x-user", "alice")]).await;
    assert_eq!(status, 200);
    let got = c.seen.lock()[0].clone();
    assert_eq!(got[0], "a GET /admin/users");
    assert!(got.iter().any(|l| l == "x-user: alice"), "{got:?}");
}
