//! `relay` copies, then resets the side that did not fail: a broken upstream reaches the
//! downstream as a reset, not as a clean end it would take for a complete answer.

use std::io::ErrorKind;
use std::time::Duration;

use ferry_hbone::copy::{Bounds, Failed, Interrupted, Resets, relay, relay_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connected pair of loopback sockets.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

/// Reads until the end; the error that ended it, if any.
async fn read_end(s: &mut TcpStream) -> Result<Vec<u8>, ErrorKind> {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the connection ends")
        .map(|_| got)
        .map_err(|e| e.kind())
}

#[tokio::test]
async fn an_upstream_reset_reaches_the_downstream_as_a_reset() {
    // client <-> (a | relay | b) <-> server
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    let proxy = tokio::spawn(async move {
        let r = relay(&mut a, &mut b, Bounds::default()).await;
        drop((a, b));
        r
    });
    client.write_all(b"request").await.unwrap();
    let mut got = [0u8; 7];
    server.read_exact(&mut got).await.unwrap();
    server.write_all(b"half an ans").await.unwrap();
    // The server breaks off mid-answer.
    ferry_hbone::socket::reset_tcp(&server);
    drop(server);
    let err = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the relay ends")
        .unwrap()
        .expect_err("ended by the reset");
    assert_eq!(err.copy.failed, Failed::B, "{err}");
    assert_eq!(err.reset, Resets { a: true, b: false });
    // What arrived before the reset may be read or lost; the end is a reset either way.
    assert_eq!(read_end(&mut client).await, Err(ErrorKind::ConnectionReset));
}

#[tokio::test]
async fn a_half_closed_relay_that_goes_quiet_resets_both_sides() {
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    let proxy = tokio::spawn(async move {
        let r = relay(
            &mut a,
            &mut b,
            Bounds {
                half_closed_idle: Some(Duration::from_millis(300)),
                finish: None,
            },
        )
        .await;
        drop((a, b));
        r
    });
    client.write_all(b"last words").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = [0u8; 10];
    server.read_exact(&mut got).await.unwrap();
    // The server neither answers nor closes.
    let err = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the relay ends by itself")
        .unwrap()
        .expect_err("ended by the bound");
    assert_eq!(err.copy.source.kind(), ErrorKind::TimedOut);
    assert_eq!(err.reset, Resets { a: true, b: true });
    assert_eq!(read_end(&mut client).await, Err(ErrorKind::ConnectionReset));
    // The server had the FIN already (its reads end cleanly); the RST that follows is
    // recorded as the socket's pending error.
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let error = loop {
        if let Some(e) = server.take_error().unwrap() {
            break e;
        }
        assert!(tokio::time::Instant::now() < end, "the server saw no reset");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        matches!(
            error.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_clean_end_resets_nothing() {
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    let proxy = tokio::spawn(async move { relay(&mut a, &mut b, Bounds::default()).await });
    client.write_all(b"ping").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    server.write_all(b"pong").await.unwrap();
    server.shutdown().await.unwrap();
    assert_eq!(read_end(&mut client).await, Ok(b"pong".to_vec()));
    assert_eq!(proxy.await.unwrap().unwrap(), (4, 4));
}

#[tokio::test]
async fn a_relay_ended_by_its_until_resets_both_sides_and_counts_what_moved() {
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<&'static str>();
    let proxy = tokio::spawn(async move {
        let until = async move { stopped.await.unwrap_or("sender gone") };
        let r = relay_until(&mut a, &mut b, Bounds::default(), until).await;
        drop((a, b));
        r
    });
    client.write_all(b"request").await.unwrap();
    let mut got = [0u8; 7];
    server.read_exact(&mut got).await.unwrap();
    server.write_all(b"ans").await.unwrap();
    let mut ans = [0u8; 3];
    client.read_exact(&mut ans).await.unwrap();
    // A held connection, both directions open: ended from outside (a policy change).
    stop.send("no longer allowed").unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the relay ends")
        .unwrap();
    match end {
        Err(Interrupted::Until {
            reason,
            a_to_b,
            b_to_a,
        }) => assert_eq!((reason, a_to_b, b_to_a), ("no longer allowed", 7, 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(read_end(&mut client).await, Err(ErrorKind::ConnectionReset));
    assert_eq!(read_end(&mut server).await, Err(ErrorKind::ConnectionReset));
}
