//! Istio's `PeerAuthentication` in ambient mode, converted as istiod converts it: node proxies
//! never receive a PeerAuthentication, only authorization policies and the keys of those that
//! govern each workload.
//!
//! - **`istio_converted_static_strict`**, in the root namespace: `DENY` every connection
//!   without a peer identity (`not_principals: [presence]`), scope `WORKLOAD_SELECTOR`. Sent
//!   whenever at least one PeerAuthentication exists, and listed on every workload whose
//!   effective mode is STRICT. istiod: `PolicyCollections`' `DefaultPolicy` in
//!   `pilot/pkg/serviceregistry/kube/controller/ambient/policies.go`.
//! - **`converted_peer_authentication_<name>`**, in the PeerAuthentication's namespace, for a
//!   workload-level one (a selector, not in the root namespace) with port-level modes that
//!   differ from what it inherits: a `DENY` whose rules carry the port exceptions, merged with
//!   the inherited strictness where there is one (ztunnel denies on *any* matching DENY, so an
//!   exception cannot sit beside the static policy: it must replace it). istiod:
//!   `convertPeerAuthentication` in `.../ambient/authorization.go`.
//! - **The keys a workload lists** (`convertedSelectorPeerAuthentications`, same file): the
//!   oldest PeerAuthentication of each level (mesh: the root namespace without selector;
//!   namespace: the workload's namespace without selector; workload: a selector its labels
//!   include) decides, the workload's over the namespace's over the mesh's; `UNSET` inherits;
//!   `PERMISSIVE` and `DISABLE` do not restrict.
//!
//! Istio's corner cases are reproduced as they are, since a stock ztunnel subscribed to Ferry
//! must enforce what it would enforce under istiod (each one is a case in the tests):
//! - a workload-level `UNSET` under an effective STRICT mode lists its converted policy only
//!   for a `PERMISSIVE` port, not for a `DISABLE` one (which then stays strict);
//! - a STRICT port of a workload-level PERMISSIVE or DISABLE PeerAuthentication is left out of
//!   its converted policy when the mesh is STRICT and its namespace has no mode of its own
//!   (Go's `a && b || c` in the skip condition), so nothing enforces it;
//! - istiod may list a converted key for which it sends no policy; ztunnel skips unknown keys,
//!   Ferry's snapshot refuses them, so such a key is not listed (the same enforcement).

use std::collections::{BTreeMap, HashMap};

use crate::model::{
    Action, Clause, Match, MtlsMode, PeerAuthentication, Policy, PolicyKey, PolicyScope, Rule,
    StringMatch,
};

/// The policy every workload under an effective STRICT mode lists (in the root namespace;
/// `_` cannot appear in a Kubernetes name, so it cannot collide with one).
pub const STATIC_STRICT: &str = "istio_converted_static_strict";
/// The prefix of a workload-level PeerAuthentication's converted policy.
pub const CONVERTED_PREFIX: &str = "converted_peer_authentication_";
/// Istio's default root namespace (`meshConfig.rootNamespace`).
pub const DEFAULT_ROOT_NAMESPACE: &str = "istio-system";

/// The PeerAuthentications of a mesh, converted: the policies to send and, per workload, the
/// keys to list.
#[derive(Debug)]
pub struct Conversion<'a> {
    root: &'a str,
    /// The mesh-level PeerAuthentication (the oldest in the root namespace without selector).
    mesh: Option<&'a PeerAuthentication>,
    /// Outside the root namespace, by namespace.
    namespaces: HashMap<&'a str, Level<'a>>,
    policies: Vec<Policy>,
}

/// One namespace's PeerAuthentications.
#[derive(Debug, Default)]
struct Level<'a> {
    /// The oldest one without selector.
    namespace_wide: Option<&'a PeerAuthentication>,
    /// Those with a selector, oldest first.
    selecting: Vec<&'a PeerAuthentication>,
}

// === impl Conversion ===

