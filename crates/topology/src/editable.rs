//! A converted mesh whose workloads can be changed a few at a time: the file without its
//! workloads is kept with the snapshot, and a change converts only the workload specs it
//! touches (with the services they could back and the policies that could select them) and
//! applies them to the snapshot as a delta ([`Snapshot::apply`]). The result is the snapshot a conversion of the whole changed file
//! gives: each workload converts on its own (its placement, services, policies); what concerns
//! several, unique uids and addresses, is checked by the delta's application and here.
//!
//! Used by [`crate::kept::Kept`] for an edit of a file's workload entries, and by the
//! Kubernetes source for a pod's change.

use std::collections::BTreeSet;
use std::sync::Arc;

use ferry_core::model::{Workload, WorkloadUid};
use ferry_core::snapshot::{Snapshot, SnapshotDelta};

use crate::schema::{File, PolicySpec, ServiceSpec, WorkloadSpec};
use crate::{Topology, convert};

/// A mesh kept for workload edits.
#[derive(Debug)]
pub struct Editable {
    /// The file with no workloads.
    rest: Box<File>,
    /// The workloads the rest of the file makes (waypoint instances).
    instances: BTreeSet<WorkloadUid>,
    snapshot: Snapshot,
    trust_domain: String,
}

/// What an edit changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadEdit {
    /// Workloads added, changed or removed, by uid.
    pub workloads: BTreeSet<WorkloadUid>,
}

impl Editable {
    /// `topology`, converted from `rest` with workloads that were then taken out of it; `None`
    /// when the rest does not convert without them.
    pub fn new(mut rest: File, topology: &Topology) -> Option<Self> {
        rest.workloads = Vec::new();
        let (base, _) = convert::convert(&rest).ok()?;
        let instances = base.workloads().map(|w| w.uid.clone()).collect();
        Some(Self {
            rest: Box::new(rest),
            instances,
            snapshot: topology.snapshot.clone(),
            trust_domain: topology.trust_domain.clone(),
        })
    }

    /// The snapshot of the last edit.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The mesh with the workloads `removed` taken out and those of the specs `added` put in
    /// (the same uid in both: changed); this then keeps it. `None` (and this unchanged) when
    /// a spec does not convert, a uid is given twice or is held by a workload left alone, or
    /// the snapshot rejects the delta: a full conversion says why.
    pub fn replace(
        &mut self,
        removed: &[WorkloadUid],
        added: Vec<WorkloadSpec>,
    ) -> Option<(Topology, WorkloadEdit)> {
        let added = self.convert(added)?;
        let (topology, edit) = self.apply(removed, added)?;
        self.commit(&topology);
        Some((topology, edit))
    }

    /// The workloads `specs` convert to with the rest of the file; `None` when they do not
    /// convert.
    pub(crate) fn convert(&mut self, specs: Vec<WorkloadSpec>) -> Option<Vec<Arc<Workload>>> {
        if specs.is_empty() {
            return Some(Vec::new());
        }
        let rest = &mut self.rest;
        let count = specs.len();
        // Only the services these specs could back are converted with them (a selector whose
        // labels they carry, a name or hostname they list), without routes and endpoints
        // (which name other services and say nothing of a workload); an address they share
        // with a service left out is found when the delta is applied. Likewise only the
        // policies that could select them (a selector whose labels one carries, or none): the
        // others attach to no workload of these.
        let services = Lent::keep(&mut rest.services, |s| may_back(s, &specs));
        let stripped: Vec<_> = rest
            .services
            .iter_mut()
            .map(|s| {
                (
                    std::mem::take(&mut s.routes),
                    std::mem::take(&mut s.endpoints),
                )
            })
            .collect();
        let policies = Lent::keep(&mut rest.policies, |p| may_select(p, &specs));
        rest.workloads = specs;
        let converted = convert::convert(rest);
        rest.workloads = Vec::new();
        for (s, (routes, endpoints)) in rest.services.iter_mut().zip(stripped) {
            s.routes = routes;
            s.endpoints = endpoints;
        }
        services.give_back(&mut rest.services);
        policies.give_back(&mut rest.policies);
        let (mini, _) = converted.ok()?;
        let out: Vec<_> = mini
            .workloads()
            .filter(|w| !self.instances.contains(&w.uid))
            .cloned()
            .collect();
        (out.len() == count).then_some(out)
    }

