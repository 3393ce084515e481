//! Authorization policies, from Istio's Kubernetes shape to the model's rules, clauses and
//! matches.

use std::collections::BTreeSet;

use ferry_core::keyed_hash::HashMap;
use ferry_core::model::{
    Action, Cidr, Clause, ClusterId, Match, Policy, PolicyKey, PolicyScope, Rule, StringMatch,
};

use super::{Cx, item, namespace, selects};
use crate::schema::{ActionSpec, FromSpec, PolicySpec, PortValue, RuleSpec, ToSpec};

impl Cx {
    pub(super) fn policies(&mut self, specs: &[PolicySpec]) {
        // Workloads by namespace and by label, so a policy looks only at the workloads its
        // selector (or namespace) can name, not at every workload of the mesh.
        let mut by_namespace: HashMap<String, Vec<usize>> = HashMap::default();
        let mut by_label: HashMap<(String, String, String), Vec<usize>> = HashMap::default();
        let mut by_any_label: HashMap<(String, String), Vec<usize>> = HashMap::default();
        for (i, w) in self.out.workloads.iter().enumerate() {
            by_namespace.entry(w.namespace.clone()).or_default().push(i);
            for (k, v) in w.labels.iter() {
                by_label
                    .entry((w.namespace.clone(), k.clone(), v.clone()))
                    .or_default()
                    .push(i);
                by_any_label
                    .entry((k.clone(), v.clone()))
                    .or_default()
                    .push(i);
            }
        }
        let all: Vec<usize> = (0..self.out.workloads.len()).collect();
        for (i, p) in specs.iter().enumerate() {
            let path = item("policies", i, &p.name);
            self.check_name(&path, "name", &p.name);
            let ns = namespace(p.namespace.as_ref());
            self.check_identity(&path, &ns, None);
            let key = PolicyKey::new(&ns, &p.name);
            let unique = self.declare(
                format!("policy {key}"),
                &path,
                "policy namespace/name",
                &key.to_string(),
            );
            let selector = p.selector.as_ref();
            let clusters: Option<BTreeSet<ClusterId>> = p.clusters.as_ref().map(|names| {
                names
                    .iter()
                    .enumerate()
                    .filter(|(j, c)| {
                        self.cluster_network(&format!("{path}.clusters[{j}]"), c)
                            .is_some()
                    })
                    .map(|(_, c)| ClusterId::new(c))
                    .collect()
            });
            if p.any_namespace && selector.is_none() {
                self.problem(
                    format!("{path}.any_namespace"),
                    "expected a `selector` with `any_namespace: true` (use `mesh: true` for every workload), found none",
                );
            }
            let scope = match (p.mesh, selector) {
                (true, Some(_)) => {
                    self.problem(
                        &path,
                        "expected at most one of `mesh: true` and `selector`, found both",
                    );
                    PolicyScope::Mesh
                }
                (true, None) => PolicyScope::Mesh,
                (false, Some(labels)) => {
                    if labels.is_empty() {
                        self.problem(
                            format!("{path}.selector"),
                            "expected at least one label, found an empty map (omit `selector` to apply the policy to its whole namespace)",
                        );
                    }
                    PolicyScope::WorkloadSelector
                }
                (false, None) => PolicyScope::Namespace,
            };
            let rules = p
                .rules
                .iter()
                .enumerate()
                .map(|(j, r)| self.rule(&format!("{path}.rules[{j}]"), r))
                .collect();
            if !unique {
                continue;
            }
            // A cluster limit or `any_namespace` is a selection of its own: the workloads
            // are listed, whatever the scope said.
            let scope = if clusters.is_some() || p.any_namespace {
                PolicyScope::WorkloadSelector
            } else {
                scope
            };
            if scope == PolicyScope::WorkloadSelector {
                let first = selector.and_then(|l| l.iter().next());
                let candidates: &[usize] = match first {
                    Some((k, v)) if p.mesh || p.any_namespace => by_any_label
                        .get(&(k.clone(), v.clone()))
                        .map_or(&[], Vec::as_slice),
                    Some((k, v)) => by_label
                        .get(&(ns.clone(), k.clone(), v.clone()))
                        .map_or(&[], Vec::as_slice),
                    None if p.mesh => &all,
                    None => by_namespace.get(&ns).map_or(&[], Vec::as_slice),
                };
                for &i in candidates {
                    let w = &mut self.out.workloads[i];
                    let in_namespace = p.mesh || p.any_namespace || w.namespace == ns;
                    let labelled = selector.is_none_or(|l| selects(l, &w.labels));
                    let in_cluster = clusters.as_ref().is_none_or(|c| c.contains(&w.cluster));
                    if in_namespace && labelled && in_cluster {
                        w.authorization_policies.push(key.clone());
                    }
                }
            }
            self.out.policies.push(Policy {
                name: p.name.clone(),
                namespace: ns,
                scope,
                action: match p.action {
                    ActionSpec::Allow => Action::Allow,
                    ActionSpec::Deny => Action::Deny,
                    ActionSpec::Audit => Action::Audit,
                },
                rules,
                dry_run: p.dry_run,
            });
        }
    }

