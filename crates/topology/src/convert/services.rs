//! Waypoints and services: addresses, ports, scope, load balancing, waypoint references and
//! address endpoints.

use std::collections::{BTreeMap, BTreeSet};

use ferry_core::identity::Identity;
use ferry_core::model::{
    AddressEndpoint, ClusterId, GatewayDestination, GatewayRef, HBONE_PORT, HealthPolicy, LbMode,
    LoadBalancing, LocalityScope, NetworkAddress, PortMapping, ScopeRule, Service, ServiceKey,
    ServicePort, ServiceScope, WaypointFor,
};
use ferry_core::protocol;

use super::{Cx, Selector, ServicePorts, WaypointInfo, item, namespace, one_of};
use crate::schema::{
    EndpointSpec, HealthSpec, LbModeSpec, LbSpec, PortSpec, PreferSpec, ScopeSpec, ServiceSpec,
    VipSpec, WaypointForSpec, WaypointSpec,
};

/// The hostname of service `name` in `namespace` when the file gives none.
pub(super) fn default_hostname(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local")
}

/// Who uses a waypoint: decides which `for` values fit.
#[derive(Clone, Copy)]
pub(super) enum User {
    Service,
    Workload,
}

impl Cx {
    pub(super) fn waypoints(&mut self, specs: &[WaypointSpec]) {
        for (i, w) in specs.iter().enumerate() {
            let path = item("waypoints", i, &w.name);
            self.check_name(&path, "name", &w.name);
            let ns = namespace(w.namespace.as_ref());
            let service_account = w.service_account.as_deref().unwrap_or(&w.name);
            self.check_identity(&path, &ns, Some(service_account));
            let key = ServiceKey::new(&ns, default_hostname(&w.name, &ns));
            let name = format!("{ns}/{}", w.name);
            let unique = self.declare(
                format!("waypoint {name}"),
                &path,
                "waypoint namespace/name",
                &name,
            ) && self.declare(
                format!("service {key}"),
                &path,
                "service namespace/hostname",
                &key.to_string(),
            );
            let serves = match w.for_ {
                WaypointForSpec::Service => WaypointFor::Service,
                WaypointForSpec::Workload => WaypointFor::Workload,
                WaypointForSpec::All => WaypointFor::All,
            };
            let scope = self.scope(&path, w.scope.as_ref(), &w.scope_by_cluster);
            let vips = self.vips(&path, &w.vips);
            let load_balancing = self
                .load_balancing(&format!("{path}.load_balancing"), w.load_balancing.as_ref())
                .unwrap_or_else(LoadBalancing::prefer_close);
            for (j, inst) in w.instances.iter().enumerate() {
                let inst_path = format!("{path}.{}", item("instances", j, &inst.name));
                self.waypoint_instance(&inst_path, inst, &ns, service_account, &key);
            }
            if !unique {
                continue;
            }
            self.waypoints.insert(
                (ns.clone(), w.name.clone()),
                WaypointInfo {
                    key: key.clone(),
                    serves,
                    path,
                },
            );
            self.out.services.push(Service {
                name: w.name.clone(),
                namespace: ns,
                hostname: key.hostname,
                vips,
                ports: vec![ServicePort::new(HBONE_PORT, HBONE_PORT)],
                subject_alt_names: Vec::new(),
                waypoint: None,
                load_balancing: Some(load_balancing),
                scope,
                address_endpoints: Vec::new(),
                waypoint_for: Some(serves),
                http_routes: Vec::new(),
            });
        }
    }

