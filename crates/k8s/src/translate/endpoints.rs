//! EndpointSlices (`discovery.k8s.io/v1`): what a Service's endpoints say about the pods they
//! name. Pure: the slices of one cluster in, each pod's state out.
//!
//! Kubernetes' meanings (`EndpointConditions` in `k8s.io/api/discovery/v1`):
//! - `terminating`: "A nil value indicates an unknown state. Consumers should interpret this
//!   unknown state to mean that the endpoint is not terminating."
//! - `serving`: "identical to ready except that it is set regardless of the terminating state
//!   of endpoints. [...] If nil, consumers should defer to the ready condition."
//! - `ready`: "A nil value indicates an unknown state. In most cases consumers should
//!   interpret this unknown state as ready."
//!
//! `serving`, not `ready`, is health: `ready` is false for every terminating endpoint, and true
//! for an unready pod of a Service with `publishNotReadyAddresses`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};

use super::pod_status::is_ready;
use super::{Tx, label, ns_name, selectorless};
use crate::objects::ClusterObjects;

/// The label that names a slice's Service.
pub(super) const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// A pod's state, as the translation gives it to its workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PodState {
    pub(super) healthy: bool,
    /// No new connections, open ones kept (whatever `healthy` says).
    pub(super) terminating: bool,
}

/// One cluster's pods as their slices' endpoints name them, by `(namespace, name)`.
#[derive(Debug, Default)]
pub(super) struct SliceStates(BTreeMap<(String, String), Vec<Named>>);

/// One endpoint naming a pod.
#[derive(Debug)]
struct Named {
    /// The `targetRef`'s uid, if it gives one.
    uid: Option<String>,
    state: PodState,
    /// The slice's `(namespace, name)`, to take its endpoints out when it changes.
    slice: (String, String),
}

impl Tx<'_> {
    /// Reads every cluster's slices; a slice with endpoints that name no pod is a note.
    pub(super) fn endpoints(&mut self) {
        for c in self.clusters.clone() {
            let mut states = SliceStates::default();
            for s in &c.endpoint_slices {
                if let Some(unnamed) = states.add(s) {
                    self.slice_note(c, s, unnamed);
                }
            }
            self.context.pod_states.insert(c.cluster.clone(), states);
        }
    }

    /// The note of slice `s` of `c`, `unnamed` of whose endpoints name no pod.
    pub(super) fn slice_note(&mut self, c: &ClusterObjects, s: &EndpointSlice, unnamed: usize) {
        let (ns, name) = ns_name(&s.metadata);
        // A selector-less Service's are its endpoints ([`super::manual`]).
        if label(&s.metadata, SERVICE_NAME).is_some_and(|svc| selectorless(c, &ns, svc).is_some()) {
            return;
        }
        let msg = format!(
            "{unnamed} endpoint(s) left out: they name no pod (no targetRef), and the endpoints of a Service with a selector are the pods it selects"
        );
        self.note(&c.cluster, format!("EndpointSlice {ns}/{name}"), msg);
    }

    /// The state of pod `p` of `cluster`: what its endpoints say if any names it, else its
    /// `Ready` condition and deletion timestamp.
    pub(super) fn pod_state(&self, cluster: &str, p: &Pod) -> PodState {
        self.context
            .pod_states
            .get(cluster)
            .and_then(|s| s.of(p))
            .unwrap_or_else(|| PodState {
                healthy: is_ready(p),
                terminating: p.metadata.deletion_timestamp.is_some(),
            })
    }
}

impl SliceStates {
    /// Adds the endpoints of slice `s` that name a pod. Returns how many endpoints name none,
    /// if that is worth a note: not for slices of no Service, nor for the API server's own
    /// (`default/kubernetes`, in every cluster).
    pub(super) fn add(&mut self, s: &EndpointSlice) -> Option<usize> {
        let service = label(&s.metadata, SERVICE_NAME)?;
        let slice = ns_name(&s.metadata);
        let ns = slice.0.clone();
        let mut unnamed = 0;
        for e in s.endpoints.iter().flatten() {
            let Some(target) = e.target_ref.as_ref() else {
                unnamed += 1;
                continue;
            };
            // Another kind (a node, a VM's object) names no pod of this cluster.
            if target.kind.as_deref() != Some("Pod") {
                continue;
            }
            let Some(name) = target.name.clone() else {
                unnamed += 1;
                continue;
            };
            let pod_ns = target.namespace.clone().unwrap_or_else(|| ns.clone());
            self.0.entry((pod_ns, name)).or_default().push(Named {
                uid: target.uid.clone(),
                state: state(e.conditions.as_ref()),
                slice: slice.clone(),
            });
        }
        let api_server = ns == "default" && service == "kubernetes";
        (unnamed > 0 && !api_server).then_some(unnamed)
    }

    /// Takes out what slice `slice` (`(namespace, name)`) said of the pods in `named`.
    pub(super) fn remove(&mut self, slice: &(String, String), named: &[(String, String)]) {
        for pod in named {
            if let Some(v) = self.0.get_mut(pod) {
                v.retain(|n| &n.slice != slice);
                if v.is_empty() {
                    self.0.remove(pod);
                }
            }
        }
    }

    /// The pods (`(namespace, name)`) whose state slice `s` says something of, as
    /// [`Self::add`] reads it.
    pub(super) fn named(s: &EndpointSlice) -> Vec<(String, String)> {
        let mut one = Self::default();
        one.add(s);
        one.0.into_keys().collect()
    }

    /// What the endpoints naming `p` say, if any does: terminating if one says so, else
    /// unhealthy if one is not serving. An endpoint whose `targetRef` uid is not `p`'s names
    /// an earlier pod of the same name (a StatefulSet's, say) and says nothing of this one.
    fn of(&self, p: &Pod) -> Option<PodState> {
        let uid = p.metadata.uid.as_deref();
        self.0
            .get(&ns_name(&p.metadata))?
            .iter()
            .filter(|n| match (n.uid.as_deref(), uid) {
                (Some(t), Some(u)) => t == u,
                _ => true,
            })
            .map(|n| n.state)
            .reduce(|a, b| PodState {
                healthy: a.healthy && b.healthy,
                terminating: a.terminating || b.terminating,
            })
    }
}

/// The state one endpoint's conditions give, with Kubernetes' meaning of each nil.
pub(super) fn state(c: Option<&EndpointConditions>) -> PodState {
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    PodState {
        healthy: c.and_then(|c| c.serving).unwrap_or(ready),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
    }
}

#[cfg(test)]
mod tests;
