//! The topology file as the control plane's source of truth, watched for edits.
//!
//! The watcher waits on file-system events (inotify on Linux) for the file's directory, so an
//! edit that replaces the file (write aside, rename over it; Kubernetes' `..data` symlink swap)
//! is seen as well as one written in place. An event that ends a write (the file renamed over,
//! or closed by a writer; Kubernetes' `..data` renamed) has the file read at once; after any
//! other event the burst is taken as one edit once the directory has been quiet for the debounce
//! interval. Events that come while an edit is being read and applied make one edit after it. An
//! edit whose content is unchanged is ignored.
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

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferry_core::store::Store;
use ferry_topology::kept::{Kept, parse_keeping, parse_kept};
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
    /// How long the directory must be quiet after an event before the file is read, unless the
    /// event ended a write (a rename onto the file, a writer closing it), which is read at once.
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
    /// Set with an event that ended a write of the file: it is read without waiting.
    written: Arc<AtomicBool>,
    /// Dropping it ends the watch.
    _watcher: notify::RecommendedWatcher,
    threads: Arc<Semaphore>,
    last: Option<Seen>,
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
        let mut watch = Self::unread(path, config)?;
        watch.last = ferry_topology::read_file_within(&watch.path, &watch.config.limits)
            .ok()
            .map(|text| Seen::Digest(fingerprint(&text)));
        Ok(watch)
    }

    /// [`TopologyWatch::new`] without reading the file: the content the first state is loaded
    /// from ([`load_kept`]) counts as seen once [`TopologyWatch::with_kept`] is given it, so
    /// the file is read and digested once at start-up, not twice.
    pub fn unread(path: PathBuf, config: WatchConfig) -> Result<Self, SourceError> {
        let dir = match path.parent() {
            Some(d) if d.as_os_str().is_empty() => PathBuf::from("."),
            Some(d) => d.to_path_buf(),
            None => return Err(SourceError::NoDirectory { path }),
        };
        let name = path.file_name().map(ToOwned::to_owned);
        let (tx, events) = mpsc::channel(1);
        let written = Arc::new(AtomicBool::new(false));
        let ended = written.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = match &event {
                    // Opened or read: the control plane's own reads (the first load's too, made
                    // once this watch is set) would have it read and compare the file again.
                    Ok(e) if only_read(&e.kind) => false,
                    // A rename's third report: its `From` and `To` came just before.
                    Ok(e) if repeats_a_rename(&e.kind) => false,
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
                    // The last relevant event decides: a write that begins after one ended
                    // (a truncate, a modify) waits for quiet again. Before the wake-up, so the
                    // watch sees it with the wake-up.
                    let ends = event
                        .as_ref()
                        .is_ok_and(|e| ends_a_write(e, name.as_deref()));
                    ended.store(ends, Ordering::Release);
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
        Ok(Self {
            path,
            config,
            events,
            written,
            _watcher: watcher,
            threads: Arc::new(Semaphore::new(MAX_PARSE_THREADS)),
            last: None,
            kept: None,
        })
    }

    /// Starts from `first`, what the first state was loaded from ([`load_kept`]): its content
    /// counts as seen, and even the first edit of workloads alone is parsed for those alone.
    #[must_use]
    pub fn with_kept(mut self, first: First) -> Self {
        if let Some(digest) = first.digest {
            self.last = Some(Seen::Digest(digest));
        } else if first.kept.is_some() {
            self.last = Some(Seen::Kept);
        }
        self.kept = first.kept.map(Box::new);
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
            // Debounce: wait for the burst to end, unless its last event ended a write and the
            // file is there (Kubernetes' atomic writer swaps `..data` before it links a new
            // key's file: that link comes after, and is waited for).
            loop {
                if self.written.swap(false, Ordering::Acquire) && self.path.exists() {
                    break;
                }
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
            let (seen, result) = match judged {
                Judged::Unchanged(seen) => {
                    self.last = Some(seen);
                    continue;
                }
                Judged::Changed(seen, result) => (seen, result),
            };
            self.last = seen;
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

/// What the first state was loaded from, for [`TopologyWatch::with_kept`]: the text kept for
/// edits, and the content's digest when the text is not kept (a kept text is the content seen:
/// start-up digests nothing it need not).
#[derive(Debug, Default)]
pub struct First {
    pub kept: Option<Kept>,
    pub digest: Option<Vec<u8>>,
}

/// The content the watcher last read, to tell an edit that changed nothing.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Its digest.
    Digest(Vec<u8>),
    /// The first state's, which the kept text holds (compared byte for byte).
    Kept,
}

/// [`load`], with what it was loaded from for [`TopologyWatch::with_kept`].
pub async fn load_kept(
    path: &Path,
    limits: Limits,
    budget: Duration,
) -> Result<(Topology, First), TopologyError> {
    let config = WatchConfig {
        limits,
        budget,
        ..WatchConfig::default()
    };
    match judge(path, config, None, None, None).await {
        (Judged::Changed(seen, result), kept) => {
            let digest = match seen {
                Some(Seen::Digest(d)) => Some(d),
                _ => None,
            };
            result.map(|p| (p.topology, First { kept, digest }))
        }
        // Nothing to compare with: it cannot be unchanged.
        (Judged::Unchanged(_), _) => Err(TopologyError {
            file: path.display().to_string(),
            problems: vec![Problem::new("", "expected a topology, found none")],
        }),
    }
}

/// What became of an edit.
enum Judged {
    /// The same content as last time (as seen now).
    Unchanged(Seen),
    /// New content (as seen, when it could be read), parsed or rejected.
    Changed(Option<Seen>, Box<Result<Reloaded, TopologyError>>),
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
/// edit (the prior's when the edit is rejected or unchanged; none when abandoned). Without a
/// prior (the first load) the text is digested only when it is not kept, after the parse: the
/// digest is not on the way to serving.
async fn judge(
    path: &Path,
    config: WatchConfig,
    last: Option<Seen>,
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
            let mut digest_tx = Some(digest_tx);
            let digested = move |text: &str| {
                let d = fingerprint(text);
                if let Some(tx) = digest_tx.take() {
                    let _ = tx.send(d.clone());
                }
                d
            };
            let judged = match served {
                Some(served) => edited(
                    &thread_path,
                    &config.limits,
                    last.as_ref(),
                    &mut kept,
                    served,
                    digested,
                ),
                None => match ferry_topology::read_file_within(&thread_path, &config.limits) {
                    Err(e) => Judged::Changed(None, Box::new(Err(e))),
                    Ok(text) => {
                        let (judged, first) = first_load(&thread_path, text, &config.limits);
                        kept = first;
                        judged
                    }
                },
            };
            let _ = tx.send((judged, kept));
        });
    let fail = |seen: Option<Seen>, message: String| {
        Judged::Changed(
            seen,
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
                digest_rx.try_recv().ok().map(Seen::Digest),
                format!(
                    "expected a parse within {:?}, found it still running (abandoned)",
                    config.budget
                ),
            ),
            None,
        ),
    }
}

