//! Which pods the agent enrolls, decided from what the API server says of them, as Istio's CNI
//! agent decides (pure: facts in, verdicts and actions out; the agent carries them out).
//!
//! A pod of this node is enrolled when it is asked into the mesh by Istio's label
//! (`istio.io/dataplane-mode=ambient` on it or its namespace, the pod's own label winning:
//! [`ferry_k8s::enrollment::asked`]; or its namespace given by the agent's flags, see
//! [`Override`]) unless it runs in the host's network namespace (capture rules there would
//! capture the node), has an Istio sidecar, or has ended (`Succeeded`/`Failed`: its processes are
//! gone and it is released).

use std::collections::{BTreeMap, BTreeSet};

use ferry_k8s::enrollment::{self, DATAPLANE_MODE, REDIRECTION, REDIRECTION_ENABLED};

use crate::spec::PodRef;

pub(crate) type Labels = BTreeMap<String, String>;

/// Istio's sidecar injector marks an injected pod with this annotation.
const SIDECAR_STATUS: &str = "sidecar.istio.io/status";

/// What the agent reads of a Pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) labels: Labels,
    pub(crate) annotations: Labels,
    /// `spec.nodeName`.
    pub(crate) node: Option<String>,
    /// `spec.hostNetwork`.
    pub(crate) host_network: bool,
    /// `status.phase`.
    pub(crate) phase: Option<String>,
    /// `status.podIPs` (else `status.podIP`): how the agent finds the network namespace of a
    /// pod that started before it.
    pub(crate) ips: Vec<std::net::IpAddr>,
}

impl PodFacts {
    /// `namespace/name`, how the agent's stores key a pod.
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod as the plugin would name it.
    pub(crate) fn pod_ref(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }

    /// The CNI's pod is this one: the same uid when the runtime gave one, else the same name.
    pub(crate) fn is(&self, pod: &PodRef) -> bool {
        if pod.uid.is_empty() {
            pod.namespace == self.namespace && pod.name == self.name
        } else {
            pod.uid == self.uid
        }
    }

    fn redirected(&self) -> bool {
        self.annotations.get(REDIRECTION).map(String::as_str) == Some(REDIRECTION_ENABLED)
    }
}

/// The agent's flags, which enroll namespaces as if they were labelled `ambient` (for a cluster
/// whose labels cannot be changed, the lab and tests); without Kubernetes they alone decide.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Override<'a> {
    pub(crate) namespaces: &'a BTreeSet<String>,
    pub(crate) all_namespaces: bool,
    pub(crate) excluded: &'a BTreeSet<String>,
}

impl Override<'_> {
    /// The flags enroll the pods of `namespace`.
    pub(crate) fn enrolls(&self, namespace: &str) -> bool {
        if self.all_namespaces {
            !self.excluded.contains(namespace)
        } else {
            self.namespaces.contains(namespace)
        }
    }
}

/// Whether a pod is enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Enroll,
    Leave(Why),
}

/// Why a pod is left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// Neither it nor its namespace is labelled `ambient` (nor named by the flags).
    NotAsked,
    /// Its own label says anything but `ambient` (`none`).
    OptedOut,
    HostNetwork,
    /// An Istio sidecar captures it already.
    Sidecar,
    /// `Succeeded` or `Failed`.
    Ended,
    /// Scheduled on another node (the API server's field selector should never send one).
    OtherNode,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotAsked => {
                "neither the pod nor its namespace is labelled istio.io/dataplane-mode=ambient"
            }
            Self::OptedOut => "the pod's istio.io/dataplane-mode label opts it out",
            Self::HostNetwork => "the pod runs in the host's network namespace",
            Self::Sidecar => "the pod has an Istio sidecar",
            Self::Ended => "the pod has ended",
            Self::OtherNode => "the pod is on another node",
        })
    }
}

