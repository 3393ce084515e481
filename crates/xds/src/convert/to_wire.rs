//! Model -> wire.

use std::collections::BTreeSet;

use ferry_api::security as sec;
use ferry_api::workload as wl;
use ferry_core::identity::Identity;
use ferry_core::model::{
    Action, AppProtocol, FailoverMinimum, Gateway, GatewayDestination, GatewayRef, HeaderModifier,
    Health, HealthPolicy, HttpRoute, LbMode, LocalityScope, Match, NetworkAddress, PathMatch,
    Policy, PolicyScope, RedirectPath, RequestRedirect, ScopeRule, Service, ServiceScope,
    StringMatch, TunnelProtocol, WaypointFor, Workload,
};
use ferry_core::snapshot::Snapshot;
use ferry_core::telemetry::canonical;

use super::fields::{ip_bytes, l4_match, string_match};

/// A workload's address resource: it depends on the workload alone.
pub(crate) fn workload_address(w: &Workload) -> (String, wl::Address) {
    (
        w.uid.to_string(),
        wl::Address {
            r#type: Some(wl::address::Type::Workload(workload(w))),
        },
    )
}

/// The name of an east-west gateway's address resource.
pub(crate) fn gateway_name(g: &Gateway) -> String {
    format!(
        "{}//v1/Pod/{}/{}",
        g.cluster,
        g.identity.namespace(),
        g.name
    )
}

/// An east-west gateway's address resource (a workload marked as the gateway): it depends on
/// the gateway alone.
pub(crate) fn gateway_address(g: &Gateway) -> (String, wl::Address) {
    let uid = gateway_name(g);
    let w = wl::Workload {
        uid: uid.clone(),
        name: g.name.clone(),
        namespace: g.identity.namespace().to_string(),
        addresses: vec![ip_bytes(g.address)],
        network: g.network.to_string(),
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        trust_domain: g.identity.trust_domain().to_string(),
        service_account: g.identity.service_account().to_string(),
        cluster_id: g.cluster.to_string(),
        ferry_eastwest_gateway: true,
        ..Default::default()
    };
    (
        uid,
        wl::Address {
            r#type: Some(wl::address::Type::Workload(w)),
        },
    )
}

/// A service's address resource: it depends on the service and on the identities of its
/// endpoints (through nested service addresses too; see `upstream_sans`).
pub(crate) fn service_address(snap: &Snapshot, s: &Service) -> (String, wl::Address) {
    (
        s.key().to_string(),
        wl::Address {
            r#type: Some(wl::address::Type::Service(service(snap, s))),
        },
    )
}

/// A policy's resource: it depends on the policy alone unless
/// [`policy_reads_workloads`] says it also reads the workloads it applies to.
pub(crate) fn policy_resource(snap: &Snapshot, p: &Policy) -> (String, sec::Authorization) {
    (p.key().to_string(), policy(snap, p))
}

/// Does `p`'s resource depend on more than `p` (the workloads it applies to, their waypoints)?
pub(crate) fn policy_reads_workloads(p: &Policy) -> bool {
    super::project::reads_workloads(p)
}

fn network_address(a: &NetworkAddress) -> wl::NetworkAddress {
    wl::NetworkAddress {
        network: a.network.to_string(),
        address: ip_bytes(a.ip),
        length: None,
    }
}

fn gateway(r: &GatewayRef) -> wl::GatewayAddress {
    let destination = match &r.destination {
        GatewayDestination::Service(k) => {
            wl::gateway_address::Destination::Hostname(wl::NamespacedHostname {
                namespace: k.namespace.clone(),
                hostname: k.hostname.clone(),
            })
        }
        GatewayDestination::Address(a) => {
            wl::gateway_address::Destination::Address(network_address(a))
        }
    };
    wl::GatewayAddress {
        destination: Some(destination),
        hbone_mtls_port: u32::from(r.hbone_port),
    }
}