    pub(super) fn services(&mut self, specs: &[ServiceSpec]) {
        for (i, s) in specs.iter().enumerate() {
            let path = item("services", i, &s.name);
            self.check_name(&path, "name", &s.name);
            let ns = namespace(s.namespace.as_ref());
            self.check_identity(&path, &ns, None);
            let hostname = s
                .hostname
                .clone()
                .unwrap_or_else(|| default_hostname(&s.name, &ns));
            self.check_name(&path, "hostname", &hostname);
            let key = ServiceKey::new(&ns, &hostname);
            let unique = self.declare(
                format!("service {key}"),
                &path,
                "service namespace/hostname",
                &key.to_string(),
            );
            let vips = self.vips(&path, &s.vips);
            let ports = self.ports(&path, &s.ports);
            if s.selector.as_ref().is_some_and(BTreeMap::is_empty) {
                self.problem(
                    format!("{path}.selector"),
                    "expected at least one label, found an empty map (omit `selector` for a service without workload endpoints)",
                );
            }
            let scope = self.scope(&path, s.scope.as_ref(), &s.scope_by_cluster);
            let waypoint = s.waypoint.as_ref().and_then(|r| {
                self.waypoint_ref(&format!("{path}.waypoint"), &ns, r, User::Service)
            });
            let load_balancing =
                self.load_balancing(&format!("{path}.load_balancing"), s.load_balancing.as_ref());
            let mut subject_alt_names = Vec::new();
            for (j, san) in s.subject_alt_names.iter().enumerate() {
                match san.parse::<Identity>() {
                    Ok(id) => subject_alt_names.push(id),
                    Err(e) => self.problem(
                        format!("{path}.subject_alt_names[{j}]"),
                        format!(
                            "expected a SPIFFE identity spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>, found {san:?} ({e})"
                        ),
                    ),
                }
            }
            let mut declared_ports: Vec<u16> = s.ports.iter().map(|p| p.port).collect();
            declared_ports.sort_unstable();
            declared_ports.dedup();
            let address_endpoints = self.endpoints(&path, &s.endpoints, &declared_ports);
            let selector_clusters = s.selector_clusters.as_ref().map(|names| {
                names
                    .iter()
                    .enumerate()
                    .filter(|(j, c)| {
                        self.cluster_network(&format!("{path}.selector_clusters[{j}]"), c)
                            .is_some()
                    })
                    .map(|(_, c)| ClusterId::new(c))
                    .collect()
            });
            if !unique {
                continue;
            }
            let named: Vec<(u16, String)> = s
                .ports
                .iter()
                .filter(|p| p.target_port.is_none())
                .filter_map(|p| Some((p.port, p.target_port_name.clone()?)))
                .filter(|(port, _)| ports.iter().any(|sp| sp.port == *port))
                .collect();
            let by_name: ServicePorts = ports
                .iter()
                .map(|sp| {
                    let name = named.iter().find(|(p, _)| *p == sp.port);
                    (sp.port, name.map(|(_, n)| n.clone()))
                })
                .collect();
            self.service_ports.insert(key.clone(), by_name);
            if let Some(labels) = s.selector.as_ref().filter(|l| !l.is_empty()) {
                self.selectors.push(Selector {
                    key: key.clone(),
                    namespace: ns.clone(),
                    labels: labels.clone(),
                    clusters: selector_clusters,
                    ports: ports
                        .iter()
                        .filter(|p| p.target_port != 0)
                        .map(|p| PortMapping {
                            service_port: p.port,
                            target_port: p.target_port,
                        })
                        .collect(),
                    named,
                });
            }
            self.out.services.push(Service {
                name: s.name.clone(),
                namespace: ns,
                hostname,
                vips,
                ports,
                subject_alt_names,
                waypoint,
                load_balancing,
                scope,
                address_endpoints,
                waypoint_for: None,
                http_routes: Vec::new(),
            });
        }
    }

    /// Virtual IPs, each claimed on its network for the object at `path`.
    fn vips(&mut self, path: &str, specs: &[VipSpec]) -> Vec<NetworkAddress> {
        let mut vips = Vec::new();
        for (j, v) in specs.iter().enumerate() {
            let vip_path = format!("{path}.vips[{j}]");
            let network = self.check_network(&format!("{vip_path}.network"), &v.network);
            let address_path = format!("{vip_path}.address");
            let ip = self.ip(&address_path, &v.address);
            if let (Some(network), Some(ip)) = (network, ip) {
                self.claim(&address_path, path, &network, ip);
                vips.push(NetworkAddress::new(network, ip));
            }
        }
        vips
    }

