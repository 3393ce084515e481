//! Where things run: clusters, networks, nodes and localities.

use std::net::IpAddr;

use serde::Serialize;

use super::{ClusterId, NetworkId, NodeName};

/// A Kubernetes cluster. In Ferry each cluster sits on exactly one network; several clusters may
/// share a network (a "flat" multi-cluster set-up).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cluster {
    pub name: ClusterId,
    pub network: NetworkId,
}

/// Istio's `Locality`: region, zone and subzone, each possibly empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

/// A node of a cluster: `ferry node` runs once on each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Node {
    pub name: NodeName,
    pub cluster: ClusterId,
    pub locality: Locality,
    /// The node's own address on its network, when known (the lab uses it).
    pub address: Option<IpAddr>,
}
