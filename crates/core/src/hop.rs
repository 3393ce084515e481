//! Whose scope a tunnel is judged under: the origin cluster every hop (waypoint, east-west
//! gateway, destination node proxy) takes from the tunnel's verified peer certificate.
//!
//! The mesh CA binds into every certificate it signs the cluster of whoever holds its key (the
//! node proxy of the workload, or the gateway or waypoint itself), so a hop knows its TCP peer's
//! cluster as surely as its identity ([`PeerCluster::Proven`]). The `k8s.cluster.name` in the
//! tunnel's baggage is the caller's word: a hint for logs, never an input. A peer whose
//! certificate carries no cluster (issued by another trust source, such as istiod) is
//! [`PeerCluster::Unproven`]: it reaches only what is admitted to every cluster.
//!
//! The peer is the tunnel's own peer: for double HBONE, the gateway sees the outer tunnel's
//! client and the destination the inner tunnel's (end to end, the gateway cannot read it). A
//! connection through a waypoint reaches the next hop under the waypoint's certificate, so
//! from there on the waypoint's cluster is the origin: a waypoint instance is, for the hops
//! after it, the source of the connection.

use crate::model::{
    ClusterId, NetworkAddress, NetworkId, ScopeRule, Service, ServiceKey, Workload,
};
use crate::route::Destination;
use crate::snapshot::{AddressOwner, Snapshot};

/// The hop itself: where it stands in the mesh.
#[derive(Clone, Copy, Debug)]
pub struct Hop<'a> {
    pub cluster: &'a ClusterId,
    pub network: &'a NetworkId,
}

/// What a tunnel's verified peer certificate proves about the cluster its key is held in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerCluster {
    /// The mesh CA bound this cluster into the certificate.
    Proven(ClusterId),
    /// The certificate carries no cluster: another trust source (istiod) issued it.
    Unproven,
}

// === impl PeerCluster ===

impl PeerCluster {
    /// From what the certificate carries (`ferry_tls::config::peer_cluster`).
    pub fn from_certificate(cluster: Option<ClusterId>) -> Self {
        cluster.map_or(Self::Unproven, Self::Proven)
    }

    pub fn proven(&self) -> Option<&ClusterId> {
        match self {
            Self::Proven(c) => Some(c),
            Self::Unproven => None,
        }
    }

    /// Whether `scope`'s rule for endpoints in `endpoint_cluster` admits this peer: a proven
    /// cluster as the rule says, an unproven one only where the rule is global.
    pub fn admitted_by(&self, service: &Service, endpoint_cluster: &ClusterId) -> bool {
        match self {
            Self::Proven(c) => service.scope.admits(endpoint_cluster, c),
            Self::Unproven => *service.scope.rule_for(endpoint_cluster) == ScopeRule::Global,
        }
    }
}

impl std::fmt::Display for PeerCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Proven(c) => write!(f, "{c}"),
            Self::Unproven => f.write_str("(unproven)"),
        }
    }
}

/// Why a hop refuses a tunnel for its origin.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    #[error(
        "the peer's certificate proves no cluster (it is not from the mesh CA), and {target} is not admitted to every cluster"
    )]
    Unproven { target: String },
    #[error("service {service} does not admit a source in cluster {origin} to {endpoint_cluster}")]
    OutOfScope {
        service: ServiceKey,
        origin: PeerCluster,
        endpoint_cluster: ClusterId,
    },
}

/// The cluster a waypoint or gateway decides a tunnel's target for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// What scope is checked against when routing on the tunnel's behalf.
    pub cluster: ClusterId,
    /// The peer proved no cluster; `cluster` is the hop's own, a stand-in that only globally
    /// scoped targets were let through with.
    pub unproven: bool,
    /// The baggage claimed another cluster than the certificate proves (for the log).
    pub disputed_claim: Option<ClusterId>,
}

