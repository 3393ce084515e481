//! The agent's pods: each enrolled pod with its network namespace held open, each pod the
//! plugin told of but not enrolled (with Kubernetes: it may be enrolled later, when a label
//! changes) with its namespace's path, and the file that keeps them across restarts of the agent
//! (so the pods that started before it are served again: it reopens their namespaces and
//! replays them to the node proxy).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::spec::PodRef;

/// One pod the plugin told of.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    pub(crate) kept: Kept,
    /// The pod's network namespace, held open while the pod is enrolled; `None`: not enrolled.
    pub(crate) netns: Option<Arc<File>>,
}

/// What the state file holds of a pod.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    #[serde(flatten)]
    kept: Kept,
    /// Files written before pods could be known without being enrolled hold only enrolled ones.
    #[serde(default = "enrolled_by_default")]
    enrolled: bool,
}

fn enrolled_by_default() -> bool {
    true
}

/// What the state file keeps of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Kept {
    pub(crate) pod: PodRef,
    pub(crate) container_id: String,
    pub(crate) netns: PathBuf,
    /// For a namespace the agent found itself (`/proc/<pid>/ns/net` of a pod that started
    /// before it), its inode: the path names it only while that process lives, and another
    /// namespace once the pid is reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inode: Option<u64>,
    /// Inbound ports left out of the pod's capture, as the enroller asked
    /// ([`crate::wire::Ask::Add`]); sent with every add of the pod, replays too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) uncaptured: Vec<u16>,
}

impl Kept {
    /// Opens the pod's network namespace; an error when it is gone, or when the path now names
    /// another namespace than the one found.
    pub(crate) fn open(&self) -> std::io::Result<File> {
        let f = File::open(&self.netns)?;
        if let Some(want) = self.inode {
            use std::os::unix::fs::MetadataExt;
            let got = f.metadata()?.ino();
            if got != want {
                return Err(std::io::Error::other(format!(
                    "{} now names another network namespace (inode {got}, the pod's was {want}): the pod's process ended",
                    self.netns.display()
                )));
            }
        }
        Ok(f)
    }
}

/// The pods, by the uid the node proxy knows them by ([`uid`]).
#[derive(Debug, Default)]
pub(crate) struct Pods(BTreeMap<String, Pod>);

/// The uid a pod is handed over with: the Kubernetes pod uid when the runtime says it, else
/// `namespace/name`, else the container id (outside Kubernetes).
pub(crate) fn uid(pod: &PodRef, container_id: &str) -> String {
    if !pod.uid.is_empty() {
        pod.uid.clone()
    } else if !pod.name.is_empty() {
        format!("{}/{}", pod.namespace, pod.name)
    } else {
        container_id.to_string()
    }
}

// === impl Pods ===

impl Pods {
    pub(crate) fn get(&self, uid: &str) -> Option<&Pod> {
        self.0.get(uid)
    }

    pub(crate) fn insert(&mut self, uid: String, pod: Pod) {
        self.0.insert(uid, pod);
    }

