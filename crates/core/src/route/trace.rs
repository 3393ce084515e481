//! Where a decision's steps go: a [`Trace`] sink.
//!
//! The data path routes with [`NoTrace`]: it reports itself disabled, so no [`Step`] is built and
//! no candidate label is formatted. `ferry explain` routes with a `Vec<Step>`, which keeps them
//! all, in order.

use serde::Serialize;

use super::{Class, Near, Transport};
use crate::lb::{LbDrop, TierShare};
use crate::model::{ClusterId, FailoverMinimum, NetworkId, ScopeRule, ServiceKey};

/// A sink for the steps of a decision.
pub(crate) trait Trace {
    /// Whether steps are wanted. When `false`, the decision never builds them.
    fn enabled(&self) -> bool;

    /// Takes one step, in the order the decision took it. Called only when [`Trace::enabled`].
    fn record(&mut self, step: Step);

    /// Whether a [`Step::Dropped`] is wanted: a bounded sink keeps only so many candidates set
    /// aside (and counts the others), so a service with many endpoints costs it no more.
    fn wants_drop(&mut self) -> bool {
        self.enabled()
    }
}

/// The data path's sink: keeps nothing, so nothing is built.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NoTrace;

// === impl NoTrace ===

impl Trace for NoTrace {
    fn enabled(&self) -> bool {
        false
    }

    fn record(&mut self, _: Step) {}
}

/// `ferry explain`'s sink: every step, in order.
impl Trace for Vec<Step> {
    fn enabled(&self) -> bool {
        true
    }

    fn record(&mut self, step: Step) {
        self.push(step);
    }
}

/// The role of a candidate that was set aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateRole {
    Endpoint,
    WaypointEndpoint,
}

/// Why a candidate was set aside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DropReason {
    /// The scope of `service` does not admit the source's cluster for the candidate's cluster.
    OutOfScope {
        service: ServiceKey,
        rule: ScopeRule,
        source_cluster: ClusterId,
    },
    /// A workload-attached waypoint on another network.
    WaypointOnOtherNetwork {
        network: NetworkId,
    },
    /// On another network, and nothing carries traffic there.
    Unreachable {
        network: NetworkId,
        why: &'static str,
    },
    /// The workload does not back the requested service port.
    PortNotMapped {
        port: u16,
    },
    /// Not in the subset an HTTP route asked for.
    NotInSubset {
        subset: String,
    },
    /// An earlier attempt of this connection failed to connect to it (a retry).
    FailedBefore,
    /// Ejected by this node's outlier detection: its connects kept failing.
    Ejected,
    /// A waypoint instance in front of dead backends of `service` (endpoints near it, none
    /// usable), while another has usable ones near it.
    NoLiveBackendsNear {
        service: ServiceKey,
        near: Near,
    },
    Balancer(LbDrop),
}

/// One step of a decision, in the order it was taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "step")]
pub enum Step {
    Classified {
        destination: String,
        class: Class,
    },
    WaypointRequired {
        waypoint: String,
        attached_to: String,
    },
    WaypointSkipped {
        waypoint: String,
        why: &'static str,
    },
    Dropped {
        role: CandidateRole,
        candidate: String,
        cluster: ClusterId,
        reason: DropReason,
    },
    Picked {
        role: CandidateRole,
        candidate: String,
        cluster: ClusterId,
        network: NetworkId,
        /// How many routing preferences the pick shares with the source.
        rank: usize,
        among: usize,
    },
    /// Waypoints chosen by what they reach: the usable capacity of `service` near each
    /// instance (by its label), at the nearness `near`; recorded when it sets an instance aside.
    WaypointReach {
        service: ServiceKey,
        near: Near,
        instances: Vec<(String, u64)>,
    },
    /// Graduated failover: the locality tiers, best first, and the share of new connections each
    /// takes (the pick that follows was drawn by these shares).
    Tiers {
        role: CandidateRole,
        minimum: FailoverMinimum,
        tiers: Vec<TierShare>,
    },
    /// An endpoint that is itself a service address, resolved in this decision.
    Nested {
        outer: ServiceKey,
        address: String,
        inner: ServiceKey,
        port: u16,
    },
    Transport {
        transport: Transport,
    },
}
