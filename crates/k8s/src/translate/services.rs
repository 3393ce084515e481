//! Services, merged across clusters by namespace and name (namespace sameness).

use std::collections::BTreeMap;

use ferry_topology::schema::{
    HealthSpec, LbDetail, LbModeSpec, LbSpec, MinHealthySpec, PortSpec, PreferSpec, ServiceSpec,
    VipSpec,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Serves, Tx, ns_name, setting};
use crate::objects::ClusterObjects;

/// A TCP port of a Service: its number, its target, and what it says it speaks (its name
/// and `appProtocol`, read as Istio reads them when the topology is converted).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct KubePort {
    pub(super) port: u16,
    pub(super) target: Target,
    pub(super) name: Option<String>,
    pub(super) app_protocol: Option<String>,
}

/// A Service port's `targetPort`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Target {
    Number(u16),
    /// A container port's name: each pod serves the port on its own port of that name.
    Name(String),
}

/// One cluster's copy of a service, translated.
#[derive(Clone)]
pub(super) struct ServiceCopy {
    pub(super) cluster: String,
    pub(super) network: String,
    pub(super) ports: Vec<KubePort>,
    pub(super) selector: Option<BTreeMap<String, String>>,
    pub(super) waypoint: Option<String>,
    pub(super) scope: ferry_topology::schema::ScopeSpec,
    /// The Service declares its scope itself (else `scope` is the mesh default).
    pub(super) declared_scope: bool,
    pub(super) vips: Vec<String>,
    pub(super) prefer_close: bool,
    /// Ferry's graduated failover (`ferry.dev/failover-min-healthy`), checked.
    pub(super) min_healthy: Option<MinHealthySpec>,
}

/// Ferry's graduated failover on a Service: `"2"` (usable endpoints) or `"60%"` (of capacity) a
/// locality tier needs before it takes all of the traffic. It implies `PreferClose` tiers.
pub(super) const MIN_HEALTHY_KEY: &str = "ferry.dev/failover-min-healthy";

impl Tx<'_> {
    pub(super) fn services(&mut self) {
        let mut copies: BTreeMap<(String, String), Vec<ServiceCopy>> = BTreeMap::new();
        for c in self.clusters.clone() {
            let network = self.network_of(&c.cluster);
            for s in &c.services {
                let (ns, name) = ns_name(&s.metadata);
                let Some(spec) = s.spec.as_ref() else {
                    continue;
                };
                // A waypoint's own Service gives the waypoint its addresses.
                if self.context.waypoints.contains_key(&format!("{ns}/{name}")) {
                    continue;
                }
                if spec.type_.as_deref() == Some("ExternalName") {
                    continue;
                }
                let object = format!("Service {ns}/{name}");
                let ports = self.ports(c, &object, s);
                let ns_labels = self.namespace_labels(c, &ns);
                let waypoint = self.waypoint_for(
                    &c.cluster,
                    &object,
                    &s.metadata,
                    &ns_labels,
                    Serves::Service,
                );
                let scope = self.scope_of(&c.cluster, &object, &s.metadata);
                let min_healthy = self.min_healthy(&c.cluster, &object, &s.metadata);
                let declared_scope = Self::declares_scope(&s.metadata);
                let vips = spec
                    .cluster_ips
                    .iter()
                    .flatten()
                    .chain(spec.cluster_ip.iter())
                    .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                copies.entry((ns, name)).or_default().push(ServiceCopy {
                    cluster: c.cluster.clone(),
                    network: network.clone(),
                    ports,
                    selector: spec.selector.clone().filter(|s| !s.is_empty()),
                    waypoint,
                    scope,
                    declared_scope,
                    vips,
                    prefer_close: spec.traffic_distribution.as_deref() == Some("PreferClose"),
                    min_healthy,
                });
            }
        }
        for ((ns, name), copies) in copies {
            let spec = self.merge(&ns, &name, &copies);
            self.file.services.push(spec);
            self.copies.push((ns, name, copies));
        }
    }

    /// One service from its copies; the first cluster's copy decides what they disagree on.
    fn merge(&mut self, ns: &str, name: &str, copies: &[ServiceCopy]) -> ServiceSpec {
        let first = &copies[0];
        let object = format!("Service {ns}/{name}");
        for other in &copies[1..] {
            let differ = other.differences(first);
            if !differ.is_empty() {
                let msg = format!(
                    "conflicts with cluster {} on {}: cluster {}'s copy is used",
                    first.cluster,
                    differ.join(", "),
                    first.cluster
                );
                self.note(&other.cluster, object.clone(), msg);
            }
        }
        let mut scope_by_cluster = BTreeMap::new();
        let mut vips = Vec::new();
        for c in copies {
            scope_by_cluster.insert(c.cluster.clone(), c.scope.clone());
            for ip in &c.vips {
                // Two clusters on one network may give a service the same address.
                if !vips
                    .iter()
                    .any(|v: &VipSpec| v.network == c.network && &v.address == ip)
                {
                    vips.push(VipSpec {
                        network: c.network.clone(),
                        address: ip.clone(),
                    });
                }
            }
        }
        ServiceSpec {
            name: name.to_string(),
            namespace: Some(ns.to_string()),
            vips,
            ports: port_specs(&first.ports),
            selector: first.selector.clone(),
            selector_clusters: Some(selector_clusters(copies)),
            scope: Some(first.scope.clone()),
            scope_by_cluster,
            waypoint: first.waypoint.clone(),
            load_balancing: first.load_balancing(),
            ..ServiceSpec::default()
        }
    }

    /// The `ferry.dev/failover-min-healthy` setting of a Service, if it is one Ferry can apply;
    /// a bad one is a note and is left out (the service then fails over the Istio way).
    fn min_healthy(
        &mut self,
        cluster: &str,
        object: &str,
        meta: &ObjectMeta,
    ) -> Option<MinHealthySpec> {
        let raw = setting(meta, MIN_HEALTHY_KEY)?.trim();
        let spec = match raw.parse::<u32>() {
            Ok(n) => MinHealthySpec::Endpoints(n),
            Err(_) => MinHealthySpec::Text(raw.to_string()),
        };
        match spec.minimum() {
            Ok(_) => Some(spec),
            Err(e) => {
                let msg = format!("{MIN_HEALTHY_KEY} left out: {e}");
                self.note(cluster, object.to_string(), msg);
                None
            }
        }
    }

    /// TCP ports with their target ports, names and `appProtocol`s. A named target port is
    /// each pod's own port of that name (a pod without one does not serve the port); a target
    /// of port 0 is left out with a note.
    fn ports(&mut self, c: &ClusterObjects, object: &str, s: &Service) -> Vec<KubePort> {
        let Some(spec) = s.spec.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in spec.ports.iter().flatten() {
            if p.protocol.as_deref().is_some_and(|proto| proto != "TCP") {
                continue;
            }
            let Ok(port) = u16::try_from(p.port) else {
                continue;
            };
            let target = match &p.target_port {
                None => Some(Target::Number(port)),
                Some(IntOrString::Int(n)) => u16::try_from(*n)
                    .ok()
                    .filter(|n| *n != 0)
                    .map(Target::Number),
                Some(IntOrString::String(named)) if !named.is_empty() => {
                    Some(Target::Name(named.clone()))
                }
                Some(IntOrString::String(_)) => None,
            };
            match target {
                Some(t) if port != 0 => out.push(KubePort {
                    port,
                    target: t,
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    app_protocol: p.app_protocol.clone(),
                }),
                _ => {
                    let msg = format!(
                        "port {port} left out: its target port {:?} is no port",
                        p.target_port
                    );
                    self.note(&c.cluster, object.to_string(), msg);
                }
            }
        }
        out.sort_unstable();
        out
    }
}

