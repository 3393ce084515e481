//! How an HBONE connection finds out that its peer is gone: HTTP/2 PINGs while it carries
//! streams, the kernel's TCP keepalive while it carries none.
//!
//! A PING runs the whole stack in user space (a timer, h2, rustls, the socket, both ways, at
//! both ends). On a connection that carries tunnels that is noise; on the warm connection a
//! pool keeps idle for minutes it was the only code a quiet node proxy ran, and every 10 s it
//! mapped back the binary's pages a release had dropped (issue 21: about 4.5 MB of text within
//! 10 s of each release). So a connection PINGs only while it has open streams ([`Streams`]);
//! while it has none, the kernel watches it with TCP keepalive probes, answered by the peer's
//! kernel, which wake no process ([`crate::settings::Settings::keepalive`]: with the defaults a
//! vanished peer is found within 30 s either way).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The streams open on one HBONE connection, and a wake-up for whoever waits for the first.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    open: AtomicUsize,
    /// The most ever open at once ([`Streams::peak`]).
    peak: AtomicUsize,
    /// Notified when the count goes from 0 to 1.
    opened: Notify,
}

impl Streams {
    /// Streams open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Counts one more stream if fewer than `limit` are open; `false` if `limit` are.
    pub(crate) fn try_add(&self, limit: usize) -> bool {
        let added = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        if let Ok(n) = added {
            self.peak.fetch_max(n + 1, Ordering::AcqRel);
        }
        if added == Ok(0) {
            self.opened.notify_waiters();
        }
        added.is_ok()
    }

    /// Counts one more stream, whatever the count.
    pub(crate) fn add(&self) {
        let n = self.open.fetch_add(1, Ordering::AcqRel);
        self.peak.fetch_max(n + 1, Ordering::AcqRel);
        if n == 0 {
            self.opened.notify_waiters();
        }
    }

    /// The most streams ever open at once: the h2 connection under them keeps tables that
    /// many entries long for its life ([`crate::pool::PoolConfig::warm_max_streams`]).
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }

    /// One stream fewer; `true` if it was the last.
    pub(crate) fn remove(&self) -> bool {
        self.open.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Resolves once a stream is open (at once if one is).
    async fn busy(&self) {
        loop {
            // Enabled before the count is read: an open in between is not missed.
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.open() > 0 {
                return;
            }
            opened.await;
        }
    }
}

/// One stream counted in [`Streams`] for as long as it lives.
#[derive(Debug)]
pub(crate) struct Held(std::sync::Arc<Streams>);

impl Held {
    pub(crate) fn new(streams: &std::sync::Arc<Streams>) -> Self {
        streams.add();
        Self(streams.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// When a connection PINGs its peer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum When<'a> {
    /// Every interval, whatever it carries (a connection that lives for its one stream, as
    /// double HBONE's inner one, or one made outside a pool, whose streams are not counted).
    Always,
    /// Only while it carries streams: with none open, no timer runs and nothing is sent.
    Busy(&'a Streams),
}

/// Sends a PING every `interval` (while `when` says so) and returns when one is not answered
/// within `timeout` (or the connection is gone). The caller then closes the connection: its
/// peer has vanished.
pub(crate) async fn ping_until_dead(
    mut pings: h2::PingPong,
    when: When<'_>,
    interval: Duration,
    timeout: Duration,
) -> &'static str {
    let mut answered = tokio::time::Instant::now();
    loop {
        if let When::Busy(streams) = when {
            streams.busy().await;
        }
        // An interval after the last answer: at once for a connection that turns busy after
        // a longer quiet spell, so a peer that hung while it was idle (its kernel answering
        // the keepalive) fails the stream within `timeout`, not `interval + timeout`.
        tokio::time::sleep_until(answered + interval).await;
        if let When::Busy(streams) = when
            && streams.open() == 0
        {
            // Idle again: the kernel's keepalive watches it from here.
            continue;
        }
        match tokio::time::timeout(timeout, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => answered = tokio::time::Instant::now(),
            Ok(Err(_)) => return "the connection failed while waiting for a PING answer",
            Err(_) => return "no PING answer in time: the peer is gone",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Whether `f` is ready now.
    fn ready<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    }

    #[test]
    fn a_wait_for_a_stream_ends_when_the_first_opens_and_not_before() {
        let streams = Arc::new(Streams::default());
        let busy = streams.busy();
        tokio::pin!(busy);
        assert!(!ready(busy.as_mut()), "no stream open");
        let held = Held::new(&streams);
        assert!(ready(busy.as_mut()), "woken by the first stream");
        assert!(streams.try_add(2));
        assert!(!streams.try_add(2), "the limit holds");
        assert!(!streams.remove());
        drop(held);
        assert_eq!(streams.open(), 0);
        let again = streams.busy();
        tokio::pin!(again);
        assert!(!ready(again.as_mut()), "idle again");
        assert!(streams.try_add(1));
        assert!(ready(again.as_mut()), "woken by a reservation too");
        assert!(streams.remove(), "the last one");
        assert_eq!(streams.peak(), 2, "the most open at once");
    }
}
