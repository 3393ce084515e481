//! One `DeltaDiscoveryResponse` as gRPC-framed bytes, written in bounded chunks straight from
//! the shared [`Diff`] it carries.
//!
//! tonic's encoder writes a whole message into one buffer per stream and keeps that buffer's
//! allocation for the stream's life, so every synced node cost the server its largest push (the
//! initial sync: about 32 MiB at 100,000 workloads) for as long as it stayed connected, and a
//! stream being synced held a copy of every resource body besides. Here a response is written
//! a chunk at a time ([`Outgoing::next_chunk`]): what a stream holds is the `Arc<Diff>` (shared
//! with every stream brought over the same change) and one chunk, freed once the transport has
//! written it. The bytes are exactly prost's encoding of the same message (fields in prost's
//! order, defaults left out), prefixed with gRPC's uncompressed message header.

use std::sync::Arc;

use bytes::Bytes;
use ferry_xds::client::framing::HEADER;
use ferry_xds::resources::{Diff, Versioned};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len, string};

/// A response being sent: its fields, and how far it has been written.
#[derive(Debug)]
pub(super) struct Outgoing {
    type_url: String,
    nonce: String,
    diff: Arc<Diff>,
    /// The message's encoded length (computed once: a walk over its items' lengths).
    len: usize,
    /// Of it, the bytes not yet handed out.
    left: usize,
    /// The next item to write (see [`Outgoing::item_len`]); `None` before the header.
    next: Option<usize>,
}

// Field numbers of envoy.service.discovery.v3.DeltaDiscoveryResponse, Resource and Any.
const RESPONSE_RESOURCES: u32 = 2;
const RESPONSE_TYPE_URL: u32 = 4;
const RESPONSE_NONCE: u32 = 5;
const RESPONSE_REMOVED: u32 = 6;
const RESOURCE_VERSION: u32 = 1;
const RESOURCE_RESOURCE: u32 = 2;
const RESOURCE_NAME: u32 = 3;
const ANY_TYPE_URL: u32 = 1;
const ANY_VALUE: u32 = 2;

/// A response that gRPC cannot frame: its message is longer than the 32-bit length of gRPC's
/// message header allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {type_url} response of {len} bytes is over gRPC's limit of {max} bytes a message")]
pub(super) struct TooLarge {
    pub(super) type_url: String,
    pub(super) len: usize,
    pub(super) max: u32,
}

impl Outgoing {
    /// The response carrying `diff`, or [`TooLarge`] when its message cannot be framed.
    pub(super) fn new(type_url: &str, nonce: String, diff: Arc<Diff>) -> Result<Self, TooLarge> {
        let mut out = Self {
            type_url: type_url.to_string(),
            nonce,
            diff,
            len: 0,
            left: 0,
            next: None,
        };
        out.len = (0..out.items()).map(|i| out.item_len(i)).sum();
        header(out.len).map_err(|e| TooLarge {
            type_url: type_url.to_string(),
            ..e
        })?;
        out.left = out.len;
        Ok(out)
    }

    /// The next chunk of the framed message: whole fields, no more than `at_most` bytes unless
    /// one field alone is larger (a resource is never split); `None` once all is written.
    pub(super) fn next_chunk(&mut self, at_most: usize) -> Option<Bytes> {
        let items = self.items();
        let mut i = match self.next {
            Some(i) if i >= items => return None,
            Some(i) => i,
            None => 0,
        };
        let mut chunk = Vec::with_capacity(at_most.min(HEADER + self.left));
        if self.next.is_none() {
            // `new` refused a length the header cannot hold.
            if let Ok(h) = header(self.len) {
                chunk.extend_from_slice(&h);
            }
        }
        while i < items {
            let len = self.item_len(i);
            if chunk.len() + len > at_most && !chunk.is_empty() {
                break;
            }
            self.write_item(i, &mut chunk);
            self.left -= len;
            i += 1;
        }
        self.next = Some(i);
        Some(Bytes::from(chunk))
    }

    /// Whether every byte has been handed out.
    pub(super) fn is_done(&self) -> bool {
        self.next.is_some_and(|i| i >= self.items())
    }

    /// Items in field order: the upserts (field 2), the type URL (4), the nonce (5), then each
    /// removed name (6). `system_version_info` (1) is empty and so not written.
    fn items(&self) -> usize {
        self.diff.upserts.len() + 2 + self.diff.removed.len()
    }

    fn item_len(&self, i: usize) -> usize {
        let upserts = self.diff.upserts.len();
        if let Some((name, v)) = self.diff.upserts.get(i) {
            return delimited_len(RESPONSE_RESOURCES, self.resource_len(name, v));
        }
        match i - upserts {
            0 => string_len(RESPONSE_TYPE_URL, &self.type_url),
            1 => string_len(RESPONSE_NONCE, &self.nonce),
            r => string::encoded_len(RESPONSE_REMOVED, &self.diff.removed[r - 2]),
        }
    }

