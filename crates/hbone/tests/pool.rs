//! The connection pool: sharing, limits, one handshake per burst, eviction, idle close.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::{Pool, PoolConfig, PoolKey};
use ferry_hbone::server::Server;
use ferry_hbone::settings::Settings;
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_streams_share_a_bounded_number_of_connections() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let settings = Settings {
        max_concurrent_streams: 1000,
        ..Settings::default()
    };
    let hbone = hbone_server(&ca, SERVER, Arc::new(Recorder::default()), settings).await;
    let client = Arc::new(ClientSide::new(
        ca.clone(),
        PoolConfig {
            max_streams: 100,
            ..PoolConfig::default()
        },
    ));
    // Every stream stays open until all are open, so they are truly concurrent.
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let mut tasks = JoinSet::new();
    for i in 0..1000u32 {
        let (client, barrier) = (client.clone(), barrier.clone());
        tasks.spawn(async move {
            let mut t = client.open(hbone, echo).await.expect("tunnel");
            let msg = i.to_le_bytes();
            t.write_all(&msg).await.unwrap();
            let mut back = [0u8; 4];
            t.read_exact(&mut back).await.unwrap();
            assert_eq!(back, msg);
            barrier.wait().await;
            t.shutdown().await.unwrap();
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("stream task");
    }
    let handshakes = client.pool.handshakes();
    assert!(
        (10..=12).contains(&handshakes),
        "1000 streams at 100 per connection took {handshakes} connections"
    );
}

/// Each pooled connection costs its TLS and HTTP/2 state at both ends however few streams it
/// carries (issue 21: about 48 KB per end, 0.47 KiB per idle proxied connection per end at
/// 100 streams a connection). With the defaults at both ends, 300 held tunnels share one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_tunnels_share_one_connection_with_the_defaults() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut held = Vec::new();
    for i in 0..300u32 {
        let mut t = client.open(hbone, echo).await.expect("tunnel");
        let msg = i.to_le_bytes();
        t.write_all(&msg).await.unwrap();
        let mut back = [0u8; 4];
        t.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
        held.push(t);
    }
    assert_eq!(client.pool.handshakes(), 1, "300 held tunnels");
    assert_eq!(client.pool.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_first_requests_costs_one_handshake() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = Arc::new(ClientSide::new(ca.clone(), PoolConfig::default()));
    let mut tasks = JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        tasks.spawn(async move { client.open(hbone, echo).await.expect("tunnel") });
    }
    let mut tunnels = Vec::new();
    while let Some(t) = tasks.join_next().await {
        tunnels.push(t.unwrap());
    }
    assert_eq!(tunnels.len(), 50);
    assert_eq!(client.pool.handshakes(), 1);
    assert_eq!(client.pool.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_any_different_security_attribute_never_share() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let pool = Pool::new(PoolConfig::default());
    let bundle = ca.bundle();
    let a = ca.issue_str(CLIENT);
    let b = ca.issue_str("spiffe://cluster.local/ns/default/sa/other-client");
    let h = ConnectHeaders::default();
    let keys = [
        (
            PoolKey::new(
                id(CLIENT),
                "127.0.0.1".parse().unwrap(),
                hbone,
                vec![id(SERVER)],
            ),
            &a,
        ),
        (
            PoolKey::new(
                b.identity().clone(),
                "127.0.0.1".parse().unwrap(),
                hbone,
                vec![id(SERVER)],
            ),
            &b,
        ),
        (
            PoolKey::new(
                id(CLIENT),
                "127.0.0.2".parse().unwrap(),
                hbone,
                vec![id(SERVER)],
            ),
            &a,
        ),
        (
            PoolKey::new(
                id(CLIENT),
                "127.0.0.1".parse().unwrap(),
                hbone,
                vec![id(SERVER), id("spiffe://cluster.local/ns/x/sa/y")],
            ),
            &a,
        ),
    ];
    let mut tunnels = Vec::new();
    for (k, creds) in &keys {
        tunnels.push(
            pool.open(k, creds, &bundle, &echo.to_string(), &h)
                .await
                .unwrap(),
        );
        tunnels.push(
            pool.open(k, creds, &bundle, &echo.to_string(), &h)
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        pool.handshakes(),
        4,
        "one connection per distinct key, shared within a key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_the_timeout() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            idle_timeout: Duration::from_millis(200),
            ..PoolConfig::default()
        },
    );
    let t = client.open(hbone, echo).await.unwrap();
    assert_eq!(client.pool.connections(), 1);
    // Whoever follows the pool's connections is woken when it lets the idle one go.
    let closed = client.pool.closed();
    drop(t);
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("woken when the idle connection was let go");
    assert_eq!(client.pool.connections(), 0);
    let _t = client.open(hbone, echo).await.unwrap();
    assert_eq!(client.pool.handshakes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_is_evicted_and_never_handed_out_again() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let server =
        Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), Settings::default()).unwrap());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hbone = l.local_addr().unwrap();
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    // Serve the first connection on a task we can kill.
    let accept = tokio::spawn(async move {
        let (tcp, peer) = l.accept().await.unwrap();
        (l, tcp, peer)
    });
    let s = server.clone();
    let serve_first = async move {
        let (l, tcp, peer) = accept.await.unwrap();
        let first = tokio::spawn(async move {
            s.serve_connection(tcp, peer, Arc::new(Recorder::default()))
                .await
        });
        (l, first)
    };
    let (t, (l, first)) = tokio::join!(client.open(hbone, echo), serve_first);
    let t = t.unwrap();
    drop(t);
    first.abort();
    eventually(
        "the client notices the broken connection",
        Duration::from_secs(10),
        || client.pool.connections() == 0,
    )
    .await;
    // The next open dials again rather than reusing the dead connection.
    tokio::spawn(server.serve(l, Arc::new(Recorder::default())));
    let mut t = client.open(hbone, echo).await.expect("a fresh connection");
    t.write_all(b"alive").await.unwrap();
    let mut b = [0u8; 5];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(client.pool.handshakes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_peer_is_detected_by_ping_and_the_connection_evicted() {
    use std::sync::atomic::Ordering;
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let (relay, frozen) = freezable_relay(hbone).await;
    let settings = Settings {
        ping_interval: Duration::from_millis(100),
        // Wide enough that a loaded machine does not time out a PING before the echo.
        ping_timeout: Duration::from_secs(2),
        ..Settings::default()
    };
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            settings,
            ..PoolConfig::default()
        },
    );
    let mut t = client.open(relay, echo).await.unwrap();
    t.write_all(b"hi").await.unwrap();
    let mut b = [0u8; 2];
    t.read_exact(&mut b).await.unwrap();
    frozen.store(true, Ordering::SeqCst);
    eventually(
        "the silent connection is closed",
        Duration::from_secs(10),
        || client.pool.connections() == 0,
    )
    .await;
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), t.read_to_end(&mut rest))
        .await
        .expect("no hang");
    assert!(
        r.is_err(),
        "the tunnel on a dead connection fails instead of hanging"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_left_over_from_a_burst_close_soon_and_one_stays_warm() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            max_streams: 1,
            idle_timeout: Duration::from_secs(600),
            surplus_idle_timeout: Duration::from_millis(200),
            ..PoolConfig::default()
        },
    );
    // A burst: three tunnels at once need three connections (one stream each).
    let (a, b, c) = tokio::join!(
        client.open(hbone, echo),
        client.open(hbone, echo),
        client.open(hbone, echo)
    );
    let burst = [a.unwrap(), b.unwrap(), c.unwrap()];
    assert_eq!(client.pool.connections(), 3);
    drop(burst);
    eventually(
        "the surplus idle connections to close",
        Duration::from_secs(10),
        || client.pool.connections() == 1,
    )
    .await;
    // The one kept is warm: the next tunnel needs no handshake.
    let handshakes = client.pool.handshakes();
    let _t = client.open(hbone, echo).await.unwrap();
    assert_eq!(client.pool.handshakes(), handshakes);
}

