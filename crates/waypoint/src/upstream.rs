//! Where each request of the waypoint's HTTP filter goes: a [`Router`] decides (route, backend,
//! endpoint, authorization, and whether the backend's port speaks HTTP/1.1 or HTTP/2) per
//! request; [`Upstreams`] keeps one downstream connection's upstream connections by backend,
//! so consecutive requests to one endpoint reuse a connection and requests to different
//! endpoints are balanced one by one: HTTP/1.1 connections carry one request at a time, one
//! HTTP/2 connection (prior knowledge, inside the tunnel) carries them all at once, bodies
//! streamed and trailers passed both ways. Deadlines and retries of idempotent requests that
//! failed before any response live here too.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::authz::HttpRequest;
pub use ferry_core::protocol::HttpUpstream;
use ferry_hbone::Side;
use ferry_hbone::copy::{self, Reset};
use ferry_hbone::upstream::Upstream;
use ferry_runtime::conn::{ConnError, Denial};
use http::{Method, Request, Response, StatusCode, Version, header};
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::replay::Replay;

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// A byte stream a waypoint carries a connection on to: TCP, a tunnel, or the inner tunnel of
/// double HBONE through another network's gateway.
pub trait Io: AsyncRead + AsyncWrite + Reset + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Reset + Send + Unpin> Io for T {}

/// An open [`Io`], whatever it is.
pub type Link = Box<dyn Io>;

/// Resolves, with the denial, once a policy change no longer allows an upgraded connection:
/// the connection then ends, both sides reset.
pub type Recheck = Pin<Box<dyn Future<Output = Denial> + Send>>;

/// Upstream connections kept per backend and downstream connection (more only while the ones
/// there are busy with requests of the same client).
const MAX_PER_BACKEND: usize = 4;

/// Why a request is not sent on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Authorization denied it: `403`.
    Denied(String),
    /// No route, backend or endpoint may take it (scope, health): `503`.
    Unroutable(String),
}

/// One request's destination.
#[derive(Clone, Debug)]
pub struct Choice<T> {
    /// Requests with the same key may share an upstream connection.
    pub key: String,
    /// The workload it lands on, for logs and metrics.
    pub backend: String,
    /// The HTTP route that matched, if any.
    pub route: Option<String>,
    /// Deadline for the response head.
    pub timeout: Option<Duration>,
    /// Further tries when it failed before a response (idempotent requests without a body).
    pub retries: u32,
    /// How the request goes on: as the backend's port declares.
    pub protocol: HttpUpstream,
    /// The route's edits of the request sent on and of the response returned, applied after
    /// this choice was made (the request was authorized as the client sent it).
    pub headers: crate::edit::HeaderEdits,
    /// The route's redirect: the waypoint answers the (authorized) request with it and
    /// connects to no backend.
    pub redirect: Option<crate::redirect::Redirect>,
    /// What [`Router::open`] needs to connect.
    pub ticket: T,
}

/// Decides and connects requests.
pub trait Router: Send + Sync + 'static {
    type Ticket: Send + Sync + 'static;

    /// Routes and authorizes one request; `avoid` holds keys of backends that failed it.
    fn decide(
        &self,
        req: &HttpRequest<'_>,
        avoid: &[String],
    ) -> Result<Choice<Self::Ticket>, Refused>;

    /// Opens a byte stream to a chosen backend.
    fn open(&self, ticket: &Self::Ticket) -> impl Future<Output = Result<Link, ConnError>> + Send;

    /// A request switched protocols: from now on its connection carries the upgraded stream,
    /// allowed as `req` was, until what this returns resolves (`req` judged again when the
    /// policy changes). By default, never.
    fn upgraded(&self, _ticket: &Self::Ticket, _req: &HttpRequest<'_>) -> Recheck {
        Box::pin(std::future::pending())
    }
}