/// An edit's judgement, with `served` what is served before it. Content last seen as the kept
/// text is read against it ([`Kept::read_file`]: compared as it is read, only where it differs
/// kept), and an edit of workload entries alone is applied to it in place; else the file is
/// read whole and compared with the digest of what was seen. An edit of workloads alone is
/// seen as the text it leaves kept; a text parsed whole is digested before its parse (one
/// abandoned over its budget, or rejected, is not judged again for the same content).
fn edited(
    path: &Path,
    limits: &Limits,
    last: Option<&Seen>,
    kept: &mut Option<Kept>,
    served: Result<Served, (Arc<ferry_core::snapshot::Snapshot>, Arc<ResourceSet>)>,
    mut digested: impl FnMut(&str) -> Vec<u8>,
) -> Judged {
    let name = path.display().to_string();
    let served = served.unwrap_or_else(|(snap, set)| Served::from_parts(&snap, set));
    if last == Some(&Seen::Kept)
        && let Some(k) = kept.as_mut()
    {
        let difference = match k.read_file(path, limits) {
            Err(e) => return Judged::Changed(None, Box::new(Err(e))),
            Ok(None) => return Judged::Unchanged(Seen::Kept),
            Ok(Some(d)) => d,
        };
        if let Some(edit) = k.edit_by(&difference, limits) {
            let reloaded = incrementally(edit, Some(&served));
            return Judged::Changed(Some(Seen::Kept), Box::new(Ok(reloaded)));
        }
        let text = difference.text(k.text());
        let digest = digested(&text);
        let parsed = reload_whole(&name, text, limits, kept, Some(&served));
        return Judged::Changed(Some(Seen::Digest(digest)), Box::new(parsed));
    }
    let text = match ferry_topology::read_file_within(path, limits) {
        Err(e) => return Judged::Changed(None, Box::new(Err(e))),
        Ok(text) => text,
    };
    let mut digest = matches!(last, Some(Seen::Digest(_))).then(|| digested(&text));
    let unchanged = match last {
        Some(Seen::Digest(d)) => digest.as_ref() == Some(d),
        Some(Seen::Kept) => kept.as_ref().is_some_and(|k| k.text() == text),
        None => false,
    };
    if unchanged {
        return Judged::Unchanged(digest.map_or(Seen::Kept, Seen::Digest));
    }
    let parsed = reload_noting(&name, text, limits, kept, Some(&served), |text| {
        if digest.is_none() {
            digest = Some(digested(text));
        }
    });
    let seen = match (&parsed, digest) {
        (Ok(r), None) if r.incremental => Some(Seen::Kept),
        (_, d) => d.map(Seen::Digest),
    };
    Judged::Changed(seen, Box::new(parsed))
}

