//! Workload TLS: the rustls configurations HBONE runs on, the SPIFFE identities in them, and
//! the node proxy's certificates.
//!
//! The node proxy impersonates every pod on its node, so it holds one certificate per workload
//! identity. [`certs::CertManager`] fetches them on demand (first connection) and ahead of
//! time, caches them, rotates them at a fraction of their lifetime, retries with backoff and
//! jitter while the CA is away (keeping a still-valid certificate meanwhile, never an expired
//! one), drops those of workloads that left the node, and sends one CSR for concurrent first
//! requests. [`ca_client::GrpcCa`] asks `ferry control`'s CA over TLS, authenticated with the
//! node credential. Private keys are generated here and never leave the process.
//!
//! # Layout
//! - [`config`]: rustls client and server configurations (TLS 1.3, AES-GCM, ALPN `h2`); SPIFFE
//!   identity verification on both sides; [`config::Credentials`] and [`config::TrustBundle`].
//!   `san` (private) reads SPIFFE identities out of certificates.
//! - [`cluster`]: the cluster the mesh CA binds into every certificate it signs (a private,
//!   non-critical X.509 extension), read back from verified peer certificates.
//! - [`certs`]: [`certs::CertManager`], one worker per identity: single-flight, rotation,
//!   backoff, expiry.
//! - [`ca_client`]: [`ca_client::GrpcCa`], a fresh key and CSR per certificate, over gRPC with
//!   the node credential; the [`ca_client::CertificateSource`] seam tests replace.
//! - [`error`]: [`error::TlsError`] (set-up problems) and [`error::IdentityMismatch`] (a valid
//!   peer with an unexpected identity).
//! - [`secret_file`]: keys and credentials written 0600.
//! - [`testkit`] (feature `testkit`): a throwaway CA (rcgen) for tests of every crate.

pub mod ca_client;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod error;
mod san;
pub mod secret_file;
mod verified;

#[cfg(feature = "testkit")]
pub mod testkit;
