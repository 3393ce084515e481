//! HTTP routes a waypoint applies to a service's requests: which requests (path, method,
//! headers, query parameters), to which backends (other services, or subsets of one, by
//! weight), within what time, with how many retries, and which headers of the request sent on
//! and of the response returned it edits. A Ferry extension (Istio carries routes outside WDS).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{RequestRedirect, ServiceKey, StringMatch};

/// How a route matches a request path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    Exact(String),
    /// Segment-wise: `/v2` matches `/v2` and `/v2/x`, not `/v20`.
    Prefix(String),
}

impl PathMatch {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(p) => path == p,
            Self::Prefix(p) => {
                let p = p.trim_end_matches('/');
                p.is_empty()
                    || (path.starts_with(p)
                        && matches!(path.as_bytes().get(p.len()), None | Some(b'/' | b'?')))
            }
        }
    }
}

/// One set of conditions; a request matches when every condition holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct RouteMatch {
    pub path: Option<PathMatch>,
    /// The request method, exactly (case-sensitive, as HTTP methods are): `GET`.
    pub method: Option<String>,
    /// Header name (lower case) and how its value must look.
    pub headers: Vec<(String, StringMatch)>,
    /// Query parameter name (exact, case-sensitive) and the value it must have. Only the
    /// request's query is percent-decoded (`+` as a space); this name and value are compared as
    /// written. A parameter given several times is judged by its first value, and only the
    /// query's first [`crate::route::http::QUERY_PARAMETERS_READ`] parameters are read.
    pub query: Vec<(String, String)>,
}

/// Where a share of a route's requests goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteBackend {
    pub service: ServiceKey,
    /// `None`: the port the request arrived on.
    pub port: Option<u16>,
    /// Only endpoints whose labels include all of these (empty: every endpoint).
    pub subset: BTreeMap<String, String>,
    pub weight: u32,
}

/// One HTTP route of a service. Routes are tried in order; the first that matches decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HttpRoute {
    pub name: String,
    /// Any of these (empty: every request).
    pub matches: Vec<RouteMatch>,
    /// At least one backend with a weight above zero, or none when `redirect` is set.
    pub backends: Vec<RouteBackend>,
    /// Whole-request deadline (until the response head arrives), in milliseconds; 0: none.
    pub timeout_ms: u32,
    /// How many more times an idempotent request without a body is tried, on another
    /// endpoint where there is one, when it failed before any response.
    pub retries: u32,
    /// Edits of the request sent on to the backend (after it was authorized and routed).
    /// Shared: a routed request holds its route's edits without copying them.
    pub request_headers: Arc<HeaderModifier>,
    /// Edits of the backend's response returned to the client (not of a redirect).
    pub response_headers: Arc<HeaderModifier>,
    /// The Gateway API's `RequestRedirect`: the waypoint answers the route's authorized
    /// requests itself with this redirect; the route then has no backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Arc<RequestRedirect>>,
}

/// The Gateway API's `HTTPHeaderFilter`: header edits, applied in one order: every `remove`,
/// then every `set` (replaces all values of that name), then every `add` (one more value).
/// Names are lower case, at most once in each list; [`HeaderModifier::check`] tells the ones
/// no route may edit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct HeaderModifier {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

/// The methods a route may match (the Gateway API's `HTTPMethod`).
pub const HTTP_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Headers a route may not edit: the message's own framing and connection handling, which the
/// waypoint and hyper own (`host` is judged and sent on as one value; the hop-by-hop ones,
/// `trailer` among them, are stripped before the edits, which would put them back).
pub const UNEDITABLE_HEADERS: [&str; 9] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "content-length",
];

/// Why a header edit is refused: its place (`set[0].name`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct HeaderEditError {
    pub field: String,
    pub problem: String,
}

