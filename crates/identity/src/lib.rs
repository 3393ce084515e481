//! Workload certificates in the node proxy.
//!
//! The node proxy impersonates every pod on its node, so it holds one certificate per workload
//! identity. [`manager::CertManager`] fetches them on demand (first connection) and ahead of
//! time, caches them, rotates them at a fraction of their lifetime, retries with backoff and
//! jitter while the CA is away (keeping a still-valid certificate meanwhile, never an expired
//! one), drops those of workloads that left the node, and sends one CSR for concurrent first
//! requests. [`client::GrpcCa`] asks `ferry control`'s CA over TLS, authenticated with the node
//! credential. Private keys are generated here and never leave the process.

pub mod client;
pub mod manager;

pub use client::{CertificateSource, FetchError, GrpcCa};
pub use manager::{CertManager, CertState, ManagerConfig};
