//! The mesh over delta ADS, wire-compatible with Istio's workload discovery (WDS).
//!
//! # Layout
//! - [`convert`]: model <-> `istio.workload.Address` / `istio.security.Authorization`.
//! - [`resources`]: versioned resource sets and their differences.
//! - [`assemble`]: a data-plane snapshot from decoded resources.
//! - [`incremental`]: a push applied as a delta to the snapshot served, equal to assembling
//!   everything held; `index`, what it keeps beside the held resources.
//! - [`client`]: the subscriber the data-plane programs share (through `ferry_runtime::bootstrap`);
//!   [`client::XdsClient::changes`] tells when a new snapshot is applied.
//!
//! The server side (`DeltaAggregatedResources`, flattening, the watched topology file) is in
//! `ferry-control`; this crate depends on neither the CA nor the topology file format.

pub mod assemble;
pub mod client;
pub mod convert;
pub mod incremental;
mod index;
pub mod resources;
