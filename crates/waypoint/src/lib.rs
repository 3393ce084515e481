//! `ferry waypoint`: the HBONE hop in front of a service or workload.
//!
//! # Layout
//! - [`hop`]: the HBONE handler (decide again on behalf of the original source, carry the
//!   tunnel on), its admin endpoint and `run`.
//! - `router`: per-request routing decisions for a tunnel's HTTP traffic.
//! - [`l7`]: the HTTP filter (detection, per-request authorization, normalization);
//!   `upstream`: upstream HTTP connections, retries, upgrades; `metrics`: request metrics.

pub mod hop;
pub mod l7;
mod metrics;
mod router;
mod upstream;

pub use hop::{Config, run};