    /// The snapshot with `removed` taken out and `added` put in, not kept yet ([`Self::commit`]).
    pub(crate) fn apply(
        &self,
        removed: &[WorkloadUid],
        added: Vec<Arc<Workload>>,
    ) -> Option<(Topology, WorkloadEdit)> {
        let mut delta = SnapshotDelta::new(self.snapshot.version());
        let mut edit = WorkloadEdit::default();
        let gone: BTreeSet<&WorkloadUid> = removed.iter().collect();
        let mut seen = BTreeSet::new();
        for w in &added {
            // A uid given twice, or one a workload left alone holds: the full conversion names it.
            let held = self.snapshot.workload(&w.uid).is_some() && !gone.contains(&w.uid);
            if !seen.insert(w.uid.clone()) || held {
                return None;
            }
        }
        for uid in removed {
            // Not in the mesh: the full conversion knows why.
            self.snapshot.workload(uid)?;
            delta.removed_workloads.push(uid.clone());
            edit.workloads.insert(uid.clone());
        }
        for w in added {
            edit.workloads.insert(w.uid.clone());
            delta.workloads.push(w);
        }
        let snapshot = self.snapshot.apply(&delta).ok()?;
        let topology = Topology {
            snapshot,
            trust_domain: self.trust_domain.clone(),
        };
        Some((topology, edit))
    }

    /// Keeps `topology`, one [`Self::apply`] gave.
    pub(crate) fn commit(&mut self, topology: &Topology) {
        self.snapshot = topology.snapshot.clone();
    }
}

/// The items of a list set aside while the list holds only some of them.
struct Lent<T> {
    /// Every item, those left in the list as `None`.
    slots: Vec<Option<T>>,
    /// Where the items left in the list came from, in order.
    at: Vec<usize>,
}

impl<T> Lent<T> {
    /// Leaves in `list` only the items `keep` takes (in order); the rest wait here.
    fn keep(list: &mut Vec<T>, keep: impl Fn(&T) -> bool) -> Self {
        let mut slots: Vec<Option<T>> = std::mem::take(list).into_iter().map(Some).collect();
        let mut at = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(&keep)
                && let Some(item) = slot.take()
            {
                list.push(item);
                at.push(i);
            }
        }
        Self { slots, at }
    }

    /// Puts the items left in `list` back among the others, each in its place.
    fn give_back(mut self, list: &mut Vec<T>) {
        for (i, item) in self.at.into_iter().zip(std::mem::take(list)) {
            self.slots[i] = Some(item);
        }
        *list = self.slots.into_iter().flatten().collect();
    }
}

/// Could policy `p` select one of `specs`: no selector, or its labels all on one of them? (A
/// superset: the conversion decides.)
fn may_select(p: &PolicySpec, specs: &[WorkloadSpec]) -> bool {
    p.selector.as_ref().is_none_or(|sel| {
        specs
            .iter()
            .any(|w| sel.iter().all(|(k, v)| w.labels.get(k) == Some(v)))
    })
}

/// Could `s` be backed by one of `specs`: its selector's labels all on one of them, or its name
/// or hostname among the services one lists? (A superset: the conversion decides.)
fn may_back(s: &ServiceSpec, specs: &[WorkloadSpec]) -> bool {
    specs.iter().any(|w| {
        let selected = s
            .selector
            .as_ref()
            .is_some_and(|sel| sel.iter().all(|(k, v)| w.labels.get(k) == Some(v)));
        let named = w.services.keys().any(|n| {
            n.split('.').next() == Some(s.name.as_str()) || s.hostname.as_ref() == Some(n)
        });
        selected || named
    })
}
