//! Kubernetes service-account tokens as node credentials, as istiod accepts them.
//!
//! A stock node proxy (Istio's ztunnel) authenticates with its projected service-account token,
//! a JWT signed by its cluster's API server, bound to its own pod. `ferry control` checks it
//! without an API server: the signature against the issuing cluster's keys (OIDC discovery, or a
//! JWKS URL or file given per cluster), the audience, the lifetime; then the pod binding names
//! the node (the `kubernetes.io.node` claim of Kubernetes 1.30+, else the pod's node in the
//! topology), and the CA's co-location rule applies to that node as to a Ferry node token.
//!
//! # Layout
//! - [`config`]: the issuers per cluster, the audiences, the node-proxy service accounts.
//! - [`binding`]: the claims and the node they bind to (pure, over the snapshot).
//! - [`keys`]: each cluster's signing keys, cached, refetched on an unknown `kid`.
//! - [`fetch`]: a small HTTP(S) GET for discovery documents and key sets.
//! - [`verify`]: a token to a node: the whole check, with the reason of a refusal.

pub mod binding;
pub mod config;
pub mod fetch;
pub mod keys;
pub mod verify;

pub use binding::Denial;
pub use config::{ClusterIssuer, K8sConfig, KeySource, ServiceAccount};
pub use verify::K8sTokens;
