//! The routing decision: where a captured connection goes, and why.
//!
//! [`route`] is a pure function of (source, destination, snapshot, random source). It returns a
//! [`Decision`]: the [`Plan`] the node proxy executes (or the [`RouteError`] it fails the
//! connection with), and every [`Step`] taken on the way, which `ferry explain` prints. The data
//! path calls [`plan`] instead: the same decision, its steps sent to [`NoTrace`], so none is
//! built ([`route_traced`] takes any [`Trace`] sink). Invariants it keeps, whatever the snapshot:
//!
//! - **Scope**: an endpoint or waypoint endpoint is a candidate only if the scope of the service
//!   being reached admits the source's cluster for that endpoint's cluster. No candidate, no
//!   connection: it never falls back outside the scope. A waypoint's own scope can only narrow
//!   this further.
//! - **Workload waypoints** are chosen only on the source's network.
//! - **Nested service addresses** (a service endpoint that is itself a service VIP) are resolved
//!   inside the same decision, with the inner service's scope and waypoint, to a workload: the
//!   connection is captured, and tunnelled, once.
//! - **Reachability**: the next hop is on the source's network, or is an east-west gateway.

mod compact;
mod decide;
mod destination;
pub mod http;
mod reach;
mod service;
#[cfg(test)]
mod tests;
mod trace;
mod transport;
mod waypoint;

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

pub use compact::Compact;
pub(crate) use decide::resolve_host;
#[cfg(test)]
use decide::route_traced;
pub use decide::{Family, Within, plan, plan_compact, plan_within, route, route_within};
pub use destination::{BadAuthority, Destination, valid_hostname};
pub use reach::Near;
pub use trace::{CandidateRole, DropReason, Step};
pub(crate) use trace::{NoTrace, Trace};
pub(crate) use waypoint::WaypointInstances;

use crate::identity::Identity;
use crate::lb::Placement;
use crate::model::{ClusterId, Locality, NetworkId, ServiceKey, Workload, WorkloadUid};
use crate::outlier::Ejected;

/// Who is connecting.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// The workload connecting; `None` for a hop that is no workload (an east-west gateway),
    /// which is then never taken for an instance of a waypoint by its addresses or services.
    pub workload: Option<&'a Workload>,
    /// Where it stands: the network it dials on (reachability, addresses), and its cluster,
    /// node and locality (load-balancing preferences).
    pub placement: Placement<'a>,
    /// The namespace a hostname naming several services resolves in.
    pub namespace: &'a str,
    /// The cluster scope is checked against: the workload's own, or, at a waypoint, the cluster
    /// of the original source it acts for.
    pub origin_cluster: &'a ClusterId,
    /// At an east-west gateway: the (verified) identity of the peer that sent the tunnel. A
    /// waypoint one of whose instances presents it has already been passed, so it is skipped
    /// (the waypoint sends to endpoints on other networks through their gateway).
    pub sent_by: Option<&'a Identity>,
    /// Endpoints and waypoint instances a connect to has just failed, before any byte was sent:
    /// set aside, so that a retry picks another from the same decision.
    pub excluded: &'a [WorkloadUid],
    /// Endpoints and waypoint instances this node's outlier detection has ejected: set aside
    /// like unhealthy ones (the trace says "ejected").
    pub ejected: &'a Ejected,
}

/// No ejection in force.
static NONE_EJECTED: Ejected = Ejected::NONE;

/// The locality of a hop that is no workload: none, so no locality preference matches it.
static NO_LOCALITY: Locality = Locality {
    region: String::new(),
    zone: String::new(),
    subzone: String::new(),
};

impl<'a> Source<'a> {
    pub fn new(workload: &'a Workload) -> Self {
        Self::on_behalf_of(workload, &workload.cluster)
    }

