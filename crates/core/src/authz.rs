//! L4 authorization at the destination, with Istio's semantics.
//!
//! Order of evaluation: any matching `DENY` policy denies; otherwise, if any `ALLOW` policy applies
//! to the workload, one of them must match or the connection is denied (default deny); otherwise
//! the connection is allowed. `AUDIT` policies and dry-run policies are evaluated and reported,
//! and never change the verdict. The verdict names the policy and rule that decided.

use std::net::IpAddr;

use serde::Serialize;

use crate::identity::Identity;
use crate::model::{Action, Clause, Match, Policy, PolicyKey, Rule, Workload};
use crate::snapshot::Snapshot;

/// What authorization knows about one connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnInfo<'a> {
    /// The mutual-TLS peer; `None` for plain TCP from outside the mesh.
    pub source_identity: Option<&'a Identity>,
    pub source_ip: IpAddr,
    pub destination_ip: IpAddr,
    /// The target port on the workload (after service-to-target translation).
    pub destination_port: u16,
    /// The peer is an instance of the destination's own waypoint, which has already judged
    /// each HTTP request (see [`is_waypoint_of`]). Otherwise, at L4, a DENY match that names
    /// HTTP facts is applied on its other fields alone: stricter, never looser.
    pub via_waypoint: bool,
}

/// Whether `peer` is an instance of the waypoint that serves `dst` (its own, or its services').
pub fn is_waypoint_of(snap: &Snapshot, dst: &Workload, peer: Option<&Identity>) -> bool {
    peer.is_some_and(|peer| waypoint_identities(snap, dst).contains(peer))
}

/// The identities of the instances of every waypoint that serves `dst` (its own, or its
/// services'), sorted and without repeats: the peers [`is_waypoint_of`] recognizes.
pub fn waypoint_identities(snap: &Snapshot, dst: &Workload) -> Vec<Identity> {
    use crate::model::GatewayDestination;
    use crate::snapshot::{AddressOwner, Endpoint};
    let refs = dst.waypoint.iter().chain(
        dst.services
            .keys()
            .filter_map(|k| snap.service(k))
            .filter_map(|s| s.waypoint.as_ref()),
    );
    let mut ids: Vec<Identity> = refs
        .filter_map(|wp| match &wp.destination {
            GatewayDestination::Service(k) => Some(k.clone()),
            GatewayDestination::Address(a) => match snap.owner(a) {
                Some(AddressOwner::Service(k)) => Some((**k).clone()),
                _ => None,
            },
        })
        .flat_map(|key| {
            snap.endpoints(&key)
                .iter()
                .filter_map(|e| match e {
                    Endpoint::Workload(u) => snap.workload(u).and_then(|w| w.identity().ok()),
                    Endpoint::Address(_) => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The HTTP facts of one request, for waypoints.
#[derive(Clone, Copy, Debug)]
pub struct HttpRequest<'a> {
    pub method: &'a str,
    /// The path alone, without the query.
    pub path: &'a str,
    /// The query string as sent (after `?`, empty when none): HTTP routes match on it;
    /// authorization does not read it (Istio's `paths` name the path alone).
    pub query: &'a str,
    pub host: &'a str,
    /// Header names in lower case, with their values (a name may repeat).
    pub headers: &'a [(&'a str, &'a str)],
}

/// Allow or deny.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Allow,
    Deny,
}

/// Which rule of which policy matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleRef {
    pub policy: PolicyKey,
    /// Index of the matching rule in the policy.
    pub rule: usize,
}

/// Why the verdict is what it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reason {
    DeniedBy(RuleRef),
    AllowedBy(RuleRef),
    /// ALLOW policies apply to the workload and none matched.
    NoAllowMatched {
        allow_policies: usize,
    },
    /// No ALLOW policy applies to the workload, and no DENY matched.
    NoAllowPolicies,
}

/// The outcome of authorization.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub effect: Effect,
    pub reason: Reason,
    /// AUDIT policies that matched.
    pub audited: Vec<RuleRef>,
    /// Dry-run policies that matched, with what they would have done.
    pub dry_run: Vec<(Action, RuleRef)>,
}

