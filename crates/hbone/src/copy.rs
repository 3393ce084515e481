//! Bidirectional copy with half-close and buffers that grow with traffic.
//!
//! Each direction starts with a small buffer (idle tunnels cost little) and grows it fourfold,
//! up to [`MAX_BUF`], each time a read fills it (bulk transfers move in large chunks, so TLS
//! writes few, large records). When one side reaches EOF, the other side's write half is shut
//! down (a FIN, or END_STREAM) and the opposite direction keeps flowing, for as long as it
//! moves bytes: [`Bounds::half_closed_idle`] ends a half-closed copy that went quiet, so no
//! socket waits in CLOSE-WAIT or FIN-WAIT-2 for a peer that will never finish.
//!
//! One copy per direction: a side that holds its data as `Bytes` (an HTTP/2 stream, see
//! [`Reset::poll_read_bytes`] and [`Reset::poll_write_bytes`]) hands its chunks over as they
//! are, and a TCP side is read into a buffer whose chunks are passed on the same way; only a
//! TCP writer gets a slice.
//!
//! [`relay`] is the copy a proxy runs: it copies, then resets the side that did not fail;
//! [`relay_until`] also ends it, resetting both sides, when a future resolves (a policy change).
//!
//! # The tunnel, as a state table
//!
//! A tunnel is two independent directions. A TCP FIN and an HTTP/2 END_STREAM mean the same
//! (this direction is finished); a TCP RST and an RST_STREAM mean the same (the connection
//! broke: RFC 9113 §8.5 signals a TCP reset as a stream error CONNECT_ERROR).
//!
//! ```text
//!  direction X->Y   event                          what the copy does              next
//!  ---------------  -----------------------------  ------------------------------  -----------
//!  open             bytes from X                   write them to Y (the buffer     open
//!                                                  grows 4x when a read fills it)
//!  open             EOF from X (FIN / END_STREAM)  flush Y, shut down Y's write    done
//!                                                  half (FIN / END_STREAM to Y);
//!                                                  Y->X keeps flowing
//!  open             error reading X or writing Y   the copy ends: CopyError        ended:
//!                   (RST, RST_STREAM, broken       {failed}; relay() resets the    reset
//!                   pipe)                          other side (RST / RST_STREAM)
//!  open, Y->X done  no byte either way for         the copy ends: TimedOut,        ended:
//!  (half-closed)    Bounds::half_closed_idle       failed = X; relay() resets      reset
//!                                                  both sides
//!  open             Bounds::finish turns true      read what is ready (at most     done
//!                   (the drain deadline)           1 MiB more), then as EOF
//!  done, Y->X done  -                              Ok((a_to_b, b_to_a)); after a   ended:
//!                                                  finish, first read and drop     clean
//!                                                  what peers still send (<= 2 s)
//! ```
//!
//! The drain, on the server: when its drain signal turns true, every connection gets a GOAWAY
//! (streams already open go on, new ones go elsewhere); at the deadline, `finish` turns true
//! and every tunnel still open ends cleanly as above, END_STREAM towards the client and FIN
//! towards the target; the connection then closes with a TLS close_notify.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The first buffer of each direction.
pub(crate) const INITIAL_BUF: usize = 1024;
/// The largest buffer a direction grows to.
pub(crate) const MAX_BUF: usize = 256 * 1024;
/// At a drain deadline, what a direction still reads before it stops regardless.
const FINISH_BUDGET: usize = 1 << 20;
/// After both sides were shut down at a deadline, how long what the peers still send is read
/// and dropped, so their sockets close with a FIN rather than a reset for unread data.
const FINISH_LINGER: Duration = Duration::from_secs(2);

/// Buffers up to this size are given back while their direction waits for data (larger ones
/// mean a transfer in full swing: kept).
const IDLE_RELEASE: usize = 16 * 1024;

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

impl CopyError {
    /// Ended by [`Bounds::half_closed_idle`]: the caller resets both sides, so that neither
    /// lingers in FIN-WAIT-2 or CLOSE-WAIT.
    pub fn timed_out(&self) -> bool {
        self.source.kind() == io::ErrorKind::TimedOut
    }
}

