//! ZDS packets, decoded and encoded without I/O: what the node agent sends
//! ([`WorkloadRequest`] plus the descriptors of its SCM_RIGHTS ancillary data) becomes a
//! [`Request`] or a [`FrameError`]; what the node proxy sends (its hello, each ack) becomes bytes.
//!
//! Generic over the descriptor type `F`, so that the rules (one descriptor with an add, none with
//! anything else) are tested and fuzzed without real descriptors. A rejected packet's descriptors
//! are dropped with it: owned descriptors are closed, never kept.

use ferry_api::zds::{
    Ack, Version, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello, workload_request,
    workload_response,
};
use prost::Message;

/// The largest packet accepted. Istio's agent sends a few hundred bytes at most (a uid and a
/// pod's name, namespace and service account); ztunnel reads into 1 KiB.
pub const MAX_FRAME: usize = 8 * 1024;

/// One request of the node agent, checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<F> {
    /// Serve pod `uid`, whose network namespace is `netns`.
    Add {
        uid: String,
        /// The agent's name for the pod (informational: the mesh snapshot says who it is).
        info: Option<WorkloadInfo>,
        netns: F,
        /// Inbound ports left out of the pod's capture (Ferry's extension of the add, field
        /// 10000; none from Istio's agent), each checked: not 0, not a proxy port.
        uncaptured: Vec<u16>,
    },
    /// Do not release pod `uid` at the end of this replay.
    Keep { uid: String },
    /// Stop serving pod `uid`.
    Del { uid: String },
    /// The replay is over.
    SnapshotSent,
}

/// Why a packet is not a request the node proxy can act on. Each one is answered with an error
/// ack and changes nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("packet larger than {MAX_FRAME} bytes")]
    TooLarge,
    #[error("ancillary data truncated (more descriptors than the one expected)")]
    Truncated,
    #[error("not a WorkloadRequest: {0}")]
    Decode(String),
    #[error(
        "a request of no kind this node proxy knows (protocol V1: add, keep, del, snapshot_sent)"
    )]
    UnknownRequest,
    #[error("add without the pod's network namespace (no descriptor in SCM_RIGHTS)")]
    MissingNetns,
    #[error("{0} descriptors where an add carries one")]
    ExtraDescriptors(usize),
    #[error("{0} carries descriptors; only add does")]
    UnexpectedDescriptors(&'static str),
    #[error("{0} without a uid")]
    EmptyUid(&'static str),
    #[error(
        "uncaptured port {0} is not a port the pod's app may take out of capture (0, over 65535, or a proxy port)"
    )]
    UncapturedPort(u32),
}

/// Decodes one packet: its bytes, the descriptors that came with it, and whether the kernel cut
/// its ancillary data short (`MSG_CTRUNC`).
pub fn decode<F>(bytes: &[u8], mut fds: Vec<F>, truncated: bool) -> Result<Request<F>, FrameError> {
    if bytes.len() > MAX_FRAME {
        return Err(FrameError::TooLarge);
    }
    if truncated {
        return Err(FrameError::Truncated);
    }
    let request = WorkloadRequest::decode(bytes).map_err(|e| FrameError::Decode(e.to_string()))?;
    // A oneof field this version does not know decodes as no payload at all.
    let payload = request.payload.ok_or(FrameError::UnknownRequest)?;
    let kind = kind(&payload);
    let uid = match &payload {
        workload_request::Payload::Add(a) => Some(&a.uid),
        workload_request::Payload::Keep(k) => Some(&k.uid),
        workload_request::Payload::Del(d) => Some(&d.uid),
        workload_request::Payload::SnapshotSent(_) => None,
    };
    if uid.is_some_and(|u| u.trim().is_empty()) {
        return Err(FrameError::EmptyUid(kind));
    }
    match payload {
        workload_request::Payload::Add(add) => {
            if fds.len() > 1 {
                return Err(FrameError::ExtraDescriptors(fds.len()));
            }
            let uncaptured = add
                .ferry_uncaptured_ports
                .iter()
                .map(|p| crate::capture::uncapturable(*p).ok_or(FrameError::UncapturedPort(*p)))
                .collect::<Result<Vec<u16>, FrameError>>()?;
            let netns = fds.pop().ok_or(FrameError::MissingNetns)?;
            Ok(Request::Add {
                uid: add.uid,
                info: add.workload_info,
                netns,
                uncaptured,
            })
        }
        _ if !fds.is_empty() => Err(FrameError::UnexpectedDescriptors(kind)),
        workload_request::Payload::Keep(k) => Ok(Request::Keep { uid: k.uid }),
        workload_request::Payload::Del(d) => Ok(Request::Del { uid: d.uid }),
        workload_request::Payload::SnapshotSent(_) => Ok(Request::SnapshotSent),
    }
}

/// The node proxy's first packet on a connection: protocol V1.
pub fn hello() -> Vec<u8> {
    ZdsHello {
        version: Version::V1 as i32,
    }
    .encode_to_vec()
}

/// The answer to one request: an ack, with `error` set when the request failed.
pub fn ack(error: Option<&str>) -> Vec<u8> {
    WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(Ack {
            error: error.unwrap_or_default().to_string(),
        })),
    }
    .encode_to_vec()
}

fn kind(payload: &workload_request::Payload) -> &'static str {
    match payload {
        workload_request::Payload::Add(_) => "add",
        workload_request::Payload::Keep(_) => "keep",
        workload_request::Payload::Del(_) => "del",
        workload_request::Payload::SnapshotSent(_) => "snapshot_sent",
    }
}

