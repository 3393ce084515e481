//! The waypoint's HTTP/1 filter: every request on a tunnel is authorized on its own, with the
//! request's method, path and host, before it is sent on. A denied request gets `403` and the
//! connection stays usable; bytes that are not HTTP/1 end the connection (fail closed: a
//! destination with HTTP rules is never reached by traffic the rules could not be checked on).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ferry_core::authz::HttpRequest;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// Decides one request: `Err` carries the reason it was denied.
pub type RequestCheck = Arc<dyn Fn(&HttpRequest<'_>) -> Result<(), String> + Send + Sync>;

type Body = BoxBody<Bytes, hyper::Error>;

/// What each request's access-log line names.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// The original source (the tunnel's mutual-TLS peer), not this waypoint.
    pub src_identity: String,
    pub dst_workload: String,
}

/// What happened on one connection, for the access log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: u64,
    pub denied: u64,
    /// Why the connection ended early, if it did.
    pub error: Option<String>,
}

/// Serves HTTP/1 from `client`, sending each allowed request on to `upstream` (one upstream
/// connection, requests in order).
pub async fn serve<C, U>(client: C, upstream: U, check: RequestCheck, labels: Labels) -> Outcome
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
        Ok(pair) => pair,
        Err(e) => {
            return Outcome {
                error: Some(format!("upstream: {e}")),
                ..Outcome::default()
            };
        }
    };
    let upstream_task = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "waypoint upstream connection ended");
        }
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let counts = Arc::new(parking_lot::Mutex::new((0u64, 0u64)));
    let svc = {
        let counts = counts.clone();
        let labels = Arc::new(labels);
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let (sender, check, counts, labels) = (
                sender.clone(),
                check.clone(),
                counts.clone(),
                labels.clone(),
            );
            async move {
                let started = Instant::now();
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                let verdict = {
                    let host = req
                        .headers()
                        .get(header::HOST)
                        .and_then(|v| v.to_str().ok())
                        .or_else(|| req.uri().host())
                        .unwrap_or("");
                    check(&HttpRequest {
                        method: method.as_str(),
                        path: &path,
                        host,
                    })
                };
                let resp = match &verdict {
                    Err(_) => {
                        counts.lock().1 += 1;
                        plain(StatusCode::FORBIDDEN, "RBAC: access denied\n")
                    }
                    Ok(()) => {
                        counts.lock().0 += 1;
                        forward(&sender, req).await
                    }
                };
                let (status, ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
                match verdict {
                    Err(reason) => {
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %labels.dst_workload, http.method = %method, http.path = %path, http.status = status, duration_ms = ms, reason = %reason, "waypoint denied the request")
                    }
                    Ok(()) => {
                        tracing::info!(target: "access", direction = "waypoint", src.identity = %labels.src_identity, dst.workload = %labels.dst_workload, http.method = %method, http.path = %path, http.status = status, duration_ms = ms, "request")
                    }
                }
                Ok::<_, hyper::Error>(resp)
            }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        // Clients may close their side once the last request is sent.
        .half_close(true)
        .serve_connection(TokioIo::new(client), svc)
        .await;
    upstream_task.abort();
    let (allowed, denied) = *counts.lock();
    Outcome {
        allowed,
        denied,
        error: served.err().map(|e| format!("client: {e}")),
    }
}

/// Sends one allowed request on; a failure upstream is answered `502`.
async fn forward(
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    req: Request<Incoming>,
) -> Response<Body> {
    let mut s = sender.lock().await;
    if s.ready().await.is_err() {
        return plain(StatusCode::BAD_GATEWAY, "upstream connection closed\n");
    }
    match s.send_request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(e) => plain(StatusCode::BAD_GATEWAY, &format!("upstream: {e}\n")),
    }
}

fn plain(status: StatusCode, body: &str) -> Response<Body> {
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
