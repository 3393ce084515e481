//! Waypoints: `Gateway` objects of class `istio-waypoint`, their pods and their Service, and
//! how other objects attach to them.

use std::collections::BTreeMap;

use ferry_topology::schema::{InstanceSpec, VipSpec, WaypointForSpec, WaypointSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::pod_status::{GATEWAY_NAME, pod_ips};
use super::{Serves, Tx, label, ns_name};

/// Gateway API class of Istio's waypoints.
pub(super) const WAYPOINT_CLASS: &str = "istio-waypoint";
const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
const USE_WAYPOINT: &str = "istio.io/use-waypoint";
const USE_WAYPOINT_NS: &str = "istio.io/use-waypoint-namespace";

impl Tx<'_> {
    pub(super) fn waypoints(&mut self) {
        // One waypoint per namespace/name, whichever clusters declare it.
        let mut specs: BTreeMap<(String, String), WaypointSpec> = BTreeMap::new();
        for c in self.clusters.clone() {
            for g in &c.gateways {
                if g.spec.gateway_class_name != WAYPOINT_CLASS {
                    continue;
                }
                let (ns, name) = ns_name(&g.metadata);
                let object = format!("Gateway {ns}/{name}");
                let serves = match label(&g.metadata, WAYPOINT_FOR).unwrap_or("service") {
                    "service" => Serves::Service,
                    "workload" => Serves::Workload,
                    "all" => Serves::All,
                    "none" => continue,
                    other => {
                        let msg = format!(
                            "{WAYPOINT_FOR}: expected service, workload, all or none, found {other:?}; taken as service"
                        );
                        self.note(&c.cluster, object.clone(), msg);
                        Serves::Service
                    }
                };
                let scope = self.scope_of(&c.cluster, &object, &g.metadata);
                let key = (ns.clone(), name.clone());
                if let Some(first) = specs.get_mut(&key) {
                    // Another cluster's copy: its instances and addresses come below; its
                    // scope applies to its own instances.
                    first.scope_by_cluster.insert(c.cluster.clone(), scope);
                    continue;
                }
                self.context
                    .waypoints
                    .insert(format!("{ns}/{name}"), serves);
                let mut scope_by_cluster = BTreeMap::new();
                scope_by_cluster.insert(c.cluster.clone(), scope);
                specs.insert(
                    key,
                    WaypointSpec {
                        name,
                        namespace: Some(ns),
                        for_: match serves {
                            Serves::Service => WaypointForSpec::Service,
                            Serves::Workload => WaypointForSpec::Workload,
                            Serves::All => WaypointForSpec::All,
                        },
                        scope: Some(self.mesh.default_scope.spec()),
                        scope_by_cluster,
                        ..WaypointSpec::default()
                    },
                );
            }
        }
        let mut notes = Vec::new();
        for ((ns, name), spec) in &mut specs {
            for c in &self.clusters {
                for s in &c.services {
                    if ns_name(&s.metadata) != (ns.clone(), name.clone()) {
                        continue;
                    }
                    let network = self.network_of(&c.cluster);
                    for ip in s
                        .spec
                        .as_ref()
                        .and_then(|s| s.cluster_ips.clone())
                        .unwrap_or_default()
                    {
                        if ip.parse::<std::net::IpAddr>().is_ok() {
                            spec.vips.push(VipSpec {
                                network: network.clone(),
                                address: ip,
                            });
                        }
                    }
                }
                let declares = c.gateways.iter().any(|g| {
                    g.spec.gateway_class_name == WAYPOINT_CLASS
                        && ns_name(&g.metadata) == (ns.clone(), name.clone())
                });
                if !declares {
                    continue;
                }
                for p in c.pods.iter().filter(|p| is_instance(p, ns, name)) {
                    let addresses = pod_ips(p);
                    let (false, Some(node)) = (addresses.is_empty(), node_of(p)) else {
                        continue;
                    };
                    if self.context.nodes.get(&node) != Some(&c.cluster) {
                        let (pns, pname) = ns_name(&p.metadata);
                        notes.push((
                            c.cluster.clone(),
                            format!("Pod {pns}/{pname}"),
                            format!("left out of waypoint {ns}/{name}: its node {node:?} is not a node of this cluster"),
                        ));
                        continue;
                    }
                    if spec.service_account.is_none() {
                        spec.service_account =
                            p.spec.as_ref().and_then(|s| s.service_account_name.clone());
                    }
                    let state = self.pod_state(&c.cluster, p);
                    spec.instances.push(InstanceSpec {
                        name: p.metadata.name.clone().unwrap_or_default(),
                        node,
                        address: None,
                        addresses: Some(addresses),
                        healthy: state.healthy,
                        terminating: state.terminating,
                        capacity: 1,
                    });
                }
            }
        }
        for (cluster, object, msg) in notes {
            self.note(&cluster, object, msg);
        }
        self.file.waypoints.extend(specs.into_values());
    }

    /// The waypoint `meta` attaches to (`namespace/name`), if it is one that serves `user`.
    /// Looked up on the object, else on its namespace's labels `ns_labels`.
    pub(super) fn waypoint_for(
        &mut self,
        cluster: &str,
        object: &str,
        meta: &ObjectMeta,
        ns_labels: &BTreeMap<String, String>,
        user: Serves,
    ) -> Option<String> {
        let (ns, _) = ns_name(meta);
        let (name, wp_ns) = match label(meta, USE_WAYPOINT) {
            Some(n) => (
                n.to_string(),
                label(meta, USE_WAYPOINT_NS).map(str::to_string),
            ),
            None => (
                ns_labels.get(USE_WAYPOINT)?.clone(),
                ns_labels.get(USE_WAYPOINT_NS).cloned(),
            ),
        };
        if name == "none" {
            return None;
        }
        let reference = format!("{}/{name}", wp_ns.unwrap_or(ns));
        match self.context.waypoints.get(&reference) {
            Some(s) if *s == Serves::All || *s == user => Some(reference),
            Some(_) => None,
            None => {
                let msg = format!(
                    "{USE_WAYPOINT}: no waypoint {reference} (a Gateway of class {WAYPOINT_CLASS}); reached without one"
                );
                self.note(cluster, object.to_string(), msg);
                None
            }
        }
    }
}

/// Is `p` a pod of the gateway `ns/name`?
pub(super) fn is_instance(p: &Pod, ns: &str, name: &str) -> bool {
    p.metadata.namespace.as_deref().unwrap_or("default") == ns
        && label(&p.metadata, GATEWAY_NAME) == Some(name)
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone()
}
