//! Where connection records come from: admin endpoints, each read over HTTP/1.1 (hyper) on a
//! TCP connection opened from inside the component's network namespace (a lab's node proxies,
//! waypoints and gateways) or from here (`--admin host:port`).
//!
//! Following one (`/records?follow=1`, see `ferry_runtime::admin`) turns its JSON lines into
//! [`Event`]s: it is followed, a record, records missed, it ended. The endpoint sends an empty
//! line every few seconds when it has nothing else to say; one silent for [`SILENCE`] is
//! taken for gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// How long connecting to an admin endpoint and getting its answer's head may take.
const CONNECT_BOUND: Duration = Duration::from_secs(5);

/// How long a followed endpoint may send nothing, not even its heartbeat, before it is taken
/// for gone: three of its heartbeats.
const SILENCE: Duration = Duration::from_secs(15);

/// One admin endpoint serving connection records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    /// `node/<name>`, `waypoint/<name>`, `gateway/<name>`, or `admin/<host:port>`.
    pub(crate) name: String,
    at: At,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum At {
    /// Reached from inside a network namespace (a path under /run/netns).
    Netns { netns: PathBuf, admin: String },
    /// Reached from here: `host:port`.
    Here(String),
}

/// What following the sources says, in the order it happens.
#[derive(Debug)]
pub(crate) enum Event {
    /// A source is followed: every record it keeps from now on will come.
    Following,
    /// The source could not be followed.
    Failed(String, anyhow::Error),
    /// A record, with its `component` (the source's name).
    Record(Value),
    /// The source could not keep up with this follower: this many records were missed.
    Lagged(String, u64),
    /// The source sent a line that is not a record (skipped).
    Garbled(String, anyhow::Error),
    /// The source stopped answering: its stream ended, broke or went silent.
    Ended(String, anyhow::Error),
}

// === impl Source ===

impl Source {
    /// The node proxies, waypoint instances and east-west gateways of the lab in `state_dir`.
    pub(crate) fn lab(state_dir: &Path) -> anyhow::Result<Vec<Self>> {
        Ok(ferry_lab::components(state_dir)?
            .into_iter()
            .map(|c| Self {
                name: c.name,
                at: At::Netns {
                    netns: Path::new("/run/netns").join(c.netns),
                    admin: c.admin,
                },
            })
            .collect())
    }

    /// The admin endpoint at `addr` (`host:port`), reached from here.
    pub(crate) fn admin(addr: &str) -> Self {
        Self {
            name: format!("admin/{addr}"),
            at: At::Here(addr.to_string()),
        }
    }

    async fn connect(&self) -> anyhow::Result<TcpStream> {
        match &self.at {
            At::Here(addr) => TcpStream::connect(addr.as_str())
                .await
                .with_context(|| format!("connecting to {addr}")),
            At::Netns { netns, admin } => {
                let to: std::net::SocketAddr = admin
                    .parse()
                    .with_context(|| format!("the admin address {admin:?}"))?;
                let ns = ferry_runtime::netns::Netns::open(netns)
                    .with_context(|| format!("entering {}", netns.display()))?;
                ns.connect(None, to)
                    .await
                    .with_context(|| format!("connecting to {admin} in {}", netns.display()))
            }
        }
    }

    /// Sends `GET path` and returns the answer's body, once its head says 200.
    async fn request(&self, path: &str) -> anyhow::Result<hyper::body::Incoming> {
        let tcp = self.connect().await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, "admin")
            .body(Empty::<Bytes>::new())
            .context("the request")?;
        let answer = send.send_request(req).await.context("no answer")?;
        anyhow::ensure!(
            answer.status() == http::StatusCode::OK,
            "answered {path} with {}",
            answer.status()
        );
        Ok(answer.into_body())
    }

    /// The whole body of `GET path`.
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<String> {
        let asked = async {
            let body = self.request(path).await?;
            let bytes = body.collect().await.context("reading the answer")?;
            Ok::<_, anyhow::Error>(String::from_utf8_lossy(&bytes.to_bytes()).into_owned())
        };
        tokio::time::timeout(CONNECT_BOUND, asked)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {CONNECT_BOUND:?}"))?
            .with_context(|| format!("asking {} for {path}", self.name))
    }

    /// Follows the source's records until it ends or `events` is closed, telling `events`
    /// what happens.
    pub(crate) async fn follow(self, events: mpsc::Sender<Event>) {
        let asked = tokio::time::timeout(CONNECT_BOUND, self.request("/records?follow=1")).await;
        let mut body = match asked {
            Ok(Ok(body)) => body,
            Ok(Err(e)) => {
                let _ = events.send(Event::Failed(self.name, e)).await;
                return;
            }
            Err(_) => {
                let e = anyhow::anyhow!("no answer within {CONNECT_BOUND:?}");
                let _ = events.send(Event::Failed(self.name, e)).await;
                return;
            }
        };
        if events.send(Event::Following).await.is_err() {
            return;
        }
        let mut pending: Vec<u8> = Vec::new();
        let ended = loop {
            let frame = match tokio::time::timeout(SILENCE, body.frame()).await {
                Err(_) => break anyhow::anyhow!("silent for {SILENCE:?}"),
                Ok(None) => break anyhow::anyhow!("the stream ended"),
                Ok(Some(Err(e))) => break anyhow::Error::new(e).context("the stream broke"),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let Some(event) = self.event(&line) else {
                    continue;
                };
                if events.send(event).await.is_err() {
                    return;
                }
            }
        };
        let _ = events.send(Event::Ended(self.name, ended)).await;
    }

    /// What one line of the stream says: nothing for a heartbeat.
    fn event(&self, line: &[u8]) -> Option<Event> {
        let line = std::str::from_utf8(line).unwrap_or("").trim();
        if line.is_empty() {
            return None;
        }
        Some(match serde_json::from_str::<Value>(line) {
            Ok(v) if v.get("lagged").is_some() => {
                Event::Lagged(self.name.clone(), v["lagged"].as_u64().unwrap_or(0))
            }
            Ok(mut v) => {
                v["component"] = Value::String(self.name.clone());
                Event::Record(v)
            }
            Err(e) => Event::Garbled(
                self.name.clone(),
                anyhow::anyhow!("a line that is not JSON: {e}"),
            ),
        })
    }
}
