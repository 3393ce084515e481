//! What a tunnel's server side does with an admitted tunnel ([`Forward`]): copy it to a byte
//! stream ([`Upstream`]: a TCP connection, or another tunnel when a waypoint or gateway carries
//! one tunnel into the next), or hand the tunnel's stream to the handler, which serves it in
//! process (a waypoint's HTTP filter reads the tunnel's bytes directly).

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

/// Ends a forwarded tunnel early when it resolves, with the reason it gives (e.g. a policy
/// change that no longer allows it): both sides are reset, and the handler's `finished` is
/// told [`crate::server::Ended::Closed`].
pub type Until = Pin<Box<dyn Future<Output = Box<dyn std::error::Error + Send + Sync>> + Send>>;

/// What to do with an admitted tunnel.
pub enum Forward {
    /// Copy it to and from this byte stream.
    Stream(Upstream),
    /// Copy it to and from this byte stream until `until` resolves ([`Forward::until`]).
    Guarded { upstream: Upstream, until: Until },
    /// No far side: the handler serves the tunnel's stream itself (no bytes are copied; the
    /// stream counts what it carries for [`crate::server::Outcome`]).
    Serve(Serve),
}

/// The far side of a forwarded tunnel.
pub enum Upstream {
    Tcp(TcpStream),
    Tunnel(Tunnel),
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stream(u) => f.debug_tuple("Stream").field(u).finish(),
            Self::Guarded { upstream, .. } => f
                .debug_struct("Guarded")
                .field("upstream", upstream)
                .finish_non_exhaustive(),
            Self::Serve(_) => f.write_str("Serve"),
        }
    }
}

impl Forward {
    /// The same forward, ended early when `until` resolves. A tunnel the handler serves in
    /// process ([`Forward::Serve`]) is left as it is: its server ends it itself.
    pub fn until(self, until: Until) -> Self {
        match self {
            Self::Stream(upstream) | Self::Guarded { upstream, .. } => {
                Self::Guarded { upstream, until }
            }
            Self::Serve(s) => Self::Serve(s),
        }
    }
}

impl<T: Into<Upstream>> From<T> for Forward {
    fn from(t: T) -> Self {
        Self::Stream(t.into())
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(t) => f.debug_tuple("Tcp").field(t).finish(),
            Self::Tunnel(t) => f.debug_tuple("Tunnel").field(t).finish(),
        }
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
            Self::Tcp(t) => crate::socket::reset_tcp(t),
            Self::Tunnel(t) => t.abort(),
        }
    }
}

impl crate::copy::Reset for Upstream {
    fn reset(&mut self) {
        Self::reset(self);
    }

    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<bytes::Bytes>>> {
        match self {
            Self::Tcp(_) => None,
            Self::Tunnel(t) => t.poll_read_bytes(cx),
        }
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut bytes::Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        match self {
            Self::Tcp(_) => None,
            Self::Tunnel(t) => t.poll_write_bytes(cx, data),
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_flush(cx),
            Self::Tunnel(t) => Pin::new(t).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            Self::Tunnel(t) => Pin::new(t).poll_shutdown(cx),
        }
    }
}
