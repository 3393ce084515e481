//! A route's redirect at the waypoint, over real loopback sockets with the real router: an
//! authorized request is answered 301/302 with the exact `Location` and no backend is opened;
//! a denied one gets its 403, not the redirect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use ferry_core::authz::HttpRequest;
use ferry_core::route::Plan;
use ferry_hbone::Side;
use ferry_runtime::conn::ConnError;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::tests::router;
use super::*;
use crate::l7::{self, Link};

/// The tunnel router, counting the backends it is asked to open (and opening none: a request
/// that gets that far is answered 502).
struct Counting {
    inner: TunnelRouter,
    opened: Arc<AtomicUsize>,
}

impl Router for Counting {
    type Ticket = Plan;

    fn decide(&self, req: &HttpRequest<'_>, avoid: &[String]) -> Result<Choice<Plan>, Refused> {
        self.inner.decide(req, avoid)
    }

    fn open(&self, _: &Plan) -> impl std::future::Future<Output = Result<Link, ConnError>> + Send {
        self.opened.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err(ConnError::io(
            Side::Upstream,
            "opening a backend in a test",
            std::io::ErrorKind::ConnectionRefused.into(),
        )))
    }
}

/// One HTTP/1.1 client connection through the filter with the real router.
async fn client(opened: Arc<AtomicUsize>) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let router = Arc::new(Counting {
        inner: router(),
        opened,
    });
    tokio::spawn(async move {
        let (c, _) = l.accept().await.unwrap();
        l7::serve_routed(c, router, l7::Labels::default()).await
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// Status, `Location`, `x-route` and body of one GET.
async fn get(
    c: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Option<String>, String) {
    let mut req = http::Request::builder()
        .uri(target)
        .header("host", "shop.default.svc.cluster.local");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = c
        .send_request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (location, route) = (header("location"), header("x-route"));
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        location,
        route,
        String::from_utf8_lossy(&body).into(),
    )
}

#[tokio::test]
async fn an_authorized_request_is_redirected_without_a_backend_and_a_denied_one_gets_403() {
    let opened = Arc::new(AtomicUsize::new(0));
    let mut c = client(opened.clone()).await;
    // ReplacePrefixMatch, segment-wise, the query kept; port 80 (http's) left out.
    let (status, location, route, body) = get(&mut c, "/old/a/b?x=1&y=%20", &[]).await;
    assert_eq!(status, 301);
    assert_eq!(
        location.as_deref(),
        Some("http://shop.default.svc.cluster.local/new/a/b?x=1&y=%20")
    );
    // A redirect is the waypoint's own answer: the route's response edits do not apply.
    assert_eq!(route, None);
    assert_eq!(body, "");
    // Scheme and hostname set: https's port left out, the default status 302.
    let (status, location, ..) = get(&mut c, "/login?next=%2F", &[]).await;
    assert_eq!(status, 302);
    assert_eq!(
        location.as_deref(),
        Some("https://login.example/login?next=%2F")
    );
    assert_eq!(
        opened.load(Ordering::SeqCst),
        0,
        "a redirect opened a backend"
    );
    // Denied by the DENY policy on `x-block`: the 403, not the redirect.
    let (status, location, ..) = get(&mut c, "/old/a", &[("x-block", "1")]).await;
    assert_eq!(status, 403);
    assert_eq!(location, None);
    assert_eq!(opened.load(Ordering::SeqCst), 0);
    // A request the redirects do not match goes to a backend: the counter sees it.
    let (status, location, ..) = get(&mut c, "/shop", &[]).await;
    assert_ne!(status, 301);
    assert_eq!(location, None);
    assert_eq!(opened.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_router_decides_a_redirect_only_for_an_allowed_request() {
    let r = router();
    let req = HttpRequest {
        method: "GET",
        path: "/old",
        query: "",
        host: "shop.default.svc.cluster.local:80",
        headers: &[],
    };
    let choice = r.decide(&req, &[]).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(choice.route.as_deref(), Some("moved"));
    assert_eq!(
        choice.redirect,
        Some(crate::redirect::Redirect {
            status: 301,
            location: Some("http://shop.default.svc.cluster.local/new".into()),
        })
    );
    let blocked = HttpRequest {
        headers: &[("x-block", "1")],
        ..req
    };
    assert!(matches!(r.decide(&blocked, &[]), Err(Refused::Denied(_))));
}

#[test]
fn a_request_that_made_no_location_is_answered_400() {
    let r = crate::redirect::Redirect {
        status: 302,
        location: None,
    };
    let answer =
        crate::upstream::redirect_response(&r).expect_err("no redirect without a Location");
    assert_eq!(answer.status(), http::StatusCode::BAD_REQUEST);
    assert!(answer.headers().get(http::header::LOCATION).is_none());
}