#[cfg(test)]
mod tests {
    use ferry_api::zds::{AddWorkload, DelWorkload, KeepWorkload, SnapshotSent};

    use super::*;

    fn encode(p: workload_request::Payload) -> Vec<u8> {
        WorkloadRequest { payload: Some(p) }.encode_to_vec()
    }

    fn add(uid: &str) -> Vec<u8> {
        encode(workload_request::Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(WorkloadInfo {
                name: "web-0".into(),
                namespace: "default".into(),
                service_account: "web".into(),
            }),
            ferry_uncaptured_ports: Vec::new(),
        }))
    }

    fn del(uid: &str) -> Vec<u8> {
        encode(workload_request::Payload::Del(DelWorkload {
            uid: uid.into(),
        }))
    }

    #[test]
    fn an_add_with_one_descriptor_is_an_add_of_that_descriptor() {
        let Ok(Request::Add {
            uid,
            info,
            netns,
            uncaptured,
        }) = decode(&add("u1"), vec![7], false)
        else {
            panic!("not an add");
        };
        assert_eq!((uid.as_str(), netns), ("u1", 7));
        assert_eq!(info.map(|i| i.name), Some("web-0".to_string()));
        assert!(
            uncaptured.is_empty(),
            "Istio's agent leaves every port captured"
        );
    }

    #[test]
    fn an_add_carries_its_uncaptured_ports_and_a_proxy_port_or_no_port_is_refused() {
        let with = |ports: Vec<u32>| {
            encode(workload_request::Payload::Add(AddWorkload {
                uid: "u1".into(),
                workload_info: None,
                ferry_uncaptured_ports: ports,
            }))
        };
        let Ok(Request::Add { uncaptured, .. }) = decode(&with(vec![18080, 17778]), vec![7], false)
        else {
            panic!("not an add");
        };
        assert_eq!(uncaptured, [18080, 17778]);
        for bad in [0, 15001, 15006, 15008, 65536] {
            assert_eq!(
                decode(&with(vec![18080, bad]), vec![7], false),
                Err(FrameError::UncapturedPort(bad)),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_add_needs_exactly_one_descriptor() {
        assert_eq!(
            decode::<u8>(&add("u1"), vec![], false),
            Err(FrameError::MissingNetns)
        );
        assert_eq!(
            decode(&add("u1"), vec![1, 2], false),
            Err(FrameError::ExtraDescriptors(2))
        );
        assert_eq!(
            decode(&add("u1"), vec![1], true),
            Err(FrameError::Truncated)
        );
    }

    #[test]
    fn keep_del_and_snapshot_sent_carry_no_descriptor() {
        let keep = encode(workload_request::Payload::Keep(KeepWorkload {
            uid: "u".into(),
        }));
        assert_eq!(
            decode::<u8>(&keep, vec![], false),
            Ok(Request::Keep { uid: "u".into() })
        );
        assert_eq!(
            decode::<u8>(&del("u"), vec![], false),
            Ok(Request::Del { uid: "u".into() })
        );
        let sent = encode(workload_request::Payload::SnapshotSent(SnapshotSent {}));
        assert_eq!(
            decode::<u8>(&sent, vec![], false),
            Ok(Request::SnapshotSent)
        );
        assert_eq!(
            decode(&del("u"), vec![3], false),
            Err(FrameError::UnexpectedDescriptors("del"))
        );
        assert_eq!(
            decode(&sent, vec![3], false),
            Err(FrameError::UnexpectedDescriptors("snapshot_sent"))
        );
    }

    #[test]
    fn garbage_an_unknown_kind_an_empty_uid_and_an_oversized_packet_are_refused() {
        assert!(matches!(
            decode::<u8>(&[0xff, 0xff, 0xff], vec![], false),
            Err(FrameError::Decode(_))
        ));
        // Field 4 (NoSnapshotPresent, dropped upstream) or any later kind: no payload V1 knows.
        assert_eq!(
            decode::<u8>(&[0x22, 0x00], vec![], false),
            Err(FrameError::UnknownRequest)
        );
        assert_eq!(
            decode::<u8>(&[], vec![], false),
            Err(FrameError::UnknownRequest)
        );
        assert_eq!(
            decode::<u8>(&del(" "), vec![], false),
            Err(FrameError::EmptyUid("del"))
        );
        assert_eq!(
            decode(&add(""), vec![1], false),
            Err(FrameError::EmptyUid("add"))
        );
        let mut big = add("u");
        big.resize(MAX_FRAME + 1, 0);
        assert_eq!(decode(&big, vec![1], false), Err(FrameError::TooLarge));
    }

    #[test]
    fn a_refused_packets_descriptors_are_dropped_with_it() {
        use std::rc::Rc;
        let fd = Rc::new(());
        let r = decode(&del("u"), vec![fd.clone()], false);
        assert!(r.is_err());
        drop(r);
        assert_eq!(
            Rc::strong_count(&fd),
            1,
            "the descriptor outlived the refusal"
        );
    }

    #[test]
    fn the_hello_is_v1_and_an_ack_carries_its_error() {
        assert_eq!(hello(), [0x08, 0x01]);
        assert_eq!(ack(None), [0x0a, 0x00]);
        let failed = WorkloadResponse::decode(ack(Some("no")).as_slice()).unwrap();
        let Some(workload_response::Payload::Ack(a)) = failed.payload else {
            panic!("no ack");
        };
        assert_eq!(a.error, "no");
    }
}
