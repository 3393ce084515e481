//! One query in, what to do with it out: pure, no I/O. The wire format is hickory's
//! ([`hickory_proto::op::Message`]); what a name means is `ferry_core::dns`'s.
//!
//! The proxy answers a query itself only when it is a standard query (opcode QUERY, QR clear)
//! with one question, class IN, type A or AAAA, for a mesh name. Everything else (other types
//! such as SRV and PTR, other opcodes, several questions, a message hickory cannot read) goes
//! to the upstream resolver as the bytes the pod sent, and the upstream's answer comes back as
//! the bytes it sent: the proxy never answers NOTIMP or FORMERR for what it does not know.

use std::net::IpAddr;

use ferry_core::dns::{ANSWER_TTL, MeshName, lookup};
use ferry_core::model::Workload;
use ferry_core::snapshot::Snapshot;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

/// The EDNS payload size the proxy advertises in its own answers (the DNS flag day's 1232).
const EDNS_PAYLOAD: u16 = 1232;

/// The largest answer over UDP to a query without EDNS (RFC 1035).
const PLAIN_UDP_LIMIT: usize = 512;

/// What the proxy does with one query.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Answered by the proxy (a mesh name): the answer's bytes.
    Answer {
        bytes: Vec<u8>,
        /// NXDOMAIN: a mesh name out of scope for this pod.
        hidden: bool,
    },
    /// Not a mesh query: sent to the upstream as it is.
    Forward,
}

/// Where the answer goes back: over UDP it must fit the query's payload size (else it is sent
/// truncated, TC set, and the stub asks again over TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// Decides `query` (as the pod sent it) from `source` on the mesh `snap`.
pub(crate) fn decide(
    query: &[u8],
    snap: &Snapshot,
    source: &Workload,
    transport: Transport,
) -> Decision {
    let Ok(msg) = Message::from_vec(query) else {
        return Decision::Forward;
    };
    let Some(name) = mesh_question(&msg) else {
        return Decision::Forward;
    };
    let (addresses, hidden) = match lookup(snap, source, &name) {
        MeshName::Outside => return Decision::Forward,
        MeshName::Hidden => (Vec::new(), true),
        MeshName::Resolves(a) => (a, false),
    };
    match answer(&msg, &addresses, hidden, transport) {
        Some(bytes) => Decision::Answer { bytes, hidden },
        // Not expected (hickory encodes what it decoded); the upstream can still answer.
        None => Decision::Forward,
    }
}

/// The name of a query the proxy may answer: a standard query with one IN question for A or
/// AAAA.
fn mesh_question(msg: &Message) -> Option<String> {
    let m = &msg.metadata;
    if m.message_type != MessageType::Query || m.op_code != OpCode::Query {
        return None;
    }
    let [q] = msg.queries.as_slice() else {
        return None;
    };
    if q.query_class() != DNSClass::IN
        || !matches!(q.query_type(), RecordType::A | RecordType::AAAA)
    {
        return None;
    }
    Some(q.name().to_ascii())
}

/// The proxy's answer to `msg`: authoritative, the question echoed, the addresses of the
/// question's family (none: NODATA), or NXDOMAIN for a `hidden` name; EDNS if the query had
/// it. Over UDP, an answer larger than the query allows goes truncated (TC).
fn answer(
    msg: &Message,
    addresses: &[IpAddr],
    hidden: bool,
    transport: Transport,
) -> Option<Vec<u8>> {
    let q = msg.queries.first()?;
    let mut resp = Message::response(msg.metadata.id, OpCode::Query);
    resp.metadata.authoritative = true;
    resp.metadata.recursion_desired = msg.metadata.recursion_desired;
    resp.metadata.checking_disabled = msg.metadata.checking_disabled;
    resp.metadata.recursion_available = true;
    resp.metadata.response_code = if hidden {
        ResponseCode::NXDomain
    } else {
        ResponseCode::NoError
    };
    resp.add_query(q.clone());
    for ip in addresses {
        let rdata = match (ip, q.query_type()) {
            (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
            (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
            _ => continue,
        };
        resp.add_answer(Record::from_rdata(q.name().clone(), ANSWER_TTL, rdata));
    }
    let limit = match &msg.edns {
        Some(e) => {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            resp.set_edns(edns);
            usize::from(e.max_payload()).max(PLAIN_UDP_LIMIT)
        }
        None => PLAIN_UDP_LIMIT,
    };
    let bytes = resp.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > limit {
        return resp.truncate().to_vec().ok();
    }
    Some(bytes)
}

/// SERVFAIL for `query` (the upstream could not be reached): `None` if the query cannot be
/// read, which then goes unanswered, as it would if the upstream were silent.
pub(crate) fn servfail(query: &[u8]) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    let mut resp = Message::error_msg(
        msg.metadata.id,
        msg.metadata.op_code,
        ResponseCode::ServFail,
    );
    resp.metadata.recursion_desired = msg.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.add_queries(msg.queries.iter().cloned());
    resp.to_vec().ok()
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