impl HeaderModifier {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    /// Checked, with names in lower case: every name a valid HTTP field name that is no
    /// pseudo-header and none of [`UNEDITABLE_HEADERS`], at most once in each list; every value
    /// a valid field value: visible ASCII, spaces and tabs only (no CR, LF, NUL, other control
    /// characters or bytes beyond ASCII, which HTTP allows only as opaque data).
    pub fn check(mut self) -> Result<Self, HeaderEditError> {
        let err = |field: String, problem: String| HeaderEditError { field, problem };
        for (list, entries) in [("set", &mut self.set), ("add", &mut self.add)] {
            let mut seen = std::collections::BTreeSet::new();
            for (i, (name, value)) in entries.iter_mut().enumerate() {
                *name = checked_name(name).map_err(|p| err(format!("{list}[{i}].name"), p))?;
                if !seen.insert(name.clone()) {
                    return Err(err(
                        format!("{list}[{i}].name"),
                        format!("expected each name once, found {name:?} again"),
                    ));
                }
                if !value
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
                {
                    return Err(err(
                        format!("{list}[{i}].value"),
                        format!(
                            "expected a valid header value (visible ASCII, spaces, tabs), found {value:?}"
                        ),
                    ));
                }
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, name) in self.remove.iter_mut().enumerate() {
            *name = checked_name(name).map_err(|p| err(format!("remove[{i}]"), p))?;
            if !seen.insert(name.clone()) {
                return Err(err(
                    format!("remove[{i}]"),
                    format!("expected each name once, found {name:?} again"),
                ));
            }
        }
        Ok(self)
    }
}

/// `name` in lower case, if a route may edit it.
fn checked_name(name: &str) -> Result<String, String> {
    if name.starts_with(':') {
        return Err(format!(
            "expected a header name, found the pseudo-header {name:?}"
        ));
    }
    let Ok(parsed) = http::HeaderName::from_bytes(name.as_bytes()) else {
        return Err(format!("expected a valid header name, found {name:?}"));
    };
    let lower = parsed.as_str();
    if UNEDITABLE_HEADERS.contains(&lower) {
        return Err(format!(
            "expected a header a route may edit, found {lower:?} (one of {})",
            UNEDITABLE_HEADERS.join(", ")
        ));
    }
    Ok(lower.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, value: &str) -> HeaderModifier {
        HeaderModifier {
            set: vec![(name.into(), value.into())],
            ..HeaderModifier::default()
        }
    }

    #[test]
    fn header_edits_are_checked_and_names_lowered() {
        let ok = HeaderModifier {
            set: vec![("X-Env".into(), "prod".into())],
            add: vec![("x-trace".into(), "a b\tc".into())],
            remove: vec!["X-Debug".into()],
        }
        .check()
        .unwrap();
        assert_eq!(ok.set, [("x-env".to_string(), "prod".to_string())]);
        assert_eq!(ok.remove, ["x-debug"]);
        let problem = |m: HeaderModifier| m.check().unwrap_err().to_string();
        for name in UNEDITABLE_HEADERS
            .iter()
            .chain(&["Host", "TE", "Trailer", "Content-Length"])
        {
            let e = problem(set(name, "x"));
            assert!(
                e.starts_with("set[0].name: expected a header a route may edit"),
                "{e}"
            );
        }
        assert!(problem(set(":path", "/")).contains("pseudo-header"));
        assert!(problem(set("bad name", "x")).contains("valid header name"));
        assert!(problem(set("", "x")).contains("valid header name"));
        let e = problem(set("x-a", "one\r\ntwo: 2"));
        assert!(
            e.starts_with("set[0].value: expected a valid header value"),
            "{e}"
        );
        assert!(problem(set("x-a", "nul\0")).contains("valid header value"));
        assert!(problem(set("x-a", "caf\u{e9}")).contains("valid header value"));
        assert!(problem(set("x-a", "del\u{7f}")).contains("valid header value"));
        let e = problem(HeaderModifier {
            add: vec![("x-a".into(), "1".into()), ("X-A".into(), "2".into())],
            ..HeaderModifier::default()
        });
        assert!(e.starts_with("add[1].name: expected each name once"), "{e}");
        let e = problem(HeaderModifier {
            remove: vec!["x-a".into(), "connection".into()],
            ..HeaderModifier::default()
        });
        assert!(
            e.starts_with("remove[1]: expected a header a route may edit"),
            "{e}"
        );
    }
}