    /// One clause for `from` and one for `to`, each omitted when empty: `{}` matches everything.
    fn rule(&mut self, path: &str, spec: &RuleSpec) -> Rule {
        let mut clauses = Vec::new();
        if !spec.from.is_empty() {
            let matches = spec
                .from
                .iter()
                .enumerate()
                .map(|(k, f)| self.source_match(&format!("{path}.from[{k}]"), f))
                .collect();
            clauses.push(Clause { matches });
        }
        if !spec.to.is_empty() {
            let matches = spec
                .to
                .iter()
                .enumerate()
                .map(|(k, t)| self.operation_match(&format!("{path}.to[{k}]"), t))
                .collect();
            clauses.push(Clause { matches });
        }
        Rule { clauses }
    }

    fn source_match(&mut self, path: &str, f: &FromSpec) -> Match {
        let lists = [
            &f.principals,
            &f.not_principals,
            &f.namespaces,
            &f.not_namespaces,
            &f.ip_blocks,
            &f.not_ip_blocks,
        ];
        if lists.iter().all(|l| l.is_empty()) {
            self.problem(
                path,
                "expected at least one of `principals`, `not_principals`, `namespaces`, `not_namespaces`, `ip_blocks`, `not_ip_blocks`, found an empty entry",
            );
        }
        Match {
            principals: self.patterns(&format!("{path}.principals"), &f.principals),
            not_principals: self.patterns(&format!("{path}.not_principals"), &f.not_principals),
            namespaces: self.patterns(&format!("{path}.namespaces"), &f.namespaces),
            not_namespaces: self.patterns(&format!("{path}.not_namespaces"), &f.not_namespaces),
            source_ips: self.cidrs(&format!("{path}.ip_blocks"), &f.ip_blocks),
            not_source_ips: self.cidrs(&format!("{path}.not_ip_blocks"), &f.not_ip_blocks),
            ..Match::default()
        }
    }

    fn operation_match(&mut self, path: &str, t: &ToSpec) -> Match {
        let l7 = [
            &t.methods,
            &t.not_methods,
            &t.paths,
            &t.not_paths,
            &t.hosts,
            &t.not_hosts,
        ];
        if t.ports.is_empty()
            && t.not_ports.is_empty()
            && l7.iter().all(|l| l.is_empty())
            && t.headers.is_empty()
        {
            self.problem(
                path,
                "expected at least one of `ports`, `not_ports`, `methods`, `not_methods`, `paths`, `not_paths`, `hosts`, `not_hosts`, `headers`, found an empty entry",
            );
        }
        Match {
            destination_ports: self.policy_ports(&format!("{path}.ports"), &t.ports),
            not_destination_ports: self.policy_ports(&format!("{path}.not_ports"), &t.not_ports),
            methods: self.patterns(&format!("{path}.methods"), &t.methods),
            not_methods: self.patterns(&format!("{path}.not_methods"), &t.not_methods),
            paths: self.patterns(&format!("{path}.paths"), &t.paths),
            not_paths: self.patterns(&format!("{path}.not_paths"), &t.not_paths),
            hosts: self.patterns(&format!("{path}.hosts"), &t.hosts),
            not_hosts: self.patterns(&format!("{path}.not_hosts"), &t.not_hosts),
            headers: t
                .headers
                .iter()
                .map(|(name, values)| ferry_core::model::HeaderMatch {
                    name: name.to_ascii_lowercase(),
                    values: self.patterns(&format!("{path}.headers.{name}"), values),
                })
                .collect(),
            ..Match::default()
        }
    }

    /// Istio's patterns: exact, `prefix*`, `*suffix` or `*`.
    fn patterns(&mut self, path: &str, values: &[String]) -> Vec<StringMatch> {
        let mut out = Vec::new();
        for (k, v) in values.iter().enumerate() {
            if v.is_empty() {
                self.problem(
                    format!("{path}[{k}]"),
                    "expected a value, `prefix*`, `*suffix` or `*`, found \"\"",
                );
            } else {
                out.push(StringMatch::from_pattern(v));
            }
        }
        out
    }

    fn cidrs(&mut self, path: &str, values: &[String]) -> Vec<Cidr> {
        let mut out = Vec::new();
        for (k, v) in values.iter().enumerate() {
            match v.trim().parse::<Cidr>() {
                Ok(c) => out.push(c),
                Err(e) => self.problem(
                    format!("{path}[{k}]"),
                    format!(
                        "expected an IP address or CIDR block such as 198.18.0.0/15, found {v:?} ({})",
                        e.reason
                    ),
                ),
            }
        }
        out
    }

    fn policy_ports(&mut self, path: &str, values: &[PortValue]) -> Vec<u16> {
        let mut out = Vec::new();
        for (k, PortValue(p)) in values.iter().enumerate() {
            if *p == 0 {
                self.problem(
                    format!("{path}[{k}]"),
                    "expected a port from 1 to 65535, found 0",
                );
            } else {
                out.push(*p);
            }
        }
        out
    }
}
