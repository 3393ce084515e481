//! HTTP routes a waypoint applies to a service's requests: which requests (path, headers), to
//! which backends (other services, or subsets of one, by weight), within what time, with how
//! many retries. A Ferry extension (Istio carries routes outside WDS).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ServiceKey, StringMatch};

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
    /// Header name (lower case) and how its value must look.
    pub headers: Vec<(String, StringMatch)>,
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
    /// At least one backend with a weight above zero.
    pub backends: Vec<RouteBackend>,
    /// Whole-request deadline (until the response head arrives), in milliseconds; 0: none.
    pub timeout_ms: u32,
    /// How many more times an idempotent request without a body is tried, on another
    /// endpoint where there is one, when it failed before any response.
    pub retries: u32,
}
