//! Wire -> model, checking every field. Errors name the resource and what is wrong with it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ferry_api::security as sec;
use ferry_api::workload as wl;
use ferry_core::identity::Identity;
use ferry_core::model::{
    Action, AddressEndpoint, AppProtocol, Cidr, Clause, ClusterId, FailoverMinimum, Gateway,
    GatewayDestination, GatewayRef, HBONE_PORT, HTTP_METHODS, HeaderModifier, Health, HealthPolicy,
    HttpRoute, LbMode, LoadBalancing, Locality, LocalityScope, Match, NetworkAddress, NetworkId,
    PathMatch, Policy, PolicyKey, PolicyScope, PortMapping, REDIRECT_STATUSES, RedirectPath,
    RedirectScheme, RequestRedirect, RouteBackend, RouteMatch, Rule, ScopeRule, Service,
    ServiceAccountMatch, ServiceKey, ServicePort, ServiceScope, StringMatch, TunnelProtocol,
    WaypointFor, Workload, WorkloadUid,
};
use ferry_core::telemetry::{canonical_name, canonical_revision};

use super::intern::{Adopted, Interner, Labels, ServiceMap};
use super::wire;
use prost::Message;

/// A resource the client will not apply. The text is the NACK detail for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {reason}")]
pub struct InvalidResource {
    pub name: String,
    pub reason: String,
}

/// What one `Address` resource turned out to be.
#[derive(Debug, Clone)]
pub enum Decoded {
    Workload(Arc<Workload>),
    Gateway(Arc<Gateway>),
    Service(Arc<Service>),
}

type R<T> = Result<T, String>;

/// Decodes one `istio.workload.Address` resource named `name`.
pub fn decode_address(name: &str, bytes: &[u8]) -> Result<Decoded, InvalidResource> {
    decode_address_with(&mut Interner::default(), name, bytes)
}

/// Decodes one `istio.workload.Address` resource named `name`, sharing the names and maps it
/// repeats with what `intern` handed out before (what a client does with every push).
pub fn decode_address_with(
    intern: &mut Interner,
    name: &str,
    bytes: &[u8],
) -> Result<Decoded, InvalidResource> {
    let bad = |reason: String| InvalidResource {
        name: name.to_string(),
        reason,
    };
    let msg = wire::Address::decode(bytes).map_err(|e| bad(wire::not_an_address(bytes, e)))?;
    match msg.r#type {
        Some(wire::AddressType::Workload(w)) => {
            // The fields left as bytes decode before anything is checked, as the whole
            // message does at once.
            let shared = Shared::of(&w, intern).map_err(|e| bad(wire::not_an_address(bytes, e)))?;
            if w.uid != name {
                return Err(bad(format!(
                    "expected uid {name:?} (the resource name), found {:?}",
                    w.uid
                )));
            }
            if w.ferry_eastwest_gateway {
                gateway(&w).map(|g| Decoded::Gateway(Arc::new(g)))
            } else {
                workload(w, shared, intern).map(|w| Decoded::Workload(Arc::new(w)))
            }
        }
        Some(wire::AddressType::Service(s)) => {
            let expected = super::service_name(&s.namespace, &s.hostname);
            if expected != name {
                return Err(bad(format!(
                    "expected the name namespace/hostname = {expected:?}, found {name:?}"
                )));
            }
            service(&s, intern).map(|s| Decoded::Service(Arc::new(s)))
        }
        None => Err("neither a workload nor a service".to_string()),
    }
    .map_err(bad)
}

