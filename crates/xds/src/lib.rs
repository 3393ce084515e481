//! The mesh over delta ADS, wire-compatible with Istio's workload discovery (WDS).
//!
//! # Layout
//! - [`convert`]: model <-> `istio.workload.Address` / `istio.security.Authorization`.
//! - [`resources`]: versioned resource sets and their differences.
//! - [`assemble`]: a data-plane snapshot from decoded resources.
//! - [`server`]: `DeltaAggregatedResources` in `ferry control`.
//! - [`client`]: the subscriber in `ferry node`.

pub mod assemble;
pub mod client;
pub mod convert;
pub mod flatten;
pub mod metrics_http;
pub mod resources;
pub mod server;
pub mod source;
