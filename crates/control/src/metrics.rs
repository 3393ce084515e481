//! The control plane's Prometheus endpoint for its xDS, CA and connection counters.
//!
//! Answers every HTTP/1.1 request on its port, whatever the path, with the counters in the
//! OpenMetrics text format (prometheus-client) and closes the connection. Bind it to loopback or
//! a management network.
//!
//! A client that closes its side once it has sent the request (`ferry lab connect` does) still
//! gets the answer; a client that sends no complete request head in [`HEADER_READ_TIMEOUT`] is
//! dropped; a failed accept (out of file descriptors) waits [`ACCEPT_BACKOFF`] before the next.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_k8s::watch::WatchStatus;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long a client may take to send a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause after a failed accept, so that running out of descriptors does not spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The exposition's content type.
const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Counters the control plane exports. Clones of a counter share its value, so the registry
/// [`Metrics::registry`] builds sees every later increment.
#[derive(Debug, Default)]
pub struct Metrics {
    pub streams: Counter,
    /// xDS streams open now (each holds only an `Arc` of the set it was last pushed).
    pub streams_open: Gauge,
    pub pushes: Counter,
    pub resources_sent: Counter,
    pub acks: Counter,
    pub nacks: Counter,
    pub refused: Counter,
    /// Certificate requests decoded and judged (signed or refused after reading the body).
    pub ca_requests: Counter,
    /// Certificate requests refused from their headers, before the body was read.
    pub ca_refused: Counter,
    /// Connections closed at accept: too many open from the same peer address.
    pub connections_refused: Counter,
}

// === impl Metrics ===

impl Metrics {
    /// A registry of these counters (prometheus-client adds `_total` to each name).
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        for (name, help, c) in [
            ("ferry_xds_streams", "xDS streams opened", &self.streams),
            ("ferry_xds_pushes", "xDS responses sent", &self.pushes),
            (
                "ferry_xds_resources_sent",
                "resources sent in xDS responses",
                &self.resources_sent,
            ),
            ("ferry_xds_acks", "xDS responses acknowledged", &self.acks),
            (
                "ferry_xds_nacks",
                "xDS responses rejected by a node (NACK)",
                &self.nacks,
            ),
            (
                "ferry_xds_refused",
                "xDS streams refused for a missing or bad node credential",
                &self.refused,
            ),
            (
                "ferry_ca_requests",
                "certificate requests decoded and judged",
                &self.ca_requests,
            ),
            (
                "ferry_ca_refused",
                "certificate requests refused for a missing or bad node credential, before the body was read",
                &self.ca_refused,
            ),
            (
                "ferry_control_connections_refused",
                "connections closed at accept: too many open from one peer address",
                &self.connections_refused,
            ),
        ] {
            r.register(name, help, c.clone());
        }
        r.register(
            "ferry_xds_streams_open",
            "xDS streams open now",
            self.streams_open.clone(),
        );
        r
    }
}

/// The labels of a Kubernetes object the last translation left out or changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct NoteLabels {
    pub cluster: String,
    /// `Kind namespace/name`.
    pub object: String,
}

/// What the Kubernetes source exports: one gauge per object of the last translation's notes
/// (1 while the note holds, gone once it does not), so an alert can name the object; the
/// reason is on `/debug/kubernetes` and in the log.
#[derive(Clone, Debug, Default)]
pub struct KubeMetrics {
    pub notes: Family<NoteLabels, Gauge>,
    /// Per watched cluster: 1 while its watches answer, 0 while the last one failed (its last
    /// objects keep serving).
    pub reachable: Family<ClusterLabels, Gauge>,
    /// 1 while this replica holds the Lease and so writes to the clusters, 0 while another
    /// does (only set when replicas elect, `--lease`).
    pub leader: Gauge,
}

/// The label of one watched cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

impl KubeMetrics {
    /// Adds these to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ferry_kubernetes_notes",
            "Kubernetes objects the last translation left out, failed closed or changed (1 each)",
            self.notes.clone(),
        );
        registry.register(
            "ferry_kubernetes_cluster_reachable",
            "Watched Kubernetes clusters: 1 while their API server answers, 0 while its last watch failed (the cluster's last objects keep serving)",
            self.reachable.clone(),
        );
        registry.register(
            "ferry_kubernetes_leader",
            "1 while this control plane holds the Lease and writes to the clusters (ServiceImports, ServiceExport status), 0 while another replica does",
            self.leader.clone(),
        );
    }

    /// Shows the clusters watched now, and only those, each reachable or not.
    pub fn set_clusters(&self, status: &ferry_k8s::watch::WatchStatus) {
        self.reachable.clear();
        for (id, c) in &status.clusters {
            self.reachable
                .get_or_create(&ClusterLabels {
                    cluster: id.clone(),
                })
                .set(i64::from(c.last_error.is_none()));
        }
        if let Some(l) = &status.leader {
            self.leader.set(i64::from(l.leading));
        }
    }

    /// Shows the notes of a translation, and only those.
    pub fn set(&self, notes: &[ferry_k8s::Note]) {
        self.notes.clear();
        for n in notes {
            self.notes
                .get_or_create(&NoteLabels {
                    cluster: n.cluster.clone(),
                    object: n.object.clone(),
                })
                .set(1);
        }
    }
}

/// The exposition text of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding the metrics");
    }
    out
}

/// Serves `render(registry)` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    serve_with(listener, registry, None).await;
}

/// [`serve`], and with a Kubernetes source, its status as JSON on `/debug/kubernetes`
/// (clusters synced or failing, and the notes of the last translation: objects left out or
/// failed closed, and why).
pub async fn serve_with(
    listener: TcpListener,
    registry: Arc<Registry>,
    kubernetes: Option<watch::Receiver<WatchStatus>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let registry = registry.clone();
        let kubernetes = kubernetes.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                let kubernetes = kubernetes.clone();
                async move {
                    Ok::<_, Infallible>(match (req.uri().path(), &kubernetes) {
                        ("/debug/kubernetes", Some(k)) => kubernetes_status(&k.borrow()),
                        _ => respond(&registry),
                    })
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .half_close(true)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

fn kubernetes_status(status: &WatchStatus) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(status).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn respond(registry: &Registry) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(render(registry))));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// The lab's `ferry lab connect` sends the request and closes its side at once: the answer
    /// still comes, every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_half_closes_after_its_request_still_gets_the_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(WatchStatus::default());
        let server = tokio::spawn(serve_with(
            listener,
            Arc::new(Metrics::default().registry()),
            Some(rx),
        ));
        let answers = tokio::task::spawn_blocking(move || {
            (0..50)
                .map(|_| {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    // A server that never answers fails the test instead of hanging it.
                    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                        .unwrap();
                    s.write_all(b"GET /debug/kubernetes HTTP/1.1\r\nhost: x\r\n\r\n")
                        .unwrap();
                    s.shutdown(std::net::Shutdown::Write).unwrap();
                    let mut out = String::new();
                    s.read_to_string(&mut out).unwrap();
                    out
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        for answer in answers {
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
            assert!(answer.contains("\"clusters\""), "{answer:?}");
        }
        server.abort();
        drop(tx);
    }
}
