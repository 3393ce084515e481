//! The accept loops every program runs, under the drain: HBONE, where each new connection is
//! served with the newest valid certificate of its identity (rotation without restarts), and
//! plain TCP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_core::identity::Identity;
use ferry_hbone::server::{Handler, Server};
use ferry_hbone::settings::Settings;
use ferry_tls::certs::CertManager;
use ferry_tls::config::TrustBundle;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::accept::Acceptor;
use crate::drain::DrainWatcher;

/// One HBONE listener: who it serves as, and with what.
#[derive(Clone, Debug)]
pub struct Hbone {
    /// For logs: which listener this is.
    pub what: &'static str,
    pub identity: Identity,
    pub certs: CertManager,
    /// The configured roots, used until certificates bring the CA's own.
    pub bundle: TrustBundle,
    pub settings: Settings,
    pub acceptor: Arc<Acceptor>,
    pub drain: DrainWatcher,
    /// HBONE connections being served (a gauge for memory and admin).
    pub open: Arc<Served>,
}

/// How many HBONE connections are being served, and a signal each time one closes.
#[derive(Debug, Default)]
pub struct Served {
    count: AtomicU64,
    closed: Notify,
}

// === impl Served ===

impl Served {
    /// Connections being served now.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Resolves when a connection closes after this was created (and enabled, if polled late).
    pub fn closed(&self) -> Notified<'_> {
        self.closed.notified()
    }
}

/// Counts one served connection for as long as it lives.
struct Open(Arc<Served>);

impl Open {
    fn new(served: &Arc<Served>) -> Self {
        served.count.fetch_add(1, Ordering::Relaxed);
        Self(served.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
        self.0.closed.notify_waiters();
    }
}

/// Accepts HBONE connections on each of `listeners` (a program's addresses, e.g. one of each
/// family) as [`serve_hbone`] does; returns once every one has stopped.
pub async fn serve_hbone_each<H: Handler>(
    listeners: Vec<TcpListener>,
    hbone: Hbone,
    handler: Arc<H>,
) {
    let mut each = tokio::task::JoinSet::new();
    for l in listeners {
        each.spawn(serve_hbone(l, hbone.clone(), handler.clone()));
    }
    while each.join_next().await.is_some() {}
}

/// Accepts HBONE connections on `listener` until the drain starts; each connection is served on
/// its own tracked task (the drain waits for it, and its GOAWAY and clean finish come from the
/// drain too).
pub async fn serve_hbone<H: Handler>(listener: TcpListener, hbone: Hbone, handler: Arc<H>) {
    let mut current: Option<(Vec<u8>, Arc<Server>)> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            c = hbone.acceptor.accept(&listener, hbone.what) => c,
            () = hbone.drain.draining() => return,
        };
        let creds = match hbone.certs.fetch(&hbone.identity).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(listener = hbone.what, identity = %hbone.identity, error = %e, "no certificate: refusing an HBONE connection");
                continue;
            }
        };
        let leaf = creds.leaf().to_vec();
        let server = match &current {
            Some((l, s)) if *l == leaf => s.clone(),
            _ => {
                let bundle = hbone
                    .certs
                    .trust_bundle()
                    .unwrap_or_else(|| hbone.bundle.clone());
                match Server::new(&creds, &bundle, hbone.settings.clone()) {
                    Ok(s) => {
                        let s = Arc::new(
                            s.drain_on(hbone.drain.drain_signal())
                                .finish_on(hbone.drain.finish_signal()),
                        );
                        current = Some((leaf, s.clone()));
                        s
                    }
                    Err(e) => {
                        tracing::error!(listener = hbone.what, identity = %hbone.identity, error = %e, "cannot build the HBONE server");
                        continue;
                    }
                }
            }
        };
        let (open, handler, what) = (Open::new(&hbone.open), handler.clone(), hbone.what);
        hbone.drain.spawn(async move {
            let _open = open;
            if let Err(e) = server.serve_connection(tcp, peer, handler).await {
                tracing::debug!(listener = what, peer.addr = %peer, error = %e, "HBONE connection ended with an error");
            }
        });
    }
}

/// Accepts TCP connections on `listener` (`what` names it in logs) until the drain starts; each
/// connection is served by `serve` on its own tracked task (the drain waits for it).
pub async fn serve_tcp<F, Fut>(
    listener: TcpListener,
    acceptor: &Acceptor,
    drain: &DrainWatcher,
    what: &'static str,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let (tcp, peer) = tokio::select! {
            c = acceptor.accept(&listener, what) => c,
            () = drain.draining() => return,
        };
        drain.spawn(serve(tcp, peer));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn serve_tcp_serves_each_connection_until_the_drain() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, drain) = crate::drain::new();
        let loop_drain = drain.clone();
        let served = tokio::spawn(async move {
            let acceptor = Acceptor::default();
            serve_tcp(
                listener,
                &acceptor,
                &loop_drain,
                "test",
                |mut tcp, _| async move {
                    let _ = tcp.write_all(b"served").await;
                },
            )
            .await;
        });
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"served");
        }
        let drained = trigger
            .drain(Duration::from_secs(5), Duration::from_secs(1))
            .await;
        assert_eq!(drained.left_at_deadline, 0);
        // The loop returns once the drain starts.
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("serve_tcp returns on drain")
            .unwrap();
    }

    #[tokio::test]
    async fn a_served_connection_is_counted_while_it_lives_and_its_close_wakes_followers() {
        let served = Arc::new(Served::default());
        let open = Open::new(&served);
        assert_eq!(served.count(), 1);
        let closed = served.closed();
        drop(open);
        tokio::time::timeout(std::time::Duration::from_secs(5), closed)
            .await
            .expect("woken by the close");
        assert_eq!(served.count(), 0);
    }
}
