//! Workloads and waypoint instances: placement, addresses, identity, and the services they back.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ferry_core::keyed_hash::HashMap;
use ferry_core::model::{
    ClusterId, HBONE_PORT, Health, Locality, NetworkId, NodeName, PortMapping, ServiceKey,
    SharedMap, TunnelProtocol, Workload, WorkloadUid,
};

use super::services::{User, default_hostname};
use super::{Cx, DEFAULT_NAMESPACE, item, one_of, selects};
use crate::schema::{InstanceSpec, Labels, ProtocolSpec, WorkloadSpec};

/// What the services a workload selects depend on, when it names no ports or services of
/// its own.
#[derive(PartialEq, Eq, Hash)]
struct SelectedBy<'a> {
    namespace: &'a str,
    labels: &'a Labels,
    cluster: Option<ClusterId>,
}

/// Where a workload runs.
struct Placement {
    cluster: ClusterId,
    network: NetworkId,
    node: Option<NodeName>,
    locality: Arc<Locality>,
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
    services: SharedMap<ServiceKey, Vec<PortMapping>>,
    labels: SharedMap<String, String>,
}

impl Cx {
    /// Converts `specs`, the workloads of the file from index `first` on.
    pub(super) fn workloads(&mut self, specs: &[WorkloadSpec], first: usize) {
        // Selectors by (namespace, first label): a workload looks at the selectors one of its
        // own labels starts, not at every selector of the mesh.
        let selectors = std::mem::take(&mut self.selectors);
        let mut index: HashMap<(&str, &str, &str), Vec<usize>> = HashMap::default();
        for (j, s) in selectors.iter().enumerate() {
            if let Some((k, v)) = s.labels.iter().next() {
                index
                    .entry((s.namespace.as_str(), k.as_str(), v.as_str()))
                    .or_default()
                    .push(j);
            }
        }
        self.out.workloads.reserve(specs.len());
        // One copy of each distinct label map, and of each distinct map of the services a
        // workload's labels select (replicas carry the same labels and back the same services).
        let mut label_maps: HashMap<&Labels, SharedMap<String, String>> = HashMap::default();
        let mut selected: HashMap<SelectedBy<'_>, SharedMap<ServiceKey, Vec<PortMapping>>> =
            HashMap::default();
        for (i, w) in (first..).zip(specs) {
            let path = item("workloads", i, &w.name);
            self.check_name(&path, "name", &w.name);
            let ns = w.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
            let service_account = w.service_account.as_deref().unwrap_or("default");
            self.check_identity(&path, ns, Some(service_account));
            let placement = self.placement(&path, w.node.as_deref(), w.cluster.as_deref());

            let addresses = self.addresses(&path, &w.address, &w.addresses, placement.as_ref());
            let waypoint = w.waypoint.as_ref().and_then(|r| {
                self.waypoint_ref(&format!("{path}.waypoint"), ns, r, User::Workload)
            });
            let select = || -> BTreeMap<ServiceKey, Vec<PortMapping>> {
                let mut candidates: Vec<usize> = w
                    .labels
                    .iter()
                    .filter_map(|(k, v)| index.get(&(ns, k.as_str(), v.as_str())))
                    .flatten()
                    .copied()
                    .collect();
                candidates.sort_unstable();
                candidates
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
                    .collect()
            };
            // Without named ports or services of its own, what a workload backs depends on
            // its namespace, labels and cluster alone.
            let services: SharedMap<ServiceKey, Vec<PortMapping>> =
                if w.ports.is_empty() && w.services.is_empty() {
                    let by = SelectedBy {
                        namespace: ns,
                        labels: &w.labels,
                        cluster: placement.as_ref().map(|p| p.cluster.clone()),
                    };
                    match selected.get(&by) {
                        Some(shared) => shared.clone(),
                        None => {
                            let shared = SharedMap::from(select());
                            selected.insert(by, shared.clone());
                            shared
                        }
                    }
                } else {
                    let mut services = select();
                    services.extend(self.backs(&path, ns, w));
                    services.into()
                };

            let Some(placement) = placement else { continue };
            let labels = label_maps
                .entry(&w.labels)
                .or_insert_with(|| w.labels.clone().into())
                .clone();
            let pod = Pod {
                path: &path,
                name: &w.name,
                namespace: ns,
                uid: w.uid.as_deref(),
                service_account,
                placement,
                addresses,
                services,
                labels,
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
        let hbone = PortMapping {
            service_port: HBONE_PORT,
            target_port: HBONE_PORT,
        };
        let pod = Pod {
            path,
            name: &inst.name,
            namespace,
            uid: None,
            service_account,
            placement,
            addresses,
            services: BTreeMap::from([(waypoint.clone(), vec![hbone])]).into(),
            labels: SharedMap::default(),
        };
        let Some(mut workload) = self.workload(pod) else {
            return;
        };
        workload.health = health(inst.healthy, inst.terminating);
        workload.capacity = inst.capacity;
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
        let texts: Vec<(Option<usize>, &String)> = match (address, addresses) {
            (Some(_), Some(_)) => {
                self.problem(path, "expected either `address` or `addresses`, found both");
                Vec::new()
            }
            (Some(a), None) => vec![(None, a)],
            (None, Some(list)) => list.iter().enumerate().map(|(j, a)| (Some(j), a)).collect(),
            (None, None) => Vec::new(),
        };
        let mut out = Vec::new();
        for (index, text) in texts {
            let at = AddressPath { path, index };
            let Some(ip) = self.ip(at, text) else {
                continue;
            };
            if let Some(p) = placement {
                self.claim(at, path, &p.network, ip);
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
            services,
            labels,
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
            format_args!("namespace/name in cluster {cluster}"),
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
            services,
            authorization_policies: Vec::new(),
            labels,
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
                locality: Arc::default(),
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
            node: Some(info.name.clone()),
            locality: info.locality.clone(),
        })
    }
}

/// Where an address of the item at `path` is: its `address`, or its `addresses[index]`.
#[derive(Clone, Copy)]
struct AddressPath<'a> {
    path: &'a str,
    index: Option<usize>,
}

impl std::fmt::Display for AddressPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            None => write!(f, "{}.address", self.path),
            Some(j) => write!(f, "{}.addresses[{j}]", self.path),
        }
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

