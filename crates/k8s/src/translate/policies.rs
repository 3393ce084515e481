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
//! - A policy governs the workloads of the cluster it was read from (as each cluster's istiod
//!   does); identical copies in several clusters are one policy over those clusters, and a
//!   copy that differs is a policy of its own, `<name>@<cluster>`, with a note. In the root
//!   namespace, no selector means the whole mesh and a selector means its matches in every
//!   namespace. `istio.io/dry-run: "true"` is honoured (evaluated, never enforced).

use std::collections::BTreeMap;

use ferry_topology::schema::{
    ActionSpec, FromSpec, Labels, PolicySpec, PortValue, RuleSpec, ToSpec,
};

use super::{Tx, ns_name};
use crate::crd::{AuthorizationPolicy, Condition, Other, Rule};

/// Istio's annotation for a policy that is evaluated and reported, never enforced.
const DRY_RUN: &str = "istio.io/dry-run";

/// Why a policy cannot be enforced exactly.
struct Unsupported(String);

impl Tx<'_> {
    pub(super) fn policies(&mut self) {
        // Each cluster's policies govern its own workloads (as each cluster's istiod does):
        // identical copies are one policy limited to their clusters; a copy that differs is a
        // policy of its own, named `<name>@<cluster>` (no Kubernetes name holds an `@`).
        type Group = (String, PolicySpec, Vec<String>);
        let mut groups: BTreeMap<(String, String), Vec<Group>> = BTreeMap::new();
        for c in self.clusters.clone() {
            for p in &c.policies {
                let (ns, name) = ns_name(&p.metadata);
                let object = format!("AuthorizationPolicy {ns}/{name}");
                let spec = self.policy(&c.cluster, &object, p);
                let text = format!("{spec:?}");
                let group = groups.entry((ns, name)).or_default();
                match group.iter_mut().find(|(t, _, _)| *t == text) {
                    Some((_, _, clusters)) => clusters.push(c.cluster.clone()),
                    None => group.push((text, spec, vec![c.cluster.clone()])),
                }
            }
        }
        for ((ns, name), group) in groups {
            let first = group[0].2[0].clone();
            for (i, (_, mut spec, clusters)) in group.into_iter().enumerate() {
                if i > 0 {
                    spec.name = format!("{name}@{}", clusters[0]);
                    let msg = format!(
                        "differs from cluster {first}'s copy: each copy governs its own cluster's workloads (this one as {})",
                        spec.name
                    );
                    self.note(
                        &clusters[0],
                        format!("AuthorizationPolicy {ns}/{name}"),
                        msg,
                    );
                }
                spec.clusters = Some(clusters);
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
        let root = ns == self.mesh.root_namespace;
        let mesh = selector.is_none() && root;
        // Istio's `istio.io/dry-run` annotation: evaluated and reported, never enforced.
        let dry_run = match p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DRY_RUN))
            .map(String::as_str)
        {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(Unsupported(format!("{DRY_RUN}: {other:?}"))),
        };
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
            any_namespace: root && selector.is_some(),
            selector: if mesh { None } else { selector },
            dry_run: *dry_run.as_ref().unwrap_or(&false),
            ..PolicySpec::default()
        };
        let rules = match (&p.invalid, action) {
            (Some(why), _) => Err(Unsupported(format!("the object does not decode ({why})"))),
            (None, _) if dry_run.is_err() => dry_run.map(|_| Vec::new()),
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
        if headers
            .insert(name.to_ascii_lowercase(), c.values.clone())
            .is_some()
        {
            // Istio ANDs the conditions; two on one header are not one match.
            return Err(Unsupported(format!(
                "{at}: a second condition on header {name:?}"
            )));
        }
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
