use ferry_api::discovery::{DeltaDiscoveryResponse, Resource};
use proptest::prelude::*;
use prost::Message as _;

use super::*;

fn framed(messages: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.push(0);
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// Feeds `chunks` one after the other; returns the messages read, checking that nothing is held
/// between messages, and the result of `finish`.
fn read(limit: usize, chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut d = Deframer::new(limit);
    let mut out = Vec::new();
    for chunk in chunks {
        let mut data = Bytes::copy_from_slice(chunk);
        while let Some(m) = d.next_message(&mut data)? {
            assert_eq!(d.retained(), 0, "a buffer kept after a message");
            out.push(m.to_vec());
        }
        assert!(data.is_empty(), "a chunk not used up");
    }
    d.finish()?;
    Ok(out)
}

#[test]
fn a_message_split_at_every_byte_is_read_whole() {
    let big = vec![7u8; 300];
    let messages: [&[u8]; 3] = [b"first", &big, b""];
    let stream = framed(&messages);
    let expected: Vec<Vec<u8>> = messages.iter().map(|m| m.to_vec()).collect();
    for cut in 0..=stream.len() {
        let (a, b) = stream.split_at(cut);
        assert_eq!(read(1 << 20, &[a, b]), Ok(expected.clone()), "cut at {cut}");
    }
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(read(1 << 20, &bytes), Ok(expected));
}

#[test]
fn several_messages_in_one_frame() {
    let stream = framed(&[b"a", b"bc", b"", b"def"]);
    let got = read(16, &[&stream]).expect("whole");
    assert_eq!(
        got,
        vec![b"a".to_vec(), b"bc".to_vec(), vec![], b"def".to_vec()]
    );
}

#[test]
fn a_stream_ending_inside_a_message_is_an_error() {
    let stream = framed(&[b"hello", b"world"]);
    let boundaries = [0, HEADER + 5, stream.len()];
    for cut in 0..=stream.len() {
        let r = read(16, &[&stream[..cut]]);
        if boundaries.contains(&cut) {
            assert!(r.is_ok(), "cut at {cut}: {r:?}");
        } else {
            assert_eq!(r, Err(FrameError::Truncated), "cut at {cut}");
        }
    }
}

#[test]
fn a_compressed_message_is_refused() {
    let mut stream = framed(&[b"zz"]);
    stream[0] = 1;
    let e = read(16, &[&stream]).expect_err("compressed");
    assert_eq!(e, FrameError::Compressed);
    assert_eq!(e.code(), tonic::Code::Internal);
    assert!(e.to_string().contains("compressed-flag"), "{e}");
    stream[0] = 2;
    assert_eq!(read(16, &[&stream]), Err(FrameError::InvalidFlag(2)));
}

#[test]
fn a_message_over_the_limit_is_refused_before_its_body() {
    let stream = framed(&[&[1u8; 17]]);
    // The header alone is enough: nothing is allocated for the body.
    let e = read(16, &[&stream[..HEADER]]).expect_err("too large");
    assert_eq!(e, FrameError::TooLarge { len: 17, limit: 16 });
    assert_eq!(e.code(), tonic::Code::OutOfRange);
    assert!(
        e.to_string()
            .contains("found 17 bytes, the limit is: 16 bytes"),
        "{e}"
    );
    assert_eq!(read(17, &[&stream]), Ok(vec![vec![1u8; 17]]));
    // The largest length a header can give, refused at any limit below it.
    let huge = [0, 0xff, 0xff, 0xff, 0xff];
    let e = read(200 << 20, &[&huge]).expect_err("4 GiB");
    assert_eq!(
        e,
        FrameError::TooLarge {
            len: u32::MAX as usize,
            limit: 200 << 20
        }
    );
}

/// A large message split across frames is gathered into a buffer of exactly its length, which
/// the reader gives away with the message: after a large push it holds nothing.
#[test]
fn a_large_message_leaves_no_buffer_behind() {
    let body = vec![3u8; 1 << 20];
    let stream = framed(&[&body, b"small"]);
    let mut d = Deframer::new(2 << 20);
    let mut chunks = stream.chunks(16 << 10).map(Bytes::copy_from_slice);
    let mut data = chunks.next().expect("a chunk");
    assert_eq!(d.next_message(&mut data), Ok(None));
    assert_eq!(d.retained(), body.len(), "exactly the message's length");
    let mut got = Vec::new();
    loop {
        if let Some(m) = d.next_message(&mut data).expect("valid") {
            assert_eq!(d.retained(), 0);
            got.push(m);
            continue;
        }
        match chunks.next() {
            Some(c) => data = c,
            None => break,
        }
    }
    d.finish().expect("ends between messages");
    assert_eq!(got.len(), 2);
    assert_eq!(&got[0][..], &body[..]);
    assert_eq!(&got[1][..], b"small");
    assert_eq!(d.retained(), 0);
}

#[test]
fn frame_is_prost_encoding_behind_grpc_header() {
    let r = DeltaDiscoveryResponse {
        type_url: "t".into(),
        nonce: "1".into(),
        resources: vec![Resource {
            name: "n".into(),
            version: "v".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let bytes = frame(&r).expect("small");
    let encoded = r.encode_to_vec();
    assert_eq!(&bytes[..], &framed(&[&encoded])[..]);
    let got = read(1 << 10, &[&bytes]).expect("read back");
    assert_eq!(DeltaDiscoveryResponse::decode(&got[0][..]), Ok(r));
}

proptest! {
    /// However the bytes are cut into frames, the same messages come out, and nothing is held
    /// between them.
    #[test]
    fn any_chunking_gives_the_same_messages(
        messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
        cuts in proptest::collection::vec(0usize..600, 0..12),
    ) {
        let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
        let stream = framed(&refs);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let chunks: Vec<&[u8]> = cuts.windows(2).map(|w| &stream[w[0]..w[1]]).collect();
        prop_assert_eq!(read(64, &chunks), Ok(messages));
    }

    /// Arbitrary bytes never panic: messages, or one of the errors.
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = read(64, &[&data]);
    }
}