/// `d`, decoded through another interner (a push decoded on several threads), holding
/// `intern`'s copies of the names and maps it shares instead: as if `intern` had decoded it.
/// `from` is that other interner's copies adopted by `intern` so far, to which `d`'s are added.
/// Only a resource nothing else holds yet is changed; any other is returned as it is.
pub(crate) fn share(intern: &mut Interner, from: &mut Adopted, d: &mut Decoded) {
    fn network(intern: &mut Interner, from: &mut Adopted, a: &mut NetworkAddress) {
        a.network = intern.adopt_network(&a.network, from);
    }
    fn gateway(intern: &mut Interner, from: &mut Adopted, g: &mut Option<GatewayRef>) {
        if let Some(GatewayRef {
            destination: GatewayDestination::Address(a),
            ..
        }) = g
        {
            network(intern, from, a);
        }
    }
    match d {
        Decoded::Workload(w) => {
            let Some(w) = Arc::get_mut(w) else { return };
            w.network = intern.adopt_network(&w.network, from);
            w.cluster = intern.adopt_cluster(&w.cluster, from);
            if let Some(n) = &mut w.node {
                *n = intern.adopt_node(n, from);
            }
            gateway(intern, from, &mut w.waypoint);
            gateway(intern, from, &mut w.network_gateway);
            w.locality = intern.adopt_locality(&w.locality, from);
            w.services = intern.adopt_services(w.services.as_arc(), from).into();
            w.labels = intern.adopt_labels(w.labels.as_arc(), from).into();
        }
        Decoded::Service(s) => {
            let Some(s) = Arc::get_mut(s) else { return };
            for a in &mut s.vips {
                network(intern, from, a);
            }
            for e in &mut s.address_endpoints {
                network(intern, from, &mut e.address);
            }
            gateway(intern, from, &mut s.waypoint);
        }
        // Decoded without the interner.
        Decoded::Gateway(_) => {}
    }
}

/// Decodes one `istio.security.Authorization` resource named `name`.
pub fn decode_authorization(name: &str, bytes: &[u8]) -> Result<Policy, InvalidResource> {
    let bad = |reason: String| InvalidResource {
        name: name.to_string(),
        reason,
    };
    let msg = sec::Authorization::decode(bytes)
        .map_err(|e| bad(format!("not an istio.security.Authorization: {e}")))?;
    let expected = format!("{}/{}", msg.namespace, msg.name);
    if expected != name {
        return Err(bad(format!(
            "expected the name namespace/name = {expected:?}, found {name:?}"
        )));
    }
    policy(&msg).map_err(bad)
}

fn ip(bytes: &[u8]) -> R<IpAddr> {
    match bytes.len() {
        4 => Ok(IpAddr::from(
            <[u8; 4]>::try_from(bytes).map_err(|_| "bad IPv4")?,
        )),
        16 => Ok(IpAddr::from(
            <[u8; 16]>::try_from(bytes).map_err(|_| "bad IPv6")?,
        )),
        n => Err(format!("an address must be 4 or 16 bytes, found {n}")),
    }
}

fn port(p: u32, what: &str) -> R<u16> {
    u16::try_from(p).map_err(|_| format!("{what} {p} is not a port (0-65535)"))
}

/// A port's `app_protocol`. A value this build does not know (a newer istiod's) is no HTTP,
/// as `TCP` and `TLS` are: the port is not refused for it, as ztunnel does not.
fn app_protocol(p: i32) -> AppProtocol {
    match wl::AppProtocol::try_from(p) {
        Ok(wl::AppProtocol::Http11) => AppProtocol::Http11,
        Ok(wl::AppProtocol::Http2) => AppProtocol::Http2,
        Ok(wl::AppProtocol::Grpc) => AppProtocol::Grpc,
        Ok(_) | Err(_) => AppProtocol::Unknown,
    }
}

fn nonempty<'a>(s: &'a str, what: &str) -> R<&'a str> {
    if s.is_empty() {
        Err(format!("{what} is required"))
    } else {
        Ok(s)
    }
}

fn network_address(a: &wl::NetworkAddress, intern: &mut Interner) -> R<NetworkAddress> {
    Ok(NetworkAddress::new(
        intern.network(&a.network),
        ip(&a.address)?,
    ))
}

fn gateway_ref(g: &wl::GatewayAddress, what: &str, intern: &mut Interner) -> R<GatewayRef> {
    let destination = match &g.destination {
        Some(wl::gateway_address::Destination::Hostname(h)) => GatewayDestination::Service(
            ServiceKey::new(&h.namespace, nonempty(&h.hostname, "hostname")?),
        ),
        Some(wl::gateway_address::Destination::Address(a)) => {
            GatewayDestination::Address(network_address(a, intern)?)
        }
        None => return Err(format!("{what}: no destination")),
    };
    let hbone_port = match g.hbone_mtls_port {
        0 => HBONE_PORT,
        p => port(p, &format!("{what} hbone_mtls_port"))?,
    };
    Ok(GatewayRef {
        destination,
        hbone_port,
    })
}