struct Direction {
    /// Where a reader that holds no `Bytes` of its own is read into; the chunks split off it
    /// go back to it once written (no allocation while the writer copies them).
    buf: BytesMut,
    /// What was read and is not yet written.
    chunk: Bytes,
    /// How much the next read asks for: grows fourfold when a read fills it.
    size: usize,
    read_done: bool,
    /// Reads only what is already there, then takes the next wait for EOF (a drain deadline).
    finishing: bool,
    /// How much more a finishing direction reads before it stops regardless.
    finish_budget: usize,
    shut_down: bool,
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
            buf: BytesMut::new(),
            chunk: Bytes::new(),
            size: INITIAL_BUF,
            read_done: false,
            finishing: false,
            finish_budget: FINISH_BUDGET,
            shut_down: false,
            need_flush: false,
            amount: 0,
        }
    }

    /// The next chunk from `r`: the reader's own `Bytes` when it holds its data so (an HTTP/2
    /// stream: no copy), else read into this direction's buffer.
    fn poll_read<R: AsyncRead + Reset + Unpin + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
    ) -> Poll<io::Result<Bytes>> {
        if let Some(got) = r.as_mut().get_mut().poll_read_bytes(cx) {
            return got;
        }
        if self.buf.capacity() < self.size {
            // Gets its earlier chunks' memory back when they are all written and dropped.
            self.buf.reserve(self.size);
        }
        ready!(tokio_util::io::poll_read_buf(
            r,
            cx,
            &mut (&mut self.buf).limit(self.size)
        ))?;
        Poll::Ready(Ok(self.buf.split().freeze()))
    }

    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
        mut w: Pin<&mut W>,
    ) -> Poll<Result<(), DirError>>
    where
        R: AsyncRead + Reset + Unpin + ?Sized,
        W: AsyncWrite + Reset + Unpin + ?Sized,
    {
        loop {
            if self.chunk.is_empty() && !self.read_done {
                match self.poll_read(cx, r.as_mut()) {
                    Poll::Ready(Ok(chunk)) => {
                        let n = chunk.len();
                        if n == 0 {
                            self.read_done = true;
                        } else {
                            if n >= self.size && self.size < MAX_BUF {
                                self.size = (self.size * 4).min(MAX_BUF);
                            }
                            self.chunk = chunk;
                            if self.finishing {
                                // A peer that never pauses does not hold the deadline off.
                                self.finish_budget = self.finish_budget.saturating_sub(n);
                                if self.finish_budget == 0 {
                                    self.read_done = true;
                                }
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(DirError::Read(e))),
                    Poll::Pending if self.finishing => self.read_done = true,
                    Poll::Pending => {
                        // Nothing buffered and nothing to read: an idle direction keeps no
                        // small buffer (a large one means a transfer in full swing: kept).
                        if self.size <= IDLE_RELEASE {
                            self.buf = BytesMut::new();
                        }
                        if self.need_flush {
                            ready!(w.as_mut().poll_flush(cx)).map_err(DirError::Write)?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                }
            }
            while !self.chunk.is_empty() {
                let n = match w.as_mut().get_mut().poll_write_bytes(cx, &mut self.chunk) {
                    Some(written) => ready!(written),
                    None => ready!(w.as_mut().poll_write(cx, &self.chunk)).map(|n| {
                        self.chunk.advance(n);
                        n
                    }),
                }
                .map_err(DirError::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(DirError::Write(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "wrote zero bytes",
                    ))));
                }
                self.amount += n as u64;
                self.need_flush = true;
            }
            // Written: its memory goes back to `buf` (an empty `Bytes` would still hold it).
            self.chunk = Bytes::new();
            if self.read_done {
                if !self.shut_down {
                    ready!(w.as_mut().poll_flush(cx)).map_err(DirError::Write)?;
                    ready!(w.as_mut().poll_shutdown(cx)).map_err(DirError::Write)?;
                    self.shut_down = true;
                    // An idle half-closed direction keeps no buffer.
                    self.buf = BytesMut::new();
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Limits on a copy.
#[derive(Clone, Debug, Default)]
pub struct Bounds {
    /// Once one direction has ended, the copy ends with a `TimedOut` error (on the side that
    /// should still be sending) when the other direction moves no byte for this long.
    pub half_closed_idle: Option<Duration>,
    /// When this turns true (a drain deadline), both directions stop reading once nothing more
    /// is ready, write out what they hold and shut their write side down: each peer gets a FIN
    /// (or END_STREAM), never a reset, and the copy ends cleanly.
    pub finish: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Copies A->B and B->A until both directions reach EOF, within `bounds` (the state table in
/// the [module docs](self)). Returns (bytes A->B, bytes B->A).
pub async fn bidirectional_bounded<A, B>(
    a: &mut A,
    b: &mut B,
    bounds: Bounds,
) -> Result<(u64, u64), CopyError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    match copy_until(
        &mut Plain(a),
        &mut Plain(b),
        bounds,
        std::future::pending::<std::convert::Infallible>(),
    )
    .await
    {
        Ok(moved) => Ok(moved),
        Err(Stop::Failed(e)) => Err(e),
        Err(Stop::Until { reason, .. }) => match reason {},
    }
}

/// A side of [`bidirectional_bounded`]: never reset, and moving its bytes through
/// `AsyncRead` and `AsyncWrite` only.
struct Plain<'a, T: ?Sized>(&'a mut T);

impl<T: AsyncRead + Unpin + ?Sized> AsyncRead for Plain<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin + ?Sized> AsyncWrite for Plain<'_, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().0).poll_shutdown(cx)
    }
}

impl<T: ?Sized> Reset for Plain<'_, T> {
    fn reset(&mut self) {}
}

/// Why [`copy_until`] stopped before both directions ended.
enum Stop<T> {
    Failed(CopyError),
    Until { reason: T, a_to_b: u64, b_to_a: u64 },
}

/// [`bidirectional_bounded`], stopped as soon as `until` resolves (with the bytes moved so far).
///
/// This and [`relay_until`] are plain functions returning their futures: an `async fn` stores
/// its arguments twice, and a held connection keeps its copy's future for its whole life.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn stores its arguments twice, for as long as a connection is held"
)]
fn copy_until<'a, A, B, T>(
    a: &'a mut A,
    b: &'a mut B,
    bounds: Bounds,
    until: impl Future<Output = T> + 'a,
) -> impl Future<Output = Result<(u64, u64), Stop<T>>> + 'a
where
    A: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
    T: 'a,
{
    async move {
        let mut until = std::pin::pin!(until);
        let mut ab = Direction::new();
        let mut ba = Direction::new();
        let (mut ab_done, mut ba_done) = (false, false);
        // While half-closed: the quiet-time deadline, and the byte count it was last reset at.
        let mut quiet: Option<(Pin<Box<tokio::time::Sleep>>, u64)> = None;
        let mut finish = Box::pin(async move {
            match bounds.finish {
                Some(mut rx) => {
                    if rx.wait_for(|v| *v).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        });
        let mut finishing = false;
        let mut lingering: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let (mut a_eof, mut b_eof) = (false, false);
        poll_fn(|cx| {
            if let Poll::Ready(reason) = until.as_mut().poll(cx) {
                return Poll::Ready(Err(Stop::Until {
                    reason,
                    a_to_b: ab.amount,
                    b_to_a: ba.amount,
                }));
            }
            if !finishing && finish.as_mut().poll(cx).is_ready() {
                finishing = true;
                ab.finishing = true;
                ba.finishing = true;
            }
            let fail = |failed, source, ab: &Direction, ba: &Direction| {
                Poll::Ready(Err(Stop::Failed(CopyError {
                    failed,
                    source,
                    a_to_b: ab.amount,
                    b_to_a: ba.amount,
                })))
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
                if !finishing {
                    return Poll::Ready(Ok((ab.amount, ba.amount)));
                }
                // Ended at a deadline: read and drop what the peers still send until both end, for
                // a short while, so neither socket is closed with data unread (a reset).
                let linger =
                    lingering.get_or_insert_with(|| Box::pin(tokio::time::sleep(FINISH_LINGER)));
                let a_end = a_eof || discard(cx, Pin::new(&mut *a));
                let b_end = b_eof || discard(cx, Pin::new(&mut *b));
                (a_eof, b_eof) = (a_end, b_end);
                if (a_eof && b_eof) || linger.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok((ab.amount, ba.amount)));
                }
                return Poll::Pending;
            }
            if let (Some(idle), true) = (bounds.half_closed_idle, ab_done || ba_done) {
                let moved = ab.amount + ba.amount;
                let deadline = tokio::time::Instant::now() + idle;
                match &mut quiet {
                    Some((sleep, at)) if *at != moved => {
                        sleep.as_mut().reset(deadline);
                        *at = moved;
                    }
                    Some(_) => {}
                    None => quiet = Some((Box::pin(tokio::time::sleep_until(deadline)), moved)),
                }
                if let Some((sleep, _)) = &mut quiet
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    // The direction still open is the one whose reader went quiet.
                    let failed = if ab_done { Failed::B } else { Failed::A };
                    let e = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("half-closed and idle for {} s", idle.as_secs_f64()),
                    );
                    return fail(failed, e, &ab, &ba);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Reads and drops what `r` has; `true` once it has ended (EOF or an error).
fn discard<R: AsyncRead + ?Sized>(cx: &mut Context<'_>, mut r: Pin<&mut R>) -> bool {
    let mut scratch = [0u8; 4096];
    loop {
        let mut rb = ReadBuf::new(&mut scratch);
        match r.as_mut().poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => return true,
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return true,
            Poll::Pending => return false,
        }
    }
}

// === relay ===

/// A side of a [`relay`]: how it is ended with a reset rather than a clean close, so its peer
/// learns that the other end broke rather than finished; and, for a side that holds its data
/// as [`Bytes`] (an HTTP/2 stream), how the copy hands chunks in and out of it without copying
/// them (by default it does not: the copy uses `AsyncRead` and `AsyncWrite`).
pub trait Reset {
    /// A TCP socket sends its RST when it is closed (dropped); a tunnel sends RST_STREAM now.
    fn reset(&mut self);

    /// The next chunk received, as the side holds it (empty at EOF); `None` if this side has
    /// no chunks of its own to give.
    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
        let _ = cx;
        None
    }

    /// Takes a prefix of `data` to send (advancing it) and returns its length; `None` if this
    /// side only takes slices (`poll_write`).
    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        let _ = (cx, data);
        None
    }
}

impl Reset for TcpStream {
    fn reset(&mut self) {
        crate::socket::reset_tcp(self);
    }
}

impl<T: Reset + ?Sized> Reset for &mut T {
    fn reset(&mut self) {
        (**self).reset();
    }

    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
        (**self).poll_read_bytes(cx)
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        (**self).poll_write_bytes(cx, data)
    }
}

