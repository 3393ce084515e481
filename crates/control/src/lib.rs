//! The control plane, `ferry control`: the mesh CA and the delta-ADS server on one gRPC port,
//! fed by a watched topology file.
//!
//! # Layout
//! - [`admission`]: connections per peer address, capped at accept.
//! - [`ca`]: the mesh CA (root, CSRs, node tokens, the co-location rule, the gRPC service).
//! - [`xds_server`]: `DeltaAggregatedResources`: initial state on subscribe, then differences.
//! - [`flatten`]: nested service addresses resolved once, before they go on the wire.
//! - [`served`]: what is served for a mesh, kept so that an edit encodes only what it changed.
//! - [`source`]: the topology file, watched for edits.
//! - [`metrics`]: the Prometheus endpoint for the xDS counters.
//! - [`nodes`]: the programs connected over xDS and their admin addresses (for the mesh map).
//! - [`app`]: the composition root `ferry control serve` runs.
//! - `testing` (feature `testing`): a generated topology of any size, for tests and benches.
//!
//! The wire conversion, resource sets and the client are in `ferry-xds`.

pub mod admission;
pub mod app;
pub mod ca;
pub mod flatten;
pub mod kube_source;
pub mod metrics;
pub mod nodes;
pub mod served;
pub mod source;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod xds_server;
