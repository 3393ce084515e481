//! ZDS packets as the node proxy reads them from its node agent (`ferry_node::zds::frames`):
//! the first byte says how many descriptors came with the packet (its low two bits) and whether
//! the ancillary data was cut (bit 2); the rest is the packet. Any input decodes to a request or
//! an error, never a panic; an add holds the one descriptor it came with, nothing else holds
//! any; and what decodes encodes back to a packet that decodes to the same request.
#![no_main]

use ferry_api::zds::{
    AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadRequest, workload_request,
};
use ferry_node::zds::frames::{FrameError, Request, decode};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&head, bytes)) = data.split_first() else {
        return;
    };
    let count = usize::from(head & 0b11);
    let truncated = head & 0b100 != 0;
    let fds: Vec<u32> = (0..count as u32).map(|i| 100 + i).collect();
    let decoded = decode(bytes, fds, truncated);
    let request = match decoded {
        Err(e) => {
            assert!(!matches!(e, FrameError::MissingNetns) || count == 0);
            return;
        }
        Ok(r) => r,
    };
    assert!(!truncated, "a cut packet is refused");
    let payload = match &request {
        Request::Add {
            uid,
            info,
            netns,
            uncaptured,
        } => {
            assert_eq!((count, *netns), (1, 100), "an add holds its one descriptor");
            assert!(
                uncaptured.iter().all(|p| *p != 0 && ![15001, 15006, 15008].contains(p)),
                "no port 0 or proxy port is left out of capture"
            );
            workload_request::Payload::Add(AddWorkload {
                uid: uid.clone(),
                workload_info: info.clone(),
                ferry_uncaptured_ports: uncaptured.iter().map(|p| u32::from(*p)).collect(),
            })
        }
        other => {
            assert_eq!(count, 0, "only an add carries descriptors");
            match other {
                Request::Keep { uid } => {
                    workload_request::Payload::Keep(KeepWorkload { uid: uid.clone() })
                }
                Request::Del { uid } => {
                    workload_request::Payload::Del(DelWorkload { uid: uid.clone() })
                }
                _ => workload_request::Payload::SnapshotSent(SnapshotSent {}),
            }
        }
    };
    let again = WorkloadRequest {
        payload: Some(payload),
    }
    .encode_to_vec();
    let fds: Vec<u32> = (0..count as u32).map(|i| 100 + i).collect();
    assert_eq!(
        decode(&again, fds, false),
        Ok(request),
        "decode(encode(r)) == r"
    );
});
