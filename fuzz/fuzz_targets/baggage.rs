//! The `baggage` header of a CONNECT, typed (`ferry_hbone::headers::Baggage`): any bytes parse,
//! and what parses encodes back to itself, through the header value, through its pairs and
//! through a `HeaderMap` (the invariant the crate's property tests check).
#![no_main]

use ferry_hbone::headers::Baggage;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let b = Baggage::parse(&text);
    assert_eq!(Baggage::parse(&b.encode()), b, "parse(encode(b)) == b");
    assert_eq!(
        b.to_pairs().into_iter().collect::<Baggage>(),
        b,
        "pairs round trip"
    );
    let mut map = HeaderMap::new();
    b.write(&mut map);
    assert_eq!(Baggage::read(&map), b, "header round trip");
    assert_eq!(map.contains_key("baggage"), !b.is_empty());
});
