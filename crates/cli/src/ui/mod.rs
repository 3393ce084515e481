//! `ferry ui --lab`: the mesh map in the browser. An HTTP server on loopback (hyper) serving one
//! self-contained page (`index.html`, embedded; inline script and style, nothing fetched from
//! elsewhere) and the JSON it draws from:
//!
//! - `/api/mesh`: the running lab's live topology ([`mesh::mesh`]);
//! - `/api/records`: every component's connection records ([`crate::observe::gather`]), each
//!   with its `hop` (its place on the path, as `ferry trace` orders hops);
//! - `/api/explain?from=X&to=Y`: [`crate::explain::explain`]'s report (with `refused`, and
//!   `text` as `ferry explain` prints it), `400` for bad input.
//!
//! Gathering records asks every node proxy and waypoint (one process each, in their network
//! namespaces), so one gathering runs at a time and its answer serves every request that
//! arrives within [`RECORDS_FRESH`] of it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio::time::Instant;

mod mesh;

/// The page: markup, style and script in one file.
const INDEX: &str = include_str!("index.html");

/// How long a gathering of the records answers later requests.
const RECORDS_FRESH: Duration = Duration::from_millis(500);

/// How long a connection may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

const JSON: &str = "application/json";

#[derive(Debug, clap::Args)]
pub(crate) struct UiArgs {
    /// Draw the lab that is up in --state-dir (the only source today).
    #[arg(long)]
    lab: bool,
    #[arg(long, default_value = ferry_lab::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Where to serve the page: a loopback address.
    #[arg(long, default_value = "127.0.0.1:15300")]
    listen: SocketAddr,
}

/// What every request shares.
#[derive(Debug)]
struct Ui {
    state_dir: PathBuf,
    /// The last gathering of the records, as JSON, and when it was made.
    records: Mutex<Option<(Instant, Bytes)>>,
}

/// One answer.
type Answer = http::Response<Full<Bytes>>;

pub(crate) fn run(args: &UiArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry ui: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &UiArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.lab, "give --lab: the lab is the only source today");
    anyhow::ensure!(
        args.listen.ip().is_loopback(),
        "--listen {}: the map is served on loopback only (127.0.0.1 or [::1])",
        args.listen
    );
    ferry_lab::live_topology(&args.state_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        // The test (and a user) read the address from this line.
        println!("serving the mesh map on http://{}/", listener.local_addr()?);
        let ui = Arc::new(Ui {
            state_dir: args.state_dir.clone(),
            records: Mutex::new(None),
        });
        serve(listener, ui).await;
        Ok(())
    })
}

async fn serve(listener: TcpListener, ui: Arc<Ui>) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("ferry ui: accept: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let ui = ui.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: http::Request<_>| {
                let ui = ui.clone();
                async move { Ok::<_, Infallible>(ui.respond(req.method(), req.uri()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    let mut r = http::Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn error(status: StatusCode, message: &str) -> Answer {
    answer(status, JSON, json!({ "error": message }).to_string())
}

// === impl Ui ===

impl Ui {
    async fn respond(self: &Arc<Self>, method: &Method, uri: &http::Uri) -> Answer {
        if method != Method::GET {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{method}: only GET is served"),
            );
        }
        match uri.path() {
            "/" | "/index.html" => answer(StatusCode::OK, "text/html; charset=utf-8", INDEX),
            "/api/mesh" => {
                let dir = self.state_dir.clone();
                match blocking(move || mesh::mesh(&dir)).await {
                    Ok(v) => answer(StatusCode::OK, JSON, v.to_string()),
                    Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}")),
                }
            }
            "/api/records" => match self.records().await {
                Ok(body) => answer(StatusCode::OK, JSON, body),
                Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}")),
            },
            "/api/explain" => {
                let query = uri.query().unwrap_or("").to_string();
                let dir = self.state_dir.clone();
                match blocking(move || explain(&dir, &query)).await {
                    Ok(Ok(v)) => answer(StatusCode::OK, JSON, v.to_string()),
                    Ok(Err(bad)) => error(StatusCode::BAD_REQUEST, &bad),
                    Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}")),
                }
            }
            p => error(
                StatusCode::NOT_FOUND,
                &format!("{p}: paths are /, /api/mesh, /api/records, /api/explain?from=X&to=Y"),
            ),
        }
    }

    /// The records as a JSON array: a fresh gathering's, or one made less than
    /// [`RECORDS_FRESH`] ago.
    async fn records(&self) -> anyhow::Result<Bytes> {
        let mut last = self.records.lock().await;
        if let Some((at, body)) = last.as_ref()
            && at.elapsed() < RECORDS_FRESH
        {
            return Ok(body.clone());
        }
        let dir = self.state_dir.clone();
        let body = blocking(move || {
            let mut records = crate::observe::gather(&dir)?;
            for r in &mut records {
                r["hop"] = Value::from(crate::trace::order(r));
            }
            Ok(Bytes::from(serde_json::to_vec(&records)?))
        })
        .await?;
        *last = Some((Instant::now(), body.clone()));
        Ok(body)
    }
}

/// Runs `f` (which starts processes or reads files) off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("the request's task panicked")?
}

/// `/api/explain?from=X&to=Y[&seed=N]` on the live topology: the report, or (inner `Err`) what
/// is wrong with the request. The outer error is the lab's (none up, topology unreadable).
fn explain(state_dir: &Path, query: &str) -> anyhow::Result<Result<Value, String>> {
    let (mut from, mut to, mut seed) = (None, None, 1);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "from" => from = Some(v.trim().to_string()),
            "to" => to = Some(v.trim().to_string()),
            "seed" => match v.parse() {
                Ok(n) => seed = n,
                Err(_) => return Ok(Err(format!("seed {v:?}: expected a number"))),
            },
            _ => {}
        }
    }
    let (Some(from), Some(to)) = (from.filter(|f| !f.is_empty()), to.filter(|t| !t.is_empty()))
    else {
        return Ok(Err(
            "give from (a workload: name, namespace/name, cluster/namespace/name, IP or network/IP) and to (IP:port or hostname:port)".into(),
        ));
    };
    let path = ferry_lab::live_topology(state_dir)?;
    let topology = ferry_topology::load_file(&path)?;
    Ok(
        match crate::explain::explain(&topology.snapshot, &from, &to, seed) {
            Ok(report) => {
                let mut v = serde_json::to_value(&report)?;
                v["refused"] = Value::Bool(report.refused());
                // The explanation as `ferry explain --lab` prints it.
                let name = format!("the running lab's topology ({})", path.display());
                v["text"] = Value::String(crate::explain::text::text(&report, &name));
                Ok(v)
            }
            Err(e) => Err(format!("{e:#}")),
        },
    )
}