/// A verdict in words, for access logs and refusals.
impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.reason {
            Reason::DeniedBy(r) => write!(f, "denied by policy {} rule {}", r.policy, r.rule),
            Reason::AllowedBy(r) => write!(f, "allowed by policy {} rule {}", r.policy, r.rule),
            Reason::NoAllowMatched { allow_policies } => {
                write!(
                    f,
                    "denied: {allow_policies} ALLOW policies apply, none matches"
                )
            }
            Reason::NoAllowPolicies => f.write_str("allowed: no policy applies"),
        }
    }
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        self.effect == Effect::Allow
    }
}

/// Decides whether `conn` may reach `dst` at L4: a match that names HTTP facts never holds in
/// an ALLOW, and holds on its other fields alone in a DENY unless `conn` came through the
/// destination's waypoint (fail closed both ways).
pub fn authorize(snap: &Snapshot, dst: &Workload, conn: &ConnInfo<'_>) -> Verdict {
    evaluate(snap, dst, conn, None)
}

/// Decides whether one HTTP request on `conn` may reach `dst` (at a waypoint).
pub fn authorize_request(
    snap: &Snapshot,
    dst: &Workload,
    conn: &ConnInfo<'_>,
    request: &HttpRequest<'_>,
) -> Verdict {
    evaluate(snap, dst, conn, Some(request))
}

fn evaluate(
    snap: &Snapshot,
    dst: &Workload,
    conn: &ConnInfo<'_>,
    request: Option<&HttpRequest<'_>>,
) -> Verdict {
    let mut applicable: Vec<&Policy> = snap.policies_for(dst).map(|p| &**p).collect();
    applicable.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    applicable.dedup_by(|a, b| a.namespace == b.namespace && a.name == b.name);

    let principal = conn.source_identity.map(Identity::principal);
    let facts = Facts {
        conn,
        principal: principal.as_deref(),
        request,
        l7_holds_at_l4: false,
    };
    let mut audited = Vec::new();
    let mut dry_run = Vec::new();
    let mut deny = None;
    let mut allow = None;
    let mut allow_policies = 0;
    for p in applicable {
        // At L4, a DENY that names HTTP facts holds on its other fields alone (fail closed),
        // unless the destination's waypoint already judged each request.
        let facts = Facts {
            l7_holds_at_l4: p.action == Action::Deny && !conn.via_waypoint,
            ..facts
        };
        let hit = matching_rule(p, &facts).map(|rule| RuleRef {
            policy: p.key(),
            rule,
        });
        if p.dry_run {
            if let Some(r) = hit {
                dry_run.push((p.action, r));
            }
            continue;
        }
        match p.action {
            Action::Audit => audited.extend(hit),
            Action::Deny => {
                if deny.is_none() {
                    deny = hit;
                }
            }
            Action::Allow => {
                allow_policies += 1;
                if allow.is_none() {
                    allow = hit;
                }
            }
        }
    }
    let (effect, reason) = match (deny, allow) {
        (Some(r), _) => (Effect::Deny, Reason::DeniedBy(r)),
        (None, Some(r)) => (Effect::Allow, Reason::AllowedBy(r)),
        (None, None) if allow_policies > 0 => {
            (Effect::Deny, Reason::NoAllowMatched { allow_policies })
        }
        (None, None) => (Effect::Allow, Reason::NoAllowPolicies),
    };
    Verdict {
        effect,
        reason,
        audited,
        dry_run,
    }
}

/// The connection's facts, with the principal computed once per check.
#[derive(Clone, Copy)]
struct Facts<'a> {
    conn: &'a ConnInfo<'a>,
    principal: Option<&'a str>,
    request: Option<&'a HttpRequest<'a>>,
    /// Without a request, whether a match's HTTP fields count as holding.
    l7_holds_at_l4: bool,
}

/// The index of the first rule of `p` that matches, if any. Rules OR.
fn matching_rule(p: &Policy, facts: &Facts<'_>) -> Option<usize> {
    p.rules.iter().position(|r| rule_matches(r, facts))
}

