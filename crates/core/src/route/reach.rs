//! Waypoints chosen by what they can reach (ztunnel#1555, istio#56272): a waypoint instance near
//! live backends of the service beats a nearer one in front of dead ones.
//!
//! For each admissible instance the decision adds up the capacity of the service's usable
//! endpoints *near* it: in scope for the source's cluster, serving (healthy, or unhealthy when the
//! service's health policy allows it; never terminating), capacity above 0, on the instance's
//! network and in its region and zone. If no instance has any that near, region alone counts. If
//! none has any even then, or the service has address endpoints (their locality is unknown),
//! reachability says nothing and the instances are balanced as before. Otherwise instances that
//! reach nothing are set aside and the rest are weighted by what they reach. Only instances that
//! already passed the scope and network filters are judged, so this never widens the choice.

use serde::Serialize;

use crate::model::{ClusterId, Health, HealthPolicy, Service, Workload};
use crate::snapshot::{Endpoint, Snapshot};

/// How near a backend must be to count for an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Near {
    /// The instance's network, region and zone.
    Zone,
    /// The instance's network and region.
    Region,
}

impl Near {
    fn holds(self, inst: &Workload, b: &Workload) -> bool {
        inst.network == b.network
            && inst.locality.region == b.locality.region
            && (self == Self::Region || inst.locality.zone == b.locality.zone)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Zone => "zone",
            Self::Region => "region",
        }
    }
}

/// The live capacity of `svc` near each of `instances` (in order), and at what nearness; `None`
/// when reachability says nothing (see the module docs).
pub(super) fn reach(
    snap: &Snapshot,
    svc: &Service,
    origin: &ClusterId,
    instances: &[&Workload],
) -> Option<(Near, Vec<u64>)> {
    let allow_unhealthy = svc
        .load_balancing
        .as_ref()
        .is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll);
    let mut live = Vec::new();
    for ep in snap.endpoints(&svc.key()) {
        let Endpoint::Workload(uid) = ep else {
            return None;
        };
        let Some(b) = snap.workload(uid) else {
            continue;
        };
        let serving = match b.health {
            Health::Healthy => true,
            Health::Unhealthy => allow_unhealthy,
            Health::Terminating => false,
        };
        if serving && b.capacity > 0 && svc.scope.admits(&b.cluster, origin) {
            live.push(&**b);
        }
    }
    [Near::Zone, Near::Region].into_iter().find_map(|near| {
        let by_instance: Vec<u64> = instances
            .iter()
            .map(|inst| {
                live.iter()
                    .filter(|b| near.holds(inst, b))
                    .map(|b| u64::from(b.capacity))
                    .sum()
            })
            .collect();
        by_instance
            .iter()
            .any(|r| *r > 0)
            .then_some((near, by_instance))
    })
}