/// The origin cluster of a tunnel reaching a waypoint or gateway (`hop`) for `target`, from its
/// peer's certificate (`peer`). `claim` (the baggage's `k8s.cluster.name`) never changes the
/// answer; it is returned when it disagrees.
///
/// A proven cluster is the answer. An unproven peer is let through only for a target every
/// service of which is admitted to every cluster ([`unproven_may_reach`]); the hop's own cluster
/// then stands in for routing.
pub fn origin_cluster(
    snap: &Snapshot,
    hop: Hop<'_>,
    peer: &PeerCluster,
    claim: Option<&ClusterId>,
    target: &Destination,
) -> Result<Origin, OriginError> {
    match peer {
        PeerCluster::Proven(c) => Ok(Origin {
            cluster: c.clone(),
            unproven: false,
            disputed_claim: claim.filter(|claimed| *claimed != c).cloned(),
        }),
        PeerCluster::Unproven if unproven_may_reach(snap, hop.network, target) => Ok(Origin {
            cluster: hop.cluster.clone(),
            unproven: true,
            disputed_claim: None,
        }),
        PeerCluster::Unproven => Err(OriginError::Unproven {
            target: target.to_string(),
        }),
    }
}

/// Whether a peer that proves no cluster may ask a hop on `network` for `target`: only if every
/// service `target` can mean admits every cluster. A hostname names its services; an address is
/// a service's VIP, or a pod's address (every service that pod serves on that port; a pod
/// serving none on it has no scope to break). Anything else (no one's address, a gateway's,
/// an unknown hostname) is refused.
pub fn unproven_may_reach(snap: &Snapshot, network: &NetworkId, target: &Destination) -> bool {
    let global = |s: &Service| {
        s.scope.default == ScopeRule::Global
            && s.scope.by_cluster.values().all(|r| *r == ScopeRule::Global)
    };
    match target {
        Destination::Host { hostname, .. } => {
            let keys = snap.services_by_hostname(hostname);
            !keys.is_empty()
                && keys
                    .iter()
                    .all(|k| snap.service(k).is_some_and(|s| global(s)))
        }
        Destination::Addr(a) => match snap.owner(&NetworkAddress::new(network.clone(), a.ip())) {
            Some(AddressOwner::Service(k)) => snap.service(k).is_some_and(|s| global(s)),
            Some(AddressOwner::Workload(uid)) => snap.workload(uid).is_some_and(|w| {
                services_on_port(snap, w, a.port())
                    .all(|(_, s)| PeerCluster::Unproven.admitted_by(s, &w.cluster))
            }),
            Some(AddressOwner::Gateway(_)) | None => false,
        },
    }
}

/// The services `pod` serves on its own port `port` (the target port a service port maps to).
pub fn services_on_port<'a>(
    snap: &'a Snapshot,
    pod: &'a Workload,
    port: u16,
) -> impl Iterator<Item = (&'a ServiceKey, &'a Service)> + 'a {
    pod.services.keys().filter_map(move |k| {
        let s = snap.service(k)?;
        s.ports
            .iter()
            .any(|sp| pod.serving_port(k, sp) == port)
            .then_some((k, &**s))
    })
}

/// The destination node proxy's scope check, the last hop's: may a tunnel whose peer proves
/// `peer` reach `pod` on its port `port`, asked for as `target`?
///
/// - `hostname:port` (the inner tunnel of double HBONE): the scope of the service it names (each
///   service of that hostname the pod serves) must admit the peer for the pod's cluster.
/// - `ip:port` (the pod's own address): the scope of **every** service the pod serves on that
///   port must admit it: the address does not say which service the source meant, so a pod
///   behind a local and a global service on one port is reached by pod address only from its own
///   cluster, and from elsewhere only by the global service's hostname. A port no service
///   maps to has no scope: allowed (authorization policies still apply).
///
/// A connection from a waypoint is judged with the waypoint's cluster (see the module
/// documentation): the waypoint checked the original source's; this checks the waypoint's.
pub fn destination_admits(
    snap: &Snapshot,
    pod: &Workload,
    target: &Destination,
    port: u16,
    peer: &PeerCluster,
) -> Result<(), OriginError> {
    let refuse = |key: &ServiceKey| OriginError::OutOfScope {
        service: key.clone(),
        origin: peer.clone(),
        endpoint_cluster: pod.cluster.clone(),
    };
    match target {
        Destination::Host { hostname, .. } => {
            for key in snap.services_by_hostname(hostname) {
                if !pod.services.contains_key(key) {
                    continue;
                }
                match snap.service(key) {
                    Some(s) if peer.admitted_by(s, &pod.cluster) => {}
                    _ => return Err(refuse(key)),
                }
            }
            Ok(())
        }
        Destination::Addr(_) => services_on_port(snap, pod, port)
            .find(|(_, s)| !peer.admitted_by(s, &pod.cluster))
            .map_or(Ok(()), |(k, _)| Err(refuse(k))),
    }
}

#[cfg(test)]
#[path = "hop_tests.rs"]
mod tests;
