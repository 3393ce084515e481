//! Manual endpoints: a Service without a selector is backed by the addresses its
//! EndpointSlices (labelled `kubernetes.io/service-name`) list, as istiod's ambient index reads
//! them. Each address of an endpoint that names no pod becomes a workload of the slice's
//! cluster (istiod's "EndpointSlice workloads"):
//! - reached over plain TCP (nothing proves it runs a node proxy), with no labels and the
//!   namespace's `default` service account;
//! - its port map from the slice's ports, matched to the Service's ports by name; a Service
//!   port no slice port names keeps the Service's target;
//! - its health from the endpoint's conditions, read as for pods ([`super::endpoints`]);
//! - on the endpoint's node when that node is of its cluster, else in the cluster alone;
//! - backing the Service and, when its cluster exports the Service, the cluster-set service.
//!
//! Slices of `addressType: FQDN` name no address: left out, with a note. An endpoint that names
//! a pod of its cluster (`targetRef`) makes that pod's workload back the Service, with the same
//! port map; its state is the pod's, given by its endpoints as for every slice.

use std::collections::BTreeMap;

use ferry_topology::schema::{ProtocolSpec, WorkloadSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::endpoints::{SERVICE_NAME, state};
use super::{Tx, label, ns_name, selectorless};
use crate::objects::ClusterObjects;

impl Tx<'_> {
    /// The workloads of every selector-less Service's slices.
    pub(super) fn manual_endpoints(&mut self) {
        for c in self.clusters.clone() {
            for s in &c.endpoint_slices {
                let Some(service) = label(&s.metadata, SERVICE_NAME) else {
                    continue;
                };
                let (ns, _) = ns_name(&s.metadata);
                // A waypoint's own Service is backed by its instances.
                if selectorless(c, &ns, service).is_none()
                    || self
                        .context
                        .waypoints
                        .contains_key(&format!("{ns}/{service}"))
                {
                    continue;
                }
                self.slice_workloads(c, s, service);
            }
        }
    }

    /// The workloads of slice `s` of Service `service` in cluster `c`.
    fn slice_workloads(&mut self, c: &ClusterObjects, s: &EndpointSlice, service: &str) {
        let (ns, slice) = ns_name(&s.metadata);
        if s.address_type == "FQDN" {
            let msg = "left out: its endpoints are FQDNs, and a service's endpoints are addresses";
            self.note(&c.cluster, format!("EndpointSlice {ns}/{slice}"), msg);
            return;
        }
        let ports = self.slice_ports(&c.cluster, &ns, service, s);
        let mut services = BTreeMap::from([(service.to_string(), ports.clone())]);
        let clusterset = format!("{service}.{ns}.svc.clusterset.local");
        let exported = self.file.services.iter().any(|spec| {
            spec.hostname.as_deref() == Some(clusterset.as_str())
                && spec.scope_by_cluster.contains_key(&c.cluster)
        });
        if exported {
            services.insert(clusterset, ports);
        }
        for e in s.endpoints.iter().flatten() {
            if let Some(t) = e.target_ref.as_ref()
                && t.kind.as_deref() == Some("Pod")
            {
                self.pod_backs(c, &ns, t, &services);
                continue;
            }
            let st = state(e.conditions.as_ref());
            let (node, cluster) = match &e.node_name {
                Some(n) if self.context.nodes.get(n) == Some(&c.cluster) => (Some(n.clone()), None),
                _ => (None, Some(c.cluster.clone())),
            };
            for address in &e.addresses {
                self.file.workloads.push(WorkloadSpec {
                    name: format!("{slice}-{}", address.replace(['.', ':'], "-")),
                    namespace: Some(ns.clone()),
                    // istiod's UID for an EndpointSlice workload.
                    uid: Some(format!(
                        "{}/discovery.k8s.io/EndpointSlice/{ns}/{slice}/{address}",
                        c.cluster
                    )),
                    node: node.clone(),
                    cluster: cluster.clone(),
                    address: Some(address.clone()),
                    protocol: ProtocolSpec::Tcp,
                    healthy: st.healthy,
                    terminating: st.terminating,
                    services: services.clone(),
                    ..WorkloadSpec::default()
                });
            }
        }
    }

    /// Pod `target` (named by an endpoint of a selector-less Service's slice in namespace `ns`
    /// of `c`) backs `services`: added to its workload's, unless the pod is not in the mesh
    /// model or the reference names an earlier pod of that name (another uid).
    fn pod_backs(
        &mut self,
        c: &ClusterObjects,
        ns: &str,
        target: &k8s_openapi::api::core::v1::ObjectReference,
        services: &BTreeMap<String, BTreeMap<u16, u16>>,
    ) {
        let pod_ns = target.namespace.as_deref().unwrap_or(ns);
        let Some(name) = target.name.as_deref() else {
            return;
        };
        self.context
            .manual
            .insert((c.cluster.clone(), pod_ns.to_string(), name.to_string()));
        let pod = c
            .pods
            .iter()
            .find(|p| ns_name(&p.metadata) == (pod_ns.into(), name.into()));
        let same = pod.is_some_and(
            |p| match (target.uid.as_deref(), p.metadata.uid.as_deref()) {
                (Some(t), Some(u)) => t == u,
                _ => true,
            },
        );
        if !same {
            return;
        }
        let nodes = &self.context.nodes;
        let workload = self.file.workloads.iter_mut().find(|w| {
            w.namespace.as_deref() == Some(pod_ns)
                && w.name == name
                && w.uid.is_none()
                && (w.cluster.as_deref() == Some(c.cluster.as_str())
                    || w.node.as_ref().and_then(|n| nodes.get(n)) == Some(&c.cluster))
        });
        if let Some(w) = workload {
            for (svc, ports) in services {
                w.services.insert(svc.clone(), ports.clone());
            }
        }
    }

    /// The port map of slice `s` for Service `ns/service`'s copy in `cluster`: each Service
    /// port to the slice port of the same name (TCP).
    fn slice_ports(
        &self,
        cluster: &str,
        ns: &str,
        service: &str,
        s: &EndpointSlice,
    ) -> BTreeMap<u16, u16> {
        let copy = self
            .copies
            .iter()
            .find(|(n, m, _)| n == ns && m == service)
            .and_then(|(_, _, copies)| copies.iter().find(|c| c.cluster == cluster));
        let Some(copy) = copy else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for kp in &copy.ports {
            let slice_port = s.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or("") == kp.name.as_deref().unwrap_or("")
                    && p.protocol.as_deref().is_none_or(|proto| proto == "TCP")
            });
            if let Some(port) = slice_port
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0)
            {
                out.insert(kp.port, port);
            }
        }
        out
    }
}
