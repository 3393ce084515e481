//! The DNS answer corpus: queries as a stub resolver sends them, through the proxy's UDP socket
//! and TCP handler, against a real upstream server on loopback (hickory-server). Where the
//! proxy forwards, what comes back must be byte for byte what the upstream answers the same
//! query; mesh names are answered by the proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::model::WorkloadUid;
use ferry_core::store::Store;
use ferry_core::testing::MeshBuilder;
use ferry_runtime::dns_server::ZoneServer;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::{Egress, Metrics, Opening, Resolver, Settings};

const OUTSIDE: &str = "\
$ORIGIN outside.test.
@     3600 IN SOA ns.outside.test. admin.outside.test. 1 3600 600 86400 60
@     3600 IN NS  ns
ns    3600 IN A   198.18.200.53
www   3600 IN A   198.18.200.80
www   3600 IN AAAA 2001:db8::80
_http._tcp 3600 IN SRV 10 5 80 www
big   3600 IN TXT \"0000000000000000000000000000000000000000000000000000000000000000\"
big   3600 IN TXT \"1111111111111111111111111111111111111111111111111111111111111111\"
big   3600 IN TXT \"2222222222222222222222222222222222222222222222222222222222222222\"
big   3600 IN TXT \"3333333333333333333333333333333333333333333333333333333333333333\"
big   3600 IN TXT \"4444444444444444444444444444444444444444444444444444444444444444\"
big   3600 IN TXT \"5555555555555555555555555555555555555555555555555555555555555555\"
big   3600 IN TXT \"6666666666666666666666666666666666666666666666666666666666666666\"
big   3600 IN TXT \"7777777777777777777777777777777777777777777777777777777777777777\"
big   3600 IN TXT \"8888888888888888888888888888888888888888888888888888888888888888\"
big   3600 IN TXT \"9999999999999999999999999999999999999999999999999999999999999999\"
";

const REVERSE: &str = "\
$ORIGIN 18.198.in-addr.arpa.
@      3600 IN SOA ns.outside.test. admin.outside.test. 1 3600 600 86400 60
@      3600 IN NS  ns.outside.test.
80.200 3600 IN PTR www.outside.test.
";

/// Forwarded queries leave from this process, as from a pod's namespace.
#[derive(Debug)]
struct Direct;

impl Egress for Direct {
    fn udp(&self, upstream: SocketAddr) -> Opening<'_, UdpSocket> {
        Box::pin(async move {
            let s = UdpSocket::bind("127.0.0.1:0").await?;
            s.connect(upstream).await?;
            Ok(s)
        })
    }

    fn tcp(&self, upstream: SocketAddr) -> Opening<'_, TcpStream> {
        Box::pin(TcpStream::connect(upstream))
    }
}

/// The proxy of pod `sleep` (alpha), with `remote` a global service only in beta, forwarding
/// to `upstream`: its UDP socket's address and a TCP listener handing connections to it.
async fn proxy(upstream: SocketAddr) -> (SocketAddr, SocketAddr) {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat").cluster("beta", "flat");
    m.node("alpha-1", "alpha", "r1/z1")
        .node("beta-1", "beta", "r2/z1");
    m.pod("sleep", "alpha-1", "198.18.1.10");
    m.pod("remote-b", "beta-1", "198.18.3.20");
    m.service("remote", &[("flat", "198.18.10.2")], 80, 8080);
    m.backs("remote-b", "remote");
    let store = Arc::new(Store::new(m.build()));
    let settings = Settings {
        upstream: Some(upstream),
        metrics: Metrics::default(),
    };
    let resolver: Arc<Resolver> =
        settings.resolver(store, WorkloadUid::new("alpha//v1/Pod/default/sleep"));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let udp_addr = udp.local_addr().unwrap();
    tokio::spawn(resolver.clone().serve_udp(Arc::new(Direct), udp));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = tcp.accept().await {
            tokio::spawn(resolver.clone().serve_tcp(Arc::new(Direct), conn));
        }
    });
    (udp_addr, tcp_addr)
}

/// A query as a stub resolver (glibc, musl, hickory's) sends it: a fresh id, recursion desired,
/// one question; with EDNS (payload 1232) or without.
fn stub_query(id: u16, name: &str, ty: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), ty));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

async fn over_udp(to: SocketAddr, query: &[u8]) -> Vec<u8> {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    s.connect(to).await.unwrap();
    s.send(query).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    let n = tokio::time::timeout(Duration::from_secs(10), s.recv(&mut buf))
        .await
        .expect("an answer over UDP")
        .unwrap();
    buf.truncate(n);
    buf
}

/// `queries` one after another on one TCP connection; their answers.
async fn over_tcp(to: SocketAddr, queries: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut s = TcpStream::connect(to).await.unwrap();
    let mut answers = Vec::new();
    for q in queries {
        let len = u16::try_from(q.len()).unwrap().to_be_bytes();
        s.write_all(&[&len[..], q].concat()).await.unwrap();
        let mut len = [0u8; 2];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
            .await
            .expect("an answer over TCP")
            .unwrap();
        let mut a = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut a).await.unwrap();
        answers.push(a);
    }
    answers
}

