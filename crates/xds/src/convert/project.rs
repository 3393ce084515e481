//! What a stock Istio peer reads: the upstream fields of Ferry's resources, given Istio's L4
//! meaning so that a decoder that skips Ferry's extensions never allows more than Ferry means.
//!
//! A policy's `action`, `rules` and `dry_run` are a projection of Ferry's policy (which travels
//! whole in `ferry_policy`). Per match, with Ferry's L4 semantics ([`ferry_core::authz::authorize`]):
//! - in an ALLOW, a match that names HTTP facts never holds: it becomes [`never`];
//! - in a DENY, such a match holds on its other fields unless the peer is an instance of the
//!   destination's waypoint: those fields plus `not_principals` listing the waypoint identities
//!   (per group of destinations with the same waypoints, told apart by `destination_ips`);
//! - AUDIT and dry-run policies are never enforced: an empty dry-run DENY, inert at any peer.
//!
//! Two differences of ztunnel's matcher are evened out: it skips empty matches and then finds a
//! clause false (Ferry: true), and it matches namespaces of identity-less peers against "".

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferry_api::security as sec;
use ferry_core::authz::waypoint_identities;
use ferry_core::identity::Identity;
use ferry_core::model::{Action, Clause, Match, Policy, StringMatch};
use ferry_core::snapshot::Snapshot;

use super::fields::{cidr, ip_bytes, l4_match, string_match};

/// The upstream action, rules and dry_run of `p`.
pub(super) fn upstream(snap: &Snapshot, p: &Policy) -> (sec::Action, Vec<sec::Rule>, bool) {
    if p.action == Action::Audit || p.dry_run {
        // Matches nothing, and is dry-run besides: inert whether or not the peer honours dry_run.
        return (sec::Action::Deny, Vec::new(), true);
    }
    let exempt = if reads_workloads(p) {
        Exemption::of(snap, p)
    } else {
        Exemption::None
    };
    let rules = p
        .rules
        .iter()
        .map(|r| sec::Rule {
            clauses: r
                .clauses
                .iter()
                .map(|c| clause(c, p.action, &exempt))
                .collect(),
        })
        .collect();
    let action = match p.action {
        Action::Deny => sec::Action::Deny,
        Action::Allow | Action::Audit => sec::Action::Allow,
    };
    (action, rules, false)
}

/// Whether `p`'s upstream form reads the snapshot beyond `p`: a DENY naming HTTP facts spares
/// waypoints by the workloads it applies to ([`Exemption`]). An audit or dry-run policy never.
pub(super) fn reads_workloads(p: &Policy) -> bool {
    p.action == Action::Deny && !p.dry_run && names_http(p)
}

fn names_http(p: &Policy) -> bool {
    p.rules
        .iter()
        .flat_map(|r| &r.clauses)
        .flat_map(|c| &c.matches)
        .any(Match::is_l7)
}

/// Which peers a DENY that names HTTP facts spares at each destination it applies to.
enum Exemption {
    /// No destination has a waypoint.
    None,
    /// Every destination has these waypoint identities.
    Uniform(Vec<Identity>),
    /// Destinations differ: the addresses of each group, with its waypoint identities.
    Split(Vec<(Vec<Identity>, Vec<IpAddr>)>),
}

impl Exemption {
    fn of(snap: &Snapshot, p: &Policy) -> Self {
        let key = p.key();
        let mut groups: BTreeMap<Vec<Identity>, Vec<IpAddr>> = BTreeMap::new();
        for w in snap.workloads() {
            if snap.policies_for(w).any(|q| q.key() == key) {
                groups
                    .entry(waypoint_identities(snap, w))
                    .or_default()
                    .extend(w.addresses.iter().copied());
            }
        }
        // Sorted: the encoding (and so the resource's version) must not depend on hash order.
        let mut groups: Vec<_> = groups
            .into_iter()
            .map(|(ids, mut ips)| {
                ips.sort_unstable();
                ips.dedup();
                (ids, ips)
            })
            .collect();
        match groups.as_slice() {
            [] => Self::None,
            [(ids, _)] if ids.is_empty() => Self::None,
            [_] => Self::Uniform(groups.remove(0).0),
            _ => Self::Split(groups),
        }
    }
}

fn clause(c: &Clause, action: Action, exempt: &Exemption) -> sec::Clause {
    let live: Vec<&Match> = c.matches.iter().filter(|m| !m.is_empty()).collect();
    if live.is_empty() {
        // Holds at both (a clause without matches).
        return sec::Clause::default();
    }
    let mut matches: Vec<sec::Match> = live
        .into_iter()
        .flat_map(|m| project(m, action, exempt))
        .collect();
    if matches.is_empty() {
        matches.push(never());
    }
    sec::Clause { matches }
}

/// The upstream matches (OR) that hold exactly when Ferry's `m` holds at L4.
fn project(m: &Match, action: Action, exempt: &Exemption) -> Vec<sec::Match> {
    let mut base = l4_match(m);
    base.namespaces = m.namespaces.iter().map(namespace).collect();
    base.not_namespaces = m.not_namespaces.iter().map(namespace).collect();
    if !m.is_l7() {
        return vec![non_empty(base)];
    }
    if action == Action::Allow {
        return vec![never()];
    }
    let spare = |mut x: sec::Match, ids: &[Identity]| {
        x.not_principals.extend(
            ids.iter()
                .map(|id| string_match(&StringMatch::Exact(id.principal()))),
        );
        x
    };
    match exempt {
        Exemption::None => vec![non_empty(base)],
        Exemption::Uniform(ids) => vec![non_empty(spare(base, ids))],
        Exemption::Split(groups) => groups
            .iter()
            .filter_map(|(ids, ips)| {
                let ips: Vec<IpAddr> = ips
                    .iter()
                    .copied()
                    .filter(|ip| {
                        m.destination_ips.is_empty()
                            || m.destination_ips.iter().any(|c| c.contains(*ip))
                    })
                    .collect();
                if ips.is_empty() {
                    return None;
                }
                let mut x = spare(base.clone(), ids);
                x.destination_ips = ips.into_iter().map(host).collect();
                Some(x)
            })
            .collect(),
    }
}

/// A namespace matcher that means the same to ztunnel, which gives a peer without an identity
/// the namespace "": one that matches "" is widened to presence (it matches every namespace)
/// or, if it matches only "", narrowed to one no namespace has (`/` is not allowed in one).
fn namespace(m: &StringMatch) -> sec::StringMatch {
    let m = match m {
        StringMatch::Exact(s) if s.is_empty() => StringMatch::Exact("/".into()),
        StringMatch::Prefix(s) | StringMatch::Suffix(s) if s.is_empty() => StringMatch::Presence,
        m => m.clone(),
    };
    string_match(&m)
}

fn host(ip: IpAddr) -> sec::Address {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    sec::Address {
        address: ip_bytes(ip),
        length: prefix,
    }
}

fn every_address() -> Vec<sec::Address> {
    ["0.0.0.0/0", "::/0"]
        .iter()
        .filter_map(|c| c.parse().ok())
        .map(|c| cidr(&c))
        .collect()
}

/// A match no connection satisfies (every source address is excluded).
pub(super) fn never() -> sec::Match {
    sec::Match {
        not_source_ips: every_address(),
        ..Default::default()
    }
}

/// A match every connection satisfies, where an empty one would be skipped.
fn always() -> sec::Match {
    sec::Match {
        source_ips: every_address(),
        ..Default::default()
    }
}

fn non_empty(m: sec::Match) -> sec::Match {
    if m == sec::Match::default() {
        always()
    } else {
        m
    }
}
