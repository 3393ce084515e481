//! A half-closed copy ends once the direction still open goes quiet for the bound, so no socket
//! waits forever in CLOSE-WAIT or FIN-WAIT-2; a direction that keeps moving keeps it open.

use std::time::Duration;

use ferry_hbone::copy::{Bounds, Failed, bidirectional_bounded};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A connected pair of loopback sockets.
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

const BOUND: Duration = Duration::from_millis(300);

#[tokio::test]
async fn a_half_closed_copy_that_goes_quiet_ends_after_the_bound() {
    // client <-> (a | proxy | b) <-> server
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    let proxy = tokio::spawn(async move {
        bidirectional_bounded(
            &mut a,
            &mut b,
            Bounds {
                half_closed_idle: Some(BOUND),
                finish: None,
            },
        )
        .await
    });
    client.write_all(b"last words").await.unwrap();
    client.shutdown().await.unwrap();
    // The server gets the bytes and the FIN, then never answers nor closes.
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last words");
    let err = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the copy ends by itself")
        .unwrap()
        .expect_err("ended by the bound");
    assert_eq!(err.failed, Failed::B, "{err}");
    assert_eq!(err.source.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!((err.a_to_b, err.b_to_a), (10, 0));
    // The client sees its connection end.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
        .await
        .expect("the client's side is closed");
}

#[tokio::test]
async fn a_half_closed_direction_that_keeps_moving_is_not_cut() {
    let (mut client, mut a) = pair().await;
    let (mut b, mut server) = pair().await;
    // Wide against the writer's pace, so that a stalled thread on a loaded machine does not
    // make the pause between two bytes look like the bound.
    let bound = Duration::from_secs(1);
    let proxy = tokio::spawn(async move {
        bidirectional_bounded(
            &mut a,
            &mut b,
            Bounds {
                half_closed_idle: Some(bound),
                finish: None,
            },
        )
        .await
    });
    client.shutdown().await.unwrap();
    let mut eof = [0u8; 1];
    assert_eq!(server.read(&mut eof).await.unwrap(), 0);
    // The answer trickles in for well over the bound, a byte every tenth of it.
    let answer = tokio::spawn(async move {
        for _ in 0..30 {
            server.write_all(b"x").await.unwrap();
            tokio::time::sleep(bound / 10).await;
        }
        server.shutdown().await.unwrap();
        server
    });
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, [b'x'; 30]);
    let done = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the copy ends")
        .unwrap()
        .expect("a clean end");
    assert_eq!(done, (0, 30));
    drop(answer.await.unwrap());
}
