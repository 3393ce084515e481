//! At a drain deadline the server ends every open tunnel cleanly: the client's stream gets
//! END_STREAM, the target gets a FIN (never a reset), and the connection, already sent a
//! GOAWAY, closes with a TLS close_notify (the client's HTTP/2 connection ends without error).

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{CLIENT, Recorder, SERVER, id};
use ferry_hbone::server::Server;
use ferry_hbone::settings::Settings;
use ferry_hbone::stream::H2Stream;
use ferry_tls::config::{client_config, server_name};
use ferry_tls::testkit::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_deadline_tunnels_end_with_fin_and_the_connection_with_close_notify() {
    let ca = Arc::new(TestCa::new("root"));
    // The target: reports what its read of the tunnel ended with.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    // The target: reports each read, and what its reading ended with.
    let (read_tx, mut read_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        loop {
            let r = s
                .read(&mut buf)
                .await
                .map(|n| Bytes::copy_from_slice(&buf[..n]));
            let end = !matches!(&r, Ok(b) if !b.is_empty());
            let _ = read_tx.send(r);
            if end {
                break;
            }
        }
        // Keeps its side open: only the proxy ends the connection.
        std::future::pending::<()>().await;
    });
    let mut received = Vec::new();
    let mut until_received = async |want: &[u8]| {
        while received != want {
            let r = tokio::time::timeout(Duration::from_secs(10), read_rx.recv())
                .await
                .expect("the target reads")
                .unwrap();
            received.extend_from_slice(&r.expect("data"));
        }
    };
    let (drain, drain_rx) = tokio::sync::watch::channel(false);
    let (finish, finish_rx) = tokio::sync::watch::channel(false);
    let server = Arc::new(
        Server::new(&ca.issue_str(SERVER), &ca.bundle(), Settings::default())
            .unwrap()
            .drain_on(drain_rx)
            .finish_on(finish_rx),
    );
    let hl = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hbone = hl.local_addr().unwrap();
    tokio::spawn(server.serve(hl, Arc::new(Recorder::default())));

    // A client made by hand, so the connection's own end can be observed.
    let config = client_config(&ca.issue_str(CLIENT), &ca.bundle(), vec![id(SERVER)]).unwrap();
    let (relay, from_server) = recording_relay(hbone).await;
    let tcp = TcpStream::connect(relay).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name(hbone), tcp)
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    let conn = tokio::spawn(conn);
    let request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(target.to_string())
        .body(())
        .unwrap();
    let mut send = send.ready().await.unwrap();
    let (response, stream) = send.send_request(request, false).unwrap();
    drop(send);
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut tunnel = H2Stream::new(stream, response.into_body());
    tunnel.write_all(b"before").await.unwrap();
    until_received(b"before").await;

    // Draining: a GOAWAY, and the open tunnel keeps flowing.
    drain.send(true).unwrap();
    tunnel.write_all(b" during").await.unwrap();
    tunnel.flush().await.unwrap();
    until_received(b"before during").await;

    // The deadline: the tunnel ends cleanly on both sides.
    finish.send(true).unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tunnel.read_to_end(&mut rest))
        .await
        .expect("the tunnel ends");
    assert!(read.is_ok(), "the client's stream was reset: {read:?}");
    let end = tokio::time::timeout(Duration::from_secs(10), read_rx.recv())
        .await
        .expect("the target's read ends")
        .unwrap();
    assert_eq!(end.expect("a FIN, not a reset"), Bytes::new());
    // Like an app seeing EOF, the client finishes its side too; the server, which waits a
    // moment for that, then closes the connection.
    tunnel.shutdown().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the client's connection ends");
    // What the server sent, as TLS records, ended by a FIN: the last record is an encrypted
    // alert (TLS 1.3 with AES-GCM: 2 alert bytes + 1 type byte + 16 tag bytes = 19), the
    // close_notify; an HTTP/2 frame would be at least 9 + 1 + 16 bytes.
    let bytes = tokio::time::timeout(Duration::from_secs(10), from_server)
        .await
        .expect("the server closes its side")
        .unwrap()
        .expect("the server ends with a FIN, not a reset");
    let mut records = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        records.push((rest[0], len));
        rest = &rest[(5 + len).min(rest.len())..];
    }
    assert!(rest.is_empty(), "a partial record at the end");
    assert_eq!(
        records.last(),
        Some(&(0x17, 19)),
        "the server's last record is not a close_notify: {records:?}"
    );
}

/// A plain TCP relay to `to` for one connection; resolves to everything the server sent once it
/// closed its side with a FIN (an error if it reset instead).
async fn recording_relay(
    to: std::net::SocketAddr,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Receiver<std::io::Result<Vec<u8>>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let server = TcpStream::connect(to).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut cr, &mut sw).await;
            let _ = sw.shutdown().await;
        });
        let mut seen = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let end = loop {
            match sr.read(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    seen.extend_from_slice(&buf[..n]);
                    let _ = cw.write_all(&buf[..n]).await;
                }
                Err(e) => break Err(e),
            }
        };
        let _ = cw.shutdown().await;
        let _ = tx.send(end.map(|()| seen));
    });
    (addr, rx)
}
