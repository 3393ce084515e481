//! A stock Istio node proxy's view of Ferry's resources: decoded with Istio's upstream messages
//! only (`ferry_api::stock`), checked as ztunnel checks them (what it would NACK), and its L4
//! authorization as ztunnel's `rbac.rs` / `assert_rbac` evaluate it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferry_api::stock::security as sec;
use ferry_api::stock::workload as wl;
use ferry_core::identity::Identity;
use ferry_core::model::Cidr;
use ferry_xds::resources::ResourceSet;
use prost::Message;

/// What a stock peer holds after applying everything Ferry served.
#[derive(Debug, Default)]
pub(crate) struct StockPeer {
    pub(crate) workloads: BTreeMap<String, wl::Workload>,
    pub(crate) services: BTreeMap<String, wl::Service>,
    pub(crate) policies: BTreeMap<String, sec::Authorization>,
}

/// How the peer treats `dry_run` (older ztunnels ignore it and enforce the policy).
#[derive(Clone, Copy, Debug)]
pub(crate) enum DryRun {
    Honoured,
    Ignored,
}

/// One connection arriving at a destination workload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conn<'a> {
    pub(crate) src: IpAddr,
    pub(crate) identity: Option<&'a Identity>,
    pub(crate) dst: IpAddr,
    pub(crate) port: u16,
}

fn ip_ok(b: &[u8]) -> Result<(), String> {
    match b.len() {
        4 | 16 => Ok(()),
        n => Err(format!("address of {n} bytes")),
    }
}

fn port_ok(p: u32) -> Result<(), String> {
    u16::try_from(p)
        .map(|_| ())
        .map_err(|_| format!("port {p} out of range"))
}

fn network_address(a: &wl::NetworkAddress) -> Result<(), String> {
    ip_ok(&a.address)
}

fn gateway(g: &wl::GatewayAddress) -> Result<(), String> {
    match &g.destination {
        Some(wl::gateway_address::Destination::Address(a)) => network_address(a)?,
        Some(wl::gateway_address::Destination::Hostname(h)) if !h.hostname.is_empty() => {}
        _ => return Err("gateway address without a destination".into()),
    }
    port_ok(g.hbone_mtls_port)
}

fn enum_ok<E: TryFrom<i32>>(v: i32, what: &str) -> Result<(), String> {
    E::try_from(v)
        .map(|_| ())
        .map_err(|_| format!("unknown enumeration value {v} ({what})"))
}

fn port(p: &wl::Port) -> Result<(), String> {
    port_ok(p.service_port)?;
    port_ok(p.target_port)?;
    enum_ok::<wl::AppProtocol>(p.app_protocol, "app_protocol")
}

fn check_workload(w: &wl::Workload) -> Result<(), String> {
    if w.uid.is_empty() || w.name.is_empty() {
        return Err("workload without uid or name".into());
    }
    w.addresses.iter().try_for_each(|a| ip_ok(a))?;
    enum_ok::<wl::TunnelProtocol>(w.tunnel_protocol, "tunnel_protocol")?;
    if w.tunnel_protocol == wl::TunnelProtocol::LegacyIstioMtls as i32 {
        return Err("LEGACY_ISTIO_MTLS".into());
    }
    enum_ok::<wl::WorkloadStatus>(w.status, "status")?;
    enum_ok::<wl::WorkloadType>(w.workload_type, "workload_type")?;
    enum_ok::<wl::NetworkMode>(w.network_mode, "network_mode")?;
    if let Some(t) = &w.application_tunnel {
        enum_ok::<wl::application_tunnel::Protocol>(t.protocol, "application_tunnel")?;
    }
    w.waypoint.iter().try_for_each(gateway)?;
    w.network_gateway.iter().try_for_each(gateway)?;
    for (k, ports) in &w.services {
        if !k.contains('/') {
            return Err(format!("service key {k:?} is not namespace/hostname"));
        }
        ports.ports.iter().try_for_each(port)?;
    }
    Ok(())
}

