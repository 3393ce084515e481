//! Bidirectional copy with half-close and buffers that grow with traffic.
//!
//! Each direction starts with a small buffer (idle tunnels cost little) and grows it fourfold,
//! up to [`MAX_BUF`], each time a read fills it (bulk transfers move in large chunks, so TLS
//! writes few, large records). When one side reaches EOF, the other side's write half is shut
//! down (a FIN, or END_STREAM) and the opposite direction keeps flowing.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first buffer of each direction.
pub const INITIAL_BUF: usize = 1024;
/// The largest buffer a direction grows to.
pub const MAX_BUF: usize = 256 * 1024;

/// Which stream of a copy failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    A,
    B,
}

/// A copy that ended with an error on one side.
#[derive(Debug, thiserror::Error)]
#[error("{} failed after {a_to_b} bytes A->B and {b_to_a} bytes B->A: {source}", match failed { Failed::A => "side A", Failed::B => "side B" })]
pub struct CopyError {
    pub failed: Failed,
    pub source: io::Error,
    pub a_to_b: u64,
    pub b_to_a: u64,
}

struct Direction {
    buf: Vec<u8>,
    pos: usize,
    cap: usize,
    read_done: bool,
    shut_down: bool,
    grow: bool,
    need_flush: bool,
    amount: u64,
}

/// Which side of one direction failed.
enum DirError {
    Read(io::Error),
    Write(io::Error),
}

impl Direction {
    fn new() -> Self {
        Self {
            buf: Vec::new(),
            pos: 0,
            cap: 0,
            read_done: false,
            shut_down: false,
            grow: false,
            need_flush: false,
            amount: 0,
        }
    }

    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
        mut w: Pin<&mut W>,
    ) -> Poll<Result<(), DirError>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            if self.pos == self.cap && !self.read_done {
                self.pos = 0;
                self.cap = 0;
                if self.buf.is_empty() {
                    self.buf = vec![0; INITIAL_BUF];
                } else if self.grow && self.buf.len() < MAX_BUF {
                    self.buf = vec![0; (self.buf.len() * 4).min(MAX_BUF)];
                }
                let mut rb = ReadBuf::new(&mut self.buf);
                match r.as_mut().poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        if n == 0 {
                            self.read_done = true;
                        } else {
                            self.cap = n;
                            self.grow = n == self.buf.len();
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(DirError::Read(e))),
                    Poll::Pending => {
                        if self.need_flush {
                            ready!(w.as_mut().poll_flush(cx)).map_err(DirError::Write)?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                }
            }
            while self.pos < self.cap {
                let n = ready!(w.as_mut().poll_write(cx, &self.buf[self.pos..self.cap]))
                    .map_err(DirError::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(DirError::Write(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "wrote zero bytes",
                    ))));
                }
                self.pos += n;
                self.amount += n as u64;
                self.need_flush = true;
            }
            if self.read_done {
                if !self.shut_down {
                    ready!(w.as_mut().poll_flush(cx)).map_err(DirError::Write)?;
                    ready!(w.as_mut().poll_shutdown(cx)).map_err(DirError::Write)?;
                    self.shut_down = true;
                    // An idle half-closed direction keeps no buffer.
                    self.buf = Vec::new();
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Copies A->B and B->A until both directions reach EOF. Returns (bytes A->B, bytes B->A).
pub async fn bidirectional<A, B>(a: &mut A, b: &mut B) -> Result<(u64, u64), CopyError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut ab = Direction::new();
    let mut ba = Direction::new();
    let (mut ab_done, mut ba_done) = (false, false);
    poll_fn(|cx| {
        let fail = |failed, source, ab: &Direction, ba: &Direction| {
            Poll::Ready(Err(CopyError {
                failed,
                source,
                a_to_b: ab.amount,
                b_to_a: ba.amount,
            }))
        };
        if !ab_done {
            match ab.poll_copy(cx, Pin::new(&mut *a), Pin::new(&mut *b)) {
                Poll::Ready(Ok(())) => ab_done = true,
                Poll::Ready(Err(DirError::Read(e))) => return fail(Failed::A, e, &ab, &ba),
                Poll::Ready(Err(DirError::Write(e))) => return fail(Failed::B, e, &ab, &ba),
                Poll::Pending => {}
            }
        }
        if !ba_done {
            match ba.poll_copy(cx, Pin::new(&mut *b), Pin::new(&mut *a)) {
                Poll::Ready(Ok(())) => ba_done = true,
                Poll::Ready(Err(DirError::Read(e))) => return fail(Failed::B, e, &ab, &ba),
                Poll::Ready(Err(DirError::Write(e))) => return fail(Failed::A, e, &ab, &ba),
                Poll::Pending => {}
            }
        }
        if ab_done && ba_done {
            Poll::Ready(Ok((ab.amount, ba.amount)))
        } else {
            Poll::Pending
        }
    })
    .await
}
