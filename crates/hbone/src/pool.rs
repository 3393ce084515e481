//! A pool of HBONE connections.
//!
//! Invariants:
//! - **Keys carry every security-relevant attribute**: the local identity we present, the
//!   source IP we dial from (a node proxy dials as the pod; sharing across pods would let one
//!   pod's traffic ride another's connection), the destination address, and the set of peer
//!   identities we accept. Two requests share a connection only if all four are equal.
//! - **One handshake per burst**: concurrent first requests for one key wait on that key's dial
//!   lock; the first dials, the rest find its connection.
//! - **Bounded streams per connection**: a connection carries at most `max_streams` streams at
//!   once; when all are full, another connection opens.
//! - **Broken connections are never handed out**: a connection whose driver ended (error or
//!   GOAWAY) is skipped and evicted.
//! - **Idle connections are quiet**: a connection PINGs its peer only while it carries streams;
//!   an idle one is left to the kernel's TCP keepalive ([`crate::keepalive`]), so the warm
//!   connection of a quiet proxy runs no code.
//! - **Idle connections close**: a connection with no stream for `idle_timeout` is dropped
//!   (its surplus siblings of the same key after `surplus_idle_timeout`, and so is one that
//!   once carried more than `warm_max_streams` at once: h2 keeps tables that long). No sweep: each
//!   connection has its own watcher, woken when a stream slot is released and asleep until its
//!   own deadline ([`expire`]); one that is used again before then simply stays.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_tls::config::{Credentials, TrustBundle};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::Connection;
use crate::error::Error;
use crate::headers::ConnectHeaders;
use crate::settings::Settings;
use crate::stream::H2Stream;

/// What makes two connections interchangeable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub local: Identity,
    pub(crate) src_ip: IpAddr,
    pub dst: SocketAddr,
    /// Sorted and de-duplicated by [`PoolKey::new`].
    pub accepted: Vec<Identity>,
}

impl PoolKey {
    pub fn new(
        local: Identity,
        src_ip: IpAddr,
        dst: SocketAddr,
        mut accepted: Vec<Identity>,
    ) -> Self {
        accepted.sort();
        accepted.dedup();
        Self {
            local,
            src_ip,
            dst,
            accepted,
        }
    }
}

pub use crate::settings::MAX_STREAMS;

/// [`PoolConfig::warm_max_streams`]'s default: ztunnel's streams per connection, a table of
/// 128 slots.
pub const WARM_MAX_STREAMS: usize = 100;

/// Pool limits.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Streams one connection carries at once (capped by what its peer allows). Each
    /// connection costs about 48 KB at each end (TLS and HTTP/2 state and buffers), whatever
    /// its streams carry: at 100 it was 0.47 KiB per idle proxied connection per end (issue 21,
    /// measured with `ferry lab bench-memory`); a busy stream is bounded by its own window.
    pub max_streams: usize,
    /// The first idle connection of a key is kept this long (a warm connection for the next
    /// burst).
    pub idle_timeout: Duration,
    /// Further idle connections of the same key (left over from a burst) go after this long,
    /// so the memory a spike took comes back soon.
    pub surplus_idle_timeout: Duration,
    /// A connection that has carried more streams than this at once is never the one kept
    /// warm: it goes after `surplus_idle_timeout` like a burst's other connections. h2 keeps
    /// each connection's stream table and frame queues (slabs) as long as the most streams it
    /// ever had open, for the connection's life, at both ends (issue 21: the warm connection a
    /// 5,000-connection spike left, 1,000 streams at once, kept about 0.7 MB in each node
    /// proxy for 5 minutes). The next tunnel after such a burst dials a new connection.
    pub warm_max_streams: usize,
    pub settings: Settings,
    /// Makes the TCP connections (a node proxy dials from inside each pod's namespace).
    pub dialer: std::sync::Arc<dyn crate::client::Dialer>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams: MAX_STREAMS,
            idle_timeout: Duration::from_secs(300),
            surplus_idle_timeout: Duration::from_secs(10),
            warm_max_streams: WARM_MAX_STREAMS,
            settings: Settings::default(),
            dialer: std::sync::Arc::new(crate::client::DirectDialer),
        }
    }
}

/// Shares HBONE connections between tunnels.
#[derive(Clone, Debug)]
pub struct Pool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Entry {
    conn: Arc<Connection>,
    /// Since when it has carried no stream; `None` while it carries some.
    idle_since: Mutex<Option<Instant>>,
    /// Shared by the connections of one key.
    key: Arc<KeyWatch>,
    /// Its watcher sleeps with no deadline (the connection carried streams when it looked):
    /// the release of its last stream must wake it.
    watcher_unbounded: AtomicBool,
    /// [`PoolConfig::warm_max_streams`]: past that peak, its deadline is the surplus one, which
    /// a release must tell its watcher of.
    warm_max_streams: usize,
}