impl<T: Reset + ?Sized> Reset for Box<T> {
    fn reset(&mut self) {
        (**self).reset();
    }

    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
        (**self).poll_read_bytes(cx)
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        (**self).poll_write_bytes(cx, data)
    }
}

/// The sides a failed copy resets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resets {
    pub a: bool,
    pub b: bool,
}

impl Resets {
    /// After a copy failed: the side that did not fail (its peer must see a reset, not a clean
    /// end), or, when the half-closed idle bound ended it, both, so that neither lingers in
    /// FIN-WAIT-2 or CLOSE-WAIT.
    pub fn after(e: &CopyError) -> Self {
        match e.failed {
            _ if e.timed_out() => Self { a: true, b: true },
            Failed::A => Self { a: false, b: true },
            Failed::B => Self { a: true, b: false },
        }
    }
}

/// A [`relay`] that ended with an error, after resetting [`RelayError::reset`].
#[derive(Debug, thiserror::Error)]
#[error("{copy}")]
pub struct RelayError {
    /// What ended the copy, and the bytes moved until then.
    pub copy: CopyError,
    /// The sides that were reset.
    pub reset: Resets,
}

/// Copies A<->B within `bounds` ([`bidirectional_bounded`]); when that fails, resets the side
/// that did not fail (both after the half-closed idle bound): [`Resets::after`]. A TCP side's
/// RST goes out when the caller drops it. Returns (bytes A->B, bytes B->A).
pub async fn relay<A, B>(a: &mut A, b: &mut B, bounds: Bounds) -> Result<(u64, u64), RelayError>
where
    A: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
{
    match relay_until(
        a,
        b,
        bounds,
        std::future::pending::<std::convert::Infallible>(),
    )
    .await
    {
        Ok(moved) => Ok(moved),
        Err(Interrupted::Failed(e)) => Err(e),
        Err(Interrupted::Until { reason, .. }) => match reason {},
    }
}

