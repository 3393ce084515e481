//! The loopback rig the HBONE benchmarks share: an HBONE server admitting every CONNECT, pools
//! that reach it, targets (a sink, an echo) and a node proxy's outbound in miniature. Each
//! benchmark uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey, Tunnel};
use ferry_hbone::server::Server;
use ferry_hbone::settings::Settings;
use ferry_tls::config::{Credentials, TrustBundle};
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{AllowAll, CLIENT, SERVER, id};

/// A CA and an HBONE server on loopback, serving on the current runtime.
pub(crate) struct Env {
    pub(crate) ca: TestCa,
    pub(crate) hbone: SocketAddr,
}

impl Env {
    pub(crate) async fn new() -> Self {
        let ca = TestCa::new("bench");
        let settings = Settings {
            max_concurrent_streams: 1000,
            ..Settings::default()
        };
        let server = Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), settings).unwrap());
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hbone = l.local_addr().unwrap();
        tokio::spawn(server.serve(l, Arc::new(AllowAll)));
        Self { ca, hbone }
    }

    /// A pool of `max_streams` per connection, its key to the server and the client's
    /// credentials.
    pub(crate) fn pool(&self, max_streams: usize) -> (Pool, PoolKey, Credentials) {
        let pool = Pool::new(PoolConfig {
            max_streams,
            ..PoolConfig::default()
        });
        let key = PoolKey::new(
            id(CLIENT),
            "127.0.0.1".parse().unwrap(),
            self.hbone,
            vec![id(SERVER)],
        );
        (pool, key, self.ca.issue_str(CLIENT))
    }
}

/// A loopback server that serves each connection it accepts with `serve`, on its own task.
pub(crate) async fn serve_each<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            tokio::spawn(serve(s));
        }
    });
    addr
}

/// A sink that discards everything and answers EOF with one byte.
pub(crate) async fn sink() -> SocketAddr {
    serve_each(|mut s| async move {
        let mut buf = vec![0u8; 256 << 10];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        let _ = s.write_all(b"!").await;
    })
    .await
}

/// An echo server: each connection echoed until EOF, 1 KiB at a time (the round trips' size).
pub(crate) async fn echo() -> SocketAddr {
    serve_each(|mut s| async move {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await
}

/// A pooled tunnel to `target`, as the benchmark's client.
pub(crate) async fn tunnel(
    pool: &Pool,
    key: &PoolKey,
    creds: &Credentials,
    bundle: &TrustBundle,
    target: SocketAddr,
) -> Tunnel {
    pool.open(
        key,
        creds,
        bundle,
        &target.to_string(),
        &ConnectHeaders::default(),
    )
    .await
    .unwrap()
}

/// Writes `total` bytes in 256 KiB writes, closes the write side and waits for the sink's byte:
/// how long that took.
pub(crate) async fn send_all<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    total: usize,
) -> Duration {
    let chunk = vec![0x5au8; 256 << 10];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&chunk).await.unwrap();
        sent += chunk.len();
    }
    s.shutdown().await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    start.elapsed()
}

/// One byte there and back, then a clean close: our FIN (END_STREAM), and the target's back.
pub(crate) async fn echo_once<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
    let mut b = [0u8; 1];
    s.write_all(b"x").await.expect("write");
    s.read_exact(&mut b).await.expect("read");
    s.shutdown().await.expect("shutdown");
    assert_eq!(s.read(&mut b).await.expect("read the end"), 0, "the end");
}

/// A node proxy's outbound, in miniature: each connection accepted on the returned address is
/// relayed into a new pooled tunnel to `target` ([`ferry_hbone::copy::relay`]).
pub(crate) async fn outbound(env: &Env, target: SocketAddr) -> SocketAddr {
    let (pool, key, creds) = env.pool(100);
    let bundle = env.ca.bundle();
    let ctx = Arc::new((pool, key, creds, bundle));
    serve_each(move |mut s| {
        let ctx = ctx.clone();
        async move {
            let (p, k, c, b) = &*ctx;
            let mut t = tunnel(p, k, c, b, target).await;
            let _ = ferry_hbone::copy::relay(&mut s, &mut t, Default::default()).await;
        }
    })
    .await
}