/// Decides one request: `Err` carries the reason it was denied.
pub type RequestCheck = Arc<dyn Fn(&HttpRequest<'_>) -> Result<(), String> + Send + Sync>;

/// One upstream for every request, after a check: the filter without routing (tests, tools).
pub struct Fixed {
    upstream: parking_lot::Mutex<Option<Upstream>>,
    check: RequestCheck,
}

impl std::fmt::Debug for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixed").finish_non_exhaustive()
    }
}

impl Fixed {
    pub fn new(upstream: impl Into<Upstream>, check: RequestCheck) -> Self {
        Self {
            upstream: parking_lot::Mutex::new(Some(upstream.into())),
            check,
        }
    }
}

impl Router for Fixed {
    type Ticket = ();

    fn decide(&self, req: &HttpRequest<'_>, _avoid: &[String]) -> Result<Choice<()>, Refused> {
        (self.check)(req).map_err(Refused::Denied)?;
        Ok(Choice {
            key: "upstream".into(),
            backend: String::new(),
            route: None,
            timeout: None,
            retries: 0,
            protocol: HttpUpstream::Http1,
            headers: crate::edit::HeaderEdits::default(),
            redirect: None,
            ticket: (),
        })
    }

    fn open(&self, _: &()) -> impl Future<Output = Result<Link, ConnError>> + Send {
        let taken = self.upstream.lock().take();
        async move {
            taken.map(|u| Box::new(u) as Link).ok_or_else(|| {
                ConnError::io(
                    Side::Upstream,
                    "taking the one upstream connection",
                    std::io::ErrorKind::NotConnected.into(),
                )
            })
        }
    }
}

type Shared = Arc<tokio::sync::Mutex<SendRequest<Body>>>;

/// An HTTP/2 connection's handle: cloned for each request, which it carries as one stream.
type Http2 = hyper::client::conn::http2::SendRequest<Body>;

/// One backend's connections.
#[derive(Default)]
struct Conns {
    /// HTTP/1.1 connections, each carrying one request at a time.
    http1: Vec<Shared>,
    /// The HTTP/2 connection that carries every request at once.
    http2: Option<Http2>,
}

/// A connection a request is sent on.
enum Sender {
    /// Held for this request alone.
    Http1(tokio::sync::OwnedMutexGuard<SendRequest<Body>>),
    Http2(Http2),
}

/// One downstream connection's upstream connections, by backend key.
pub(crate) struct Upstreams {
    by_key: parking_lot::Mutex<HashMap<String, Conns>>,
    /// Upgraded connections being carried, each ending with how it failed (if it did): the
    /// client connection's serving waits for them.
    pub(crate) upgraded: parking_lot::Mutex<tokio::task::JoinSet<Option<ConnError>>>,
    /// Turns true at the drain deadline: upgraded connections end cleanly then.
    finish: Option<watch::Receiver<bool>>,
    /// Takes the client's own stream back from hyper once a request upgraded it.
    downstream: fn(hyper::upgrade::Upgraded) -> Option<Link>,
}

/// How sending one request failed. Nothing came back either way: the request may be tried
/// again if it is safe to.
enum SendError {
    /// No connection to the backend could be opened.
    Open(ConnError),
    /// The backend's HTTP connection failed while `doing` this.
    Http {
        doing: &'static str,
        source: hyper::Error,
    },
}

// === impl SendError ===

impl std::fmt::Display for SendError {
    /// The text the client's `502` says, and the access log's reason.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(e) => write!(f, "{}", e.kind),
            Self::Http { doing, source } => write!(f, "{doing}: {source}"),
        }
    }
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = self.by_key.lock();
        f.debug_map()
            .entries(
                map.iter()
                    .map(|(k, v)| (k, (v.http1.len(), v.http2.is_some()))),
            )
            .finish()
    }
}

impl Upstreams {
    pub(crate) fn new(
        finish: Option<watch::Receiver<bool>>,
        downstream: fn(hyper::upgrade::Upgraded) -> Option<Link>,
    ) -> Self {
        Self {
            by_key: parking_lot::Mutex::default(),
            upgraded: parking_lot::Mutex::default(),
            finish,
            downstream,
        }
    }