/// How a [`relay_until`] ended early.
#[derive(Debug)]
pub enum Interrupted<T> {
    /// The copy failed: as [`relay`].
    Failed(RelayError),
    /// `until` resolved first: both sides were reset.
    Until { reason: T, a_to_b: u64, b_to_a: u64 },
}

/// [`relay`], ended as soon as `until` resolves (a policy change that no longer allows the
/// connection): both sides are then reset, and the bytes moved so far reported.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn stores its arguments twice, for as long as a connection is held"
)]
pub fn relay_until<'a, A, B, T>(
    a: &'a mut A,
    b: &'a mut B,
    bounds: Bounds,
    until: impl Future<Output = T> + 'a,
) -> impl Future<Output = Result<(u64, u64), Interrupted<T>>> + 'a
where
    A: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Reset + Unpin + ?Sized,
    T: 'a,
{
    async move {
        match copy_until(&mut *a, &mut *b, bounds, until).await {
            Ok(moved) => Ok(moved),
            Err(Stop::Failed(copy)) => {
                let reset = Resets::after(&copy);
                if reset.a {
                    a.reset();
                }
                if reset.b {
                    b.reset();
                }
                Err(Interrupted::Failed(RelayError { copy, reset }))
            }
            Err(Stop::Until {
                reason,
                a_to_b,
                b_to_a,
            }) => {
                a.reset();
                b.reset();
                Err(Interrupted::Until {
                    reason,
                    a_to_b,
                    b_to_a,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// A side that only moves `Bytes` (as an HTTP/2 stream does): what it gives, then EOF; what
    /// it takes, kept as it was handed over.
    #[derive(Default)]
    struct Chunks {
        give: VecDeque<Bytes>,
        took: Vec<Bytes>,
    }

    impl AsyncRead for Chunks {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            unreachable!("a side with chunks of its own is read with poll_read_bytes")
        }
    }

    impl AsyncWrite for Chunks {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            unreachable!("a side that takes chunks is written with poll_write_bytes")
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl Reset for Chunks {
        fn reset(&mut self) {}

        fn poll_read_bytes(&mut self, _: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
            Some(Poll::Ready(Ok(self.give.pop_front().unwrap_or_default())))
        }

        fn poll_write_bytes(
            &mut self,
            _: &mut Context<'_>,
            data: &mut Bytes,
        ) -> Option<Poll<io::Result<usize>>> {
            let n = data.len();
            self.took.push(data.split_to(n));
            Some(Poll::Ready(Ok(n)))
        }
    }

    #[tokio::test]
    async fn chunks_pass_between_sides_that_hold_bytes_without_a_copy() {
        let sent = [Bytes::from(vec![1u8; 300_000]), Bytes::from_static(b"tail")];
        let mut a = Chunks {
            give: sent.iter().cloned().collect(),
            ..Chunks::default()
        };
        let mut b = Chunks::default();
        let moved = relay(&mut a, &mut b, Bounds::default()).await.unwrap();
        assert_eq!(moved, (300_004, 0));
        assert_eq!(b.took.len(), 2);
        for (got, sent) in b.took.iter().zip(&sent) {
            assert_eq!(got.as_ptr(), sent.as_ptr(), "the same memory, not a copy");
            assert_eq!(got.len(), sent.len());
        }
    }

    fn failure(failed: Failed, kind: io::ErrorKind) -> CopyError {
        CopyError {
            failed,
            source: io::Error::new(kind, "test"),
            a_to_b: 0,
            b_to_a: 0,
        }
    }

    #[test]
    fn the_side_that_did_not_fail_is_reset_and_both_after_the_idle_bound() {
        use io::ErrorKind::{ConnectionReset, TimedOut};
        let r = |a, b| Resets { a, b };
        assert_eq!(
            Resets::after(&failure(Failed::A, ConnectionReset)),
            r(false, true)
        );
        assert_eq!(
            Resets::after(&failure(Failed::B, ConnectionReset)),
            r(true, false)
        );
        assert_eq!(Resets::after(&failure(Failed::A, TimedOut)), r(true, true));
        assert_eq!(Resets::after(&failure(Failed::B, TimedOut)), r(true, true));
    }
}
