//! One immutable, indexed view of the whole mesh.
//!
//! A [`Snapshot`] is built by [`SnapshotBuilder::build`], which checks the model's invariants
//! (unique addresses per network, no dangling references), and is never changed after: an update
//! makes a new one and swaps it in whole (see [`crate::store`]), so a reader on the data path
//! sees either the old mesh or the new one, never half of each. [`Snapshot::apply`] makes the
//! new one from a [`SnapshotDelta`] (added, changed and removed objects): it touches only the
//! entries and index buckets the delta names, shares the rest with the old snapshot, and checks
//! the invariants only where they could break; the result equals a full build of the same
//! objects (`tests/incremental.rs`).

mod bulk;
mod delta;
mod index;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use equivalent::Equivalent;
use imbl::OrdMap;
use serde::Serialize;

pub use delta::SnapshotDelta;
use index::Touched;

use crate::identity::InvalidIdentity;
use crate::keyed_hash::Map;
use crate::model::{
    AddressEndpoint, Cluster, ClusterId, Gateway, GatewayDestination, NetworkAddress, NetworkId,
    Node, NodeName, Policy, PolicyKey, Service, ServiceKey, Workload, WorkloadUid,
};

/// What owns an address on a network.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressOwner {
    Workload(WorkloadUid),
    /// Boxed: the address index holds one owner per workload address, and a key (two strings)
    /// inline would make every entry 24 bytes larger.
    Service(Box<ServiceKey>),
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
    /// An endpoint given by address, possibly another service's VIP. Boxed: a bucket holds
    /// one endpoint per workload that backs the service, and the rare address endpoint would
    /// make every entry as large as itself (88 bytes instead of 24).
    Address(Box<AddressEndpoint>),
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
///
/// Every map is persistent (`imbl`), hashed with a keyed fast hash (`keyed_hash`): a snapshot made by [`Snapshot::apply`] shares every entry
/// and index bucket a delta did not touch with the one it was made from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    version: u64,
    clusters: OrdMap<ClusterId, Cluster>,
    nodes: OrdMap<NodeName, Node>,
    workloads: Map<WorkloadUid, Arc<Workload>>,
    services: Map<ServiceKey, Arc<Service>>,
    policies: Map<PolicyKey, Arc<Policy>>,
    /// By name.
    gateways: Vec<Arc<Gateway>>,
    by_address: Map<NetworkAddress, AddressOwner>,
    /// Each bucket by key.
    by_hostname: Map<String, Vec<ServiceKey>>,
    /// Each bucket by uid.
    by_node: Map<NodeName, Arc<Vec<WorkloadUid>>>,
    /// Every service has a bucket, in [`endpoint_sort_key`] order.
    endpoints: Map<ServiceKey, Arc<Vec<Endpoint>>>,
    /// By key, as each namespace's bucket.
    mesh_policies: Vec<PolicyKey>,
    namespace_policies: Map<String, Vec<PolicyKey>>,
    /// How many workloads name each policy: a policy still named cannot go.
    policy_refs: Map<PolicyKey, usize>,
    /// How many workloads and services name each waypoint or network gateway destination: a
    /// service or address still named cannot go.
    gateway_refs: Map<GatewayDestination, usize>,
}

/// Collects objects and builds a [`Snapshot`] from them.
#[derive(Clone, Debug, Default)]
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

    /// Checks every invariant and indexes the result. Reports the first broken invariant, in
    /// this order: clusters, nodes, services, gateways, policies, workloads (each kind in the
    /// order given), then the references of services and of workloads (in the order given).
    ///
    /// Built in bulk (`snapshot/bulk.rs`); a set that breaks an invariant is built again
    /// [one by one](Self::build_one_by_one) to name the first.
    pub fn build(self) -> Result<Snapshot, SnapshotError> {
        match self.bulk(bulk::APART_MIN) {
            Some(snap) => Ok(snap),
            None => self.build_one_by_one(),
        }
    }

    /// [`Self::build`] adding one object at a time, as [`Snapshot::apply`] adds those a delta
    /// brings: the same snapshot or error, slower for a large set (public to test that).
    pub fn build_one_by_one(self) -> Result<Snapshot, SnapshotError> {
        let mut snap = Snapshot {
            version: self.version,
            ..Snapshot::default()
        };
        let mut touched = Touched::default();
        for c in self.clusters {
            snap.add_cluster(c)?;
        }
        for n in self.nodes {
            snap.add_node(n)?;
        }
        for s in &self.services {
            snap.add_service(s.clone(), &mut touched)?;
        }
        for g in self.gateways {
            snap.add_gateway(g, &mut touched)?;
        }
        for p in self.policies {
            snap.add_policy(p, &mut touched)?;
        }
        for w in &self.workloads {
            snap.add_workload(w.clone(), &mut touched)?;
        }
        // References are checked once every owner is known.
        for s in &self.services {
            snap.check_service_refs(s)?;
        }
        for w in &self.workloads {
            snap.check_workload_refs(w)?;
        }
        snap.sort(&touched);
        Ok(snap)
    }
}