    /// A connection for `choice`: its backend's HTTP/2 connection while it is open, else a new
    /// one kept for the next requests.
    async fn http2_sender<R: Router>(
        &self,
        router: &R,
        choice: &Choice<R::Ticket>,
    ) -> Result<Http2, SendError> {
        let open = self
            .by_key
            .lock()
            .get(&choice.key)
            .and_then(|c| c.http2.clone())
            .filter(|s| !s.is_closed());
        if let Some(s) = open {
            return Ok(s);
        }
        let io = router.open(&choice.ticket).await.map_err(SendError::Open)?;
        let sender = http2(io).await.map_err(|source| SendError::Http {
            doing: "upstream HTTP/2 handshake",
            source,
        })?;
        self.by_key
            .lock()
            .entry(choice.key.clone())
            .or_default()
            .http2 = Some(sender.clone());
        Ok(sender)
    }

    /// A connection for `choice` that is free now, or a new one (kept for later requests below
    /// the limit, used once above it: a request never waits behind another's response).
    async fn sender<R: Router>(
        &self,
        router: &R,
        choice: &Choice<R::Ticket>,
    ) -> Result<Sender, SendError> {
        if choice.protocol == HttpUpstream::Http2 {
            return self.http2_sender(router, choice).await.map(Sender::Http2);
        }
        let keep = {
            let mut map = self.by_key.lock();
            let list = &mut map.entry(choice.key.clone()).or_default().http1;
            list.retain(|s| s.try_lock().map_or(true, |g| !g.is_closed()));
            if let Some(free) = list
                .iter()
                .find_map(|s| s.clone().try_lock_owned().ok().filter(|g| g.is_ready()))
            {
                return Ok(Sender::Http1(free));
            }
            list.len() < MAX_PER_BACKEND
        };
        let io = router.open(&choice.ticket).await.map_err(SendError::Open)?;
        let sender = http1(io).await.map_err(|source| SendError::Http {
            doing: "upstream handshake",
            source,
        })?;
        let shared: Shared = Arc::new(tokio::sync::Mutex::new(sender));
        // Nothing else has seen it yet: locked at once.
        let guard = shared.clone().lock_owned().await;
        if keep {
            self.by_key
                .lock()
                .entry(choice.key.clone())
                .or_default()
                .http1
                .push(shared);
        }
        Ok(Sender::Http1(guard))
    }

    /// Keeps `link`, already open to the backend `key` names, for the requests routed there
    /// (the connection a tunnel's decision opened before it was answered), speaking `protocol`.
    pub(crate) async fn adopt(&self, key: String, link: Link, protocol: HttpUpstream) {
        let adopted = match protocol {
            HttpUpstream::Http1 => {
                async {
                    let mut sender = http1(link).await?;
                    // Ready once its connection runs: the first request finds it free.
                    sender.ready().await?;
                    Ok::<_, hyper::Error>(Conns {
                        http1: vec![Arc::new(tokio::sync::Mutex::new(sender))],
                        http2: None,
                    })
                }
                .await
            }
            HttpUpstream::Http2 => http2(link).await.map(|h| Conns {
                http1: Vec::new(),
                http2: Some(h),
            }),
        };
        match adopted {
            Ok(conns) => {
                let mut map = self.by_key.lock();
                let kept = map.entry(key).or_default();
                kept.http1.extend(conns.http1);
                if conns.http2.is_some() {
                    kept.http2 = conns.http2;
                }
            }
            Err(e) => tracing::debug!(error = %e, "waypoint upstream handshake failed"),
        }
    }

