//! The topology file as the control plane's source of truth, watched for edits.
//!
//! The watcher waits on file-system events (inotify on Linux) for the file's directory, so an
//! edit that replaces the file (write aside, rename over it; Kubernetes' `..data` symlink swap)
//! is seen as well as one written in place. A burst of events is taken as one edit once the
//! directory has been quiet for the debounce interval, and an edit whose content is unchanged is
//! ignored.
//!
//! An edit is read, checked, parsed and encoded (flattened into the resource set xDS serves) on
//! a thread of its own, never on the async runtime, so
//! the CA and xDS keep answering (and SIGTERM keeps working) whatever the file holds: the size
//! and nesting limits are checked before the YAML parser runs, and a parse that outlives its
//! time budget is rejected (its thread is left to finish; at most [`MAX_PARSE_THREADS`] run at
//! once). A good edit replaces the snapshot and the served resources in one step each; a bad
//! one is logged with its located errors and the last good state keeps being served.
//!
//! An edit costs what it changes, not what the file holds: the last good text is kept
//! ([`Kept`]), so an edit of workload entries alone parses and converts just those entries and
//! applies them to the snapshot as a delta (anything else is parsed whole); and what is served
//! is kept ([`Served`]), so only the resources whose inputs changed are encoded again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::store::Store;
use ferry_topology::kept::{Kept, parse_kept};
use ferry_topology::{Limits, Problem, Topology, TopologyError};
use ferry_xds::resources::ResourceSet;
use notify::Watcher as _;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::served::Served;

/// Parse threads that may run at once; a further edit waits for one to end.
pub const MAX_PARSE_THREADS: usize = 2;

/// What the watcher has done, for tests and admin output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    pub applied: u64,
    pub rejected: u64,
    pub last_error: Option<String>,
}

/// How edits are read and judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchConfig {
    /// Size and nesting limits, checked before parsing.
    pub limits: Limits,
    /// The longest a read and parse may take before the edit is rejected.
    pub budget: Duration,
    /// How long the directory must be quiet after an event before the file is read.
    pub debounce: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            budget: Duration::from_secs(30),
            debounce: Duration::from_millis(50),
        }
    }
}

/// Why the topology file cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: expected a file in a directory, found none")]
    NoDirectory { path: PathBuf },
    #[error("watching {dir} for edits: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// A watch on the topology file, set up; [`TopologyWatch::run`] applies the edits.
pub struct TopologyWatch {
    path: PathBuf,
    config: WatchConfig,
    events: mpsc::Receiver<()>,
    /// Dropping it ends the watch.
    _watcher: notify::RecommendedWatcher,
    threads: Arc<Semaphore>,
    last: Option<Vec<u8>>,
    /// The last good text, for edits of workloads alone (boxed: it holds a snapshot).
    kept: Option<Box<Kept>>,
}

impl std::fmt::Debug for TopologyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyWatch")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// === impl TopologyWatch ===

