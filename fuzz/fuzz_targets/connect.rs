//! A CONNECT request as the HBONE server and every hop read it: the method and `:authority`
//! (`ferry_hbone::headers::parse_request`, the target) and the headers a peer sends
//! (`ConnectHeaders::read`: baggage, forwarded, traceparent, x-forwarded-network).
//!
//! The input is a request head in text, as the seeds show:
//!
//! ```text
//! CONNECT 10.0.1.5:8080
//! forwarded: for="10.0.0.1:3456";host=app.ns.svc.cluster.local
//! traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//! ```
//!
//! The first line is the method and the authority (absent if there is no space); each further
//! line a `name: value` header (header values may hold any byte but CR, LF and NUL). A target
//! that parses prints as an authority that parses back to it.
#![no_main]

use ferry_hbone::headers::{ConnectHeaders, parse_authority, parse_request};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    let (method, authority) = match first.iter().position(|&b| b == b' ') {
        Some(i) => (&first[..i], Some(&first[i + 1..])),
        None => (first, None),
    };
    let Ok(method) = Method::from_bytes(method) else {
        return;
    };
    let authority = match authority.map(std::str::from_utf8) {
        Some(Ok(a)) => Some(a),
        Some(Err(_)) => return,
        None => None,
    };
    if let Ok(target) = parse_request(&method, authority) {
        let printed = target.to_string();
        assert_eq!(parse_authority(&printed).as_ref(), Ok(&target), "{printed}");
    }

    let mut map = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = line[colon + 1..]
            .strip_prefix(b" ")
            .unwrap_or(&line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    let read = ConnectHeaders::read(&map);
    let _ = read.typed_baggage();
    // What was read is what a client writes; reading that again changes nothing more.
    let mut again = HeaderMap::new();
    read.write(&mut again);
    let once = ConnectHeaders::read(&again);
    let mut twice_map = HeaderMap::new();
    once.write(&mut twice_map);
    assert_eq!(
        ConnectHeaders::read(&twice_map),
        once,
        "read . write is idempotent"
    );
});
