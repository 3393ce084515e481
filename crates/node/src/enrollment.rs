//! What this node serves, kept on disk: the fallback for a node proxy that restarts (after a
//! crash, kill -9, or upgrade) while its node agent is not there to replay. The agent's replay
//! stays authoritative: once it comes, pods it does not name are released ([`crate::zds`]).
//!
//! The agent hands each pod over as a descriptor of its network namespace, which names no path.
//! The path is found where runtimes bind-mount pod namespaces ([`NETNS_DIRS`]: `ip netns`,
//! containerd and CRI-O alike) by the namespace's identity (nsfs device and inode); a pod whose
//! namespace is mounted nowhere there cannot be restored without the agent, and is left out.
//!
//! The file (mode 0600, replaced whole after every add and del: a temporary file, then a
//! rename) holds one line per pod:
//!
//! ```text
//! <pod uid> <netns path> ns=<device>:<inode> [uncaptured=<port>,...]
//! ```
//!
//! A path is restored only while it still names that namespace: one deleted and created again
//! under the same name is another pod's sandbox (or nobody's), never served as the old pod.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::WorkloadUid;

use crate::capture::Uncaptured;
use crate::recorded::{Recorded, Unserved};
use crate::state::Node;

/// How long a restored pod may wait for its workload to appear in the first xDS snapshot.
const RESTORE_WAIT: Duration = Duration::from_secs(10);

/// How often pods that could not be served are tried again, while any is left (besides on
/// every new snapshot).
const RETRY: Duration = Duration::from_secs(2);

/// Where runtimes bind-mount pods' network namespaces: `ip netns` and containerd use
/// `/var/run/netns`, which is `/run/netns` where `/var/run` links to `/run`.
const NETNS_DIRS: [&str; 2] = ["/var/run/netns", "/run/netns"];

/// One pod of the state file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) uid: WorkloadUid,
    pub(crate) netns: Recorded,
    pub(crate) uncaptured: Uncaptured,
}

// === impl Entry ===

impl Entry {
    /// Reads one line of the state file; `None` if it is malformed.
    fn parse(line: &str) -> Option<Self> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (uid, path, id, uncaptured) = match words.as_slice() {
            [uid, path, id] => (uid, path, id, Uncaptured::default()),
            [uid, path, id, ports] => (uid, path, id, Uncaptured::parse(ports)?),
            _ => return None,
        };
        let (dev, ino) = id.strip_prefix("ns=")?.split_once(':')?;
        Some(Self {
            uid: WorkloadUid::new(*uid),
            netns: Recorded {
                path: PathBuf::from(path),
                id: (dev.parse().ok()?, ino.parse().ok()?),
            },
            uncaptured,
        })
    }

    /// Its line in the state file.
    fn line(&self) -> String {
        let Recorded { path, id } = &self.netns;
        let mut line = format!("{} {} ns={}:{}", self.uid, path.display(), id.0, id.1);
        if !self.uncaptured.is_empty() {
            line.push_str(&format!(" {}", self.uncaptured));
        }
        line.push('\n');
        line
    }
}

/// Reads the enrolled pods from `path` (none if the file does not exist). Malformed lines are
/// skipped with a warning naming them.
pub(crate) fn load(path: &Path) -> Vec<Entry> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the enrollment state");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match Entry::parse(line) {
            Some(e) => out.push(e),
            None => {
                tracing::warn!(path = %path.display(), line = i + 1, "skipping a malformed enrollment line (expected `<uid> <netns path> ns=<device>:<inode> [uncaptured=<port>,...]`)")
            }
        }
    }
    out
}

/// The namespaces mounted in `dirs`, by identity (the first path found for each).
fn mounted(dirs: &[&str]) -> HashMap<(u64, u64), PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let mut found = HashMap::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if let Ok(m) = std::fs::metadata(&path) {
                found.entry((m.dev(), m.ino())).or_insert(path);
            }
        }
    }
    found
}

/// Writes what `node` serves and what it was asked to serve but cannot: each pod whose
/// namespace is mounted in [`NETNS_DIRS`].
pub(crate) fn save(node: &Node) {
    let Some(path) = &node.state_file else { return };
    let mounted = mounted(&NETNS_DIRS);
    let uncaptured = node.uncaptured.lock().clone();
    let mut pods: BTreeMap<WorkloadUid, Recorded> = BTreeMap::new();
    for pod in node.pods() {
        let id = pod.netns.id();
        match mounted.get(&id) {
            Some(p) => {
                pods.insert(
                    pod.uid.clone(),
                    Recorded {
                        path: p.clone(),
                        id,
                    },
                );
            }
            None => {
                tracing::debug!(pod = %pod.uid, dirs = ?NETNS_DIRS, "the pod's network namespace is mounted in none of the directories: only its node agent can hand it over again")
            }
        }
    }
    for (uid, u) in node.unserved.lock().iter() {
        pods.insert(uid.clone(), u.netns.clone());
    }
    let text: String = pods
        .into_iter()
        .map(|(uid, netns)| {
            let uncaptured = uncaptured.get(&uid).cloned().unwrap_or_default();
            Entry {
                uid,
                netns,
                uncaptured,
            }
            .line()
        })
        .collect();
    if let Err(e) = write_private(path, &text) {
        tracing::error!(path = %path.display(), error = %e, "cannot save the enrollment state");
    }
}

