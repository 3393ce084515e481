//! What a full build and an incremental apply share: adding an object checks the invariants it
//! carries itself and indexes it; removing one takes it out of every index. References that
//! need every owner known are checked apart ([`Snapshot::check_service_refs`],
//! [`Snapshot::check_workload_refs`]), and buckets are put in order once at the end
//! ([`Snapshot::sort`]).

use std::hash::Hash;
use std::sync::Arc;

use super::{AddressOwner, Endpoint, ObjectRef, Snapshot, SnapshotError, endpoint_order};
use crate::identity::Identity;
use crate::keyed_hash::{HashSet, Map};
use crate::model::{
    Cluster, ClusterId, Gateway, GatewayDestination, GatewayRef, NetworkAddress, NetworkId, Node,
    NodeName, Policy, PolicyKey, PolicyScope, Service, ServiceKey, Workload, WorkloadUid,
};

/// Index buckets changed since they were last put in order.
#[derive(Debug, Default)]
pub(super) struct Touched {
    pub(super) endpoints: HashSet<ServiceKey>,
    pub(super) by_node: HashSet<NodeName>,
    by_hostname: HashSet<String>,
    namespaces: HashSet<String>,
    mesh: bool,
    gateways: bool,
}

pub(super) fn mark<K: Hash + Eq + Clone>(set: &mut HashSet<K>, key: &K) {
    if !set.contains(key) {
        set.insert(key.clone());
    }
}

pub(super) fn count_up<K: Hash + Eq + Clone>(counts: &mut Map<K, usize>, key: &K) {
    *counts.entry(key.clone()).or_insert(0) += 1;
}

fn count_down<K: Hash + Eq + Clone>(counts: &mut Map<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// The destinations a workload's or service's gateway references name.
pub(super) fn destinations<'a>(
    refs: impl IntoIterator<Item = &'a Option<GatewayRef>>,
) -> impl Iterator<Item = &'a GatewayDestination> {
    refs.into_iter().flatten().map(|r| &r.destination)
}

impl Snapshot {
    pub(super) fn add_cluster(&mut self, c: Cluster) -> Result<(), SnapshotError> {
        if self.clusters.contains_key(&c.name) {
            return Err(SnapshotError::Duplicate {
                object: ObjectRef::Cluster(c.name),
            });
        }
        self.clusters.insert(c.name.clone(), c);
        Ok(())
    }

    pub(super) fn add_node(&mut self, n: Node) -> Result<(), SnapshotError> {
        let object = ObjectRef::Node(n.name.clone());
        if !self.clusters.contains_key(&n.cluster) {
            return Err(SnapshotError::UnknownCluster {
                object,
                cluster: n.cluster,
            });
        }
        if self.nodes.contains_key(&n.name) {
            return Err(SnapshotError::Duplicate { object });
        }
        self.nodes.insert(n.name.clone(), n);
        Ok(())
    }

    pub(super) fn add_service(
        &mut self,
        s: Arc<Service>,
        touched: &mut Touched,
    ) -> Result<(), SnapshotError> {
        let key = s.key();
        for vip in &s.vips {
            self.claim(vip.clone(), AddressOwner::Service(Box::new(key.clone())))?;
        }
        if self.services.contains_key(&key) {
            return Err(SnapshotError::Duplicate {
                object: ObjectRef::Service(key),
            });
        }
        self.by_hostname
            .entry(s.hostname.clone())
            .or_default()
            .push(key.clone());
        mark(&mut touched.by_hostname, &s.hostname);
        let bucket = Arc::make_mut(self.endpoints.entry(key.clone()).or_default());
        bucket.extend(
            s.address_endpoints
                .iter()
                .map(|a| Endpoint::Address(Box::new(a.clone()))),
        );
        mark(&mut touched.endpoints, &key);
        for d in destinations([&s.waypoint]) {
            count_up(&mut self.gateway_refs, d);
        }
        self.services.insert(key, s);
        Ok(())
    }

