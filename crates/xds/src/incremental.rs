//! A push applied incrementally: the resources it changed become a [`SnapshotDelta`] on the
//! snapshot the client serves, so an edit costs what it touches, not what the mesh holds.
//!
//! The delta carries exactly what a full [`assemble`](crate::assemble::assemble) of the held
//! resources would change: the resources themselves; the workloads whose skipped references
//! (to services or policies the client does not have) change with them; the clusters (the
//! network of their resources) and nodes (cluster and locality of the first workload by name on
//! each) derived from the workloads. Whenever the answer could differ from a full assembly (a
//! gateway changed, a resource whose network is not its cluster's, or a delta the snapshot
//! rejects), [`delta`] says so and the caller assembles in full, which also sets aside the
//! resources to blame.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ferry_core::keyed_hash::{HashMap as KeyedMap, HashSet};

use ferry_core::model::{
    Cluster, ClusterId, NetworkId, Node, NodeName, PolicyKey, ServiceKey, Workload,
};
use ferry_core::snapshot::{Endpoint, Snapshot, SnapshotDelta};

use crate::assemble::{Held, assemble, map_at};
use crate::convert::{Decoded, InvalidResource};
use crate::index::Index;

/// What a push changed: every resource name it added, changed or removed (or that no longer
/// decodes), with what was held under it before.
#[derive(Debug, Default)]
pub struct Changed {
    pub addresses: HashMap<String, Option<Decoded>>,
    pub policies: HashMap<String, Option<Arc<ferry_core::model::Policy>>>,
}

impl Index {
    /// The index of `held`, whose resources `version` was assembled from in full (`None`: no
    /// snapshot came of them).
    pub(crate) fn of(held: &Held, version: Option<u64>) -> Self {
        let keys = Keys::of(held);
        let mut index = Self {
            synced: version,
            ..Self::default()
        };
        // Whether a service map names a service not held, by the map's address (see
        // `assemble::try_build`).
        let mut names_missing: KeyedMap<usize, bool> = KeyedMap::default();
        for (name, d) in &held.addresses {
            match d {
                Decoded::Workload(w) => {
                    index.count_member(&w.cluster);
                    let missing = *names_missing
                        .entry(map_at(&w.services))
                        .or_insert_with(|| w.services.keys().any(|k| !keys.services.contains(k)));
                    if missing || !w.authorization_policies.is_empty() {
                        index.note_dangling(name, w, &|k| keys.services.contains(k), &|k| {
                            keys.policies.contains(k)
                        });
                    }
                }
                Decoded::Gateway(g) => index.count_member(&g.cluster),
                Decoded::Service(_) => {}
            }
        }
        index
    }

    /// One more workload or gateway in `cluster` (its name copied only the first time).
    fn count_member(&mut self, cluster: &ClusterId) {
        match self.cluster_members.get_mut(cluster) {
            Some(n) => *n += 1,
            None => {
                self.cluster_members.insert(cluster.clone(), 1);
            }
        }
    }

    fn note_dangling(
        &mut self,
        name: &str,
        w: &Workload,
        has_service: &dyn Fn(&ServiceKey) -> bool,
        has_policy: &dyn Fn(&PolicyKey) -> bool,
    ) {
        for k in w.services.keys().filter(|k| !has_service(k)) {
            let names = self.dangling_services.entry(k.clone()).or_default();
            names.insert(name.to_string());
        }
        for k in w.authorization_policies.iter().filter(|k| !has_policy(k)) {
            let names = self.dangling_policies.entry(k.clone()).or_default();
            names.insert(name.to_string());
        }
    }

    fn forget_dangling(&mut self, name: &str, w: &Workload) {
        for k in w.services.keys() {
            forget(&mut self.dangling_services, k, name);
        }
        for k in &w.authorization_policies {
            forget(&mut self.dangling_policies, k, name);
        }
    }
}

fn forget<K: std::hash::Hash + Eq>(map: &mut KeyedMap<K, BTreeSet<String>>, key: &K, name: &str) {
    if let Some(names) = map.get_mut(key) {
        names.remove(name);
        if names.is_empty() {
            map.remove(key);
        }
    }
}

