//! `ferry waypoint`: the HBONE hop in front of a service or workload.
//!
//! # Layout
//! - `hop`: the HBONE handler (decide again on behalf of the original source, carry the
//!   tunnel on), its admin endpoint and `run`; `state`: the instance's state and what it opens
//!   to carry a connection; `judge`: authorization of one tunnel's requests or connection.
//! - `router`: per-request routing decisions for a tunnel's HTTP traffic.
//! - [`l7`]: the HTTP filter (detection, per-request authorization, normalization);
//!   `upstream`: upstream HTTP connections, retries, upgrades; `replay`: a stream that gives
//!   back bytes read ahead; `metrics`: request metrics; `edit`: a route's header edits;
//!   `redirect`: a route's redirect, answered by the waypoint itself.

mod edit;
mod hop;
mod judge;
pub mod l7;
mod metrics;
mod redirect;
mod replay;
mod router;
mod state;
mod upstream;

pub use hop::{Config, run};
