//! HTTP/2 and socket parameters, with Istio's defaults as the starting point.

use std::time::Duration;

use tokio::net::TcpStream;

/// The streams a pooled connection carries at once by default, and a server of ours admits
/// ([`Settings::max_concurrent_streams`]), so that idle tunnels share few connections.
pub const MAX_STREAMS: usize = 1000;

/// Tunnel parameters shared by client and server.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Per-stream receive window. One stalled stream can buffer at most this much.
    pub stream_window: u32,
    /// Per-connection receive window; larger than the stream window, so one stalled stream
    /// cannot stall the others sharing the connection.
    pub connection_window: u32,
    /// Largest HTTP/2 frame we accept.
    pub max_frame_size: u32,
    /// Concurrent streams a server lets one client open: as many as our pool puts on one
    /// connection ([`MAX_STREAMS`]), so that idle tunnels share few connections.
    pub max_concurrent_streams: u32,
    /// How long a TCP connect plus TLS and HTTP/2 handshakes may take.
    pub connect_timeout: Duration,
    /// TCP keepalive idle time on every tunnel socket.
    pub keepalive: Duration,
    /// HTTP/2 PING interval on an HBONE connection (client and server).
    pub ping_interval: Duration,
    /// A connection whose PING is not answered within this time is closed.
    pub ping_timeout: Duration,
    /// A tunnel half-closed one way ends once the other way moves no byte for this long.
    pub half_closed_idle: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            stream_window: 4 << 20,
            connection_window: 16 << 20,
            max_frame_size: 1 << 20,
            max_concurrent_streams: MAX_STREAMS as u32,
            connect_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(180),
            ping_interval: Duration::from_secs(10),
            ping_timeout: Duration::from_secs(20),
            half_closed_idle: Some(Duration::from_secs(300)),
        }
    }
}

/// TCP_NODELAY and keepalive on a tunnel socket. Failures here only cost performance, so they
/// are logged and ignored.
pub(crate) fn tune_socket(tcp: &TcpStream, s: &Settings) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY");
    }
    let ka = socket2::TcpKeepalive::new()
        .with_time(s.keepalive)
        .with_interval(s.keepalive);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "TCP keepalive");
    }
}

/// Sends a PING every `interval` and returns when one is not answered within `timeout` (or the
/// connection is gone). The caller then closes the connection: its peer has vanished.
pub(crate) async fn ping_until_dead(
    mut pings: h2::PingPong,
    interval: Duration,
    timeout: Duration,
) -> &'static str {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return "the connection failed while waiting for a PING answer",
            Err(_) => return "no PING answer in time: the peer is gone",
        }
    }
}
