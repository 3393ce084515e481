//! The admin endpoint every program serves: real HTTP/1.1 (hyper), one task per connection,
//! keep-alive, routes added by each program; plus what every admin endpoint shows the same way
//! (certificates, the metrics registry).
//!
//! A request hyper cannot parse gets its `400` (or `431` for oversized headers) and its
//! connection closed; a client that never finishes its headers is dropped after
//! [`HEADER_READ_TIMEOUT`]. Either way only that connection's task is involved.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_tls::certs::{CertManager, CertState};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;

/// How long a connection may take to send a request's headers.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of [`Response::metrics`]: the OpenMetrics text that `prometheus-client`
/// writes (counter families are typed without their `_total` suffix, the text ends in `# EOF`).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long the accept loop pauses after an accept error (out of descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

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
#[derive(Default)]
pub struct Routes {
    routes: Vec<(&'static [&'static str], Handler)>,
}

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
                let answer = routes.respond(req.uri().path());
                std::future::ready(Ok::<_, Infallible>(answer.into_http()))
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

    fn into_http(self) -> http::Response<Full<Bytes>> {
        let mut r = http::Response::new(Full::new(Bytes::from(self.body)));
        *r.status_mut() = self.status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        r
    }
}

// === impl Routes ===

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

    /// The answer to a request for `path`. Every program also answers `/records`: its
    /// connection records, JSON lines, oldest first ([`crate::records`]).
    pub fn respond(&self, path: &str) -> Response {
        if let Some((_, handler)) = self.routes.iter().find(|(ps, _)| ps.contains(&path)) {
            return handler();
        }
        if path == "/records" {
            return Response::ok("application/jsonl", crate::records::global().json_lines());
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
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|(ps, _)| ps))
            .finish()
    }
}