/// A connection that carried more streams at once than `warm_max_streams` is not the one kept
/// warm (h2 keeps its tables that long for its life, issue 21): after the burst it goes at the
/// surplus timeout, and the next tunnel dials anew; one that stayed within it is kept. Timed on
/// tokio's paused clock, as the test below.
#[tokio::test(flavor = "current_thread")]
async fn a_connection_that_carried_a_large_burst_is_not_kept_warm() {
    let ca = Arc::new(TestCa::new("root"));
    let (hbone, echo, quiet) = quiet_servers(&ca).await;
    let surplus = Duration::from_secs(10);
    let config = PoolConfig {
        idle_timeout: Duration::from_secs(600),
        surplus_idle_timeout: surplus,
        warm_max_streams: 4,
        settings: quiet,
        ..PoolConfig::default()
    };
    // Two pools: one carries 4 tunnels at once, the other 5, each on one connection.
    let within = ClientSide::new(ca.clone(), config.clone());
    let over = ClientSide::new(ca.clone(), config);
    let mut held = Vec::new();
    for (client, n) in [(&within, 4), (&over, 5)] {
        for _ in 0..n {
            let mut t = client.open(hbone, echo).await.expect("tunnel");
            t.write_all(b"up").await.unwrap();
            let mut b = [0u8; 2];
            t.read_exact(&mut b).await.unwrap();
            held.push(t);
        }
        assert_eq!(client.pool.handshakes(), 1, "{n} tunnels on one connection");
    }
    tokio::time::pause();
    drop(held);
    settle().await;
    tokio::time::advance(surplus + Duration::from_millis(2)).await;
    settle().await;
    assert_eq!(within.pool.connections(), 1, "4 at once: kept warm");
    assert_eq!(
        over.pool.connections(),
        0,
        "5 at once: let go at the surplus timeout"
    );
    tokio::time::resume();
    let _t = over.open(hbone, echo).await.expect("tunnel");
    assert_eq!(over.pool.handshakes(), 2, "the next tunnel dialled anew");
}

