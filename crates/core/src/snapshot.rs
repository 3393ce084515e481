//! One immutable, indexed view of the whole mesh.
//!
//! A [`Snapshot`] is built once by [`SnapshotBuilder::build`], which checks the model's
//! invariants (unique addresses per network, no dangling references), and is never changed after:
//! an update builds a new one and swaps it in whole (see [`crate::store`]), so a reader on the
//! data path sees either the old mesh or the new one, never half of each.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::identity::InvalidIdentity;
use crate::model::{
    AddressEndpoint, Cluster, ClusterId, Gateway, GatewayDestination, GatewayRef, NetworkAddress,
    NetworkId, Node, NodeName, Policy, PolicyKey, PolicyScope, Service, ServiceKey, Workload,
    WorkloadUid,
};

/// What owns an address on a network.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressOwner {
    Workload(WorkloadUid),
    Service(ServiceKey),
    Gateway(String),
}

impl fmt::Display for AddressOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Workload(uid) => write!(f, "workload {uid}"),
            Self::Service(key) => write!(f, "service {key}"),
            Self::Gateway(name) => write!(f, "gateway {name}"),
        }
    }
}

/// One endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// A workload that backs the service (its port map is in `Workload::services`).
    Workload(WorkloadUid),
    /// An endpoint given by address, possibly another service's VIP.
    Address(AddressEndpoint),
}

/// An object of the model, named in errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectRef {
    Cluster(ClusterId),
    Node(NodeName),
    Workload(WorkloadUid),
    Service(ServiceKey),
    Policy(PolicyKey),
    Gateway(String),
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cluster(c) => write!(f, "cluster {c}"),
            Self::Node(n) => write!(f, "node {n}"),
            Self::Workload(w) => write!(f, "workload {w}"),
            Self::Service(s) => write!(f, "service {s}"),
            Self::Policy(p) => write!(f, "policy {p}"),
            Self::Gateway(g) => write!(f, "gateway {g}"),
        }
    }
}

/// A model invariant that a set of objects breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("{object} is defined twice")]
    Duplicate { object: ObjectRef },
    #[error("address {address} is used by both {first} and {second}")]
    DuplicateAddress {
        address: NetworkAddress,
        first: AddressOwner,
        second: AddressOwner,
    },
    #[error("{object} refers to cluster {cluster:?}, which does not exist")]
    UnknownCluster {
        object: ObjectRef,
        cluster: ClusterId,
    },
    #[error("{object} refers to node {node:?}, which does not exist")]
    UnknownNode { object: ObjectRef, node: NodeName },
    #[error(
        "{object} is on network {found:?}, but its cluster {cluster} is on network {expected:?}"
    )]
    WrongNetwork {
        object: ObjectRef,
        cluster: ClusterId,
        expected: NetworkId,
        found: NetworkId,
    },
    #[error("{object} refers to service {service}, which does not exist")]
    UnknownService {
        object: ObjectRef,
        service: ServiceKey,
    },
    #[error("{object} refers to policy {policy}, which does not exist")]
    UnknownPolicy {
        object: ObjectRef,
        policy: PolicyKey,
    },
    #[error("{object} has a {role} at {reference}, which matches no service, workload or gateway")]
    UnresolvedGateway {
        object: ObjectRef,
        role: &'static str,
        reference: String,
    },
    #[error("{object} has no valid identity: {source}")]
    Identity {
        object: ObjectRef,
        source: InvalidIdentity,
    },
}

/// The whole mesh at one version, with the indexes every hop needs.
#[derive(Debug, Default)]
pub struct Snapshot {
    version: u64,
    clusters: BTreeMap<ClusterId, Cluster>,
    nodes: BTreeMap<NodeName, Node>,
    workloads: HashMap<WorkloadUid, Arc<Workload>>,
    services: HashMap<ServiceKey, Arc<Service>>,
    policies: HashMap<PolicyKey, Arc<Policy>>,
    gateways: Vec<Arc<Gateway>>,
    by_address: HashMap<NetworkAddress, AddressOwner>,
    by_hostname: HashMap<String, Vec<ServiceKey>>,
    by_node: HashMap<NodeName, Vec<WorkloadUid>>,
    endpoints: HashMap<ServiceKey, Vec<Endpoint>>,
    mesh_policies: Vec<PolicyKey>,
    namespace_policies: HashMap<String, Vec<PolicyKey>>,
}

/// Collects objects and builds a [`Snapshot`] from them.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    version: u64,
    clusters: Vec<Cluster>,
    nodes: Vec<Node>,
    workloads: Vec<Arc<Workload>>,
    services: Vec<Arc<Service>>,
    policies: Vec<Arc<Policy>>,
    gateways: Vec<Arc<Gateway>>,
}

// === impl SnapshotBuilder ===

impl SnapshotBuilder {
    pub fn new(version: u64) -> Self {
        Self {
            version,
            ..Self::default()
        }
    }