fn port_mappings(ports: &[wl::Port]) -> R<Vec<PortMapping>> {
    ports
        .iter()
        .map(|p| {
            Ok(PortMapping {
                service_port: port(p.service_port, "service_port")?,
                target_port: port(p.target_port, "target_port")?,
            })
        })
        .collect()
}

fn service_key(s: &str) -> R<ServiceKey> {
    let (ns, host) = s
        .split_once('/')
        .ok_or_else(|| format!("service key {s:?} is not namespace/hostname"))?;
    Ok(ServiceKey::new(ns, nonempty(host, "service hostname")?))
}

/// A workload's fields that its message left as bytes, as the interner's copies: found by
/// their bytes, decoded the first time. The service map is checked too, but what is wrong with
/// it is reported where the workload's checks come to it.
struct Shared {
    services: R<Arc<ServiceMap>>,
    labels: Arc<Labels>,
    locality: Arc<Locality>,
}

impl Shared {
    fn of(w: &wire::Workload, intern: &mut Interner) -> Result<Self, prost::DecodeError> {
        let services = intern.services_wire(&w.services, |entries| {
            let sent = wire::services(entries)?;
            let mut services = BTreeMap::new();
            let converted = sent.iter().try_for_each(|(k, ports)| -> R<()> {
                services.insert(service_key(k)?, port_mappings(&ports.ports)?);
                Ok(())
            });
            Ok::<_, prost::DecodeError>(converted.map(|()| services))
        })?;
        let labels = intern.labels_wire(&w.ferry_labels, wire::labels)?;
        let locality = intern.locality_wire(&w.locality, |sent| {
            Ok::<_, prost::DecodeError>(wire::locality(sent)?.map_or_else(Locality::default, |l| {
                Locality {
                    region: l.region,
                    zone: l.zone,
                    subzone: l.subzone,
                }
            }))
        })?;
        Ok(Self {
            services,
            labels,
            locality,
        })
    }
}

/// A workload, moved out of its message (its strings are not copied again) with the names and
/// maps it repeats shared through `intern` (`shared`: those its message left as bytes).
fn workload(mut w: wire::Workload, shared: Shared, intern: &mut Interner) -> R<Workload> {
    let trust_domain = if w.trust_domain.is_empty() {
        "cluster.local".to_string()
    } else {
        std::mem::take(&mut w.trust_domain)
    };
    let service_account = if w.service_account.is_empty() {
        "default".to_string()
    } else {
        std::mem::take(&mut w.service_account)
    };
    Identity::check(&trust_domain, &w.namespace, &service_account).map_err(|e| e.to_string())?;
    let labels = shared.labels;
    let tunnel = match wl::TunnelProtocol::try_from(w.tunnel_protocol) {
        Ok(wl::TunnelProtocol::Hbone) => TunnelProtocol::Hbone,
        Ok(wl::TunnelProtocol::None) => TunnelProtocol::Tcp,
        Ok(wl::TunnelProtocol::LegacyIstioMtls) => {
            return Err("tunnel_protocol LEGACY_ISTIO_MTLS is not supported".into());
        }
        Err(_) => return Err(format!("unknown tunnel_protocol {}", w.tunnel_protocol)),
    };
    let health = match wl::WorkloadStatus::try_from(w.status) {
        // Terminating whatever the status says (Ferry sends UNHEALTHY with it).
        Ok(_) if w.ferry_terminating => Health::Terminating,
        Ok(wl::WorkloadStatus::Healthy) => Health::Healthy,
        Ok(wl::WorkloadStatus::Unhealthy) => Health::Unhealthy,
        Err(_) => return Err(format!("unknown status {}", w.status)),
    };
    let services = shared.services?;
    nonempty(&w.uid, "uid")?;
    nonempty(&w.name, "name")?;
    let addresses = w.addresses.iter().map(|a| ip(a)).collect::<R<_>>()?;
    let cluster = intern.cluster(nonempty(&w.cluster_id, "cluster_id")?);
    let waypoint = w
        .waypoint
        .as_ref()
        .map(|g| gateway_ref(g, "waypoint", intern))
        .transpose()?;
    let network_gateway = w
        .network_gateway
        .as_ref()
        .map(|g| gateway_ref(g, "network_gateway", intern))
        .transpose()?;
    let authorization_policies = w
        .authorization_policies
        .iter()
        .map(|p| {
            let (ns, n) = p
                .split_once('/')
                .ok_or_else(|| format!("policy key {p:?} is not namespace/name"))?;
            Ok(PolicyKey::new(ns, n))
        })
        .collect::<R<_>>()?;
    Ok(Workload {
        uid: WorkloadUid::new(&w.uid),
        canonical_name: given_unless(&w.canonical_name, canonical_name(&labels, &w.name)),
        canonical_revision: given_unless(&w.canonical_revision, canonical_revision(&labels)),
        name: w.name,
        namespace: w.namespace,
        service_account,
        trust_domain,
        addresses,
        network: intern.network(&w.network),
        cluster,
        node: (!w.node.is_empty()).then(|| intern.node(&w.node)),
        locality: shared.locality,
        tunnel,
        health,
        capacity: w.capacity.unwrap_or(1),
        waypoint,
        network_gateway,
        services: services.into(),
        authorization_policies,
        labels: labels.into(),
        dns_capture: w.ferry_dns_capture,
    })
}