    async fn send<R: Router>(
        &self,
        router: &R,
        choice: &Choice<R::Ticket>,
        req: Request<Body>,
    ) -> Result<Response<Body>, SendError> {
        let ready = |source| SendError::Http {
            doing: "upstream connection",
            source,
        };
        let sent = match self.sender(router, choice).await? {
            Sender::Http1(mut s) => {
                s.ready().await.map_err(ready)?;
                s.send_request(req).await
            }
            Sender::Http2(mut s) => {
                s.ready().await.map_err(ready)?;
                s.send_request(req).await
            }
        };
        match sent {
            Ok(resp) => Ok(resp.map(BodyExt::boxed)),
            Err(source) => Err(SendError::Http {
                doing: "upstream",
                source,
            }),
        }
    }
}

/// An HTTP/2 client connection (prior knowledge) on `io`, driven on its own task.
async fn http2(io: Link) -> Result<Http2, hyper::Error> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "waypoint upstream HTTP/2 connection ended");
        }
    });
    Ok(sender)
}

/// An HTTP/1.1 client connection on `io`, driven on its own task (upgrades allowed).
async fn http1(io: Link) -> Result<SendRequest<Body>, hyper::Error> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "waypoint upstream connection ended");
        }
    });
    Ok(sender)
}

/// What became of one request.
#[derive(Debug)]
pub(crate) struct Sent {
    pub response: Response<Body>,
    /// The backend that answered (or the last one tried).
    pub backend: String,
    pub route: Option<String>,
    /// Why it was refused or failed, for the access log.
    pub reason: Option<String>,
    /// Refused by authorization (not sent anywhere).
    pub denied: bool,
    pub tries: u32,
    /// How it went to the backend, if it went.
    pub protocol: Option<HttpUpstream>,
}