impl TopologyWatch {
    /// Starts watching `path`'s directory. Content already there counts as seen: only a later
    /// edit is applied. Call it before loading the first state, so no edit falls in between.
    pub fn new(path: PathBuf, config: WatchConfig) -> Result<Self, SourceError> {
        let dir = match path.parent() {
            Some(d) if d.as_os_str().is_empty() => PathBuf::from("."),
            Some(d) => d.to_path_buf(),
            None => return Err(SourceError::NoDirectory { path }),
        };
        let name = path.file_name().map(ToOwned::to_owned);
        let (tx, events) = mpsc::channel(1);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = match &event {
                    // The file itself, or Kubernetes' atomic writer swapping `..data`.
                    Ok(e) => e.paths.iter().any(|p| {
                        p.file_name().is_some_and(|n| {
                            Some(n) == name.as_deref() || n.as_encoded_bytes().starts_with(b"..")
                        })
                    }),
                    // A lost event (queue overflow) may have been ours.
                    Err(_) => true,
                };
                if relevant {
                    // Full means an edit is already pending: this one is part of it.
                    let _ = tx.try_send(());
                }
            })
            .map_err(|source| SourceError::Watch {
                dir: dir.clone(),
                source,
            })?;
        watcher
            .watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(|source| SourceError::Watch {
                dir: dir.clone(),
                source,
            })?;
        let last = ferry_topology::read_file_within(&path, &config.limits)
            .ok()
            .map(|text| fingerprint(&text));
        Ok(Self {
            path,
            config,
            events,
            _watcher: watcher,
            threads: Arc::new(Semaphore::new(MAX_PARSE_THREADS)),
            last,
            kept: None,
        })
    }

    /// Starts from `kept`, the text the first state was loaded from ([`load_kept`]), so that
    /// even the first edit of workloads alone is parsed for those alone.
    #[must_use]
    pub fn with_kept(mut self, kept: Option<Kept>) -> Self {
        self.kept = kept.map(Box::new);
        self
    }

    /// Applies each edit to `store` and `resources` until dropped. `resources` holds what is
    /// served for the store's snapshot when it starts.
    pub async fn run(
        mut self,
        store: Arc<Store>,
        resources: watch::Sender<Arc<ResourceSet>>,
        reloads: watch::Sender<Reloads>,
    ) {
        // What is served, kept to encode the next edit from (made on the first edit's thread).
        let mut served: Option<Served> = None;
        loop {
            if self.events.recv().await.is_none() {
                return;
            }
            // Debounce: wait for the burst to end.
            loop {
                match tokio::time::timeout(self.config.debounce, self.events.recv()).await {
                    Ok(Some(())) => {}
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let Ok(permit) = self.threads.clone().acquire_owned().await else {
                return;
            };
            let prior = Prior {
                served: served
                    .clone()
                    .map_or_else(|| Err((store.load(), resources.borrow().clone())), Ok),
                kept: self.kept.take().map(|k| *k),
            };
            let (judged, kept) = judge(
                &self.path,
                self.config,
                self.last.take(),
                Some(permit),
                Some(prior),
            )
            .await;
            self.kept = kept.map(Box::new);
            let (digest, result) = match judged {
                Judged::Unchanged(digest) => {
                    self.last = Some(digest);
                    continue;
                }
                Judged::Changed(digest, result) => (digest, result),
            };
            self.last = digest;
            match *result {
                Ok(Reloaded {
                    topology,
                    served: next,
                    incremental,
                }) => {
                    // Encoded on the parse thread (judged with a prior).
                    let next = next.unwrap_or_else(|| Served::new(&topology.snapshot));
                    store.publish(topology.snapshot);
                    // The old set goes when the last stream pushing from it is done with it.
                    drop(resources.send_replace(next.resources().clone()));
                    served = Some(next);
                    reloads.send_modify(|r| r.applied += 1);
                    tracing::info!(path = %self.path.display(), incremental, "topology reloaded");
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "topology edit rejected; still serving the last good state");
                    reloads.send_modify(|r| {
                        r.rejected += 1;
                        r.last_error = Some(e.to_string());
                    });
                }
            }
        }
    }
}

/// Reads and converts the topology file at `path` on a thread of its own, within `limits` and
/// `budget`: what `ferry control serve` loads its first state with.
pub async fn load(
    path: &Path,
    limits: Limits,
    budget: Duration,
) -> Result<Topology, TopologyError> {
    load_kept(path, limits, budget).await.map(|(t, _)| t)
}

/// [`load`], with the text kept for [`TopologyWatch::with_kept`].
pub async fn load_kept(
    path: &Path,
    limits: Limits,
    budget: Duration,
) -> Result<(Topology, Option<Kept>), TopologyError> {
    let config = WatchConfig {
        limits,
        budget,
        ..WatchConfig::default()
    };
    match judge(path, config, None, None, None).await {
        (Judged::Changed(_, result), kept) => result.map(|p| (p.topology, kept)),
        // Nothing to compare with: it cannot be unchanged.
        (Judged::Unchanged(_), _) => Err(TopologyError {
            file: path.display().to_string(),
            problems: vec![Problem::new("", "expected a topology, found none")],
        }),
    }
}

/// What became of an edit.
enum Judged {
    /// The same content as last time.
    Unchanged(Vec<u8>),
    /// New content (its digest, when it could be read), parsed or rejected.
    Changed(Option<Vec<u8>>, Box<Result<Reloaded, TopologyError>>),
}

