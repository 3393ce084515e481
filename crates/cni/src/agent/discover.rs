//! Pods that started before the agent (or while it was down): the plugin never told of them, so
//! the agent finds their network namespaces itself, as Istio's CNI agent does. It looks at the
//! network namespace of every process of the node (`/proc/<pid>/ns/net`, each namespace once,
//! by its inode; the agent's own, the host's, left out), reads the addresses of that
//! namespace's interfaces, and takes as a pod's namespace the one that holds the pod's IP from
//! its Pod status.
//!
//! An IP held by two namespaces is ambiguous, and neither is taken: an address is what a
//! process in a namespace can configure, so the agent only hands over a namespace that is the
//! one place the pod's address lives.
//!
//! [`matches`] is the pure decision; [`scan`] the I/O (entering each namespace on a thread of
//! its own, `ferry_runtime::netns`, to list its addresses).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ferry_runtime::netns::Netns;

/// One network namespace of the node, as the scan saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Its nsfs inode (what tells one namespace from another).
    pub(crate) inode: u64,
    /// A path that names it: `/proc/<pid>/ns/net` of one of its processes.
    pub(crate) path: PathBuf,
    /// The addresses of its interfaces.
    pub(crate) ips: BTreeSet<IpAddr>,
}

/// A pod looked for, by the key the agent keeps it under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wanted {
    pub(crate) key: String,
    /// Its IPs from the Pod status (`status.podIPs`).
    pub(crate) ips: Vec<IpAddr>,
}

/// What the scan found of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The one namespace that holds its IPs.
    At { path: PathBuf, inode: u64 },
    /// No namespace holds any of its IPs.
    Nowhere,
    /// More than one namespace holds its IPs (their inodes): none is taken.
    Ambiguous(Vec<u64>),
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::At { path, inode } => write!(f, "{} (inode {inode})", path.display()),
            Self::Nowhere => {
                f.write_str("no network namespace of this node's processes holds the pod's IP")
            }
            Self::Ambiguous(inodes) => write!(
                f,
                "the pod's IP is held by more than one network namespace (inodes {inodes:?}); none is taken"
            ),
        }
    }
}

/// Where each wanted pod's namespace is, among `seen` (pure).
pub(crate) fn matches(seen: &[Seen], wanted: &[Wanted]) -> BTreeMap<String, Found> {
    wanted
        .iter()
        .map(|w| {
            let holders: Vec<&Seen> = seen
                .iter()
                .filter(|s| w.ips.iter().any(|ip| s.ips.contains(ip)))
                .collect();
            let found = match holders.as_slice() {
                [] => Found::Nowhere,
                [one] => Found::At {
                    path: one.path.clone(),
                    inode: one.inode,
                },
                many => Found::Ambiguous(many.iter().map(|s| s.inode).collect()),
            };
            (w.key.clone(), found)
        })
        .collect()
}

/// Every network namespace of the processes under `proc` (each once), but the agent's own
/// (`/proc/self`: `proc` may be the host's procfs mounted elsewhere),
/// with its interfaces' addresses. A process that ends meanwhile, or whose namespace cannot be
/// entered, is left out (logged).
pub(crate) async fn scan(proc: &Path) -> std::io::Result<Vec<Seen>> {
    let own = std::fs::metadata("/proc/self/ns/net")?.ino();
    let mut inodes = BTreeSet::from([own]);
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(proc)? {
        let Ok(entry) = entry else { continue };
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let path = entry.path().join("ns/net");
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if !inodes.insert(meta.ino()) {
            continue;
        }
        match addresses(&path, meta.ino()).await {
            Ok(ips) => seen.push(Seen {
                inode: meta.ino(),
                path,
                ips,
            }),
            Err(e) => {
                tracing::debug!(netns = %path.display(), error = %e, "a process's network namespace could not be read; left out");
            }
        }
    }
    Ok(seen)
}

/// The addresses of the interfaces of the namespace at `path`, if it is still `inode`.
async fn addresses(path: &Path, inode: u64) -> std::io::Result<BTreeSet<IpAddr>> {
    let netns = Netns::open(path)?;
    if netns.id().1 != inode {
        return Err(std::io::Error::other(
            "the process ended; its pid names another namespace",
        ));
    }
    netns
        .run(|| -> std::io::Result<BTreeSet<IpAddr>> {
            let all = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
            Ok(all
                .filter_map(|a| a.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|v4| IpAddr::V4(v4.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                })
                .collect())
        })
        .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(inode: u64, ips: &[&str]) -> Seen {
        Seen {
            inode,
            path: PathBuf::from(format!("/proc/{inode}/ns/net")),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
        }
    }

    fn wanted(key: &str, ips: &[&str]) -> Wanted {
        Wanted {
            key: key.into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn a_pod_is_the_one_namespace_holding_its_ip_and_never_an_ambiguous_one() {
        let node = [
            seen(1, &["127.0.0.1", "198.18.62.10"]),
            seen(2, &["127.0.0.1", "198.18.62.11", "fd00::11"]),
            seen(3, &["198.18.62.12"]),
            seen(4, &["198.18.62.12"]),
        ];
        let found = matches(
            &node,
            &[
                wanted("web", &["198.18.62.10"]),
                wanted("dual", &["fd00::11"]),
                wanted("gone", &["198.18.62.99"]),
                wanted("twice", &["198.18.62.12"]),
                wanted("none", &[]),
            ],
        );
        assert_eq!(
            found["web"],
            Found::At {
                path: "/proc/1/ns/net".into(),
                inode: 1
            }
        );
        assert_eq!(
            found["dual"],
            Found::At {
                path: "/proc/2/ns/net".into(),
                inode: 2
            }
        );
        assert_eq!(found["gone"], Found::Nowhere);
        assert_eq!(found["twice"], Found::Ambiguous(vec![3, 4]));
        assert_eq!(found["none"], Found::Nowhere);
        // Loopback is in every namespace: it is no pod's address.
        assert!(matches!(
            matches(&node, &[wanted("lo", &["127.0.0.1"])])["lo"],
            Found::Ambiguous(_)
        ));
    }
}