/// The warm connection, idle and its watcher asleep until its long deadline, then carries a
/// burst too large to stay warm: once the burst is over it goes at the surplus timeout, not
/// at the deadline its watcher slept towards (a release wakes a lone connection's watcher only
/// when its deadline can come sooner).
#[tokio::test(flavor = "current_thread")]
async fn a_warm_connection_that_then_carries_a_large_burst_goes_at_the_surplus_timeout() {
    let ca = Arc::new(TestCa::new("root"));
    let (hbone, echo, quiet) = quiet_servers(&ca).await;
    let surplus = Duration::from_secs(10);
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            idle_timeout: Duration::from_secs(600),
            surplus_idle_timeout: surplus,
            warm_max_streams: 4,
            settings: quiet,
            ..PoolConfig::default()
        },
    );
    let echoed = |mut t: ferry_hbone::pool::Tunnel| async move {
        t.write_all(b"up").await.unwrap();
        let mut b = [0u8; 2];
        t.read_exact(&mut b).await.unwrap();
        t
    };
    // Warm and idle: its watcher sleeps towards the 600 s deadline.
    drop(echoed(client.open(hbone, echo).await.unwrap()).await);
    settle().await;
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(echoed(client.open(hbone, echo).await.unwrap()).await);
    }
    assert_eq!(
        client.pool.handshakes(),
        1,
        "the burst on the warm connection"
    );
    tokio::time::pause();
    drop(held);
    settle().await;
    tokio::time::advance(surplus + Duration::from_millis(2)).await;
    settle().await;
    assert_eq!(
        client.pool.connections(),
        0,
        "5 at once: let go at the surplus timeout"
    );
}

/// An HBONE server and an echo target for the paused-clock tests, and the settings they and
/// the pool use: no PING either way inside the tests' frozen minutes.
async fn quiet_servers(ca: &TestCa) -> (std::net::SocketAddr, std::net::SocketAddr, Settings) {
    let echo = echo_server().await;
    let quiet = Settings {
        ping_interval: Duration::from_secs(3600),
        ..Settings::default()
    };
    let hbone = hbone_server(ca, SERVER, Arc::new(Recorder::default()), quiet.clone()).await;
    (hbone, echo, quiet)
}

