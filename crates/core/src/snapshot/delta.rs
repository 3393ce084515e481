//! Incremental snapshots: a [`SnapshotDelta`] applied to a [`Snapshot`].
//!
//! [`Snapshot::apply`] starts from a clone of the old snapshot (every map is persistent, so the
//! clone copies nothing), takes out what the delta removes or replaces, adds what it brings with
//! the checks a full build makes on each object, and then checks only what the removals could
//! have broken: a service, policy, node or address that something still names. A changed or
//! removed cluster touches everything in it, so that delta is applied by a full build. When a
//! check fails, the error returned is the one a full build of the same objects gives
//! ([`Snapshot::rebuild`]): a rejected delta reads the same however it was applied.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Snapshot, SnapshotBuilder, SnapshotError, Touched};
use crate::model::{
    Cluster, ClusterId, Gateway, GatewayDestination, NetworkAddress, Node, NodeName, Policy,
    PolicyKey, Service, ServiceKey, Workload, WorkloadUid,
};

/// Objects added or changed (by key: a workload's uid, a service's key, a gateway's name...)
/// and keys removed. A key both removed and given is replaced.
#[derive(Clone, Debug, Default)]
pub struct SnapshotDelta {
    /// The version of the snapshot the delta makes.
    pub version: u64,
    pub clusters: Vec<Cluster>,
    pub removed_clusters: Vec<ClusterId>,
    pub nodes: Vec<Node>,
    pub removed_nodes: Vec<NodeName>,
    pub services: Vec<Arc<Service>>,
    pub removed_services: Vec<ServiceKey>,
    pub gateways: Vec<Arc<Gateway>>,
    /// By gateway name.
    pub removed_gateways: Vec<String>,
    pub policies: Vec<Arc<Policy>>,
    pub removed_policies: Vec<PolicyKey>,
    pub workloads: Vec<Arc<Workload>>,
    pub removed_workloads: Vec<WorkloadUid>,
}

impl SnapshotDelta {
    pub fn new(version: u64) -> Self {
        Self {
            version,
            ..Self::default()
        }
    }

