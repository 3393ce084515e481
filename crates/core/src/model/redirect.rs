//! The Gateway API's `RequestRedirect` filter: a route that answers its requests itself with a
//! redirect (301 or 302) instead of sending them to a backend, its `Location` built from the
//! request and the filter's fields.

use serde::Serialize;

use super::{PathMatch, RouteMatch};

/// A redirect's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedirectScheme {
    Http,
    Https,
}

impl RedirectScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    /// `http` or `https`, exactly (the Gateway API's enum is case-sensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "http" => Some(Self::Http),
            "https" => Some(Self::Https),
            _ => None,
        }
    }

    /// The scheme's well-known port, which a `Location` leaves out.
    pub fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// How a redirect rewrites the request's path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedirectPath {
    /// `ReplaceFullPath`: the whole path becomes this.
    Full(String),
    /// `ReplacePrefixMatch`: the part of the path the route's `PathPrefix` match matched,
    /// segment-wise, becomes this; the rest is kept.
    PrefixMatch(String),
}

/// The redirect statuses the Gateway API allows.
pub const REDIRECT_STATUSES: [u16; 2] = [301, 302];

/// The Gateway API's `HTTPRequestRedirectFilter`. Every field left `None` keeps the request's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RequestRedirect {
    /// `None`: the request's scheme (`http` at a waypoint).
    pub scheme: Option<RedirectScheme>,
    /// `None`: the request's `Host`, without its port.
    pub hostname: Option<String>,
    /// `None`: the scheme's well-known port when `scheme` is set, else the port the request
    /// arrived on. A scheme's well-known port is left out of the `Location`.
    pub port: Option<u16>,
    /// `None`: the request's path.
    pub path: Option<RedirectPath>,
    /// 301 or 302.
    pub status: u16,
}

impl Default for RequestRedirect {
    fn default() -> Self {
        Self {
            scheme: None,
            hostname: None,
            port: None,
            path: None,
            status: 302,
        }
    }
}

/// Why a redirect is refused: its field (`hostname`, `path`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct RedirectError {
    pub field: String,
    pub problem: String,
}

fn err(field: &str, problem: String) -> RedirectError {
    RedirectError {
        field: field.into(),
        problem,
    }
}

/// What a redirect reads of a request.
#[derive(Clone, Copy, Debug)]
pub struct RedirectRequest<'a> {
    /// `http` or `https`: the scheme the request came with.
    pub scheme: RedirectScheme,
    /// The request's `Host` (or `:authority`), perhaps with a port.
    pub host: &'a str,
    /// The port the request arrived on (the listener's, or the service's at a waypoint).
    pub port: u16,
    pub path: &'a str,
    /// Without the `?`; empty: none.
    pub query: &'a str,
}

impl RequestRedirect {
    /// Checked: a status of 301 or 302, a hostname that is a valid DNS name (lower-cased), a
    /// port above 0, a path that starts with `/` and is visible ASCII without `?` or `#`.
    pub fn check(mut self) -> Result<Self, RedirectError> {
        if !REDIRECT_STATUSES.contains(&self.status) {
            return Err(err(
                "status",
                format!("expected 301 or 302, found {}", self.status),
            ));
        }
        if let Some(h) = &mut self.hostname {
            if !is_dns_name(h) {
                return Err(err(
                    "hostname",
                    format!("expected a DNS name (letters, digits, '-', '.'), found {h:?}"),
                ));
            }
            h.make_ascii_lowercase();
        }
        if self.port == Some(0) {
            return Err(err(
                "port",
                "expected a port from 1 to 65535, found 0".into(),
            ));
        }
        if let Some(p) = &self.path {
            let (field, path) = match p {
                RedirectPath::Full(s) => ("path.replace_full_path", s),
                RedirectPath::PrefixMatch(s) => ("path.replace_prefix_match", s),
            };
            if !path.starts_with('/')
                || path.starts_with("//")
                || !path
                    .bytes()
                    .all(|b| (b'!'..=b'~').contains(&b) && b != b'?' && b != b'#')
            {
                return Err(err(
                    field,
                    format!(
                        "expected a path starting with one '/', visible ASCII without '?' or '#', found {path:?}"
                    ),
                ));
            }
        }
        Ok(self)
    }

    /// Refused when the path replaces a prefix match and some match of the route is not a
    /// `PathPrefix` one (a match without a path counts as the prefix `/`).
    pub fn check_matches(&self, matches: &[RouteMatch]) -> Result<(), RedirectError> {
        if let Some(RedirectPath::PrefixMatch(_)) = &self.path
            && let Some((i, _)) = matches
                .iter()
                .enumerate()
                .find(|(_, m)| matches!(m.path, Some(PathMatch::Exact(_))))
        {
            return Err(err(
                "path.replace_prefix_match",
                format!("expected only path prefix matches, found an exact path in matches[{i}]"),
            ));
        }
        Ok(())
    }