    pub(super) fn add_gateway(
        &mut self,
        g: Arc<Gateway>,
        touched: &mut Touched,
    ) -> Result<(), SnapshotError> {
        let object = ObjectRef::Gateway(g.name.clone());
        self.check_cluster_network(&object, &g.cluster, &g.network)?;
        if self.gateways.iter().any(|o| o.name == g.name) {
            return Err(SnapshotError::Duplicate { object });
        }
        // Every network dials a gateway by its bare address, so it must be unique mesh-wide.
        if let Some(o) = self.gateways.iter().find(|o| o.address == g.address) {
            return Err(SnapshotError::DuplicateAddress {
                address: g.network_address(),
                first: AddressOwner::Gateway(o.name.clone()),
                second: AddressOwner::Gateway(g.name.clone()),
            });
        }
        self.claim(g.network_address(), AddressOwner::Gateway(g.name.clone()))?;
        self.gateways.push(g);
        touched.gateways = true;
        Ok(())
    }

    pub(super) fn add_policy(
        &mut self,
        p: Arc<Policy>,
        touched: &mut Touched,
    ) -> Result<(), SnapshotError> {
        let key = p.key();
        if self.policies.contains_key(&key) {
            return Err(SnapshotError::Duplicate {
                object: ObjectRef::Policy(key),
            });
        }
        match p.scope {
            PolicyScope::Mesh => {
                self.mesh_policies.push(key.clone());
                touched.mesh = true;
            }
            PolicyScope::Namespace => {
                self.namespace_policies
                    .entry(p.namespace.clone())
                    .or_default()
                    .push(key.clone());
                mark(&mut touched.namespaces, &p.namespace);
            }
            PolicyScope::WorkloadSelector => {}
        }
        self.policies.insert(key, p);
        Ok(())
    }

    pub(super) fn add_workload(
        &mut self,
        w: Arc<Workload>,
        touched: &mut Touched,
    ) -> Result<(), SnapshotError> {
        let object = ObjectRef::Workload(w.uid.clone());
        if self.workloads.contains_key(&w.uid) {
            return Err(SnapshotError::Duplicate { object });
        }
        Identity::check(&w.trust_domain, &w.namespace, &w.service_account).map_err(|source| {
            SnapshotError::Identity {
                object: object.clone(),
                source,
            }
        })?;
        self.check_cluster_network(&object, &w.cluster, &w.network)?;
        if let Some(node) = &w.node {
            if self.nodes.get(node).is_none_or(|n| n.cluster != w.cluster) {
                return Err(SnapshotError::UnknownNode {
                    object,
                    node: node.clone(),
                });
            }
            Arc::make_mut(self.by_node.entry(node.clone()).or_default()).push(w.uid.clone());
            mark(&mut touched.by_node, node);
        }
        for ip in &w.addresses {
            self.claim(
                NetworkAddress::new(w.network.clone(), *ip),
                AddressOwner::Workload(w.uid.clone()),
            )?;
        }
        for svc in w.services.keys() {
            let Some(bucket) = self.endpoints.get_mut(svc) else {
                return Err(SnapshotError::UnknownService {
                    object,
                    service: svc.clone(),
                });
            };
            Arc::make_mut(bucket).push(Endpoint::Workload(w.uid.clone()));
            mark(&mut touched.endpoints, svc);
        }
        for p in &w.authorization_policies {
            if !self.policies.contains_key(p) {
                return Err(SnapshotError::UnknownPolicy {
                    object,
                    policy: p.clone(),
                });
            }
            count_up(&mut self.policy_refs, p);
        }
        for d in destinations([&w.waypoint, &w.network_gateway]) {
            count_up(&mut self.gateway_refs, d);
        }
        self.workloads.insert(w.uid.clone(), w);
        Ok(())
    }

    /// A service's references, once every owner is known.
    pub(super) fn check_service_refs(&self, s: &Service) -> Result<(), SnapshotError> {
        let object = ObjectRef::Service(s.key());
        for ae in &s.address_endpoints {
            if !self.clusters.contains_key(&ae.cluster) {
                return Err(SnapshotError::UnknownCluster {
                    object,
                    cluster: ae.cluster.clone(),
                });
            }
        }
        if let Some(wp) = &s.waypoint {
            self.check_gateway_ref(&object, "waypoint", wp)?;
        }
        Ok(())
    }

