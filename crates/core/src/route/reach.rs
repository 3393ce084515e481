//! Waypoints chosen by what they can reach (ztunnel#1555, istio#56272): a waypoint instance in
//! front of dead backends loses to a farther one in front of live ones.
//!
//! For each admissible instance the decision looks at the service's endpoints *near* it (in
//! scope for the source's cluster, capacity above 0, on the instance's network and in its region
//! and zone) and adds up the capacity of those that are usable (healthy, or unhealthy when the
//! service's health policy allows it; never terminating). An instance is *in front of dead
//! backends* when endpoints are near it and none is usable. If some instance is and another has
//! usable endpoints near it, the first kind is set aside; else region alone is looked at the same
//! way. An instance with no endpoint near it at all is never set aside: it forwards elsewhere as
//! it always did (a waypoint sending to another network through its gateway). A service with
//! address endpoints (their locality is unknown) is balanced as before. Only instances that
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

/// What one instance has near it: the capacity of the service's endpoints there, and of the
/// usable ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Nearby {
    pub(super) all: u64,
    pub(super) live: u64,
}

/// The usable capacity of `svc` near each of `instances` (in order), at what nearness, and which
/// instances are in front of dead backends; `None` when reachability sets none aside.
pub(super) fn reach(
    snap: &Snapshot,
    svc: &Service,
    origin: &ClusterId,
    instances: &[&Workload],
) -> Option<(Near, Vec<u64>, Vec<bool>)> {
    let allow_unhealthy = svc
        .load_balancing
        .as_ref()
        .is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll);
    let endpoints = snap.endpoints_of(svc);
    let mut backends = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let Endpoint::Workload(uid) = ep else {
            return None;
        };
        let Some(b) = snap.workload(uid) else {
            continue;
        };
        if b.capacity > 0 && svc.scope.admits(&b.cluster, origin) {
            let usable = match b.health {
                Health::Healthy => true,
                Health::Unhealthy => allow_unhealthy,
                Health::Terminating => false,
            };
            backends.push((&**b, usable));
        }
    }
    [Near::Zone, Near::Region].into_iter().find_map(|near| {
        let by_instance: Vec<Nearby> = instances
            .iter()
            .map(|inst| {
                let mut n = Nearby::default();
                for (b, usable) in backends.iter().filter(|(b, _)| near.holds(inst, b)) {
                    n.all += u64::from(b.capacity);
                    if *usable {
                        n.live += u64::from(b.capacity);
                    }
                }
                n
            })
            .collect();
        let dead: Vec<bool> = by_instance
            .iter()
            .map(|n| n.all > 0 && n.live == 0)
            .collect();
        let some_live = by_instance.iter().any(|n| n.live > 0);
        (some_live && dead.iter().any(|d| *d))
            .then(|| (near, by_instance.iter().map(|n| n.live).collect(), dead))
    })
}
