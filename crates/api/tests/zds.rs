//! The ZDS messages encode with Istio's field numbers: bytes written by hand from
//! `istio.workload.zds` (a tag is `field << 3 | wire type`, 2 for length-delimited, 0 for varint).

use ferry_api::zds::{
    Ack, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, Version, WorkloadInfo,
    WorkloadRequest, WorkloadResponse, ZdsHello, workload_request, workload_response,
};
use prost::Message;

fn request(p: workload_request::Payload) -> Vec<u8> {
    WorkloadRequest { payload: Some(p) }.encode_to_vec()
}

#[test]
fn the_hello_carries_version_1_in_field_1() {
    let hello = ZdsHello {
        version: Version::V1 as i32,
    };
    assert_eq!(hello.encode_to_vec(), [0x08, 0x01]);
    assert_eq!(Version::NotUsed as i32, 0);
}

#[test]
fn add_is_field_1_with_uid_1_and_workload_info_2() {
    let add = request(workload_request::Payload::Add(AddWorkload {
        uid: "u".into(),
        workload_info: Some(WorkloadInfo {
            name: "n".into(),
            namespace: "s".into(),
            service_account: "a".into(),
        }),
        ferry_uncaptured_ports: Vec::new(),
    }));
    let info = [0x0a, 1, b'n', 0x12, 1, b's', 0x1a, 1, b'a'];
    let mut inner = vec![0x0a, 1, b'u', 0x12, info.len() as u8];
    inner.extend(info);
    let mut want = vec![0x0a, inner.len() as u8];
    want.extend(inner);
    assert_eq!(add, want);
}

/// Ferry's extension of the add (uncaptured ports, field 10000, packed varints) comes after
/// Istio's fields: a stock ztunnel skips it as an unknown field.
#[test]
fn the_uncaptured_ports_extension_is_field_10000_packed() {
    let add = request(workload_request::Payload::Add(AddWorkload {
        uid: "u".into(),
        workload_info: None,
        ferry_uncaptured_ports: vec![18080, 1],
    }));
    // 10000 << 3 | 2 = 80002: varint 0x82 0xf1 0x04; 18080: 0xa0 0x8d 0x01; 1: 0x01.
    let inner = [0x0a, 1, b'u', 0x82, 0xf1, 0x04, 4, 0xa0, 0x8d, 0x01, 0x01];
    let mut want = vec![0x0a, inner.len() as u8];
    want.extend(inner);
    assert_eq!(add, want);
}

#[test]
fn keep_is_field_5_del_is_field_2_with_uid_2_snapshot_sent_is_field_3() {
    let keep = request(workload_request::Payload::Keep(KeepWorkload {
        uid: "u".into(),
    }));
    assert_eq!(keep, [0x2a, 3, 0x0a, 1, b'u']);
    let del = request(workload_request::Payload::Del(DelWorkload {
        uid: "u".into(),
    }));
    assert_eq!(del, [0x12, 3, 0x12, 1, b'u']);
    let sent = request(workload_request::Payload::SnapshotSent(SnapshotSent {}));
    assert_eq!(sent, [0x1a, 0]);
}

#[test]
fn the_ack_is_field_1_with_error_1() {
    let ack = WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(Ack { error: "e".into() })),
    };
    assert_eq!(ack.encode_to_vec(), [0x0a, 3, 0x0a, 1, b'e']);
}