/// The service and policy keys of what is held.
struct Keys {
    services: HashSet<ServiceKey>,
    policies: HashSet<PolicyKey>,
}

impl Keys {
    fn of(held: &Held) -> Self {
        let services = held
            .addresses
            .values()
            .filter_map(|d| match d {
                Decoded::Service(s) => Some(s.key()),
                _ => None,
            })
            .collect();
        let policies = held.policies.values().map(|p| p.key()).collect();
        Self { services, policies }
    }
}

/// `w` without the references it makes to services or policies that are not held.
fn live(
    w: &Arc<Workload>,
    has_service: &dyn Fn(&ServiceKey) -> bool,
    has_policy: &dyn Fn(&PolicyKey) -> bool,
) -> Arc<Workload> {
    let dangling = w.services.keys().any(|k| !has_service(k))
        || w.authorization_policies.iter().any(|k| !has_policy(k));
    if !dangling {
        return w.clone();
    }
    let mut w = (**w).clone();
    w.services.make_mut().retain(|k, _| has_service(k));
    w.authorization_policies.retain(|k| has_policy(k));
    Arc::new(w)
}

/// The delta that takes `current` (assembled from the resources held before `changed`) to
/// what assembling `held` in full gives, updating `held`'s index on the way; `None` when only
/// a full assembly can tell (the index is then rebuilt with it).
pub(crate) fn delta(
    held: &mut Held,
    current: &Snapshot,
    changed: &Changed,
    version: u64,
) -> Option<SnapshotDelta> {
    if held.index.synced != Some(current.version()) {
        return None;
    }
    let mut d = SnapshotDelta::new(version);
    // Services and policies that come and go, and the resources themselves.
    let (mut services_out, mut services_in) = (HashSet::default(), HashSet::default());
    let mut members: HashMap<ClusterId, Vec<NetworkId>> = HashMap::new();
    let mut nodes: BTreeSet<NodeName> = BTreeSet::new();
    for (name, old) in &changed.addresses {
        match old {
            Some(Decoded::Service(s)) => {
                services_out.insert(s.key());
                d.removed_services.push(s.key());
            }
            Some(Decoded::Workload(w)) => {
                d.removed_workloads.push(w.uid.clone());
                held.index.forget_dangling(name, w);
                count_down(&mut held.index.cluster_members, &w.cluster);
                members.entry(w.cluster.clone()).or_default();
                nodes.extend(w.node.clone());
            }
            Some(Decoded::Gateway(_)) => return None,
            None => {}
        }
        match held.addresses.get(name.as_str()) {
            Some(Decoded::Service(s)) => {
                services_in.insert(s.key());
                d.services.push(s.clone());
            }
            Some(Decoded::Workload(w)) => {
                *held
                    .index
                    .cluster_members
                    .entry(w.cluster.clone())
                    .or_default() += 1;
                members
                    .entry(w.cluster.clone())
                    .or_default()
                    .push(w.network.clone());
                nodes.extend(w.node.clone());
            }
            Some(Decoded::Gateway(_)) => return None,
            None => {}
        }
    }
    let (mut policies_out, mut policies_in) = (HashSet::default(), HashSet::default());
    for (name, old) in &changed.policies {
        if let Some(p) = old {
            policies_out.insert(p.key());
            d.removed_policies.push(p.key());
        }
        if let Some(p) = held.policies.get(name) {
            policies_in.insert(p.key());
            d.policies.push(p.clone());
        }
    }
    let has_service = |k: &ServiceKey| {
        services_in.contains(k) || (!services_out.contains(k) && current.service(k).is_some())
    };
    let has_policy = |k: &PolicyKey| {
        policies_in.contains(k) || (!policies_out.contains(k) && current.policy(k).is_some())
    };
    // Workloads whose skipped references change: they name a key that came or went.
    let mut again: BTreeSet<String> = BTreeSet::new();
    for k in services_out.union(&services_in) {
        if current.service(k).is_some() && !has_service(k) {
            again.extend(current.endpoints(k).iter().filter_map(|e| match e {
                Endpoint::Workload(uid) => Some(uid.to_string()),
                Endpoint::Address(_) => None,
            }));
        } else if current.service(k).is_none() && has_service(k) {
            again.extend(
                held.index
                    .dangling_services
                    .get(k)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
    }
    for k in policies_out.union(&policies_in) {
        if current.policy(k).is_some() && !has_policy(k) {
            if current.is_policy_named(k) {
                again.extend(held.addresses.iter().filter_map(|(n, r)| match r {
                    Decoded::Workload(w) if w.authorization_policies.contains(k) => {
                        Some(n.to_string())
                    }
                    _ => None,
                }));
            }
        } else if current.policy(k).is_none() && has_policy(k) {
            again.extend(
                held.index
                    .dangling_policies
                    .get(k)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
    }
    let rederive = again
        .iter()
        .filter(|n| !changed.addresses.contains_key(*n))
        .chain(changed.addresses.keys());
    for name in rederive {
        if let Some(Decoded::Workload(w)) = held.addresses.get(name.as_str()) {
            held.index.forget_dangling(name, w);
            held.index.note_dangling(name, w, &has_service, &has_policy);
            d.workloads.push(live(w, &has_service, &has_policy));
        }
    }
    // Clusters: a cluster's resources all carry its network (a full assembly sets the others
    // aside); one that comes with its first resources takes theirs.
    for (cluster, networks) in members {
        let left = held
            .index
            .cluster_members
            .get(&cluster)
            .copied()
            .unwrap_or(0);
        let network = match current.cluster(&cluster) {
            Some(c) => c.network.clone(),
            None => match networks.first() {
                Some(n) => n.clone(),
                None => continue,
            },
        };
        if networks.iter().any(|n| n != &network) {
            return None;
        }
        match (left, current.cluster(&cluster)) {
            (0, Some(_)) => d.removed_clusters.push(cluster),
            (0, None) => {}
            (_, Some(_)) => {}
            (_, None) => d.clusters.push(Cluster {
                name: cluster,
                network,
            }),
        }
    }
    // Nodes: each takes its cluster and locality from the first workload on it by name.
    for node in nodes {
        let kept = current
            .workloads_on_node(&node)
            .iter()
            .map(|u| u.as_str())
            .find(|u| !changed.addresses.contains_key(*u));
        let came = changed.addresses.keys().filter(|n| {
            matches!(held.addresses.get(n.as_str()), Some(Decoded::Workload(w)) if w.node.as_ref() == Some(&node))
        });
        let first = kept.into_iter().chain(came.map(String::as_str)).min();
        let derived = first.and_then(|n| match held.addresses.get(n) {
            Some(Decoded::Workload(w)) => Some(Node {
                name: node.clone(),
                cluster: w.cluster.clone(),
                locality: (*w.locality).clone(),
                address: None,
            }),
            _ => None,
        });
        match (derived, current.node(&node)) {
            (None, Some(_)) => d.removed_nodes.push(node),
            (Some(n), Some(old)) if &n == old => {}
            (Some(n), _) => d.nodes.push(n),
            (None, None) => {}
        }
    }
    Some(d)
}

fn count_down(counts: &mut KeyedMap<ClusterId, usize>, key: &ClusterId) {
    if let Some(n) = counts.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// What applying a push gave.
#[derive(Debug)]
pub struct Update {
    /// `None` when no snapshot can be made (the caller keeps serving the one it has).
    pub snapshot: Option<Snapshot>,
    /// Resources set aside (no longer held), with why.
    pub set_aside: Vec<InvalidResource>,
    /// Made as a delta on the snapshot served, not assembled in full.
    pub incremental: bool,
}

/// Held resources from which a full assembly also makes the index on another thread.
const INDEX_APART_MIN: usize = 8_192;

/// A full assembly of `held`, and, for a large one (a node's first sync), the index of
/// `held` as it would be if the assembly set nothing aside, made on another thread meanwhile:
/// both only read the held resources.
fn assemble_and_index(
    held: &Held,
    version: u64,
) -> ((Option<Snapshot>, Vec<InvalidResource>), Option<Index>) {
    if held.addresses.len() < INDEX_APART_MIN {
        return (assemble(held, version), None);
    }
    std::thread::scope(|s| {
        let index = s.spawn(|| Index::of(held, Some(version)));
        let assembled = assemble(held, version);
        // Neither panics; if one did, the panic goes on as if on one thread.
        let index = index
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (assembled, Some(index))
    })
}

/// Applies a push to `current`: `held` already holds its resources and `changed` names what it
/// changed. Incremental when [`delta`] can tell, else a full [`assemble`]; either way the
/// resources set aside are no longer held, and the snapshot is what a full assembly of what
/// is held gives.
pub fn update(held: &mut Held, current: &Snapshot, changed: &Changed, version: u64) -> Update {
    if let Some(d) = delta(held, current, changed, version) {
        match current.apply(&d) {
            Ok(snap) => {
                tracing::debug!(version, objects = d.len(), "push applied incrementally");
                held.index.synced = Some(version);
                return Update {
                    snapshot: Some(snap),
                    set_aside: Vec::new(),
                    incremental: true,
                };
            }
            Err(e) => {
                tracing::debug!(version, error = %e, "the push breaks the snapshot; assembling in full to find the resources to set aside");
            }
        }
    }
    let ((snapshot, set_aside), index) = assemble_and_index(held, version);
    for bad in &set_aside {
        held.addresses.remove(bad.name.as_str());
        held.policies.remove(&bad.name);
    }
    held.index = match index {
        Some(index) if set_aside.is_empty() && snapshot.is_some() => index,
        _ => Index::of(held, snapshot.as_ref().map(Snapshot::version)),
    };
    Update {
        snapshot,
        set_aside,
        incremental: false,
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::testing::MeshBuilder;

    use super::*;

    /// `INDEX_APART_MIN` pods backing `svc` (held) or `gone` (not held), every tenth on the
    /// other cluster; the `dup` first pods have their address taken by another pod.
    fn held(dup: usize) -> Held {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east").cluster("west", "net-west");
        m.node("n0", "east", "r/z/s").node("n1", "west", "r/z/s");
        m.service("svc", &[("net-east", "198.19.0.1")], 80, 8080);
        m.service("gone", &[("net-east", "198.19.0.2")], 80, 8080);
        for i in 0..INDEX_APART_MIN {
            let node = if i % 10 == 0 { "n1" } else { "n0" };
            let a = if i < dup { INDEX_APART_MIN + i } else { i };
            m.pod(
                &format!("pod{i}"),
                node,
                &format!("198.18.{}.{}", a / 250, a % 250),
            );
            m.backs(&format!("pod{i}"), if i % 3 == 0 { "gone" } else { "svc" });
        }
        for i in 0..dup {
            let a = INDEX_APART_MIN + i;
            let node = if i % 10 == 0 { "n1" } else { "n0" };
            m.pod(
                &format!("twin{i}"),
                node,
                &format!("198.18.{}.{}", a / 250, a % 250),
            );
        }
        let mut held = Held::default();
        let gone = m.services.pop().expect("gone");
        let svc = m.services.pop().expect("svc");
        assert_eq!(gone.name, "gone");
        held.addresses.insert(
            svc.key().to_string().into(),
            Decoded::Service(Arc::new(svc)),
        );
        for w in m.workloads {
            held.addresses
                .insert(w.uid.shared(), Decoded::Workload(Arc::new(w)));
        }
        held
    }

    #[test]
    fn a_large_assembly_keeps_the_index_made_beside_it_only_if_nothing_was_set_aside() {
        for dup in [0, 2] {
            let mut h = held(dup);
            let before = h.addresses.len();
            let u = update(&mut h, &Snapshot::default(), &Changed::default(), 7);
            let snap = u.snapshot.expect("a snapshot");
            assert_eq!(u.set_aside.len(), dup, "{:?}", u.set_aside);
            assert_eq!(h.addresses.len(), before - dup);
            // The index of exactly what is held now.
            assert_eq!(h.index, Index::of(&h, Some(snap.version())));
            assert_eq!(h.index.synced, Some(7));
            let members: usize = h.index.cluster_members.values().sum();
            assert_eq!(members, snap.workloads().count());
            let gone = ServiceKey::new("default", ferry_core::testing::hostname("gone"));
            let dangling = h
                .index
                .dangling_services
                .get(&gone)
                .map_or(0, BTreeSet::len);
            assert_eq!(dangling, INDEX_APART_MIN.div_ceil(3));
        }
    }
}