    /// A workload's references, once every owner is known.
    pub(super) fn check_workload_refs(&self, w: &Workload) -> Result<(), SnapshotError> {
        let object = ObjectRef::Workload(w.uid.clone());
        if let Some(wp) = &w.waypoint {
            self.check_gateway_ref(&object, "waypoint", wp)?;
        }
        if let Some(gw) = &w.network_gateway {
            self.check_gateway_ref(&object, "network gateway", gw)?;
        }
        Ok(())
    }

    /// Takes a workload out of every index. Its services' buckets stay.
    pub(super) fn remove_workload(&mut self, uid: &WorkloadUid) -> Option<Arc<Workload>> {
        let w = self.workloads.remove(uid)?;
        let owner = AddressOwner::Workload(uid.clone());
        for ip in &w.addresses {
            self.unclaim(&NetworkAddress::new(w.network.clone(), *ip), &owner);
        }
        if let Some(node) = &w.node {
            remove_from_bucket(&mut self.by_node, node, |u| u == uid);
        }
        for svc in w.services.keys() {
            if let Some(bucket) = self.endpoints.get_mut(svc) {
                Arc::make_mut(bucket).retain(|e| !matches!(e, Endpoint::Workload(u) if u == uid));
            }
        }
        for p in &w.authorization_policies {
            count_down(&mut self.policy_refs, p);
        }
        for d in destinations([&w.waypoint, &w.network_gateway]) {
            count_down(&mut self.gateway_refs, d);
        }
        Some(w)
    }

    /// Takes a service out of every index. Its bucket of endpoints goes with it unless
    /// workloads still name the service (a dangling reference the caller reports).
    pub(super) fn remove_service(&mut self, key: &ServiceKey) -> Option<Arc<Service>> {
        let s = self.services.remove(key)?;
        let owner = AddressOwner::Service(Box::new(key.clone()));
        for vip in &s.vips {
            self.unclaim(vip, &owner);
        }
        if let Some(bucket) = self.by_hostname.get_mut(&s.hostname) {
            bucket.retain(|k| k != key);
            if bucket.is_empty() {
                self.by_hostname.remove(&s.hostname);
            }
        }
        remove_from_bucket(&mut self.endpoints, key, |e| {
            matches!(e, Endpoint::Address(_))
        });
        for d in destinations([&s.waypoint]) {
            count_down(&mut self.gateway_refs, d);
        }
        Some(s)
    }

    pub(super) fn remove_gateway(&mut self, name: &str) -> Option<Arc<Gateway>> {
        let at = self.gateways.iter().position(|g| g.name == name)?;
        let g = self.gateways.remove(at);
        self.unclaim(&g.network_address(), &AddressOwner::Gateway(g.name.clone()));
        Some(g)
    }

    pub(super) fn remove_policy(&mut self, key: &PolicyKey) -> Option<Arc<Policy>> {
        let p = self.policies.remove(key)?;
        match p.scope {
            PolicyScope::Mesh => self.mesh_policies.retain(|k| k != key),
            PolicyScope::Namespace => {
                if let Some(bucket) = self.namespace_policies.get_mut(&p.namespace) {
                    bucket.retain(|k| k != key);
                    if bucket.is_empty() {
                        self.namespace_policies.remove(&p.namespace);
                    }
                }
            }
            PolicyScope::WorkloadSelector => {}
        }
        Some(p)
    }

    pub(super) fn remove_node(&mut self, name: &NodeName) -> Option<Node> {
        self.nodes.remove(name)
    }

    /// Is `destination` named by a workload's or a service's waypoint or network gateway?
    pub(super) fn is_gateway_destination(&self, destination: &GatewayDestination) -> bool {
        self.gateway_refs.contains_key(destination)
    }

