//! `ferry node`: the per-node proxy.
//!
//! For each enrolled pod it opens listeners *inside the pod's network namespace* (outbound
//! 15001, inbound plain 15006, HBONE 15008) and installs redirect rules there; it impersonates
//! the pod's identity with a certificate from the CA; it routes with `ferry_core::route`, tunnels
//! with `ferry_hbone`, and authorizes at the destination with `ferry_core::authz`.
//!
//! # Layout
//! - [`app`]: configuration and the composition root (xDS, certificates, pool, API, admin, drain).
//! - [`node`]: state and pod enrollment; [`api`]: the node-local enrollment API.
//! - [`netns`]: sockets inside pods' namespaces; [`capture`]: the iptables rules.
//! - [`outbound`], [`inbound`]: the two directions; [`telemetry`]: access log and metrics.
//! - [`admin`]: readiness, config dump, certificates, metrics.

pub mod accept;
pub mod admin;
pub mod api;
pub mod app;
pub mod capture;
pub mod conns;
pub mod enrollment;
pub mod gateway;
pub mod inbound;
pub mod l7;
pub mod l7_metrics;
pub mod l7_upstream;
mod memory;
pub mod netns;
pub mod node;
pub mod outbound;
mod sockets;
pub mod telemetry;
pub mod waypoint;
mod waypoint_router;
