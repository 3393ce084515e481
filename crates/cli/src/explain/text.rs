//! Text rendering of an explanation: the path as an engineer would trace it by hand.

use std::fmt::Write as _;

use ferry_core::authz::{Effect, Reason};
use ferry_core::lb::LbDrop;
use ferry_core::model::ScopeRule;
use ferry_core::route::{CandidateRole, Class, DropReason, Step, Transport};

use super::report::{Authorization, Report};

/// Renders one report.
pub(crate) fn text(r: &Report, topology: &str) -> String {
    let mut out = String::new();
    let w = &r.source.workload;
    let src_ip = w
        .addresses
        .first()
        .map_or("no address".to_string(), ToString::to_string);
    if let Some(title) = &r.title {
        let _ = writeln!(out, "== {title}");
    }
    let _ = writeln!(
        out,
        "connection  {}/{}/{} ({src_ip}) -> {}\ntopology    {topology}, seed {}",
        w.cluster, w.namespace, w.name, r.destination, r.seed
    );
    let mut n = 0;
    let mut line = |out: &mut String, what: &str, text: String| {
        n += 1;
        let _ = writeln!(out, "{n:>3}  {what:<10} {text}");
    };
    let node = w
        .node
        .as_ref()
        .map_or("(none)".to_string(), ToString::to_string);
    line(
        &mut out,
        "capture",
        format!(
            "the node proxy on node {node} (cluster {}, network {}) captures it inside the pod's network namespace, as {}",
            w.cluster, w.network, r.source.identity
        ),
    );
    for (i, hop) in r.hops.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(out, "     --- at {}: it decides again", hop.by);
        }
        if !hop.http_routes.is_empty() {
            line(
                &mut out,
                "routes",
                "HTTP requests take the first route that matches, each request on its own; the pick below is for bytes that are not HTTP:".to_string(),
            );
            for r in &hop.http_routes {
                let _ = writeln!(out, "                 {r}");
            }
        }
        for step in &hop.decision.steps {
            match step {
                Step::Classified { destination, class } => {
                    line(&mut out, "classify", classify(destination, class))
                }
                Step::WaypointRequired {
                    waypoint,
                    attached_to,
                } => line(
                    &mut out,
                    "waypoint",
                    format!(
                        "{attached_to} is served by waypoint {waypoint}: the next hop is one of its endpoints"
                    ),
                ),
                Step::WaypointSkipped { waypoint, why } => line(
                    &mut out,
                    "waypoint",
                    format!("waypoint {waypoint} skipped: {why}"),
                ),
                Step::Dropped {
                    role,
                    candidate,
                    cluster,
                    reason,
                } => {
                    let (what, why) = drop_reason(reason);
                    let _ = writeln!(
                        out,
                        "     {what:<10} drop {} {candidate} (cluster {cluster}): {why}",
                        role_name(*role)
                    );
                }
                Step::Picked {
                    role,
                    candidate,
                    cluster,
                    network,
                    rank,
                    among,
                } => {
                    let pref = if *among > 0 {
                        format!(", sharing {rank} of {among} locality preferences with the source")
                    } else {
                        String::new()
                    };
                    line(
                        &mut out,
                        "pick",
                        format!(
                            "{} {candidate} (cluster {cluster}, network {network}){pref}",
                            role_name(*role)
                        ),
                    )
                }
                Step::WaypointReach {
                    service,
                    near,
                    instances,
                } => line(
                    &mut out,
                    "reach",
                    format!(
                        "live capacity of {service} near each waypoint instance (same {}): {}",
                        near.as_str(),
                        instances
                            .iter()
                            .map(|(i, r)| format!("{i} {r}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                Step::Tiers {
                    role,
                    minimum,
                    tiers,
                } => line(
                    &mut out,
                    "failover",
                    format!(
                        "graduated: a tier takes all {} connections once it has {minimum} usable; {}",
                        role_name(*role),
                        tiers
                            .iter()
                            .map(|t| format!(
                                "tier sharing {} preference(s): {} usable, {:.1}% of new connections",
                                t.rank,
                                t.usable,
                                f64::from(t.share_ppm) / 10_000.0
                            ))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ),
                Step::Nested {
                    outer,
                    address,
                    inner,
                    port,
                } => line(
                    &mut out,
                    "nested",
                    format!(
                        "endpoint {address} of {outer} is service {inner}'s address: resolved in this same decision (port {port}), no second capture"
                    ),
                ),
                Step::Transport { transport } => {
                    line(&mut out, "transport", transport_text(transport))
                }
            }
        }
        match &hop.authorization {
            Authorization::Checked {
                at,
                peer,
                port,
                verdict,
            } => {
                let reason = match &verdict.reason {
                    Reason::DeniedBy(rr) => {
                        format!("denied by policy {} rule {}", rr.policy, rr.rule)
                    }
                    Reason::AllowedBy(rr) => {
                        format!("allowed by policy {} rule {}", rr.policy, rr.rule)
                    }
                    Reason::NoAllowMatched { allow_policies } => {
                        format!("denied: {allow_policies} ALLOW policies apply and none matches")
                    }
                    Reason::NoAllowPolicies => {
                        "allowed: no ALLOW policy applies and no DENY matches".to_string()
                    }
                };
                let mut text = format!("at {at} port {port}, peer {peer}: {reason}");
                for a in &verdict.audited {
                    let _ = write!(text, "; audited by {} rule {}", a.policy, a.rule);
                }
                for (action, d) in &verdict.dry_run {
                    let _ = write!(
                        text,
                        "; dry-run {action:?} policy {} would match (rule {})",
                        d.policy, d.rule
                    );
                }
                line(&mut out, "policy", text);
            }
            Authorization::NotEnforced { why } => {
                line(&mut out, "policy", format!("not enforced: {why}"))
            }
        }
    }
    let last = r.hops.last().expect("a report has at least one hop");
    let first = &r.hops[0];
    let verdict = match (
        &first.decision.outcome,
        &last.decision.outcome,
        &last.authorization,
    ) {
        (Err(e), _, _) => format!("REFUSED at the source node proxy: {e}"),
        (_, Err(e), _) => format!("REFUSED at the waypoint: {e}"),
        (_, Ok(_), Authorization::Checked { verdict, .. }) if verdict.effect == Effect::Deny => {
            "REFUSED by the destination's policy (the HBONE CONNECT is answered 401)".to_string()
        }
        (Ok(p0), Ok(p), _) => {
            let via = p0
                .waypoint
                .as_ref()
                .filter(|_| r.hops.len() > 1)
                .map(|w| format!(" via waypoint {w}"))
                .unwrap_or_default();
            format!(
                "CONNECTED to {}{via}",
                p.landing
                    .as_ref()
                    .map_or(p.transport.dial().to_string(), ToString::to_string)
            )
        }
    };
    let _ = writeln!(out, "result      {verdict}");
    out
}

fn role_name(role: CandidateRole) -> &'static str {
    match role {
        CandidateRole::Endpoint => "endpoint",
        CandidateRole::WaypointEndpoint => "waypoint endpoint",
    }
}

fn classify(destination: &str, class: &Class) -> String {
    match class {
        Class::Service { service, port } => {
            format!("{destination} is service {service}, port {port}")
        }
        Class::Workload { workload, port } => {
            format!("{destination} is workload {workload}, port {port}")
        }
        Class::OutsideMesh => {
            format!("{destination} is outside the mesh: passed through untouched")
        }
        Class::Gateway { name } => {
            format!("{destination} is east-west gateway {name}: passed through untouched")
        }
    }
}

fn drop_reason(reason: &DropReason) -> (&'static str, String) {
    match reason {
        DropReason::OutOfScope {
            service,
            rule,
            source_cluster,
        } => {
            let rule = match rule {
                ScopeRule::Global => "global".to_string(),
                ScopeRule::Local => "local (only its own cluster)".to_string(),
                ScopeRule::Clusters(set) => {
                    format!(
                        "clusters [{}]",
                        set.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            };
            (
                "scope",
                format!("scope of {service} is {rule}; the source is in cluster {source_cluster}"),
            )
        }
        DropReason::WaypointOnOtherNetwork { network } => (
            "network",
            format!(
                "workload-attached waypoints are used only on the source's network; this one is on {network}"
            ),
        ),
        DropReason::Unreachable { network, why } => {
            ("network", format!("on network {network}: {why}"))
        }
        DropReason::PortNotMapped { port } => ("port", format!("does not serve port {port}")),
        DropReason::FailedBefore => ("retry", "an earlier attempt failed to connect".to_string()),
        DropReason::Ejected => (
            "health",
            "ejected (its connects kept failing; outlier detection)".to_string(),
        ),
        DropReason::NoLiveBackendsNear { service, near } => (
            "reach",
            format!(
                "in front of dead backends: the endpoints of {service} in its {} are all down, while another instance has live ones",
                near.as_str()
            ),
        ),
        DropReason::NotInSubset { subset } => ("subset", format!("not in subset {subset}")),
        DropReason::Balancer(LbDrop::Unhealthy) => ("health", "unhealthy".to_string()),
        DropReason::Balancer(LbDrop::Terminating) => (
            "health",
            "terminating (no new connections; open ones are kept)".to_string(),
        ),
        DropReason::Balancer(LbDrop::NoCapacity) => ("capacity", "capacity 0".to_string()),
        DropReason::Balancer(LbDrop::OtherTier { rank, of }) => (
            "failover",
            format!(
                "in the tier sharing {rank} of {of} locality preferences; this connection was drawn to another tier"
            ),
        ),
        DropReason::Balancer(LbDrop::LessPreferred { rank, of }) => (
            "locality",
            format!(
                "shares {rank} of {of} locality preferences; closer endpoints exist (or strict mode)"
            ),
        ),
    }
}

fn transport_text(t: &Transport) -> String {
    let ids = |ids: &[ferry_core::identity::Identity]| {
        ids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match t {
        Transport::Hbone {
            connect_to,
            authority,
            identities,
        } => format!(
            "HBONE: mutual TLS to {connect_to}, CONNECT {authority}; the peer must present {}",
            ids(identities)
        ),
        Transport::GatewayHbone {
            gateway,
            gateway_identity,
            authority,
            identities,
        } => format!(
            "double HBONE: outer tunnel to east-west gateway {gateway} (peer {gateway_identity}), inner CONNECT {authority}; the inner peer must present one of {}",
            ids(identities)
        ),
        Transport::Tcp { connect_to } => {
            format!("plain TCP to {connect_to} (the destination is not in the mesh)")
        }
        Transport::Passthrough { connect_to } => format!("plain TCP to {connect_to}, untouched"),
    }
}