/// What the watchers of one key's connections share.
#[derive(Debug, Default)]
struct KeyWatch {
    /// Notified when a connection releases its last stream and a watcher needs to look again:
    /// its own sleeps with no deadline, or the key has other connections, whose deadlines may
    /// change with it (only the first idle one stays warm), or it carried too many streams at
    /// once to stay warm (its deadline is the surplus one now). A lone connection's watcher
    /// asleep until its deadline is not woken otherwise: that deadline can only move later,
    /// which it finds when it looks then. (One wake-up per stream of a reused connection was a second worker
    /// woken per stream, issue 21.)
    idled: Notify,
    /// How many connections of the key are in the pool.
    conns: AtomicUsize,
}

#[derive(Debug)]
struct Inner {
    config: PoolConfig,
    conns: Mutex<HashMap<PoolKey, Vec<Arc<Entry>>>>,
    dialing: Mutex<HashMap<PoolKey, Arc<tokio::sync::Mutex<()>>>>,
    handshakes: AtomicU64,
    /// Woken when connections are let go (idle past their timeout, or their driver ended).
    closed: Notify,
}

impl Pool {
    /// A new pool. Each connection it dials gets its idle watcher on the current tokio runtime.
    pub fn new(config: PoolConfig) -> Self {
        let inner = Arc::new(Inner {
            config,
            conns: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
            handshakes: AtomicU64::new(0),
            closed: Notify::new(),
        });
        Self { inner }
    }

    /// Lets go of every pooled connection: each closes (GOAWAY, TLS close_notify) once the
    /// tunnels still on it are done. Waits up to `max` for them all to have closed.
    pub async fn shutdown(&self, max: Duration) {
        let entries: Vec<Arc<Entry>> = self
            .inner
            .conns
            .lock()
            .drain()
            .flat_map(|(_, list)| list)
            .collect();
        let mut ended: Vec<_> = entries.iter().map(|e| e.conn.ended.clone()).collect();
        drop(entries);
        let deadline = tokio::time::Instant::now() + max;
        for rx in &mut ended {
            // Resolves (with an error) when the connection's driver drops its sender.
            let _ = tokio::time::timeout_at(deadline, rx.wait_for(|()| false)).await;
        }
    }

    /// Handshakes performed so far (a new connection each).
    pub fn handshakes(&self) -> u64 {
        self.inner.handshakes.load(Ordering::Relaxed)
    }

    /// Resolves the next time pooled connections are let go (idle past their timeout, or
    /// broken), after this was created (and enabled, if polled late).
    pub fn closed(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.closed.notified()
    }

    /// Open connections (not yet known to be broken).
    pub fn connections(&self) -> usize {
        self.inner
            .conns
            .lock()
            .values()
            .flatten()
            .filter(|e| !e.conn.is_closed())
            .count()
    }

    /// Opens a tunnel to `authority` through a pooled connection for `key`.
    pub async fn open(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
        authority: &str,
        headers: &ConnectHeaders,
    ) -> Result<Tunnel, Error> {
        self.open_timed(key, creds, bundle, authority, headers)
            .await
            .map(|(t, _)| t)
    }

    /// [`Pool::open`], and how long the handshake of a new connection took (TCP, TLS and
    /// HTTP/2 settings), if the tunnel needed one; `None` when a pooled connection carried it.
    pub async fn open_timed(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
        authority: &str,
        headers: &ConnectHeaders,
    ) -> Result<(Tunnel, Option<Duration>), Error> {
        let started = Instant::now();
        let (entry, fresh) = self.acquire(key, creds, bundle).await?;
        let mut dialed = fresh.then(|| started.elapsed());
        let reservation = Reservation(entry);
        match reservation.0.conn.open(authority, headers).await {
            Ok(stream) => Ok((
                Tunnel {
                    stream,
                    _reservation: reservation,
                },
                dialed,
            )),
            // A pooled connection that went away (GOAWAY, peer restart) between uses, or a new
            // one whose peer turned the stream away (a draining proxy that had accepted the
            // connection just before its drain began): never hand it out again, and try once
            // more on a new one. A refusal (an HTTP status) is final.
            Err(Error::H2 { ref source, .. }) if !fresh || turned_away(source) => {
                reservation.0.conn.mark_closed();
                drop(reservation);
                let redial = Instant::now();
                let entry = self.dial_locked(key, creds, bundle).await?;
                dialed = Some(redial.elapsed());
                let reservation = Reservation(entry);
                let stream = reservation.0.conn.open(authority, headers).await?;
                Ok((
                    Tunnel {
                        stream,
                        _reservation: reservation,
                    },
                    dialed,
                ))
            }
            Err(e) => Err(e),
        }
    }