/// A canonical name or revision as sent (istiod derives them from the pod's labels, which it
/// does not send), kept only when the labels sent do not derive the same (Ferry's control
/// plane sends both): empty means derived (`ferry_core::telemetry::canonical`).
fn given_unless(given: &str, derived: &str) -> String {
    if given == derived {
        String::new()
    } else {
        given.to_string()
    }
}

fn gateway(w: &wire::Workload) -> R<Gateway> {
    let [addr] = w.addresses.as_slice() else {
        return Err(format!(
            "an east-west gateway has exactly one address, found {}",
            w.addresses.len()
        ));
    };
    let td = if w.trust_domain.is_empty() {
        "cluster.local"
    } else {
        &w.trust_domain
    };
    let sa = if w.service_account.is_empty() {
        "default"
    } else {
        &w.service_account
    };
    Ok(Gateway {
        name: nonempty(&w.name, "name")?.to_string(),
        network: NetworkId::new(&w.network),
        cluster: ClusterId::new(nonempty(&w.cluster_id, "cluster_id")?),
        address: ip(addr)?,
        hbone_port: HBONE_PORT,
        identity: Identity::new(td, &w.namespace, sa).map_err(|e| e.to_string())?,
    })
}

fn scope_rule(r: Option<&wl::FerryScopeRule>) -> R<ScopeRule> {
    use wl::ferry_scope_rule::Rule;
    match r.and_then(|r| r.rule.as_ref()) {
        Some(Rule::Global(true)) => Ok(ScopeRule::Global),
        Some(Rule::Local(true)) => Ok(ScopeRule::Local),
        Some(Rule::Clusters(list)) if !list.clusters.is_empty() => Ok(ScopeRule::Clusters(
            list.clusters.iter().map(ClusterId::new).collect(),
        )),
        Some(Rule::Clusters(_)) => Err("scope: an empty cluster list admits no one".into()),
        _ => Err("scope: expected global, local or a cluster list".into()),
    }
}

