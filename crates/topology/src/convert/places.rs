//! Clusters, nodes and east-west gateways: where everything else runs.

use std::sync::Arc;

use ferry_core::identity::Identity;
use ferry_core::model::{
    Cluster, ClusterId, Gateway, GatewayDestination, GatewayRef, HBONE_PORT, Locality,
    NetworkAddress, NetworkId, Node, NodeName,
};

use super::{Cx, NodeInfo, item};
use crate::schema::{ClusterSpec, GatewaySpec, NodeSpec};

/// Namespace of gateways that name none.
const GATEWAY_NAMESPACE: &str = "istio-system";

impl Cx {
    pub(super) fn clusters(&mut self, specs: &[ClusterSpec]) {
        if specs.is_empty() {
            self.problem(
                "clusters",
                "expected at least one cluster, found an empty list",
            );
        }
        for (i, c) in specs.iter().enumerate() {
            let path = item("clusters", i, &c.name);
            self.check_name(&path, "name", &c.name);
            self.check_name(&path, "network", &c.network);
            if self.declare(
                format!("cluster {}", c.name),
                &path,
                "cluster name",
                &c.name,
            ) {
                let network = NetworkId::new(&c.network);
                self.clusters.insert(c.name.clone(), network.clone());
                self.out.clusters.push(Cluster {
                    name: ClusterId::new(&c.name),
                    network,
                });
            }
        }
    }

    pub(super) fn nodes(&mut self, specs: &[NodeSpec]) {
        for (i, n) in specs.iter().enumerate() {
            let path = item("nodes", i, &n.name);
            self.check_name(&path, "name", &n.name);
            let unique = self.declare(format!("node {}", n.name), &path, "node name", &n.name);
            let network = self.cluster_network(&format!("{path}.cluster"), &n.cluster);
            let address_path = format!("{path}.address");
            let address = n.address.as_ref().and_then(|a| self.ip(&address_path, a));
            if let (Some(net), Some(ip)) = (&network, address) {
                self.claim(&address_path, &path, net, ip);
            }
            let locality = Locality {
                region: n.locality.region.clone(),
                zone: n.locality.zone.clone(),
                subzone: n.locality.subzone.clone(),
            };
            if !unique {
                continue;
            }
            let cluster = ClusterId::new(&n.cluster);
            if network.is_some() {
                self.out.nodes.push(Node {
                    name: NodeName::new(&n.name),
                    cluster: cluster.clone(),
                    locality: locality.clone(),
                    address,
                });
            }
            self.nodes.insert(
                n.name.clone(),
                NodeInfo {
                    name: NodeName::new(&n.name),
                    cluster,
                    network,
                    locality: Arc::new(locality),
                },
            );
        }
    }

    pub(super) fn gateways(&mut self, specs: &[GatewaySpec]) {
        for (i, g) in specs.iter().enumerate() {
            let path = item("gateways", i, &g.name);
            self.check_name(&path, "name", &g.name);
            let unique = self.declare(
                format!("gateway {}", g.name),
                &path,
                "gateway name",
                &g.name,
            );
            let network = self.cluster_network(&format!("{path}.cluster"), &g.cluster);
            let address_path = format!("{path}.address");
            let address = self.ip(&address_path, &g.address);
            let port = g.port.unwrap_or(HBONE_PORT);
            if port == 0 {
                self.problem(
                    format!("{path}.port"),
                    "expected a port from 1 to 65535, found 0",
                );
            }
            let namespace = g.namespace.as_deref().unwrap_or(GATEWAY_NAMESPACE);
            let service_account = g.service_account.as_deref().unwrap_or(&g.name);
            self.check_identity(&path, namespace, Some(service_account));

            let Some(network) = network else { continue };
            if let Some((_, first)) = self.gateways.get(&network) {
                let msg = format!(
                    "expected at most one east-west gateway per network, found a second one on network {network} (the first is {first})"
                );
                self.problem(&path, msg);
                continue;
            }
            let Some(ip) = address else { continue };
            self.claim(&address_path, &path, &network, ip);
            let gref = GatewayRef {
                destination: GatewayDestination::Address(NetworkAddress::new(network.clone(), ip)),
                hbone_port: port,
            };
            self.gateways.insert(network.clone(), (gref, path));
            let identity = Identity::new(&self.trust_domain, namespace, service_account);
            if let (true, Ok(identity)) = (unique, identity) {
                self.out.gateways.push(Gateway {
                    name: g.name.clone(),
                    network,
                    cluster: ClusterId::new(&g.cluster),
                    address: ip,
                    hbone_port: port,
                    identity,
                });
            }
        }
    }
}
