//! One connection's replay, without I/O: which pods the agent has named since it connected, and
//! what each request asks of the node.
//!
//! ```text
//!   connect, hello ──> replaying ──SnapshotSent──> live
//!     replaying: add (served, named), keep (named), del (released, unnamed)
//!     SnapshotSent: the agent's pods served but not named are released
//!     live: add, del; a keep or a second SnapshotSent is an error and changes nothing
//! ```
//!
//! Every pod the node serves is the agent's (it is the one way pods are enrolled), those served
//! again from the state file included.

use std::collections::{BTreeMap, BTreeSet};

use ferry_core::model::WorkloadUid;

use super::frames::Request;

/// What the node must do for one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action<F> {
    /// Serve this pod from this namespace, with these inbound ports left out of its capture (a
    /// pod served already stays as it is).
    Serve {
        uid: WorkloadUid,
        netns: F,
        uncaptured: Vec<u16>,
    },
    /// Keep this pod; nothing to do now.
    Keep,
    /// Stop serving this pod.
    Release(WorkloadUid),
    /// The replay is over: release these pods.
    Reconcile(Vec<WorkloadUid>),
}

/// A request that is well-formed but out of place.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum SessionError {
    #[error("keep after SnapshotSent (keep is for the replay only)")]
    KeepAfterSnapshot,
    #[error("a second SnapshotSent on this connection")]
    SecondSnapshot,
}

/// One connection's state.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// Whether SnapshotSent came.
    live: bool,
    /// The pods added or kept during the replay (and not deleted since).
    named: BTreeSet<WorkloadUid>,
}

// === impl Session ===

impl Session {
    /// What `request` asks; `served` are the agent's pods served now (read at SnapshotSent).
    pub(crate) fn step<F>(
        &mut self,
        request: Request<F>,
        served: impl FnOnce() -> Vec<WorkloadUid>,
    ) -> Result<Action<F>, SessionError> {
        match request {
            Request::Add {
                uid,
                netns,
                uncaptured,
                ..
            } => {
                let uid = WorkloadUid::new(uid);
                if !self.live {
                    self.named.insert(uid.clone());
                }
                Ok(Action::Serve {
                    uid,
                    netns,
                    uncaptured,
                })
            }
            Request::Keep { uid } => {
                if self.live {
                    return Err(SessionError::KeepAfterSnapshot);
                }
                self.named.insert(WorkloadUid::new(uid));
                Ok(Action::Keep)
            }
            Request::Del { uid } => {
                let uid = WorkloadUid::new(uid);
                self.named.remove(&uid);
                Ok(Action::Release(uid))
            }
            Request::SnapshotSent => {
                if self.live {
                    return Err(SessionError::SecondSnapshot);
                }
                self.live = true;
                let named = std::mem::take(&mut self.named);
                let mut gone: Vec<WorkloadUid> = served()
                    .into_iter()
                    .filter(|u| !named.contains(u))
                    .collect();
                gone.sort();
                Ok(Action::Reconcile(gone))
            }
        }
    }

    /// Whether the replay is over.
    #[cfg(test)]
    pub(crate) fn live(&self) -> bool {
        self.live
    }
}

/// The agent's uids of the pods whose workload has another uid in the mesh. Istio's agent
/// names a pod by its Kubernetes UID, which the mesh's workloads do not carry; such a pod is
/// found by the name and namespace of its `workload_info` among this node's workloads. Kept
/// across connections: a del or a replay names the pod by the agent's uid.
#[derive(Debug, Default)]
pub(crate) struct Aliases(BTreeMap<WorkloadUid, WorkloadUid>);

// === impl Aliases ===

impl Aliases {
    /// Records that the agent's `agent` is the mesh's `mesh` (nothing if they are the same).
    pub(crate) fn insert(&mut self, agent: WorkloadUid, mesh: WorkloadUid) {
        if agent == mesh {
            self.0.remove(&agent);
        } else {
            self.0.insert(agent, mesh);
        }
    }