    pub fn cluster(&mut self, c: Cluster) -> &mut Self {
        self.clusters.push(c);
        self
    }

    pub fn node(&mut self, n: Node) -> &mut Self {
        self.nodes.push(n);
        self
    }

    pub fn workload(&mut self, w: Workload) -> &mut Self {
        self.workload_shared(Arc::new(w))
    }

    pub fn service(&mut self, s: Service) -> &mut Self {
        self.service_shared(Arc::new(s))
    }

    pub fn policy(&mut self, p: Policy) -> &mut Self {
        self.policy_shared(Arc::new(p))
    }

    pub fn gateway(&mut self, g: Gateway) -> &mut Self {
        self.gateway_shared(Arc::new(g))
    }

    /// Adds a workload already shared with another snapshot (no copy).
    pub fn workload_shared(&mut self, w: Arc<Workload>) -> &mut Self {
        self.workloads.push(w);
        self
    }

    pub fn service_shared(&mut self, s: Arc<Service>) -> &mut Self {
        self.services.push(s);
        self
    }

    pub fn policy_shared(&mut self, p: Arc<Policy>) -> &mut Self {
        self.policies.push(p);
        self
    }

    pub fn gateway_shared(&mut self, g: Arc<Gateway>) -> &mut Self {
        self.gateways.push(g);
        self
    }

    /// Checks every invariant and indexes the result. Reports the first broken invariant.
    pub fn build(self) -> Result<Snapshot, SnapshotError> {
        let mut snap = Snapshot {
            version: self.version,
            ..Snapshot::default()
        };

        for c in self.clusters {
            let object = ObjectRef::Cluster(c.name.clone());
            if snap.clusters.insert(c.name.clone(), c).is_some() {
                return Err(SnapshotError::Duplicate { object });
            }
        }
        for n in self.nodes {
            let object = ObjectRef::Node(n.name.clone());
            if !snap.clusters.contains_key(&n.cluster) {
                return Err(SnapshotError::UnknownCluster {
                    object,
                    cluster: n.cluster,
                });
            }
            if snap.nodes.insert(n.name.clone(), n).is_some() {
                return Err(SnapshotError::Duplicate { object });
            }
        }
        for s in self.services {
            let key = s.key();
            for vip in &s.vips {
                snap.claim(vip.clone(), AddressOwner::Service(key.clone()))?;
            }
            snap.by_hostname
                .entry(s.hostname.clone())
                .or_default()
                .push(key.clone());
            if snap.services.insert(key.clone(), s).is_some() {
                return Err(SnapshotError::Duplicate {
                    object: ObjectRef::Service(key),
                });
            }
        }
        for g in self.gateways {
            let object = ObjectRef::Gateway(g.name.clone());
            snap.check_cluster_network(&object, &g.cluster, &g.network)?;
            if snap.gateways.iter().any(|o| o.name == g.name) {
                return Err(SnapshotError::Duplicate { object });
            }
            // Every network dials a gateway by its bare address, so it must be unique mesh-wide.
            if let Some(o) = snap.gateways.iter().find(|o| o.address == g.address) {
                return Err(SnapshotError::DuplicateAddress {
                    address: g.network_address(),
                    first: AddressOwner::Gateway(o.name.clone()),
                    second: AddressOwner::Gateway(g.name.clone()),
                });
            }
            snap.claim(g.network_address(), AddressOwner::Gateway(g.name.clone()))?;
            snap.gateways.push(g);
        }
        for p in self.policies {
            let key = p.key();
            match p.scope {
                PolicyScope::Mesh => snap.mesh_policies.push(key.clone()),
                PolicyScope::Namespace => snap
                    .namespace_policies
                    .entry(p.namespace.clone())
                    .or_default()
                    .push(key.clone()),
                PolicyScope::WorkloadSelector => {}
            }
            if snap.policies.insert(key.clone(), p).is_some() {
                return Err(SnapshotError::Duplicate {
                    object: ObjectRef::Policy(key),
                });
            }
        }
        for w in self.workloads {
            let object = ObjectRef::Workload(w.uid.clone());
            if snap.workloads.contains_key(&w.uid) {
                return Err(SnapshotError::Duplicate { object });
            }
            w.identity().map_err(|source| SnapshotError::Identity {
                object: object.clone(),
                source,
            })?;
            snap.check_cluster_network(&object, &w.cluster, &w.network)?;
            if let Some(node) = &w.node {
                match snap.nodes.get(node) {
                    None => {
                        return Err(SnapshotError::UnknownNode {
                            object,
                            node: node.clone(),
                        });
                    }
                    Some(n) if n.cluster != w.cluster => {
                        return Err(SnapshotError::UnknownNode {
                            object,
                            node: node.clone(),
                        });
                    }
                    Some(_) => {}
                }
                snap.by_node
                    .entry(node.clone())
                    .or_default()
                    .push(w.uid.clone());
            }
            for ip in &w.addresses {
                snap.claim(
                    NetworkAddress::new(w.network.clone(), *ip),
                    AddressOwner::Workload(w.uid.clone()),
                )?;
            }
            for svc in w.services.keys() {
                if !snap.services.contains_key(svc) {
                    return Err(SnapshotError::UnknownService {
                        object,
                        service: svc.clone(),
                    });
                }
                snap.endpoints
                    .entry(svc.clone())
                    .or_default()
                    .push(Endpoint::Workload(w.uid.clone()));
            }
            for p in &w.authorization_policies {
                if !snap.policies.contains_key(p) {
                    return Err(SnapshotError::UnknownPolicy {
                        object,
                        policy: p.clone(),
                    });
                }
            }
            snap.workloads.insert(w.uid.clone(), w);
        }
        // Address endpoints and references are checked once every owner is known.
        for (key, svc) in &snap.services {
            let object = ObjectRef::Service(key.clone());
            for ae in &svc.address_endpoints {
                if !snap.clusters.contains_key(&ae.cluster) {
                    return Err(SnapshotError::UnknownCluster {
                        object,
                        cluster: ae.cluster.clone(),
                    });
                }
            }
            if let Some(wp) = &svc.waypoint {
                snap.check_gateway_ref(&object, "waypoint", wp)?;
            }
        }
        for (uid, w) in &snap.workloads {
            let object = ObjectRef::Workload(uid.clone());
            if let Some(wp) = &w.waypoint {
                snap.check_gateway_ref(&object, "waypoint", wp)?;
            }
            if let Some(gw) = &w.network_gateway {
                snap.check_gateway_ref(&object, "network gateway", gw)?;
            }
        }
        for (key, svc) in &snap.services {
            let eps = snap.endpoints.entry(key.clone()).or_default();
            eps.extend(svc.address_endpoints.iter().cloned().map(Endpoint::Address));
        }
        // Deterministic order: a seeded load-balancing choice must not depend on hash order.
        for eps in snap.endpoints.values_mut() {
            eps.sort_by_key(endpoint_sort_key);
        }
        for uids in snap.by_node.values_mut() {
            uids.sort();
        }
        snap.gateways.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(snap)
    }
}

