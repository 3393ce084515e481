//! Workloads and waypoint instances: placement, addresses, identity, and the services they back.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ferry_core::model::{
    ClusterId, HBONE_PORT, Health, Locality, NetworkId, NodeName, PortMapping, ServiceKey,
    TunnelProtocol, Workload, WorkloadUid,
};

use super::services::{User, default_hostname};
use super::{Cx, item, namespace, one_of, selects};
use crate::schema::{InstanceSpec, ProtocolSpec, WorkloadSpec};

/// Where a workload runs.
struct Placement {
    cluster: ClusterId,
    network: NetworkId,
    node: Option<NodeName>,
    locality: Locality,
}

/// The parts of a workload that differ between pods and waypoint instances.
struct Pod<'a> {
    path: &'a str,
    name: &'a str,
    namespace: &'a str,
    uid: Option<&'a str>,
    service_account: &'a str,
    placement: Placement,
    addresses: Vec<IpAddr>,
}

impl Cx {
    pub(super) fn workloads(&mut self, specs: &[WorkloadSpec]) {
        // Selectors by (namespace, first label): a workload looks at the selectors one of its
        // own labels starts, not at every selector of the mesh.
        let selectors = std::mem::take(&mut self.selectors);
        let mut index: HashMap<(&str, &str, &str), Vec<usize>> = HashMap::new();
        for (j, s) in selectors.iter().enumerate() {
            if let Some((k, v)) = s.labels.iter().next() {
                index
                    .entry((s.namespace.as_str(), k.as_str(), v.as_str()))
                    .or_default()
                    .push(j);
            }
        }
        for (i, w) in specs.iter().enumerate() {
            let path = item("workloads", i, &w.name);
            self.check_name(&path, "name", &w.name);
            let ns = namespace(w.namespace.as_ref());
            let service_account = w.service_account.as_deref().unwrap_or("default");
            self.check_identity(&path, &ns, Some(service_account));
            let placement = self.placement(&path, w.node.as_deref(), w.cluster.as_deref());

            let addresses = self.addresses(&path, &w.address, &w.addresses, placement.as_ref());
            let waypoint = w.waypoint.as_ref().and_then(|r| {
                self.waypoint_ref(&format!("{path}.waypoint"), &ns, r, User::Workload)
            });
            let mut candidates: Vec<usize> = w
                .labels
                .iter()
                .filter_map(|(k, v)| index.get(&(ns.as_str(), k.as_str(), v.as_str())))
                .flatten()
                .copied()
                .collect();
            candidates.sort_unstable();
            let mut services: BTreeMap<ServiceKey, Vec<PortMapping>> = candidates
                .iter()
                .map(|&j| &selectors[j])
                .filter(|s| selects(&s.labels, &w.labels))
                .filter(|s| match (&s.clusters, &placement) {
                    (None, _) => true,
                    (Some(set), Some(p)) => set.contains(&p.cluster),
                    (Some(_), None) => false,
                })
                .map(|s| {
                    let mut ports = s.ports.clone();
                    ports.extend(named_ports(&s.named, &w.ports));
                    (s.key.clone(), ports)
                })
                .collect();
            services.extend(self.backs(&path, &ns, w));

            let Some(placement) = placement else { continue };
            let pod = Pod {
                path: &path,
                name: &w.name,
                namespace: &ns,
                uid: w.uid.as_deref(),
                service_account,
                placement,
                addresses,
            };
            let Some(mut workload) = self.workload(pod) else {
                continue;
            };
            workload.tunnel = match w.protocol {
                ProtocolSpec::Hbone => TunnelProtocol::Hbone,
                ProtocolSpec::Tcp => TunnelProtocol::Tcp,
            };
            workload.health = health(w.healthy, w.terminating);
            workload.capacity = w.capacity;
            workload.waypoint = waypoint;
            workload.services = services.into();
            workload.labels = w.labels.clone().into();
            workload.dns_capture = w.dns_capture;
            self.out.workloads.push(workload);
        }
        drop(index);
        self.selectors = selectors;
    }

