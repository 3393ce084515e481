//! Keeps every enrolled pod served while its network namespace comes and goes: a pod whose
//! namespace is gone is reported, one whose namespace was created again is served in the new
//! one, and pods that could not be served are tried again. (Their capture rules are kept by
//! each pod's own watcher, on ruleset events: `Node::keep_rules`.)
//!
//! Woken by events, not by a clock: the directories holding the pods' namespace paths (inotify:
//! `ip netns add`/`del` and a CNI's bind mounts create and remove entries there), each new
//! snapshot (an unserved pod's workload may be known now), and each pod served (its directory is
//! watched from then on). Two timers stay: a retry every [`RETRY`] while some pod cannot be
//! served (its failure may be transient), and a check every [`SAFETY_CHECK`] for what has no
//! directory events (`/proc/<pid>/ns/net` paths) or an event lost.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher as _;

use crate::state::Node;

/// How often pods that could not be served are tried again, while any is left.
const RETRY: Duration = Duration::from_secs(2);

/// The check that catches what no event tells of.
const SAFETY_CHECK: Duration = Duration::from_secs(30);

pub(crate) async fn keep_served(node: Arc<Node>) {
    let woken = Arc::new(tokio::sync::Notify::new());
    let wake = woken.clone();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok() {
            wake.notify_one();
        }
    })
    .inspect_err(|e| {
        tracing::warn!(error = %e, "cannot watch the pods' namespace directories; checking every 30 s");
    })
    .ok();
    let mut watched: HashSet<PathBuf> = HashSet::new();
    let mut changes = node.changes.clone();
    loop {
        if let Some(w) = watcher.as_mut() {
            for dir in directories(&node) {
                if watched.contains(&dir) {
                    continue;
                }
                match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        watched.insert(dir);
                    }
                    // Tried again on the next wake-up (the directory may not exist yet).
                    Err(e) => {
                        tracing::debug!(dir = %dir.display(), error = %e, "cannot watch a namespace directory")
                    }
                }
            }
        }
        crate::enrollment::retry_unserved(&node).await;
        check(&node).await;
        let next = if node.unserved.lock().is_empty() {
            SAFETY_CHECK
        } else {
            RETRY
        };
        tokio::select! {
            () = woken.notified() => {}
            () = node.pod_served.notified() => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// The directories of every enrolled pod's namespace path, served or not; none under `/proc`,
/// which has no directory events.
fn directories(node: &Node) -> HashSet<PathBuf> {
    let mut paths: Vec<PathBuf> = node
        .pods()
        .iter()
        .map(|p| p.netns.path().to_path_buf())
        .collect();
    paths.extend(node.unserved.lock().values().map(|(p, _)| p.clone()));
    paths
        .iter()
        .filter(|p| !p.starts_with("/proc"))
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect()
}

/// Reports pods whose namespace is gone, and serves again those whose namespace was re-created.
async fn check(node: &Arc<Node>) {
    for pod in node.pods() {
        let path = pod.netns.path().to_path_buf();
        if !path.exists() {
            tracing::error!(pod = %pod.uid, netns = %path.display(), "the pod's network namespace is gone; remove the pod or enroll it again");
            continue;
        }
        if pod.netns.replaced() {
            tracing::warn!(pod = %pod.uid, netns = %path.display(), "the pod's network namespace was created again: serving the new one");
            if let Err(e) = node.reenroll(&pod.uid).await {
                tracing::error!(pod = %pod.uid, error = %e, "cannot serve the re-created namespace; its traffic stays blocked");
                node.unserved
                    .lock()
                    .insert(pod.uid.clone(), (path.clone(), e.to_string()));
            }
        }
    }
}
