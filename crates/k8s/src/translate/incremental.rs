//! An edit of the objects translated for what it changes: when only pods and EndpointSlices
//! changed since the last translation, only the pods they touch are translated again (with
//! what a whole translation kept of the rest: waypoints, nodes, the slices' pod states), and
//! their workloads are applied to the last mesh as a delta ([`Editable`]). Pods are what
//! churns in a cluster (and the slices that follow their readiness); anything else is
//! translated whole, as are the cases where a pod's translation reads or is read by more
//! than its own workload:
//! - a gateway's pod (a waypoint's instance, an east-west gateway's address and identity);
//! - a pod named by a selector-less Service's slice, or a slice of a selector-less Service
//!   (its manual endpoints, [`super::manual`]);
//! - a change of the clusters translated;
//! - after a translation that left something out ([`crate::repair`]): a pod's change may let
//!   it back in;
//! - a pod whose address (old or new) is within the range cluster-set addresses are allocated
//!   from ([`MeshConfig::clusterset_cidr`]): an allocation steps around the addresses pods hold;
//! - a pod's workload that does not convert or apply on its own (a duplicate address, say): the
//!   whole translation names and repairs it.
//!
//! The result equals a whole translation of the same objects, notes aside, whose order may
//! differ (`crates/control/tests/kube_incremental.rs` checks random edit sequences against
//! one).

use std::collections::{BTreeMap, BTreeSet};

use ferry_core::model::WorkloadUid;
use ferry_topology::editable::{Editable, WorkloadEdit};
use ferry_topology::{Topology, TopologyError};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::endpoints::{SERVICE_NAME, SliceStates};
use super::mcs::{self, in_range};
use super::pods::is_gateway;
use super::{MeshConfig, PodContext, Tx, label, ns_name, selectorless, translate_with};
use crate::objects::{ClusterObjects, HasMeta, Note};

/// `(cluster, namespace, name)` of a namespaced object.
pub type ObjectKey = (String, String, String);

/// What changed in the objects since the last translation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Objects other than pods and EndpointSlices changed, or a kind was read whole:
    /// everything is translated.
    pub whole: bool,
    pub pods: BTreeSet<ObjectKey>,
    pub slices: BTreeSet<ObjectKey>,
}

impl Changed {
    /// Everything, as for a first translation.
    pub fn whole() -> Self {
        Self {
            whole: true,
            ..Self::default()
        }
    }
}

/// A translated and converted mesh.
#[derive(Debug)]
pub struct Translated {
    pub topology: Topology,
    /// The translation's notes, and what was left out of it.
    pub notes: Vec<Note>,
    /// When it differs from the mesh translated before in these workloads alone.
    pub edit: Option<WorkloadEdit>,
    /// As [`super::Translation::exports`].
    pub exports: BTreeMap<ObjectKey, Option<String>>,
    /// As [`super::Translation::imports`].
    pub imports: BTreeMap<ObjectKey, Option<mcs::ImportWrite>>,
}

/// A slice's Service and the pods (`(namespace, name)`) it names.
type SliceKept = (Option<String>, Vec<(String, String)>);

/// Translates objects, keeping what an edit of pods alone needs.
#[derive(Debug, Default)]
pub struct Translator {
    kept: Option<Box<Kept>>,
}

/// What the last whole translation kept.
#[derive(Debug)]
struct Kept {
    /// The clusters translated, in ID order.
    clusters: Vec<String>,
    context: PodContext,
    /// Gateways' pods.
    gateways: BTreeSet<ObjectKey>,
    /// Each slice's Service and the pods it names.
    slices: BTreeMap<ObjectKey, SliceKept>,
    notes: Vec<Note>,
    exports: BTreeMap<ObjectKey, Option<String>>,
    imports: BTreeMap<ObjectKey, Option<mcs::ImportWrite>>,
    mesh: Editable,
}

impl Translator {
    /// The mesh of `clusters`, which differ from the objects of the last call by `changed`
    /// (in any order: they are taken in cluster ID order; each cluster's pods and slices in
    /// namespace/name order, as the watch keeps them). An error keeps nothing: the next call
    /// translates whole.
    pub fn translate(
        &mut self,
        mesh: &MeshConfig,
        clusters: &[&ClusterObjects],
        changed: &Changed,
    ) -> Result<Translated, TopologyError> {
        if !changed.whole
            && let Some(kept) = self.kept.as_deref_mut()
            && let Some(t) = kept.edit(mesh, clusters, changed)
        {
            return Ok(t);
        }
        self.kept = None;
        let (mut t, context) = translate_with(mesh, clusters);
        let exports = std::mem::take(&mut t.exports);
        let imports = std::mem::take(&mut t.imports);
        let translated = t.notes.len();
        let (topology, notes, file) = t.into_checked()?;
        // After a repair a pod's change may let what was left out back in: whole, then.
        let repaired = notes.len() != translated;
        let mut ids: Vec<String> = clusters.iter().map(|c| c.cluster.clone()).collect();
        ids.sort_unstable();
        let kept = (!repaired)
            .then(|| Editable::new(file, &topology))
            .flatten()
            .map(|mesh| {
                Box::new(Kept {
                    clusters: ids,
                    gateways: gateway_pods(clusters),
                    slices: slices(clusters),
                    context,
                    notes: notes.clone(),
                    exports: exports.clone(),
                    imports: imports.clone(),
                    mesh,
                })
            });
        self.kept = kept;
        Ok(Translated {
            topology,
            notes,
            edit: None,
            exports,
            imports,
        })
    }
}

