//! A stream that gives back the bytes already read from it (a protocol sniff, what hyper read
//! ahead of an upgrade) before reading on.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

/// A stream that replays the bytes already read from it before reading on.
#[derive(Debug)]
pub struct Replay<S> {
    head: Bytes,
    inner: S,
}

impl<S> Replay<S> {
    pub fn new(head: Bytes, inner: S) -> Self {
        Self { head, inner }
    }
}

impl<S: ferry_hbone::copy::Reset> ferry_hbone::copy::Reset for Replay<S> {
    fn reset(&mut self) {
        self.inner.reset();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.head.is_empty() {
            let n = this.head.len().min(buf.remaining());
            buf.put_slice(&this.head.split_to(n));
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