fn workload(w: &Workload) -> wl::Workload {
    wl::Workload {
        uid: w.uid.to_string(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        addresses: w.addresses.iter().map(|ip| ip_bytes(*ip)).collect(),
        network: w.network.to_string(),
        tunnel_protocol: match w.tunnel {
            TunnelProtocol::Hbone => wl::TunnelProtocol::Hbone as i32,
            TunnelProtocol::Tcp => wl::TunnelProtocol::None as i32,
        },
        trust_domain: w.trust_domain.clone(),
        service_account: w.service_account.clone(),
        waypoint: w.waypoint.as_ref().map(gateway),
        network_gateway: w.network_gateway.as_ref().map(gateway),
        node: w.node.as_ref().map(ToString::to_string).unwrap_or_default(),
        canonical_name: canonical(w).service.to_string(),
        canonical_revision: canonical(w).revision.to_string(),
        workload_name: w.name.clone(),
        ferry_labels: (*w.labels).clone(),
        workload_type: wl::WorkloadType::Pod as i32,
        services: w
            .services
            .iter()
            .map(|(k, ports)| {
                let ports = ports
                    .iter()
                    .map(|p| wl::Port {
                        service_port: u32::from(p.service_port),
                        target_port: u32::from(p.target_port),
                        app_protocol: 0,
                    })
                    .collect();
                (k.to_string(), wl::PortList { ports })
            })
            .collect(),
        authorization_policies: w
            .authorization_policies
            .iter()
            .map(ToString::to_string)
            .collect(),
        status: match w.health {
            Health::Healthy => wl::WorkloadStatus::Healthy as i32,
            // Upstream has no terminating status: UNHEALTHY stops a stock peer's new
            // connections too, and `ferry_terminating` says which it is.
            Health::Unhealthy | Health::Terminating => wl::WorkloadStatus::Unhealthy as i32,
        },
        ferry_terminating: w.health == Health::Terminating,
        ferry_dns_capture: w.dns_capture,
        cluster_id: w.cluster.to_string(),
        locality: Some(wl::Locality {
            region: w.locality.region.clone(),
            zone: w.locality.zone.clone(),
            subzone: w.locality.subzone.clone(),
        }),
        capacity: Some(w.capacity),
        ..Default::default()
    }
}

fn scope_rule(r: &ScopeRule) -> wl::FerryScopeRule {
    use wl::ferry_scope_rule::Rule;
    let rule = match r {
        ScopeRule::Global => Rule::Global(true),
        ScopeRule::Local => Rule::Local(true),
        ScopeRule::Clusters(set) => Rule::Clusters(wl::FerryClusterList {
            clusters: set.iter().map(ToString::to_string).collect(),
        }),
    };
    wl::FerryScopeRule { rule: Some(rule) }
}

fn scope(s: &ServiceScope) -> wl::FerryScope {
    wl::FerryScope {
        default: Some(scope_rule(&s.default)),
        by_cluster: s
            .by_cluster
            .iter()
            .map(|(c, r)| (c.to_string(), scope_rule(r)))
            .collect(),
    }
}

fn service(snap: &Snapshot, s: &Service) -> wl::Service {
    let lb = s.load_balancing.as_ref().map(|lb| wl::LoadBalancing {
        routing_preference: lb
            .routing_preference
            .iter()
            .map(|p| {
                (match p {
                    LocalityScope::Region => wl::load_balancing::Scope::Region,
                    LocalityScope::Zone => wl::load_balancing::Scope::Zone,
                    LocalityScope::Subzone => wl::load_balancing::Scope::Subzone,
                    LocalityScope::Node => wl::load_balancing::Scope::Node,
                    LocalityScope::Cluster => wl::load_balancing::Scope::Cluster,
                    LocalityScope::Network => wl::load_balancing::Scope::Network,
                }) as i32
            })
            .collect(),
        mode: (match lb.mode {
            LbMode::Standard => wl::load_balancing::Mode::UnspecifiedMode,
            LbMode::Strict => wl::load_balancing::Mode::Strict,
            LbMode::Failover => wl::load_balancing::Mode::Failover,
        }) as i32,
        health_policy: (match lb.health_policy {
            HealthPolicy::OnlyHealthy => wl::load_balancing::HealthPolicy::OnlyHealthy,
            HealthPolicy::AllowAll => wl::load_balancing::HealthPolicy::AllowAll,
        }) as i32,
        ferry_failover_minimum: lb.failover_minimum.map(|m| wl::FerryFailoverMinimum {
            minimum: Some(match m {
                FailoverMinimum::Endpoints(n) => wl::ferry_failover_minimum::Minimum::Endpoints(n),
                FailoverMinimum::Percent(p) => {
                    wl::ferry_failover_minimum::Minimum::Percent(u32::from(p))
                }
            }),
        }),
    });
    wl::Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        addresses: s.vips.iter().map(network_address).collect(),
        ports: s
            .ports
            .iter()
            .map(|p| wl::Port {
                service_port: u32::from(p.port),
                target_port: u32::from(p.target_port),
                app_protocol: app_protocol(p.app_protocol) as i32,
            })
            .collect(),
        subject_alt_names: upstream_sans(snap, s),
        waypoint: s.waypoint.as_ref().map(gateway),
        load_balancing: lb,
        ferry_scope: Some(scope(&s.scope)),
        ferry_address_endpoints: s
            .address_endpoints
            .iter()
            .map(|a| wl::FerryAddressEndpoint {
                address: Some(network_address(&a.address)),
                cluster: a.cluster.to_string(),
                ports: a
                    .ports
                    .iter()
                    .map(|p| wl::Port {
                        service_port: u32::from(p.service_port),
                        target_port: u32::from(p.target_port),
                        app_protocol: 0,
                    })
                    .collect(),
            })
            .collect(),
        ferry_waypoint_for: (match s.waypoint_for {
            None => wl::FerryWaypointFor::FerryNotAWaypoint,
            Some(WaypointFor::Service) => wl::FerryWaypointFor::Service,
            Some(WaypointFor::Workload) => wl::FerryWaypointFor::Workload,
            Some(WaypointFor::All) => wl::FerryWaypointFor::All,
        }) as i32,
        ferry_http_routes: s.http_routes.iter().map(http_route).collect(),
        ferry_subject_alt_names: Some(wl::FerrySubjectAltNames {
            names: s
                .subject_alt_names
                .iter()
                .map(ToString::to_string)
                .collect(),
        }),
        ..Default::default()
    }
}