#[cfg(test)]
mod tests {
    /// Replicas (equal labels, no ports or services of their own) hold one copy of their labels
    /// and of the services those select; a workload with named ports gets its own services.
    #[test]
    fn replicas_share_one_copy_of_their_labels_and_services() {
        let text = "clusters: [{name: east, network: net-east}]\nnodes: [{name: n1, cluster: east}]\nservices:\n  - {name: a, vips: [{network: net-east, address: 10.200.0.1}], ports: [{port: 80, target_port: 8080}, {port: 81, target_port_name: http}], selector: {app: a}}\nworkloads:\n  - {name: p1, node: n1, address: 10.0.0.1, labels: {app: a}}\n  - {name: p2, node: n1, address: 10.0.0.2, labels: {app: a}}\n  - {name: p3, node: n1, address: 10.0.0.3, labels: {app: b}}\n  - {name: p4, node: n1, address: 10.0.0.4, labels: {app: a}, ports: {http: 9090}}\n";
        let topology = crate::parse("replicas.yaml", text).expect("the mesh converts");
        let snap = &topology.snapshot;
        let pod = |name: &str| {
            snap.workloads()
                .find(|w| w.name == name)
                .expect("the pod")
                .clone()
        };
        let (p1, p2, p3, p4) = (pod("p1"), pod("p2"), pod("p3"), pod("p4"));
        assert!(p1.labels.ptr_eq(&p2.labels) && p1.labels.ptr_eq(&p4.labels));
        assert!(!p1.labels.ptr_eq(&p3.labels));
        assert_eq!(p3.labels.get("app").map(String::as_str), Some("b"));
        assert!(p1.services.ptr_eq(&p2.services));
        let ports = |w: &ferry_core::model::Workload| -> Vec<(u16, u16)> {
            w.services
                .values()
                .flatten()
                .map(|m| (m.service_port, m.target_port))
                .collect()
        };
        assert_eq!(ports(&p1), [(80, 8080)]);
        assert!(p3.services.is_empty());
        assert!(!p4.services.ptr_eq(&p1.services));
        assert_eq!(ports(&p4), [(80, 8080), (81, 9090)]);
    }
}
