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
//! - **Idle connections close**: a connection with no stream for `idle_timeout` is dropped.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_tls::config::{Credentials, TrustBundle};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

/// Pool limits.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub max_streams: usize,
    /// The first idle connection of a key is kept this long (a warm connection for the next
    /// burst).
    pub idle_timeout: Duration,
    /// Further idle connections of the same key (left over from a burst) go after this long,
    /// so the memory a spike took comes back soon.
    pub surplus_idle_timeout: Duration,
    pub settings: Settings,
    /// Makes the TCP connections (a node proxy dials from inside each pod's namespace).
    pub dialer: std::sync::Arc<dyn crate::client::Dialer>,
}

impl PoolConfig {
    /// How often idle connections are looked at: an idle one is let go at most this long after
    /// its timeout.
    pub fn reap_period(&self) -> Duration {
        (self.idle_timeout.min(self.surplus_idle_timeout) / 4).max(Duration::from_millis(10))
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams: 100,
            idle_timeout: Duration::from_secs(300),
            surplus_idle_timeout: Duration::from_secs(10),
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
    idle_since: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Inner {
    config: PoolConfig,
    conns: Mutex<HashMap<PoolKey, Vec<Arc<Entry>>>>,
    dialing: Mutex<HashMap<PoolKey, Arc<tokio::sync::Mutex<()>>>>,
    handshakes: AtomicU64,
    /// Woken when the reaper lets connections go (idle, or their driver ended).
    closed: tokio::sync::Notify,
}

impl Pool {
    /// A new pool; spawns its idle reaper on the current tokio runtime.
    pub fn new(config: PoolConfig) -> Self {
        let inner = Arc::new(Inner {
            config,
            conns: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
            handshakes: AtomicU64::new(0),
            closed: tokio::sync::Notify::new(),
        });
        tokio::spawn(reap(Arc::downgrade(&inner)));
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
        let (entry, fresh) = self.acquire(key, creds, bundle).await?;
        let reservation = Reservation(entry);
        match reservation.0.conn.open(authority, headers).await {
            Ok(stream) => Ok(Tunnel {
                stream,
                _reservation: reservation,
            }),
            // A pooled connection that went away (GOAWAY, peer restart) between uses: never hand
            // it out again, and try once more on a new one. A refusal (an HTTP status) is final.
            Err(Error::H2 { .. }) if !fresh => {
                reservation.0.conn.mark_closed();
                drop(reservation);
                let entry = self.dial_locked(key, creds, bundle).await?;
                let reservation = Reservation(entry);
                let stream = reservation.0.conn.open(authority, headers).await?;
                Ok(Tunnel {
                    stream,
                    _reservation: reservation,
                })
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
        let _guard = lock.lock().await;
        match self.checkout(key) {
            Some(e) => Ok((e, false)),
            None => Ok((self.dial(key, creds, bundle).await?, true)),
        }
    }

    /// A new connection for `key`, one dial at a time per key.
    async fn dial_locked(
        &self,
        key: &PoolKey,
        creds: &Credentials,
        bundle: &TrustBundle,
    ) -> Result<Arc<Entry>, Error> {
        let lock = self.dial_lock(key);
        let _guard = lock.lock().await;
        self.dial(key, creds, bundle).await
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

    /// A live connection for `key` with a free stream slot, reserved.
    fn checkout(&self, key: &PoolKey) -> Option<Arc<Entry>> {
        let mut conns = self.inner.conns.lock();
        let list = conns.get_mut(key)?;
        list.retain(|e| !e.conn.is_closed());
        let max = self.inner.config.max_streams;
        let entry = list.iter().find(|e| {
            // The peer's own stream limit caps ours: beyond it, requests would queue.
            let limit = max.min(e.conn.peer_stream_limit());
            e.conn
                .active
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < limit).then_some(n + 1)
                })
                .is_ok()
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
        let conn = Connection::connect(
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
        conn.active.store(1, Ordering::Release);
        let entry = Arc::new(Entry {
            conn: Arc::new(conn),
            idle_since: Mutex::new(None),
        });
        self.inner
            .conns
            .lock()
            .entry(key.clone())
            .or_default()
            .push(entry.clone());
        tracing::debug!(dst.addr = %key.dst, src.identity = %key.local, "new HBONE connection");
        Ok(entry)
    }
}

/// Drops idle and broken connections until the pool is gone.
async fn reap(inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(i) => i.config.reap_period(),
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let timeout = inner.config.idle_timeout;
        let surplus = inner.config.surplus_idle_timeout.min(timeout);
        let mut conns = inner.conns.lock();
        let before: usize = conns.values().map(Vec::len).sum();
        for list in conns.values_mut() {
            let mut idle_kept = 0;
            list.retain(|e| {
                if e.conn.is_closed() {
                    return false;
                }
                let idle = e.conn.active.load(Ordering::Acquire) == 0;
                let mut since = e.idle_since.lock();
                let limit = if idle_kept == 0 { timeout } else { surplus };
                match (*since, idle) {
                    (_, false) => *since = None,
                    (None, true) => *since = Some(now),
                    (Some(t), true) if now.duration_since(t) >= limit => return false,
                    (Some(_), true) => {}
                }
                if idle {
                    idle_kept += 1;
                }
                true
            });
        }
        conns.retain(|_, list| !list.is_empty());
        let let_go = conns.values().map(Vec::len).sum::<usize>() < before;
        drop(conns);
        if let_go {
            inner.closed.notify_waiters();
        }
        inner
            .dialing
            .lock()
            .retain(|_, lock| Arc::strong_count(lock) > 1);
    }
}

/// A reserved stream slot, released when dropped.
#[derive(Debug)]
struct Reservation(Arc<Entry>);

impl Drop for Reservation {
    fn drop(&mut self) {
        self.0.conn.active.fetch_sub(1, Ordering::AcqRel);
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
