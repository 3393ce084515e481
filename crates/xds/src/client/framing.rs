//! gRPC messages read out of a response body's data frames, each into a buffer of its own.
//!
//! tonic's `Streaming` decoder reads every message into one buffer per stream, reserving room
//! for the largest message seen, and keeps that room for the stream's life: a node kept its
//! first push's size (about 31 MiB at 100,000 workloads) for as long as it stayed connected.
//! Here a message that lies within one data frame is handed out as a slice of that frame (no
//! copy), and one split across frames is gathered into a buffer of exactly its length, handed
//! out whole and not kept: between messages the reader holds nothing but the five bytes of a
//! header ([`Deframer::retained`]).
//!
//! Compression is never negotiated, so a message flagged compressed is refused; so is one
//! longer than the limit the reader was given, and a body that ends inside a message.

use bytes::{Buf, Bytes};

/// gRPC's message header: a compression flag and the length, big-endian.
pub const HEADER: usize = 5;

/// Why a response body cannot be read as gRPC messages. The texts are tonic's for the same
/// faults, so a session reports them as it did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(
        "protocol error: received message with compressed-flag but no grpc-encoding was specified"
    )]
    Compressed,
    #[error(
        "protocol error: received message with invalid compression flag: {0} (valid flags are 0 and 1)"
    )]
    InvalidFlag(u8),
    #[error(
        "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
    )]
    TooLarge { len: usize, limit: usize },
    #[error("Unexpected EOF decoding stream.")]
    Truncated,
}

impl FrameError {
    /// The gRPC code tonic gives the same fault.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::TooLarge { .. } => tonic::Code::OutOfRange,
            _ => tonic::Code::Internal,
        }
    }
}

/// Reads gRPC messages out of data frames as they come.
#[derive(Debug)]
pub struct Deframer {
    limit: usize,
    header: [u8; HEADER],
    /// Header bytes read so far (all of them while a message body is being gathered).
    header_len: usize,
    /// The body of a message split across frames, allocated to its exact length.
    partial: Vec<u8>,
}

impl Deframer {
    /// A reader refusing messages over `limit` bytes (at most gRPC's `u32` lengths anyway).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            header: [0; HEADER],
            header_len: 0,
            partial: Vec::new(),
        }
    }

    /// The next whole message, taking what it needs from the front of `data`; `None` once
    /// `data` is used up without completing one (what was read of it is kept for the next
    /// frame). After an error the stream cannot be read further.
    pub fn next_message(&mut self, data: &mut Bytes) -> Result<Option<Bytes>, FrameError> {
        while self.header_len < HEADER {
            if data.is_empty() {
                return Ok(None);
            }
            let n = (HEADER - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            data.advance(n);
            self.header_len += n;
            if self.header_len == HEADER {
                self.check_header()?;
            }
        }
        let len = self.len();
        if self.partial.is_empty() {
            if data.len() >= len {
                // The whole message in this frame: a slice of it, no copy.
                self.header_len = 0;
                return Ok(Some(data.split_to(len)));
            }
            if data.is_empty() {
                return Ok(None);
            }
            // Allocated once the body begins to come, not on the header's word alone.
            self.partial = Vec::with_capacity(len);
        }
        let n = (len - self.partial.len()).min(data.len());
        self.partial.extend_from_slice(&data[..n]);
        data.advance(n);
        if self.partial.len() < len {
            return Ok(None);
        }
        self.header_len = 0;
        Ok(Some(Bytes::from(std::mem::take(&mut self.partial))))
    }

    /// Checks that the body ended between messages.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.header_len == 0 {
            Ok(())
        } else {
            Err(FrameError::Truncated)
        }
    }

    /// Bytes of buffer held for a message not yet complete: 0 between messages.
    pub fn retained(&self) -> usize {
        self.partial.capacity()
    }

    fn len(&self) -> usize {
        let [_, a, b, c, d] = self.header;
        u32::from_be_bytes([a, b, c, d]) as usize
    }

    fn check_header(&self) -> Result<(), FrameError> {
        match self.header[0] {
            0 => {}
            1 => return Err(FrameError::Compressed),
            f => return Err(FrameError::InvalidFlag(f)),
        }
        let len = self.len();
        if len > self.limit {
            return Err(FrameError::TooLarge {
                len,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// `message` framed as gRPC sends it uncompressed: flag 0, its length as a big-endian `u32`,
/// then prost's encoding, in one buffer of exactly that size. `None` for a message over 4 GiB,
/// which gRPC cannot frame.
pub fn frame(message: &impl prost::Message) -> Option<Bytes> {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(HEADER + len);
    out.extend_from_slice(&header(len)?);
    message.encode_raw(&mut out);
    Some(Bytes::from(out))
}

/// The header of an uncompressed gRPC message of `len` bytes (the server's responses use it
/// too); `None` over 4 GiB, which gRPC cannot frame.
pub fn header(len: usize) -> Option<[u8; HEADER]> {
    let mut h = [0; HEADER];
    h[1..].copy_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
    Some(h)
}

#[cfg(test)]
#[path = "framing_tests.rs"]
mod tests;