    /// The mesh's uid of the agent's `agent`, forgotten.
    pub(crate) fn take(&mut self, agent: &WorkloadUid) -> WorkloadUid {
        self.0.remove(agent).unwrap_or_else(|| agent.clone())
    }

    /// The agent's uid of the mesh's `mesh`.
    pub(crate) fn agent_uid(&self, mesh: &WorkloadUid) -> WorkloadUid {
        self.0
            .iter()
            .find(|(_, m)| *m == mesh)
            .map_or_else(|| mesh.clone(), |(a, _)| a.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> WorkloadUid {
        WorkloadUid::new(s)
    }

    fn add(s: &str) -> Request<u8> {
        Request::Add {
            uid: s.into(),
            info: None,
            netns: 0,
            uncaptured: Vec::new(),
        }
    }

    fn served(list: &[&str]) -> impl FnOnce() -> Vec<WorkloadUid> + use<> {
        let list: Vec<WorkloadUid> = list.iter().map(|s| uid(s)).collect();
        move || list
    }

    #[test]
    fn pods_neither_added_nor_kept_in_the_replay_are_released_at_snapshot_sent() {
        let mut s = Session::default();
        assert_eq!(
            s.step(add("a"), served(&[])),
            Ok(Action::Serve {
                uid: uid("a"),
                netns: 0,
                uncaptured: Vec::new(),
            })
        );
        assert_eq!(
            s.step(Request::<u8>::Keep { uid: "b".into() }, served(&[])),
            Ok(Action::Keep)
        );
        assert!(!s.live());
        assert_eq!(
            s.step(Request::<u8>::SnapshotSent, served(&["a", "b", "c", "d"])),
            Ok(Action::Reconcile(vec![uid("c"), uid("d")]))
        );
        assert!(s.live());
    }

    #[test]
    fn a_pod_deleted_during_the_replay_is_released_and_not_kept() {
        let mut s = Session::default();
        s.step(add("a"), served(&[])).unwrap();
        assert_eq!(
            s.step(Request::<u8>::Del { uid: "a".into() }, served(&[])),
            Ok(Action::Release(uid("a")))
        );
        // Had its release failed, the reconcile would still take it.
        assert_eq!(
            s.step(Request::<u8>::SnapshotSent, served(&["a"])),
            Ok(Action::Reconcile(vec![uid("a")]))
        );
    }

    #[test]
    fn after_snapshot_sent_adds_and_dels_act_and_keep_or_a_second_snapshot_are_errors() {
        let mut s = Session::default();
        s.step(Request::<u8>::SnapshotSent, served(&[])).unwrap();
        assert!(matches!(
            s.step(add("x"), served(&[])),
            Ok(Action::Serve { .. })
        ));
        assert_eq!(
            s.step(Request::<u8>::Keep { uid: "x".into() }, served(&[])),
            Err(SessionError::KeepAfterSnapshot)
        );
        assert_eq!(
            s.step(Request::<u8>::SnapshotSent, served(&["x"])),
            Err(SessionError::SecondSnapshot)
        );
        assert_eq!(
            s.step(Request::<u8>::Del { uid: "x".into() }, served(&[])),
            Ok(Action::Release(uid("x")))
        );
    }

    #[test]
    fn an_alias_maps_the_agents_uid_both_ways_until_taken() {
        let mut a = Aliases::default();
        a.insert(uid("k8s-1"), uid("east//v1/Pod/default/web-1"));
        a.insert(uid("same"), uid("same"));
        assert_eq!(
            a.agent_uid(&uid("east//v1/Pod/default/web-1")),
            uid("k8s-1")
        );
        assert_eq!(a.agent_uid(&uid("other")), uid("other"));
        assert_eq!(a.take(&uid("k8s-1")), uid("east//v1/Pod/default/web-1"));
        assert_eq!(a.take(&uid("k8s-1")), uid("k8s-1"), "forgotten");
        assert_eq!(a.take(&uid("same")), uid("same"));
    }
}
