//! The decisions of a destination's node proxy: where a tunnel's target lands in the pod, and
//! whether plain TCP arriving for the pod must go through its waypoint first.
//!
//! Pure functions over the snapshot. The node proxy calls them with what it knows about the
//! connection and executes the [`InboundPlan`]; authorization ([`crate::authz`]) is separate.

use std::net::{IpAddr, SocketAddr};

use crate::identity::Identity;
use crate::model::{ClusterId, Health, ServiceKey, Workload, WorkloadUid};
use crate::ports::{RecursiveCall, refuse_recursion};
use crate::route::{Destination, WaypointInstances};
use crate::snapshot::Snapshot;

/// Why a connection arriving for a pod is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InboundError {
    #[error("{target} is not this pod ({pod})")]
    NotThisPod { target: SocketAddr, pod: IpAddr },
    #[error("the pod left the mesh")]
    LeftMesh,
    #[error("this pod serves no service {hostname}")]
    NoSuchService { hostname: String },
    #[error("service {service} has no port {port}")]
    NoSuchPort { service: ServiceKey, port: u16 },
    #[error("service {service} port {port} maps to no port of this pod")]
    PortNotMapped { service: ServiceKey, port: u16 },
    #[error(transparent)]
    Recursive(#[from] RecursiveCall),
}

// === impl InboundError ===

impl InboundError {
    /// Whether the request itself is wrong (HTTP 400), rather than this pod being unable to
    /// serve it as the mesh stands (HTTP 503).
    pub fn is_bad_request(&self) -> bool {
        match self {
            Self::NotThisPod { .. } | Self::NoSuchPort { .. } | Self::Recursive(_) => true,
            Self::LeftMesh | Self::NoSuchService { .. } | Self::PortNotMapped { .. } => false,
        }
    }
}

/// How a connection arrived for the pod.
#[derive(Clone, Copy, Debug)]
pub enum Arrival<'t> {
    /// An HBONE tunnel asking for `target` (its CONNECT authority).
    Tunnel(&'t Destination),
    /// Plain TCP captured on its way to `orig` (the original destination).
    Plain(SocketAddr),
}

/// What the node proxy does with a connection arriving for one of its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboundPlan {
    /// Connect to this address in the pod's namespace.
    Deliver(SocketAddr),
    /// Plain TCP to a pod behind a waypoint: tunnel it to this waypoint instance first.
    ViaWaypoint(WaypointInstance),
    Refuse(InboundError),
}

/// The waypoint instance plain traffic to a pod goes through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaypointInstance {
    /// The instance's HBONE address.
    pub hbone: SocketAddr,
    /// The identity the instance must present.
    pub identity: Identity,
    pub instance: WorkloadUid,
    /// The waypoint service.
    pub waypoint: ServiceKey,
    /// The cluster the traffic is admitted for (the pod's): what the tunnel's baggage claims.
    pub cluster: ClusterId,
}

/// Decides what happens to a connection arriving for the pod `pod` (at `pod_ip`):
///
/// - a tunnel is delivered to its resolved target ([`resolve_target`]);
/// - plain TCP goes through the pod's waypoint if it has one with an eligible instance
///   ([`waypoint_instance`]), and is delivered to the original port otherwise;
/// - either is refused if it would land on one of the proxy's own ports.
pub fn plan_inbound(
    snap: &Snapshot,
    pod: &WorkloadUid,
    pod_ip: IpAddr,
    arrival: Arrival<'_>,
) -> InboundPlan {
    let planned = match arrival {
        Arrival::Tunnel(target) => plan_tunnel(snap, pod, pod_ip, target),
        Arrival::Plain(orig) => plan_plain(snap, pod, pod_ip, orig),
    };
    planned.unwrap_or_else(InboundPlan::Refuse)
}

fn plan_tunnel(
    snap: &Snapshot,
    pod: &WorkloadUid,
    pod_ip: IpAddr,
    target: &Destination,
) -> Result<InboundPlan, InboundError> {
    let to = resolve_target(snap, pod, pod_ip, target)?;
    refuse_recursion(pod_ip, to)?;
    Ok(InboundPlan::Deliver(to))
}