impl<'a> Conversion<'a> {
    /// Converts `all` (oldest first) for a mesh whose root namespace is `root`.
    pub fn new(root: &'a str, all: &'a [PeerAuthentication]) -> Self {
        let mut mesh = None;
        let mut namespaces: HashMap<&str, Level<'_>> = HashMap::new();
        for pa in all {
            match (pa.namespace == root, pa.selector.is_empty()) {
                (true, true) => {
                    mesh.get_or_insert(pa);
                }
                // A selector in the root namespace: istiod applies none in ambient mode.
                (true, false) => {}
                (false, true) => {
                    let level = namespaces.entry(pa.namespace.as_str()).or_default();
                    level.namespace_wide.get_or_insert(pa);
                }
                (false, false) => namespaces
                    .entry(pa.namespace.as_str())
                    .or_default()
                    .selecting
                    .push(pa),
            }
        }
        let mut policies = Vec::new();
        if !all.is_empty() {
            policies.push(static_strict(root));
        }
        let inherited = |l: Option<&PeerAuthentication>| l.map(|p| p.mode);
        for level in namespaces.values() {
            for pa in &level.selecting {
                if let Some(p) = convert(pa, inherited(level.namespace_wide), inherited(mesh)) {
                    policies.push(p);
                }
            }
        }
        // Independent of hash order: the resources (and their versions) must not depend on it.
        policies.sort_by_key(|p| p.key().to_string());
        Self {
            root,
            mesh,
            namespaces,
            policies,
        }
    }