fn check_service(s: &wl::Service) -> Result<(), String> {
    if s.hostname.is_empty() {
        return Err("service without hostname".into());
    }
    s.addresses.iter().try_for_each(network_address)?;
    s.ports.iter().try_for_each(port)?;
    for san in &s.subject_alt_names {
        san.parse::<Identity>()
            .map_err(|e| format!("subject_alt_names: {e}"))?;
    }
    s.waypoint.iter().try_for_each(gateway)?;
    if let Some(lb) = &s.load_balancing {
        enum_ok::<wl::load_balancing::Mode>(lb.mode, "load_balancing.mode")?;
        enum_ok::<wl::load_balancing::HealthPolicy>(lb.health_policy, "health_policy")?;
        for p in &lb.routing_preference {
            enum_ok::<wl::load_balancing::Scope>(*p, "routing_preference")?;
        }
    }
    enum_ok::<wl::IpFamilies>(s.ip_families, "ip_families")?;
    enum_ok::<wl::Visibility>(s.visibility, "visibility")
}

fn check_policy(p: &sec::Authorization) -> Result<(), String> {
    if p.name.is_empty() {
        return Err("policy without a name".into());
    }
    enum_ok::<sec::Scope>(p.scope, "scope")?;
    enum_ok::<sec::Action>(p.action, "action")?;
    for m in p
        .rules
        .iter()
        .flat_map(|r| &r.clauses)
        .flat_map(|c| &c.matches)
    {
        for a in m
            .source_ips
            .iter()
            .chain(&m.not_source_ips)
            .chain(&m.destination_ips)
            .chain(&m.not_destination_ips)
        {
            cidr(a).ok_or_else(|| format!("bad CIDR {a:?}"))?;
        }
        for p in m.destination_ports.iter().chain(&m.not_destination_ports) {
            port_ok(*p)?;
        }
        for s in m
            .namespaces
            .iter()
            .chain(&m.not_namespaces)
            .chain(&m.principals)
            .chain(&m.not_principals)
        {
            if s.match_type.is_none() {
                return Err("a string match without a type".into());
            }
        }
    }
    Ok(())
}

fn cidr(a: &sec::Address) -> Option<Cidr> {
    let ip = match a.address.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(a.address.as_slice()).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(a.address.as_slice()).ok()?),
        _ => return None,
    };
    Cidr::new(ip, u8::try_from(a.length).ok()?).ok()
}

impl StockPeer {
    /// Applies everything in `set`; the error lists what the peer would NACK (`name: reason`).
    pub(crate) fn read(set: &ResourceSet) -> Result<Self, Vec<String>> {
        let mut peer = Self::default();
        let mut nacks = Vec::new();
        let empty = Default::default();
        for (name, v) in set.of_type(ferry_api::ADDRESS_TYPE).unwrap_or(&empty) {
            let r = wl::Address::decode(v.body.as_slice())
                .map_err(|e| e.to_string())
                .and_then(|a| match a.r#type {
                    Some(wl::address::Type::Workload(w)) => {
                        check_workload(&w)?;
                        peer.workloads.insert(name.clone(), w);
                        Ok(())
                    }
                    Some(wl::address::Type::Service(s)) => {
                        check_service(&s)?;
                        peer.services.insert(name.clone(), s);
                        Ok(())
                    }
                    None => Err("empty address".into()),
                });
            if let Err(e) = r {
                nacks.push(format!("{name}: {e}"));
            }
        }
        for (name, v) in set.of_type(ferry_api::AUTHORIZATION_TYPE).unwrap_or(&empty) {
            let r = sec::Authorization::decode(v.body.as_slice())
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    check_policy(&p)?;
                    peer.policies.insert(name.clone(), p);
                    Ok(())
                });
            if let Err(e) = r {
                nacks.push(format!("{name}: {e}"));
            }
        }
        if nacks.is_empty() {
            Ok(peer)
        } else {
            Err(nacks)
        }
    }

    /// ztunnel's verdict on `conn` to the workload `uid`: any matching DENY denies; no ALLOW
    /// applying allows; else one ALLOW must match.
    pub(crate) fn allows(&self, uid: &str, conn: &Conn<'_>, dry_run: DryRun) -> bool {
        let Some(w) = self.workloads.get(uid) else {
            return false;
        };
        let applicable = self.policies.iter().filter(|(key, p)| {
            let scope = sec::Scope::try_from(p.scope);
            scope == Ok(sec::Scope::Global)
                || (scope == Ok(sec::Scope::Namespace) && p.namespace == w.namespace)
                || w.authorization_policies.contains(key)
        });
        let (allow, deny): (Vec<_>, Vec<_>) = applicable
            .map(|(_, p)| p)
            .filter(|p| matches!(dry_run, DryRun::Ignored) || !p.dry_run)
            .partition(|p| p.action == sec::Action::Allow as i32);
        if deny.iter().any(|p| matches(p, conn)) {
            return false;
        }
        allow.is_empty() || allow.iter().any(|p| matches(p, conn))
    }
}