    /// Objects given or removed, all kinds together.
    pub fn len(&self) -> usize {
        self.clusters.len()
            + self.removed_clusters.len()
            + self.nodes.len()
            + self.removed_nodes.len()
            + self.services.len()
            + self.removed_services.len()
            + self.gateways.len()
            + self.removed_gateways.len()
            + self.policies.len()
            + self.removed_policies.len()
            + self.workloads.len()
            + self.removed_workloads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An incremental check failed: which invariant a full build names is left to it.
struct Broken;

impl<E> From<E> for Broken
where
    SnapshotError: From<E>,
{
    fn from(_: E) -> Self {
        Self
    }
}

// === impl Snapshot ===

impl Snapshot {
    /// The snapshot `delta` makes of this one, at `delta.version`, sharing every entry and
    /// index bucket the delta does not touch. Equal to [`Snapshot::rebuild`], and rejected
    /// with the same error.
    pub fn apply(&self, delta: &SnapshotDelta) -> Result<Self, SnapshotError> {
        if self.changes_clusters(delta) {
            return self.rebuild(delta);
        }
        let mut next = self.clone();
        next.version = delta.version;
        match next.apply_in_place(self, delta) {
            Ok(()) => Ok(next),
            Err(Broken) => {
                let full = self.rebuild(delta);
                debug_assert!(
                    full.is_err(),
                    "an incremental check rejected a delta a full build accepts"
                );
                full
            }
        }
    }

    /// A full build of this snapshot's objects with `delta` applied: the objects kept, in
    /// key order, then the delta's, in its order.
    pub fn rebuild(&self, delta: &SnapshotDelta) -> Result<Self, SnapshotError> {
        /// The keys of the old objects that do not stay as they are.
        fn keyed<K: std::hash::Hash + Eq + Clone>(
            removed: &[K],
            given: impl Iterator<Item = K>,
        ) -> HashSet<K> {
            removed.iter().cloned().chain(given).collect()
        }
        let mut b = SnapshotBuilder::new(delta.version);
        let gone = keyed(
            &delta.removed_clusters,
            delta.clusters.iter().map(|c| c.name.clone()),
        );
        for (name, c) in &self.clusters {
            if !gone.contains(name) {
                b.cluster(c.clone());
            }
        }
        delta.clusters.iter().cloned().for_each(|c| {
            b.cluster(c);
        });
        let gone = keyed(
            &delta.removed_nodes,
            delta.nodes.iter().map(|n| n.name.clone()),
        );
        for (name, n) in &self.nodes {
            if !gone.contains(name) {
                b.node(n.clone());
            }
        }
        delta.nodes.iter().cloned().for_each(|n| {
            b.node(n);
        });
        let gone = keyed(
            &delta.removed_services,
            delta.services.iter().map(|s| s.key()),
        );
        let mut kept: Vec<_> = self
            .services
            .iter()
            .filter(|(k, _)| !gone.contains(*k))
            .collect();
        kept.sort_by(|a, b| a.0.cmp(b.0));
        for s in kept.into_iter().map(|(_, s)| s).chain(&delta.services) {
            b.service_shared(s.clone());
        }
        let gone = keyed(
            &delta.removed_gateways,
            delta.gateways.iter().map(|g| g.name.clone()),
        );
        let kept = self.gateways.iter().filter(|g| !gone.contains(&g.name));
        for g in kept.chain(&delta.gateways) {
            b.gateway_shared(g.clone());
        }
        let gone = keyed(
            &delta.removed_policies,
            delta.policies.iter().map(|p| p.key()),
        );
        let mut kept: Vec<_> = self
            .policies
            .iter()
            .filter(|(k, _)| !gone.contains(*k))
            .collect();
        kept.sort_by(|a, b| a.0.cmp(b.0));
        for p in kept.into_iter().map(|(_, p)| p).chain(&delta.policies) {
            b.policy_shared(p.clone());
        }
        let gone = keyed(
            &delta.removed_workloads,
            delta.workloads.iter().map(|w| w.uid.clone()),
        );
        let mut kept: Vec<_> = self
            .workloads
            .iter()
            .filter(|(k, _)| !gone.contains(*k))
            .collect();
        kept.sort_by(|a, b| a.0.cmp(b.0));
        for w in kept.into_iter().map(|(_, w)| w).chain(&delta.workloads) {
            b.workload_shared(w.clone());
        }
        b.build()
    }

    /// Does `delta` remove or change a cluster this snapshot has?
    fn changes_clusters(&self, delta: &SnapshotDelta) -> bool {
        let removed = delta
            .removed_clusters
            .iter()
            .any(|c| self.clusters.contains_key(c) && !delta.clusters.iter().any(|u| &u.name == c));
        let changed = delta
            .clusters
            .iter()
            .any(|c| self.clusters.get(&c.name).is_some_and(|old| old != c));
        removed || changed
    }

    /// Applies `delta` to this clone of `old`, which has the same clusters (no cluster is
    /// removed or changed).
    fn apply_in_place(&mut self, old: &Self, delta: &SnapshotDelta) -> Result<(), Broken> {
        let mut touched = Touched::default();
        // Out: what the delta removes or replaces, remembering what others may still name.
        let mut released: Vec<NetworkAddress> = Vec::new();
        let workloads = delta.workloads.iter().map(|w| &w.uid);
        for uid in delta.removed_workloads.iter().chain(workloads) {
            if let Some(w) = self.remove_workload(uid) {
                let on = |ip: &std::net::IpAddr| NetworkAddress::new(w.network.clone(), *ip);
                released.extend(w.addresses.iter().map(on));
            }
        }
        let mut gone_services = Vec::new();
        let keys: Vec<ServiceKey> = delta.services.iter().map(|s| s.key()).collect();
        for key in delta.removed_services.iter().chain(&keys) {
            if let Some(s) = self.remove_service(key) {
                released.extend(s.vips.iter().cloned());
                gone_services.push(key);
            }
        }
        let names = delta.gateways.iter().map(|g| &g.name);
        for name in delta.removed_gateways.iter().chain(names) {
            if let Some(g) = self.remove_gateway(name) {
                released.push(g.network_address());
            }
        }
        let mut gone_policies = Vec::new();
        let keys: Vec<PolicyKey> = delta.policies.iter().map(|p| p.key()).collect();
        for key in delta.removed_policies.iter().chain(&keys) {
            if self.remove_policy(key).is_some() {
                gone_policies.push(key);
            }
        }
        let mut gone_nodes = Vec::new();
        let names = delta.nodes.iter().map(|n| &n.name);
        for name in delta.removed_nodes.iter().chain(names) {
            if let Some(n) = self.remove_node(name) {
                gone_nodes.push(n);
            }
        }
        // In: what the delta brings, each object checked as a full build checks it.
        let mut seen = HashSet::new();
        for c in &delta.clusters {
            if !seen.insert(&c.name) {
                return Err(Broken);
            }
            if !old.clusters.contains_key(&c.name) {
                self.add_cluster(c.clone())?;
            }
        }
        for n in &delta.nodes {
            self.add_node(n.clone())?;
        }
        for s in &delta.services {
            self.add_service(s.clone(), &mut touched)?;
        }
        for g in &delta.gateways {
            self.add_gateway(g.clone(), &mut touched)?;
        }
        for p in &delta.policies {
            self.add_policy(p.clone(), &mut touched)?;
        }
        for w in &delta.workloads {
            self.add_workload(w.clone(), &mut touched)?;
        }
        // What the removals may have broken: something still naming what went.
        for key in gone_services {
            let named = self.endpoints.contains_key(key)
                || self.is_gateway_destination(&GatewayDestination::Service(key.clone()));
            if !self.services.contains_key(key) && named {
                return Err(Broken);
            }
        }
        for address in released {
            if !self.by_address.contains_key(&address)
                && self.is_gateway_destination(&GatewayDestination::Address(address))
            {
                return Err(Broken);
            }
        }
        for key in gone_policies {
            if !self.policies.contains_key(key) && self.is_policy_named(key) {
                return Err(Broken);
            }
        }
        for was in gone_nodes {
            let on_it = self.workloads_on_node(&was.name);
            match self.nodes.get(&was.name) {
                None if !on_it.is_empty() => return Err(Broken),
                Some(n) if n.cluster != was.cluster => {
                    let elsewhere = |uid: &WorkloadUid| {
                        self.workloads
                            .get(uid)
                            .is_none_or(|w| w.cluster != n.cluster)
                    };
                    if on_it.iter().any(elsewhere) {
                        return Err(Broken);
                    }
                }
                _ => {}
            }
        }
        for s in &delta.services {
            self.check_service_refs(s)?;
        }
        for w in &delta.workloads {
            self.check_workload_refs(w)?;
        }
        self.sort(&touched);
        Ok(())
    }
}