/// The SANs a stock peer expects of the service's endpoints: the configured ones and, as istiod
/// fills them, the identities of its endpoints (through nested service addresses too), so the
/// inner handshake of a connection through an east-west gateway verifies.
fn upstream_sans(snap: &Snapshot, s: &Service) -> Vec<String> {
    use ferry_core::snapshot::{AddressOwner, Endpoint};
    let mut ids: BTreeSet<Identity> = s.subject_alt_names.iter().cloned().collect();
    let mut seen = BTreeSet::new();
    let mut todo = vec![s.key()];
    while let Some(key) = todo.pop() {
        if !seen.insert(key.clone()) {
            continue;
        }
        for e in snap.endpoints(&key) {
            let uid = match e {
                Endpoint::Workload(u) => u,
                Endpoint::Address(a) => match snap.owner(&a.address) {
                    Some(AddressOwner::Workload(u)) => u,
                    Some(AddressOwner::Service(k)) => {
                        todo.push((**k).clone());
                        continue;
                    }
                    _ => continue,
                },
            };
            ids.extend(snap.workload(uid).and_then(|w| w.identity().ok()));
        }
    }
    ids.iter().map(ToString::to_string).collect()
}

fn http_route(r: &HttpRoute) -> wl::FerryHttpRoute {
    use wl::ferry_header_route_match::Value;
    use wl::ferry_route_match::Path;
    wl::FerryHttpRoute {
        name: r.name.clone(),
        matches: r
            .matches
            .iter()
            .map(|m| wl::FerryRouteMatch {
                path: m.path.as_ref().map(|p| match p {
                    PathMatch::Exact(p) => Path::PathExact(p.clone()),
                    PathMatch::Prefix(p) => Path::PathPrefix(p.clone()),
                }),
                headers: m
                    .headers
                    .iter()
                    .map(|(name, v)| wl::FerryHeaderRouteMatch {
                        name: name.clone(),
                        value: Some(match v {
                            StringMatch::Exact(x) => Value::Exact(x.clone()),
                            StringMatch::Prefix(x) => Value::Prefix(x.clone()),
                            StringMatch::Suffix(x) => Value::Suffix(x.clone()),
                            StringMatch::Presence => Value::Present(true),
                        }),
                    })
                    .collect(),
                method: m.method.clone().unwrap_or_default(),
                query_params: m
                    .query
                    .iter()
                    .map(|(name, exact)| wl::FerryQueryParamMatch {
                        name: name.clone(),
                        exact: exact.clone(),
                    })
                    .collect(),
            })
            .collect(),
        backends: r
            .backends
            .iter()
            .map(|b| wl::FerryRouteBackend {
                service: b.service.to_string(),
                port: u32::from(b.port.unwrap_or(0)),
                subset: b.subset.clone().into_iter().collect(),
                weight: b.weight,
            })
            .collect(),
        timeout_ms: r.timeout_ms,
        retries: r.retries,
        request_headers: header_modifier(&r.request_headers),
        response_headers: header_modifier(&r.response_headers),
        redirect: r.redirect.as_deref().map(redirect),
    }
}

