//! The decision as a connection record keeps it: a [`Trace`] sink with a fixed budget, and its
//! one-line summary.
//!
//! The data path routes with it only when records are kept. It keeps at most [`MAX_STEPS`]
//! steps, of which at most [`MAX_DROPS`] candidates set aside; the decision does not even build
//! the steps past that (it asks first), so a service with thousands of endpoints costs a record
//! no more than one with five. What was left out is counted and said.

use std::fmt::Write as _;

use super::trace::Trace;
use super::{Class, DropReason, Step, Transport};
use crate::lb::LbDrop;
use crate::model::ScopeRule;

/// Steps kept in all.
pub(crate) const MAX_STEPS: usize = 12;
/// Candidates set aside that are kept (the first ones the decision met).
pub(crate) const MAX_DROPS: usize = 4;

/// A bounded trace of one decision.
#[derive(Clone, Debug, Default)]
pub struct Compact {
    steps: Vec<Step>,
    drops: usize,
    /// Steps the budget left out (candidates set aside past [`MAX_DROPS`], any step past
    /// [`MAX_STEPS`]).
    left_out: usize,
}

// === impl Compact ===

impl Compact {
    pub fn new() -> Self {
        Self::default()
    }

    /// The steps kept, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The decision in one line: `; `-separated steps, e.g. `service default/echo:80; dropped
    /// echo-b@beta (out of scope: local, source alpha); picked echo-a@alpha (rank 2 of 3); hbone
    /// to 198.18.1.21:15008`.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for step in &self.steps {
            if !out.is_empty() {
                out.push_str("; ");
            }
            write_step(&mut out, step);
        }
        if self.left_out > 0 {
            let _ = write!(out, "; (+{} more steps)", self.left_out);
        }
        out
    }
}

impl Trace for Compact {
    fn enabled(&self) -> bool {
        self.steps.len() < MAX_STEPS
    }

    fn record(&mut self, step: Step) {
        self.steps.push(step);
    }

    fn wants_drop(&mut self) -> bool {
        if self.drops < MAX_DROPS && self.enabled() {
            self.drops += 1;
            true
        } else {
            self.left_out += 1;
            false
        }
    }
}

fn write_step(out: &mut String, step: &Step) {
    // Writing to a String cannot fail.
    let _ = match step {
        Step::Classified { class, .. } => match class {
            Class::Service { service, port } => write!(out, "service {service}:{port}"),
            Class::Workload { workload, port } => write!(out, "workload {workload}:{port}"),
            Class::OutsideMesh => write!(out, "outside the mesh"),
            Class::Gateway { name } => write!(out, "east-west gateway {name}"),
        },
        Step::WaypointRequired {
            waypoint,
            attached_to,
        } => write!(out, "waypoint {waypoint} (of {attached_to})"),
        Step::WaypointSkipped { waypoint, why } => {
            write!(out, "waypoint {waypoint} skipped ({why})")
        }
        Step::Dropped {
            candidate,
            cluster,
            reason,
            ..
        } => {
            let _ = write!(out, "dropped {candidate}@{cluster} (");
            write_reason(out, reason);
            write!(out, ")")
        }
        Step::Picked {
            candidate,
            cluster,
            rank,
            among,
            ..
        } => write!(out, "picked {candidate}@{cluster} (rank {rank} of {among})"),
        Step::WaypointReach {
            service, instances, ..
        } => {
            let _ = write!(out, "reach of {service}:");
            for (label, capacity) in instances {
                let _ = write!(out, " {label}={capacity}");
            }
            Ok(())
        }
        Step::Tiers { tiers, .. } => {
            let _ = write!(out, "failover tiers");
            for t in tiers {
                let _ = write!(out, " rank{}={}ppm", t.rank, t.share_ppm);
            }
            Ok(())
        }
        Step::Nested {
            address,
            inner,
            port,
            ..
        } => write!(out, "nested {address} -> {inner}:{port}"),
        Step::Transport { transport } => match transport {
            Transport::Hbone { connect_to, .. } => write!(out, "hbone to {connect_to}"),
            Transport::GatewayHbone {
                gateway, authority, ..
            } => write!(out, "double hbone via gateway {gateway} to {authority}"),
            Transport::Tcp { connect_to } => write!(out, "plain tcp to {connect_to}"),
            Transport::Passthrough { connect_to } => write!(out, "passthrough to {connect_to}"),
        },
    };
}

fn write_reason(out: &mut String, reason: &DropReason) {
    let _ = match reason {
        DropReason::OutOfScope {
            service,
            rule,
            source_cluster,
        } => {
            let _ = write!(out, "out of scope of {service}: ");
            match rule {
                ScopeRule::Global => out.push_str("global"),
                ScopeRule::Local => out.push_str("local"),
                ScopeRule::Clusters(set) => {
                    out.push_str("clusters ");
                    for (i, c) in set.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(c.as_str());
                    }
                }
            }
            write!(out, ", source cluster {source_cluster}")
        }
        DropReason::WaypointOnOtherNetwork { network } => {
            write!(out, "workload waypoint on network {network}")
        }
        DropReason::Unreachable { network, why } => {
            write!(out, "unreachable on network {network}: {why}")
        }
        DropReason::PortNotMapped { port } => write!(out, "no port {port}"),
        DropReason::NotInSubset { subset } => write!(out, "not in subset {subset}"),
        DropReason::FailedBefore => write!(out, "failed to connect before"),
        DropReason::Ejected => write!(out, "ejected"),
        DropReason::NoLiveBackendsNear { near, .. } => {
            write!(out, "no live backends in its {}", near.as_str())
        }
        DropReason::Balancer(d) => match d {
            LbDrop::Unhealthy => write!(out, "unhealthy"),
            LbDrop::Terminating => write!(out, "terminating"),
            LbDrop::NoCapacity => write!(out, "no capacity"),
            LbDrop::LessPreferred { rank, of } => write!(out, "less near: rank {rank} of {of}"),
            LbDrop::OtherTier { rank, of } => write!(out, "other tier: rank {rank} of {of}"),
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterId, ServiceKey};

    fn dropped(i: usize) -> Step {
        Step::Dropped {
            role: super::super::CandidateRole::Endpoint,
            candidate: format!("echo-{i}"),
            cluster: ClusterId::from("beta"),
            reason: DropReason::OutOfScope {
                service: ServiceKey::new("default", "echo.default.svc.cluster.local"),
                rule: ScopeRule::Local,
                source_cluster: ClusterId::from("alpha"),
            },
        }
    }

    #[test]
    fn a_compact_trace_keeps_at_most_its_budget_and_says_what_it_left_out() {
        let mut c = Compact::new();
        let mut built = 0;
        for i in 0..50 {
            if c.wants_drop() && c.enabled() {
                built += 1;
                c.record(dropped(i));
            }
        }
        assert_eq!(built, MAX_DROPS, "no step past the budget is even built");
        for _ in 0..50 {
            if c.enabled() {
                c.record(Step::Transport {
                    transport: Transport::Passthrough {
                        connect_to: "198.18.0.1:80".parse().unwrap(),
                    },
                });
            }
        }
        assert_eq!(c.steps().len(), MAX_STEPS);
        let s = c.summary();
        assert!(
            s.starts_with(
                "dropped echo-0@beta (out of scope of default/echo.default.svc.cluster.local: local, source cluster alpha)"
            ),
            "{s}"
        );
        assert!(s.ends_with("(+46 more steps)"), "{s}");
    }
}