fn service(s: &wl::Service, intern: &mut Interner) -> R<Service> {
    // No Ferry scope (a service from istiod): Istio's behaviour, reachable from every cluster.
    let scope = match &s.ferry_scope {
        None => ServiceScope::global(),
        Some(fs) => ServiceScope {
            default: scope_rule(fs.default.as_ref())?,
            by_cluster: fs
                .by_cluster
                .iter()
                .map(|(c, r)| Ok((ClusterId::new(c), scope_rule(Some(r))?)))
                .collect::<R<_>>()?,
        },
    };
    let load_balancing = match &s.load_balancing {
        None => None,
        Some(lb) => Some(LoadBalancing {
            mode: match wl::load_balancing::Mode::try_from(lb.mode) {
                Ok(wl::load_balancing::Mode::UnspecifiedMode) => LbMode::Standard,
                Ok(wl::load_balancing::Mode::Strict) => LbMode::Strict,
                Ok(wl::load_balancing::Mode::Failover) => LbMode::Failover,
                Ok(wl::load_balancing::Mode::Passthrough) => {
                    return Err("load_balancing mode PASSTHROUGH is not supported".into());
                }
                Err(_) => return Err(format!("unknown load_balancing mode {}", lb.mode)),
            },
            routing_preference: lb
                .routing_preference
                .iter()
                .map(|p| match wl::load_balancing::Scope::try_from(*p) {
                    Ok(wl::load_balancing::Scope::Region) => Ok(LocalityScope::Region),
                    Ok(wl::load_balancing::Scope::Zone) => Ok(LocalityScope::Zone),
                    Ok(wl::load_balancing::Scope::Subzone) => Ok(LocalityScope::Subzone),
                    Ok(wl::load_balancing::Scope::Node) => Ok(LocalityScope::Node),
                    Ok(wl::load_balancing::Scope::Cluster) => Ok(LocalityScope::Cluster),
                    Ok(wl::load_balancing::Scope::Network) => Ok(LocalityScope::Network),
                    _ => Err(format!("unknown routing preference {p}")),
                })
                .collect::<R<_>>()?,
            health_policy: match wl::load_balancing::HealthPolicy::try_from(lb.health_policy) {
                Ok(wl::load_balancing::HealthPolicy::OnlyHealthy) => HealthPolicy::OnlyHealthy,
                Ok(wl::load_balancing::HealthPolicy::AllowAll) => HealthPolicy::AllowAll,
                Err(_) => return Err(format!("unknown health_policy {}", lb.health_policy)),
            },
            failover_minimum: failover_minimum(lb)?,
        }),
    };
    let waypoint_for = match wl::FerryWaypointFor::try_from(s.ferry_waypoint_for) {
        Ok(wl::FerryWaypointFor::FerryNotAWaypoint) => None,
        Ok(wl::FerryWaypointFor::Service) => Some(WaypointFor::Service),
        Ok(wl::FerryWaypointFor::Workload) => Some(WaypointFor::Workload),
        Ok(wl::FerryWaypointFor::All) => Some(WaypointFor::All),
        Err(_) => {
            return Err(format!(
                "unknown ferry_waypoint_for {}",
                s.ferry_waypoint_for
            ));
        }
    };
    Ok(Service {
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: nonempty(&s.hostname, "hostname")?.to_string(),
        vips: s
            .addresses
            .iter()
            .map(|a| network_address(a, intern))
            .collect::<R<_>>()?,
        ports: s
            .ports
            .iter()
            .map(|p| {
                Ok(ServicePort {
                    port: port(p.service_port, "service_port")?,
                    target_port: port(p.target_port, "target_port")?,
                    app_protocol: app_protocol(p.app_protocol),
                })
            })
            .collect::<R<_>>()?,
        // Ferry's own SANs when it sent them; the upstream list also names endpoints' identities.
        subject_alt_names: s
            .ferry_subject_alt_names
            .as_ref()
            .map_or(&s.subject_alt_names, |f| &f.names)
            .iter()
            .map(|n| {
                n.parse::<Identity>()
                    .map_err(|e| format!("subject_alt_names: {e}"))
            })
            .collect::<R<_>>()?,
        waypoint: s
            .waypoint
            .as_ref()
            .map(|g| gateway_ref(g, "waypoint", intern))
            .transpose()?,
        load_balancing,
        scope,
        address_endpoints: s
            .ferry_address_endpoints
            .iter()
            .map(|a| {
                Ok(AddressEndpoint {
                    address: network_address(
                        a.address
                            .as_ref()
                            .ok_or("address endpoint without an address")?,
                        intern,
                    )?,
                    cluster: ClusterId::new(nonempty(&a.cluster, "address endpoint cluster")?),
                    ports: port_mappings(&a.ports)?,
                })
            })
            .collect::<R<_>>()?,
        waypoint_for,
        http_routes: s
            .ferry_http_routes
            .iter()
            .enumerate()
            .map(|(i, r)| http_route(i, r))
            .collect::<R<_>>()?,
    })
}