    /// The `Location` for a request the route matched with `matched` (the match that held;
    /// `None`: the route has none). `None` when the request cannot make one: a path that is
    /// not absolute (`OPTIONS *`), or, without a configured hostname, a `Host` that is not a
    /// DNS name or an IP address literal (`good@evil.example` would send the client elsewhere).
    pub fn location(
        &self,
        req: &RedirectRequest<'_>,
        matched: Option<&RouteMatch>,
    ) -> Option<String> {
        if !req.path.starts_with('/') {
            return None;
        }
        let scheme = self.scheme.unwrap_or(req.scheme);
        let host = match &self.hostname {
            Some(h) => h.as_str(),
            None => Some(host_without_port(req.host)).filter(|h| is_host(h))?,
        };
        let port = match (self.port, self.scheme) {
            (Some(p), _) => p,
            (None, Some(s)) => s.default_port(),
            (None, None) => req.port,
        };
        let mut out = String::with_capacity(host.len() + req.path.len() + req.query.len() + 16);
        out.push_str(scheme.as_str());
        out.push_str("://");
        out.push_str(host);
        if port != scheme.default_port() {
            out.push(':');
            out.push_str(&port.to_string());
        }
        match &self.path {
            None => out.push_str(req.path),
            Some(RedirectPath::Full(p)) => out.push_str(p),
            Some(RedirectPath::PrefixMatch(with)) => {
                let prefix = match matched.and_then(|m| m.path.as_ref()) {
                    Some(PathMatch::Prefix(p)) => p.as_str(),
                    _ => "/",
                };
                out.push_str(&replace_prefix(req.path, prefix, with));
            }
        }
        if !req.query.is_empty() {
            out.push('?');
            out.push_str(req.query);
        }
        Some(out)
    }
}

