//! Workloads: pods (and address-only entries) with the identity Ferry impersonates for them.

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::{
    ClusterId, GatewayRef, Locality, NetworkId, NodeName, PolicyKey, ServiceKey, ServicePort,
    SharedMap, WorkloadUid,
};
use crate::identity::{Identity, InvalidIdentity};

/// How traffic reaches a workload. Istio's `TunnelProtocol` (`NONE` is `Tcp` here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TunnelProtocol {
    /// Enrolled in the mesh: a node proxy terminates HBONE on port 15008 for it.
    Hbone,
    /// Not captured: reached with plain TCP on its own port.
    Tcp,
}

/// Istio's `WorkloadStatus`, plus `Terminating` (a Ferry extension: Istio has no such status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Healthy,
    Unhealthy,
    /// Shutting down (a Kubernetes endpoint's `terminating` condition, a rollout): it takes no
    /// new connections, whatever the health policy, and keeps the ones it has.
    Terminating,
}

/// One service port mapped to the workload's target port. Istio's `Port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PortMapping {
    pub service_port: u16,
    pub target_port: u16,
}

/// A workload, with Istio's `istio.workload.Workload` field meanings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Workload {
    pub uid: WorkloadUid,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub trust_domain: String,
    /// Addresses on `network`. Empty for an address-less placeholder of a remote workload.
    pub addresses: Vec<IpAddr>,
    pub network: NetworkId,
    pub cluster: ClusterId,
    /// The node whose proxy serves this workload; `None` for workloads outside any node proxy.
    pub node: Option<NodeName>,
    /// Shared: the workloads on one node hold its locality once.
    pub locality: Arc<Locality>,
    pub tunnel: TunnelProtocol,
    pub health: Health,
    /// Relative weight in load balancing. Istio's default is 1; 0 takes no new traffic.
    pub capacity: u32,
    /// A waypoint attached to this workload itself (not to a service it backs).
    pub waypoint: Option<GatewayRef>,
    /// The east-west gateway through which other networks reach this workload.
    pub network_gateway: Option<GatewayRef>,
    /// The services this workload backs, with their port maps (serialized by `namespace/hostname`:
    /// a JSON object's keys are strings). Shared: the replicas of one deployment back the same
    /// services, and a node holds their map once.
    #[serde(serialize_with = "by_service_name")]
    pub services: SharedMap<ServiceKey, Vec<PortMapping>>,
    /// Workload-selector policies that select this workload.
    pub authorization_policies: Vec<PolicyKey>,
    /// Shared as `services` is: replicas carry the same labels.
    pub labels: SharedMap<String, String>,
    /// The canonical service name as the control plane sent it (istiod's `canonical_name`);
    /// empty: derived from `labels` and `name` (`telemetry::canonical`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub canonical_name: String,
    /// The canonical revision as the control plane sent it; empty: derived from `labels`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub canonical_revision: String,
    /// The pod's DNS queries (UDP and TCP port 53) are captured and answered by its node proxy
    /// for mesh names (opt-in: the topology's `dns_capture`, Istio's pod annotation
    /// `ambient.istio.io/dns-capture`). See `ferry_core::dns`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dns_capture: bool,
}

fn by_service_name<S: serde::Serializer>(
    services: &SharedMap<ServiceKey, Vec<PortMapping>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(services.iter().map(|(k, v)| (k.to_string(), v)))
}

// === impl Workload ===

impl Workload {
    /// The SPIFFE identity the node proxy presents for this workload.
    pub fn identity(&self) -> Result<Identity, InvalidIdentity> {
        Identity::new(&self.trust_domain, &self.namespace, &self.service_account)
    }

    /// The target port for `service_port` of `service`, if this workload backs that port.
    pub fn target_port(&self, service: &ServiceKey, service_port: u16) -> Option<u16> {
        self.services
            .get(service)?
            .iter()
            .find(|p| p.service_port == service_port)
            .map(|p| p.target_port)
    }

    /// The port this workload serves port `sp` of `service` on: its own mapping, unless it has
    /// none or maps to 0, else the service's target port. 0 means the port is not served.
    pub(crate) fn serving_port(&self, service: &ServiceKey, sp: &ServicePort) -> u16 {
        self.target_port(service, sp.port)
            .filter(|p| *p != 0)
            .unwrap_or(sp.target_port)
    }
}
