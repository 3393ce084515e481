//! Istio `AuthorizationPolicy` to Ferry policies, with Istio's semantics.
//!
//! - No selector in the root namespace: mesh-wide; no selector elsewhere: the namespace; a
//!   selector: the workloads of its namespace whose labels include it.
//! - `ALLOW`, `DENY` and `AUDIT` as in Istio. `from[].source` (principals, namespaces, IP
//!   blocks and their negations) and `to[].operation` (ports, methods, paths, hosts and their
//!   negations) map one to one; `when` conditions on `request.headers[<name>]` with `values`
//!   become header matches of every `to` of the rule.
//! - **Anything else fails closed** and is a note: `CUSTOM`, `targetRef(s)`, `provider`,
//!   request principals, remote IP blocks, other `when` keys, `notValues`, empty entries, a
//!   port that is not a number, and any field Istio may add later. An `ALLOW` policy then
//!   matches nothing (so the workloads it selects accept only what other policies allow) and
//!   a `DENY` policy denies everything it selects. A policy that did not decode at all fails
//!   closed the same way.
//! - One policy name in several clusters is one policy: identical copies are taken once; where
//!   copies differ, the first cluster's copy is used and the others are notes.

use std::collections::BTreeMap;

use ferry_topology::schema::{
    ActionSpec, FromSpec, Labels, PolicySpec, PortValue, RuleSpec, ToSpec,
};

use super::{Tx, ns_name};
use crate::crd::{AuthorizationPolicy, Condition, Other, Rule};

/// Why a policy cannot be enforced exactly.
struct Unsupported(String);

impl Tx<'_> {
    pub(super) fn policies(&mut self) {
        let mut seen: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
        for c in self.clusters.clone() {
            for p in &c.policies {
                let (ns, name) = ns_name(&p.metadata);
                let object = format!("AuthorizationPolicy {ns}/{name}");
                let spec = self.policy(&c.cluster, &object, p);
                let text = format!("{spec:?}");
                if let Some((first, first_text)) = seen.get(&(ns.clone(), name.clone())) {
                    if *first_text != text {
                        let msg = format!(
                            "differs from cluster {first}'s copy: cluster {first}'s copy is used"
                        );
                        self.note(&c.cluster, object, msg);
                    }
                    continue;
                }
                seen.insert((ns, name), (c.cluster.clone(), text));
                self.file.policies.push(spec);
            }
        }
    }

    /// The Ferry form of `p`, or its fail-closed form with a note saying why.
    fn policy(&mut self, cluster: &str, object: &str, p: &AuthorizationPolicy) -> PolicySpec {
        let (ns, name) = ns_name(&p.metadata);
        let selector: Option<Labels> = p
            .spec
            .selector
            .as_ref()
            .map(|s| s.match_labels.clone())
            .filter(|l| !l.is_empty());
        let mesh = selector.is_none() && ns == self.mesh.root_namespace;
        let action = match p.spec.action.as_deref().unwrap_or("ALLOW") {
            "ALLOW" => Some(ActionSpec::Allow),
            "DENY" => Some(ActionSpec::Deny),
            "AUDIT" => Some(ActionSpec::Audit),
            _ => None,
        };
        let base = PolicySpec {
            name,
            namespace: Some(ns),
            mesh,
            selector: if mesh { None } else { selector },
            ..PolicySpec::default()
        };
        let rules = match (&p.invalid, action) {
            (Some(why), _) => Err(Unsupported(format!("the object does not decode ({why})"))),
            (None, None) => Err(Unsupported(format!(
                "action {:?}",
                p.spec.action.as_deref().unwrap_or_default()
            ))),
            (None, Some(_)) => self.rules(p),
        };
        let why = match (action, rules) {
            (Some(action), Ok(rules)) => {
                return PolicySpec {
                    action,
                    rules,
                    ..base
                };
            }
            (_, Err(Unsupported(why))) => why,
            (None, Ok(_)) => String::from("an unknown action"),
        };
        let closed = match action {
            // An ALLOW policy that matches nothing: its workloads accept only what other
            // policies allow.
            Some(ActionSpec::Allow) => PolicySpec {
                action: ActionSpec::Allow,
                rules: Vec::new(),
                ..base
            },
            // An AUDIT policy decides nothing: leaving its rules out loses only the audit.
            Some(ActionSpec::Audit) => PolicySpec {
                action: ActionSpec::Audit,
                rules: Vec::new(),
                ..base
            },
            // DENY, CUSTOM and unknown actions: deny everything it selects.
            Some(ActionSpec::Deny) | None => PolicySpec {
                action: ActionSpec::Deny,
                rules: vec![RuleSpec::default()],
                ..base
            },
        };
        let how = match closed.action {
            ActionSpec::Allow => "it matches nothing (fails closed)",
            ActionSpec::Audit => "it audits nothing",
            ActionSpec::Deny => "it denies everything it selects (fails closed)",
        };
        self.note(
            cluster,
            object.to_string(),
            format!("{why} is not supported: {how}"),
        );
        closed
    }

    fn rules(&self, p: &AuthorizationPolicy) -> Result<Vec<RuleSpec>, Unsupported> {
        unknown("spec", &p.spec.other)?;
        if let Some(s) = &p.spec.selector {
            unknown("spec.selector", &s.other)?;
        }
        p.spec
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(&format!("spec.rules[{i}]"), r))
            .collect()
    }
}

