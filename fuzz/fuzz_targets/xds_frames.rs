//! A node's xDS response stream as its client reads it (`ferry_xds::client`): the bytes of a
//! response body cut into data frames, read a gRPC message at a time
//! (`ferry_xds::client::framing::Deframer`), each decoded as a `DeltaDiscoveryResponse`.
//!
//! The input's first byte sets the frames' size (1 to 256 bytes); the rest is the body. Checks:
//! no panic, the reader holds no buffer between messages, a message is never longer than its
//! limit, and the messages with their headers never come to more than the body.
#![no_main]

use bytes::Bytes;
use ferry_api::discovery::DeltaDiscoveryResponse;
use ferry_xds::client::framing::{Deframer, HEADER};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

/// Small, so that a header's word alone cannot make an input slow.
const LIMIT: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&size, body)) = data.split_first() else {
        return;
    };
    let mut d = Deframer::new(LIMIT);
    let mut read = 0;
    'frames: for chunk in body.chunks(usize::from(size) + 1) {
        let mut chunk = Bytes::copy_from_slice(chunk);
        loop {
            match d.next_message(&mut chunk) {
                Ok(Some(message)) => {
                    assert_eq!(d.retained(), 0, "a buffer kept between messages");
                    assert!(message.len() <= LIMIT);
                    read += HEADER + message.len();
                    let _ = DeltaDiscoveryResponse::decode(message);
                }
                Ok(None) => break,
                Err(_) => break 'frames,
            }
        }
    }
    assert!(read <= body.len());
    let _ = d.finish();
});