    /// The policies to send: the static STRICT one (when any PeerAuthentication exists) and
    /// each converted one.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The keys a workload of `namespace` with `labels` lists, sorted as istiod sorts them
    /// (by `namespace/name`), after its own authorization policies.
    pub fn workload_policies(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<PolicyKey> {
        let level = (namespace != self.root)
            .then(|| self.namespaces.get(namespace))
            .flatten();
        let namespace_wide = level.and_then(|l| l.namespace_wide);
        let workload = level.and_then(|l| {
            l.selecting
                .iter()
                .copied()
                .find(|pa| pa.selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
        });
        let (strict, converted) = effective(self.mesh, namespace_wide, workload);
        let mut keys = Vec::new();
        if strict {
            keys.push(static_strict_key(self.root));
        }
        // Listed only if istiod sends it (see the module's notes).
        keys.extend(converted.filter(|key| self.policies.iter().any(|p| p.key() == *key)));
        keys.sort_by_key(ToString::to_string);
        keys
    }
}

/// The key of the static STRICT policy.
pub fn static_strict_key(root: &str) -> PolicyKey {
    PolicyKey::new(root, STATIC_STRICT)
}

/// The key of `pa`'s converted policy (istiod's `GetAmbientPolicyConfigName`).
pub fn converted_key(pa: &PeerAuthentication) -> PolicyKey {
    PolicyKey::new(&pa.namespace, format!("{CONVERTED_PREFIX}{}", pa.name))
}

/// Denies connections without a peer identity.
fn no_identity() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

fn clause(m: Match) -> Clause {
    Clause { matches: vec![m] }
}

/// The static STRICT policy.
fn static_strict(root: &str) -> Policy {
    Policy {
        name: STATIC_STRICT.into(),
        namespace: root.into(),
        scope: PolicyScope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![Rule {
            clauses: vec![clause(no_identity())],
        }],
        dry_run: false,
    }
}

/// istiod's `convertPeerAuthentication`: the converted policy of workload-level `pa` under a
/// namespace-level mode `ns` and a mesh-level mode `root` (`None`: no such PeerAuthentication),
/// or `None` when istiod sends none. Istio's `Group` is a [`Rule`] here and its `Rules` a
/// [`Clause`].
fn convert(
    pa: &PeerAuthentication,
    ns: Option<MtlsMode>,
    root: Option<MtlsMode>,
) -> Option<Policy> {
    if pa.selector.is_empty() || pa.port_level.is_empty() {
        return None;
    }
    let strict = |m: Option<MtlsMode>| m == Some(MtlsMode::Strict);
    let unset = |m: Option<MtlsMode>| m.is_none() || m == Some(MtlsMode::Unset);
    let mode = pa.mode;
    // Clauses of the last rule (AND), and rules of their own (OR), one per STRICT port.
    let mut clauses = Vec::new();
    let mut rules = Vec::new();
    if mode.is_strict() {
        clauses.push(clause(no_identity()));
    }
    let mut found_open_port = false;
    // Ports in ascending order, as istiod's `maps.SeqStable`.
    for (&port, &port_mode) in &pa.port_level {
        match port_mode {
            MtlsMode::Strict => {
                // Enforced by the parent already. Go's `a || (b && c || d)`: the last term
                // does not ask for the workload's own mode to be UNSET.
                if mode.is_strict()
                    || (mode == MtlsMode::Unset && strict(ns))
                    || (unset(ns) && strict(root))
                {
                    continue;
                }
                rules.push(Rule {
                    clauses: vec![clause(Match {
                        not_principals: vec![StringMatch::Presence],
                        destination_ports: vec![port],
                        ..Match::default()
                    })],
                });
            }
            MtlsMode::Permissive | MtlsMode::Disable => {
                if mode.is_open() {
                    continue;
                }
                if mode == MtlsMode::Unset
                    && ((ns.is_some() && !strict(ns))
                        || (ns.is_none() && root.is_some() && !strict(root))
                        || (ns.is_none() && root.is_none()))
                {
                    continue;
                }
                found_open_port = true;
                // Denied only off this port: the exception.
                clauses.push(clause(Match {
                    not_destination_ports: vec![port],
                    ..Match::default()
                }));
            }
            MtlsMode::Unset => {}
        }
    }
    if mode.is_strict() && !found_open_port {
        // Every port strict: the static STRICT policy says it all.
        return None;
    }
    if clauses.is_empty() && rules.is_empty() {
        return None;
    }
    let merge_strict = (strict(root) && (unset(ns) || strict(ns))) || strict(ns);
    if merge_strict && found_open_port {
        clauses.push(clause(no_identity()));
    }
    if !clauses.is_empty() {
        rules.push(Rule { clauses });
    }
    let key = converted_key(pa);
    Some(Policy {
        name: key.name,
        namespace: key.namespace,
        scope: PolicyScope::WorkloadSelector,
        action: Action::Deny,
        rules,
        dry_run: false,
    })
}

/// istiod's `convertedSelectorPeerAuthentications`: whether the workload's effective mode is
/// STRICT everywhere (it lists the static policy), and the converted policy it lists instead
/// or besides, from the oldest PeerAuthentication of each level that applies to it.
fn effective(
    mesh: Option<&PeerAuthentication>,
    namespace: Option<&PeerAuthentication>,
    workload: Option<&PeerAuthentication>,
) -> (bool, Option<PolicyKey>) {
    let mut strict = mesh.is_some_and(|m| m.mode.is_strict());
    if let Some(n) = namespace.filter(|n| n.mode != MtlsMode::Unset) {
        strict = n.mode.is_strict();
    }
    let Some(w) = workload else {
        return (strict, None);
    };
    if w.mode.is_strict() {
        strict = true;
    }
    if w.mode.is_open() {
        strict = false;
    }
    let ports = || w.port_level.values().copied();
    let mut converted = None;
    if !w.port_level.is_empty() {
        match w.mode {
            MtlsMode::Strict => {
                if ports().any(MtlsMode::is_open) {
                    converted = Some(converted_key(w));
                    // Its converted form holds the STRICT default.
                    strict = false;
                }
            }
            MtlsMode::Permissive | MtlsMode::Disable => {
                if ports().any(MtlsMode::is_strict) {
                    converted = Some(converted_key(w));
                }
            }
            MtlsMode::Unset if strict => {
                // PERMISSIVE only (not DISABLE), as istiod checks it.
                if ports().any(|m| m == MtlsMode::Permissive) {
                    converted = Some(converted_key(w));
                    strict = false;
                }
            }
            MtlsMode::Unset => {
                strict = false;
                if ports().any(MtlsMode::is_strict) {
                    converted = Some(converted_key(w));
                }
            }
        }
    }
    (strict, converted)
}

#[cfg(test)]
#[path = "peer_auth_tests.rs"]
mod tests;