    /// A reserved slot on a pooled connection, or on a new one (`true`).
    async fn acquire(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
    ) -> Result<(Arc<Entry>, bool), Error> {
        if let Some(e) = self.checkout(key) {
            return Ok((e, false));
        }
        let lock = self.dial_lock(key);
        let guard = lock.lock().await;
        let got = match self.checkout(key) {
            Some(e) => Ok((e, false)),
            None => self.dial(key, creds, bundle).await.map(|e| (e, true)),
        };
        drop(guard);
        self.release_dial_lock(lock);
        got
    }

    /// A new connection for `key`, one dial at a time per key.
    async fn dial_locked(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
    ) -> Result<Arc<Entry>, Error> {
        let lock = self.dial_lock(key);
        let guard = lock.lock().await;
        let got = self.dial(key, creds, bundle).await;
        drop(guard);
        self.release_dial_lock(lock);
        got
    }

    /// The lock that lets one dial at a time happen for `key`.
    fn dial_lock(&self, key: &PoolKey) -> Arc<tokio::sync::Mutex<()>> {
        self.inner
            .dialing
            .lock()
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Gives back a dial lock; the locks no one holds or waits on are forgotten.
    fn release_dial_lock(&self, lock: Arc<tokio::sync::Mutex<()>>) {
        drop(lock);
        self.inner
            .dialing
            .lock()
            .retain(|_, lock| Arc::strong_count(lock) > 1);
    }

    /// A live connection for `key` with a free stream slot, reserved.
    fn checkout(&self, key: &PoolKey) -> Option<Arc<Entry>> {
        let mut conns = self.inner.conns.lock();
        let list = conns.get_mut(key)?;
        let before = list.len();
        list.retain(|e| !e.conn.is_closed());
        if let Some(e) = list.first() {
            e.key.conns.fetch_sub(before - list.len(), Ordering::SeqCst);
        }
        let max = self.inner.config.max_streams;
        let entry = list.iter().find(|e| {
            // The peer's own stream limit caps ours: beyond it, requests would queue.
            let limit = max.min(e.conn.peer_stream_limit());
            e.conn.streams.try_add(limit)
        })?;
        *entry.idle_since.lock() = None;
        Some(entry.clone())
    }

    async fn dial(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
    ) -> Result<Arc<Entry>, Error> {
        let conn = Connection::connect_pooled(
            &*self.inner.config.dialer,
            Some(key.src_ip),
            key.dst,
            creds,
            bundle,
            key.accepted.clone(),
            &self.inner.config.settings,
        )
        .await?;
        self.inner.handshakes.fetch_add(1, Ordering::Relaxed);
        conn.streams.add();
        let ended = conn.ended.clone();
        let entry = {
            let mut conns = self.inner.conns.lock();
            let list = conns.entry(key.clone()).or_default();
            let watch: Arc<KeyWatch> = list.first().map_or_else(Arc::default, |e| e.key.clone());
            watch.conns.fetch_add(1, Ordering::SeqCst);
            let entry = Arc::new(Entry {
                conn: Arc::new(conn),
                idle_since: Mutex::new(None),
                key: watch,
                watcher_unbounded: AtomicBool::new(false),
                warm_max_streams: self.inner.config.warm_max_streams,
            });
            list.push(entry.clone());
            entry
        };
        tokio::spawn(expire(
            Arc::downgrade(&self.inner),
            key.clone(),
            Arc::downgrade(&entry),
            entry.key.clone(),
            ended,
        ));
        tracing::debug!(dst.addr = %key.dst, src.identity = %key.local, "new HBONE connection");
        Ok(entry)
    }
}

/// What [`Inner::review`] found about one connection.
#[derive(Debug, PartialEq, Eq)]
enum Review {
    /// It carries streams: nothing to do until it releases its last one.
    Busy,
    /// Idle: let go at this instant unless it is used before.
    Until(Instant),
    /// Let go now (idle past its timeout, or broken), or already no longer in the pool.
    Gone,
}

impl Inner {
    /// Looks at `entry` of `key` at `now`, and lets it go if its time has come: the first idle
    /// connection of a key (in dial order) that never carried more than `warm_max_streams`
    /// at once stays `idle_timeout`, the others `surplus_idle_timeout`.
    fn review(&self, key: &PoolKey, entry: &Arc<Entry>, now: Instant) -> Review {
        let mut conns = self.conns.lock();
        let Some(list) = conns.get_mut(key) else {
            return Review::Gone;
        };
        let Some(pos) = list.iter().position(|e| Arc::ptr_eq(e, entry)) else {
            return Review::Gone;
        };
        let idle = |e: &Entry| !e.conn.is_closed() && e.conn.streams.open() == 0;
        // Only a connection whose tables stayed small may stay warm.
        let warm = |e: &Entry| idle(e) && e.conn.streams.peak() <= self.config.warm_max_streams;
        let review = if entry.conn.is_closed() {
            Review::Gone
        } else {
            match *entry.idle_since.lock() {
                // Reserved under this lock only: with none, it is idle since its last release.
                Some(since) if idle(entry) => {
                    let first = list.iter().position(|e| warm(e)) == Some(pos);
                    let timeout = self.config.idle_timeout;
                    let limit = if first {
                        timeout
                    } else {
                        self.config.surplus_idle_timeout.min(timeout)
                    };
                    if now.duration_since(since) >= limit {
                        Review::Gone
                    } else {
                        Review::Until(since + limit)
                    }
                }
                _ => Review::Busy,
            }
        };
        if review == Review::Gone {
            list.remove(pos).key.conns.fetch_sub(1, Ordering::SeqCst);
            if list.is_empty() {
                conns.remove(key);
            }
            drop(conns);
            self.closed.notify_waiters();
        }
        review
    }
}

/// Watches one pooled connection until it leaves the pool: asleep while it carries streams,
/// woken when its key's connections release their last stream ([`KeyWatch::idled`]), and at its own idle
/// deadline; let go there if it is still idle, or as soon as its driver ends (`ended`). Holds
/// no strong reference to it, so that the pool's shutdown and drop still close it.
async fn expire(
    inner: Weak<Inner>,
    key: PoolKey,
    entry: Weak<Entry>,
    watch: Arc<KeyWatch>,
    mut ended: tokio::sync::watch::Receiver<()>,
) {
    loop {
        // Enabled before the review: a release after it is not missed.
        let released = watch.idled.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        let review = match (inner.upgrade(), entry.upgrade()) {
            (Some(inner), Some(entry)) => {
                // Said before the review reads `idle_since`, which a release writes before it
                // reads this (a SeqCst fence between, on both sides): either the review sees the release, or the release
                // sees this and wakes the watcher (`released` is enabled already).
                entry.watcher_unbounded.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                let review = inner.review(&key, &entry, Instant::now());
                if review != Review::Busy {
                    entry.watcher_unbounded.store(false, Ordering::SeqCst);
                }
                review
            }
            _ => return,
        };
        let deadline = match review {
            Review::Gone => return,
            Review::Busy => None,
            Review::Until(at) => Some(at),
        };
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut released => {}
            () = sleep => {}
            _ = ended.changed() => {
                // The driver ended (its sender is gone): broken, let go now.
                if let Some(inner) = inner.upgrade() {
                    if let Some(entry) = entry.upgrade() {
                        entry.conn.mark_closed();
                        inner.review(&key, &entry, Instant::now());
                    }
                    inner.closed.notify_waiters();
                }
                return;
            }
        }
    }
}

