//! Shared pieces of the HBONE tests: servers on loopback, handlers, identities.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_hbone::headers::{ConnectHeaders, Refusal};
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::{ConnectRequest, Handler, Server};
use ferry_hbone::settings::Settings;
use ferry_tls::config::Credentials;
use ferry_tls::testkit::TestCa;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
pub const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

pub fn id(s: &str) -> Identity {
    s.parse().expect("identity")
}

/// Polls `cond` until it holds or `deadline` passes.
pub async fn eventually(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Allows everything and records what it saw.
#[derive(Debug, Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<ConnectRequest>>,
    pub deny: bool,
}

impl Handler for Recorder {
    type Admit = ();

    fn admit(&self, request: &ConnectRequest) -> Result<(), Refusal> {
        self.seen.lock().push(request.clone());
        if self.deny {
            Err(Refusal::Denied(format!("{} may not connect", request.peer)))
        } else {
            Ok(())
        }
    }
}

/// An echo server on loopback: echoes until EOF, then closes its write half.
pub async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// A target that records the first 8 bytes of each connection, in accept order.
pub async fn recording_target() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (s2, a2) = (seen.clone(), accepted.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            a2.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 8];
            if s.read_exact(&mut buf).await.is_ok() {
                s2.lock().push(buf.to_vec());
            }
        }
    });
    (addr, seen, accepted)
}

/// An HBONE server for `identity` on loopback.
pub async fn hbone_server<H: Handler>(
    ca: &TestCa,
    identity: &str,
    handler: Arc<H>,
    settings: Settings,
) -> SocketAddr {
    let server = Arc::new(Server::new(&ca.issue_str(identity), &ca.bundle(), settings).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(server.serve(l, handler));
    addr
}

/// A client pool plus what it needs to open tunnels.
#[derive(Debug)]
pub struct ClientSide {
    pub pool: Pool,
    pub creds: Credentials,
    pub ca: Arc<TestCa>,
}

impl ClientSide {
    pub fn new(ca: Arc<TestCa>, config: PoolConfig) -> Self {
        Self {
            pool: Pool::new(config),
            creds: ca.issue_str(CLIENT),
            ca,
        }
    }

    pub fn key(&self, dst: SocketAddr, accepted: &[&str]) -> PoolKey {
        PoolKey::new(
            id(CLIENT),
            "127.0.0.1".parse().unwrap(),
            dst,
            accepted.iter().map(|s| id(s)).collect(),
        )
    }

    pub async fn open(
        &self,
        hbone: SocketAddr,
        target: SocketAddr,
    ) -> Result<ferry_hbone::pool::Tunnel, ferry_hbone::Error> {
        self.pool
            .open(
                &self.key(hbone, &[SERVER]),
                &self.creds,
                &self.ca.bundle(),
                &target.to_string(),
                &ConnectHeaders::default(),
            )
            .await
    }
}

/// A TCP relay that can freeze: it stops forwarding but keeps both sockets open, as a peer
/// that vanished without a FIN or RST looks from outside.
pub async fn freezable_relay(
    to: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    (relay(to, frozen.clone(), pump).await, frozen)
}

/// A TCP relay on loopback to `to`: each connection's two directions run `forward`, with a
/// clone of `state` each; the relay's address.
async fn relay<S, F, Fut>(to: std::net::SocketAddr, state: S, forward: F) -> std::net::SocketAddr
where
    S: Clone + Send + 'static,
    F: Fn(tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf, S) -> Fut
        + Copy
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (a, _) = l.accept().await.unwrap();
            let b = tokio::net::TcpStream::connect(to).await.unwrap();
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(forward(ar, bw, state.clone()));
            tokio::spawn(forward(br, aw, state.clone()));
        }
    });
    addr
}

async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(std::sync::atomic::Ordering::SeqCst) {
            // Hold both halves open, forwarding nothing, until the test ends.
            std::future::pending::<()>().await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A TCP relay that counts the TLS records crossing it, both ways: through an HBONE
/// connection's TLS, what its peers send each other (data, PINGs and their answers) without
/// reading it.
pub async fn counting_relay(
    to: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let records = Arc::new(std::sync::atomic::AtomicU64::new(0));
    (relay(to, records.clone(), count_records).await, records)
}

/// Forwards `r` to `w`, adding each TLS record that starts in it to `records`.
async fn count_records(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    records: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut buf = vec![0u8; 16 << 10];
    // A record's 5-byte header as far as read, and how much of its body is still to come.
    let (mut header, mut have, mut skip) = ([0u8; 5], 0usize, 0usize);
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut data = &buf[..n];
        while !data.is_empty() {
            if skip > 0 {
                let k = skip.min(data.len());
                skip -= k;
                data = &data[k..];
                continue;
            }
            let k = (header.len() - have).min(data.len());
            header[have..have + k].copy_from_slice(&data[..k]);
            have += k;
            data = &data[k..];
            if have == header.len() {
                skip = usize::from(u16::from_be_bytes([header[3], header[4]]));
                have = 0;
                records.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
