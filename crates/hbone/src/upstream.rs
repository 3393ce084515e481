//! What a tunnel's server side forwards to: a TCP connection, or another tunnel (a waypoint or
//! gateway carries one tunnel into the next).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::DuplexStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::pool::Tunnel;

/// The far side of a served tunnel.
#[derive(Debug)]
pub enum Upstream {
    Tcp(TcpStream),
    Tunnel(Tunnel),
    /// An in-process peer: a task that inspects the bytes (a waypoint's HTTP filter) and
    /// carries them on itself.
    Local(DuplexStream),
}

impl From<DuplexStream> for Upstream {
    fn from(d: DuplexStream) -> Self {
        Self::Local(d)
    }
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
            Self::Tcp(t) => crate::server::reset_tcp(t),
            Self::Tunnel(t) => t.abort(),
            // Dropping our end tells the inspecting task at once.
            Self::Local(d) => *d = tokio::io::duplex(1).0,
        }
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
            Self::Local(d) => Pin::new(d).poll_read(cx, buf),
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
            Self::Local(d) => Pin::new(d).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_flush(cx),
            Self::Tunnel(t) => Pin::new(t).poll_flush(cx),
            Self::Local(d) => Pin::new(d).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            Self::Tunnel(t) => Pin::new(t).poll_shutdown(cx),
            Self::Local(d) => Pin::new(d).poll_shutdown(cx),
        }
    }
}
