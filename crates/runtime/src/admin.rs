//! The admin endpoint every program serves: real HTTP/1.1 (hyper), one task per connection,
//! keep-alive, routes added by each program; plus what every admin endpoint shows the same way
//! (certificates, the metrics registry).
//!
//! A request hyper cannot parse gets its `400` (or `431` for oversized headers) and its
//! connection closed; a client that never finishes its headers is dropped after
//! [`HEADER_READ_TIMEOUT`]. Either way only that connection's task is involved.
//!
//! Every program also answers `/records`: its connection records ([`crate::records`]), JSON
//! lines, oldest first; `?since=MS` keeps those that ended at or after MS milliseconds since
//! the Unix epoch. `/records?follow=1` streams them instead (chunked, until the client goes
//! away): the kept records since MS first if `since` is given, then every record as it is
//! pushed, one JSON line each. A follower that fell too far behind gets `{"lagged":N}` (N
//! records it missed) and goes on; an empty line comes every [`FOLLOW_HEARTBEAT`] with
//! nothing else to say, which tells the client the endpoint is alive and the server that the
//! client is gone (its write fails), ending the stream's task.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use ferry_tls::certs::{CertManager, CertState};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::records::{Followed, Records};

/// How long a connection may take to send a request's headers.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of [`Response::metrics`]: the OpenMetrics text that `prometheus-client`
/// writes (counter families are typed without their `_total` suffix, the text ends in `# EOF`).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long the accept loop pauses after an accept error (out of descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// How often a stream of records with nothing new sends an empty line.
pub const FOLLOW_HEARTBEAT: Duration = Duration::from_secs(5);

/// The JSON lines of a stream of records waiting to be written, per follower: when the client
/// reads slower, the follower's records wait in the ring's channel and are missed from there.
const FOLLOW_LINES: usize = 64;

/// The body of every admin answer: whole, or a stream of records.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One admin answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

type Handler = Box<dyn Fn() -> Response + Send + Sync>;

/// The paths a program answers, each with its handler; any other path gets a `404` naming
/// the first path of each route.
pub struct Routes {
    routes: Vec<(&'static [&'static str], Handler)>,
    /// The ring served at `/records`: this process's unless a test says otherwise.
    records: &'static Records,
    /// How often a stream of records with nothing new sends an empty line.
    heartbeat: Duration,
}

/// What `/records` is asked: its query.
#[derive(Debug, Default, PartialEq, Eq)]
struct RecordsQuery {
    follow: bool,
    since_ms: Option<u64>,
}

/// A stream of records' lines, written as its task makes them; dropped when the client is
/// gone, which ends the task.
#[derive(Debug)]
struct Lines(mpsc::Receiver<Bytes>);

/// Serves `routes` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, routes: Routes) {
    let routes = Arc::new(routes);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let routes = routes.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: http::Request<_>| {
                std::future::ready(Ok::<_, Infallible>(routes.answer(req.uri())))
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                // A client may close its side once it has sent the request (`ferry lab
                // connect` does): it still gets the answer.
                .half_close(true)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(peer = %peer, error = %e, "admin connection ended with an error");
            }
        });
    }
}

/// A summary of every certificate: identity, state, expiry. Never key material.
pub fn cert_summary(certs: &CertManager) -> serde_json::Value {
    let now = std::time::SystemTime::now();
    certs
        .states()
        .into_iter()
        .map(|(id, st)| match st {
            CertState::Ready(i) => json!({"identity": id.to_string(), "state": "ready",
                "expires_in_s": i.not_after.duration_since(now).map(|d| d.as_secs()).unwrap_or(0)}),
            CertState::Pending => json!({"identity": id.to_string(), "state": "pending"}),
            CertState::Failed(e) => {
                json!({"identity": id.to_string(), "state": "failed", "error": e})
            }
        })
        .collect()
}

// === impl Response ===

impl Response {
    pub fn new(status: StatusCode, content_type: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
        }
    }

    /// `200` with `body`.
    pub fn ok(content_type: &'static str, body: impl Into<String>) -> Self {
        Self::new(StatusCode::OK, content_type, body)
    }

    /// `200` with every family of `registry` in OpenMetrics text.
    pub fn metrics(registry: &Registry) -> Self {
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, registry) {
            Ok(()) => Self::ok(OPENMETRICS, text),
            Err(e) => {
                tracing::warn!(error = %e, "metrics could not be encoded");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "metrics could not be encoded\n",
                )
            }
        }
    }

    fn into_http(self) -> http::Response<Body> {
        let mut r = http::Response::new(Full::new(Bytes::from(self.body)).boxed());
        *r.status_mut() = self.status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        r
    }
}