    /// A hop (a waypoint) acting for a source in `origin_cluster`.
    pub fn on_behalf_of(workload: &'a Workload, origin_cluster: &'a ClusterId) -> Self {
        Self {
            workload: Some(workload),
            placement: Placement {
                cluster: &workload.cluster,
                network: &workload.network,
                node: workload.node.as_ref(),
                locality: &workload.locality,
            },
            namespace: &workload.namespace,
            origin_cluster,
            sent_by: None,
            excluded: &[],
            ejected: &NONE_EJECTED,
        }
    }

    /// A hop that is no workload (an east-west gateway), standing on `network` in `cluster`
    /// under `identity` (whose namespace resolves ambiguous hostnames), acting for a source in
    /// `origin_cluster`. On no node and in no locality.
    pub fn hop(
        network: &'a NetworkId,
        cluster: &'a ClusterId,
        identity: &'a Identity,
        origin_cluster: &'a ClusterId,
    ) -> Self {
        Self {
            workload: None,
            placement: Placement {
                cluster,
                network,
                node: None,
                locality: &NO_LOCALITY,
            },
            namespace: identity.namespace(),
            origin_cluster,
            sent_by: None,
            excluded: &[],
            ejected: &NONE_EJECTED,
        }
    }

    /// The tunnel was sent by `peer` (an east-west gateway's caller): a waypoint whose
    /// instance `peer` is counts as passed.
    pub fn sent_by(self, peer: &'a Identity) -> Self {
        Self {
            sent_by: Some(peer),
            ..self
        }
    }

    /// Outlier detection's ejections (this node's): set aside.
    pub fn ejecting(self, ejected: &'a Ejected) -> Self {
        Self { ejected, ..self }
    }

    /// A retry: `failed` (the landings of earlier attempts) are set aside.
    pub fn excluding(self, failed: &'a [WorkloadUid]) -> Self {
        Self {
            excluded: failed,
            ..self
        }
    }
}

/// What the destination turned out to be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Class {
    Service {
        service: ServiceKey,
        port: u16,
    },
    Workload {
        workload: WorkloadUid,
        port: u16,
    },
    /// Not a mesh address: passed through untouched.
    OutsideMesh,
    /// An east-west gateway's address: infrastructure, passed through untouched.
    Gateway {
        name: String,
    },
}

/// How the node proxy carries the connection to its next hop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Transport {
    /// HTTP/2 CONNECT over mutual TLS to a node proxy (or waypoint) on the source's network.
    Hbone {
        connect_to: SocketAddr,
        /// The CONNECT `:authority`.
        authority: String,
        /// The TLS peer must present one of these.
        identities: Vec<Identity>,
    },
    /// Double HBONE: an outer tunnel to another network's east-west gateway, carrying an inner
    /// tunnel to the destination.
    GatewayHbone {
        gateway: SocketAddr,
        gateway_identity: Identity,
        /// `hostname:port`: the gateway resolves it on its own network.
        authority: String,
        identities: Vec<Identity>,
    },
    /// Plain TCP to a workload that is not enrolled in the mesh.
    Tcp { connect_to: SocketAddr },
    /// Plain TCP to an address outside the mesh, untouched.
    Passthrough { connect_to: SocketAddr },
}

impl Transport {
    /// The address the node proxy dials.
    pub fn dial(&self) -> SocketAddr {
        match self {
            Self::Hbone { connect_to, .. }
            | Self::Tcp { connect_to }
            | Self::Passthrough { connect_to } => *connect_to,
            Self::GatewayHbone { gateway, .. } => *gateway,
        }
    }

    /// The identities the TLS handshake must accept (the inner ones for double HBONE).
    pub fn identities(&self) -> &[Identity] {
        match self {
            Self::Hbone { identities, .. } | Self::GatewayHbone { identities, .. } => identities,
            Self::Tcp { .. } | Self::Passthrough { .. } => &[],
        }
    }
}

