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
    /// TCP keepalive on every tunnel socket: how long it may hear nothing before the kernel
    /// probes its peer. A connection without streams sends no PING ([`crate::keepalive`]), so
    /// this is how an idle one finds out that its peer vanished. Whole seconds, at least one.
    pub keepalive: Duration,
    /// Time between the kernel's keepalive probes (whole seconds, at least one).
    pub keepalive_interval: Duration,
    /// Unanswered keepalive probes after which the kernel closes the connection.
    pub keepalive_retries: u32,
    /// HTTP/2 PING interval on an HBONE connection with open streams (client and server).
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
            // A vanished peer is found within 30 s, idle (10 s + 2 x 10 s) as busy (a PING
            // after 10 s, unanswered for 20 s).
            keepalive: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(10),
            keepalive_retries: 2,
            ping_interval: Duration::from_secs(10),
            ping_timeout: Duration::from_secs(20),
            half_closed_idle: Some(Duration::from_secs(300)),
        }
    }
}

/// The plaintext rustls takes from one write before it must send what it encrypted (its default
/// is 64 KiB). A tunnel's HTTP/2 DATA frames are up to [`crate::copy`]'s 256 KiB chunks; at
/// 64 KiB each frame took several trips through rustls and the socket. At 256 KiB, measured with
/// this crate's bench (`-- bulk-only`, 1 GiB, seven alternating pairs): CPU per GB 1.98 -> 1.69 s
/// for a tunnel, 2.60 -> 2.37 s relayed into one (issue 21).
pub const TLS_BUFFER: usize = 256 << 10;

/// Lets a tunnel's TLS connection take [`TLS_BUFFER`] per write.
pub(crate) fn widen_tls_buffer<D: rustls::SideData>(tls: &mut rustls::ConnectionCommon<D>) {
    tls.set_buffer_limit(Some(TLS_BUFFER));
}

/// TCP_NODELAY and keepalive on a tunnel socket. Failures here only cost performance, so they
/// are logged and ignored.
pub(crate) fn tune_socket(tcp: &TcpStream, s: &Settings) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY");
    }
    // The kernel counts in whole seconds and refuses 0.
    let secs = |d: Duration| d.max(Duration::from_secs(1));
    let ka = socket2::TcpKeepalive::new()
        .with_time(secs(s.keepalive))
        .with_interval(secs(s.keepalive_interval))
        .with_retries(s.keepalive_retries.max(1));
    let sock = socket2::SockRef::from(tcp);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "TCP keepalive");
    }
    // Keepalive probes only a connection with nothing unacknowledged: one whose peer vanished
    // while a frame was in flight (an idle connection's last RST_STREAM, say) would retransmit
    // for many minutes. The same bound, for sent data not acknowledged.
    let user_timeout = secs(s.keepalive) + secs(s.keepalive_interval) * s.keepalive_retries.max(1);
    if let Err(e) = sock.set_tcp_user_timeout(Some(user_timeout)) {
        tracing::debug!(error = %e, "TCP_USER_TIMEOUT");
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use ferry_tls::config::{client_config, server_config, server_name};
    use ferry_tls::testkit::{TestCa, pass};
    use rustls::{ClientConnection, ServerConnection};

    use super::*;

    #[test]
    fn a_widened_tls_connection_takes_a_whole_copy_chunk_in_one_write() {
        let ca = TestCa::new("root");
        let client_id = "spiffe://cluster.local/ns/default/sa/client";
        let server_id = "spiffe://cluster.local/ns/default/sa/server";
        let server = server_config(&ca.issue_str(server_id), &ca.bundle()).expect("server");
        let client = client_config(
            &ca.issue_str(client_id),
            &ca.bundle(),
            vec![server_id.parse().expect("an identity")],
        )
        .expect("client");
        let addr = "127.0.0.1:15008".parse().expect("an address");
        let mut c = ClientConnection::new(client, server_name(addr)).expect("client");
        let mut s = ServerConnection::new(server).expect("server");
        while c.is_handshaking() || s.is_handshaking() {
            pass(&mut c, &mut s).expect("valid TLS records");
            pass(&mut s, &mut c).expect("valid TLS records");
        }
        let chunk = vec![7u8; crate::copy::MAX_BUF];
        // rustls's own default: 64 KiB per write.
        let taken = c.writer().write(&chunk).expect("written");
        assert!(taken <= 64 << 10, "{taken} bytes taken by default");
        while c.wants_write() {
            c.write_tls(&mut std::io::sink()).expect("sent");
        }
        widen_tls_buffer(&mut c);
        let taken = c.writer().write(&chunk).expect("written");
        assert!(
            taken == chunk.len() || taken + (1 << 10) >= TLS_BUFFER,
            "{taken} of {} bytes taken in one write (buffer {TLS_BUFFER})",
            chunk.len()
        );
    }
}