fn redirect(r: &RequestRedirect) -> wl::FerryRequestRedirect {
    use wl::ferry_request_redirect::Path;
    wl::FerryRequestRedirect {
        scheme: r.scheme.map(|s| s.as_str().to_string()),
        hostname: r.hostname.clone(),
        port: r.port.map(u32::from),
        path: r.path.as_ref().map(|p| match p {
            RedirectPath::Full(p) => Path::ReplaceFullPath(p.clone()),
            RedirectPath::PrefixMatch(p) => Path::ReplacePrefixMatch(p.clone()),
        }),
        status_code: u32::from(r.status),
    }
}

/// `None` for no edits: a route without them encodes as it did before they existed.
fn header_modifier(m: &HeaderModifier) -> Option<wl::FerryHeaderModifier> {
    let pairs = |list: &[(String, String)]| {
        list.iter()
            .map(|(name, value)| wl::FerryHeader {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    };
    (!m.is_empty()).then(|| wl::FerryHeaderModifier {
        set: pairs(&m.set),
        add: pairs(&m.add),
        remove: m.remove.clone(),
    })
}

fn policy(snap: &Snapshot, p: &Policy) -> sec::Authorization {
    let (action, rules, dry_run) = super::project::upstream(snap, p);
    // Sent as istiod sends it, without `ferry_policy`, when the upstream fields alone read back
    // as the same policy (every policy istiod itself could send: plain L4, ALLOW or DENY).
    let says_it_all = dry_run == p.dry_run
        && match action {
            sec::Action::Allow => p.action == Action::Allow,
            sec::Action::Deny => p.action == Action::Deny,
            sec::Action::Audit => false,
        }
        && super::from_wire::policy_rules(&rules).is_ok_and(|r| r == p.rules);
    sec::Authorization {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: (match p.scope {
            PolicyScope::Mesh => sec::Scope::Global,
            PolicyScope::Namespace => sec::Scope::Namespace,
            PolicyScope::WorkloadSelector => sec::Scope::WorkloadSelector,
        }) as i32,
        action: action as i32,
        rules,
        dry_run,
        extensions: vec![],
        ferry_policy: (!says_it_all).then(|| sec::FerryPolicy {
            action: (match p.action {
                Action::Allow => sec::Action::Allow,
                Action::Deny => sec::Action::Deny,
                Action::Audit => sec::Action::Audit,
            }) as i32,
            rules: p
                .rules
                .iter()
                .map(|r| sec::Rule {
                    clauses: r
                        .clauses
                        .iter()
                        .map(|c| sec::Clause {
                            matches: c.matches.iter().map(ferry_match).collect(),
                        })
                        .collect(),
                })
                .collect(),
            dry_run: p.dry_run,
        }),
    }
}

/// The whole match, HTTP facts in Ferry's extension fields.
fn ferry_match(m: &Match) -> sec::Match {
    sec::Match {
        ferry_methods: m.methods.iter().map(string_match).collect(),
        ferry_not_methods: m.not_methods.iter().map(string_match).collect(),
        ferry_paths: m.paths.iter().map(string_match).collect(),
        ferry_not_paths: m.not_paths.iter().map(string_match).collect(),
        ferry_hosts: m.hosts.iter().map(string_match).collect(),
        ferry_not_hosts: m.not_hosts.iter().map(string_match).collect(),
        ferry_headers: m
            .headers
            .iter()
            .map(|h| sec::HeaderMatch {
                name: h.name.clone(),
                values: h.values.iter().map(string_match).collect(),
            })
            .collect(),
        ..l4_match(m)
    }
}

/// A service port's protocol, as istiod writes it.
fn app_protocol(p: AppProtocol) -> wl::AppProtocol {
    match p {
        AppProtocol::Unknown => wl::AppProtocol::Unknown,
        AppProtocol::Http11 => wl::AppProtocol::Http11,
        AppProtocol::Http2 => wl::AppProtocol::Http2,
        AppProtocol::Grpc => wl::AppProtocol::Grpc,
    }
}