fn endpoint_sort_key(e: &Endpoint) -> (u8, String) {
    match e {
        Endpoint::Workload(uid) => (0, uid.to_string()),
        Endpoint::Address(a) => (1, a.address.to_string()),
    }
}

// === impl Snapshot ===

impl Snapshot {
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn clusters(&self) -> impl Iterator<Item = &Cluster> {
        self.clusters.values()
    }

    pub fn cluster(&self, id: &ClusterId) -> Option<&Cluster> {
        self.clusters.get(id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn node(&self, name: &NodeName) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn workload(&self, uid: &WorkloadUid) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    /// All workloads, in no particular order.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    /// All services, in no particular order.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    pub fn policy(&self, key: &PolicyKey) -> Option<&Arc<Policy>> {
        self.policies.get(key)
    }

    pub fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.values()
    }

    pub fn gateways(&self) -> impl Iterator<Item = &Arc<Gateway>> {
        self.gateways.iter()
    }

    /// Who owns `address` on its network.
    pub fn owner(&self, address: &NetworkAddress) -> Option<&AddressOwner> {
        self.by_address.get(address)
    }

    /// Services with this hostname (one per namespace at most).
    pub fn services_by_hostname(&self, hostname: &str) -> &[ServiceKey] {
        self.by_hostname
            .get(hostname)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The workloads a node proxy serves.
    pub fn workloads_on_node(&self, node: &NodeName) -> &[WorkloadUid] {
        self.by_node.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The endpoints of a service, in a stable order.
    pub fn endpoints(&self, service: &ServiceKey) -> &[Endpoint] {
        self.endpoints
            .get(service)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The east-west gateway at `address`.
    pub(crate) fn gateway_at(&self, address: &NetworkAddress) -> Option<&Arc<Gateway>> {
        self.gateways
            .iter()
            .find(|g| &g.network_address() == address)
    }

    /// The policies that apply to `workload`: mesh-wide, its namespace's, and those that select it.
    pub fn policies_for<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = &'a Arc<Policy>> {
        self.mesh_policies
            .iter()
            .chain(
                self.namespace_policies
                    .get(&workload.namespace)
                    .into_iter()
                    .flatten(),
            )
            .chain(workload.authorization_policies.iter())
            .filter_map(|k| self.policies.get(k))
    }

    /// The waypoint services this workload is an instance of.
    pub fn waypoints_served_by<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = &'a ServiceKey> {
        workload.services.keys().filter(|k| {
            self.services
                .get(*k)
                .is_some_and(|s| s.waypoint_for.is_some())
        })
    }

    fn claim(&mut self, address: NetworkAddress, owner: AddressOwner) -> Result<(), SnapshotError> {
        if let Some(first) = self.by_address.get(&address) {
            return Err(SnapshotError::DuplicateAddress {
                address,
                first: first.clone(),
                second: owner,
            });
        }
        self.by_address.insert(address, owner);
        Ok(())
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
