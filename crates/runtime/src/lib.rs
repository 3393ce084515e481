//! What the three data-plane programs (`ferry node`, `ferry waypoint`, `ferry gateway`) share.
//!
//! # Layout
//! - [`accept`]: accepting when file descriptors run out (refuse and count, never hang).
//! - [`admin`]: the admin server (HTTP/1.1 on hyper, each program adds its routes) and what
//!   every admin endpoint shows the same way (certificates, the metrics registry).
//! - [`bootstrap`]: subscribe to the mesh (xDS) and get certificates (CA), once for all.
//! - [`conn`]: why a connection failed ([`conn::ConnError`]: side, response flag, cause).
//! - [`drain`]: one drain primitive, graceful then forced at a deadline.
//! - `dns_server` (feature `dns-server`): a small authoritative DNS server, the DNS proxy's
//!   upstream in tests and the lab.
//! - [`serve`]: the HBONE accept loop with certificate rotation, under the drain.
//! - [`recheck`]: a connection's own policy re-check on each snapshot change.
//! - [`netns`]: sockets inside a pod's network namespace, and a tunnel dialer there.
//! - [`sockets`]: app-side socket hygiene and copy bounds.
//! - [`telemetry`]: access log and Istio-named TCP metrics.
//! - [`text`]: a log field held as found (address, shared name) and written out only when the
//!   line is.

#![forbid(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod bootstrap;
pub mod conn;
#[cfg(feature = "dns-server")]
pub mod dns_server;
pub mod drain;
pub mod netns;
pub mod recheck;
pub mod records;
pub mod serve;
pub mod sockets;
pub mod telemetry;
pub mod text;

/// Waits for SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Raises the soft file-descriptor limit to the hard one: every proxied connection holds two.
pub fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the file-descriptor limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the file-descriptor limit"),
        },
        _ => {}
    }
}