    fn write_item(&self, i: usize, buf: &mut Vec<u8>) {
        let upserts = self.diff.upserts.len();
        if let Some((name, v)) = self.diff.upserts.get(i) {
            encode_key(RESPONSE_RESOURCES, WireType::LengthDelimited, buf);
            encode_varint(self.resource_len(name, v) as u64, buf);
            put_string(RESOURCE_VERSION, &v.version, buf);
            encode_key(RESOURCE_RESOURCE, WireType::LengthDelimited, buf);
            encode_varint(self.any_len(v) as u64, buf);
            put_string(ANY_TYPE_URL, &self.type_url, buf);
            if !v.body.is_empty() {
                prost::encoding::bytes::encode(ANY_VALUE, &*v.body, buf);
            }
            put_string(RESOURCE_NAME, name, buf);
            return;
        }
        match i - upserts {
            0 => put_string(RESPONSE_TYPE_URL, &self.type_url, buf),
            1 => put_string(RESPONSE_NONCE, &self.nonce, buf),
            // Repeated: written even when empty.
            r => string::encode(RESPONSE_REMOVED, &self.diff.removed[r - 2], buf),
        }
    }

    /// A `Resource`'s length: version, the `Any` (always present), name.
    fn resource_len(&self, name: &String, v: &Versioned) -> usize {
        string_len(RESOURCE_VERSION, &v.version)
            + delimited_len(RESOURCE_RESOURCE, self.any_len(v))
            + string_len(RESOURCE_NAME, name)
    }

    fn any_len(&self, v: &Versioned) -> usize {
        let value = if v.body.is_empty() {
            0
        } else {
            prost::encoding::bytes::encoded_len(ANY_VALUE, &*v.body)
        };
        string_len(ANY_TYPE_URL, &self.type_url) + value
    }
}

/// gRPC's header for an uncompressed message of `len` bytes: no compression flag, then the
/// length as a big-endian `u32`, which a message over 4 GiB does not fit.
fn header(len: usize) -> Result<[u8; HEADER], TooLarge> {
    ferry_xds::client::framing::header(len).ok_or(TooLarge {
        type_url: String::new(),
        len,
        max: u32::MAX,
    })
}

/// A length-delimited field of `len` bytes.
fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A singular string field's length: nothing when empty (proto3's default), as prost writes it.
fn string_len(tag: u32, s: &String) -> usize {
    if s.is_empty() {
        0
    } else {
        string::encoded_len(tag, s)
    }
}

fn put_string(tag: u32, s: &String, buf: &mut Vec<u8>) {
    if !s.is_empty() {
        string::encode(tag, s, buf);
    }
}

#[cfg(test)]
mod tests {
    use ferry_api::discovery::{DeltaDiscoveryResponse, Resource};
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;

    /// What tonic and prost send for the same response.
    fn prost_framed(type_url: &str, nonce: &str, d: &Diff) -> Vec<u8> {
        let message = DeltaDiscoveryResponse {
            system_version_info: String::new(),
            resources: d
                .upserts
                .iter()
                .map(|(name, v)| Resource {
                    version: v.version.clone(),
                    resource: Some(prost_types::Any {
                        type_url: type_url.to_string(),
                        value: (*v.body).clone(),
                    }),
                    name: name.clone(),
                    aliases: vec![],
                })
                .collect(),
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            removed_resources: d.removed.clone(),
        }
        .encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        framed
    }

    fn diff() -> impl Strategy<Value = Diff> {
        let upsert = (
            "[a-z/]{0,12}",
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(n, body)| (n, Versioned::new(body)));
        (
            proptest::collection::vec(upsert, 0..20),
            proptest::collection::vec("[a-z]{0,8}", 0..6),
        )
            .prop_map(|(upserts, removed)| Diff { upserts, removed })
    }

    /// A message over 4 GiB has no gRPC header: it is refused with its length, never framed
    /// with a wrong one (a header of `u32::MAX` would make the node read garbage as the next
    /// message).
    #[test]
    fn a_message_over_4_gib_is_refused() {
        assert_eq!(header(0), Ok([0, 0, 0, 0, 0]));
        assert_eq!(header(u32::MAX as usize), Ok([0, 0xff, 0xff, 0xff, 0xff]));
        let over = u32::MAX as usize + 1;
        let e = header(over).expect_err("over 4 GiB");
        assert_eq!(e.len, over);
        assert!(
            e.to_string().contains(&format!("{over} bytes")),
            "the error names the length: {e}"
        );
    }

    proptest! {
        /// The chunks put together are prost's framed encoding of the same response, and no
        /// chunk is over the bound unless it is one field that alone is.
        #[test]
        fn chunks_are_the_framed_prost_encoding(
            d in diff(),
            type_url in "[a-z./]{0,30}",
            nonce in "[0-9]{0,3}",
            at_most in 1usize..800,
        ) {
            let expected = prost_framed(&type_url, &nonce, &d);
            let mut out = Outgoing::new(&type_url, nonce, Arc::new(d)).expect("small");
            let mut all = Vec::new();
            let mut chunks = 0;
            while let Some(chunk) = out.next_chunk(at_most) {
                chunks += 1;
                prop_assert!(chunks <= expected.len() + 1, "it never ends");
                if chunk.len() > at_most {
                    // The header alone, or one field alone (after the header if it is the first
                    // chunk).
                    let header = if all.is_empty() { HEADER } else { 0 };
                    let field = chunk.len() - header;
                    prop_assert!(
                        (header > 0 && field == 0)
                            || (0..out.items()).any(|i| out.item_len(i) == field)
                    );
                }
                all.extend_from_slice(&chunk);
            }
            prop_assert!(out.is_done());
            prop_assert_eq!(all, expected);
        }
    }
}
