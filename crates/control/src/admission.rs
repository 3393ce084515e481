//! Connections per peer address: the listener's accepted sockets, each counted against its
//! peer's IP while it is open; one over the cap is closed as soon as it is accepted.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections by peer IP.
type Open = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The accepted connections of a listener, at most `max_per_peer` open from one IP.
#[derive(Debug)]
pub struct PeerLimited {
    inner: TcpListenerStream,
    max_per_peer: usize,
    open: Open,
    refused: Counter,
}

/// One admitted connection; its slot is given back when it is dropped.
#[derive(Debug)]
pub struct PeerConn {
    io: TcpStream,
    _slot: Slot,
}

#[derive(Debug)]
struct Slot {
    ip: IpAddr,
    open: Open,
}

// === impl PeerLimited ===

impl PeerLimited {
    /// Admits at most `max_per_peer` open connections from one IP, counting the rest in
    /// `refused`.
    pub fn new(listener: TcpListener, max_per_peer: usize, refused: Counter) -> Self {
        Self {
            inner: TcpListenerStream::new(listener),
            max_per_peer,
            open: Open::default(),
            refused,
        }
    }

    fn admit(&self, io: TcpStream) -> Option<PeerConn> {
        let ip = io.peer_addr().ok()?.ip();
        {
            let mut open = self.open.lock();
            let n = open.entry(ip).or_default();
            if *n >= self.max_per_peer {
                drop(open);
                self.refused.inc();
                tracing::warn!(peer = %ip, max = self.max_per_peer, "connection refused: too many from this peer");
                return None;
            }
            *n += 1;
        }
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY");
        }
        Some(PeerConn {
            io,
            _slot: Slot {
                ip,
                open: self.open.clone(),
            },
        })
    }
}

impl Stream for PeerLimited {
    type Item = io::Result<PeerConn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match std::task::ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                Some(Ok(io)) => {
                    if let Some(conn) = self.admit(io) {
                        return Poll::Ready(Some(Ok(conn)));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            }
        }
    }
}

// === impl Slot ===

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

// === impl PeerConn ===

impl Connected for PeerConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for PeerConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt as _;
    use tokio_stream::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn a_peer_over_its_cap_is_closed_and_its_slot_comes_back() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let refused = Counter::default();
        let mut incoming = PeerLimited::new(l, 2, refused.clone());
        let open = incoming.open.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(c) = incoming.next().await {
                let _ = tx.send(c.unwrap());
            }
        });
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let a = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        let _b = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        // The third is closed as soon as it is accepted.
        let mut c3 = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), c3.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "closed");
        assert_eq!(refused.get(), 1);
        // Once one closes, a new one is admitted.
        drop(a);
        let _c4 = TcpStream::connect(addr).await.unwrap();
        let _d = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("admitted")
            .unwrap();
        assert_eq!(open.lock().get(&addr.ip()), Some(&2));
    }
}