/// Whether pod `pod` of node `node` is enrolled, given its namespace's labels (`None`: the
/// namespace is not known) and the flags.
pub(crate) fn decide(
    node: &str,
    namespace: Option<&Labels>,
    flags: Override<'_>,
    pod: &PodFacts,
) -> Verdict {
    if pod.node.as_deref() != Some(node) {
        return Verdict::Leave(Why::OtherNode);
    }
    if matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Verdict::Leave(Why::Ended);
    }
    if pod.host_network {
        return Verdict::Leave(Why::HostNetwork);
    }
    if pod.annotations.contains_key(SIDECAR_STATUS) {
        return Verdict::Leave(Why::Sidecar);
    }
    let pod_mode = pod.labels.get(DATAPLANE_MODE).map(String::as_str);
    let ns_mode = namespace
        .and_then(|l| l.get(DATAPLANE_MODE))
        .map(String::as_str);
    let ns_mode = if pod_mode.is_none() && flags.enrolls(&pod.namespace) {
        Some(enrollment::AMBIENT)
    } else {
        ns_mode
    };
    match (enrollment::asked(pod_mode, ns_mode), pod_mode) {
        (true, _) => Verdict::Enroll,
        (false, Some(_)) => Verdict::Leave(Why::OptedOut),
        (false, None) => Verdict::Leave(Why::NotAsked),
    }
}

/// One pod the agent knows from the plugin (it has its network namespace's path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The uid the node proxy knows it by.
    pub(crate) key: String,
    pub(crate) pod: PodRef,
    pub(crate) enrolled: bool,
}

/// What the API server says, as the agent holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub(crate) node: &'a str,
    /// Labels by namespace name.
    pub(crate) namespaces: &'a BTreeMap<String, Labels>,
    /// This node's pods by `namespace/name`.
    pub(crate) pods: &'a BTreeMap<String, PodFacts>,
    pub(crate) flags: Override<'a>,
}

impl View<'_> {
    /// The API server's pod the plugin told of, if it has it.
    pub(crate) fn find(&self, pod: &PodRef) -> Option<&PodFacts> {
        self.pods
            .get(&format!("{}/{}", pod.namespace, pod.name))
            .filter(|p| p.is(pod))
    }

    pub(crate) fn decide(&self, pod: &PodFacts) -> Verdict {
        decide(
            self.node,
            self.namespaces.get(&pod.namespace),
            self.flags,
            pod,
        )
    }
}

/// A change the agent makes to bring its pods in line with the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Hand the pod to the node proxy (it became enrolled while running).
    Enroll { key: String },
    /// Take it back from the node proxy; the agent still knows it.
    Unenroll { key: String, why: Why },
    /// The API server no longer has it: take it back if enrolled, and forget it.
    Forget { key: String },
    /// Asked into the mesh, but the plugin never told the agent of it (it started before the
    /// agent ran, or while it was down): its network namespace is to be found by its IPs.
    Unknown {
        pod: PodRef,
        ips: Vec<std::net::IpAddr>,
    },
}

/// The actions that bring `entries` in line with `view`.
pub(crate) fn plan(view: &View<'_>, entries: &[Entry]) -> Vec<Action> {
    let mut actions = Vec::new();
    for e in entries {
        let Some(pod) = view.find(&e.pod) else {
            actions.push(Action::Forget { key: e.key.clone() });
            continue;
        };
        match (view.decide(pod), e.enrolled) {
            (Verdict::Enroll, false) => actions.push(Action::Enroll { key: e.key.clone() }),
            (Verdict::Leave(why), true) => actions.push(Action::Unenroll {
                key: e.key.clone(),
                why,
            }),
            _ => {}
        }
    }
    for pod in view.pods.values() {
        if view.decide(pod) == Verdict::Enroll && !entries.iter().any(|e| pod.is(&e.pod)) {
            actions.push(Action::Unknown {
                pod: pod.pod_ref(),
                ips: pod.ips.clone(),
            });
        }
    }
    actions
}

/// A change to a pod's `ambient.istio.io/redirection` annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Annotate {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `enabled`, or removed.
    pub(crate) enabled: bool,
}

/// The annotations that make every pod of this node say whether the agent has it enrolled: set
/// on those it has, removed from those it has not (a value other than `enabled` is left alone).
pub(crate) fn annotations(view: &View<'_>, entries: &[Entry]) -> Vec<Annotate> {
    view.pods
        .values()
        .filter(|p| p.node.as_deref() == Some(view.node))
        .filter_map(|p| {
            let want = entries.iter().any(|e| e.enrolled && p.is(&e.pod));
            (want != p.redirected()).then(|| Annotate {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                enabled: want,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