/// A topology read from the file, and what xDS serves for it when asked for.
#[derive(Debug)]
pub struct Reloaded {
    pub topology: Topology,
    pub served: Option<Served>,
    /// Whether only workload entries were parsed (the rest kept from the text before).
    pub incremental: bool,
}

/// What the last good state left for the next edit: what is served (or, before the first edit,
/// the snapshot and the resources encoded for it) and the text it was parsed from.
struct Prior {
    served: Result<Served, (Arc<ferry_core::snapshot::Snapshot>, Arc<ResourceSet>)>,
    kept: Option<Kept>,
}

/// Reads, compares, parses and (with a `prior`) encodes on a new thread (holding `permit`
/// while it runs); gives up waiting after the budget. Also gives the text kept for the next
/// edit (the prior's when the edit is rejected or unchanged; none when abandoned).
async fn judge(
    path: &Path,
    config: WatchConfig,
    last: Option<Vec<u8>>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    prior: Option<Prior>,
) -> (Judged, Option<Kept>) {
    let (tx, rx) = oneshot::channel();
    // The digest is known before the parse starts: a parse abandoned over its budget is still
    // not retried for the same content.
    let (digest_tx, mut digest_rx) = oneshot::channel();
    let thread_path = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("topology-parse".into())
        .spawn(move || {
            let _permit = permit;
            let (mut kept, served) = match prior {
                Some(p) => (p.kept, Some(p.served)),
                None => (None, None),
            };
            let judged = match ferry_topology::read_file_within(&thread_path, &config.limits) {
                Err(e) => Judged::Changed(None, Box::new(Err(e))),
                Ok(text) => {
                    let digest = fingerprint(&text);
                    let _ = digest_tx.send(digest.clone());
                    if last.as_ref() == Some(&digest) {
                        Judged::Unchanged(digest)
                    } else {
                        let name = thread_path.display().to_string();
                        let served = served.map(|s| {
                            s.unwrap_or_else(|(snap, set)| Served::from_parts(&snap, set))
                        });
                        let parsed =
                            reload(&name, text, &config.limits, &mut kept, served.as_ref());
                        Judged::Changed(Some(digest), Box::new(parsed))
                    }
                }
            };
            let _ = tx.send((judged, kept));
        });
    let fail = |digest: Option<Vec<u8>>, message: String| {
        Judged::Changed(
            digest,
            Box::new(Err(TopologyError {
                file: path.display().to_string(),
                problems: vec![Problem::new("", message)],
            })),
        )
    };
    if let Err(e) = spawned {
        return (
            fail(
                None,
                format!("expected a thread to parse on, found an error: {e}"),
            ),
            None,
        );
    }
    match tokio::time::timeout(config.budget, rx).await {
        Ok(Ok(judged)) => judged,
        Ok(Err(_)) => (
            fail(
                None,
                "expected the parse to finish, found that it panicked".into(),
            ),
            None,
        ),
        Err(_) => (
            fail(
                digest_rx.try_recv().ok(),
                format!(
                    "expected a parse within {:?}, found it still running (abandoned)",
                    config.budget
                ),
            ),
            None,
        ),
    }
}

/// Parses `text`: through `kept` when the edit is of workload entries alone (see [`Kept`]), else
/// whole (and `kept` becomes the new text's, or stays when the text is rejected); with
/// `served`, encodes from it only what changed ([`Served`]).
pub fn reload(
    name: &str,
    text: String,
    limits: &Limits,
    kept: &mut Option<Kept>,
    served: Option<&Served>,
) -> Result<Reloaded, TopologyError> {
    let text = match kept.as_mut() {
        Some(k) => match k.edit(text, limits) {
            Ok((topology, edit)) => {
                let served = served.map(|s| s.edited(&topology.snapshot, &edit.workloads));
                return Ok(Reloaded {
                    topology,
                    served,
                    incremental: true,
                });
            }
            Err(text) => text,
        },
        None => text,
    };
    let (topology, new_kept) = parse_kept(name, text, limits)?;
    *kept = new_kept;
    let served = served.map(|s| s.next(&topology.snapshot));
    Ok(Reloaded {
        topology,
        served,
        incremental: false,
    })
}

/// Content digest, so edits within one mtime tick count.
fn fingerprint(text: &str) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes())
        .as_ref()
        .to_vec()
}