    /// The services workload `w` (at `path`, of namespace `ns`) backs by name, whatever their
    /// selectors, with their port maps: its own map for a port, else its port of the name the
    /// service port targets, else the service's target.
    fn backs(
        &mut self,
        path: &str,
        ns: &str,
        w: &WorkloadSpec,
    ) -> Vec<(ServiceKey, Vec<PortMapping>)> {
        let mut out = Vec::new();
        for (name, map) in &w.services {
            let service_path = format!("{path}.services.{name}");
            // A hostname, else a name with the default hostname.
            let hostname = if name.contains('.') {
                name.clone()
            } else {
                default_hostname(name, ns)
            };
            let key = ServiceKey::new(ns, &hostname);
            let Some(declared) = self.service_ports.get(&key).cloned() else {
                self.problem(
                    service_path,
                    format!(
                        "expected a service (name or hostname) of namespace {ns}, found {name:?}"
                    ),
                );
                continue;
            };
            let mut ports = Vec::new();
            for (&service_port, &target_port) in map {
                let port_path = format!("{service_path}.{service_port}");
                if !declared.iter().any(|(p, _)| *p == service_port) {
                    let list: Vec<u16> = declared.iter().map(|(p, _)| *p).collect();
                    let expected = one_of("service's ports", &list);
                    self.problem(
                        port_path,
                        format!("expected a key that is {expected}, found {service_port}"),
                    );
                } else if target_port == 0 {
                    self.problem(port_path, "expected a target port from 1 to 65535, found 0");
                } else {
                    ports.push(PortMapping {
                        service_port,
                        target_port,
                    });
                }
            }
            let named: Vec<(u16, String)> = declared
                .into_iter()
                .filter(|(p, _)| !map.contains_key(p))
                .filter_map(|(p, n)| Some((p, n?)))
                .collect();
            ports.extend(named_ports(&named, &w.ports));
            out.push((key, ports));
        }
        out
    }

    /// An instance of the waypoint whose service is `waypoint`: a label-less HBONE pod that
    /// backs that service on the HBONE port.
    pub(super) fn waypoint_instance(
        &mut self,
        path: &str,
        inst: &InstanceSpec,
        namespace: &str,
        service_account: &str,
        waypoint: &ServiceKey,
    ) {
        self.check_name(path, "name", &inst.name);
        let placement = self.placement(path, Some(&inst.node), None);
        let addresses = self.addresses(path, &inst.address, &inst.addresses, placement.as_ref());
        if inst.address.is_none() && inst.addresses.as_ref().is_none_or(Vec::is_empty) {
            self.problem(path, "expected `address` or `addresses`, found neither");
        }
        let Some(placement) = placement else { return };
        let pod = Pod {
            path,
            name: &inst.name,
            namespace,
            uid: None,
            service_account,
            placement,
            addresses,
        };
        let Some(mut workload) = self.workload(pod) else {
            return;
        };
        workload.health = health(inst.healthy, inst.terminating);
        workload.capacity = inst.capacity;
        let hbone = PortMapping {
            service_port: HBONE_PORT,
            target_port: HBONE_PORT,
        };
        workload
            .services
            .make_mut()
            .insert(waypoint.clone(), vec![hbone]);
        self.out.workloads.push(workload);
    }

    /// The addresses `address` or `addresses` (not both) of the item at `path`, each parsed and
    /// claimed on its network; the ones with problems left out.
    fn addresses(
        &mut self,
        path: &str,
        address: &Option<String>,
        addresses: &Option<Vec<String>>,
        placement: Option<&Placement>,
    ) -> Vec<IpAddr> {
        let texts: Vec<(String, &String)> = match (address, addresses) {
            (Some(_), Some(_)) => {
                self.problem(path, "expected either `address` or `addresses`, found both");
                Vec::new()
            }
            (Some(a), None) => vec![(format!("{path}.address"), a)],
            (None, Some(list)) => list
                .iter()
                .enumerate()
                .map(|(j, a)| (format!("{path}.addresses[{j}]"), a))
                .collect(),
            (None, None) => Vec::new(),
        };
        let mut out = Vec::new();
        for (address_path, text) in texts {
            let Some(ip) = self.ip(&address_path, text) else {
                continue;
            };
            if let Some(p) = placement {
                let network = p.network.clone();
                self.claim(&address_path, path, &network, ip);
            }
            out.push(ip);
        }
        out
    }