fn string_match(m: &sec::StringMatch) -> R<StringMatch> {
    use sec::string_match::MatchType;
    match &m.match_type {
        Some(MatchType::Exact(s)) => Ok(StringMatch::Exact(s.clone())),
        Some(MatchType::Prefix(s)) => Ok(StringMatch::Prefix(s.clone())),
        Some(MatchType::Suffix(s)) => Ok(StringMatch::Suffix(s.clone())),
        Some(MatchType::Presence(())) => Ok(StringMatch::Presence),
        None => Err("a string match without a type".into()),
    }
}

fn cidr(a: &sec::Address) -> R<Cidr> {
    let prefix =
        u8::try_from(a.length).map_err(|_| format!("prefix length {} too long", a.length))?;
    Cidr::new(ip(&a.address)?, prefix).map_err(|e| e.to_string())
}

fn policy(p: &sec::Authorization) -> R<Policy> {
    // Ferry's policy when it sent one; the upstream fields are then a stock peer's projection.
    let (action, rules, dry_run) = match &p.ferry_policy {
        Some(f) => (f.action, &f.rules, f.dry_run),
        None => (p.action, &p.rules, p.dry_run),
    };
    Ok(Policy {
        name: nonempty(&p.name, "name")?.to_string(),
        namespace: p.namespace.clone(),
        scope: match sec::Scope::try_from(p.scope) {
            Ok(sec::Scope::Global) => PolicyScope::Mesh,
            Ok(sec::Scope::Namespace) => PolicyScope::Namespace,
            Ok(sec::Scope::WorkloadSelector) => PolicyScope::WorkloadSelector,
            Err(_) => return Err(format!("unknown scope {}", p.scope)),
        },
        action: match sec::Action::try_from(action) {
            Ok(sec::Action::Allow) => Action::Allow,
            Ok(sec::Action::Deny) => Action::Deny,
            Ok(sec::Action::Audit) => Action::Audit,
            Err(_) => return Err(format!("unknown action {action}")),
        },
        rules: policy_rules(rules)?,
        dry_run,
    })
}

/// Upstream (or `ferry_policy`) rules as the model's; also what `to_wire` reads its own
/// projection back with.
pub(super) fn policy_rules(rules: &[sec::Rule]) -> R<Vec<Rule>> {
    let sm = |v: &[sec::StringMatch]| v.iter().map(string_match).collect::<R<Vec<_>>>();
    let ci = |v: &[sec::Address]| v.iter().map(cidr).collect::<R<Vec<_>>>();
    let ports = |v: &[u32]| {
        v.iter()
            .map(|p| port(*p, "destination port"))
            .collect::<R<Vec<_>>>()
    };
    let sa = |v: &[sec::ServiceAccountMatch]| {
        v.iter()
            .map(|m| ServiceAccountMatch {
                namespace: m.namespace.clone(),
                service_account: m.service_account.clone(),
            })
            .collect::<Vec<_>>()
    };
    rules
        .iter()
        .map(|r| {
            Ok(Rule {
                clauses: r
                    .clauses
                    .iter()
                    .map(|c| {
                        Ok(Clause {
                            matches: c
                                .matches
                                .iter()
                                .map(|m| {
                                    Ok(Match {
                                        namespaces: sm(&m.namespaces)?,
                                        not_namespaces: sm(&m.not_namespaces)?,
                                        principals: sm(&m.principals)?,
                                        not_principals: sm(&m.not_principals)?,
                                        service_accounts: sa(&m.service_accounts),
                                        not_service_accounts: sa(&m.not_service_accounts),
                                        source_ips: ci(&m.source_ips)?,
                                        not_source_ips: ci(&m.not_source_ips)?,
                                        destination_ips: ci(&m.destination_ips)?,
                                        not_destination_ips: ci(&m.not_destination_ips)?,
                                        destination_ports: ports(&m.destination_ports)?,
                                        not_destination_ports: ports(&m.not_destination_ports)?,
                                        methods: sm(&m.ferry_methods)?,
                                        not_methods: sm(&m.ferry_not_methods)?,
                                        paths: sm(&m.ferry_paths)?,
                                        not_paths: sm(&m.ferry_not_paths)?,
                                        hosts: sm(&m.ferry_hosts)?,
                                        not_hosts: sm(&m.ferry_not_hosts)?,
                                        headers: m
                                            .ferry_headers
                                            .iter()
                                            .map(|h| {
                                                if h.name.is_empty() {
                                                    return Err(
                                                        "a header match has no name".to_string()
                                                    );
                                                }
                                                Ok(ferry_core::model::HeaderMatch {
                                                    name: h.name.to_ascii_lowercase(),
                                                    values: sm(&h.values)?,
                                                })
                                            })
                                            .collect::<R<Vec<_>>>()?,
                                    })
                                })
                                .collect::<R<_>>()?,
                        })
                    })
                    .collect::<R<_>>()?,
            })
        })
        .collect()
}