/// The stable order of a service's endpoints: workloads by uid, then addresses by their text.
fn endpoint_order(a: &Endpoint, b: &Endpoint) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Endpoint::Workload(x), Endpoint::Workload(y)) => x.as_str().cmp(y.as_str()),
        (Endpoint::Workload(_), Endpoint::Address(_)) => Ordering::Less,
        (Endpoint::Address(_), Endpoint::Workload(_)) => Ordering::Greater,
        (Endpoint::Address(x), Endpoint::Address(y)) => {
            x.address.to_string().cmp(&y.address.to_string())
        }
    }
}

/// A [`NetworkAddress`] borrowed from its parts. Hashes as a `NetworkAddress` does: the same
/// fields in the same order (`tests::borrowed_keys_find_what_owned_ones_do`).
#[derive(Hash)]
struct AddressRef<'a> {
    network: &'a NetworkId,
    ip: IpAddr,
}

impl Equivalent<NetworkAddress> for AddressRef<'_> {
    fn equivalent(&self, key: &NetworkAddress) -> bool {
        self.ip == key.ip && *self.network == key.network
    }
}

/// A [`ServiceKey`] borrowed from its parts, hashing as one does.
#[derive(Hash)]
struct ServiceKeyRef<'a> {
    namespace: &'a str,
    hostname: &'a str,
}

impl Equivalent<ServiceKey> for ServiceKeyRef<'_> {
    fn equivalent(&self, key: &ServiceKey) -> bool {
        self.hostname == key.hostname && self.namespace == key.namespace
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

    /// Who owns `ip` on `network`: [`Snapshot::owner`] without building a [`NetworkAddress`]
    /// (a copy of the network's name) to look it up.
    pub(crate) fn owner_on(&self, network: &NetworkId, ip: IpAddr) -> Option<&AddressOwner> {
        self.by_address.get(&AddressRef { network, ip })
    }

    /// The endpoints of `service`: [`Snapshot::endpoints`] without building its key (a copy of
    /// its namespace and hostname) to look them up.
    pub(crate) fn endpoints_of(&self, service: &Service) -> &[Endpoint] {
        let key = ServiceKeyRef {
            namespace: &service.namespace,
            hostname: &service.hostname,
        };
        self.endpoints
            .get(&key)
            .map(|b| b.as_slice())
            .unwrap_or(&[])
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
        self.by_node.get(node).map(|b| b.as_slice()).unwrap_or(&[])
    }

    /// The endpoints of a service, in a stable order.
    pub fn endpoints(&self, service: &ServiceKey) -> &[Endpoint] {
        self.endpoints
            .get(service)
            .map(|b| b.as_slice())
            .unwrap_or(&[])
    }

    /// The east-west gateway at `address`.
    pub(crate) fn gateway_at(&self, address: &NetworkAddress) -> Option<&Arc<Gateway>> {
        self.gateways
            .iter()
            .find(|g| g.address == address.ip && g.network == address.network)
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
}

#[cfg(test)]
mod tests {
    use crate::model::NetworkAddress;
    use crate::testing::MeshBuilder;

    #[test]
    fn borrowed_keys_find_what_owned_ones_do() {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east").cluster("west", "net-west");
        m.node("n1", "east", "r/z/s").node("n2", "west", "r/z/s");
        m.pod("a", "n1", "198.18.1.1");
        m.pod("b", "n2", "198.18.1.1");
        m.service("svc", &[("net-east", "198.18.9.1")], 80, 8080);
        m.backs("a", "svc");
        let snap = m.build();
        for w in snap.workloads() {
            let ip = w.addresses[0];
            let owned = NetworkAddress::new(w.network.clone(), ip);
            assert_eq!(snap.owner_on(&w.network, ip), snap.owner(&owned));
            assert!(snap.owner_on(&w.network, ip).is_some());
        }
        // The same address on the network that does not have it.
        let nowhere = "net-nowhere".into();
        assert_eq!(snap.owner_on(&nowhere, "198.18.1.1".parse().unwrap()), None);
        for s in snap.services() {
            assert_eq!(snap.endpoints_of(s), snap.endpoints(&s.key()));
        }
        let svc = snap.services().find(|s| s.name == "svc").unwrap();
        assert_eq!(snap.endpoints_of(svc).len(), 1);
    }
}
