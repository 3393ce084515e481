//! One HBONE tunnel as a byte stream: an HTTP/2 stream adapted to `AsyncRead` + `AsyncWrite`.
//!
//! Half-close: `poll_shutdown` sends an empty DATA frame with END_STREAM (the tunnel's FIN); the
//! other direction stays open. Reset: an RST_STREAM from the peer surfaces as
//! `ConnectionReset` on the next read or write; [`H2Stream::abort`] sends one.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An HTTP/2 CONNECT stream carrying a tunnel's bytes.
#[derive(Debug)]
pub struct H2Stream {
    /// Present until the stream is dropped (see `Drop`).
    io: Option<(SendStream<Bytes>, RecvStream)>,
    /// Received data not yet read by the caller.
    pending: Bytes,
    write_closed: bool,
    read_done: bool,
    aborted: bool,
    /// What was read and written, when someone asked ([`H2Stream::counted`]).
    moved: Option<Arc<Moved>>,
}

/// The bytes a counted [`H2Stream`] has carried so far, readable while it is served.
#[derive(Debug, Default)]
pub struct Moved {
    read: AtomicU64,
    written: AtomicU64,
}

// === impl Moved ===

impl Moved {
    /// Bytes read from the tunnel (from its client).
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Bytes written into the tunnel (to its client).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

// === impl H2Stream ===

impl H2Stream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        Self {
            io: Some((send, recv)),
            pending: Bytes::new(),
            write_closed: false,
            read_done: false,
            aborted: false,
            moved: None,
        }
    }

    /// The stream, counting the bytes it carries into the returned [`Moved`]: for a tunnel
    /// served in process, where no copy loop counts them.
    #[must_use]
    pub fn counted(mut self) -> (Self, Arc<Moved>) {
        let moved = self.moved.get_or_insert_with(Arc::default).clone();
        (self, moved)
    }

    /// Resets the stream: the peer sees a reset, not a clean end. RFC 9113 §8.5: a TCP reset on
    /// the far side of a CONNECT tunnel is signalled with a stream error of type CONNECT_ERROR.
    pub fn abort(&mut self) {
        self.aborted = true;
        self.send().send_reset(Reason::CONNECT_ERROR);
    }

    fn send(&mut self) -> &mut SendStream<Bytes> {
        &mut self
            .io
            .as_mut()
            .expect("the stream's halves live until drop")
            .0
    }

    fn recv(&mut self) -> &mut RecvStream {
        &mut self
            .io
            .as_mut()
            .expect("the stream's halves live until drop")
            .1
    }
}

impl crate::copy::Reset for H2Stream {
    fn reset(&mut self) {
        self.abort();
    }

    fn poll_read_bytes(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<Bytes>>> {
        Some(self.poll_chunk(cx, usize::MAX))
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut Bytes,
    ) -> Option<Poll<io::Result<usize>>> {
        Some(self.poll_send(cx, data.len(), |n| data.split_to(n)))
    }
}

// === impl H2Stream: moving bytes ===

impl H2Stream {
    /// The next received chunk, at most `max` bytes of it (empty at the end of the stream): the
    /// `Bytes` h2 received, not a copy.
    fn poll_chunk(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<io::Result<Bytes>> {
        while self.pending.is_empty() {
            match ready!(self.recv().poll_data(cx)) {
                // An empty DATA frame carries nothing but, perhaps, END_STREAM (h2 hands it
                // over as an empty chunk before it reports the end): the peer's FIN (the
                // usual form of it, `poll_shutdown`'s), else nothing to pass on. Either way
                // never an empty chunk, which a reader would take for EOF.
                Some(Ok(data)) if data.is_empty() => {
                    if self.recv().is_end_stream() {
                        self.read_done = true;
                        return Poll::Ready(Ok(Bytes::new()));
                    }
                }
                Some(Ok(data)) => {
                    // Give the window back as soon as h2 hands the data over: the pending
                    // buffer holds at most one frame, so memory stays bounded by the stream
                    // window.
                    let _ = self.recv().flow_control().release_capacity(data.len());
                    self.pending = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => {
                    self.read_done = true;
                    return Poll::Ready(Ok(Bytes::new()));
                }
            }
        }
        let chunk = if self.pending.len() <= max {
            std::mem::take(&mut self.pending)
        } else {
            self.pending.split_to(max)
        };
        if let Some(m) = &self.moved {
            m.read.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        Poll::Ready(Ok(chunk))
    }

    /// Sends a prefix of `len` bytes, as soon as the stream has capacity for some: `take(n)`
    /// gives the first `n` as `Bytes`. Returns `n`.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        take: impl FnOnce(usize) -> Bytes,
    ) -> Poll<io::Result<usize>> {
        if len == 0 {
            return Poll::Ready(Ok(0));
        }
        if self.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel write half is closed",
            )));
        }
        self.send().reserve_capacity(len);
        // Capacity already assigned is used at once: `poll_capacity` only reports increases.
        let mut n = self.send().capacity();
        while n == 0 {
            match self.send().poll_capacity(cx) {
                Poll::Ready(Some(Ok(c))) => n = c,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_to_io(e))),
                Poll::Ready(None) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "tunnel closed",
                    )));
                }
                Poll::Pending => {
                    // No capacity: the peer may have reset the stream meanwhile.
                    return match self.send().poll_reset(cx) {
                        Poll::Ready(Ok(reason)) => Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::ConnectionReset,
                            format!("tunnel reset by peer ({reason})"),
                        ))),
                        Poll::Ready(Err(e)) => Poll::Ready(Err(h2_to_io(e))),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
        let n = n.min(len);
        self.send().send_data(take(n), false).map_err(h2_to_io)?;
        if let Some(m) = &self.moved {
            m.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        Poll::Ready(Ok(n))
    }
}