    /// Service ports: each non-zero, unique, with a non-zero target.
    fn ports(&mut self, path: &str, specs: &[PortSpec]) -> Vec<ServicePort> {
        let mut ports: Vec<ServicePort> = Vec::new();
        for (j, p) in specs.iter().enumerate() {
            let port_path = format!("{path}.ports[{j}]");
            let mut ok = true;
            if p.port == 0 {
                self.problem(
                    format!("{port_path}.port"),
                    "expected a port from 1 to 65535, found 0",
                );
                ok = false;
            } else if specs.iter().take(j).any(|q| q.port == p.port) {
                self.problem(
                    format!("{port_path}.port"),
                    format!("expected each service port once, found {} again", p.port),
                );
                ok = false;
            }
            match (p.target_port, p.target_port_name.as_deref()) {
                (Some(_), Some(_)) => {
                    self.problem(
                        format!("{port_path}.target_port_name"),
                        "expected either `target_port` or `target_port_name`, found both",
                    );
                }
                (None, Some("")) => {
                    self.problem(
                        format!("{port_path}.target_port_name"),
                        "expected a port name, found \"\"",
                    );
                }
                // Each workload's own port of that name: the service's target is none (0).
                (None, Some(_)) if ok => ports.push(ServicePort {
                    port: p.port,
                    target_port: 0,
                    app_protocol: protocol::declared(p.app_protocol.as_deref(), p.name.as_deref()),
                }),
                (None, Some(_)) => {}
                (None, None) => {
                    self.problem(
                        format!("{port_path}.target_port"),
                        "expected the port the endpoints listen on, found none (a port without a target)",
                    );
                }
                (Some(0), None) => {
                    self.problem(
                        format!("{port_path}.target_port"),
                        "expected a target port from 1 to 65535, found 0",
                    );
                }
                (Some(target_port), None) if ok => ports.push(ServicePort {
                    port: p.port,
                    target_port,
                    app_protocol: protocol::declared(p.app_protocol.as_deref(), p.name.as_deref()),
                }),
                (Some(_), None) => {}
            }
        }
        ports
    }

    /// A scope with its per-cluster overrides. The default scope is `local`.
    fn scope(
        &mut self,
        path: &str,
        spec: Option<&ScopeSpec>,
        by_cluster: &BTreeMap<String, ScopeSpec>,
    ) -> ServiceScope {
        let default = match spec {
            None => ScopeRule::Local,
            Some(s) => self.scope_rule(&format!("{path}.scope"), s),
        };
        let mut overrides = BTreeMap::new();
        for (cluster, s) in by_cluster {
            let rule_path = format!("{path}.scope_by_cluster.{cluster}");
            if !self.clusters.contains_key(cluster) {
                let expected = one_of("clusters", self.clusters.keys());
                self.problem(
                    &rule_path,
                    format!("expected a key that is {expected}, found {cluster:?}"),
                );
            }
            let rule = self.scope_rule(&rule_path, s);
            overrides.insert(ClusterId::new(cluster), rule);
        }
        ServiceScope {
            default,
            by_cluster: overrides,
        }
    }

    fn scope_rule(&mut self, path: &str, spec: &ScopeSpec) -> ScopeRule {
        match spec {
            ScopeSpec::Global => ScopeRule::Global,
            ScopeSpec::Local => ScopeRule::Local,
            ScopeSpec::Clusters(list) => {
                if list.is_empty() {
                    self.problem(
                        format!("{path}.clusters"),
                        "expected at least one cluster, found an empty list (a scope no cluster may use; write `local` for the endpoint's own cluster)",
                    );
                }
                let mut set = BTreeSet::new();
                for (k, c) in list.iter().enumerate() {
                    if self
                        .cluster_network(&format!("{path}.clusters[{k}]"), c)
                        .is_some()
                    {
                        set.insert(ClusterId::new(c));
                    }
                }
                ScopeRule::Clusters(set)
            }
        }
    }

    /// A load-balancing setting; `None` when the file gives none.
    fn load_balancing(&mut self, path: &str, spec: Option<&LbSpec>) -> Option<LoadBalancing> {
        let detail = match spec? {
            LbSpec::PreferClose => return Some(LoadBalancing::prefer_close()),
            LbSpec::Standard => return Some(LoadBalancing::standard()),
            LbSpec::Detail(d) => d,
        };
        let mut routing_preference = Vec::new();
        for (k, p) in detail.prefer.iter().enumerate() {
            let (scope, name) = match p {
                PreferSpec::Network => (LocalityScope::Network, "network"),
                PreferSpec::Region => (LocalityScope::Region, "region"),
                PreferSpec::Zone => (LocalityScope::Zone, "zone"),
                PreferSpec::Subzone => (LocalityScope::Subzone, "subzone"),
                PreferSpec::Node => (LocalityScope::Node, "node"),
                PreferSpec::Cluster => (LocalityScope::Cluster, "cluster"),
            };
            if routing_preference.contains(&scope) {
                self.problem(
                    format!("{path}.prefer[{k}]"),
                    format!("expected each preference once, found `{name}` again"),
                );
            } else {
                routing_preference.push(scope);
            }
        }
        let mode = match detail.mode {
            LbModeSpec::Standard => LbMode::Standard,
            LbModeSpec::Strict => LbMode::Strict,
            LbModeSpec::Failover => LbMode::Failover,
        };
        let failover_minimum = detail.min_healthy.as_ref().and_then(|m| {
            let at = format!("{path}.min_healthy");
            if mode != LbMode::Failover {
                let found = match mode {
                    LbMode::Standard => "standard",
                    LbMode::Strict => "strict",
                    LbMode::Failover => "failover",
                };
                self.problem(
                    at,
                    format!(
                        "expected `mode: failover` for a graduated minimum, found mode {found}"
                    ),
                );
                return None;
            }
            match m.minimum() {
                Ok(min) => Some(min),
                Err(e) => {
                    self.problem(at, e);
                    None
                }
            }
        });
        Some(LoadBalancing {
            mode,
            routing_preference,
            health_policy: match detail.health {
                HealthSpec::OnlyHealthy => HealthPolicy::OnlyHealthy,
                HealthSpec::AllowAll => HealthPolicy::AllowAll,
            },
            failover_minimum,
        })
    }