    /// A workload with defaults, after checking that it is unique; `None` if it is not.
    fn workload(&mut self, pod: Pod<'_>) -> Option<Workload> {
        let Pod {
            path,
            name,
            namespace,
            uid,
            service_account,
            placement,
            addresses,
        } = pod;
        let Placement {
            cluster,
            network,
            node,
            locality,
        } = placement;
        let pod_name = format!("{namespace}/{name}");
        if !self.declare(
            format!("pod {cluster}/{pod_name}"),
            path,
            &format!("namespace/name in cluster {cluster}"),
            &pod_name,
        ) {
            return None;
        }
        let uid = uid.map_or_else(
            || format!("{cluster}//v1/Pod/{namespace}/{name}"),
            str::to_string,
        );
        if uid.is_empty() {
            self.problem(
                format!("{path}.uid"),
                "expected a non-empty uid, found \"\"",
            );
        }
        if !self.declare(format!("workload {uid}"), path, "workload uid", &uid) {
            return None;
        }
        let network_gateway = self.gateways.get(&network).map(|(r, _)| r.clone());
        Some(Workload {
            uid: WorkloadUid::new(uid),
            name: name.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
            trust_domain: self.trust_domain.clone(),
            addresses,
            network,
            cluster,
            node,
            locality,
            tunnel: TunnelProtocol::Hbone,
            health: Health::Healthy,
            capacity: 1,
            waypoint: None,
            network_gateway,
            services: Default::default(),
            authorization_policies: Vec::new(),
            labels: Default::default(),
            // Derived from the labels when read (`ferry_core::telemetry::canonical`).
            canonical_name: String::new(),
            canonical_revision: String::new(),
            dns_capture: false,
        })
    }

    /// Where a workload on `node` (or, off any node, in `cluster`) runs.
    fn placement(
        &mut self,
        path: &str,
        node: Option<&str>,
        cluster: Option<&str>,
    ) -> Option<Placement> {
        let Some(node) = node else {
            let Some(cluster) = cluster else {
                self.problem(
                    path,
                    "expected `node` (or `cluster`, for a workload outside any node proxy), found neither",
                );
                return None;
            };
            let network = self.cluster_network(&format!("{path}.cluster"), cluster)?;
            return Some(Placement {
                cluster: ClusterId::new(cluster),
                network,
                node: None,
                locality: Locality::default(),
            });
        };
        let Some(info) = self.nodes.get(node) else {
            let expected = one_of("nodes", self.nodes.keys());
            self.problem(
                format!("{path}.node"),
                format!("expected {expected}, found {node:?}"),
            );
            return None;
        };
        if let Some(cluster) = cluster.filter(|c| *c != info.cluster.as_str()) {
            let msg = format!(
                "expected {} (the cluster of node {node}), found {cluster:?}",
                info.cluster
            );
            self.problem(format!("{path}.cluster"), msg);
            return None;
        }
        Some(Placement {
            cluster: info.cluster.clone(),
            network: info.network.clone()?,
            node: Some(NodeName::new(node)),
            locality: info.locality.clone(),
        })
    }
}

/// A workload's health from the topology's `healthy` and `terminating`: terminating wins.
fn health(healthy: bool, terminating: bool) -> Health {
    match (terminating, healthy) {
        (true, _) => Health::Terminating,
        (false, true) => Health::Healthy,
        (false, false) => Health::Unhealthy,
    }
}

/// The port maps of service ports that target a name (`named`: service port, name), from a
/// workload's named ports; a name it does not have maps nothing (it does not serve the port).
fn named_ports<'a>(
    named: &'a [(u16, String)],
    own: &'a BTreeMap<String, u16>,
) -> impl Iterator<Item = PortMapping> + 'a {
    named.iter().filter_map(|(service_port, name)| {
        let target_port = *own.get(name).filter(|p| **p != 0)?;
        Some(PortMapping {
            service_port: *service_port,
            target_port,
        })
    })
}