/// The first load's judgement of `text`, and the text kept for edits; the digest only when the
/// text is not kept.
fn first_load(path: &Path, text: String, limits: &Limits) -> (Judged, Option<Kept>) {
    let name = path.display().to_string();
    match parse_keeping(&name, text, limits) {
        Err(e) => (Judged::Changed(None, Box::new(Err(e))), None),
        Ok((topology, kept)) => {
            let (digest, kept) = match kept {
                Ok(k) => (None, Some(k)),
                Err(text) => (Some(fingerprint(&text)), None),
            };
            let loaded = Reloaded {
                topology,
                served: None,
                incremental: false,
            };
            let seen = digest.map(Seen::Digest);
            (Judged::Changed(seen, Box::new(Ok(loaded))), kept)
        }
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
    reload_noting(name, text, limits, kept, served, |_| {})
}

/// [`reload`], calling `full` with the text when it is to be parsed whole, before the parse.
fn reload_noting(
    name: &str,
    text: String,
    limits: &Limits,
    kept: &mut Option<Kept>,
    served: Option<&Served>,
    full: impl FnOnce(&str),
) -> Result<Reloaded, TopologyError> {
    let text = match kept.as_mut() {
        Some(k) => match k.edit(text, limits) {
            Ok(edit) => return Ok(incrementally(edit, served)),
            Err(text) => text,
        },
        None => text,
    };
    full(&text);
    reload_whole(name, text, limits, kept, served)
}

/// An edit of workload entries alone ([`Kept::edit`]), served from `served`.
fn incrementally(
    (topology, edit): (Topology, ferry_topology::kept::WorkloadEdit),
    served: Option<&Served>,
) -> Reloaded {
    let served = served.map(|s| s.edited(&topology.snapshot, &edit.workloads));
    Reloaded {
        topology,
        served,
        incremental: true,
    }
}

/// `text` parsed whole: `kept` becomes its text (or stays, when it is rejected); served from
/// `served`, encoding only what differs.
fn reload_whole(
    name: &str,
    text: String,
    limits: &Limits,
    kept: &mut Option<Kept>,
    served: Option<&Served>,
) -> Result<Reloaded, TopologyError> {
    let (topology, new_kept) = parse_kept(name, text, limits)?;
    *kept = new_kept;
    let served = served.map(|s| s.next(&topology.snapshot));
    Ok(Reloaded {
        topology,
        served,
        incremental: false,
    })
}

/// An event that ends a write of the file named `name` in the watched directory: a rename onto
/// it (or onto `..data`, which Kubernetes' atomic writer renames last), or a writer closing it.
/// Nothing more of that write is to come, so the file is read at once.
fn ends_a_write(event: &notify::Event, name: Option<&OsStr>) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
    let target = match event.kind {
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => event.paths.first(),
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => event.paths.first(),
        _ => None,
    };
    target
        .and_then(|p| p.file_name())
        .is_some_and(|n| Some(n) == name || n == "..data")
}