impl Kept {
    /// The mesh after `changed`, when it is an edit of pods and slices this can apply alone;
    /// `None` when it needs a whole translation (this may then be left part-updated: the
    /// whole translation replaces it).
    fn edit(
        &mut self,
        mesh: &MeshConfig,
        clusters: &[&ClusterObjects],
        changed: &Changed,
    ) -> Option<Translated> {
        let mut ids: Vec<&str> = clusters.iter().map(|c| c.cluster.as_str()).collect();
        ids.sort_unstable();
        if !ids.iter().eq(self.clusters.iter()) {
            return None;
        }
        let cluster = |id: &str| clusters.iter().find(|c| c.cluster == id).copied();
        let mut affected = changed.pods.clone();
        // Notes of these objects, by cluster, are replaced.
        let mut renoted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut unnamed: Vec<(&ClusterObjects, &EndpointSlice, usize)> = Vec::new();
        for key in &changed.slices {
            let (id, ns, name) = key;
            let c = cluster(id)?;
            let new = find(&c.endpoint_slices, ns, name);
            let old = self.slices.remove(key);
            let services = [
                old.as_ref().and_then(|(s, _)| s.as_deref()),
                new.and_then(|s| label(&s.metadata, SERVICE_NAME)),
            ];
            if services
                .into_iter()
                .flatten()
                .any(|svc| selectorless(c, ns, svc).is_some())
            {
                return None;
            }
            let states = self.context.pod_states.entry(id.clone()).or_default();
            let slice = (ns.clone(), name.clone());
            if let Some((_, named)) = &old {
                states.remove(&slice, named);
                affected.extend(
                    named
                        .iter()
                        .map(|(n, p)| (id.clone(), n.clone(), p.clone())),
                );
            }
            if let Some(s) = new {
                if let Some(count) = states.add(s) {
                    unnamed.push((c, s, count));
                }
                let named = SliceStates::named(s);
                affected.extend(
                    named
                        .iter()
                        .map(|(n, p)| (id.clone(), n.clone(), p.clone())),
                );
                let service = label(&s.metadata, SERVICE_NAME).map(str::to_string);
                self.slices.insert(key.clone(), (service, named));
            }
            renoted
                .entry(id.clone())
                .or_default()
                .insert(format!("EndpointSlice {ns}/{name}"));
        }
        let mut removed = Vec::new();
        let mut pods: Vec<(&ClusterObjects, &Pod)> = Vec::new();
        for key in &affected {
            let (id, ns, name) = key;
            if self.gateways.contains(key) || self.context.manual.contains(key) {
                return None;
            }
            let c = cluster(id)?;
            let pod = find(&c.pods, ns, name);
            if pod.is_some_and(is_gateway) {
                return None;
            }
            let uid = WorkloadUid::new(format!("{id}//v1/Pod/{ns}/{name}"));
            if let Some(w) = self.mesh.snapshot().workload(&uid) {
                if w.addresses
                    .iter()
                    .any(|a| in_range(mesh.clusterset_cidr, *a))
                {
                    return None;
                }
                removed.push(uid);
            }
            pods.extend(pod.map(|p| (c, p)));
            renoted
                .entry(id.clone())
                .or_default()
                .insert(format!("Pod {ns}/{name}"));
        }
        let mut tx = Tx::new(mesh, clusters, std::mem::take(&mut self.context));
        for (c, s, count) in unnamed {
            tx.slice_note(c, s, count);
        }
        let added: Vec<_> = pods
            .into_iter()
            .filter_map(|(c, p)| tx.pod_workload(c, p))
            .collect();
        let notes = std::mem::take(&mut tx.notes);
        self.context = tx.context;
        let clusterset = added.iter().any(|w| {
            w.address
                .iter()
                .chain(w.addresses.iter().flatten())
                .filter_map(|a| a.parse().ok())
                .any(|a| in_range(mesh.clusterset_cidr, a))
        });
        if clusterset {
            return None;
        }
        let (topology, edit) = self.mesh.replace(&removed, added)?;
        self.notes.retain(|n| {
            !renoted
                .get(n.cluster.as_str())
                .is_some_and(|objects| objects.contains(n.object.as_str()))
        });
        self.notes.extend(notes);
        Some(Translated {
            topology,
            notes: self.notes.clone(),
            edit: Some(edit),
            exports: self.exports.clone(),
            imports: self.imports.clone(),
        })
    }
}

/// The object of namespace `ns` and name `name` in `objects`, sorted by namespace and name.
fn find<'o, T: HasMeta>(objects: &'o [T], ns: &str, name: &str) -> Option<&'o T> {
    objects
        .binary_search_by(|o| {
            let m = o.meta();
            (m.namespace.as_deref(), m.name.as_deref()).cmp(&(Some(ns), Some(name)))
        })
        .ok()
        .map(|i| &objects[i])
}

/// Every gateway's pod, by `(cluster, namespace, name)`.
fn gateway_pods(clusters: &[&ClusterObjects]) -> BTreeSet<ObjectKey> {
    clusters
        .iter()
        .flat_map(|c| {
            c.pods.iter().filter(|p| is_gateway(p)).map(|p| {
                let (ns, name) = ns_name(&p.metadata);
                (c.cluster.clone(), ns, name)
            })
        })
        .collect()
}

/// Every slice's Service and the pods it names.
fn slices(clusters: &[&ClusterObjects]) -> BTreeMap<ObjectKey, SliceKept> {
    clusters
        .iter()
        .flat_map(|c| {
            c.endpoint_slices.iter().map(|s| {
                let (ns, name) = ns_name(&s.metadata);
                let service = label(&s.metadata, SERVICE_NAME).map(str::to_string);
                (
                    (c.cluster.clone(), ns, name),
                    (service, SliceStates::named(s)),
                )
            })
        })
        .collect()
}