fn string_matches(m: &sec::StringMatch, v: &str) -> bool {
    use sec::string_match::MatchType;
    match &m.match_type {
        Some(MatchType::Exact(s)) => v == s,
        Some(MatchType::Prefix(s)) => v.starts_with(s.as_str()),
        Some(MatchType::Suffix(s)) => v.ends_with(s.as_str()),
        Some(MatchType::Presence(())) => !v.is_empty(),
        None => false,
    }
}

/// Positive list empty or one hit, and no hit in the negative list (ztunnel's
/// `matches_internal`).
fn field<T>(pos: &[T], neg: &[T], hit: impl Fn(&T) -> bool) -> bool {
    (pos.is_empty() || pos.iter().any(&hit)) && !neg.iter().any(&hit)
}

fn is_empty(m: &sec::Match) -> bool {
    m.namespaces.is_empty()
        && m.not_namespaces.is_empty()
        && m.service_accounts.is_empty()
        && m.not_service_accounts.is_empty()
        && m.principals.is_empty()
        && m.not_principals.is_empty()
        && m.source_ips.is_empty()
        && m.not_source_ips.is_empty()
        && m.destination_ips.is_empty()
        && m.not_destination_ips.is_empty()
        && m.destination_ports.is_empty()
        && m.not_destination_ports.is_empty()
}

/// ztunnel's `Authorization::matches`: no rules match nothing; rules OR; clauses AND (an empty
/// clause holds); matches OR, empty ones skipped (a clause of only empty matches fails).
fn matches(p: &sec::Authorization, conn: &Conn<'_>) -> bool {
    // The SPIFFE URI; principals compare without `spiffe://`, and no identity is "".
    let id = conn.identity.map(ToString::to_string).unwrap_or_default();
    let principal = id.strip_prefix("spiffe://");
    let ns = conn.identity.map(Identity::namespace).unwrap_or_default();
    let match_holds = |m: &sec::Match| {
        let cidrs = |l: &[sec::Address]| l.iter().filter_map(cidr).collect::<Vec<_>>();
        field(
            &cidrs(&m.destination_ips),
            &cidrs(&m.not_destination_ips),
            |c| c.contains(conn.dst),
        ) && field(&cidrs(&m.source_ips), &cidrs(&m.not_source_ips), |c| {
            c.contains(conn.src)
        }) && field(&m.destination_ports, &m.not_destination_ports, |p| {
            *p as u16 == conn.port
        }) && field(&m.service_accounts, &m.not_service_accounts, |s| {
            conn.identity.is_some_and(|i| {
                i.namespace() == s.namespace && i.service_account() == s.service_account
            })
        }) && field(&m.principals, &m.not_principals, |s| {
            principal.is_some_and(|pr| string_matches(s, pr))
        }) && field(&m.namespaces, &m.not_namespaces, |s| string_matches(s, ns))
    };
    p.rules.iter().any(|r| {
        r.clauses.iter().all(|c| {
            c.matches.is_empty() || c.matches.iter().filter(|m| !is_empty(m)).any(&match_holds)
        })
    })
}
