//! One bad object never blocks the rest: when the topology checks reject items of the
//! translated file, those items are left out, each with a note, and the rest is converted
//! again. A policy is never left out (that would grant what it refused): it is replaced by its
//! fail-closed form, and if that is rejected too, the whole mesh is rejected so the last good
//! one keeps serving. A rejected peer authentication rejects the whole mesh at once.

use std::collections::BTreeSet;

use ferry_topology::schema::{ActionSpec, File, RuleSpec};
use ferry_topology::{Topology, TopologyError};

use crate::objects::Note;
use crate::translate::Translation;

/// Conversions tried before giving up: every round leaves out at least one item, and the
/// checks report every problem of a round at once, so one or two rounds are the rule.
const MAX_ROUNDS: usize = 8;

impl Translation {
    /// Checks and converts the file, leaving out what the checks reject; returns the mesh and
    /// every note (the translation's and the repairs'). Fails only when a problem names no
    /// item that can be left out, or after [`MAX_ROUNDS`].
    pub fn into_topology(self) -> Result<(Topology, Vec<Note>), TopologyError> {
        self.into_checked().map(|(t, notes, _)| (t, notes))
    }

    /// [`Self::into_topology`], with the file the mesh was converted from (what was left out
    /// taken out of it).
    pub(crate) fn into_checked(mut self) -> Result<(Topology, Vec<Note>, File), TopologyError> {
        let mut failed_closed: BTreeSet<String> = BTreeSet::new();
        let mut last = None;
        for _ in 0..MAX_ROUNDS {
            let e = match self.topology() {
                Ok(t) => return Ok((t, self.notes, self.file)),
                Err(e) => e,
            };
            let mut items: BTreeSet<(String, usize)> = BTreeSet::new();
            for p in &e.problems {
                if let Some(item) = item_of(&p.path) {
                    items.insert(item);
                }
            }
            if items.is_empty() {
                return Err(e);
            }
            // Highest index first, so the indexes still to visit stay valid.
            for (section, index) in items.iter().rev() {
                let why: Vec<&str> = e
                    .problems
                    .iter()
                    .filter(|p| item_of(&p.path).as_ref() == Some(&(section.clone(), *index)))
                    .map(|p| p.message.as_str())
                    .collect();
                if self
                    .repair(section, *index, &why.join("; "), &mut failed_closed)
                    .is_err()
                {
                    return Err(e);
                }
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| TopologyError {
            file: "kubernetes".into(),
            problems: Vec::new(),
        }))
    }

    /// Leaves out item `index` of `section`, or makes a policy fail closed; `Err` when a policy
    /// failed closed already is rejected again (then the whole mesh is rejected and the last
    /// good one keeps serving).
    fn repair(
        &mut self,
        section: &str,
        index: usize,
        why: &str,
        failed_closed: &mut BTreeSet<String>,
    ) -> Result<(), ()> {
        let f = &mut self.file;
        let name = match section {
            "nodes" if index < f.nodes.len() => format!("Node {}", f.nodes.remove(index).name),
            "gateways" if index < f.gateways.len() => {
                format!("Gateway {}", f.gateways.remove(index).name)
            }
            "waypoints" if index < f.waypoints.len() => {
                format!("Gateway {}", f.waypoints.remove(index).name)
            }
            "services" if index < f.services.len() => {
                format!("Service {}", f.services.remove(index).name)
            }
            "workloads" if index < f.workloads.len() => {
                format!("Pod {}", f.workloads.remove(index).name)
            }
            "policies" if index < f.policies.len() => {
                let p = &mut f.policies[index];
                let key = format!("{}/{}", p.namespace.as_deref().unwrap_or("default"), p.name);
                if !failed_closed.insert(key) {
                    // Its fail-closed form was rejected too: a policy is never left out.
                    return Err(());
                }
                let msg = match p.action {
                    ActionSpec::Allow => {
                        p.rules.clear();
                        "rejected by the checks; now matches nothing (fails closed)"
                    }
                    ActionSpec::Audit => {
                        p.rules.clear();
                        "rejected by the checks; now audits nothing"
                    }
                    ActionSpec::Deny => {
                        p.rules = vec![RuleSpec::default()];
                        "rejected by the checks; now denies everything it selects (fails closed)"
                    }
                };
                let object = format!("AuthorizationPolicy {}", p.name);
                self.push(object, format!("{msg}: {why}"));
                return Ok(());
            }
            // Never left out either (that would accept plain TCP it refused): the whole mesh
            // is rejected and the last good one keeps serving.
            "peer_authentication" => return Err(()),
            _ => return Ok(()),
        };
        self.push(name, format!("left out: rejected by the checks: {why}"));
        Ok(())
    }

    fn push(&mut self, object: String, message: String) {
        self.notes.push(Note {
            cluster: "(mesh)".into(),
            object,
            message,
        });
    }
}

/// `("services", 2)` from a problem path `services[2] (echo).ports[0]`.
fn item_of(path: &str) -> Option<(String, usize)> {
    let (section, rest) = path.split_once('[')?;
    let (index, _) = rest.split_once(']')?;
    if section.is_empty() || !section.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return None;
    }
    Some((section.to_string(), index.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::item_of;

    #[test]
    fn problem_paths_name_their_item() {
        assert_eq!(
            item_of("services[2] (echo).ports[0].target_port"),
            Some(("services".into(), 2))
        );
        assert_eq!(item_of("workloads[10]"), Some(("workloads".into(), 10)));
        assert_eq!(item_of("trust_domain"), None);
        assert_eq!(item_of(""), None);
    }
}