/// Maps an h2 error to the I/O error a byte stream would report.
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    if let Some(reason) = e.reason()
        && (reason == Reason::NO_ERROR || reason == Reason::CANCEL || e.is_reset())
    {
        return io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("tunnel reset by peer ({reason})"),
        );
    }
    io::Error::other(e)
}

impl AsyncRead for H2Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let chunk = ready!(self.poll_chunk(cx, buf.remaining()))?;
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, buf.len(), |n| Bytes::copy_from_slice(&buf[..n]))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_closed {
            self.write_closed = true;
            self.send()
                .send_data(Bytes::new(), true)
                .map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }
}

/// A stream we finished writing while the peer has not finished yet: hand it to a task that
/// waits (briefly) for the peer's END_STREAM, so the peer sees a clean end instead of the
/// RST_STREAM(CANCEL) that dropping an open stream sends.
impl Drop for H2Stream {
    fn drop(&mut self) {
        if !self.write_closed || self.read_done || self.aborted {
            return;
        }
        let (Some(io), Ok(rt)) = (self.io.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        rt.spawn(async move {
            let (send, mut recv) = io;
            let drain = async {
                while let Some(Ok(data)) = recv.data().await {
                    let _ = recv.flow_control().release_capacity(data.len());
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), drain).await;
            drop(send);
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An empty DATA frame is no end, and the usual FIN (an empty DATA frame with END_STREAM)
    /// is seen as the end by the stream itself: dropped after it, the stream hands nothing to
    /// a task waiting for the peer's end (it spawned one per tunnel while it took the empty
    /// frame for data).
    #[tokio::test]
    async fn an_empty_data_frame_is_no_end_and_an_empty_end_stream_is_the_end() {
        let (a, b) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(b).await.expect("h2 server");
            let (request, mut respond) = conn.accept().await.expect("a request").expect("h2");
            let send = respond
                .send_response(http::Response::new(()), false)
                .expect("a response");
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let mut tunnel = H2Stream::new(send, request.into_body());
            let mut got = Vec::new();
            tunnel.read_to_end(&mut got).await.expect("read to the end");
            tunnel.shutdown().await.expect("our end");
            (got, tunnel.read_done)
        });
        let (send, conn) = h2::client::handshake(a).await.expect("h2 client");
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("198.18.0.1:80")
            .body(())
            .expect("a request");
        let (response, mut stream) = send
            .ready()
            .await
            .expect("ready")
            .send_request(request, false)
            .expect("sent");
        let response = response.await.expect("a response");
        stream
            .send_data(Bytes::new(), false)
            .expect("an empty frame");
        stream
            .send_data(Bytes::from_static(b"x"), false)
            .expect("data");
        stream.send_data(Bytes::new(), true).expect("the end");
        let (got, read_done) = server.await.expect("the server side");
        assert_eq!(got, b"x", "all the data, and the end only after it");
        assert!(read_done, "the stream saw the peer's end");
        // Our end, as h2 reports it: an empty chunk (the END_STREAM frame), then none.
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            assert!(chunk.expect("no error").is_empty(), "no data, only the end");
        }
    }
}
