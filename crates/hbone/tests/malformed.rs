//! Attacker-controlled input: malformed requests, headers and bytes never panic the server, and
//! it keeps serving.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferry_hbone::headers::{self, ConnectHeaders, Refusal, Target};
use ferry_hbone::pool::PoolConfig;
use ferry_hbone::settings::Settings;
use ferry_tls::testkit::TestCa;
use http::{HeaderMap, HeaderValue, Method};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_method_and_authority_is_parsed_or_refused(method in "[A-Z]{1,10}", authority in ".{0,80}") {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        match headers::parse_request(&m, Some(&authority)) {
            Ok(Target::Addr(a)) => prop_assert!(m == Method::CONNECT && a.port() != 0),
            Ok(Target::Host { hostname, port }) => {
                prop_assert!(m == Method::CONNECT && port != 0 && !hostname.is_empty());
                prop_assert_eq!(hostname.to_ascii_lowercase(), hostname);
            }
            Err(Refusal::MethodNotAllowed(_)) => prop_assert!(m != Method::CONNECT),
            Err(r) => prop_assert_eq!(r.status(), 400),
        }
    }

    #[test]
    fn authorities_shaped_like_targets(host in "[a-z0-9.:\\[\\]-]{0,40}", port in any::<u32>()) {
        let _ = headers::parse_authority(&format!("{host}:{port}"));
    }

    #[test]
    fn any_header_values_are_read_without_panic(
        baggage in proptest::collection::vec(any::<u8>(), 0..300),
        forwarded in proptest::collection::vec(any::<u8>(), 0..200),
        traceparent in ".{0,80}",
        network in ".{0,300}",
    ) {
        let mut map = HeaderMap::new();
        for (name, bytes) in [("baggage", &baggage), ("forwarded", &forwarded)] {
            if let Ok(v) = HeaderValue::from_bytes(bytes) {
                map.insert(name, v);
            }
        }
        if let Ok(v) = HeaderValue::from_str(&traceparent) {
            map.insert("traceparent", v);
        }
        if let Ok(v) = HeaderValue::from_str(&network) {
            map.insert("x-forwarded-network", v);
        }
        let h = ConnectHeaders::read(&map);
        prop_assert!(h.baggage.len() <= 64);
        if let Some(t) = &h.traceparent {
            prop_assert!(headers::valid_traceparent(t));
        }
    }

    #[test]
    fn written_headers_read_back(k in "[a-z.]{1,20}", v in "[a-zA-Z0-9-]{1,20}", port in 1u16.., ip in any::<[u8; 4]>()) {
        let h = ConnectHeaders {
            baggage: vec![(k, v)],
            forwarded_for: Some(std::net::SocketAddr::from((ip, port))),
            ..ConnectHeaders::default()
        };
        let mut map = HeaderMap::new();
        h.write(&mut map);
        prop_assert_eq!(ConnectHeaders::read(&map), h);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_before_and_after_tls_does_not_stop_the_server() {
    let ca = Arc::new(TestCa::new("root"));
    let echo = echo_server().await;
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;

    // Plain text where a TLS ClientHello belongs.
    let mut s = tokio::net::TcpStream::connect(hbone).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink).await;

    // A valid mutual-TLS session, then bytes that are not an HTTP/2 preface.
    let config =
        ferry_tls::config::client_config(&ca.issue_str(CLIENT), &ca.bundle(), vec![id(SERVER)])
            .unwrap();
    let tcp = tokio::net::TcpStream::connect(hbone).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ferry_tls::config::server_name(hbone), tcp)
        .await
        .unwrap();
    tls.write_all(&[0xff; 300]).await.unwrap();
    let _ = tls.read_to_end(&mut sink).await;

    // A valid preface followed by a malformed frame (a HEADERS frame on stream 0).
    let config =
        ferry_tls::config::client_config(&ca.issue_str(CLIENT), &ca.bundle(), vec![id(SERVER)])
            .unwrap();
    let tcp = tokio::net::TcpStream::connect(hbone).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ferry_tls::config::server_name(hbone), tcp)
        .await
        .unwrap();
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // empty SETTINGS
    tls.write_all(&[0, 0, 3, 1, 4, 0, 0, 0, 0, 0x82, 0x86, 0x84])
        .await
        .unwrap(); // HEADERS on stream 0
    let _ = tls.read_to_end(&mut sink).await;

    // The server still serves a real client.
    let client = ClientSide::new(ca.clone(), PoolConfig::default());
    let mut t = client
        .open(hbone, echo)
        .await
        .expect("server still serving");
    t.write_all(b"fine").await.unwrap();
    let mut b = [0u8; 4];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"fine");
}

/// A mutual-TLS session to `hbone` with the client's certificate, offering `alpn`.
async fn tls_session(
    ca: &TestCa,
    hbone: std::net::SocketAddr,
    alpn: Option<Vec<Vec<u8>>>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let config =
        ferry_tls::config::client_config(&ca.issue_str(CLIENT), &ca.bundle(), vec![id(SERVER)])
            .unwrap();
    let mut config = (*config).clone();
    if let Some(alpn) = alpn {
        config.alpn_protocols = alpn;
    }
    let tcp = tokio::net::TcpStream::connect(hbone).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ferry_tls::config::server_name(hbone), tcp)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_offering_no_alpn_is_refused_before_http2() {
    let ca = Arc::new(TestCa::new("root"));
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings::default(),
    )
    .await;
    let mut tls = tls_session(&ca, hbone, Some(Vec::new())).await;
    // (The server may already have closed: a write can fail.)
    let _ = tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let _ = tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await; // empty SETTINGS
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut got)).await;
    assert!(closed.is_ok(), "the server kept the connection open");
    assert!(got.is_empty(), "the server spoke HTTP/2: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_client_that_never_sends_the_preface_is_closed() {
    let ca = Arc::new(TestCa::new("root"));
    let hbone = hbone_server(
        &ca,
        SERVER,
        Arc::new(Recorder::default()),
        Settings {
            // It bounds the TLS accept too: wide enough for that on a loaded machine.
            connect_timeout: Duration::from_secs(2),
            ..Settings::default()
        },
    )
    .await;
    let mut tls = tls_session(&ca, hbone, None).await;
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut got)).await;
    assert!(
        closed.is_ok(),
        "a connection without a preface was kept open"
    );
}
