//! Decisions of a hop that acts for someone else's source: a waypoint or an east-west gateway.

use std::net::IpAddr;

use crate::identity::Identity;
use crate::model::{ClusterId, NetworkAddress, NetworkId, WorkloadUid};
use crate::snapshot::{AddressOwner, Snapshot};

/// The hop itself: where it stands in the mesh.
#[derive(Clone, Copy, Debug)]
pub struct Hop<'a> {
    pub cluster: &'a ClusterId,
    pub network: &'a NetworkId,
}

/// What a hop does with a tunnel that claims no origin cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unclaimed {
    /// Treat the source as in the hop's own cluster (a waypoint: its callers are local).
    OwnCluster,
    /// Refuse the tunnel (a gateway: its callers are on other networks, and scope needs it).
    Refuse,
}

/// Why a tunnel's origin cluster is not trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    #[error(
        "the tunnel claims a source in cluster {claimed}, but it comes from {workload} in cluster {actual}"
    )]
    Contradicted {
        claimed: ClusterId,
        workload: WorkloadUid,
        actual: ClusterId,
    },
    #[error("the caller did not say which cluster it is in (baggage k8s.cluster.name)")]
    Unclaimed,
}

/// The cluster of a tunnel's original source, which scope is checked against.
///
/// `claim` is the `k8s.cluster.name` the caller's node proxy put in the baggage. It is checked
/// against the mesh wherever it can be: when the tunnel's TCP peer (`peer_ip`, on the hop's
/// network) is a workload presenting its own identity (`peer`; a node proxy dials from inside
/// its pod), that workload's cluster is the answer, and a claim of another cluster is refused.
/// Otherwise the claim stands, and without one `unclaimed` decides.
pub fn origin_cluster(
    snap: &Snapshot,
    hop: Hop<'_>,
    claim: Option<&ClusterId>,
    peer_ip: IpAddr,
    peer: &Identity,
    unclaimed: Unclaimed,
) -> Result<ClusterId, OriginError> {
    let at = NetworkAddress::new(hop.network.clone(), peer_ip);
    let known = match snap.owner(&at) {
        Some(AddressOwner::Workload(uid)) => snap
            .workload(uid)
            .filter(|w| w.identity().ok().as_ref() == Some(peer)),
        _ => None,
    };
    match (known, claim) {
        (Some(w), Some(c)) if *c != w.cluster => Err(OriginError::Contradicted {
            claimed: c.clone(),
            workload: w.uid.clone(),
            actual: w.cluster.clone(),
        }),
        (Some(w), _) => Ok(w.cluster.clone()),
        (None, Some(c)) => Ok(c.clone()),
        (None, None) => match unclaimed {
            Unclaimed::OwnCluster => Ok(hop.cluster.clone()),
            Unclaimed::Refuse => Err(OriginError::Unclaimed),
        },
    }
}

#[cfg(test)]
#[path = "hop_tests.rs"]
mod tests;