fn rule(path: &str, r: &Rule) -> Result<RuleSpec, Unsupported> {
    unknown(path, &r.other)?;
    let mut from = Vec::new();
    for (i, f) in r.from.iter().enumerate() {
        let at = format!("{path}.from[{i}]");
        unknown(&at, &f.other)?;
        let s = &f.source;
        unknown(&format!("{at}.source"), &s.other)?;
        let spec = FromSpec {
            principals: s.principals.clone(),
            not_principals: s.not_principals.clone(),
            namespaces: s.namespaces.clone(),
            not_namespaces: s.not_namespaces.clone(),
            ip_blocks: s.ip_blocks.clone(),
            not_ip_blocks: s.not_ip_blocks.clone(),
        };
        if [
            &spec.principals,
            &spec.not_principals,
            &spec.namespaces,
            &spec.not_namespaces,
            &spec.ip_blocks,
            &spec.not_ip_blocks,
        ]
        .iter()
        .all(|v| v.is_empty())
        {
            return Err(Unsupported(format!("an empty {at}.source")));
        }
        from.push(spec);
    }
    let mut to = Vec::new();
    for (i, t) in r.to.iter().enumerate() {
        let at = format!("{path}.to[{i}]");
        unknown(&at, &t.other)?;
        let o = &t.operation;
        unknown(&format!("{at}.operation"), &o.other)?;
        let spec = ToSpec {
            ports: ports(&at, &o.ports)?,
            not_ports: ports(&at, &o.not_ports)?,
            methods: o.methods.clone(),
            not_methods: o.not_methods.clone(),
            paths: o.paths.clone(),
            not_paths: o.not_paths.clone(),
            hosts: o.hosts.clone(),
            not_hosts: o.not_hosts.clone(),
            headers: BTreeMap::new(),
        };
        if spec.ports.is_empty()
            && spec.not_ports.is_empty()
            && [
                &spec.methods,
                &spec.not_methods,
                &spec.paths,
                &spec.not_paths,
                &spec.hosts,
                &spec.not_hosts,
            ]
            .iter()
            .all(|v| v.is_empty())
        {
            return Err(Unsupported(format!("an empty {at}.operation")));
        }
        to.push(spec);
    }
    let headers = conditions(path, &r.when)?;
    if !headers.is_empty() {
        if to.is_empty() {
            to.push(ToSpec::default());
        }
        for t in &mut to {
            t.headers.clone_from(&headers);
        }
    }
    Ok(RuleSpec { from, to })
}

/// `when` conditions as header matches: only `request.headers[<name>]` with `values`.
fn conditions(
    path: &str,
    when: &[Condition],
) -> Result<BTreeMap<String, Vec<String>>, Unsupported> {
    let mut headers = BTreeMap::new();
    for (i, c) in when.iter().enumerate() {
        let at = format!("{path}.when[{i}]");
        unknown(&at, &c.other)?;
        let name = c
            .key
            .strip_prefix("request.headers[")
            .and_then(|k| k.strip_suffix(']'))
            .filter(|k| !k.is_empty())
            .ok_or_else(|| Unsupported(format!("{at}: condition key {:?}", c.key)))?;
        if !c.not_values.is_empty() || c.values.is_empty() {
            return Err(Unsupported(format!(
                "{at}: a condition without `values`, or with `notValues`"
            )));
        }
        headers.insert(name.to_ascii_lowercase(), c.values.clone());
    }
    Ok(headers)
}

fn ports(path: &str, ports: &[String]) -> Result<Vec<PortValue>, Unsupported> {
    ports
        .iter()
        .map(|p| {
            p.trim()
                .parse()
                .map(PortValue)
                .map_err(|_| Unsupported(format!("{path}: port {p:?}")))
        })
        .collect()
}

/// Any field in `other` is one Ferry does not know.
fn unknown(path: &str, other: &Other) -> Result<(), Unsupported> {
    match other.keys().next() {
        Some(k) => Err(Unsupported(format!("{path}.{k}"))),
        None => Ok(()),
    }
}
