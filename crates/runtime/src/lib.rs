//! What the three data-plane programs (`ferry node`, `ferry waypoint`, `ferry gateway`) share.
//!
//! # Layout
//! - [`accept`]: accepting when file descriptors run out (refuse and count, never hang).
//! - [`admin`]: the admin server (HTTP/1.1 on hyper, each program adds its routes) and what
//!   every admin endpoint shows the same way (certificates, the metrics registry).
//! - [`baggage`]: Ferry's baggage keys on CONNECT requests.
//! - [`netns`]: sockets inside a pod's network namespace, and a tunnel dialer there.
//! - [`sockets`]: app-side socket hygiene and copy bounds.
//! - [`telemetry`]: access log and Istio-named TCP metrics.

#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod baggage;
pub mod netns;
pub mod sockets;
pub mod telemetry;
