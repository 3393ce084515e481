//! Cluster-set services: the Multi-Cluster Services API (`ServiceExport`, `ServiceImport`).
//!
//! - Every Service with a `ServiceExport` in at least one cluster becomes, besides its
//!   per-cluster service, the service `<name>.<namespace>.svc.clusterset.local`, backed only by
//!   the pods the exporting clusters' copies select. Its endpoints are pods, so a local
//!   exported service resolves in one decision and one hop.
//! - Its addresses: each cluster's `ServiceImport` IPs on that cluster's network; on every
//!   network with none, one address allocated from [`super::MeshConfig::clusterset_cidr`]:
//!   the FNV-1a hash of `namespace/name` into the range, then the next free address (so every
//!   replica of the control plane, given the same objects, allocates the same). A cluster with
//!   no Service of that name reaches it there: no stub Service is needed.
//! - Its scope: the cluster set (global), unless the exporting cluster's `ServiceExport` says
//!   otherwise with `ferry.dev/scope`, which then applies to that cluster's endpoints; a Service
//!   that declares its own scope is never widened by exporting it (the narrower of the two).
//! - Where exporting copies disagree on ports, selector or waypoint, the first exporting
//!   cluster's copy is used and every other exporting cluster gets a note on its
//!   `ServiceExport` (the MCS API's `Conflict` condition).
//! - An allocated address is kept where the MCS API keeps a cluster-set address: a
//!   `ServiceImport` (`spec.ips`, `type: ClusterSetIP`) of the same namespace and name in each
//!   cluster of a network that had none, labelled [`MANAGED_BY`]`: ferry` (see
//!   [`ImportWrite`]). Read back at the next translation, and after a restart, it is the
//!   service's address from then on, whatever else is exported or unexported. Ferry deletes the
//!   imports it wrote once the service is no longer exported.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use ferry_topology::schema::{ScopeSpec, ServiceSpec, VipSpec};

use super::services::{KubePort, ServiceCopy, port_specs, selector_clusters};
use super::{Tx, ns_name};

/// The label on the `ServiceImport`s Ferry writes, with the value `ferry`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// A `ServiceImport` that keeps the cluster-set address Ferry allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportWrite {
    pub ips: Vec<String>,
    /// The service's ports: `(port, name)`.
    pub ports: Vec<(u16, Option<String>)>,
}

impl ImportWrite {
    /// The object, for server-side apply.
    pub fn object(&self, namespace: &str, name: &str) -> serde_json::Value {
        let ports: Vec<serde_json::Value> = self
            .ports
            .iter()
            .map(|(port, pname)| match pname {
                Some(n) => serde_json::json!({"port": port, "protocol": "TCP", "name": n}),
                None => serde_json::json!({"port": port, "protocol": "TCP"}),
            })
            .collect();
        serde_json::json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ServiceImport",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: "ferry"}},
            "spec": {"type": "ClusterSetIP", "ips": self.ips, "ports": ports},
        })
    }
}

