//! [`super::decide`] on queries as a stub resolver sends them.

use std::net::IpAddr;

use ferry_core::model::{ServiceScope, Workload};
use ferry_core::snapshot::Snapshot;
use ferry_core::testing::MeshBuilder;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::{Decision, Transport, decide, servfail};

/// sleep in alpha; `remote` global and only in beta; `ledger` local and only in beta; `wide`
/// global with 200 VIPs on alpha's network (too many for 512 bytes).
fn mesh() -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat").cluster("beta", "flat");
    m.node("alpha-1", "alpha", "r1/z1")
        .node("beta-1", "beta", "r2/z1");
    m.pod("sleep", "alpha-1", "198.18.1.10");
    m.pod("remote-b", "beta-1", "198.18.3.20");
    m.pod("ledger-b", "beta-1", "198.18.3.30");
    m.service("remote", &[("flat", "198.18.10.2")], 80, 8080);
    m.service("ledger", &[("flat", "198.18.10.3")], 80, 8080)
        .scope = ServiceScope::local();
    let vips: Vec<String> = (0..200)
        .map(|i| format!("198.18.{}.{}", 20 + i / 200, i % 200 + 1))
        .collect();
    let vips: Vec<(&str, &str)> = vips.iter().map(|v| ("flat", v.as_str())).collect();
    m.service("wide", &vips, 80, 8080);
    m.backs("remote-b", "remote").backs("ledger-b", "ledger");
    m.build()
}

fn sleep(snap: &Snapshot) -> &Workload {
    snap.workloads().find(|w| w.name == "sleep").expect("sleep")
}

/// A query as a stub resolver sends it: recursion desired, one question, EDNS if `edns`.
fn stub_query(name: &str, ty: RecordType, edns: bool) -> Vec<u8> {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), ty));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

fn answered(d: Decision) -> Message {
    match d {
        Decision::Answer { bytes, .. } => Message::from_vec(&bytes).expect("the answer parses"),
        Decision::Forward => panic!("expected an answer, got a forward"),
    }
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_mesh_name_is_answered_with_the_question_and_id_echoed() {
    let snap = mesh();
    let q = stub_query("remote.default.svc.cluster.local.", RecordType::A, true);
    let m = answered(decide(&q, &snap, sleep(&snap), Transport::Udp));
    assert_eq!(m.metadata.id, 0x1234);
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative && m.metadata.recursion_desired);
    assert_eq!(m.queries, Message::from_vec(&q).unwrap().queries);
    assert_eq!(addresses(&m), ["198.18.10.2".parse::<IpAddr>().unwrap()]);
    assert!(m.edns.is_some(), "EDNS in the query: EDNS in the answer");
    assert_eq!(m.answers[0].ttl, ferry_core::dns::ANSWER_TTL);
}

#[test]
fn an_out_of_scope_mesh_name_is_nxdomain_and_another_family_is_nodata() {
    let snap = mesh();
    let q = stub_query("ledger.default.svc.cluster.local.", RecordType::A, false);
    let d = decide(&q, &snap, sleep(&snap), Transport::Udp);
    assert!(matches!(d, Decision::Answer { hidden: true, .. }), "{d:?}");
    let m = answered(d);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.answers.is_empty());
    let q = stub_query("remote.default.svc.cluster.local.", RecordType::AAAA, false);
    let m = answered(decide(&q, &snap, sleep(&snap), Transport::Udp));
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty(), "IPv4 VIPs only: no AAAA");
}

#[test]
fn what_is_not_a_mesh_a_or_aaaa_question_is_forwarded() {
    let snap = mesh();
    let src = sleep(&snap);
    let forward = |q: &[u8]| decide(q, &snap, src, Transport::Udp) == Decision::Forward;
    assert!(forward(&stub_query(
        "example.outside.test.",
        RecordType::A,
        true
    )));
    // Other types of a mesh name: the upstream's to answer.
    assert!(forward(&stub_query(
        "remote.default.svc.cluster.local.",
        RecordType::SRV,
        false
    )));
    assert!(forward(&stub_query(
        "2.10.18.198.in-addr.arpa.",
        RecordType::PTR,
        false
    )));
    // An unknown opcode: forwarded, never answered NOTIMP by the proxy.
    let mut q = Message::from_vec(&stub_query(
        "remote.default.svc.cluster.local.",
        RecordType::A,
        false,
    ))
    .unwrap();
    q.metadata.op_code = OpCode::Unknown(14);
    assert!(forward(&q.to_vec().unwrap()));
    // A response, two questions, bytes that are no DNS message.
    let mut r = Message::from_vec(&stub_query(
        "remote.default.svc.cluster.local.",
        RecordType::A,
        false,
    ))
    .unwrap();
    r.metadata.message_type = MessageType::Response;
    assert!(forward(&r.to_vec().unwrap()));
    let mut two = Message::from_vec(&stub_query(
        "remote.default.svc.cluster.local.",
        RecordType::A,
        false,
    ))
    .unwrap();
    two.add_query(Query::query(
        Name::from_ascii("ledger.default.svc.cluster.local.").unwrap(),
        RecordType::A,
    ));
    assert!(forward(&two.to_vec().unwrap()));
    assert!(forward(b""));
    assert!(forward(&[0xff; 7]));
}

#[test]
fn a_mesh_answer_too_large_for_udp_is_truncated_and_whole_over_tcp() {
    let snap = mesh();
    let q = stub_query("wide.default.svc.cluster.local.", RecordType::A, false);
    let m = answered(decide(&q, &snap, sleep(&snap), Transport::Udp));
    assert!(m.metadata.truncation, "200 addresses do not fit 512 bytes");
    assert!(m.answers.is_empty());
    let m = answered(decide(&q, &snap, sleep(&snap), Transport::Tcp));
    assert!(!m.metadata.truncation);
    assert_eq!(addresses(&m).len(), 200);
}

#[test]
fn servfail_echoes_the_id_and_question_and_unreadable_bytes_get_none() {
    let q = stub_query("example.outside.test.", RecordType::A, false);
    let m = Message::from_vec(&servfail(&q).expect("an answer")).unwrap();
    assert_eq!(m.metadata.id, 0x1234);
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(m.queries.len(), 1);
    assert_eq!(servfail(&[1, 2, 3]), None);
}

#[test]
fn a_dual_stack_service_answers_a_with_its_ipv4_vip_and_aaaa_with_its_ipv6_vip() {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat");
    m.node("alpha-1", "alpha", "r1/z1");
    m.pod("sleep", "alpha-1", "198.18.1.10");
    m.pod("echo-a", "alpha-1", "198.18.1.20")
        .addresses
        .push("2001:2::1:20".parse().unwrap());
    m.service(
        "echo",
        &[("flat", "198.18.10.1"), ("flat", "2001:2::10:1")],
        80,
        8080,
    );
    m.backs("echo-a", "echo");
    let snap = m.build();
    let name = "echo.default.svc.cluster.local.";
    let a = answered(decide(
        &stub_query(name, RecordType::A, false),
        &snap,
        sleep(&snap),
        Transport::Udp,
    ));
    assert_eq!(addresses(&a), ["198.18.10.1".parse::<IpAddr>().unwrap()]);
    let aaaa = answered(decide(
        &stub_query(name, RecordType::AAAA, false),
        &snap,
        sleep(&snap),
        Transport::Udp,
    ));
    assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        addresses(&aaaa),
        ["2001:2::10:1".parse::<IpAddr>().unwrap()]
    );
}
