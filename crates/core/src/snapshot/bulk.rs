//! A full build of a whole set of objects at once ([`SnapshotBuilder::build`]), as a node's
//! first sync brings (a million workloads): each workload is inserted into the persistent maps
//! once (its entry and its addresses), while its index buckets are gathered in plain hash maps
//! and put into the persistent ones once per bucket, instead of a lookup and a copy-on-write of
//! each bucket per workload. Entries go into the large maps in the order of their tries
//! ([`trie_order`]), and the addresses of a large set are claimed on a second thread meanwhile.
//!
//! The bulk path only tells whether the set is valid: on any broken invariant it gives up and
//! the caller builds one object at a time ([`SnapshotBuilder::build_one_by_one`]), which names
//! the first one broken. A valid set builds to the same snapshot either way
//! (`bulk_tests.rs`, `tests/incremental.rs`).

use std::hash::BuildHasher;
use std::sync::Arc;

use super::index::{Touched, destinations, mark};
use super::{AddressOwner, AddressRef, Endpoint, Snapshot, SnapshotBuilder};
use crate::identity::Identity;
use crate::keyed_hash::{HashMap, Map};
use crate::model::{ClusterId, NetworkAddress, NodeName, ServiceKey, Workload, WorkloadUid};

/// Workloads from which a build claims their addresses on a second thread.
pub(super) const APART_MIN: usize = 8_192;

impl SnapshotBuilder {
    /// The snapshot of these objects, or `None` when they break an invariant. Workloads are
    /// added in bulk, their addresses claimed on a second thread from `apart_min` of them.
    pub(super) fn bulk(&self, apart_min: usize) -> Option<Snapshot> {
        let mut snap = Snapshot {
            version: self.version,
            ..Snapshot::default()
        };
        let mut touched = Touched::default();
        for c in &self.clusters {
            snap.add_cluster(c.clone()).ok()?;
        }
        for n in &self.nodes {
            snap.add_node(n.clone()).ok()?;
        }
        for s in &self.services {
            snap.add_service(s.clone(), &mut touched).ok()?;
        }
        for g in &self.gateways {
            snap.add_gateway(g.clone(), &mut touched).ok()?;
        }
        for p in &self.policies {
            snap.add_policy(p.clone(), &mut touched).ok()?;
        }
        snap.add_workloads(&self.workloads, &mut touched, apart_min)?;
        for s in &self.services {
            snap.check_service_refs(s).ok()?;
        }
        for w in self
            .workloads
            .iter()
            .filter(|w| w.waypoint.is_some() || w.network_gateway.is_some())
        {
            snap.check_workload_refs(w).ok()?;
        }
        snap.sort(&touched);
        Some(snap)
    }
}

impl Snapshot {
    /// Adds `workloads` as [`Snapshot::add_workload`] does one, all at once; `None` when one
    /// breaks an invariant (this snapshot is then of no use).
    fn add_workloads(
        &mut self,
        workloads: &[Arc<Workload>],
        touched: &mut Touched,
        apart_min: usize,
    ) -> Option<()> {
        let by_address = std::mem::take(&mut self.by_address);
        let (claimed, indexed) = if workloads.len() >= apart_min {
            std::thread::scope(|s| {
                let claiming = s.spawn(|| claim_all(by_address, workloads));
                let indexed = self.index_workloads(workloads, touched);
                // Claiming does not panic; if it did, the panic goes on as if on one thread.
                let claimed = claiming
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
                (claimed, indexed)
            })
        } else {
            let indexed = self.index_workloads(workloads, touched);
            (claim_all(by_address, workloads), indexed)
        };
        self.by_address = claimed?;
        indexed
    }