/// Lets the runtime run everything that is ready (paused time does not move meanwhile).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// The idle timeout on tokio's paused clock: set up on the real one (the handshake), then
/// frozen, so that the connection's own deadline is the only thing that moves it. A periodic
/// sweep would let it go up to one period late; each connection's deadline lets it go on time,
/// and a use before then starts its idle time again.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_connection_is_let_go_at_its_own_deadline_and_a_use_starts_it_again() {
    let ca = Arc::new(TestCa::new("root"));
    let (hbone, echo, quiet) = quiet_servers(&ca).await;
    let idle = Duration::from_secs(60);
    let client = ClientSide::new(
        ca.clone(),
        PoolConfig {
            idle_timeout: idle,
            settings: quiet,
            ..PoolConfig::default()
        },
    );
    let mut t = client.open(hbone, echo).await.unwrap();
    t.write_all(b"up").await.unwrap();
    let mut b = [0u8; 2];
    t.read_exact(&mut b).await.unwrap();
    tokio::time::pause();
    drop(t);
    settle().await;
    // Used again 40 s into its idle time: its 60 s start over from the release after it.
    tokio::time::advance(Duration::from_secs(40)).await;
    settle().await;
    assert_eq!(client.pool.connections(), 1);
    let t = client.open(hbone, echo).await.unwrap();
    assert_eq!(client.pool.handshakes(), 1, "the idle connection was used");
    drop(t);
    settle().await;
    tokio::time::advance(idle - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(client.pool.connections(), 1, "kept until its deadline");
    let closed = client.pool.closed();
    tokio::pin!(closed);
    closed.as_mut().enable();
    // Within the timer's resolution (1 ms) of its deadline.
    tokio::time::advance(Duration::from_millis(2)).await;
    settle().await;
    assert_eq!(client.pool.connections(), 0, "let go at its deadline");
    // Whoever follows the pool's connections was woken.
    assert!(
        futures_poll_now(closed.as_mut()),
        "woken when the idle connection was let go"
    );
}

/// Whether `f` is ready now.
fn futures_poll_now<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
    let waker = std::task::Waker::noop();
    f.poll(&mut std::task::Context::from_waker(waker))
        .is_ready()
}

/// What a peer does with the first HBONE connection it accepts, once both handshakes are
/// done; it serves every later one.
#[derive(Clone, Copy)]
enum FirstConnection {
    /// Dropped (no GOAWAY, no close_notify): the client sees an I/O error.
    Dropped,
    /// A GOAWAY with last stream id 0, the connection then closed: the client's stream is
    /// refused unprocessed, or breaks under it, whichever it sees first.
    TurnedAway,
}

/// A tunnel through a peer that mishandles its first connection as `first` says opens on a
/// second connection and carries bytes.
async fn opens_on_a_second_connection(first: FirstConnection) {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hbone = l.local_addr().unwrap();
    let server =
        Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), Settings::default()).unwrap());
    let tls = ferry_tls::config::server_config(&ca.issue_str(SERVER), &ca.bundle()).unwrap();
    tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let tls = tokio_rustls::TlsAcceptor::from(tls)
            .accept(tcp)
            .await
            .unwrap();
        let mut conn = h2::server::handshake(tls).await.unwrap();
        match first {
            FirstConnection::Dropped => drop(conn),
            FirstConnection::TurnedAway => {
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                tokio::spawn(async move { while conn.accept().await.is_some() {} });
            }
        }
        let _ = server.serve(l, Arc::new(Recorder::default())).await;
    });
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client
        .open(hbone, echo)
        .await
        .expect("opened on a second connection");
    t.write_all(b"alive").await.unwrap();
    let mut b = [0u8; 5];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"alive");
    assert_eq!(
        client.pool.handshakes(),
        2,
        "the first connection is not reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_whose_peer_closes_before_answering_is_dialled_again() {
    // A proxy that dies just after the handshakes, before the CONNECT is answered: the
    // CONNECT had no answer, so it is sent again on a new connection, once.
    opens_on_a_second_connection(FirstConnection::Dropped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_turned_away_by_a_draining_peer_is_dialled_again() {
    // A proxy that had accepted the connection just before its drain began. The next
    // connection lands on a serving process.
    opens_on_a_second_connection(FirstConnection::TurnedAway).await;
}
