//! Clusters, nodes and east-west gateways.

use ferry_topology::schema::{ClusterSpec, GatewaySpec, LocalitySpec, NodeSpec};

use super::pod_status::GATEWAY_NAME;
use super::{Tx, label, ns_name};

/// Gateway API class of Istio's east-west gateways.
pub(super) const EAST_WEST_CLASS: &str = "istio-east-west";
/// HBONE's port, where an east-west gateway listens unless a listener says otherwise.
const HBONE_PORT: u16 = 15008;

impl Tx<'_> {
    pub(super) fn places(&mut self) {
        for c in self.clusters.clone() {
            let network = c
                .network
                .clone()
                .or_else(|| {
                    self.namespace_labels(c, &self.mesh.root_namespace)
                        .get("topology.istio.io/network")
                        .cloned()
                })
                .unwrap_or_else(|| c.cluster.clone());
            self.file.clusters.push(ClusterSpec {
                name: c.cluster.clone(),
                network,
            });
            for n in &c.nodes {
                let name = n.metadata.name.clone().unwrap_or_default();
                if let Some(first) = self.context.nodes.get(&name) {
                    let msg = format!(
                        "left out: a node of this name is already in cluster {first} (node names must be unique across the mesh)"
                    );
                    self.note(&c.cluster, format!("Node {name}"), msg);
                    continue;
                }
                self.context.nodes.insert(name.clone(), c.cluster.clone());
                let get = |k: &str| label(&n.metadata, k).unwrap_or_default().to_string();
                self.file.nodes.push(NodeSpec {
                    name,
                    cluster: c.cluster.clone(),
                    address: None,
                    locality: LocalitySpec {
                        region: get("topology.kubernetes.io/region"),
                        zone: get("topology.kubernetes.io/zone"),
                        subzone: get("topology.istio.io/subzone"),
                    },
                });
            }
            for g in &c.gateways {
                if g.spec.gateway_class_name != EAST_WEST_CLASS {
                    continue;
                }
                let (ns, name) = ns_name(&g.metadata);
                let object = format!("Gateway {ns}/{name}");
                let address = g
                    .status
                    .as_ref()
                    .and_then(|s| {
                        s.addresses
                            .iter()
                            .find(|a| a.value.parse::<std::net::IpAddr>().is_ok())
                    })
                    .map(|a| a.value.clone());
                let Some(address) = address else {
                    self.note(
                        &c.cluster,
                        object,
                        "left out: an east-west gateway with no IP address in its status yet",
                    );
                    continue;
                };
                let port = g
                    .spec
                    .listeners
                    .iter()
                    .find(|l| l.port == HBONE_PORT)
                    .or_else(|| g.spec.listeners.first())
                    .map_or(HBONE_PORT, |l| l.port);
                let service_account = c
                    .pods
                    .iter()
                    .find(|p| {
                        p.metadata.namespace.as_deref() == Some(ns.as_str())
                            && label(&p.metadata, GATEWAY_NAME) == Some(name.as_str())
                    })
                    .and_then(|p| p.spec.as_ref()?.service_account_name.clone());
                self.file.gateways.push(GatewaySpec {
                    name,
                    cluster: c.cluster.clone(),
                    address,
                    port: Some(port),
                    namespace: Some(ns),
                    service_account,
                });
            }
        }
    }
}