    /// Everything [`Snapshot::add_workload`] checks and indexes but the addresses.
    fn index_workloads(
        &mut self,
        workloads: &[Arc<Workload>],
        touched: &mut Touched,
    ) -> Option<()> {
        use std::collections::hash_map::Entry;
        let mut endpoints: HashMap<&ServiceKey, Vec<Endpoint>> = HashMap::default();
        // Each node's cluster, looked up once.
        let mut by_node: HashMap<&NodeName, (&ClusterId, Vec<WorkloadUid>)> = HashMap::default();
        for w in workloads {
            Identity::check(&w.trust_domain, &w.namespace, &w.service_account).ok()?;
            if self.clusters.get(&w.cluster)?.network != w.network {
                return None;
            }
            if let Some(node) = &w.node {
                let (cluster, bucket) = match by_node.entry(node) {
                    Entry::Occupied(o) => o.into_mut(),
                    Entry::Vacant(v) => v.insert((&self.nodes.get(node)?.cluster, Vec::new())),
                };
                if **cluster != w.cluster {
                    return None;
                }
                bucket.push(w.uid.clone());
            }
            for svc in w.services.keys() {
                let bucket = match endpoints.entry(svc) {
                    Entry::Occupied(o) => o.into_mut(),
                    // Every service known has a bucket (`add_service`).
                    Entry::Vacant(v) if self.endpoints.contains_key(svc) => v.insert(Vec::new()),
                    Entry::Vacant(_) => return None,
                };
                bucket.push(Endpoint::Workload(w.uid.clone()));
            }
            for p in &w.authorization_policies {
                if !self.policies.contains_key(p) {
                    return None;
                }
                *self.policy_refs.entry(p.clone()).or_insert(0) += 1;
            }
            for d in destinations([&w.waypoint, &w.network_gateway]) {
                *self.gateway_refs.entry(d.clone()).or_insert(0) += 1;
            }
        }
        // Each workload once, in the order of the trie (see `trie_order`).
        let hasher = self.workloads.hasher();
        let mut order: Vec<(u32, usize)> = workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (trie_order(hasher.hash_one(&w.uid)), i))
            .collect();
        order.sort_unstable();
        for (_, i) in order {
            let w = &workloads[i];
            if self.workloads.insert(w.uid.clone(), w.clone()).is_some() {
                return None;
            }
        }
        for (svc, added) in endpoints {
            let bucket = self.endpoints.get_mut(svc)?;
            Arc::make_mut(bucket).extend(added);
            mark(&mut touched.endpoints, svc);
        }
        for (node, (_, added)) in by_node {
            Arc::make_mut(self.by_node.entry(node.clone()).or_default()).extend(added);
            mark(&mut touched.by_node, node);
        }
        Some(())
    }
}

/// `by_address` with every address of `workloads` claimed; `None` when one is taken.
fn claim_all(
    mut by_address: Map<NetworkAddress, AddressOwner>,
    workloads: &[Arc<Workload>],
) -> Option<Map<NetworkAddress, AddressOwner>> {
    let hasher = by_address.hasher();
    // (where in the trie, workload, address)
    let mut claims: Vec<(u32, usize, usize)> = Vec::with_capacity(workloads.len());
    for (i, w) in workloads.iter().enumerate() {
        for (j, ip) in w.addresses.iter().enumerate() {
            let at = AddressRef {
                network: &w.network,
                ip: *ip,
            };
            claims.push((trie_order(hasher.hash_one(at)), i, j));
        }
    }
    claims.sort_unstable();
    for (_, i, j) in claims {
        let w = &workloads[i];
        let address = NetworkAddress::new(w.network.clone(), w.addresses[j]);
        match by_address.entry(address) {
            imbl::hashmap::Entry::Occupied(_) => return None,
            imbl::hashmap::Entry::Vacant(v) => {
                v.insert(AddressOwner::Workload(w.uid.clone()));
            }
        }
    }
    Some(by_address)
}

/// A key's place in the order of a persistent map's trie, from its hash: the trie takes the
/// hash's low bits first (32 of them, five a level). Inserted in this order, each key lands
/// beside the one before, in nodes still in the CPU's cache; in any other order a large map
/// (far larger than the cache) is read from memory at every level of every insertion.
fn trie_order(hash: u64) -> u32 {
    (hash as u32).reverse_bits()
}

#[cfg(test)]
#[path = "bulk_tests.rs"]
mod tests;
