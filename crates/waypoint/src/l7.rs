//! The waypoint's HTTP filter. The client's first bytes tell HTTP (HTTP/1.1, or HTTP/2 with
//! prior knowledge) from anything else. HTTP: every request is authorized on its own, with its
//! method, path and host, before it is sent on (as HTTP/2 to a port that declares `http2` or
//! `grpc`, else as HTTP/1.1); a denied request gets `403` and the connection stays usable. Anything else: the connection is authorized once at L4, where a DENY
//! that names HTTP facts holds on its other fields (fail closed), and carried as bytes.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ferry_core::authz::HttpRequest;
use ferry_hbone::Side;
use ferry_runtime::conn::{ConnError, Denial};
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub use crate::edit::HeaderEdits;
pub use crate::redirect::Redirect;
pub use crate::replay::Replay;
pub use crate::upstream::{
    Choice, Fixed, HttpUpstream, Io, Link, Recheck, Refused, RequestCheck, Router,
};
use crate::upstream::{Upstreams, plain};

/// What each request's access-log line names.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// The original source (the tunnel's mutual-TLS peer), not this waypoint.
    pub src_identity: String,
    pub dst_workload: String,
    /// Where each request is counted, if anywhere.
    pub metrics: Option<Arc<crate::metrics::RequestMetrics>>,
}

/// What happened on one connection, for the access log.
#[derive(Debug, Default)]
pub struct Outcome {
    pub allowed: u64,
    pub denied: u64,
    /// Why the connection ended early, if it did: which side failed, and how.
    pub error: Option<ConnError>,
}

/// Serves HTTP from `client` with one upstream for every request allowed by `check`.
pub async fn serve<C>(
    client: C,
    upstream: impl Into<ferry_hbone::upstream::Upstream>,
    check: RequestCheck,
    labels: Labels,
) -> Outcome
where
    C: Io + 'static,
{
    serve_routed(client, Arc::new(Fixed::new(upstream, check)), labels).await
}

/// Serves HTTP/1.1 or HTTP/2 (prior knowledge) from `client`: each request is put in normal
/// form, then routed and authorized by `router` on its own, and sent on as the router's
/// [`Choice::protocol`] says.
pub async fn serve_routed<C, R>(client: C, router: Arc<R>, labels: Labels) -> Outcome
where
    C: Io + 'static,
    R: Router,
{
    serve_routed_until(client, router, labels, None).await
}

/// [`serve_routed`], ended gracefully when `finish` turns true (a drain deadline): HTTP/2 gets a
/// GOAWAY and its streams finish, HTTP/1.1 closes once the response in flight is sent (at once
/// if none is); upgraded connections end cleanly (FIN both ways).
pub async fn serve_routed_until<C, R>(
    client: C,
    router: Arc<R>,
    labels: Labels,
    finish: Option<tokio::sync::watch::Receiver<bool>>,
) -> Outcome
where
    C: Io + 'static,
    R: Router,
{
    serve_routed_seeded(client, router, labels, finish, None).await
}

/// The far side a tunnel's decision named, opened before the tunnel was answered (a tunnel is
/// answered `200` only once its upstream is connected): carried at L4 if the client turns out
/// not to speak HTTP; for HTTP, the connection to the backend `key` names, used by the requests
/// the router sends there (requests routed elsewhere open their own).
pub(crate) struct Dialed {
    /// The router's key for that backend ([`Choice::key`]).
    pub(crate) key: String,
    pub(crate) link: Link,
    /// What HTTP speaks on it ([`Choice::protocol`]).
    pub(crate) protocol: HttpUpstream,
}