/// Route `i` of a Service; an error names its place (`ferry_http_routes[0].matches[1].method`).
fn http_route(i: usize, r: &wl::FerryHttpRoute) -> R<HttpRoute> {
    let matches = r
        .matches
        .iter()
        .enumerate()
        .map(|(j, m)| {
            route_match(m).map_err(|e| format!("ferry_http_routes[{i}].matches[{j}].{e}"))
        })
        .collect::<R<_>>()?;
    route_with_matches(r, matches).map_err(|e| format!("ferry_http_routes[{i}]: {e}"))
}

/// One match; an error starts with the field it is about (`method: ...`).
fn route_match(m: &wl::FerryRouteMatch) -> R<RouteMatch> {
    use wl::ferry_header_route_match::Value;
    use wl::ferry_route_match::Path;
    let path = |p: &str| {
        if p.starts_with('/') {
            Ok(p.to_string())
        } else {
            Err(format!("path: {p:?} does not start with /"))
        }
    };
    Ok(RouteMatch {
        path: match &m.path {
            None => None,
            Some(Path::PathExact(p)) => Some(PathMatch::Exact(path(p)?)),
            Some(Path::PathPrefix(p)) => Some(PathMatch::Prefix(path(p)?)),
        },
        headers: m
            .headers
            .iter()
            .enumerate()
            .map(|(k, h)| {
                let value = match &h.value {
                    Some(Value::Exact(x)) => StringMatch::Exact(x.clone()),
                    Some(Value::Prefix(x)) => StringMatch::Prefix(x.clone()),
                    Some(Value::Suffix(x)) => StringMatch::Suffix(x.clone()),
                    Some(Value::Present(true)) => StringMatch::Presence,
                    Some(Value::Present(false)) | None => {
                        return Err(format!(
                            "headers[{k}]: header {:?} has no value match",
                            h.name
                        ));
                    }
                };
                let name =
                    nonempty(&h.name, "header name").map_err(|e| format!("headers[{k}]: {e}"))?;
                Ok((name.to_ascii_lowercase(), value))
            })
            .collect::<R<_>>()?,
        method: match m.method.as_str() {
            "" => None,
            x if HTTP_METHODS.contains(&x) => Some(x.to_string()),
            x => {
                return Err(format!(
                    "method: expected one of {}, found {x:?}",
                    HTTP_METHODS.join(", ")
                ));
            }
        },
        query: m
            .query_params
            .iter()
            .enumerate()
            .map(|(k, q)| {
                let name = nonempty(&q.name, "query parameter name")
                    .map_err(|e| format!("query_params[{k}]: {e}"))?;
                Ok((name.to_string(), q.exact.clone()))
            })
            .collect::<R<_>>()?,
    })
}