/// A rename reported as one event with both its names (`RenameMode::Both`): notify's inotify
/// backend sends it right after the rename's `From` and `To`, so it says nothing new. Taken as
/// an edit it woke the watcher twice for one rename (the two events are sent back to back, but
/// the first could be taken off the channel before the second came): the file read and
/// compared again once the edit was applied.
fn repeats_a_rename(kind: &notify::EventKind) -> bool {
    use notify::event::{ModifyKind, RenameMode};
    matches!(
        kind,
        notify::EventKind::Modify(ModifyKind::Name(RenameMode::Both))
    )
}

/// An event of a file opened, read or closed unwritten: nothing it holds changed.
fn only_read(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    matches!(
        kind,
        notify::EventKind::Access(
            AccessKind::Read
                | AccessKind::Open(_)
                | AccessKind::Close(AccessMode::Read | AccessMode::Execute)
        )
    )
}

/// Content digest, so edits within one mtime tick count.
fn fingerprint(text: &str) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes())
        .as_ref()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own (`tag` and the process id) holding `text` as
    /// `topology.yaml`: the directory and the file's path.
    fn topology_file(tag: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ferry-source-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("topology.yaml");
        std::fs::write(&path, text).expect("written");
        (dir, path)
    }

    /// The first load's content counts as seen: an unchanged file is not reloaded, though it
    /// was read only once, by the load, and not digested (its text is kept); a changed one is.
    #[tokio::test]
    async fn the_first_loads_content_counts_as_seen() {
        let text = crate::testing::generated_topology(10, 2, 0);
        let (dir, path) = topology_file("first", &text);
        let config = WatchConfig::default();
        let watch = TopologyWatch::unread(path.clone(), config).expect("watched");
        assert_eq!(watch.last, None, "nothing read yet");
        let (topology, first) = load_kept(&path, config.limits, config.budget)
            .await
            .expect("loads");
        assert_eq!(topology.snapshot.workloads().count(), 10);
        assert!(first.kept.is_some());
        assert_eq!(first.digest, None, "a kept text is not digested");
        let mut watch = watch.with_kept(first);
        assert_eq!(watch.last, Some(Seen::Kept));
        assert!(watch.kept.is_some());

        let snapshot = Arc::new(topology.snapshot);
        let prior = |kept: Option<Box<Kept>>| Prior {
            served: Err((snapshot.clone(), Arc::new(ResourceSet::default()))),
            kept: kept.map(|k| *k),
        };
        let (judged, kept) = judge(
            &path,
            config,
            watch.last.take(),
            None,
            Some(prior(watch.kept.take())),
        )
        .await;
        match judged {
            Judged::Unchanged(seen) => assert_eq!(seen, Seen::Kept, "compared, not digested"),
            Judged::Changed(..) => panic!("the unchanged file was judged changed"),
        }
        let edited = format!("{text}# an edit\n");
        std::fs::write(&path, &edited).expect("written");
        let (judged, _) = judge(
            &path,
            config,
            Some(Seen::Digest(fingerprint(&text))),
            None,
            Some(prior(kept.map(Box::new))),
        )
        .await;
        match judged {
            Judged::Changed(seen, result) => {
                assert_eq!(seen, Some(Seen::Digest(fingerprint(&edited))));
                assert!(result.is_ok());
            }
            Judged::Unchanged(_) => panic!("the edited file was judged unchanged"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Opening, reading or closing a file unwritten is no edit; closing it written, or any
    /// change, may be.
    #[test]
    fn only_reads_are_ignored() {
        use notify::EventKind;
        use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind};
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ] {
            assert!(only_read(&kind), "{kind:?}");
        }
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Access(AccessKind::Any),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Create(CreateKind::File),
            EventKind::Remove(RemoveKind::File),
            EventKind::Any,
        ] {
            assert!(!only_read(&kind), "{kind:?}");
        }
    }

    /// An edit of workloads alone is seen as the text it leaves kept, undigested, and that text
    /// again is unchanged; a text parsed whole and rejected is digested, and is unchanged when
    /// it comes again (not rejected twice).
    #[tokio::test]
    async fn only_what_is_parsed_whole_is_digested() {
        let (dir, path) = topology_file("seen", &crate::testing::generated_topology(10, 2, 0));
        let config = WatchConfig::default();
        let (topology, first) = load_kept(&path, config.limits, config.budget)
            .await
            .expect("loads");
        let snapshot = Arc::new(topology.snapshot);
        let mut kept = first.kept;
        let mut judge_now = async |last: Seen| {
            let prior = Prior {
                served: Err((snapshot.clone(), Arc::new(ResourceSet::default()))),
                kept: kept.take(),
            };
            let (judged, next) = judge(&path, config, Some(last), None, Some(prior)).await;
            kept = next;
            judged
        };

        // pod0's capacity: one workload entry.
        std::fs::write(&path, crate::testing::generated_topology(10, 2, 1)).expect("written");
        match judge_now(Seen::Kept).await {
            Judged::Changed(seen, result) => {
                assert_eq!(seen, Some(Seen::Kept), "not digested");
                assert!(result.expect("applies").incremental);
            }
            Judged::Unchanged(_) => panic!("the edited file was judged unchanged"),
        }
        match judge_now(Seen::Kept).await {
            Judged::Unchanged(seen) => assert_eq!(seen, Seen::Kept),
            Judged::Changed(..) => panic!("the same text was judged changed"),
        }

        let bad = "trust_domain: [\n";
        std::fs::write(&path, bad).expect("written");
        let seen = match judge_now(Seen::Kept).await {
            Judged::Changed(seen, result) => {
                assert!(result.is_err(), "rejected");
                seen.expect("seen")
            }
            Judged::Unchanged(_) => panic!("the broken file was judged unchanged"),
        };
        assert_eq!(seen, Seen::Digest(fingerprint(bad)));
        match judge_now(seen).await {
            Judged::Unchanged(seen) => assert_eq!(seen, Seen::Digest(fingerprint(bad))),
            Judged::Changed(..) => panic!("the same broken text was judged again"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rename onto the file or onto `..data`, or the file closed written, ends a write; other
    /// events, and these on other files, do not. A rename's report with both names repeats its
    /// `To` and is no event at all.
    #[test]
    fn a_rename_onto_the_file_or_a_close_after_writing_ends_a_write() {
        use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind};
        use notify::event::{RemoveKind, RenameMode};
        use notify::{Event, EventKind};
        let name = Some(OsStr::new("topology.yaml"));
        let event = |kind, paths: &[&str]| {
            paths
                .iter()
                .fold(Event::new(kind), |e, p| e.add_path(PathBuf::from(p)))
        };
        let to = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        let both = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        for e in [
            event(to, &["/d/topology.yaml"]),
            event(to, &["/d/..data"]),
            event(closed, &["/d/topology.yaml"]),
        ] {
            assert!(ends_a_write(&e, name), "{e:?}");
        }
        for e in [
            event(to, &["/d/other.yaml"]),
            event(closed, &["/d/topology.yaml.tmp"]),
            event(
                EventKind::Modify(ModifyKind::Name(RenameMode::From)),
                &["/d/topology.yaml"],
            ),
            event(
                EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                &["/d/topology.yaml"],
            ),
            event(EventKind::Create(CreateKind::File), &["/d/topology.yaml"]),
            event(EventKind::Remove(RemoveKind::File), &["/d/topology.yaml"]),
        ] {
            assert!(!ends_a_write(&e, name), "{e:?}");
        }
        assert!(repeats_a_rename(&both));
        for kind in [
            to,
            closed,
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
        ] {
            assert!(!repeats_a_rename(&kind), "{kind:?}");
        }
    }

    /// A first text that cannot be kept (an anchor among its workloads) is digested instead, so
    /// its content counts as seen all the same.
    #[tokio::test]
    async fn a_first_text_not_kept_is_digested() {
        let text = crate::testing::generated_topology(10, 2, 0).replacen(
            "- {name: pod0,",
            "- {name: &a pod0,",
            1,
        );
        assert!(text.contains("&a pod0"), "an anchor among the workloads");
        let (dir, path) = topology_file("unkept", &text);
        let config = WatchConfig::default();
        let (_, first) = load_kept(&path, config.limits, config.budget)
            .await
            .expect("loads");
        assert!(first.kept.is_none());
        assert_eq!(first.digest, Some(fingerprint(&text)));
        let watch = TopologyWatch::unread(path.clone(), config)
            .expect("watched")
            .with_kept(first);
        assert_eq!(watch.last, Some(Seen::Digest(fingerprint(&text))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
