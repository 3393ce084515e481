//! A read-ahead buffer under TLS.
//!
//! rustls pulls ciphertext from the socket 4 KiB at a time, so a 16 KiB record costs four
//! `read` system calls. `ReadAhead` reads up to [`MAX_AHEAD`] bytes per call instead and hands
//! them to rustls from memory. The buffer exists only while data is waiting: an idle connection
//! holds none, which keeps idle tunnels small.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most read ahead in one system call.
pub(crate) const MAX_AHEAD: usize = 64 * 1024;

/// Wraps a socket with an on-demand read-ahead buffer; writes pass straight through.
#[derive(Debug)]
pub(crate) struct ReadAhead<T> {
    inner: T,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
}

impl<T> ReadAhead<T> {
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            pos: 0,
            len: 0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos == this.len {
            // Large reads need no staging.
            if out.remaining() >= MAX_AHEAD {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            if this.buf.is_empty() {
                this.buf = vec![0; MAX_AHEAD];
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing waiting: release the buffer while idle.
                    this.buf = Vec::new();
                    return Poll::Pending;
                }
            }
            this.pos = 0;
            this.len = rb.filled().len();
            if this.len == 0 {
                this.buf = Vec::new();
                return Poll::Ready(Ok(()));
            }
        }
        let n = (this.len - this.pos).min(out.remaining());
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}
