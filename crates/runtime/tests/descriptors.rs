//! One descriptor per proxied leg at the destination (issue 21, finding 4): a held tunnel is
//! re-checked through its own change signal ([`interrupt_on_denial`], what the node proxy's
//! inbound waits on), not through a duplicate of its upstream socket; and a policy change still
//! ends every held tunnel.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferry_core::identity::Identity;
use ferry_hbone::headers::{ConnectHeaders, Refusal, Target};
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::{ConnectRequest, Handler, Server};
use ferry_hbone::settings::Settings;
use ferry_hbone::upstream::Forward;
use ferry_runtime::recheck::{from_now, interrupt_on_denial};
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

fn id(s: &str) -> Identity {
    s.parse().expect("identity")
}

/// Descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// The destination's handler, in the node proxy's inbound shape: TCP to the target, held until
/// a change on `allowed` no longer allows it.
struct Guarded {
    allowed: watch::Receiver<bool>,
}

impl Handler for Guarded {
    type Admit = ();

    fn admit(&self, _: &ConnectRequest) -> Result<(), Refusal> {
        Ok(())
    }

    fn connect(
        &self,
        request: &ConnectRequest,
        _: &mut (),
    ) -> impl Future<Output = Result<Forward, Refusal>> + Send {
        let changes = from_now(&self.allowed);
        let allowed = self.allowed.clone();
        let target = request.target.clone();
        async move {
            let Target::Addr(addr) = target else {
                return Err(Refusal::Unavailable("not an address".into()));
            };
            let up = TcpStream::connect(addr)
                .await
                .map_err(|e| Refusal::Unavailable(e.to_string()))?;
            let recheck = interrupt_on_denial(changes, move || {
                if *allowed.borrow() {
                    Ok(())
                } else {
                    Err("denied by a policy change".to_string())
                }
            });
            Ok(Forward::from(up).until(recheck))
        }
    }
}

/// A target that holds every connection until its peer ends it; counts those it holds.
async fn holding_target() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let held = Arc::new(AtomicUsize::new(0));
    let h = held.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            h.fetch_add(1, Ordering::SeqCst);
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                h.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, held)
}

/// Polls `cond` until it holds or `deadline` passes.
async fn eventually(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + deadline;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_tunnel_costs_one_descriptor_at_the_destination_and_a_policy_change_still_ends_it() {
    const N: usize = 150;
    let ca = TestCa::new("root");
    let (target, held) = holding_target().await;
    let (allow, allowed) = watch::channel(true);
    let server =
        Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), Settings::default()).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hbone = l.local_addr().unwrap();
    tokio::spawn(server.serve(l, Arc::new(Guarded { allowed })));
    let pool = Pool::new(PoolConfig {
        max_streams: 1000,
        ..PoolConfig::default()
    });
    let key = PoolKey::new(
        id(CLIENT),
        "127.0.0.1".parse().unwrap(),
        hbone,
        vec![id(SERVER)],
    );
    let (creds, bundle) = (ca.issue_str(CLIENT), ca.bundle());
    let before = open_fds();
    let mut tunnels = Vec::with_capacity(N);
    for i in 0..N {
        let mut t = pool
            .open(
                &key,
                &creds,
                &bundle,
                &target.to_string(),
                &ConnectHeaders::default(),
            )
            .await
            .expect("tunnel");
        // Up end to end: the byte comes back from the target.
        t.write_all(&[i as u8]).await.unwrap();
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.unwrap();
        tunnels.push(t);
    }
    assert_eq!(held.load(Ordering::SeqCst), N);
    assert_eq!(pool.connections(), 1);
    // In this process: the target's N accepted sockets, the destination's N upstream legs, and
    // the HBONE connection's two ends. A duplicate per held tunnel (for its re-checks) would
    // add N more.
    let added = open_fds().saturating_sub(before);
    eprintln!("{N} held tunnels added {added} descriptors in this process");
    assert!(
        added <= 2 * N + 8,
        "{N} held tunnels added {added} descriptors: more than one per leg at the destination"
    );
    // A policy change ends every held tunnel: the client sees each one reset, the target each
    // connection end, and the destination's descriptors go.
    allow.send(false).unwrap();
    for t in &mut tunnels {
        let mut b = [0u8; 1];
        let ended = tokio::time::timeout(Duration::from_secs(10), t.read(&mut b))
            .await
            .expect("a denied tunnel ends");
        assert!(matches!(ended, Ok(0) | Err(_)), "{ended:?}");
    }
    eventually(
        "the target's connections end",
        Duration::from_secs(10),
        || held.load(Ordering::SeqCst) == 0,
    )
    .await;
    drop(tunnels);
    eventually(
        "the destination's descriptors are closed",
        Duration::from_secs(10),
        || open_fds() <= before + 2,
    )
    .await;
}