/// What the node proxy does with the connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub class: Class,
    /// The service finally served, after nested addresses were resolved.
    pub service: Option<ServiceKey>,
    /// The waypoint the connection goes through, if any.
    pub waypoint: Option<String>,
    /// The workload the bytes land on: a waypoint instance, or the destination endpoint.
    pub landing: Option<WorkloadUid>,
    /// The port on the landing workload (the target port, or the service port at a waypoint).
    pub landing_port: u16,
    pub transport: Transport,
}

/// Why no plan exists. The connection is failed with this reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RouteError {
    #[error("no service has hostname {hostname:?}")]
    UnknownHost { hostname: String },
    #[error(
        "hostname {hostname:?} names services in several namespaces ({candidates}); none is in the source's namespace"
    )]
    AmbiguousHost {
        hostname: String,
        candidates: String,
    },
    #[error("service {service} has no port {port}")]
    NoSuchPort { service: ServiceKey, port: u16 },
    #[error(
        "service {service}: no endpoint is eligible for a source in cluster {source_cluster} ({considered} considered; see the dropped candidates)"
    )]
    NoEndpoint {
        service: ServiceKey,
        source_cluster: ClusterId,
        considered: usize,
    },
    #[error(
        "waypoint {waypoint} (for {attached_to}): no waypoint endpoint is eligible for a source in cluster {source_cluster} ({considered} considered)"
    )]
    NoWaypointEndpoint {
        waypoint: String,
        attached_to: String,
        source_cluster: ClusterId,
        considered: usize,
    },
    #[error("waypoint reference {reference} of {attached_to} resolves to nothing")]
    UnresolvedWaypoint {
        reference: String,
        attached_to: String,
    },
    #[error("service addresses nest in a cycle: {chain}")]
    NestingCycle { chain: String },
    #[error("service addresses nest deeper than {limit}: {chain}")]
    NestingTooDeep { chain: String, limit: usize },
    #[error("workload {workload} has no address on network {network}")]
    NoAddress {
        workload: WorkloadUid,
        network: NetworkId,
    },
    #[error(
        "endpoint {endpoint} is on network {network}, and its east-west gateway {gateway} is unknown"
    )]
    UnknownGateway {
        endpoint: String,
        network: NetworkId,
        gateway: String,
    },
    #[error("the source workload has no identity: {0}")]
    SourceIdentity(String),
}

/// A routing decision with its trace.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    pub steps: Vec<Step>,
    pub outcome: Result<Plan, RouteError>,
}

/// `ip:port` (`[v6]:port`), as `SocketAddr` displays it: a tunnel's CONNECT authority, and how
/// traces name an address. An IPv4 one (the usual) is written without the formatting machinery,
/// which cost a decision as much as all its map lookups.
pub(crate) fn ip_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut text = String::with_capacity("255.255.255.255:65535".len());
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text.push('.');
                }
                text.push_str(digits.format(octet));
            }
            text.push(':');
            text.push_str(digits.format(port));
            text
        }
        IpAddr::V6(_) => SocketAddr::new(ip, port).to_string(),
    }
}

#[cfg(test)]
mod ip_port_tests {
    use std::net::{IpAddr, SocketAddr};

    use proptest::prelude::*;

    use super::ip_port;

    proptest! {
        #[test]
        fn ip_port_writes_what_socket_addr_displays(ip: IpAddr, port: u16) {
            prop_assert_eq!(ip_port(ip, port), SocketAddr::new(ip, port).to_string());
        }
    }

    #[test]
    fn ip_port_at_the_edges() {
        for (ip, port, text) in [
            ("0.0.0.0", 0, "0.0.0.0:0"),
            ("255.255.255.255", 65535, "255.255.255.255:65535"),
            ("198.18.0.10", 15008, "198.18.0.10:15008"),
            ("2001:2::1:10", 80, "[2001:2::1:10]:80"),
        ] {
            assert_eq!(ip_port(ip.parse().unwrap(), port), text);
        }
    }
}