fn plan_plain(
    snap: &Snapshot,
    pod: &WorkloadUid,
    pod_ip: IpAddr,
    orig: SocketAddr,
) -> Result<InboundPlan, InboundError> {
    let to = SocketAddr::new(pod_ip, orig.port());
    refuse_recursion(pod_ip, to)?;
    let w = snap.workload(pod).ok_or(InboundError::LeftMesh)?;
    Ok(match waypoint_instance(snap, w) {
        Some(via) => InboundPlan::ViaWaypoint(via),
        None => InboundPlan::Deliver(to),
    })
}

/// Where a tunnel to the pod `pod` (at `pod_ip`) lands: an `ip:port` target must be the pod's
/// own address; a `hostname:port` target (the inner tunnel of double HBONE) maps to the port of
/// that service which the pod serves ([`Workload::serving_port`]).
pub fn resolve_target(
    snap: &Snapshot,
    pod: &WorkloadUid,
    pod_ip: IpAddr,
    target: &Destination,
) -> Result<SocketAddr, InboundError> {
    match target {
        Destination::Addr(a) if a.ip() == pod_ip => Ok(*a),
        Destination::Addr(a) => Err(InboundError::NotThisPod {
            target: *a,
            pod: pod_ip,
        }),
        Destination::Host { hostname, port } => {
            let w = snap.workload(pod).ok_or(InboundError::LeftMesh)?;
            let no_service = || InboundError::NoSuchService {
                hostname: hostname.clone(),
            };
            let key = snap
                .services_by_hostname(hostname)
                .iter()
                .find(|k| w.services.contains_key(*k))
                .ok_or_else(no_service)?;
            let svc = snap.service(key).ok_or_else(no_service)?;
            let sp = svc.port(*port).ok_or_else(|| InboundError::NoSuchPort {
                service: key.clone(),
                port: *port,
            })?;
            match w.serving_port(key, sp) {
                0 => Err(InboundError::PortNotMapped {
                    service: key.clone(),
                    port: *port,
                }),
                p => Ok(SocketAddr::new(pod_ip, p)),
            }
        }
    }
}

/// The waypoint instance plain traffic to `dst` must go through, if `dst` has a waypoint (its
/// own, or the first of the services it backs) served by a waypoint service.
///
/// The candidates are the waypoint's instances that its scope admits for `dst`'s cluster
/// ([`WaypointInstances::admits`], the filter the routing decision applies too), healthy, on
/// `dst`'s network, with an address and an identity. The pick rule is this side's own: `dst`'s
/// cluster first, then the lowest uid, so the choice is stable (no load balancing: the traffic
/// comes from outside the mesh, there is no source to balance for).
pub fn waypoint_instance(snap: &Snapshot, dst: &Workload) -> Option<WaypointInstance> {
    let wp = dst.waypoint.as_ref().or_else(|| {
        dst.services
            .keys()
            .filter_map(|k| snap.service(k))
            .find_map(|s| s.waypoint.as_ref())
    })?;
    let set = WaypointInstances::resolve(snap, wp)?;
    let key = set.key?;
    set.instances
        .iter()
        .filter(|i| {
            i.health == Health::Healthy && i.network == dst.network && set.admits(i, &dst.cluster)
        })
        .filter_map(|i| Some((*i, *i.addresses.first()?, i.identity().ok()?)))
        .min_by_key(|(i, _, _)| (i.cluster != dst.cluster, &i.uid))
        .map(|(i, ip, identity)| WaypointInstance {
            hbone: SocketAddr::new(ip, wp.hbone_port),
            identity,
            instance: i.uid.clone(),
            waypoint: key.clone(),
            cluster: dst.cluster.clone(),
        })
}

#[cfg(test)]
#[path = "inbound_tests.rs"]
mod tests;