impl Tx<'_> {
    pub(super) fn clusterset(&mut self) {
        let copies = std::mem::take(&mut self.copies);
        let mut used = self.used_addresses();
        // Every import's address is taken: an allocation never moves onto one kept for
        // another service.
        used.extend(
            self.clusters
                .iter()
                .flat_map(|c| &c.service_imports)
                .flat_map(|i| &i.spec.ips)
                .filter_map(|ip| ip.parse::<IpAddr>().ok()),
        );
        // `(cluster, namespace, name)` of every export, and its scope.
        let mut exports: BTreeMap<(String, String, String), ScopeSpec> = BTreeMap::new();
        for c in self.clusters.clone() {
            for e in &c.service_exports {
                let (ns, name) = ns_name(&e.metadata);
                let object = format!("ServiceExport {ns}/{name}");
                let scope = match super::setting(&e.metadata, super::scope::SCOPE_KEY) {
                    Some(_) => self.scope_of(&c.cluster, &object, &e.metadata),
                    None => ScopeSpec::Global,
                };
                self.exports
                    .insert((c.cluster.clone(), ns.clone(), name.clone()), None);
                exports.insert((c.cluster.clone(), ns, name), scope);
            }
        }
        for (ns, name, copies) in &copies {
            let exporting: Vec<&ServiceCopy> = copies
                .iter()
                .filter(|c| exports.contains_key(&(c.cluster.clone(), ns.clone(), name.clone())))
                .collect();
            let Some(first) = exporting.first() else {
                continue;
            };
            let object = format!("ServiceExport {ns}/{name}");
            for other in &exporting[1..] {
                let differ = other.differences(first);
                if !differ.is_empty() {
                    let msg = format!(
                        "Conflict: {} differ from cluster {}'s export, whose are used",
                        differ.join(", "),
                        first.cluster
                    );
                    self.exports.insert(
                        (other.cluster.clone(), ns.clone(), name.clone()),
                        Some(msg.clone()),
                    );
                    self.note(&other.cluster, object.clone(), msg);
                }
            }
            let scope_by_cluster = exporting
                .iter()
                .map(|c| {
                    let key = (c.cluster.clone(), ns.clone(), name.clone());
                    let export = exports[&key].clone();
                    // A Service that declares its scope is never widened by its export.
                    let scope = if c.declared_scope {
                        narrowest(&c.scope, &export)
                    } else {
                        export
                    };
                    (c.cluster.clone(), scope)
                })
                .collect();
            let owned: Vec<ServiceCopy> = exporting.iter().map(|c| (*c).clone()).collect();
            let vips = self.clusterset_addresses(ns, name, &first.ports, &mut used);
            self.file.services.push(ServiceSpec {
                name: name.clone(),
                namespace: Some(ns.clone()),
                hostname: Some(format!("{name}.{ns}.svc.clusterset.local")),
                vips,
                ports: port_specs(&first.ports),
                selector: first.selector.clone(),
                selector_clusters: Some(selector_clusters(&owned)),
                scope: Some(ScopeSpec::Global),
                scope_by_cluster,
                waypoint: first.waypoint.clone(),
                load_balancing: first.load_balancing(),
                ..ServiceSpec::default()
            });
        }
        // The imports Ferry wrote for services no longer exported.
        for c in &self.clusters {
            for i in &c.service_imports {
                let (ns, name) = ns_name(&i.metadata);
                let exported = exports.keys().any(|(_, n, m)| *n == ns && *m == name);
                if ferry_managed(i) && !exported {
                    self.imports.insert((c.cluster.clone(), ns, name), None);
                }
            }
        }
        // Exports of nothing.
        for (cluster, ns, name) in exports.keys() {
            let exported = copies
                .iter()
                .any(|(n, m, cs)| n == ns && m == name && cs.iter().any(|c| &c.cluster == cluster));
            if !exported {
                let msg = "exports no Service of this namespace and name in its cluster";
                self.note(cluster, format!("ServiceExport {ns}/{name}"), msg);
            }
        }
        self.copies = copies;
    }

    /// The cluster-set addresses of `ns/name`: the `ServiceImport`s', and an allocated one on
    /// every network that has none.
    fn clusterset_addresses(
        &mut self,
        ns: &str,
        name: &str,
        ports: &[KubePort],
        used: &mut BTreeSet<IpAddr>,
    ) -> Vec<VipSpec> {
        let mut vips = Vec::new();
        let mut covered = BTreeSet::new();
        for c in &self.clusters {
            let network = self.network_of(&c.cluster);
            for import in &c.service_imports {
                if ns_name(&import.metadata) != (ns.to_string(), name.to_string()) {
                    continue;
                }
                for ip in &import.spec.ips {
                    if ip.parse::<IpAddr>().is_ok()
                        && !vips
                            .iter()
                            .any(|v: &VipSpec| v.network == network && &v.address == ip)
                    {
                        vips.push(VipSpec {
                            network: network.clone(),
                            address: ip.clone(),
                        });
                        covered.insert(network.clone());
                    }
                }
            }
        }
        let networks: BTreeSet<String> = self
            .file
            .clusters
            .iter()
            .map(|c| c.network.clone())
            .collect();
        if networks.iter().any(|n| !covered.contains(n)) {
            let ip = allocate(self.mesh.clusterset_cidr, &format!("{ns}/{name}"), used);
            if let Some(ip) = ip {
                for n in networks.difference(&covered) {
                    vips.push(VipSpec {
                        network: n.clone(),
                        address: ip.to_string(),
                    });
                }
                self.keep_allocation(ns, name, ip, ports, &covered);
            } else {
                let msg = "no free cluster-set address left in the configured range; reachable by name only";
                self.note("(mesh)", format!("ServiceExport {ns}/{name}"), msg);
            }
        }
        vips
    }

    /// Writes the allocated `ip` of `ns/name` to a `ServiceImport` in every cluster on a
    /// network not `covered` by an import's address, unless another controller owns the
    /// import there.
    fn keep_allocation(
        &mut self,
        ns: &str,
        name: &str,
        ip: IpAddr,
        ports: &[KubePort],
        covered: &BTreeSet<String>,
    ) {
        let write = ImportWrite {
            ips: vec![ip.to_string()],
            ports: ports.iter().map(|p| (p.port, p.name.clone())).collect(),
        };
        for c in &self.clusters {
            let network = self.network_of(&c.cluster);
            if covered.contains(&network) {
                continue;
            }
            let existing = c
                .service_imports
                .iter()
                .find(|i| ns_name(&i.metadata) == (ns.to_string(), name.to_string()));
            if existing.is_none_or(ferry_managed) {
                self.imports.insert(
                    (c.cluster.clone(), ns.to_string(), name.to_string()),
                    Some(write.clone()),
                );
            }
        }
    }

    /// Every address the file holds so far, and every pod address.
    fn used_addresses(&self) -> BTreeSet<IpAddr> {
        let f = &self.file;
        let vips = f
            .services
            .iter()
            .flat_map(|s| &s.vips)
            .chain(f.waypoints.iter().flat_map(|w| &w.vips))
            .map(|v| v.address.as_str());
        let pods = f
            .workloads
            .iter()
            .flat_map(|w| w.address.iter().chain(w.addresses.iter().flatten()))
            .map(String::as_str);
        let instances = f
            .waypoints
            .iter()
            .flat_map(|w| &w.instances)
            .flat_map(|i| i.address.iter().chain(i.addresses.iter().flatten()))
            .map(String::as_str);
        let gateways = f.gateways.iter().map(|g| g.address.as_str());
        vips.chain(pods)
            .chain(instances)
            .chain(gateways)
            .filter_map(|a| a.parse().ok())
            .collect()
    }
}

