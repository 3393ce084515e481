//! A full build of a whole set of objects at once ([`SnapshotBuilder::build`]), as a node's
//! first sync brings (a million workloads): each workload is inserted into the persistent maps
//! once (its entry and its addresses), while its index buckets are gathered in plain hash maps
//! and put into the persistent ones once per bucket, instead of a lookup and a copy-on-write of
//! each bucket per workload. Entries go into the large maps in the order of their tries
//! ([`trie_order`]), and the addresses of a large set are claimed on a second thread meanwhile.
//! Services (66,000 with a million workloads) are added the same way, their addresses claimed
//! with the workloads', and every bucket is made in its order instead of sorted at the end.
//!
//! The bulk path only tells whether the set is valid: on any broken invariant it gives up and
//! the caller builds one object at a time ([`SnapshotBuilder::build_one_by_one`]), which names
//! the first one broken. A valid set builds to the same snapshot either way
//! (`bulk_tests.rs`, `tests/incremental.rs`).

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use super::index::{Touched, count_up, destinations, mark};
use super::{AddressOwner, AddressRef, Endpoint, Snapshot, SnapshotBuilder, endpoint_order};
use crate::identity::Identity;
use crate::keyed_hash::{HashMap, Map};
use crate::model::{
    ClusterId, NetworkAddress, NodeName, Service, ServiceKey, Workload, WorkloadUid,
};

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
        snap.add_services(&self.services)?;
        for g in &self.gateways {
            snap.add_gateway(g.clone(), &mut touched).ok()?;
        }
        for p in &self.policies {
            snap.add_policy(p.clone(), &mut touched).ok()?;
        }
        snap.add_workloads(&self.services, &self.workloads, &mut touched, apart_min)?;
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
    /// Adds `services` as [`Snapshot::add_service`] does one, all at once, but for their
    /// addresses (claimed with the workloads', [`claim_all`]); `None` when two share a key.
    /// Each map is filled in the order of its trie, and each bucket is made in its order
    /// (none is left to [`Snapshot::sort`]).
    fn add_services(&mut self, services: &[Arc<Service>]) -> Option<()> {
        let keys: Vec<ServiceKey> = services.iter().map(|s| s.key()).collect();
        for s in services {
            for d in destinations([&s.waypoint]) {
                count_up(&mut self.gateway_refs, d);
            }
        }
        for i in in_trie_order(self.services.hasher(), &keys) {
            if self
                .services
                .insert(keys[i].clone(), services[i].clone())
                .is_some()
            {
                return None;
            }
        }
        for i in in_trie_order(self.endpoints.hasher(), &keys) {
            let mut bucket: Vec<Endpoint> = services[i]
                .address_endpoints
                .iter()
                .map(|a| Endpoint::Address(Box::new(a.clone())))
                .collect();
            sort_endpoints(&mut bucket);
            self.endpoints.insert(keys[i].clone(), Arc::new(bucket));
        }
        let mut by_hostname: HashMap<&String, Vec<ServiceKey>> = HashMap::default();
        for (s, key) in services.iter().zip(keys) {
            by_hostname.entry(&s.hostname).or_default().push(key);
        }
        let hostnames: Vec<_> = by_hostname.into_iter().collect();
        let order = in_trie_order(self.by_hostname.hasher(), hostnames.iter().map(|(h, _)| *h));
        let mut hostnames: Vec<_> = hostnames.into_iter().map(Some).collect();
        for i in order {
            let Some((hostname, keys)) = hostnames[i].take() else {
                continue;
            };
            let bucket = self.by_hostname.entry(hostname.clone()).or_default();
            bucket.extend(keys);
            bucket.sort();
        }
        Some(())
    }

    /// Adds `workloads` as [`Snapshot::add_workload`] does one, all at once, and claims the
    /// addresses of `services` (added by [`Snapshot::add_services`]) with theirs; `None` when
    /// one breaks an invariant (this snapshot is then of no use).
    fn add_workloads(
        &mut self,
        services: &[Arc<Service>],
        workloads: &[Arc<Workload>],
        touched: &mut Touched,
        apart_min: usize,
    ) -> Option<()> {
        let by_address = std::mem::take(&mut self.by_address);
        let (claimed, indexed) = if workloads.len() >= apart_min {
            std::thread::scope(|s| {
                let claiming = s.spawn(|| claim_all(by_address, services, workloads));
                let indexed = self.index_workloads(workloads, touched);
                // Claiming does not panic; if it did, the panic goes on as if on one thread.
                let claimed = claiming
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p));
                (claimed, indexed)
            })
        } else {
            let indexed = self.index_workloads(workloads, touched);
            (claim_all(by_address, services, workloads), indexed)
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
        // The buckets added to, and where each service's is among them.
        let mut endpoints: Vec<(&ServiceKey, Vec<Endpoint>)> = Vec::new();
        let mut bucket_of: HashMap<&ServiceKey, usize> = HashMap::default();
        // A service map's buckets, by the map's address: the replicas of a deployment share
        // one copy, whose keys are then looked up once, not hashed again per workload.
        let mut buckets_of: HashMap<usize, Vec<usize>> = HashMap::default();
        // Each node's cluster, looked up once.
        let mut by_node: HashMap<&NodeName, (&ClusterId, Vec<WorkloadUid>)> = HashMap::default();
        // Each workload's entry made as it is read, in the order given, with its place in the
        // trie (see `trie_order`), then the entries sorted into that order and put: the array
        // is read in order, and only each uid's text (which the map hashes again) out of it.
        let hasher = self.workloads.hasher().clone();
        let mut entries: Vec<(u32, WorkloadUid, Arc<Workload>)> =
            Vec::with_capacity(workloads.len());
        for w in workloads {
            entries.push((
                trie_order(hasher.hash_one(&w.uid)),
                w.uid.clone(),
                w.clone(),
            ));
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
            let buckets = match buckets_of.entry(Arc::as_ptr(w.services.as_arc()) as usize) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    let mut buckets = Vec::with_capacity(w.services.len());
                    for svc in w.services.keys() {
                        let at = match bucket_of.entry(svc) {
                            Entry::Occupied(o) => *o.get(),
                            // Every service known has a bucket (`add_service`).
                            Entry::Vacant(v) if self.endpoints.contains_key(svc) => {
                                endpoints.push((svc, Vec::new()));
                                *v.insert(endpoints.len() - 1)
                            }
                            Entry::Vacant(_) => return None,
                        };
                        buckets.push(at);
                    }
                    v.insert(buckets)
                }
            };
            for &at in buckets.iter() {
                endpoints
                    .get_mut(at)?
                    .1
                    .push(Endpoint::Workload(w.uid.clone()));
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
        entries.sort_unstable_by_key(|&(at, _, _)| at);
        for (_, uid, w) in entries {
            if self.workloads.insert(uid, w).is_some() {
                return None;
            }
        }
        // Each bucket put in order now: it is complete (no key copied to be sorted later).
        for (svc, added) in endpoints {
            let bucket = Arc::make_mut(self.endpoints.get_mut(svc)?);
            bucket.extend(added);
            sort_endpoints(bucket);
        }
        for (node, (_, added)) in by_node {
            Arc::make_mut(self.by_node.entry(node.clone()).or_default()).extend(added);
            mark(&mut touched.by_node, node);
        }
        Some(())
    }
}

