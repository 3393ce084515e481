//! What a tunnel's server side forwards to: a TCP connection, or another tunnel (a waypoint or
//! gateway carries one tunnel into the next), or nothing: the handler serves the tunnel itself
//! (a waypoint's HTTP filter reads the tunnel's bytes directly).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::pool::Tunnel;

/// Serves a tunnel in process, given the tunnel's stream.
pub type Serve =
    Box<dyn FnOnce(crate::stream::H2Stream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The far side of a served tunnel.
pub enum Upstream {
    Tcp(TcpStream),
    Tunnel(Tunnel),
    /// No far side: the handler serves the tunnel's stream itself (no bytes are copied).
    Serve(Serve),
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(t) => f.debug_tuple("Tcp").field(t).finish(),
            Self::Tunnel(t) => f.debug_tuple("Tunnel").field(t).finish(),
            Self::Serve(_) => f.write_str("Serve"),
        }
    }
}

/// Served in process: not a byte stream.
fn not_a_stream() -> io::Error {
    io::Error::other("this tunnel is served in process, not forwarded")
}

impl From<TcpStream> for Upstream {
    fn from(s: TcpStream) -> Self {
        let _ = s.set_nodelay(true);
        Self::Tcp(s)
    }
}

impl From<Tunnel> for Upstream {
    fn from(t: Tunnel) -> Self {
        Self::Tunnel(t)
    }
}

impl Upstream {
    /// Ends it with a reset (TCP RST, or RST_STREAM), not a clean close.
    pub fn reset(&mut self) {
        match self {
            Self::Tcp(t) => crate::socket::reset_tcp(t),
            Self::Tunnel(t) => t.abort(),
            Self::Serve(_) => {}
        }
    }
}

impl crate::copy::Reset for Upstream {
    fn reset(&mut self) {
        Self::reset(self);
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_read(cx, buf),
            Self::Tunnel(t) => Pin::new(t).poll_read(cx, buf),
            Self::Serve(_) => Poll::Ready(Err(not_a_stream())),
        }
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_write(cx, buf),
            Self::Tunnel(t) => Pin::new(t).poll_write(cx, buf),
            Self::Serve(_) => Poll::Ready(Err(not_a_stream())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_flush(cx),
            Self::Tunnel(t) => Pin::new(t).poll_flush(cx),
            Self::Serve(_) => Poll::Ready(Err(not_a_stream())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            Self::Tunnel(t) => Pin::new(t).poll_shutdown(cx),
            Self::Serve(_) => Poll::Ready(Err(not_a_stream())),
        }
    }
}
