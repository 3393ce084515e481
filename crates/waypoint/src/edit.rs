//! A route's header edits (the Gateway API's `RequestHeaderModifier` and
//! `ResponseHeaderModifier`), applied to the request the waypoint sends on and to the response
//! it returns. The request is edited only after it was routed and authorized: the policy judges
//! what the client sent, never what a route made of it.

use std::sync::{Arc, LazyLock};

use ferry_core::model::{HeaderModifier, UNEDITABLE_HEADERS};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The edits of the route a request took (none without a route), shared with the route: a
/// request clones two `Arc`s, never the edits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderEdits {
    /// Of the request sent on to the backend.
    pub request: Arc<HeaderModifier>,
    /// Of the backend's response returned to the client.
    pub response: Arc<HeaderModifier>,
}

impl Default for HeaderEdits {
    /// No edits, shared by every request without a route: no allocation.
    fn default() -> Self {
        static NONE: LazyLock<Arc<HeaderModifier>> = LazyLock::new(Arc::default);
        Self {
            request: NONE.clone(),
            response: NONE.clone(),
        }
    }
}

/// Applies `m` to `headers`: every `remove`, then every `set` (all values of the name replaced
/// by one), then every `add` (one more value). The decoders checked every name and value; one
/// that is still not a valid header, a pseudo-header or one of [`UNEDITABLE_HEADERS`] (a model
/// built without [`HeaderModifier::check`]) is skipped, never a panic.
pub(crate) fn apply(headers: &mut HeaderMap, m: &HeaderModifier) {
    for name in &m.remove {
        if let Some(n) = editable(name) {
            headers.remove(n);
        }
    }
    for (name, value) in &m.set {
        if let Some((n, v)) = parsed(name, value) {
            headers.insert(n, v);
        }
    }
    for (name, value) in &m.add {
        if let Some((n, v)) = parsed(name, value) {
            headers.append(n, v);
        }
    }
}

/// `name` as a header name, if a route may edit it.
fn editable(name: &str) -> Option<HeaderName> {
    if name.starts_with(':') {
        tracing::debug!(header.name = %name, "a route's header edit names a pseudo-header; skipped");
        return None;
    }
    let Ok(n) = HeaderName::from_bytes(name.as_bytes()) else {
        tracing::debug!(header.name = %name, "a route's header edit is not a valid header name; skipped");
        return None;
    };
    if UNEDITABLE_HEADERS.contains(&n.as_str()) {
        tracing::debug!(header.name = %name, "a route's header edit names a header no route may edit; skipped");
        return None;
    }
    Some(n)
}

fn parsed(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    let n = editable(name)?;
    let Ok(v) = HeaderValue::from_str(value) else {
        tracing::debug!(header.name = %name, "a route's header edit is not a valid header value; skipped");
        return None;
    };
    Some((n, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn remove_then_set_then_add() {
        let mut h = HeaderMap::new();
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        h.append("x-b", HeaderValue::from_static("old"));
        h.append("x-c", HeaderValue::from_static("keep"));
        let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
        apply(
            &mut h,
            &HeaderModifier {
                // Removed first, so a `set` and an `add` of the same name still land.
                remove: vec!["x-a".into(), "x-b".into(), "x-none".into()],
                set: vec![pair("x-a", "set"), pair("x-c", "new")],
                add: vec![pair("x-a", "added"), pair("x-b", "added")],
            },
        );
        assert_eq!(values(&h, "x-a"), ["set", "added"]);
        assert_eq!(values(&h, "x-b"), ["added"]);
        assert_eq!(values(&h, "x-c"), ["new"]);
        assert!(h.get("x-none").is_none());
        // Invalid edits (a model built by hand) are skipped.
        apply(
            &mut h,
            &HeaderModifier {
                set: vec![pair("bad name", "x"), pair("x-d", "a\nb")],
                remove: vec!["bad name".into()],
                ..HeaderModifier::default()
            },
        );
        assert_eq!(h.len(), 4);
    }

    #[test]
    fn pseudo_headers_and_uneditable_names_are_skipped_unchecked() {
        let mut h = HeaderMap::new();
        h.append("connection", HeaderValue::from_static("keep-alive"));
        h.append("host", HeaderValue::from_static("audit"));
        h.append("x-a", HeaderValue::from_static("1"));
        let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
        // As no decoder would let through: built without `HeaderModifier::check`.
        apply(
            &mut h,
            &HeaderModifier {
                remove: vec!["connection".into(), "Host".into(), ":path".into()],
                set: vec![
                    pair("Host", "evil.example"),
                    pair("content-length", "0"),
                    pair(":authority", "evil.example"),
                ],
                add: vec![
                    pair("transfer-encoding", "chunked"),
                    pair("trailer", "x-sum"),
                    pair("x-a", "2"),
                ],
            },
        );
        assert_eq!(values(&h, "connection"), ["keep-alive"]);
        assert_eq!(values(&h, "host"), ["audit"]);
        assert_eq!(values(&h, "x-a"), ["1", "2"]);
        for name in ["content-length", "transfer-encoding", "trailer"] {
            assert!(h.get(name).is_none(), "{name}");
        }
        assert_eq!(h.len(), 4);
    }
}