/// `by_address` with every address of `services` and `workloads` claimed; `None` when one is
/// taken. Each claim is made in the order given (each object read once, in the order its memory
/// was written) into the bucket of its trie position's first bits, then each bucket, small
/// enough for the cache, is sorted and put in: no claim is read out of order from the whole
/// array (a cache miss each, through a list of indexes, as before).
fn claim_all(
    mut by_address: Map<NetworkAddress, AddressOwner>,
    services: &[Arc<Service>],
    workloads: &[Arc<Workload>],
) -> Option<Map<NetworkAddress, AddressOwner>> {
    let hasher = by_address.hasher();
    let capacity = services.len() + workloads.len();
    // As many buckets as the power of two at or below a 256th of the claims (256 to 511 claims
    // each), at most 4,096 (the ends of 4,096 lists being written: 256 KiB of cache lines).
    let bits = (capacity / 256).max(1).ilog2().min(12);
    let mut buckets: Vec<Vec<(u32, NetworkAddress, AddressOwner)>> = (0..1usize << bits)
        .map(|_| Vec::with_capacity((capacity >> bits) + (capacity >> (bits + 2)) + 4))
        .collect();
    let mut claim = |hash: u64, address: NetworkAddress, owner: AddressOwner| {
        let at = trie_order(hash);
        // The first `bits` bits of the trie position (none when `bits` is 0).
        let bucket = at.checked_shr(32 - bits).unwrap_or(0) as usize;
        buckets.get_mut(bucket)?.push((at, address, owner));
        Some(())
    };
    for s in services {
        for vip in &s.vips {
            let owner = AddressOwner::Service(Box::new(s.key()));
            claim(hasher.hash_one(vip), vip.clone(), owner)?;
        }
    }
    for w in workloads {
        for ip in &w.addresses {
            let at = AddressRef {
                network: &w.network,
                ip: *ip,
            };
            let hash = hasher.hash_one(at);
            let address = NetworkAddress::new(w.network.clone(), *ip);
            claim(hash, address, AddressOwner::Workload(w.uid.clone()))?;
        }
    }
    for mut bucket in buckets {
        // Stable: claims of one position in the order given, as one by one.
        bucket.sort_by_key(|(at, _, _)| *at);
        for (_, address, owner) in bucket {
            match by_address.entry(address) {
                imbl::hashmap::Entry::Occupied(_) => return None,
                imbl::hashmap::Entry::Vacant(v) => {
                    v.insert(owner);
                }
            }
        }
    }
    Some(by_address)
}

/// Puts a bucket of endpoints in [`endpoint_order`], as [`Snapshot::sort`] does (stable).
fn sort_endpoints(bucket: &mut [Endpoint]) {
    if !bucket.is_sorted_by(|a, b| endpoint_order(a, b).is_le()) {
        bucket.sort_by(endpoint_order);
    }
}

/// The indexes of `keys` in the order of the trie of a persistent map hashed by `hasher`.
fn in_trie_order<K: Hash>(
    hasher: &impl BuildHasher,
    keys: impl IntoIterator<Item = K>,
) -> Vec<usize> {
    let mut order: Vec<(u32, usize)> = keys
        .into_iter()
        .enumerate()
        .map(|(i, k)| (trie_order(hasher.hash_one(k)), i))
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, i)| i).collect()
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