impl ServiceCopy {
    /// The load balancing this copy asks for: `PreferClose`, with a graduated minimum if set.
    pub(super) fn load_balancing(&self) -> Option<LbSpec> {
        match &self.min_healthy {
            Some(min) => Some(LbSpec::Detail(LbDetail {
                mode: LbModeSpec::Failover,
                prefer: vec![
                    PreferSpec::Network,
                    PreferSpec::Region,
                    PreferSpec::Zone,
                    PreferSpec::Subzone,
                    PreferSpec::Node,
                ],
                health: HealthSpec::OnlyHealthy,
                min_healthy: Some(min.clone()),
            })),
            None => self.prefer_close.then_some(LbSpec::PreferClose),
        }
    }

    /// What this copy and `first` disagree on, of what the first copy decides.
    pub(super) fn differences(&self, first: &Self) -> Vec<&'static str> {
        let mut differ = Vec::new();
        if self.ports != first.ports {
            differ.push("ports");
        }
        if self.selector != first.selector {
            differ.push("selector");
        }
        if self.waypoint != first.waypoint {
            differ.push("waypoint");
        }
        differ
    }
}

/// Ports in the topology's form.
pub(super) fn port_specs(ports: &[KubePort]) -> Vec<PortSpec> {
    ports
        .iter()
        .map(|p| PortSpec {
            port: p.port,
            target_port: match &p.target {
                Target::Number(n) => Some(*n),
                Target::Name(_) => None,
            },
            target_port_name: match &p.target {
                Target::Number(_) => None,
                Target::Name(n) => Some(n.clone()),
            },
            name: p.name.clone(),
            app_protocol: p.app_protocol.clone(),
        })
        .collect()
}

/// The clusters whose copy selects what the first copy selects.
pub(super) fn selector_clusters(copies: &[ServiceCopy]) -> Vec<String> {
    let first = &copies[0];
    copies
        .iter()
        .filter(|c| c.selector.is_some() && c.selector == first.selector)
        .map(|c| c.cluster.clone())
        .collect()
}