/// Replaces `path` with `text`, readable by this user only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Serves again every pod in the state file; a pod that cannot be served is recorded (and
/// reported by `/ready`, `/metrics` and the log) and tried again by [`retry_unserved`].
pub(crate) async fn restore(node: &Arc<Node>) {
    let Some(path) = node.state_file.clone() else {
        return;
    };
    let pods = load(&path);
    if pods.is_empty() {
        return;
    }
    tracing::info!(pods = pods.len(), path = %path.display(), "serving the pods of the state file again");
    let mut all = tokio::task::JoinSet::new();
    for Entry {
        uid,
        netns,
        uncaptured,
    } in pods
    {
        if !uncaptured.is_empty() {
            node.uncaptured.lock().insert(uid.clone(), uncaptured);
        }
        let node = node.clone();
        all.spawn(async move { serve_one(&node, &uid, netns, RESTORE_WAIT, Retry::No).await });
    }
    while all.join_next().await.is_some() {}
    save(node);
}

/// Tries the pods of the state file that could not be served again: on every new snapshot (a
/// workload may be known now), and every [`RETRY`] while any is left (a failure may be
/// transient). A namespace created again under the recorded path never matches again.
pub(crate) async fn keep_retrying(node: Arc<Node>) {
    let mut changes = node.changes.clone();
    loop {
        retry_unserved(&node).await;
        let pending = !node.unserved.lock().is_empty();
        tokio::select! {
            changed = changes.changed() => if changed.is_err() {
                return;
            },
            () = tokio::time::sleep(RETRY), if pending => {}
        }
    }
}

/// Tries the unserved pods again (their workload may be known now).
async fn retry_unserved(node: &Arc<Node>) {
    let pending: Vec<(WorkloadUid, Recorded)> = node
        .unserved
        .lock()
        .iter()
        .map(|(u, un)| (u.clone(), un.netns.clone()))
        .collect();
    let mut served = false;
    for (uid, netns) in pending {
        // Not if it was released meanwhile.
        if node.unserved.lock().contains_key(&uid) {
            served |= serve_one(node, &uid, netns, Duration::ZERO, Retry::Yes).await;
        }
    }
    if served {
        save(node);
    }
}

/// Whether [`serve_one`] tries a pod again: then one released while it was being served (by
/// the agent's replay) is not served after all.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    Yes,
    No,
}

/// Serves `uid` in its recorded namespace, or records why it cannot be; whether it is served
/// now.
async fn serve_one(
    node: &Arc<Node>,
    uid: &WorkloadUid,
    netns: Recorded,
    wait: Duration,
    retry: Retry,
) -> bool {
    let served = match netns.open() {
        Ok(file) => node
            .enroll(uid.as_str(), file.into(), wait)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match served {
        Ok(()) => {
            let was_unserved = node.unserved.lock().remove(uid).is_some();
            if retry == Retry::Yes && !was_unserved {
                node.remove(uid.as_str()).await;
                return false;
            }
            if was_unserved {
                tracing::info!(pod = %uid, "an enrolled pod that could not be served is served now");
            }
            true
        }
        Err(reason) => {
            let mut unserved = node.unserved.lock();
            let known = unserved.get(uid).is_some_and(|u| u.reason == reason);
            if !known {
                tracing::error!(pod = %uid, netns = %netns.path.display(), reason = %reason, "an enrolled pod cannot be served; its traffic stays blocked");
            }
            unserved.insert(uid.clone(), Unserved { netns, reason });
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uid: &str, path: &str, id: (u64, u64), uncaptured: Uncaptured) -> Entry {
        Entry {
            uid: WorkloadUid::new(uid),
            netns: Recorded {
                path: path.into(),
                id,
            },
            uncaptured,
        }
    }

    #[test]
    fn the_state_file_reads_good_lines_and_skips_bad_ones() {
        let dir = std::env::temp_dir().join(format!("ferry-enroll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pods");
        assert!(load(&path).is_empty(), "no file: no pods");
        std::fs::write(
            &path,
            "a//v1/Pod/default/x /var/run/netns/x ns=4:4026532301\n\
             \n\
             just-one-word\n\
             old//v1/Pod/default/o /var/run/netns/o\n\
             b//v1/Pod/default/y /var/run/netns/y ns=4:notanumber\n\
             c//v1/Pod/default/z /var/run/netns/z ns=4:4026532302 uncaptured=18080,17777\n\
             d//v1/Pod/default/w /var/run/netns/w ns=4:4026532303 uncaptured=15008\n\
             e//v1/Pod/default/v /var/run/netns/v ns=4:4026532304 extra words\n",
        )
        .unwrap();
        assert_eq!(
            load(&path),
            vec![
                entry(
                    "a//v1/Pod/default/x",
                    "/var/run/netns/x",
                    (4, 4026532301),
                    Uncaptured::default()
                ),
                entry(
                    "c//v1/Pod/default/z",
                    "/var/run/netns/z",
                    (4, 4026532302),
                    Uncaptured::parse("uncaptured=17777,18080").unwrap()
                ),
            ],
            "a line without the namespace's identity (an older node proxy's), a bad identity, \
             a proxy port left out and extra words are skipped"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_line_reads_back_as_written() {
        for e in [
            entry(
                "a//v1/Pod/default/x",
                "/run/netns/x",
                (4, 7),
                Uncaptured::default(),
            ),
            entry(
                "b",
                "/var/run/netns/cni-1",
                (3, 4026532000),
                Uncaptured::new(vec![18080, 17777]),
            ),
        ] {
            assert_eq!(Entry::parse(&e.line()), Some(e));
        }
    }
}