impl std::fmt::Debug for Dialed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialed")
            .field("key", &self.key)
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// [`serve_routed_until`], with a connection to one backend already open (`seed`).
async fn serve_routed_seeded<C, R>(
    client: C,
    router: Arc<R>,
    labels: Labels,
    finish: Option<tokio::sync::watch::Receiver<bool>>,
    seed: Option<Dialed>,
) -> Outcome
where
    C: Io + 'static,
    R: Router,
{
    let upstreams = Arc::new(Upstreams::new(finish.clone(), take_back::<C>));
    if let Some(d) = seed {
        upstreams.adopt(d.key, d.link, d.protocol).await;
    }
    let counts = Arc::new(parking_lot::Mutex::new((0u64, 0u64)));
    let svc = {
        let counts = counts.clone();
        let upstreams = upstreams.clone();
        let labels = Arc::new(labels);
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (router, upstreams, counts, labels) = (
                router.clone(),
                upstreams.clone(),
                counts.clone(),
                labels.clone(),
            );
            async move {
                let started = Instant::now();
                // The path is judged, routed and sent on in one normal form, so the app cannot
                // be reached at a path the policy did not see (`/x/../admin`, `/%61dmin`).
                let path = match normalize_path(req.uri().path()) {
                    Ok(p) => p,
                    Err(why) => {
                        counts.lock().1 += 1;
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %labels.dst_workload, http.method = %req.method(), reason = why, "waypoint refused a request path");
                        return Ok(plain(StatusCode::BAD_REQUEST, &format!("{why}\n")));
                    }
                };
                let mut req = req;
                if path != req.uri().path() {
                    let target = match req.uri().query() {
                        Some(q) => format!("{path}?{q}"),
                        None => path.clone(),
                    };
                    let mut parts = req.uri().clone().into_parts();
                    match target.parse() {
                        Ok(pq) => parts.path_and_query = Some(pq),
                        Err(_) => {
                            return Ok(plain(StatusCode::BAD_REQUEST, "bad request target\n"));
                        }
                    }
                    match http::Uri::from_parts(parts) {
                        Ok(uri) => *req.uri_mut() = uri,
                        Err(_) => {
                            return Ok(plain(StatusCode::BAD_REQUEST, "bad request target\n"));
                        }
                    }
                }
                let method = req.method().clone();
                // One host, the one the app will see (sent on as the only `host`).
                let host = match request_host(&req) {
                    Ok(h) => h,
                    Err(why) => {
                        counts.lock().1 += 1;
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %labels.dst_workload, http.method = %method, reason = why, "waypoint refused a request host");
                        return Ok(plain(StatusCode::BAD_REQUEST, &format!("{why}\n")));
                    }
                };
                // `http` keeps header names in lower case; a value that is not text is read
                // lossily, so it can still match (presence, prefixes) and a DENY on it cannot
                // be dodged with odd bytes.
                let header_map = req.headers().clone();
                let values: Vec<(&str, std::borrow::Cow<'_, str>)> = header_map
                    .iter()
                    .map(|(n, v)| (n.as_str(), String::from_utf8_lossy(v.as_bytes())))
                    .collect();
                let headers: Vec<(&str, &str)> =
                    values.iter().map(|(n, v)| (*n, v.as_ref())).collect();
                // Routes match on the query; cloning the target shares its bytes.
                let target = req.uri().clone();
                let facts = HttpRequest {
                    method: method.as_str(),
                    path: &path,
                    query: target.query().unwrap_or(""),
                    host: &host,
                    headers: &headers,
                };
                let kind = crate::metrics::request_protocol(&header_map);
                let req = req.map(BodyExt::boxed);
                let sent = crate::upstream::forward(&*router, &upstreams, &facts, req).await;
                if sent.denied {
                    counts.lock().1 += 1;
                } else {
                    counts.lock().0 += 1;
                }
                let resp = sent.response;
                let backend = if sent.backend.is_empty() {
                    labels.dst_workload.as_str()
                } else {
                    sent.backend.as_str()
                };
                let (status, ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
                if let Some(m) = &labels.metrics {
                    m.record(
                        status,
                        kind,
                        &labels.src_identity,
                        backend,
                        started.elapsed().as_secs_f64() * 1e3,
                    );
                }
                let route = sent.route.as_deref().unwrap_or("");
                let upstream = sent.protocol.map_or("", HttpUpstream::as_str);
                match (&sent.reason, sent.denied) {
                    (Some(reason), true) => {
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %backend, http.method = %method, http.path = %path, http.status = status, duration_ms = ms, reason = %reason, "waypoint denied the request")
                    }
                    (reason, _) => {
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %backend, http.route = %route, http.method = %method, http.path = %path, http.status = status, request_protocol = kind, upstream.protocol = upstream, duration_ms = ms, tries = sent.tries, reason = %reason.as_deref().unwrap_or(""), "request")
                    }
                }
                Ok::<_, hyper::Error>(resp)
            }
        })
    };
    // HTTP/1.1, or HTTP/2 with prior knowledge (told apart by the connection preface).
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Clients may close their side once the last request is sent.
    builder
        .http1()
        .half_close(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(30));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(client), svc);
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = finished(finish) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    // An upgraded connection outlives the HTTP exchange that started it: serving ends with it.
    let mut upgraded = std::mem::take(&mut *upstreams.upgraded.lock());
    let mut upgrade_error = None;
    while let Some(ended) = upgraded.join_next().await {
        if let Ok(Some(e)) = ended {
            upgrade_error.get_or_insert(e);
        }
    }
    let (allowed, denied) = *counts.lock();
    let served = served.err().map(|e| {
        ConnError::io(
            Side::Downstream,
            "serving HTTP to the client",
            std::io::Error::other(e),
        )
    });
    Outcome {
        allowed,
        denied,
        error: served.or(upgrade_error),
    }
}

