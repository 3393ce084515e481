//! The mesh model: plain data with Istio's `istio.workload` / `istio.security` field meanings,
//! so that the xDS layer can map it onto the wire field by field.

mod gateway;
mod http_route;
mod names;
mod peer_authentication;
mod policy;
mod redirect;
mod service;
mod shared;
mod topology;
mod workload;

pub use gateway::Gateway;
pub use http_route::{
    HTTP_METHODS, HeaderEditError, HeaderModifier, HttpRoute, PathMatch, RouteBackend, RouteMatch,
    UNEDITABLE_HEADERS,
};
pub use names::{
    ClusterId, NetworkAddress, NetworkId, NodeName, PolicyKey, ServiceKey, WorkloadUid,
};
pub use peer_authentication::{MtlsMode, PeerAuthentication};
pub use policy::{
    Action, Cidr, Clause, HeaderMatch, InvalidCidr, Match, Policy, PolicyScope, Rule,
    ServiceAccountMatch, StringMatch,
};
pub use redirect::{
    REDIRECT_STATUSES, RedirectError, RedirectPath, RedirectRequest, RedirectScheme,
    RequestRedirect, host_without_port, is_dns_name, replace_prefix,
};
pub use service::{
    AddressEndpoint, AppProtocol, FailoverMinimum, GatewayDestination, GatewayRef, HealthPolicy,
    LbMode, LoadBalancing, LocalityScope, ScopeRule, Service, ServicePort, ServiceScope,
    WaypointFor,
};
pub use shared::SharedMap;
pub use topology::{Cluster, Locality, Node};
pub use workload::{Health, PortMapping, TunnelProtocol, Workload};

/// The port a node proxy serves HBONE on, inside every enrolled pod's network namespace.
pub const HBONE_PORT: u16 = 15008;
