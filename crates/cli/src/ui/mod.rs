//! The mesh map in the browser, served by `ferry ui --lab` (also `ferry lab ui`) for a running
//! lab and by `ferry control serve --ui ADDR` for the mesh a control plane serves. An HTTP server
//! (hyper) serving one self-contained page (`index.html`, embedded; inline script and style,
//! nothing fetched from elsewhere) and the JSON it draws from:
//!
//! - `/api/mesh`: the mesh ([`mesh::describe`]): the lab's live topology, or the control
//!   plane's current snapshot (the page looks again every few seconds and redraws a change);
//! - `/api/records`: every component's connection records, each with its `hop` (its place on
//!   the path, as `ferry trace` orders hops): in the lab, every node proxy, waypoint and gateway
//!   asked from its namespace ([`crate::observe::gather`]); for a control plane, the admin
//!   endpoint each program connected over xDS gave in its node metadata
//!   ([`ferry_control::nodes`]);
//! - `/api/explain?from=X&to=Y`: [`crate::explain::explain`]'s report on that same mesh (with
//!   `refused`, and `text` as `ferry explain` prints it), `400` for bad input;
//! - `/api/sources`: where records are read from (the lab's components, or the connected
//!   programs with their admin addresses).
//!
//! It has no authentication: it listens on loopback unless told otherwise. Gathering records
//! asks every component, so one gathering runs at a time and its answer serves every request
//! that arrives within [`RECORDS_FRESH`] of it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use ferry_core::snapshot::Snapshot;
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
    /// Draw the lab that is up in --state-dir (`ferry control serve --ui` draws a control
    /// plane's mesh).
    #[arg(long)]
    lab: bool,
    #[command(flatten)]
    at: LabUiArgs,
}

/// `ferry lab ui`: the same as `ferry ui --lab`.
#[derive(Debug, clap::Args)]
pub(crate) struct LabUiArgs {
    #[arg(long, default_value = ferry_lab::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Where to serve the page: a loopback address.
    #[arg(long, default_value = "127.0.0.1:15300")]
    listen: SocketAddr,
}

/// Where the map's mesh and records come from.
#[derive(Debug)]
pub(crate) enum Source {
    /// The lab that is up in this state directory.
    Lab(PathBuf),
    /// The control plane this process runs.
    Control(ferry_control::app::Live),
}

/// What every request shares.
#[derive(Debug)]
struct Ui {
    source: Source,
    /// The last gathering of the records, as JSON, and when it was made.
    records: Mutex<Option<(Instant, Bytes)>>,
}

/// One answer.
type Answer = http::Response<Full<Bytes>>;

pub(crate) fn run(args: &UiArgs) -> ExitCode {
    if !args.lab {
        eprintln!(
            "ferry ui: give --lab (the lab is its only source here; `ferry control serve --ui ADDR` serves a control plane's map)"
        );
        return ExitCode::from(2);
    }
    run_lab(&args.at)
}

/// `ferry ui --lab`, `ferry lab ui`.
pub(crate) fn run_lab(args: &LabUiArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry ui: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(args: &LabUiArgs) -> anyhow::Result<()> {
    let listener = bind(args.listen, false)?;
    ferry_lab::live_topology(&args.state_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::from_std(listener)?;
        // The test (and a user) read the address from this line.
        println!("serving the mesh map on http://{}/", listener.local_addr()?);
        serve(listener, Source::Lab(args.state_dir.clone())).await;
        Ok(())
    })
}