#[tokio::test]
async fn forwarded_answers_are_the_upstreams_byte_for_byte() {
    let upstream = ZoneServer::start(&[OUTSIDE, REVERSE], "127.0.0.1:0".parse().unwrap())
        .await
        .expect("the upstream serves");
    let (udp, tcp) = proxy(upstream.addr).await;

    let corpus: Vec<(&str, Vec<u8>)> = vec![
        (
            "A",
            stub_query(0x0101, "www.outside.test.", RecordType::A, true),
        ),
        (
            "A without EDNS",
            stub_query(0x0102, "www.outside.test.", RecordType::A, false),
        ),
        (
            "AAAA",
            stub_query(0x0103, "www.outside.test.", RecordType::AAAA, true),
        ),
        (
            "SRV",
            stub_query(0x0104, "_http._tcp.outside.test.", RecordType::SRV, true),
        ),
        (
            "PTR",
            stub_query(
                0x0105,
                "80.200.18.198.in-addr.arpa.",
                RecordType::PTR,
                false,
            ),
        ),
        (
            "NXDOMAIN",
            stub_query(0x0106, "nothing.outside.test.", RecordType::A, true),
        ),
        // A mesh name's other types are the upstream's too.
        (
            "SRV of a mesh name",
            stub_query(
                0x0107,
                "remote.default.svc.cluster.local.",
                RecordType::SRV,
                false,
            ),
        ),
        (
            "big, fits EDNS",
            stub_query(0x0108, "big.outside.test.", RecordType::TXT, true),
        ),
    ];
    for (what, q) in &corpus {
        let direct = over_udp(upstream.addr, q).await;
        let proxied = over_udp(udp, q).await;
        assert_eq!(proxied, direct, "{what} over UDP: the upstream's bytes");
        let direct = over_tcp(upstream.addr, &[q]).await;
        let proxied = over_tcp(tcp, &[q]).await;
        assert_eq!(proxied, direct, "{what} over TCP: the upstream's bytes");
    }

    // An unknown opcode: the upstream's answer (NOTIMP from this one), not the proxy's.
    let mut odd = Message::from_vec(&stub_query(
        0x0109,
        "www.outside.test.",
        RecordType::A,
        false,
    ))
    .unwrap();
    odd.metadata.op_code = OpCode::Unknown(14);
    let odd = odd.to_vec().unwrap();
    let direct = over_udp(upstream.addr, &odd).await;
    assert_eq!(
        over_udp(udp, &odd).await,
        direct,
        "an unknown opcode is forwarded"
    );

    // Truncation and the TCP fallback: too big for 512 bytes, the upstream sends TC over UDP
    // and the proxy passes that on unchanged; the stub's retry over TCP gets it whole, also
    // the upstream's bytes.
    let big = stub_query(0x010a, "big.outside.test.", RecordType::TXT, false);
    let direct = over_udp(upstream.addr, &big).await;
    assert!(
        Message::from_vec(&direct).unwrap().metadata.truncation,
        "the upstream truncates"
    );
    let proxied = over_udp(udp, &big).await;
    assert_eq!(proxied, direct, "the truncated answer, unchanged");
    let whole = over_tcp(tcp, &[&big]).await.remove(0);
    let m = Message::from_vec(&whole).unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 10);
    assert_eq!(whole, over_tcp(upstream.addr, &[&big]).await.remove(0));

    // A mesh name and outside names on one TCP connection, in turn.
    let mesh = stub_query(
        0x010b,
        "remote.default.svc.cluster.local.",
        RecordType::A,
        false,
    );
    let www = stub_query(0x010c, "www.outside.test.", RecordType::A, false);
    let answers = over_tcp(tcp, &[&www, &mesh, &www]).await;
    let direct = over_tcp(upstream.addr, &[&www]).await.remove(0);
    assert_eq!(answers[0], direct);
    assert_eq!(answers[2], direct);
    let m = Message::from_vec(&answers[1]).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(m.answers.len(), 1, "the proxy answers the mesh name");
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_is_servfail() {
    // A port nothing listens on: refused at once. Its sockets are held for the whole test, so
    // that no socket of a test running alongside is given the port: a UDP socket connected
    // elsewhere (a datagram from anyone else finds no socket) and a TCP socket bound, not
    // listening.
    let (gone, _held) = (0..16)
        .find_map(|_| {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            udp.connect("127.0.0.1:9").unwrap();
            let gone = udp.local_addr().unwrap();
            let tcp = tokio::net::TcpSocket::new_v4().unwrap();
            tcp.bind(gone).ok().map(|()| (gone, (udp, tcp)))
        })
        .expect("a port free over UDP and TCP");
    let (udp, tcp) = proxy(gone).await;
    let q = stub_query(0x0201, "www.outside.test.", RecordType::A, false);
    let m = Message::from_vec(&over_udp(udp, &q).await).unwrap();
    assert_eq!(m.metadata.id, 0x0201);
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    let m = Message::from_vec(&over_tcp(tcp, &[&q]).await.remove(0)).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}
