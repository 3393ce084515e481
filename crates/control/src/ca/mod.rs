//! The mesh CA that `ferry control` runs.
//!
//! In the ambient design one node proxy holds the certificates of every pod on its node, so the
//! CA is what stops a node from impersonating pods elsewhere: a node proxy authenticates as its
//! node ([`token`], or a Kubernetes service-account token bound to a pod on it: [`k8s`]) and
//! gets a certificate for an identity only while a workload with that identity is scheduled on
//! that node in the current snapshot ([`authz`]). Everything else is refused with
//! `PermissionDenied` and the reason.
//!
//! # Layout
//! - [`signer`]: the root (loaded, or created and persisted), signing of CSRs.
//! - [`csr`]: CSR parsing, SPIFFE SAN, key strength.
//! - [`token`]: per-node bootstrap tokens.
//! - [`k8s`]: Kubernetes service-account tokens (a stock node proxy's credential).
//! - [`auth`]: the token checked from a request's headers, before its body is decoded (the
//!   CA's and xDS's).
//! - [`authz`]: the co-location check (pure).
//! - [`service`]: `istio.v1.auth.IstioCertificateService` over gRPC.

pub mod auth;
pub mod authz;
pub mod csr;
pub mod k8s;
pub mod service;
pub mod signer;
pub mod token;

pub(crate) use ferry_tls::secret_file::write_private;