/// Decides, sends and (when safe) retries one request whose path and host are already in
/// normal form and judged facts are in `facts`.
pub(crate) async fn forward<R: Router>(
    router: &R,
    upstreams: &Upstreams,
    facts: &HttpRequest<'_>,
    req: Request<Body>,
) -> Sent {
    let mut req = req;
    // An HTTP/1.1 upgrade (WebSocket and the like): once the backend agrees (101), the two
    // connections are joined and carry bytes both ways (the request was judged as it came).
    let mut upgrade = is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    // Only a request that can be sent again unchanged is retried.
    let idempotent = matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    );
    let replayable = idempotent && hyper::body::Body::is_end_stream(&body);
    let mut body = Some(body);
    let mut avoid: Vec<String> = Vec::new();
    let mut tries = 0;
    loop {
        let choice = match router.decide(facts, &avoid) {
            Ok(c) => c,
            Err(refused) => {
                let (status, reason, denied) = match refused {
                    Refused::Denied(r) => (StatusCode::FORBIDDEN, r, true),
                    Refused::Unroutable(r) => (StatusCode::SERVICE_UNAVAILABLE, r, false),
                };
                let text = if denied {
                    "RBAC: access denied\n".to_string()
                } else {
                    format!("no healthy upstream: {reason}\n")
                };
                return Sent {
                    response: plain(status, &text),
                    backend: String::new(),
                    route: None,
                    reason: Some(reason),
                    denied,
                    tries,
                    protocol: None,
                };
            }
        };
        if let Some(redirect) = &choice.redirect {
            // Decided and authorized: answered here, no backend is opened.
            let (response, reason) = match redirect_response(redirect) {
                Ok(r) => (r, None),
                Err(r) => (r, Some("bad redirect location".to_string())),
            };
            return Sent {
                response,
                backend: String::new(),
                route: choice.route,
                reason,
                denied: false,
                tries,
                protocol: None,
            };
        }
        tries += 1;
        let mut request = Request::new(
            body.take()
                .unwrap_or_else(|| Empty::new().map_err(|never| match never {}).boxed()),
        );
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        let formed = match choice.protocol {
            HttpUpstream::Http1 => {
                strip_hop_by_hop(request.headers_mut(), upgrade.is_some());
                origin_form(request)
            }
            HttpUpstream::Http2 => {
                // No upgrade in HTTP/2: the backend answers the request as it is.
                upgrade = None;
                let trailers = accepts_trailers(request.headers());
                strip_hop_by_hop(request.headers_mut(), false);
                http2_form(request, trailers)
            }
        };
        let mut request = match formed {
            Ok(r) => r,
            Err((resp, why)) => {
                return Sent {
                    response: resp,
                    backend: choice.backend,
                    route: choice.route,
                    reason: Some(why.into()),
                    denied: false,
                    tries,
                    protocol: None,
                };
            }
        };
        // Edited only now: routing and authorization judged `facts`, what the client sent; and
        // after the request took the backend's form, so no edit is stripped as one the client's
        // `Connection` named.
        crate::edit::apply(request.headers_mut(), &choice.headers.request);
        let sending = upstreams.send(router, &choice, request);
        let outcome = match choice.timeout {
            Some(t) => tokio::time::timeout(t, sending).await.ok(),
            None => Some(sending.await),
        };
        let done = |response, reason| Sent {
            response,
            backend: choice.backend.clone(),
            route: choice.route.clone(),
            reason,
            denied: false,
            tries,
            protocol: Some(choice.protocol),
        };
        match outcome {
            Some(Ok(mut response)) => {
                crate::edit::apply(response.headers_mut(), &choice.headers.response);
                if let (Some(down), StatusCode::SWITCHING_PROTOCOLS) =
                    (upgrade.take(), response.status())
                {
                    let recheck = router.upgraded(&choice.ticket, facts);
                    let up = hyper::upgrade::on(&mut response);
                    let bounds = copy::Bounds {
                        finish: upstreams.finish.clone(),
                        ..waypoint_bounds()
                    };
                    let downstream = upstreams.downstream;
                    upstreams.upgraded.lock().spawn(async move {
                        match tokio::try_join!(down, up) {
                            Ok((d, u)) => carry_upgraded(downstream(d), u, bounds, recheck)
                                .await
                                .err(),
                            Err(e) => {
                                tracing::debug!(error = %e, "an upgrade did not complete");
                                None
                            }
                        }
                    });
                }
                return done(response, None);
            }
            None => {
                let why = format!(
                    "no response within {} ms",
                    choice.timeout.unwrap_or_default().as_millis()
                );
                return done(
                    plain(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout\n"),
                    Some(why),
                );
            }
            Some(Err(failed)) => {
                let why = failed.to_string();
                if replayable && tries <= choice.retries {
                    tracing::debug!(backend = %choice.backend, tries, error = %why, "retrying a request on another backend");
                    avoid.push(choice.key.clone());
                    continue;
                }
                return done(
                    plain(StatusCode::BAD_GATEWAY, &format!("{why}\n")),
                    Some(why),
                );
            }
        }
    }
}

/// Carries an upgraded connection as bytes, as every other copy: on a failure the side that
/// did not fail is reset; when `recheck` resolves (a policy change) both are; at the drain
/// deadline (`bounds.finish`) both end cleanly.
async fn carry_upgraded(
    down: Option<Link>,
    up: hyper::upgrade::Upgraded,
    bounds: copy::Bounds,
    recheck: Recheck,
) -> Result<(u64, u64), ConnError> {
    // Both sides as the streams they were before hyper took them (with what it read ahead),
    // so that they can be reset.
    let up = up
        .downcast::<TokioIo<Link>>()
        .ok()
        .map(|parts| Box::new(Replay::new(parts.read_buf, parts.io.into_inner())) as Link);
    let (Some(mut down), Some(mut up)) = (down, up) else {
        return Err(ConnError::io(
            Side::Local,
            "taking over an upgraded connection",
            std::io::Error::other("not the stream it was served on"),
        ));
    };
    copy::relay_until(&mut down, &mut up, bounds, recheck)
        .await
        .map_err(ConnError::from)
}

/// The bounds on bytes a waypoint carries as they are (L4 tunnels, upgraded connections): a
/// half-closed one that goes quiet ends after the default idle bound.
pub(crate) fn waypoint_bounds() -> ferry_hbone::copy::Bounds {
    ferry_hbone::copy::Bounds {
        half_closed_idle: ferry_hbone::settings::Settings::default().half_closed_idle,
        finish: None,
    }
}

