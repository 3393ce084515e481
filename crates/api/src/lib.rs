//! Ferry's wire types, generated at build time from `proto/`.
//!
//! Packages, message names and field numbers are those of Istio's public APIs, so that Ferry
//! interoperates with istiod and ztunnel; the `.proto` texts are Ferry's own.

// Generated code: its style is prost's and tonic's, not ours.
#![allow(
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

/// `istio.v1.auth`: the certificate service a node proxy asks for workload certificates.
pub mod citadel {
    tonic::include_proto!("istio.v1.auth");
}
