//! Ferry's wire types, generated at build time from `proto/`.
//!
//! Packages, message names and field numbers are those of Istio's and Envoy's public APIs, so
//! that Ferry interoperates with istiod and ztunnel; the `.proto` texts are Ferry's own. Modules
//! nest like the protobuf packages (generated code refers across them); short aliases follow.

// Generated code: its style is prost's and tonic's, not ours.
#![allow(
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

pub mod istio {
    pub mod v1 {
        /// `istio.v1.auth`: the certificate service.
        pub mod auth {
            tonic::include_proto!("istio.v1.auth");
        }
    }
    /// `istio.workload`: workloads and services.
    pub mod workload {
        tonic::include_proto!("istio.workload");

        /// `istio.workload.zds`: the node agent's protocol (pods handed to the node proxy
        /// with their network namespace as a file descriptor).
        pub mod zds {
            tonic::include_proto!("istio.workload.zds");
        }
    }
    /// `istio.security`: authorization policies.
    pub mod security {
        tonic::include_proto!("istio.security");
    }
}

pub mod envoy {
    pub mod service {
        pub mod discovery {
            /// `envoy.service.discovery.v3`: delta ADS.
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
}

pub mod google {
    /// `google.rpc.Status`, carried in NACKs.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Istio's upstream messages without Ferry's extension fields (feature `stock`): what a stock
/// peer such as ztunnel decodes from Ferry's resources. Same packages and type URLs.
#[cfg(feature = "stock")]
pub mod stock {
    /// `istio.workload`, upstream fields only.
    pub mod workload {
        include!(concat!(env!("OUT_DIR"), "/stock/istio.workload.rs"));
    }
    /// `istio.security`, upstream fields only (`Action` has ALLOW and DENY only).
    pub mod security {
        include!(concat!(env!("OUT_DIR"), "/stock/istio.security.rs"));
    }
}

pub use envoy::service::discovery::v3 as discovery;
pub use istio::security;
pub use istio::v1::auth as citadel;
pub use istio::workload;
pub use istio::workload::zds;

/// The type URL of `istio.workload.Address` resources.
pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
/// The type URL of `istio.security.Authorization` resources.
pub const AUTHORIZATION_TYPE: &str = "type.googleapis.com/istio.security.Authorization";
