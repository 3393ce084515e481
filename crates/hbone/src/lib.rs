//! HBONE: HTTP/2 CONNECT tunnels over mutual TLS 1.3, wire-compatible with Istio ambient.
//!
//! Everything that crosses a node boundary in Ferry rides in one of these tunnels. The wire
//! format, with references to the public specifications, is in `docs/hbone.md`.
//!
//! # Layout
//! - [`tls`]: rustls configurations; SPIFFE identity verification on both sides.
//! - [`san`]: reading SPIFFE identities out of certificates.
//! - [`headers`]: the CONNECT target and the headers Istio sends (`baggage`, `forwarded`,
//!   `traceparent`, `x-forwarded-network`); pure and property-tested.
//! - [`client`]: one connection and CONNECT streams over it; [`pool`]: connections shared by key.
//! - [`server`]: accept, verify, check, forward.
//! - [`stream`]: an HTTP/2 stream as `AsyncRead + AsyncWrite`; [`copy`]: bidirectional copy.
//! - [`testkit`] (feature `testkit`): a throwaway CA for tests.

pub mod client;
pub mod copy;
pub mod double;
pub mod error;
pub mod headers;
pub mod pool;
pub mod readahead;
pub mod san;
pub mod server;
pub mod settings;
pub mod stream;
pub mod tls;
pub mod upstream;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::{Error, Side};

/// The port HBONE is served on.
pub const HBONE_PORT: u16 = 15008;