    /// Resolves `name` or `namespace/name` to a waypoint that serves `user`.
    pub(super) fn waypoint_ref(
        &mut self,
        path: &str,
        namespace: &str,
        reference: &str,
        user: User,
    ) -> Option<GatewayRef> {
        let (ns, name) = reference.split_once('/').unwrap_or((namespace, reference));
        let Some(info) = self.waypoints.get(&(ns.to_string(), name.to_string())) else {
            let known = one_of(
                "waypoints",
                self.waypoints.keys().map(|(n, w)| format!("{n}/{w}")),
            );
            let msg = format!(
                "expected the name of a waypoint in namespace {namespace:?} or <namespace>/<name> of {known}, found {reference:?}"
            );
            self.problem(path, msg);
            return None;
        };
        let (fits, wanted) = match user {
            User::Service => (info.serves.serves_services(), "service"),
            User::Workload => (info.serves.serves_workloads(), "workload"),
        };
        if !fits {
            let serves = match info.serves {
                WaypointFor::Service => "service",
                WaypointFor::Workload => "workload",
                WaypointFor::All => "all",
            };
            let msg = format!(
                "expected a waypoint that serves {wanted}s (`for: {wanted}` or `for: all`), found {reference:?}, which is `for: {serves}` ({})",
                info.path
            );
            self.problem(path, msg);
            return None;
        }
        Some(GatewayRef {
            destination: GatewayDestination::Service(info.key.clone()),
            hbone_port: HBONE_PORT,
        })
    }

    /// Address endpoints of a service whose ports are `service_ports`.
    fn endpoints(
        &mut self,
        path: &str,
        specs: &[EndpointSpec],
        service_ports: &[u16],
    ) -> Vec<AddressEndpoint> {
        let mut out = Vec::new();
        for (j, e) in specs.iter().enumerate() {
            let ep_path = format!("{path}.endpoints[{j}]");
            let cluster_network = self.cluster_network(&format!("{ep_path}.cluster"), &e.cluster);
            let network = match (e.network.as_deref(), cluster_network) {
                (None, net) => net,
                (Some(given), Some(net)) if given == net.as_str() => Some(net),
                (Some(given), Some(net)) => {
                    self.problem(
                        format!("{ep_path}.network"),
                        format!(
                            "expected {net} (the network of cluster {}), found {given:?}",
                            e.cluster
                        ),
                    );
                    None
                }
                (Some(_), None) => None,
            };
            let ip = self.ip(format!("{ep_path}.address"), &e.address);
            let mut ports = Vec::new();
            for (&service_port, &target_port) in &e.ports {
                let port_path = format!("{ep_path}.ports.{service_port}");
                if !service_ports.contains(&service_port) {
                    let expected = one_of("service's ports", service_ports);
                    self.problem(
                        &port_path,
                        format!("expected a key that is {expected}, found {service_port}"),
                    );
                } else if target_port == 0 {
                    self.problem(
                        &port_path,
                        "expected a target port from 1 to 65535, found 0",
                    );
                } else {
                    ports.push(PortMapping {
                        service_port,
                        target_port,
                    });
                }
            }
            if let (Some(network), Some(ip)) = (network, ip) {
                out.push(AddressEndpoint {
                    address: NetworkAddress::new(network, ip),
                    cluster: ClusterId::new(&e.cluster),
                    ports,
                });
            }
        }
        out
    }
}