/// Binds the map's address: loopback only, unless `remote` (the map has no authentication).
pub(crate) fn bind(addr: SocketAddr, remote: bool) -> anyhow::Result<std::net::TcpListener> {
    anyhow::ensure!(
        remote || addr.ip().is_loopback(),
        "{addr}: the map has no authentication, so it is served on loopback only (127.0.0.1 or [::1])"
    );
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("listening on {addr} for the mesh map"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves the map from `source` on `listener` until the process ends. Runs inside a runtime.
pub(crate) async fn serve(listener: TcpListener, source: Source) {
    let ui = Arc::new(Ui {
        source,
        records: Mutex::new(None),
    });
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

// === impl Source ===

impl Source {
    /// The mesh now, and how explain's text names it.
    fn snapshot(&self) -> anyhow::Result<(Arc<Snapshot>, String)> {
        match self {
            Self::Lab(dir) => {
                let path = ferry_lab::live_topology(dir)?;
                let topology = ferry_topology::load_file(&path)?;
                let name = format!("the running lab's topology ({})", path.display());
                Ok((Arc::new(topology.snapshot), name))
            }
            Self::Control(live) => {
                let name = "the control plane's current mesh".to_string();
                Ok((live.store.load(), name))
            }
        }
    }

    /// Every record of every component, each with its `component`, oldest first.
    async fn records(&self) -> anyhow::Result<Vec<Value>> {
        match self {
            Self::Lab(dir) => {
                let dir = dir.clone();
                blocking(move || crate::observe::gather(&dir)).await
            }
            Self::Control(live) => {
                // A program that does not answer is left out; /api/sources names them all.
                let admins = live.connected.admins();
                Ok(crate::explain::fetch::records(&admins).await.0)
            }
        }
    }

    /// Where records are read from.
    fn sources(&self) -> anyhow::Result<Value> {
        Ok(match self {
            Self::Lab(dir) => Value::Array(
                ferry_lab::components(dir)?
                    .into_iter()
                    .map(|c| json!({"name": c.name, "admin": c.admin, "netns": c.netns}))
                    .collect(),
            ),
            Self::Control(live) => Value::Array(
                live.connected
                    .list()
                    .into_iter()
                    .map(|n| {
                        json!({
                            "name": n.id,
                            "node": n.node,
                            "cluster": n.cluster,
                            "admin": n.admin.map(|a| a.to_string()),
                        })
                    })
                    .collect(),
            ),
        })
    }
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
                let ui = self.clone();
                match blocking(move || Ok(mesh::describe(&ui.source.snapshot()?.0))).await {
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
                let ui = self.clone();
                match blocking(move || explain(&ui.source, &query)).await {
                    Ok(Ok(v)) => answer(StatusCode::OK, JSON, v.to_string()),
                    Ok(Err(bad)) => error(StatusCode::BAD_REQUEST, &bad),
                    Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}")),
                }
            }
            "/api/sources" => {
                let ui = self.clone();
                match blocking(move || ui.source.sources()).await {
                    Ok(v) => answer(StatusCode::OK, JSON, v.to_string()),
                    Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}")),
                }
            }
            p => error(
                StatusCode::NOT_FOUND,
                &format!(
                    "{p}: paths are /, /api/mesh, /api/records, /api/explain?from=X&to=Y, /api/sources"
                ),
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
        let mut records = self.source.records().await?;
        for r in &mut records {
            r["hop"] = Value::from(crate::trace::order(r));
        }
        let body = Bytes::from(serde_json::to_vec(&records)?);
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

/// `/api/explain?from=X&to=Y[&seed=N]` on the source's mesh: the report, or (inner `Err`) what
/// is wrong with the request. The outer error is the source's (no lab up, topology unreadable).
fn explain(source: &Source, query: &str) -> anyhow::Result<Result<Value, String>> {
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
    let (snap, name) = source.snapshot()?;
    Ok(match crate::explain::explain(&snap, &from, &to, seed) {
        Ok(report) => {
            let mut v = serde_json::to_value(&report)?;
            v["refused"] = Value::Bool(report.refused());
            // The explanation as `ferry explain` prints it.
            v["text"] = Value::String(crate::explain::text::text(&report, &name));
            Ok(v)
        }
        Err(e) => Err(format!("{e:#}")),
    })
}