/// The route of `matches` and `r`'s other fields; an error does not say which route.
fn route_with_matches(r: &wl::FerryHttpRoute, matches: Vec<RouteMatch>) -> R<HttpRoute> {
    let backends: Vec<RouteBackend> = r
        .backends
        .iter()
        .map(|b| {
            let (ns, host) = b.service.split_once('/').ok_or_else(|| {
                format!("backend service {:?} is not namespace/hostname", b.service)
            })?;
            Ok(RouteBackend {
                service: ServiceKey::new(
                    nonempty(ns, "backend namespace")?,
                    nonempty(host, "backend hostname")?,
                ),
                port: match port(b.port, "backend port")? {
                    0 => None,
                    p => Some(p),
                },
                subset: b.subset.clone().into_iter().collect(),
                weight: b.weight,
            })
        })
        .collect::<R<_>>()?;
    let redirect = r
        .redirect
        .as_ref()
        .map(|x| redirect(x, &matches).map_err(|e| format!("redirect.{e}")))
        .transpose()?;
    if redirect.is_some() && !backends.is_empty() {
        return Err(format!(
            "route {:?} has both a redirect and backends (they exclude each other)",
            r.name
        ));
    }
    if redirect.is_none() && backends.iter().all(|b| b.weight == 0) {
        return Err(format!(
            "route {:?} has no backend with a weight above 0",
            r.name
        ));
    }
    Ok(HttpRoute {
        name: r.name.clone(),
        matches,
        backends,
        timeout_ms: r.timeout_ms,
        retries: r.retries.min(10),
        request_headers: header_modifier(r.request_headers.as_ref(), "request_headers")?.into(),
        response_headers: header_modifier(r.response_headers.as_ref(), "response_headers")?.into(),
        redirect: redirect.map(Arc::new),
    })
}

/// A redirect, checked as every decoder checks it; an error starts with its field.
fn redirect(r: &wl::FerryRequestRedirect, matches: &[RouteMatch]) -> R<RequestRedirect> {
    use wl::ferry_request_redirect::Path;
    let scheme = match r.scheme.as_deref() {
        None => None,
        Some(s) => Some(
            RedirectScheme::parse(s)
                .ok_or_else(|| format!("scheme: expected http or https, found {s:?}"))?,
        ),
    };
    let status = match u16::try_from(r.status_code) {
        Ok(s) if REDIRECT_STATUSES.contains(&s) => s,
        _ => {
            return Err(format!(
                "status_code: expected 301 or 302, found {}",
                r.status_code
            ));
        }
    };
    let checked = RequestRedirect {
        scheme,
        hostname: r.hostname.clone(),
        port: r
            .port
            .map(|p| u16::try_from(p).map_err(|_| format!("port: expected 1 to 65535, found {p}")))
            .transpose()?,
        path: r.path.as_ref().map(|p| match p {
            Path::ReplaceFullPath(p) => RedirectPath::Full(p.clone()),
            Path::ReplacePrefixMatch(p) => RedirectPath::PrefixMatch(p.clone()),
        }),
        status,
    }
    .check()
    .map_err(|e| e.to_string())?;
    checked.check_matches(matches).map_err(|e| e.to_string())?;
    Ok(checked)
}

/// Header edits, checked as every decoder checks them: a resource that holds one no route may
/// make is rejected whole.
fn header_modifier(m: Option<&wl::FerryHeaderModifier>, field: &str) -> R<HeaderModifier> {
    let Some(m) = m else {
        return Ok(HeaderModifier::default());
    };
    let pairs = |list: &[wl::FerryHeader]| {
        list.iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect()
    };
    HeaderModifier {
        set: pairs(&m.set),
        add: pairs(&m.add),
        remove: m.remove.clone(),
    }
    .check()
    .map_err(|e| format!("{field}.{e}"))
}

/// Ferry's graduated failover, checked: a minimum in bounds, and only in FAILOVER mode.
fn failover_minimum(lb: &wl::LoadBalancing) -> R<Option<FailoverMinimum>> {
    use wl::ferry_failover_minimum::Minimum;
    let Some(m) = lb.ferry_failover_minimum.as_ref() else {
        return Ok(None);
    };
    let min = match m.minimum {
        None => return Err("ferry_failover_minimum names no minimum".into()),
        Some(Minimum::Endpoints(n)) => FailoverMinimum::Endpoints(n),
        Some(Minimum::Percent(p)) => {
            FailoverMinimum::Percent(u8::try_from(p).map_err(|_| {
                format!("expected a failover minimum of 1 to 100 percent, found {p}%")
            })?)
        }
    };
    if lb.mode != wl::load_balancing::Mode::Failover as i32 {
        return Err("ferry_failover_minimum is set outside FAILOVER mode".into());
    }
    min.check().map(Some)
}
