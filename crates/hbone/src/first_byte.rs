//! A side of a relay that notes when its first byte arrived: the connection record's
//! "first byte" phase (the destination's first answer, seen by the hop that relays it).
//!
//! It forwards reads, writes and [`Reset`] untouched (chunks too, so an HTTP/2 stream is still
//! copied without copying its data); the only cost is one branch per read until the first byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::copy::Reset;

/// `inner`, and when its first byte was read.
#[derive(Debug)]
pub struct FirstByte<T> {
    inner: T,
    at: Option<Instant>,
}

impl<T> FirstByte<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, at: None }
    }

    /// When the first byte was read from it, if one was.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    fn note(&mut self, got: bool) {
        if got && self.at.is_none() {
            self.at = Some(Instant::now());
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstByte<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.note(buf.filled().len() > before);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstByte<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<T: Reset> Reset for FirstByte<T> {
    fn reset(&mut self) {
        self.inner.reset();
    }

    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
        let polled = self.inner.poll_read_bytes(cx);
        if let Some(Poll::Ready(Ok(b))) = &polled {
            let got = !b.is_empty();
            self.note(got);
        }
        polled
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        self.inner.poll_write_bytes(cx, data)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn the_first_byte_is_noted_when_read_and_not_before() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut side = FirstByte::new(a);
        side.write_all(b"ping").await.unwrap();
        assert_eq!(side.at(), None, "a write is not a first byte back");
        let before = Instant::now();
        b.write_all(b"pong").await.unwrap();
        let mut buf = [0u8; 4];
        side.read_exact(&mut buf).await.unwrap();
        let first = side.at().expect("noted");
        assert!(first >= before);
        b.write_all(b"more").await.unwrap();
        side.read_exact(&mut buf).await.unwrap();
        assert_eq!(side.at(), Some(first), "only the first is kept");
    }
}
