//! Pods to workloads.

use std::collections::BTreeMap;

use ferry_topology::schema::{ProtocolSpec, WorkloadSpec};
use k8s_openapi::api::core::v1::Pod;

use super::pod_status::{GATEWAY_NAME, pod_ips};
use super::{Serves, Tx, label, ns_name};
use crate::enrollment::{self, DATAPLANE_MODE, REDIRECTION, REDIRECTION_ENABLED};
use crate::objects::ClusterObjects;

impl Tx<'_> {
    pub(super) fn pods(&mut self) {
        for c in self.clusters.clone() {
            for p in &c.pods {
                if let Some(w) = self.pod_workload(c, p) {
                    self.file.workloads.push(w);
                }
            }
        }
    }

    /// The workload of pod `p` of cluster `c`, if it is one.
    pub(super) fn pod_workload(&mut self, c: &ClusterObjects, p: &Pod) -> Option<WorkloadSpec> {
        let (ns, name) = ns_name(&p.metadata);
        let object = format!("Pod {ns}/{name}");
        // Gateway pods are waypoint instances or east-west gateways, not workloads.
        if is_gateway(p) {
            return None;
        }
        let spec = p.spec.as_ref();
        if spec.and_then(|s| s.host_network) == Some(true) {
            return None;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let addresses = pod_ips(p);
        if addresses.is_empty() {
            return None;
        }
        let ns_labels = self.namespace_labels(c, &ns);
        let asked = enrollment::asked(
            label(&p.metadata, DATAPLANE_MODE),
            ns_labels.get(DATAPLANE_MODE).map(String::as_str),
        );
        // In the mesh only once the CNI side says its traffic is redirected (Istio's
        // annotation): a pod asked for but not captured is reached over plain TCP.
        let redirected = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REDIRECTION))
            .is_some_and(|v| v == REDIRECTION_ENABLED);
        let enrolled = asked && redirected;
        if asked && !redirected {
            let msg = format!(
                "asked into the mesh but not redirected yet ({REDIRECTION} is not `enabled`): reached over plain TCP"
            );
            self.note(&c.cluster, object.clone(), msg);
        }
        let node = spec.and_then(|s| s.node_name.clone());
        let (node, cluster) = match node {
            Some(n) if self.context.nodes.get(&n) == Some(&c.cluster) => (Some(n), None),
            _ => (None, Some(c.cluster.clone())),
        };
        let waypoint = if enrolled {
            self.waypoint_for(
                &c.cluster,
                &object,
                &p.metadata,
                &ns_labels,
                Serves::Workload,
            )
        } else {
            None
        };
        let state = self.pod_state(&c.cluster, p);
        let (address, addresses) = match addresses.as_slice() {
            [one] => (Some(one.clone()), None),
            _ => (None, Some(addresses)),
        };
        Some(WorkloadSpec {
            name,
            namespace: Some(ns),
            service_account: Some(
                spec.and_then(|s| s.service_account_name.clone())
                    .unwrap_or_else(|| "default".into()),
            ),
            node,
            cluster,
            address,
            addresses,
            protocol: if enrolled {
                ProtocolSpec::Hbone
            } else {
                ProtocolSpec::Tcp
            },
            healthy: state.healthy,
            terminating: state.terminating,
            labels: p.metadata.labels.clone().unwrap_or_default(),
            waypoint,
            dns_capture: enrolled && dns_capture(&p.metadata),
            ports: named_ports(p),
            ..WorkloadSpec::default()
        })
    }
}

/// Is `p` a gateway's pod (a waypoint instance or an east-west gateway), never a workload?
pub(super) fn is_gateway(p: &Pod) -> bool {
    label(&p.metadata, GATEWAY_NAME).is_some()
}

/// A pod's named TCP container ports, for the Services whose `targetPort` names one (the
/// first container that names a port wins, as Kubernetes resolves it).
fn named_ports(p: &k8s_openapi::api::core::v1::Pod) -> BTreeMap<String, u16> {
    let mut out = BTreeMap::new();
    let ports = p
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten());
    for cp in ports {
        if cp.protocol.as_deref().is_some_and(|proto| proto != "TCP") {
            continue;
        }
        if let (Some(name), Ok(port)) = (cp.name.as_ref(), u16::try_from(cp.container_port))
            && !name.is_empty()
            && port != 0
        {
            out.entry(name.clone()).or_insert(port);
        }
    }
    out
}

/// Istio's per-pod DNS capture switch (`"true"` / `"false"`). Ferry's DNS proxy is opt-in: a
/// pod's DNS is captured only when it says `"true"` (and it is in the mesh).
const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";

fn dns_capture(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(DNS_CAPTURE))
        .is_some_and(|v| v == "true")
}