/// Resolves once `finish` turns true; never without one (or once its sender is gone).
async fn finished(finish: Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(mut rx) = finish
        && rx.wait_for(|v| *v).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// The client's own stream (`C`), with what hyper read ahead, taken back from an upgrade.
fn take_back<C: Io + 'static>(upgraded: hyper::upgrade::Upgraded) -> Option<Link> {
    let parts = hyper_util::server::conn::auto::upgrade::downcast::<TokioIo<C>>(upgraded).ok()?;
    Some(Box::new(Replay::new(parts.read_buf, parts.io.into_inner())))
}

/// The request's host, in lower case: the target's authority if it has one, else its one
/// `host` header (none: empty, as HTTP/1.0 allows). Several `host` headers, or one that is not
/// text, are refused.
pub fn request_host<B>(req: &Request<B>) -> Result<String, &'static str> {
    if let Some(a) = req.uri().authority() {
        return Ok(a.as_str().to_ascii_lowercase());
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => Ok(String::new()),
        (Some(_), Some(_)) => Err("the request has several host headers"),
        (Some(h), None) => h
            .to_str()
            .map(str::to_ascii_lowercase)
            .map_err(|_| "the request's host header is not text"),
    }
}

/// How long a connection may stay silent before it is taken for a server-first protocol.
pub const SNIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What the first bytes of a connection say it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// An HTTP/1 request line, or the HTTP/2 connection preface.
    Http,
    /// Anything else: carried at L4.
    Other,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";
/// Longer than any method a real client sends; a longer first token is not HTTP.
const MAX_METHOD: usize = 20;

/// Classifies the first bytes of a connection; `None` while more bytes are needed.
pub fn sniff(head: &[u8]) -> Option<Sniffed> {
    let n = head.len().min(H2_PREFACE.len());
    if head[..n] == H2_PREFACE[..n] {
        return (n == H2_PREFACE.len()).then_some(Sniffed::Http);
    }
    for (i, b) in head.iter().enumerate() {
        match b {
            b'A'..=b'Z' if i < MAX_METHOD => {}
            b' ' if i > 0 => return Some(Sniffed::Http),
            _ => return Some(Sniffed::Other),
        }
    }
    if head.len() < MAX_METHOD {
        None
    } else {
        Some(Sniffed::Other)
    }
}

/// Tells HTTP from anything else by the client's first bytes: HTTP is routed and judged
/// request by request ([`serve_routed`]); anything else is carried at L4 (to what `open_l4`
/// connects) if `l4` (the connection-level policy check) allows it. The client must speak
/// first; a server-first protocol waits here.
pub async fn serve_detected<C, R>(
    client: C,
    router: Arc<R>,
    open_l4: impl std::future::Future<Output = Result<Link, ConnError>>,
    l4: impl FnOnce() -> Result<(), ConnError>,
    labels: Labels,
) -> Outcome
where
    C: Io + 'static,
    R: Router,
{
    let l4 = move || l4().map(|()| std::future::pending::<Denial>());
    serve_sniffed(client, router, Far::Lazy(open_l4), l4, labels, None).await
}

/// [`serve_detected`] for a tunnel whose far side is already open ([`Dialed`]): carried there
/// at L4, or, for HTTP, the first connection of the backend it leads to. Ended as every other
/// copy is: `l4`, when it allows the connection, gives the future that resolves once a policy
/// change no longer does (the L4 copy then ends, both sides reset); when `finish` turns true (a
/// drain deadline), HTTP ends gracefully ([`serve_routed_until`]) and the L4 copy cleanly (FIN
/// both ways).
pub(crate) async fn serve_dialed_until<C, R, U>(
    client: C,
    router: Arc<R>,
    dialed: Dialed,
    l4: impl FnOnce() -> Result<U, ConnError>,
    labels: Labels,
    finish: Option<tokio::sync::watch::Receiver<bool>>,
) -> Outcome
where
    C: Io + 'static,
    R: Router,
    U: std::future::Future<Output = Denial>,
{
    let far = Far::<std::future::Pending<Result<Link, ConnError>>>::Dialed(dialed);
    serve_sniffed(client, router, far, l4, labels, finish).await
}