/// Removes what belongs to one connection only (RFC 9110 §7.6.1): the headers `Connection`
/// names, and `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`.
/// An upgrade keeps `Connection: upgrade` and `Upgrade`, which the backend must see.
fn strip_hop_by_hop(headers: &mut http::HeaderMap, upgrade: bool) {
    let named: Vec<header::HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| header::HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        headers.remove(name);
    }
    headers.remove(header::CONNECTION);
    if upgrade {
        headers.insert(
            header::CONNECTION,
            header::HeaderValue::from_static("upgrade"),
        );
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// An HTTP/1.1 request asking to switch protocols (`Connection: upgrade` and `Upgrade`).
fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// A request that cannot be put in the form its backend needs: the client's answer, and the
/// access log's reason.
type Unformed = (Response<Body>, &'static str);

/// An absolute target (HTTP/2 always, HTTP/1.1 sometimes) goes on in origin form with its
/// authority as the only `host`: the host that was judged. Sent on as HTTP/1.1.
fn origin_form(mut req: Request<Body>) -> Result<Request<Body>, Unformed> {
    if let Some(authority) = req.uri().authority().cloned() {
        let v = header::HeaderValue::from_str(authority.as_str())
            .map_err(|_| unformed("bad authority"))?;
        req.headers_mut().insert(header::HOST, v);
        let target = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        *req.uri_mut() = target.parse().map_err(|_| unformed("bad request target"))?;
    }
    *req.version_mut() = Version::HTTP_11;
    Ok(req)
}

/// Sent on as HTTP/2: the target in absolute form, `http://<host><path>`, whose authority (the
/// `:authority`) is the host that was judged, and no `host` header; `te: trailers` (the only
/// `te` HTTP/2 allows, which gRPC servers may ask for) when the client sent it.
fn http2_form(mut req: Request<Body>, te_trailers: bool) -> Result<Request<Body>, Unformed> {
    let authority = match req.uri().authority() {
        Some(a) => a.clone(),
        None => {
            let host = req
                .headers()
                .get(header::HOST)
                .ok_or_else(|| unformed("the request names no host, which HTTP/2 needs"))?;
            http::uri::Authority::try_from(host.as_bytes()).map_err(|_| unformed("bad host"))?
        }
    };
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = http::Uri::builder()
        .scheme(http::uri::Scheme::HTTP)
        .authority(authority)
        .path_and_query(target)
        .build()
        .map_err(|_| unformed("bad request target"))?;
    req.headers_mut().remove(header::HOST);
    if te_trailers {
        req.headers_mut()
            .insert(header::TE, header::HeaderValue::from_static("trailers"));
    }
    *req.version_mut() = Version::HTTP_2;
    Ok(req)
}

/// `400` saying `why`.
fn unformed(why: &'static str) -> Unformed {
    (plain(StatusCode::BAD_REQUEST, &format!("{why}\n")), why)
}

/// The client says it accepts trailers (`te: trailers`).
fn accepts_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

pub(crate) fn plain(status: StatusCode, body: &str) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    resp
}

/// The response for `r`; a `400` when the request made no `Location`, or one that is no valid
/// header value (never a panic).
pub(crate) fn redirect_response(
    r: &crate::redirect::Redirect,
) -> Result<Response<Body>, Response<Body>> {
    let (Ok(status), Some(Ok(location))) = (
        StatusCode::from_u16(r.status),
        r.location.as_deref().map(header::HeaderValue::from_str),
    ) else {
        return Err(plain(StatusCode::BAD_REQUEST, "bad redirect location\n"));
    };
    let mut resp = plain(status, "");
    resp.headers_mut().remove(header::CONTENT_TYPE);
    resp.headers_mut().insert(header::LOCATION, location);
    Ok(resp)
}
