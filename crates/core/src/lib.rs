//! Ferry's core: the mesh model and the pure decisions every Ferry hop makes.
//!
//! Nothing in this crate does I/O, reads a clock or spawns a task. Callers pass in the snapshot,
//! the connection's facts and a random source, and get back a decision they execute.
//!
//! # Layout
//! - [`identity`]: SPIFFE identities.
//! - [`model`]: clusters, nodes, workloads, services (with scope), waypoints, gateways, policies.
//! - [`peer_auth`]: Istio's PeerAuthentication (strict mutual TLS) as the authorization policies
//!   istiod makes of it.
//! - [`snapshot`]: one immutable, validated, indexed view of the mesh; [`store`] swaps it.
//! - [`route`]: the routing decision (scope, waypoints, nesting, load balancing, transport).
//! - [`inbound`]: a destination node proxy's decisions: a tunnel's target in the pod, and plain
//!   TCP through the pod's waypoint.
//! - [`app_source`]: the source address a pod's app sees: the client's, when proven.
//! - [`hop`]: the origin cluster every hop takes from the peer's certificate (never the
//!   baggage), and the destination's scope check.
//! - [`ports`]: the proxy's own ports in a pod, and the guard against calling them.
//! - [`protocol`]: what a service port speaks (Istio's protocol selection), and whether a
//!   waypoint sends its requests on as HTTP/1.1 or HTTP/2.
//! - [`lb`]: locality-aware, capacity-weighted endpoint choice.
//! - [`outlier`]: passive health: endpoints whose connects keep failing are ejected for a while.
//! - [`authz`]: L4 authorization with Istio's ALLOW / DENY / AUDIT semantics.
//! - [`dns`]: what a pod's DNS query for a name means in the mesh (scope applied), for the node
//!   proxy's DNS proxy.
//! - [`random`]: the seeded random source decisions take.
//! - [`telemetry`]: what the metrics say about a connection's ends (canonical services, the
//!   service a destination counts a connection under), as Istio derives it.
//! - `testing` (feature `testing`): `MeshBuilder`, meshes for tests and benchmarks.

#![forbid(unsafe_code)]

pub mod app_source;
pub mod authz;
pub mod dns;
pub mod hop;
pub mod identity;
pub mod inbound;
pub mod keyed_hash;
pub mod lb;
pub mod model;
pub mod outlier;
pub mod peer_auth;
pub mod ports;
pub mod protocol;
pub mod random;
pub mod route;
pub mod snapshot;
pub mod store;
pub mod telemetry;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