    pub(crate) fn remove(&mut self, uid: &str) -> Option<Pod> {
        self.0.remove(uid)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Pod)> {
        self.0.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The enrolled pods, with their namespaces.
    pub(crate) fn enrolled(&self) -> impl Iterator<Item = (&String, &Kept, &Arc<File>)> {
        self.0
            .iter()
            .filter_map(|(u, p)| p.netns.as_ref().map(|n| (u, &p.kept, n)))
    }

    pub(crate) fn get_mut(&mut self, uid: &str) -> Option<&mut Pod> {
        self.0.get_mut(uid)
    }

    /// Writes what is kept of every pod to `path` (0600, replaced whole).
    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let saved: Vec<Saved> = self
            .0
            .values()
            .map(|p| Saved {
                kept: p.kept.clone(),
                enrolled: p.netns.is_some(),
            })
            .collect();
        let text = serde_json::to_vec_pretty(&saved)?;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// The pods kept in `path` whose namespaces still exist (the enrolled ones reopened); each
    /// one that does not is named in the second list, with why. No file is no pods.
    pub(crate) fn load(path: &Path) -> anyhow::Result<(Self, Vec<String>)> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        };
        let saved: Vec<Saved> = serde_json::from_slice(&text)
            .map_err(|e| anyhow::anyhow!("{} is not the agent's pod list: {e}", path.display()))?;
        let mut pods = Self::default();
        let mut gone = Vec::new();
        for Saved { kept: k, enrolled } in saved {
            let opened = k.open().map(|f| enrolled.then(|| Arc::new(f)));
            match opened {
                Ok(netns) => {
                    let id = uid(&k.pod, &k.container_id);
                    pods.insert(id, Pod { kept: k, netns });
                }
                Err(e) => gone.push(format!("{}: {e}", k.netns.display())),
            }
        }
        Ok((pods, gone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uid_is_the_pods_own_else_its_name_else_the_container() {
        let mut p = PodRef {
            namespace: "shop".into(),
            name: "web".into(),
            uid: "u-1".into(),
        };
        assert_eq!(uid(&p, "c"), "u-1");
        p.uid.clear();
        assert_eq!(uid(&p, "c"), "shop/web");
        assert_eq!(uid(&PodRef::default(), "c"), "c");
    }

    #[test]
    fn kept_pods_come_back_when_their_namespace_exists_and_are_named_when_not() {
        let dir = std::env::temp_dir().join(format!("ferry-cni-pods-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ns = dir.join("ns");
        std::fs::write(&ns, b"").unwrap();
        let mut pods = Pods::default();
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&ns).unwrap().ino();
        for (name, path, enrolled, inode) in [
            ("web", ns.clone(), true, None),
            ("known", ns.clone(), false, None),
            ("found", ns.clone(), true, Some(ino)),
            ("gone", dir.join("missing"), true, None),
            // Found by the agent in a process's namespace; the path names another one now.
            ("moved", ns.clone(), true, Some(ino + 1)),
        ] {
            let kept = Kept {
                pod: PodRef {
                    namespace: "shop".into(),
                    name: name.into(),
                    uid: String::new(),
                },
                container_id: name.into(),
                netns: path,
                inode,
                uncaptured: if name == "web" {
                    vec![18080]
                } else {
                    Vec::new()
                },
            };
            pods.insert(
                uid(&kept.pod, name),
                Pod {
                    kept,
                    netns: enrolled.then(|| Arc::new(File::open(&ns).unwrap())),
                },
            );
        }
        let state = dir.join("pods.json");
        pods.save(&state).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (back, gone) = Pods::load(&state).unwrap();
        assert_eq!(back.len(), 3);
        assert!(back.get("shop/web").unwrap().netns.is_some());
        assert_eq!(
            back.get("shop/web").unwrap().kept.uncaptured,
            [18080],
            "a pod's uncaptured ports are kept, to be replayed"
        );
        assert!(back.get("shop/found").unwrap().netns.is_some());
        assert!(back.get("shop/moved").is_none());
        assert!(
            back.get("shop/known").unwrap().netns.is_none(),
            "a pod known but not enrolled comes back not enrolled"
        );
        // A file written before pods could be known without being enrolled.
        let old = format!(
            r#"[{{"pod": {{"namespace": "shop", "name": "old", "uid": ""}}, "container_id": "c", "netns": {:?}}}]"#,
            ns.display().to_string()
        );
        std::fs::write(&state, old).unwrap();
        let (back, _) = Pods::load(&state).unwrap();
        assert!(back.get("shop/old").unwrap().netns.is_some());
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(
            gone[1].contains("now names another network namespace"),
            "{gone:?}"
        );
        std::fs::write(&state, b"{").unwrap();
        assert!(Pods::load(&state).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