// === impl Routes ===

impl Default for Routes {
    fn default() -> Self {
        Self {
            routes: Vec::new(),
            records: crate::records::global(),
            heartbeat: FOLLOW_HEARTBEAT,
        }
    }
}

impl Routes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers each of `paths` (matched exactly, without the query) with `handler`.
    pub fn route(
        mut self,
        paths: &'static [&'static str],
        handler: impl Fn() -> Response + Send + Sync + 'static,
    ) -> Self {
        self.routes.push((paths, Box::new(handler)));
        self
    }

    /// Serves `records` at `/records` instead of this process's ring, streams with an empty
    /// line every `heartbeat` (tests).
    pub fn records(mut self, records: &'static Records, heartbeat: Duration) -> Self {
        self.records = records;
        self.heartbeat = heartbeat;
        self
    }

    /// The answer to a request for `path` (without its query): a route's, or `/records`
    /// whole, or a `404` naming the paths.
    pub fn respond(&self, path: &str) -> Response {
        self.respond_to(path, &RecordsQuery::default())
    }

    /// The answer to a request for `uri`: streamed for `/records?follow=1`, whole otherwise.
    pub fn answer(&self, uri: &http::Uri) -> http::Response<Body> {
        let path = uri.path();
        let is_route = self.routes.iter().any(|(ps, _)| ps.contains(&path));
        if is_route || path != "/records" {
            return self.respond(path).into_http();
        }
        match RecordsQuery::parse(uri.query().unwrap_or("")) {
            Ok(q) if q.follow => self.follow(q.since_ms),
            Ok(q) => self.respond_to(path, &q).into_http(),
            Err(e) => Response::new(StatusCode::BAD_REQUEST, "text/plain", e).into_http(),
        }
    }

    fn respond_to(&self, path: &str, query: &RecordsQuery) -> Response {
        if let Some((_, handler)) = self.routes.iter().find(|(ps, _)| ps.contains(&path)) {
            return handler();
        }
        if path == "/records" {
            let body = self.records.json_lines(query.since_ms.unwrap_or(0));
            return Response::ok("application/jsonl", body);
        }
        let mut body = String::from("paths:");
        for first in self.routes.iter().filter_map(|(ps, _)| ps.first()) {
            body.push(' ');
            body.push_str(first);
        }
        body.push_str(" /records");
        body.push('\n');
        Response::new(StatusCode::NOT_FOUND, "text/plain", body)
    }

    /// `/records?follow=1`: subscribes now, then a task writes the backlog and every record
    /// pushed, until the client is gone (the body dropped: the next line or heartbeat fails).
    fn follow(&self, since_ms: Option<u64>) -> http::Response<Body> {
        let (backlog, mut follower) = self.records.follow(since_ms);
        let (tx, rx) = mpsc::channel(FOLLOW_LINES);
        let heartbeat = self.heartbeat;
        tokio::spawn(async move {
            for r in backlog {
                if tx.send(json_line(&r)).await.is_err() {
                    return;
                }
            }
            // The first tick is at once: the answer's head goes out with it.
            let mut beat = tokio::time::interval(heartbeat);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let line = tokio::select! {
                    next = follower.next() => match next {
                        Some(Followed::Record(r)) => {
                            beat.reset();
                            json_line(&r)
                        }
                        Some(Followed::Lagged(n)) => Bytes::from(format!("{{\"lagged\":{n}}}\n")),
                        None => return,
                    },
                    _ = beat.tick() => Bytes::from_static(b"\n"),
                    () = tx.closed() => return,
                };
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        });
        let mut r = http::Response::new(Lines(rx).boxed());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/jsonl"));
        r
    }
}

/// One record as a JSON line (an empty line if it could not be written, which cannot happen
/// for a struct of strings and numbers).
fn json_line(r: &crate::records::Record) -> Bytes {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|(ps, _)| ps))
            .finish()
    }
}

// === impl RecordsQuery ===

impl RecordsQuery {
    /// `follow=1` (or `true`) and `since=MS`; other parameters are ignored.
    fn parse(query: &str) -> Result<Self, String> {
        let mut q = Self::default();
        for (k, v) in query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
        {
            match k {
                "follow" => q.follow = !matches!(v, "0" | "false"),
                "since" => {
                    let ms = v.parse().map_err(|_| {
                        format!("since: milliseconds since the Unix epoch, not {v:?}\n")
                    })?;
                    q.since_ms = Some(ms);
                }
                _ => {}
            }
        }
        Ok(q)
    }
}

// === impl Lines ===

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|l| Ok(Frame::data(l))))
    }
}

#[cfg(test)]
mod tests;