/// A reserved stream slot, released when dropped.
#[derive(Debug)]
struct Reservation(Arc<Entry>);

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.0.conn.streams.remove() {
            *self.0.idle_since.lock() = Some(Instant::now());
            std::sync::atomic::fence(Ordering::SeqCst);
            let e = &self.0;
            if e.watcher_unbounded.load(Ordering::SeqCst)
                || e.key.conns.load(Ordering::SeqCst) > 1
                || e.conn.streams.peak() > e.warm_max_streams
            {
                e.key.idled.notify_waiters();
            }
        }
    }
}

/// A tunnel opened through the pool. Dropping it frees its stream slot.
#[derive(Debug)]
pub struct Tunnel {
    stream: H2Stream,
    _reservation: Reservation,
}

impl Tunnel {
    /// Resets the tunnel (the peer sees RST_STREAM, not a clean end).
    pub fn abort(&mut self) {
        self.stream.abort();
    }
}

impl crate::copy::Reset for Tunnel {
    fn reset(&mut self) {
        self.abort();
    }

    fn poll_read_bytes(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<Poll<std::io::Result<bytes::Bytes>>> {
        self.stream.poll_read_bytes(cx)
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut bytes::Bytes,
    ) -> Option<Poll<std::io::Result<usize>>> {
        self.stream.poll_write_bytes(cx, data)
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Whether a new connection's peer turned its first stream away before answering it:
/// - refused unprocessed (RFC 9113 §8.1.4): above the last stream id of the peer's GOAWAY, or
///   reset with REFUSED_STREAM;
/// - or the connection failed under it (an I/O error). A peer that sends its GOAWAY and closes
///   at once resets the HEADERS still in flight, and the client may see the broken pipe
///   before it reads the GOAWAY.
///
/// Either way the CONNECT had no answer, so no byte of the client's reached an application
/// ([`Connection::open`](crate::client::Connection::open) returns only with the response):
/// the stream may be sent again on another connection.
fn turned_away(e: &h2::Error) -> bool {
    (e.is_go_away() && e.is_remote()) || e.reason() == Some(h2::Reason::REFUSED_STREAM) || e.is_io()
}
