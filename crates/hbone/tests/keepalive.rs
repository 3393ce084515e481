//! Keepalive: a connection PINGs its peer only while it carries streams; an idle pooled
//! connection runs no code and is watched by the kernel's TCP keepalive instead (issue 21).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use ferry_hbone::headers::Refusal;
use ferry_hbone::pool::PoolConfig;
use ferry_hbone::server::{ConnectRequest, Handler, Outcome};
use ferry_hbone::settings::Settings;
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Admits every tunnel and counts those that ended.
#[derive(Debug, Default)]
struct Ends(AtomicU64);

impl Handler for Ends {
    type Admit = ();

    fn admit(&self, _: &ConnectRequest) -> Result<(), Refusal> {
        Ok(())
    }

    fn finished(&self, _: &ConnectRequest, (): (), _: &Outcome<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An echo round trip on `t`, so that the tunnel is known to be up.
async fn round_trip(t: &mut ferry_hbone::pool::Tunnel) {
    t.write_all(b"ping?").await.unwrap();
    let mut b = [0u8; 5];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"ping?");
}

/// Waits until `records` has counted `more` records beyond what it had when called.
async fn records_grow(what: &str, records: &AtomicU64, more: u64) {
    let from = records.load(Ordering::SeqCst);
    eventually(what, Duration::from_secs(20), || {
        records.load(Ordering::SeqCst) >= from + more
    })
    .await;
}

/// Two pooled connections to one server, PINGing every 20 ms at both ends while they carry
/// streams: one keeps its tunnel open (and sends nothing on it), the other's tunnel closed.
/// While the busy one's PINGs keep crossing, not one TLS record crosses the idle one, either
/// way; once a tunnel opens on it again, its PINGs come back without a byte sent on it.
/// (The busy connection's PINGs are the clock: no wall-clock window is assumed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pooled_connection_sends_no_ping_and_one_with_streams_does() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let settings = Settings {
        ping_interval: Duration::from_millis(20),
        ping_timeout: Duration::from_secs(10),
        ..Settings::default()
    };
    let ends = Arc::new(Ends::default());
    let hbone = hbone_server(&ca, SERVER, ends.clone(), settings.clone()).await;
    let (busy_relay, busy) = counting_relay(hbone).await;
    let (idle_relay, idle) = counting_relay(hbone).await;
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            settings,
            ..PoolConfig::default()
        },
    );
    let mut held = client.open(busy_relay, echo).await.unwrap();
    round_trip(&mut held).await;
    let mut t = client.open(idle_relay, echo).await.unwrap();
    round_trip(&mut t).await;
    drop(t);
    assert_eq!(client.pool.connections(), 2, "the idle one stays warm");
    eventually(
        "the server ends the closed tunnel",
        Duration::from_secs(20),
        || ends.0.load(Ordering::SeqCst) == 1,
    )
    .await;
    // A PING in flight when its last stream closed is answered (a task held back on a loaded
    // machine may answer late); the idle one has gone quiet once its count holds over a few
    // of the busy connection's intervals.
    let mut quiet = None;
    for _ in 0..50 {
        let before = idle.load(Ordering::SeqCst);
        records_grow("the busy connection's PINGs", &busy, 8).await;
        if idle.load(Ordering::SeqCst) == before {
            quiet = Some(before);
            break;
        }
    }
    let quiet = quiet.expect("the idle connection went quiet");
    // Each interval, a PING and its answer from each end: 40 records is ten intervals or more.
    records_grow("the busy connection's PINGs", &busy, 40).await;
    assert_eq!(
        idle.load(Ordering::SeqCst),
        quiet,
        "records crossed the idle connection"
    );
    // Used again, it PINGs again: records cross it beyond the round trip, no byte sent.
    let mut again = client.open(idle_relay, echo).await.unwrap();
    round_trip(&mut again).await;
    records_grow("the PINGs of the connection used again", &idle, 8).await;
    assert_eq!(client.pool.handshakes(), 2, "the warm connection was used");
    drop(held);
}

/// A peer that vanished under an idle pooled connection (every packet between them dropped,
/// no FIN, no RST) is found by the kernel's TCP keepalive, not by PING (an idle connection
/// sends none, and here no PING would come within the test anyway): the connection closes and
/// the pool lets it go. In a network namespace of the test's own, which goes away with its
/// thread; as root only.
#[test]
fn an_idle_pooled_connection_whose_peer_vanished_is_closed_by_tcp_keepalive() {
    std::thread::spawn(|| {
        if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
            eprintln!("skipped: a network namespace of its own needs root ({e})");
            return;
        }
        // A child process starts in the namespace of the thread that forks it: this one.
        run(&["ip", "link", "set", "lo", "up"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(vanishing_peer());
    })
    .join()
    .expect("the test's thread");
}

async fn vanishing_peer() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let settings = Settings {
        keepalive: Duration::from_secs(1),
        keepalive_interval: Duration::from_secs(1),
        keepalive_retries: 2,
        ping_interval: Duration::from_secs(3600),
        ..Settings::default()
    };
    let hbone = hbone_server(&ca, SERVER, Arc::new(Recorder::default()), settings.clone()).await;
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            settings,
            ..PoolConfig::default()
        },
    );
    let mut t = client.open(hbone, echo).await.unwrap();
    round_trip(&mut t).await;
    drop(t);
    assert_eq!(client.pool.connections(), 1);
    let port = hbone.port().to_string();
    for dir in ["--dport", "--sport"] {
        run(&[
            "iptables", "-I", "INPUT", "-p", "tcp", dir, &port, "-j", "DROP",
        ]);
    }
    eventually(
        "the idle connection to the vanished peer is let go",
        Duration::from_secs(30),
        || client.pool.connections() == 0,
    )
    .await;
}

fn run(args: &[&str]) {
    let st = std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(st.success(), "{args:?}: {st}");
}
