//! HBONE: HTTP/2 CONNECT tunnels over mutual TLS 1.3, wire-compatible with Istio ambient.
//!
//! Everything that crosses a node boundary in Ferry rides in one of these tunnels. The wire
//! format, with references to the public specifications, is in `docs/hbone.md`.
//!
//! # Layout
//! - [`headers`]: the CONNECT target and the headers Istio sends (`baggage`, typed as
//!   [`headers::Baggage`], `forwarded`, `traceparent`, `x-forwarded-network`); pure and
//!   property-tested.
//! - [`client`]: the one TLS + HTTP/2 client handshake ([`client::handshake`]) and CONNECT
//!   streams over it; [`pool`]: connections shared by key; [`double`]: a tunnel inside a
//!   tunnel, through an east-west gateway.
//! - [`server`]: accept, verify, check, forward; [`upstream`]: what a served tunnel forwards to.
//! - [`stream`]: an HTTP/2 stream as `AsyncRead + AsyncWrite`; [`copy`]: bidirectional copy,
//!   and [`copy::relay`], which resets the side that did not fail.
//! - [`settings`]: HTTP/2 windows, limits, timeouts and keepalive; `keepalive`: PINGs while a
//!   connection carries streams, the kernel's TCP keepalive while it is idle; [`socket`]:
//!   socket helpers (`reset_tcp`).
//! - [`error`]: [`Error`] with the [`Side`] that failed; it wraps `ferry_tls`'s TLS set-up
//!   errors and identity mismatches.
//!
//! TLS itself (rustls configurations, SPIFFE verification, credentials) is `ferry_tls::config`.

pub mod client;
pub mod copy;
pub mod double;
pub mod error;
pub mod first_byte;
pub mod headers;
pub(crate) mod keepalive;
pub mod pool;
pub mod server;
pub mod settings;
pub mod socket;
pub mod stream;
pub mod upstream;

pub use error::{Error, Side};
