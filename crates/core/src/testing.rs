//! A compact mesh builder for tests and benchmarks.
//!
//! Workloads get their cluster, network and locality from the node they are placed on, and every
//! workload on a network with an east-west gateway gets that gateway as its `network_gateway`,
//! as a control plane would do.

use std::net::IpAddr;
use std::sync::Arc;

use crate::identity::Identity;
use crate::model::{
    Cluster, ClusterId, Gateway, GatewayDestination, GatewayRef, HBONE_PORT, Health, Locality,
    NetworkAddress, NetworkId, Node, NodeName, Policy, PortMapping, Service, ServiceKey,
    ServicePort, ServiceScope, TunnelProtocol, WaypointFor, Workload, WorkloadUid,
};
use crate::snapshot::{Snapshot, SnapshotBuilder, SnapshotError};

pub(crate) const TRUST_DOMAIN: &str = "cluster.local";

/// Builds a mesh piece by piece.
#[derive(Debug, Default)]
pub struct MeshBuilder {
    pub clusters: Vec<Cluster>,
    pub nodes: Vec<Node>,
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Policy>,
    pub gateways: Vec<Gateway>,
}

/// Parses an address in tests.
pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

impl MeshBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cluster(&mut self, name: &str, network: &str) -> &mut Self {
        self.clusters.push(Cluster {
            name: name.into(),
            network: network.into(),
        });
        self
    }

    /// A node in `cluster`, with locality `region/zone/subzone`.
    pub fn node(&mut self, name: &str, cluster: &str, locality: &str) -> &mut Self {
        let mut parts = locality.split('/').map(str::to_string);
        self.nodes.push(Node {
            name: name.into(),
            cluster: cluster.into(),
            locality: Locality {
                region: parts.next().unwrap_or_default(),
                zone: parts.next().unwrap_or_default(),
                subzone: parts.next().unwrap_or_default(),
            },
            address: None,
        });
        self
    }

    fn network_of(&self, cluster: &ClusterId) -> NetworkId {
        self.clusters
            .iter()
            .find(|c| &c.name == cluster)
            .map(|c| c.network.clone())
            .expect("cluster declared before use")
    }

    /// An HBONE pod in namespace `default`, service account = name, on `node`.
    pub fn pod(&mut self, name: &str, node: &str, addr: &str) -> &mut Workload {
        let n = self
            .nodes
            .iter()
            .find(|n| n.name.as_str() == node)
            .expect("node declared before use")
            .clone();
        let network = self.network_of(&n.cluster);
        self.workloads.push(Workload {
            uid: WorkloadUid::new(format!("{}//v1/Pod/default/{name}", n.cluster)),
            name: name.into(),
            namespace: "default".into(),
            service_account: name.into(),
            trust_domain: TRUST_DOMAIN.into(),
            addresses: vec![ip(addr)],
            network,
            cluster: n.cluster.clone(),
            node: Some(n.name.clone()),
            locality: Arc::new(n.locality),
            tunnel: TunnelProtocol::Hbone,
            health: Health::Healthy,
            capacity: 1,
            waypoint: None,
            network_gateway: None,
            services: Default::default(),
            authorization_policies: Vec::new(),
            labels: Default::default(),
            canonical_name: String::new(),
            canonical_revision: String::new(),
            dns_capture: false,
        });
        self.workloads.last_mut().expect("just pushed")
    }

    pub fn workload_mut(&mut self, name: &str) -> &mut Workload {
        self.workloads
            .iter_mut()
            .find(|w| w.name == name)
            .expect("workload exists")
    }

    /// A service `name.default.svc.cluster.local` with one port, global scope.
    /// `vips` are `network=ip` pairs.
    pub fn service(
        &mut self,
        name: &str,
        vips: &[(&str, &str)],
        port: u16,
        target: u16,
    ) -> &mut Service {
        self.services.push(Service {
            name: name.into(),
            namespace: "default".into(),
            hostname: hostname(name),
            vips: vips
                .iter()
                .map(|(n, a)| NetworkAddress::new((*n).into(), ip(a)))
                .collect(),
            ports: vec![ServicePort::new(port, target)],
            subject_alt_names: Vec::new(),
            waypoint: None,
            load_balancing: None,
            scope: ServiceScope::global(),
            address_endpoints: Vec::new(),
            waypoint_for: None,
            http_routes: Vec::new(),
        });
        self.services.last_mut().expect("just pushed")
    }

    pub fn service_mut(&mut self, name: &str) -> &mut Service {
        self.services
            .iter_mut()
            .find(|s| s.name == name)
            .expect("service exists")
    }

    /// Makes workload `w` an endpoint of service `svc`, mapping each service port to its target.
    pub fn backs(&mut self, w: &str, svc: &str) -> &mut Self {
        let s = self
            .services
            .iter()
            .find(|s| s.name == svc)
            .expect("service exists");
        let key = s.key();
        let ports = s
            .ports
            .iter()
            .map(|p| PortMapping {
                service_port: p.port,
                target_port: p.target_port,
            })
            .collect();
        self.workload_mut(w).services.make_mut().insert(key, ports);
        self
    }

    /// A waypoint: a service named `name` on port 15008 that serves `for_`, global scope.
    pub fn waypoint(&mut self, name: &str, for_: WaypointFor) -> &mut Service {
        let s = self.service(name, &[], HBONE_PORT, HBONE_PORT);
        s.waypoint_for = Some(for_);
        s
    }

    /// A waypoint instance pod for waypoint `wp`.
    pub fn waypoint_pod(&mut self, wp: &str, name: &str, node: &str, addr: &str) -> &mut Self {
        self.pod(name, node, addr);
        self.backs(name, wp)
    }

    /// An east-west gateway for `cluster`'s network at `addr`.
    pub fn gateway(&mut self, name: &str, cluster: &str, addr: &str) -> &mut Self {
        let cluster: ClusterId = cluster.into();
        let network = self.network_of(&cluster);
        self.gateways.push(Gateway {
            name: name.into(),
            network,
            cluster,
            address: ip(addr),
            hbone_port: HBONE_PORT,
            identity: Identity::new(TRUST_DOMAIN, "istio-system", name).expect("valid identity"),
        });
        self
    }

    pub fn policy(&mut self, p: Policy) -> &mut Self {
        self.policies.push(p);
        self
    }

    /// Builds the snapshot, panicking on invalid test input.
    pub fn build(&self) -> Snapshot {
        self.try_build().expect("test mesh is valid")
    }

    pub fn try_build(&self) -> Result<Snapshot, SnapshotError> {
        self.builder().build()
    }

    /// A snapshot builder holding this mesh (each workload given its network's gateway).
    pub fn builder(&self) -> SnapshotBuilder {
        let mut b = SnapshotBuilder::new(1);
        for c in &self.clusters {
            b.cluster(c.clone());
        }
        for n in &self.nodes {
            b.node(n.clone());
        }
        for s in &self.services {
            b.service(s.clone());
        }
        for p in &self.policies {
            b.policy(p.clone());
        }
        for g in &self.gateways {
            b.gateway(g.clone());
        }
        for w in &self.workloads {
            let mut w = w.clone();
            if w.network_gateway.is_none()
                && let Some(g) = self.gateways.iter().find(|g| g.network == w.network)
            {
                w.network_gateway = Some(GatewayRef {
                    destination: GatewayDestination::Address(g.network_address()),
                    hbone_port: g.hbone_port,
                });
            }
            b.workload(w);
        }
        b
    }
}

/// The hostname of test service `name`.
pub fn hostname(name: &str) -> String {
    format!("{name}.default.svc.cluster.local")
}

/// The key of test service `name`.
pub fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", hostname(name))
}

/// A reference to waypoint `name` (a test service) on port 15008.
pub fn waypoint_ref(name: &str) -> GatewayRef {
    GatewayRef {
        destination: GatewayDestination::Service(key(name)),
        hbone_port: HBONE_PORT,
    }
}

/// Node `name`.
pub fn node(name: &str) -> NodeName {
    name.into()
}

/// A seeded generator for property tests: sizes, chances and picks from a list, reproducible
/// from its seed.
#[derive(Clone, Debug)]
pub struct Gen(pub crate::random::SplitMix64);

impl Gen {
    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        use crate::random::Random as _;
        self.0.below(n as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A copy of one of `items` (not empty).
    pub fn pick_owned<T: Clone>(&mut self, items: &[T]) -> T {
        self.pick(items).clone()
    }
}