/// Where a connection that is not HTTP goes: opened when it is known not to be, or already.
enum Far<F> {
    Lazy(F),
    Dialed(Dialed),
}

async fn serve_sniffed<C, R, U, F>(
    mut client: C,
    router: Arc<R>,
    far: Far<F>,
    l4: impl FnOnce() -> Result<U, ConnError>,
    labels: Labels,
    finish: Option<tokio::sync::watch::Receiver<bool>>,
) -> Outcome
where
    C: Io + 'static,
    R: Router,
    U: std::future::Future<Output = Denial>,
    F: std::future::Future<Output = Result<Link, ConnError>>,
{
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(64);
    let sniffing = async {
        loop {
            if let Some(kind) = sniff(&head) {
                return Ok(kind);
            }
            let mut b = [0u8; 64];
            match client.read(&mut b).await {
                Ok(0) => return Ok(Sniffed::Other),
                Ok(n) => head.extend_from_slice(&b[..n]),
                Err(e) => return Err(e),
            }
        }
    };
    // A client that says nothing (a server-first protocol) is carried at L4 after a moment.
    let kind = match tokio::time::timeout(SNIFF_TIMEOUT, sniffing).await {
        Ok(Ok(kind)) => kind,
        Ok(Err(e)) => {
            return Outcome {
                error: Some(ConnError::io(
                    Side::Downstream,
                    "reading the client's first bytes",
                    e,
                )),
                ..Outcome::default()
            };
        }
        Err(_) => Sniffed::Other,
    };
    let mut client = Replay::new(Bytes::from(head), client);
    match kind {
        Sniffed::Http => {
            let seed = match far {
                Far::Dialed(d) => Some(d),
                Far::Lazy(_) => None,
            };
            serve_routed_seeded(client, router, labels, finish, seed).await
        }
        Sniffed::Other => match l4() {
            Err(e) => {
                tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %labels.dst_workload, reason = %e.kind, error.side = ferry_runtime::conn::side_name(e.side), response_flags = e.flag.as_str(), "waypoint denied a connection that is not HTTP");
                Outcome {
                    denied: 1,
                    error: Some(e),
                    ..Outcome::default()
                }
            }
            Ok(until) => {
                let upstream = match far {
                    Far::Lazy(open) => open.await,
                    Far::Dialed(d) => Ok(d.link),
                };
                match upstream {
                    Err(e) => Outcome {
                        error: Some(e),
                        ..Outcome::default()
                    },
                    // On an error, the side that did not fail is reset; on a policy change, both.
                    Ok(mut upstream) => Outcome {
                        error: ferry_hbone::copy::relay_until(
                            &mut client,
                            &mut upstream,
                            ferry_hbone::copy::Bounds {
                                finish,
                                ..crate::upstream::waypoint_bounds()
                            },
                            until,
                        )
                        .await
                        .err()
                        .map(ConnError::from),
                        ..Outcome::default()
                    },
                }
            }
        },
    }
}

/// The normal form of a request path, as Istio's `BASE` normalization plus merged slashes:
/// percent-encoded unreserved characters decoded, `.` and `..` segments resolved, runs of `/`
/// merged. Encoded or raw backslashes and encoded slashes are refused (an app may read them as
/// separators), as are broken escapes.
pub fn normalize_path(path: &str) -> Result<String, &'static str> {
    if path == "*" {
        return Ok(path.to_string());
    }
    if !path.starts_with('/') {
        return Err("the request path must start with /");
    }
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return Err("the request path holds a backslash"),
            b'%' => {
                let hex = |b: u8| (b as char).to_digit(16);
                let (Some(h), Some(l)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err("the request path holds a broken %-escape");
                };
                let c = (h * 16 + l) as u8;
                match c {
                    b'/' | b'\\' => return Err("the request path holds an encoded slash"),
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        decoded.push(c as char)
                    }
                    _ => {
                        decoded.push('%');
                        decoded.push_str(&format!("{c:02X}"));
                    }
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        // Bytes other than `%` and `\` are copied as they are (whole UTF-8 sequences).
        let next = bytes[i + 1..]
            .iter()
            .position(|b| *b == b'%' || *b == b'\\')
            .map_or(bytes.len(), |p| i + 1 + p);
        decoded.push_str(&path[i..next]);
        i = next;
    }
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    let mut norm = String::with_capacity(decoded.len());
    for seg in &out {
        norm.push('/');
        norm.push_str(seg);
    }
    if norm.is_empty() || trailing {
        norm.push('/');
    }
    Ok(norm)
}
