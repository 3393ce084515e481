//! The decisions of a destination's node proxy: where a tunnel's target lands in the pod, and
//! whether plain TCP arriving for the pod must go through its waypoint first.
//!
//! Pure functions over the snapshot. The node proxy calls them with what it knows about the
//! connection and executes the [`InboundPlan`]; authorization ([`crate::authz`]) is separate.

use std::net::{IpAddr, SocketAddr};

use crate::identity::Identity;
use crate::model::{
    ClusterId, GatewayRef, Health, NetworkAddress, NetworkId, ServiceKey, Workload, WorkloadUid,
};
use crate::ports::{RecursiveCall, refuse_recursion};
use crate::route::{Destination, Family, WaypointInstances};
use crate::snapshot::{AddressOwner, Snapshot};

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
    Ok(match waypoint_instance(snap, w, Family::of_ip(orig.ip())) {
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
/// own, or the first of the services it backs) served by a waypoint service, at the instance's
/// address of `family` (the connection's), else its first ([`Family::pick`], as routing picks).
///
/// The candidates are the waypoint's instances that its scope admits for `dst`'s cluster
/// ([`WaypointInstances::admits`], the filter the routing decision applies too), healthy, on
/// `dst`'s network, with an address and an identity. The pick rule is this side's own: `dst`'s
/// cluster first, then the lowest uid, so the choice is stable (no load balancing: the traffic
/// comes from outside the mesh, there is no source to balance for).
pub fn waypoint_instance(
    snap: &Snapshot,
    dst: &Workload,
    family: Family,
) -> Option<WaypointInstance> {
    let wp = waypoint_of(snap, dst)?;
    let set = WaypointInstances::resolve(snap, wp)?;
    let key = set.key?;
    set.instances
        .iter()
        .filter(|i| {
            i.health == Health::Healthy && i.network == dst.network && set.admits(i, &dst.cluster)
        })
        .filter_map(|i| Some((*i, family.pick(&i.addresses)?, i.identity().ok()?)))
        .min_by_key(|(i, _, _)| (i.cluster != dst.cluster, &i.uid))
        .map(|(i, ip, identity)| WaypointInstance {
            hbone: SocketAddr::new(ip, wp.hbone_port),
            identity,
            instance: i.uid.clone(),
            waypoint: key.clone(),
            cluster: dst.cluster.clone(),
        })
}

/// The waypoint in front of a workload: its own, else the first of its services' that has one.
fn waypoint_of<'a>(snap: &'a Snapshot, dst: &'a Workload) -> Option<&'a GatewayRef> {
    dst.waypoint.as_ref().or_else(|| {
        dst.services
            .keys()
            .filter_map(|k| snap.service(k))
            .find_map(|s| s.waypoint.as_ref())
    })
}

/// The instances of waypoint `wp`, if `me` is one of them.
fn instances_with<'a>(
    snap: &'a Snapshot,
    wp: Option<&'a GatewayRef>,
    me: &Workload,
) -> Option<WaypointInstances<'a>> {
    let set = WaypointInstances::resolve(snap, wp?)?;
    set.instances.iter().any(|i| i.uid == me.uid).then_some(set)
}

/// What a waypoint instance serves a tunnel's target as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fronted {
    /// A service whose waypoint it is.
    Service(ServiceKey),
    /// A workload whose waypoint (its own, or its services') it is.
    Workload(WorkloadUid),
}

/// Why a waypoint instance does not serve a tunnel's target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotFronted {
    #[error(
        "{target} is no service or workload of the mesh: a waypoint serves only what it fronts"
    )]
    Unknown { target: String },
    #[error("{target} is not served by this waypoint: a waypoint serves only what it fronts")]
    NotThisWaypoint { target: String },
    #[error(
        "this waypoint instance (cluster {instance}) is out of scope for {target} for a source in cluster {origin}"
    )]
    OutOfScope {
        target: String,
        instance: ClusterId,
        origin: ClusterId,
    },
    #[error(
        "this waypoint instance (network {instance}) does not serve {target} on network {workload} for a source on network {from_network}"
    )]
    OtherNetwork {
        target: String,
        instance: NetworkId,
        workload: NetworkId,
        from_network: NetworkId,
    },
}

/// Whether waypoint instance `me` serves a tunnel to `target` for a source in cluster `origin`
/// on network `source_network`: the check a waypoint makes before it decides anything else.
///
/// - The target names (on `me`'s network, or by hostname) a service whose waypoint `me` is an
///   instance of, or a workload whose waypoint ([`waypoint_instance`]'s: its own, else its
///   services') `me` is an instance of. Anything else is not `me`'s to serve, whatever a hop
///   before it decided.
/// - `me` must be an instance routing could have picked for that origin: the waypoint's own
///   scope admits it ([`WaypointInstances::admits`]) and, for a service, the service's scope
///   admits `me`'s cluster for `origin` (the rule for waypoint endpoints).
/// - A workload's waypoint serves its own network only: `me`, the workload and the source are
///   on one network (as routing picks workload waypoints only on the source's network).
pub fn fronted_by(
    snap: &Snapshot,
    me: &Workload,
    target: &Destination,
    origin: &ClusterId,
    source_network: &NetworkId,
) -> Result<Fronted, NotFronted> {
    let name = || target.to_string();
    let owner = match target {
        Destination::Addr(a) => snap
            .owner(&NetworkAddress::new(me.network.clone(), a.ip()))
            .cloned(),
        Destination::Host { hostname, .. } => {
            crate::route::resolve_host(snap, &me.namespace, hostname)
                .ok()
                .map(|k| AddressOwner::Service(Box::new(k)))
        }
    };
    let not_ours = || NotFronted::NotThisWaypoint { target: name() };
    let out_of_scope = || NotFronted::OutOfScope {
        target: name(),
        instance: me.cluster.clone(),
        origin: origin.clone(),
    };
    match owner {
        Some(AddressOwner::Service(key)) => {
            let svc = snap
                .service(&key)
                .ok_or_else(|| NotFronted::Unknown { target: name() })?;
            let set = instances_with(snap, svc.waypoint.as_ref(), me).ok_or_else(not_ours)?;
            if !set.admits(me, origin) || !svc.scope.admits(&me.cluster, origin) {
                return Err(out_of_scope());
            }
            Ok(Fronted::Service(*key))
        }
        Some(AddressOwner::Workload(uid)) => {
            let w = snap
                .workload(&uid)
                .ok_or_else(|| NotFronted::Unknown { target: name() })?;
            let set = instances_with(snap, waypoint_of(snap, w), me).ok_or_else(not_ours)?;
            if !set.admits(me, origin) {
                return Err(out_of_scope());
            }
            if me.network != w.network || *source_network != me.network {
                return Err(NotFronted::OtherNetwork {
                    target: name(),
                    instance: me.network.clone(),
                    workload: w.network.clone(),
                    from_network: source_network.clone(),
                });
            }
            Ok(Fronted::Workload(uid))
        }
        Some(AddressOwner::Gateway(_)) | None => Err(NotFronted::Unknown { target: name() }),
    }
}

#[cfg(test)]
#[path = "inbound_tests.rs"]
mod tests;
