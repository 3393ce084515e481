//! HBONE over real sockets on loopback: TLS, CONNECT, forwarding, half-close, resets.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use ferry_hbone::Error;
use ferry_hbone::client::{Connection, DirectDialer};
use ferry_hbone::headers::ConnectHeaders;
use ferry_hbone::pool::PoolConfig;
use ferry_hbone::settings::Settings;
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_through_a_tunnel_and_the_server_sees_the_peer_identity() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let handler = Arc::new(Recorder::default());
    let hbone = hbone_server(&ca, SERVER, handler.clone(), Settings::default()).await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, echo).await.expect("tunnel");
    t.write_all(b"hello through hbone").await.unwrap();
    t.shutdown().await.unwrap();
    let mut back = Vec::new();
    t.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"hello through hbone");
    let seen = handler.seen.lock();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].peer.to_string(), CLIENT);
    assert_eq!(seen[0].target.to_string(), echo.to_string());
    // A certificate without the mesh CA's cluster extension proves no cluster.
    assert_eq!(
        *seen[0].peer_cluster,
        ferry_core::hop::PeerCluster::Unproven
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_headers_reach_the_handler() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let handler = Arc::new(Recorder::default());
    let hbone = hbone_server(&ca, SERVER, handler.clone(), Settings::default()).await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let headers = ConnectHeaders {
        baggage: vec![("k8s.cluster.name".into(), "east".into())],
        forwarded_for: Some("198.18.1.10:40000".parse().unwrap()),
        forwarded_host: None,
        traceparent: Some(format!("00-{}-{}-01", "1".repeat(32), "2".repeat(16))),
        forwarded_network: None,
    };
    let key = client.key(hbone, &[SERVER]);
    let _t = client
        .pool
        .open(
            &key,
            &client.creds,
            &ca.bundle(),
            &echo.to_string(),
            &headers,
        )
        .await
        .unwrap();
    let seen = handler.seen.lock();
    assert_eq!(ConnectHeaders::read(&seen[0].headers), headers);
    // The baggage claims "east"; only the certificate could prove it, and this one does not.
    assert_eq!(
        *seen[0].peer_cluster,
        ferry_core::hop::PeerCluster::Unproven
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_from_the_client_leaves_the_other_direction_open() {
    let ca = Arc::new(TestCa::new("root"));
    // A target that reads to EOF, then answers with how many bytes it got.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        s.write_all(format!("got {} bytes", all.len()).as_bytes())
            .await
            .unwrap();
        s.shutdown().await.unwrap();
    });
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, target).await.unwrap();
    t.write_all(&[7u8; 5000]).await.unwrap();
    t.shutdown().await.unwrap();
    let mut answer = String::new();
    t.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer, "got 5000 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_from_the_target_leaves_the_other_direction_open() {
    let ca = Arc::new(TestCa::new("root"));
    // A target that speaks first, closes its write half, then keeps reading.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        s.write_all(b"banner").await.unwrap();
        s.shutdown().await.unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        tx.send(all).unwrap();
    });
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, target).await.unwrap();
    let mut banner = Vec::new();
    t.read_to_end(&mut banner).await.unwrap();
    assert_eq!(banner, b"banner", "the target's FIN arrives as EOF");
    t.write_all(b"still talking after your FIN").await.unwrap();
    t.shutdown().await.unwrap();
    assert_eq!(rx.await.unwrap(), b"still talking after your FIN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_identity_is_refused_with_what_was_expected_and_seen() {
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
    let wanted = "spiffe://cluster.local/ns/default/sa/the-real-one";
    let key = client.key(hbone, &[wanted]);
    let err = client
        .pool
        .open(
            &key,
            &client.creds,
            &ca.bundle(),
            &echo.to_string(),
            &ConnectHeaders::default(),
        )
        .await
        .expect_err("must refuse an impostor");
    assert!(matches!(err, Error::PeerIdentity { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("expected one of [{wanted}]"))
            && text.contains(&format!("found [{SERVER}]")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_from_another_root_is_refused() {
    let ca = Arc::new(TestCa::new("root"));
    let other = TestCa::new("other root");
    let echo = echo_server().await;
    let hbone = hbone_server(
        &other,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let err = client.open(hbone, echo).await.expect_err("unknown issuer");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_from_another_root_is_refused_and_the_target_sees_nothing() {
    let ca = Arc::new(TestCa::new("root"));
    let rogue = Arc::new(TestCa::new("rogue root"));
    let (target, seen, accepted) = recording_target().await;
    let handler = Arc::new(Recorder::default());
    let hbone = hbone_server(&ca, SERVER, handler.clone(), Settings::default()).await;
    // The rogue client trusts the real root (so it accepts the server) but its own cert is rogue.
    let client = ClientSide {
        pool: ferry_hbone::pool::Pool::new(PoolConfig::default()),
        creds: rogue.issue_str(CLIENT),
        ca: ca.clone(),
    };
    let err = client
        .open(hbone, target)
        .await
        .expect_err("server must refuse the client certificate");
    assert!(!err.to_string().is_empty());
    assert!(
        handler.seen.lock().is_empty(),
        "no request may reach the handler"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert!(seen.lock().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundle_with_two_roots_accepts_both_during_rotation() {
    let old = TestCa::new("old root");
    let new = TestCa::new("new root");
    let bundle = ferry_tls::config::TrustBundle::from_der([old.root(), new.root()]).unwrap();
    assert_eq!(bundle.len(), 2);
    let echo = echo_server().await;
    // Server still on the old root; client already on the new one; both trust both.
    let server = Arc::new(
        ferry_hbone::server::Server::new(&old.issue_str(SERVER), &bundle, Settings::default())
            .unwrap(),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hbone = l.local_addr().unwrap();
    tokio::spawn(server.serve(l, Arc::new(Recorder::default())));
    let conn = Connection::connect(
        &DirectDialer,
        None,
        hbone,
        &new.issue_str(CLIENT),
        &bundle,
        vec![id(SERVER)],
        &Settings::default(),
    )
    .await
    .expect("rotation-era handshake");
    let mut t = conn
        .open(&echo.to_string(), &ConnectHeaders::default())
        .await
        .unwrap();
    t.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_connect_gets_401_and_the_target_never_sees_a_byte() {
    let ca = Arc::new(TestCa::new("root"));
    let (target, seen, _) = recording_target().await;
    let deny = Arc::new(Recorder {
        deny: true,
        ..Recorder::default()
    });
    let denied = hbone_server(&ca, SERVER, deny.clone(), Settings::default()).await;
    let allowed = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    match client.open(denied, target).await {
        Err(Error::Refused { status, .. }) => assert_eq!(status, 401),
        other => panic!("expected 401, got {other:?}"),
    }
    // Through the allowing server, a marker: it must be the first thing the target ever saw.
    let mut t = client.open(allowed, target).await.unwrap();
    t.write_all(b"MARKER!!").await.unwrap();
    eventually(
        "the target records the marker",
        Duration::from_secs(5),
        || !seen.lock().is_empty(),
    )
    .await;
    assert_eq!(seen.lock()[0], b"MARKER!!");
    assert_eq!(deny.seen.lock().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_methods_and_authorities_get_the_right_status() {
    let ca = Arc::new(TestCa::new("root"));
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let conn = Connection::connect(
        &DirectDialer,
        None,
        hbone,
        &ca.issue_str(CLIENT),
        &ca.bundle(),
        vec![id(SERVER)],
        &Settings::default(),
    )
    .await
    .unwrap();
    for (authority, status) in [
        ("bad_host:80", 400),
        ("198.18.0.1:0", 400),
        ("198.18.0.1:99999", 400),
    ] {
        match conn.open(authority, &ConnectHeaders::default()).await {
            Err(Error::Refused { status: s, .. }) => assert_eq!(s, status, "{authority}"),
            Err(Error::BadAuthority(_)) => assert_eq!(status, 400),
            other => panic!("{authority}: expected {status}, got {other:?}"),
        }
    }
    // A GET, sent with a raw HTTP/2 client over the same kind of TLS session.
    let config =
        ferry_tls::config::client_config(&ca.issue_str(CLIENT), &ca.bundle(), vec![id(SERVER)])
            .unwrap();
    let tcp = tokio::net::TcpStream::connect(hbone).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ferry_tls::config::server_name(hbone), tcp)
        .await
        .unwrap();
    let (send, driver) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(driver);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::builder()
        .method("GET")
        .uri("https://198.18.0.1/")
        .body(())
        .unwrap();
    let (resp, _) = send.send_request(req, true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 405);
    // The connection still serves a valid CONNECT afterwards.
    let echo = echo_server().await;
    let mut t = conn
        .open(&echo.to_string(), &ConnectHeaders::default())
        .await
        .unwrap();
    t.write_all(b"ok").await.unwrap();
    let mut b = [0u8; 2];
    t.read_exact(&mut b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_reset_mid_stream_surfaces_as_an_error_at_the_client() {
    let ca = Arc::new(TestCa::new("root"));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        s.write_all(b"partial").await.unwrap();
        ferry_hbone::socket::reset_tcp(&s);
        drop(s);
    });
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, target).await.unwrap();
    t.write_all(b"ping").await.unwrap();
    let mut got = Vec::new();
    let res = tokio::time::timeout(Duration::from_secs(10), t.read_to_end(&mut got))
        .await
        .expect("no hang");
    let err = res.expect_err("a reset is not a clean end");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reset_mid_stream_resets_the_target() {
    let ca = Arc::new(TestCa::new("root"));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        s.write_all(b"go").await.unwrap();
        let mut rest = Vec::new();
        tx.send(s.read_to_end(&mut rest).await).unwrap();
    });
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, target).await.unwrap();
    t.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 2];
    t.read_exact(&mut b).await.unwrap();
    t.abort();
    let res = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("no hang")
        .unwrap();
    let err = res.expect_err("the target sees a reset, not a FIN");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gigabyte_arrives_intact() {
    const TOTAL: usize = 1 << 30;
    let ca = Arc::new(TestCa::new("root"));
    // A sink that hashes everything it receives, then reports the hash and length.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut h = Fnv::default();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        s.write_all(&h.hash.to_le_bytes()).await.unwrap();
        s.write_all(&h.len.to_le_bytes()).await.unwrap();
        s.shutdown().await.unwrap();
    });
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client.open(hbone, target).await.unwrap();
    let mut h = Fnv::default();
    let mut chunk = vec![0u8; 1 << 20];
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut sent = 0;
    while sent < TOTAL {
        for w in chunk.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            w.copy_from_slice(&state.to_le_bytes()[..w.len()]);
        }
        h.update(&chunk);
        t.write_all(&chunk).await.unwrap();
        sent += chunk.len();
    }
    t.shutdown().await.unwrap();
    let mut report = [0u8; 16];
    t.read_exact(&mut report).await.unwrap();
    assert_eq!(
        u64::from_le_bytes(report[8..].try_into().unwrap()),
        TOTAL as u64,
        "length"
    );
    assert_eq!(
        u64::from_le_bytes(report[..8].try_into().unwrap()),
        h.hash,
        "checksum"
    );
}

/// FNV-1a over 8-byte words (fast enough for a gigabyte in a test build).
struct Fnv {
    hash: u64,
    len: u64,
    carry: Vec<u8>,
}

impl Default for Fnv {
    fn default() -> Self {
        Self {
            hash: 0xcbf2_9ce4_8422_2325,
            len: 0,
            carry: Vec::new(),
        }
    }
}

impl Fnv {
    fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.carry.is_empty() {
            let need = 8 - self.carry.len();
            let take = need.min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.carry[..8].try_into().unwrap());
            self.mix(w);
            self.carry.clear();
        }
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(w.try_into().unwrap()));
        }
        self.carry.extend_from_slice(words.remainder());
    }
    fn mix(&mut self, w: u64) {
        self.hash = (self.hash ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// Serves each tunnel in process (an echo that answers with the request doubled) and records
/// each outcome's byte counts.
#[derive(Debug, Default)]
struct ServesItself {
    moved: parking_lot::Mutex<Vec<(u64, u64)>>,
}

impl ferry_hbone::server::Handler for ServesItself {
    type Admit = ();

    fn admit(
        &self,
        _: &ferry_hbone::server::ConnectRequest,
    ) -> Result<(), ferry_hbone::headers::Refusal> {
        Ok(())
    }

    fn connect(
        &self,
        _: &ferry_hbone::server::ConnectRequest,
        _: &mut (),
    ) -> impl std::future::Future<
        Output = Result<ferry_hbone::upstream::Forward, ferry_hbone::headers::Refusal>,
    > + Send {
        let serve: ferry_hbone::upstream::Serve = Box::new(|mut s| {
            Box::pin(async move {
                let mut got = Vec::new();
                if s.read_to_end(&mut got).await.is_ok() {
                    got.extend_from_slice(&got.clone());
                    let _ = s.write_all(&got).await;
                    let _ = s.shutdown().await;
                }
            })
        });
        std::future::ready(Ok(ferry_hbone::upstream::Forward::Serve(serve)))
    }

    fn finished(
        &self,
        _: &ferry_hbone::server::ConnectRequest,
        _: (),
        outcome: &ferry_hbone::server::Outcome<'_>,
    ) {
        self.moved.lock().push((outcome.sent, outcome.received));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_served_in_process_reports_the_bytes_it_carried() {
    let ca = Arc::new(TestCa::new("root"));
    let handler = Arc::new(ServesItself::default());
    let hbone = hbone_server(&ca, SERVER, handler.clone(), Settings::default()).await;
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    // The target is never dialled: the handler serves the stream.
    let mut t = client
        .open(hbone, "127.0.0.1:9".parse().unwrap())
        .await
        .expect("tunnel");
    t.write_all(&[7u8; 1000]).await.unwrap();
    t.shutdown().await.unwrap();
    let mut back = Vec::new();
    t.read_to_end(&mut back).await.unwrap();
    assert_eq!(back.len(), 2000);
    eventually("the tunnel finished", Duration::from_secs(10), || {
        !handler.moved.lock().is_empty()
    })
    .await;
    assert_eq!(handler.moved.lock()[0], (1000, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_over_ipv6_carries_its_authority_in_brackets_and_a_v6_forwarded_for() {
    use ferry_hbone::server::Server;
    let ca = Arc::new(TestCa::new("root"));
    // The target and the HBONE server on IPv6 loopback; the outer connection over IPv6.
    let target = TcpListener::bind("[::1]:0").await.expect("::1 on loopback");
    let to = target.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, peer) = target.accept().await.unwrap();
        s.write_all(format!("saw {peer}").as_bytes()).await.unwrap();
        s.shutdown().await.unwrap();
    });
    let handler = Arc::new(Recorder::default());
    let server =
        Arc::new(Server::new(&ca.issue_str(SERVER), &ca.bundle(), Settings::default()).unwrap());
    let l = TcpListener::bind("[::1]:0").await.unwrap();
    let hbone = l.local_addr().unwrap();
    tokio::spawn(server.serve(l, handler.clone()));
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let headers = ConnectHeaders {
        forwarded_for: Some("[2001:2::1:10]:40000".parse().unwrap()),
        ..ConnectHeaders::default()
    };
    let authority = to.to_string();
    assert!(authority.starts_with("[::1]:"), "{authority}");
    let key = ferry_hbone::pool::PoolKey::new(
        common::id(CLIENT),
        "::1".parse().unwrap(),
        hbone,
        vec![common::id(SERVER)],
    );
    let mut t = client
        .pool
        .open(&key, &client.creds, &ca.bundle(), &authority, &headers)
        .await
        .expect("a tunnel over IPv6");
    let mut back = String::new();
    t.read_to_string(&mut back).await.unwrap();
    assert!(back.starts_with("saw [::1]:"), "{back}");
    let seen = handler.seen.lock();
    assert_eq!(seen[0].target, ferry_hbone::headers::Target::Addr(to));
    assert!(seen[0].peer_addr.is_ipv6(), "{}", seen[0].peer_addr);
    assert_eq!(ConnectHeaders::read(&seen[0].headers), headers);
}
