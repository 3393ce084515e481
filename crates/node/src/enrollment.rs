//! What this node has been asked to serve, kept on disk so that a node proxy that restarts
//! (after a crash, kill -9, or upgrade) serves every enrolled pod again without the CNI agent
//! replaying anything, and reports the pods it cannot serve.
//!
//! The file holds one `<pod uid> <netns path>` line per enrolled pod, followed by
//! ` uncaptured=<port>,...` for a pod enrolled with inbound ports left out of capture; it is
//! replaced whole (write to a temporary file, then rename) after every `add` and `del`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::WorkloadUid;

use crate::capture::Uncaptured;
use crate::pods::PodNetns;
use crate::state::Node;

/// How long a restored pod may wait for its workload to appear in the first xDS snapshot.
const RESTORE_WAIT: Duration = Duration::from_secs(10);

/// Reads the enrolled pods from `path` (none if the file does not exist). Malformed lines are
/// skipped with a warning naming them.
pub(crate) fn load(path: &Path) -> Vec<(String, PathBuf, Uncaptured)> {
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
        let words: Vec<&str> = line.split_whitespace().collect();
        let uncaptured = match words.get(2) {
            None => Some(Uncaptured::default()),
            Some(word) => Uncaptured::parse(word),
        };
        match (words.as_slice(), uncaptured) {
            ([], _) => {}
            ([uid, netns] | [uid, netns, _], Some(u)) => {
                out.push(((*uid).to_string(), PathBuf::from(netns), u));
            }
            _ => {
                tracing::warn!(path = %path.display(), line = i + 1, "skipping a malformed enrollment line (expected `<uid> <netns path> [uncaptured=<port>,...]`)")
            }
        }
    }
    out
}

/// Writes what `node` has been asked to serve: its pods, and the enrolled pods it cannot serve.
/// Not the node agent's pods: their namespaces are descriptors this process holds, and the
/// agent replays them to a node proxy that restarts.
pub(crate) fn save(node: &Node) {
    let Some(path) = &node.state_file else { return };
    let mut pods: BTreeMap<String, PathBuf> = node
        .pods()
        .iter()
        .filter(|p| !p.is_agents())
        .map(|p| (p.uid.to_string(), p.netns.path().to_path_buf()))
        .collect();
    for (uid, (netns, _)) in node.unserved.lock().iter() {
        pods.insert(uid.to_string(), netns.clone());
    }
    let uncaptured = node.uncaptured.lock().clone();
    let text: String = pods
        .iter()
        .map(|(u, p)| match uncaptured.get(&WorkloadUid::new(u)) {
            Some(ports) if !ports.is_empty() => format!("{u} {} {ports}\n", p.display()),
            _ => format!("{u} {}\n", p.display()),
        })
        .collect();
    let tmp = path.with_extension("tmp");
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::error!(path = %path.display(), error = %e, "cannot save the enrollment state");
    }
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
    tracing::info!(pods = pods.len(), path = %path.display(), "serving the enrolled pods again");
    let mut all = tokio::task::JoinSet::new();
    for (uid, netns, uncaptured) in pods {
        if !uncaptured.is_empty() {
            node.uncaptured
                .lock()
                .insert(WorkloadUid::new(&uid), uncaptured);
        }
        let node = node.clone();
        all.spawn(async move { serve_one(&node, &uid, &netns, RESTORE_WAIT).await });
    }
    while all.join_next().await.is_some() {}
    save(node);
}

/// Tries the unserved pods again (their namespace may be back, their workload known now).
pub(crate) async fn retry_unserved(node: &Arc<Node>) {
    let pending: Vec<(WorkloadUid, PathBuf)> = node
        .unserved
        .lock()
        .iter()
        .map(|(u, (p, _))| (u.clone(), p.clone()))
        .collect();
    for (uid, netns) in pending {
        // Not if it was deleted meanwhile.
        if node.unserved.lock().contains_key(&uid) {
            serve_one(node, uid.as_str(), &netns, Duration::ZERO).await;
        }
    }
}

async fn serve_one(node: &Arc<Node>, uid: &str, netns: &Path, wait: Duration) {
    match node
        .enroll(uid, PodNetns::Path(netns.to_path_buf()), wait)
        .await
    {
        Ok(_) => {
            if node
                .unserved
                .lock()
                .remove(&WorkloadUid::new(uid))
                .is_some()
            {
                tracing::info!(pod = %uid, "an enrolled pod that could not be served is served now");
            }
        }
        Err(e) => {
            let reason = e.to_string();
            let mut unserved = node.unserved.lock();
            let known = unserved
                .get(&WorkloadUid::new(uid))
                .is_some_and(|(_, r)| *r == reason);
            if !known {
                tracing::error!(pod = %uid, netns = %netns.display(), reason = %reason, "an enrolled pod cannot be served; its traffic stays blocked");
            }
            unserved.insert(WorkloadUid::new(uid), (netns.to_path_buf(), reason));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::load;
    use crate::capture::Uncaptured;

    #[test]
    fn the_state_file_reads_good_lines_and_skips_bad_ones() {
        let dir = std::env::temp_dir().join(format!("ferry-enroll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pods");
        assert!(load(&path).is_empty(), "no file: no pods");
        std::fs::write(
            &path,
            "a//v1/Pod/default/x /var/run/netns/x\n\njust-one-word\nb//v1/Pod/default/y /proc/7/ns/net extra\nc//v1/Pod/default/z /var/run/netns/z\n",
        )
        .unwrap();
        let pods = load(&path);
        assert_eq!(
            pods,
            vec![
                (
                    "a//v1/Pod/default/x".to_string(),
                    "/var/run/netns/x".into(),
                    Uncaptured::default()
                ),
                (
                    "c//v1/Pod/default/z".to_string(),
                    "/var/run/netns/z".into(),
                    Uncaptured::default()
                ),
            ]
        );
        // A pod enrolled with uncaptured inbound ports keeps them; a third word that is not
        // that is malformed.
        std::fs::write(
            &path,
            "a//v1/Pod/default/x /var/run/netns/x uncaptured=18080,17777\nb//v1/Pod/default/y /var/run/netns/y uncaptured=15008\n",
        )
        .unwrap();
        assert_eq!(
            load(&path),
            vec![(
                "a//v1/Pod/default/x".to_string(),
                "/var/run/netns/x".into(),
                Uncaptured::parse("uncaptured=17777,18080").unwrap()
            )]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