/// `path` with its segment-wise `prefix` replaced by `with`: `/foo/bar` with `/foo` → `/xyz`
/// is `/xyz/bar`; with `/` it is `/bar`; `/foo` alone becomes `/xyz` (or `/`).
pub fn replace_prefix(path: &str, prefix: &str, with: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let rest = if PathMatch::Prefix(prefix.to_string()).matches(path) {
        &path[prefix.len()..]
    } else {
        path
    };
    let mut out = with.trim_end_matches('/').to_string();
    out.push_str(rest);
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// A `Host` value without its port: `shop:8080` → `shop`, `[::1]:80` → `[::1]`.
pub fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// A host a `Location` may name: a DNS name, an IPv4 address, or an IPv6 address in brackets.
fn is_host(h: &str) -> bool {
    is_dns_name(h)
        || h.parse::<std::net::Ipv4Addr>().is_ok()
        || h.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
}

/// An RFC 1123 DNS name: dot-separated labels of letters, digits and `-` (not first or last),
/// each 1 to 63 long, 253 at most in all.
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(path: &'a str, query: &'a str) -> RedirectRequest<'a> {
        RedirectRequest {
            scheme: RedirectScheme::Http,
            host: "shop.default:8080",
            port: 8080,
            path,
            query,
        }
    }

    fn prefix(p: &str) -> RouteMatch {
        RouteMatch {
            path: Some(PathMatch::Prefix(p.into())),
            ..RouteMatch::default()
        }
    }

    #[test]
    fn defaults_keep_the_request_and_its_port() {
        let r = RequestRedirect::default();
        assert_eq!(
            r.location(&req("/a/b", "x=1&y=2"), None).unwrap(),
            "http://shop.default:8080/a/b?x=1&y=2"
        );
        let r = RequestRedirect {
            hostname: Some("other.example".into()),
            ..RequestRedirect::default()
        };
        let mut on80 = req("/", "");
        on80.port = 80;
        on80.host = "shop:80";
        assert_eq!(r.location(&on80, None).unwrap(), "http://other.example/");
    }

    #[test]
    fn a_set_scheme_defaults_to_its_well_known_port_which_is_left_out() {
        let https = RequestRedirect {
            scheme: Some(RedirectScheme::Https),
            ..RequestRedirect::default()
        };
        assert_eq!(
            https.location(&req("/p", "q=1"), None).unwrap(),
            "https://shop.default/p?q=1"
        );
        let explicit = RequestRedirect {
            port: Some(443),
            ..https.clone()
        };
        assert_eq!(
            explicit.location(&req("/", ""), None).unwrap(),
            "https://shop.default/"
        );
        let other = RequestRedirect {
            port: Some(8443),
            ..https
        };
        assert_eq!(
            other.location(&req("/", ""), None).unwrap(),
            "https://shop.default:8443/"
        );
        let http80 = RequestRedirect {
            scheme: Some(RedirectScheme::Http),
            port: Some(80),
            ..RequestRedirect::default()
        };
        assert_eq!(
            http80.location(&req("/", ""), None).unwrap(),
            "http://shop.default/"
        );
    }

    #[test]
    fn prefix_replacement_is_segment_wise_and_keeps_the_query() {
        let r = |with: &str| RequestRedirect {
            path: Some(RedirectPath::PrefixMatch(with.into())),
            ..RequestRedirect::default()
        };
        let m = prefix("/foo");
        let loc = |with: &str, path: &str| r(with).location(&req(path, "k=v"), Some(&m)).unwrap();
        assert_eq!(
            loc("/xyz", "/foo/bar"),
            "http://shop.default:8080/xyz/bar?k=v"
        );
        assert_eq!(loc("/xyz", "/foo"), "http://shop.default:8080/xyz?k=v");
        assert_eq!(
            loc("/xyz/", "/foo/bar"),
            "http://shop.default:8080/xyz/bar?k=v"
        );
        assert_eq!(loc("/", "/foo/bar"), "http://shop.default:8080/bar?k=v");
        assert_eq!(loc("/", "/foo"), "http://shop.default:8080/?k=v");
        let slash = prefix("/foo/");
        assert_eq!(
            r("/xyz")
                .location(&req("/foo/bar", ""), Some(&slash))
                .unwrap(),
            "http://shop.default:8080/xyz/bar"
        );
        assert_eq!(replace_prefix("/foobar", "/foo", "/x"), "/x/foobar");
        let full = RequestRedirect {
            path: Some(RedirectPath::Full("/new".into())),
            ..RequestRedirect::default()
        };
        assert_eq!(
            full.location(&req("/foo/bar", "a=b"), Some(&m)).unwrap(),
            "http://shop.default:8080/new?a=b"
        );
    }

    #[test]
    fn a_request_that_cannot_make_a_location_makes_none() {
        let r = RequestRedirect::default();
        for host in [
            "good@evil.example",
            "a b",
            "x/y#",
            "",
            "[::1",
            "caf\u{e9}.example",
        ] {
            let mut q = req("/", "");
            q.host = host;
            assert_eq!(r.location(&q, None), None, "{host:?}");
        }
        for host in [
            "shop.default:8080",
            "198.18.0.1:80",
            "[2001:db8::1]:80",
            "[::1]",
        ] {
            let mut q = req("/p", "");
            q.host = host;
            assert!(r.location(&q, None).is_some(), "{host:?}");
        }
        // A configured hostname stands in for the request's.
        let named = RequestRedirect {
            hostname: Some("other.example".into()),
            ..RequestRedirect::default()
        };
        let mut q = req("/p", "");
        q.host = "good@evil.example";
        assert_eq!(
            named.location(&q, None).as_deref(),
            Some("http://other.example:8080/p")
        );
        // `OPTIONS *` has no path to redirect.
        let prefix_all = RequestRedirect {
            path: Some(RedirectPath::PrefixMatch("/xyz".into())),
            ..RequestRedirect::default()
        };
        assert_eq!(prefix_all.location(&req("*", ""), None), None);
        assert_eq!(r.location(&req("*", ""), None), None);
    }

    #[test]
    fn host_ports_are_stripped() {
        assert_eq!(host_without_port("shop:8080"), "shop");
        assert_eq!(host_without_port("shop"), "shop");
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
        assert_eq!(host_without_port("[::1]"), "[::1]");
    }

    #[test]
    fn bad_fields_are_refused_naming_them() {
        let problem = |r: RequestRedirect| r.check().unwrap_err().to_string();
        let e = problem(RequestRedirect {
            status: 307,
            ..RequestRedirect::default()
        });
        assert!(e.starts_with("status: expected 301 or 302"), "{e}");
        for h in ["", "a..b", "-a", "a b", "evil\r\nx", "*.example", "a:80"] {
            let e = problem(RequestRedirect {
                hostname: Some(h.into()),
                ..RequestRedirect::default()
            });
            assert!(e.starts_with("hostname: expected a DNS name"), "{e}");
        }
        let e = problem(RequestRedirect {
            port: Some(0),
            ..RequestRedirect::default()
        });
        assert!(e.starts_with("port: "), "{e}");
        for p in ["rel", "", "//x", "/a\r\nb", "/a b", "/a?q", "/caf\u{e9}"] {
            let e = problem(RequestRedirect {
                path: Some(RedirectPath::Full(p.into())),
                ..RequestRedirect::default()
            });
            assert!(e.starts_with("path.replace_full_path: "), "{e}");
            let e = problem(RequestRedirect {
                path: Some(RedirectPath::PrefixMatch(p.into())),
                ..RequestRedirect::default()
            });
            assert!(e.starts_with("path.replace_prefix_match: "), "{e}");
        }
        let ok = RequestRedirect {
            hostname: Some("Example.COM".into()),
            status: 301,
            port: Some(8443),
            ..RequestRedirect::default()
        }
        .check()
        .unwrap();
        assert_eq!(ok.hostname.as_deref(), Some("example.com"));
        let pm = RequestRedirect {
            path: Some(RedirectPath::PrefixMatch("/x".into())),
            ..RequestRedirect::default()
        };
        assert!(
            pm.check_matches(&[prefix("/a"), RouteMatch::default()])
                .is_ok()
        );
        let exact = RouteMatch {
            path: Some(PathMatch::Exact("/a".into())),
            ..RouteMatch::default()
        };
        let e = pm
            .check_matches(&[prefix("/a"), exact])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("path.replace_prefix_match: "), "{e}");
        assert!(e.contains("matches[1]"), "{e}");
    }
}