/// An import Ferry wrote.
fn ferry_managed(i: &crate::crd::ServiceImport) -> bool {
    super::label(&i.metadata, MANAGED_BY) == Some("ferry")
}

/// The narrower of two scopes (local is narrowest; two lists: the clusters in both).
fn narrowest(a: &ScopeSpec, b: &ScopeSpec) -> ScopeSpec {
    match (a, b) {
        (ScopeSpec::Local, _) | (_, ScopeSpec::Local) => ScopeSpec::Local,
        (ScopeSpec::Global, x) | (x, ScopeSpec::Global) => x.clone(),
        (ScopeSpec::Clusters(x), ScopeSpec::Clusters(y)) => {
            let both: Vec<String> = x.iter().filter(|c| y.contains(c)).cloned().collect();
            if both.is_empty() {
                ScopeSpec::Local
            } else {
                ScopeSpec::Clusters(both)
            }
        }
    }
}

/// A free address of `cidr` for `key`: its hash into the range, then the next free one (the
/// range's first and last addresses are never given).
fn allocate(cidr: (Ipv4Addr, u8), key: &str, used: &mut BTreeSet<IpAddr>) -> Option<IpAddr> {
    let (base, prefix) = cidr;
    let bits = 32 - u32::from(prefix.min(30));
    let size: u64 = 1 << bits;
    let base = u64::from(u32::from(base)) & !(size - 1);
    let start = fnv1a(key.as_bytes()) % size;
    for i in 0..size {
        let offset = (start + i) % size;
        if offset == 0 || offset == size - 1 {
            continue;
        }
        let ip = IpAddr::V4(Ipv4Addr::from(u32::try_from(base + offset).ok()?));
        if used.insert(ip) {
            return Some(ip);
        }
    }
    None
}

/// Is `ip` within `cidr` (as [`allocate`] reads it)?
pub(super) fn in_range(cidr: (Ipv4Addr, u8), ip: IpAddr) -> bool {
    let IpAddr::V4(ip) = ip else {
        return false;
    };
    let bits = 32 - u32::from(cidr.1.min(30));
    let mask = !((1u64 << bits) - 1);
    u64::from(u32::from(ip)) & mask == u64::from(u32::from(cidr.0)) & mask
}

/// 64-bit FNV-1a: a stable hash (the standard library's is randomly seeded per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_stable_and_skips_used_addresses() {
        let cidr = (Ipv4Addr::new(198, 18, 250, 0), 24);
        let mut used = BTreeSet::new();
        let a = allocate(cidr, "default/catalog", &mut used).unwrap();
        let mut fresh = BTreeSet::new();
        assert_eq!(
            allocate(cidr, "default/catalog", &mut fresh),
            Some(a),
            "stable"
        );
        // Taken: the next one.
        let b = allocate(cidr, "default/catalog", &mut used).unwrap();
        assert_ne!(a, b);
        let IpAddr::V4(v4) = b else { panic!() };
        assert_eq!(&v4.octets()[..3], &[198, 18, 250]);
        // A full range gives nothing.
        let tiny = (Ipv4Addr::new(198, 18, 251, 0), 30);
        let mut used = BTreeSet::new();
        assert!(allocate(tiny, "a", &mut used).is_some());
        assert!(allocate(tiny, "a", &mut used).is_some());
        assert_eq!(allocate(tiny, "a", &mut used), None);
    }
}
