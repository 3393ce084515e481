//! Socket hygiene on the app-side legs (the pod's own connections to and from the node proxy):
//! a peer that vanished is noticed, and a half-closed connection that went quiet is ended,
//! both within the node's idle bound.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ferry_hbone::copy::Bounds;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Keepalive probes start after half the bound and, three unanswered probes later, end the
/// connection; unacknowledged data gives up after the bound too. Failures only cost hygiene,
/// so they are logged and ignored.
pub fn tune_app_socket(tcp: &TcpStream, bound: Duration) {
    let _ = tcp.set_nodelay(true);
    let ka = TcpKeepalive::new()
        .with_time((bound / 2).max(Duration::from_secs(1)))
        .with_interval((bound / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    let sock = SockRef::from(tcp);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "TCP keepalive on an app socket");
    }
    if let Err(e) = sock.set_tcp_user_timeout(Some(bound)) {
        tracing::debug!(error = %e, "TCP_USER_TIMEOUT on an app socket");
    }
}

/// The copy bounds of a connection: its idle bound, and its drain deadline (`finish` turns true).
pub fn bounds(idle: Duration, finish: tokio::sync::watch::Receiver<bool>) -> Bounds {
    Bounds {
        half_closed_idle: Some(idle),
        finish: Some(finish),
    }
}

/// Where a captured connection was going: its original destination, asked in the family of
/// the listener that accepted it (`SO_ORIGINAL_DST` for IPv4, `IP6T_SO_ORIGINAL_DST` for IPv6).
pub fn original_dst(tcp: &TcpStream) -> io::Result<SocketAddr> {
    let sock = SockRef::from(tcp);
    let orig = match tcp.local_addr()? {
        SocketAddr::V4(_) => sock.original_dst_v4()?,
        SocketAddr::V6(_) => sock.original_dst_v6()?,
    };
    orig.as_socket()
        .ok_or_else(|| io::Error::other("not an IP address"))
}