    /// Is `policy` named by a workload (a workload-selector policy that selects one)?
    pub fn is_policy_named(&self, policy: &PolicyKey) -> bool {
        self.policy_refs.contains_key(policy)
    }

    /// Puts the touched buckets in their order (stable: equal keys keep their order).
    pub(super) fn sort(&mut self, touched: &Touched) {
        for key in &touched.endpoints {
            sort_bucket(&mut self.endpoints, key, endpoint_order);
        }
        for node in &touched.by_node {
            sort_bucket(&mut self.by_node, node, |a, b| a.cmp(b));
        }
        for hostname in &touched.by_hostname {
            if let Some(b) = self.by_hostname.get_mut(hostname) {
                b.sort();
            }
        }
        for ns in &touched.namespaces {
            if let Some(b) = self.namespace_policies.get_mut(ns) {
                b.sort();
            }
        }
        if touched.mesh {
            self.mesh_policies.sort();
        }
        if touched.gateways {
            self.gateways.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }

    pub(super) fn claim(
        &mut self,
        address: NetworkAddress,
        owner: AddressOwner,
    ) -> Result<(), SnapshotError> {
        // One lookup: a node claims an address for every workload it is sent.
        match self.by_address.entry(address) {
            imbl::hashmap::Entry::Occupied(first) => Err(SnapshotError::DuplicateAddress {
                first: first.get().clone(),
                address: first.key().clone(),
                second: owner,
            }),
            imbl::hashmap::Entry::Vacant(v) => {
                v.insert(owner);
                Ok(())
            }
        }
    }

    /// Gives `address` up if `owner` holds it.
    fn unclaim(&mut self, address: &NetworkAddress, owner: &AddressOwner) {
        if self.by_address.get(address) == Some(owner) {
            self.by_address.remove(address);
        }
    }

    fn check_cluster_network(
        &self,
        object: &ObjectRef,
        cluster: &ClusterId,
        network: &NetworkId,
    ) -> Result<(), SnapshotError> {
        let Some(c) = self.clusters.get(cluster) else {
            return Err(SnapshotError::UnknownCluster {
                object: object.clone(),
                cluster: cluster.clone(),
            });
        };
        if &c.network != network {
            return Err(SnapshotError::WrongNetwork {
                object: object.clone(),
                cluster: cluster.clone(),
                expected: c.network.clone(),
                found: network.clone(),
            });
        }
        Ok(())
    }

    fn check_gateway_ref(
        &self,
        object: &ObjectRef,
        role: &'static str,
        r: &GatewayRef,
    ) -> Result<(), SnapshotError> {
        let resolves = match &r.destination {
            GatewayDestination::Service(key) => self.services.contains_key(key),
            GatewayDestination::Address(addr) => self.by_address.contains_key(addr),
        };
        if resolves {
            Ok(())
        } else {
            let reference = match &r.destination {
                GatewayDestination::Service(key) => key.to_string(),
                GatewayDestination::Address(addr) => addr.to_string(),
            };
            Err(SnapshotError::UnresolvedGateway {
                object: object.clone(),
                role,
                reference,
            })
        }
    }
}

/// Drops the entries of `key`'s bucket that `gone` picks, and the bucket once it is empty.
fn remove_from_bucket<K: Hash + Eq + Clone, T: Clone>(
    map: &mut Map<K, Arc<Vec<T>>>,
    key: &K,
    gone: impl Fn(&T) -> bool,
) {
    if let Some(bucket) = map.get_mut(key) {
        Arc::make_mut(bucket).retain(|e| !gone(e));
        if bucket.is_empty() {
            map.remove(key);
        }
    }
}

/// Sorts `key`'s bucket, copying it only when it is out of order.
fn sort_bucket<K: Hash + Eq + Clone, T: Clone>(
    map: &mut Map<K, Arc<Vec<T>>>,
    key: &K,
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) {
    if let Some(bucket) = map.get_mut(key)
        && !bucket.is_sorted_by(|a, b| order(a, b).is_le())
    {
        Arc::make_mut(bucket).sort_by(order);
    }
}