/// Clauses AND; a rule with no clauses matches everything.
fn rule_matches(r: &Rule, facts: &Facts<'_>) -> bool {
    r.clauses.iter().all(|c| clause_matches(c, facts))
}

/// Matches OR; empty matches are skipped; a clause with no non-empty match holds.
fn clause_matches(c: &Clause, facts: &Facts<'_>) -> bool {
    let mut live = c.matches.iter().filter(|m| !m.is_empty()).peekable();
    live.peek().is_none() || live.any(|m| match_holds(m, facts))
}

/// Every populated field holds (values of one field OR); `not_*` lists must not match.
fn match_holds(m: &Match, facts: &Facts<'_>) -> bool {
    if let (true, Some(req)) = (m.is_l7(), facts.request) {
        let any = |list: &[crate::model::StringMatch], v: &str| list.iter().any(|s| s.matches(v));
        let method_ok = (m.methods.is_empty() || any(&m.methods, req.method))
            && !any(&m.not_methods, req.method);
        let path_ok =
            (m.paths.is_empty() || any(&m.paths, req.path)) && !any(&m.not_paths, req.path);
        // Host names compare without regard to case.
        let any_ci = |list: &[crate::model::StringMatch], v: &str| {
            list.iter().any(|s| s.matches_ignore_case(v))
        };
        let host_ok =
            (m.hosts.is_empty() || any_ci(&m.hosts, req.host)) && !any_ci(&m.not_hosts, req.host);
        let headers_ok = m.headers.iter().all(|h| {
            req.headers
                .iter()
                .any(|(n, v)| *n == h.name && any(&h.values, v))
        });
        if !(method_ok && path_ok && host_ok && headers_ok) {
            return false;
        }
    } else if m.is_l7() && !facts.l7_holds_at_l4 {
        return false;
    }
    let conn = facts.conn;
    let principal = facts.principal;
    let namespace = conn.source_identity.map(Identity::namespace);
    let sa = conn
        .source_identity
        .map(|i| (i.namespace(), i.service_account()));

    let str_any = |list: &[crate::model::StringMatch], v: Option<&str>| {
        v.is_some_and(|v| list.iter().any(|s| s.matches(v)))
    };
    let sa_any = |list: &[crate::model::ServiceAccountMatch]| {
        sa.is_some_and(|(ns, sa)| {
            list.iter()
                .any(|m| m.namespace == ns && m.service_account == sa)
        })
    };
    let positive = |empty: bool, hit: bool| empty || hit;
    let negative = |empty: bool, hit: bool| empty || !hit;

    positive(m.namespaces.is_empty(), str_any(&m.namespaces, namespace))
        && negative(
            m.not_namespaces.is_empty(),
            str_any(&m.not_namespaces, namespace),
        )
        && positive(m.principals.is_empty(), str_any(&m.principals, principal))
        && negative(
            m.not_principals.is_empty(),
            str_any(&m.not_principals, principal),
        )
        && positive(m.service_accounts.is_empty(), sa_any(&m.service_accounts))
        && negative(
            m.not_service_accounts.is_empty(),
            sa_any(&m.not_service_accounts),
        )
        && positive(
            m.source_ips.is_empty(),
            m.source_ips.iter().any(|c| c.contains(conn.source_ip)),
        )
        && negative(
            m.not_source_ips.is_empty(),
            m.not_source_ips.iter().any(|c| c.contains(conn.source_ip)),
        )
        && positive(
            m.destination_ips.is_empty(),
            m.destination_ips
                .iter()
                .any(|c| c.contains(conn.destination_ip)),
        )
        && negative(
            m.not_destination_ips.is_empty(),
            m.not_destination_ips
                .iter()
                .any(|c| c.contains(conn.destination_ip)),
        )
        && positive(
            m.destination_ports.is_empty(),
            m.destination_ports.contains(&conn.destination_port),
        )
        && negative(
            m.not_destination_ports.is_empty(),
            m.not_destination_ports.contains(&conn.destination_port),
        )
}

#[cfg(test)]
#[path = "authz_tests.rs"]
mod tests;
