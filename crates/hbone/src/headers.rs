//! The CONNECT request: its target, and the headers Istio's data plane sends and reads.
//!
//! Pure functions, fuzzed by property tests: every byte here can come from an attacker.
//! See `docs/hbone.md` for the wire format.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Method, StatusCode};

pub mod baggage;

pub use baggage::{Baggage, WorkloadKind, WorkloadName};

/// Where a CONNECT asks to go: `ip:port` (a workload address, or a service VIP at a waypoint)
/// or `hostname:port` (a service, resolved by the receiver: double HBONE through a gateway). The
/// same type the routing decision takes.
pub use ferry_core::route::Destination as Target;
use ferry_core::route::valid_hostname;

/// Why a request is refused, and the HTTP status it gets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not CONNECT: 405.
    #[error("method {0} is not allowed: HBONE accepts only CONNECT")]
    MethodNotAllowed(String),
    /// A malformed request or target: 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Denied by policy: 401, as Istio's data plane answers an authorization denial.
    #[error("denied: {0}")]
    Denied(String),
    /// The target cannot be served or reached: 503.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Denied(_) => StatusCode::UNAUTHORIZED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Checks a request's method and authority and returns its target.
///
/// RFC 9113 §8.5: "The :scheme and :path pseudo-header fields MUST be omitted" from a CONNECT
/// request, and ":authority contains the host and port to connect to". h2 enforces the first;
/// this checks the method and parses the second.
pub fn parse_request(method: &Method, authority: Option<&str>) -> Result<Target, Refusal> {
    if method != Method::CONNECT {
        return Err(Refusal::MethodNotAllowed(method.to_string()));
    }
    let authority =
        authority.ok_or_else(|| Refusal::BadRequest("CONNECT without :authority".into()))?;
    parse_authority(authority)
}

/// Parses `ip:port`, `[v6]:port` or `hostname:port` (the rule is core's
/// [`Target::parse_authority`]); a bad authority is a 400.
pub fn parse_authority(authority: &str) -> Result<Target, Refusal> {
    Target::parse_authority(authority).map_err(|e| Refusal::BadRequest(e.to_string()))
}

/// Headers the client adds to a CONNECT (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectHeaders {
    /// Source peer metadata, `k=v` pairs (Istio's `baggage`); typed as [`Baggage`] by
    /// [`ConnectHeaders::typed_baggage`] and [`Baggage::to_pairs`].
    pub baggage: Vec<(String, String)>,
    /// The original client address: `forwarded: for="ip:port"`.
    pub forwarded_for: Option<SocketAddr>,
    /// The destination service hostname, added to `forwarded` as `;host=`.
    pub forwarded_host: Option<String>,
    /// W3C trace context: `00-<32 hex>-<16 hex>-<2 hex>`.
    pub traceparent: Option<String>,
    /// Only on the inner CONNECT of double HBONE: the source's network.
    pub forwarded_network: Option<String>,
}

pub(crate) const BAGGAGE: &str = "baggage";
pub(crate) const FORWARDED: &str = "forwarded";
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const X_FORWARDED_NETWORK: &str = "x-forwarded-network";

impl ConnectHeaders {
    /// Writes these headers into `map`. Values that cannot be header values are skipped.
    pub fn write(&self, map: &mut HeaderMap) {
        if !self.baggage.is_empty() {
            baggage::write_pairs(&self.baggage, map);
        }
        // `for` and `host` each only when known (a hop that cannot prove the client forwards
        // none, and still names the service).
        let pairs: Vec<String> = self
            .forwarded_for
            .map(|addr| format!("for=\"{addr}\""))
            .into_iter()
            .chain(self.forwarded_host.as_ref().map(|h| format!("host={h}")))
            .collect();
        if !pairs.is_empty()
            && let Ok(v) = HeaderValue::from_str(&pairs.join(";"))
        {
            map.insert(FORWARDED, v);
        }
        if let Some(t) = self
            .traceparent
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            map.insert(TRACEPARENT, t);
        }
        if let Some(n) = self
            .forwarded_network
            .as_deref()
            .and_then(|n| HeaderValue::from_str(n).ok())
        {
            map.insert(X_FORWARDED_NETWORK, n);
        }
    }

    /// The baggage, typed.
    pub fn typed_baggage(&self) -> Baggage {
        Baggage::from_pairs(self.baggage.iter().map(|(k, v)| (k, v)))
    }

    /// Reads what a peer sent. Malformed headers are ignored, never fatal: they are metadata.
    pub fn read(map: &HeaderMap) -> Self {
        let text = |name: &str| map.get(name).and_then(|v| v.to_str().ok());
        let (forwarded_for, forwarded_host) =
            text(FORWARDED).map(parse_forwarded).unwrap_or_default();
        Self {
            baggage: text(BAGGAGE).map(parse_baggage).unwrap_or_default(),
            forwarded_for,
            forwarded_host,
            traceparent: text(TRACEPARENT)
                .filter(|t| valid_traceparent(t))
                .map(str::to_string),
            forwarded_network: text(X_FORWARDED_NETWORK)
                .filter(|n| !n.is_empty() && n.len() <= 253)
                .map(str::to_string),
        }
    }
}

/// W3C baggage: the valid `k=v` members (at most [`baggage::MAX_MEMBERS`]); properties after
/// `;` are dropped. [`Baggage::parse`] types them.
pub(crate) fn parse_baggage(s: &str) -> Vec<(String, String)> {
    baggage::members(s)
}

/// RFC 7239 `forwarded`: the first element's `for` (an `ip:port` or bare IP) and `host`.
pub(crate) fn parse_forwarded(s: &str) -> (Option<SocketAddr>, Option<String>) {
    let first = s.split(',').next().unwrap_or("");
    let mut for_ = None;
    let mut host = None;
    for pair in first.split(';') {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"');
        match k.trim().to_ascii_lowercase().as_str() {
            "for" => {
                // `ip:port`, `[v6]:port`, or a bare address (an IPv6 one in brackets, as RFC
                // 7239 writes it, or without).
                let bare = v.strip_prefix('[').and_then(|b| b.strip_suffix(']'));
                for_ = v.parse::<SocketAddr>().ok().or_else(|| {
                    bare.unwrap_or(v)
                        .parse::<std::net::IpAddr>()
                        .ok()
                        .map(|ip| SocketAddr::new(ip, 0))
                });
            }
            "host" if valid_hostname(v) => host = Some(v.to_string()),
            _ => {}
        }
    }
    (for_, host)
}

/// `00-<32 lowercase hex, not all zero>-<16 hex, not all zero>-<2 hex>`.
/// The trace id (32 hex digits) of a valid W3C `traceparent`.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    valid_traceparent(traceparent)
        .then(|| traceparent.split('-').nth(1))
        .flatten()
}

/// The trace id of the `traceparent` a CONNECT carries, if it carries a valid one. Every hop
/// records it, so the records of one connection can be joined (`ferry trace`).
pub fn trace_id(map: &HeaderMap) -> Option<u128> {
    map.get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(trace_id_of)
        .and_then(|t| u128::from_str_radix(t, 16).ok())
}

pub fn valid_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    matches!(parts.as_slice(), [v, trace, span, flags]
        if hex(v, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2)
            && trace.bytes().any(|b| b != b'0') && span.bytes().any(|b| b != b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            parse_authority("198.18.1.10:8080"),
            Ok(Target::Addr("198.18.1.10:8080".parse().unwrap()))
        );
        assert_eq!(
            parse_authority("[fd00::1]:80"),
            Ok(Target::Addr("[fd00::1]:80".parse().unwrap()))
        );
        assert_eq!(
            parse_authority("Echo.default.svc.cluster.local:80"),
            Ok(Target::Host {
                hostname: "echo.default.svc.cluster.local".into(),
                port: 80
            })
        );
        for bad in [
            "",
            "198.18.1.10",
            "198.18.1.10:0",
            "198.18.1.10:99999",
            "host:",
            ":80",
            "-a.b:80",
            "a..b:80",
            "a b:80",
            "1.2.3:80",
            "fd00::1:80",
        ] {
            assert!(
                matches!(parse_authority(bad), Err(Refusal::BadRequest(_))),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn an_ipv6_forwarded_for_is_written_in_brackets_and_read_back() {
        let h = ConnectHeaders {
            forwarded_for: Some("[2001:2::1:10]:41234".parse().unwrap()),
            ..ConnectHeaders::default()
        };
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(
            map.get(FORWARDED).unwrap().to_str().unwrap(),
            "for=\"[2001:2::1:10]:41234\""
        );
        assert_eq!(ConnectHeaders::read(&map), h);
        for (written, want) in [
            ("for=\"[2001:2::1:10]\"", "[2001:2::1:10]:0"),
            ("for=2001:2::1:10", "[2001:2::1:10]:0"),
            ("for=\"[2001:2::1:10]:80\"", "[2001:2::1:10]:80"),
        ] {
            assert_eq!(
                parse_forwarded(written).0,
                Some(want.parse().unwrap()),
                "{written}"
            );
        }
    }

    #[test]
    fn methods_and_statuses() {
        assert_eq!(
            parse_request(&Method::GET, Some("198.18.1.10:80"))
                .unwrap_err()
                .status(),
            405
        );
        assert_eq!(
            parse_request(&Method::CONNECT, None).unwrap_err().status(),
            400
        );
        assert_eq!(Refusal::Denied("x".into()).status(), 401);
        assert_eq!(Refusal::Unavailable("x".into()).status(), 503);
    }

    #[test]
    fn headers_round_trip() {
        let h = ConnectHeaders {
            baggage: vec![
                ("k8s.cluster.name".into(), "east".into()),
                ("k8s.namespace.name".into(), "default".into()),
            ],
            forwarded_for: Some("198.18.1.10:41234".parse().unwrap()),
            forwarded_host: Some("echo.default.svc.cluster.local".into()),
            traceparent: Some(format!("00-{}-{}-01", "a".repeat(32), "b".repeat(16))),
            forwarded_network: Some("net-east".into()),
        };
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(
            map.get(FORWARDED).unwrap(),
            "for=\"198.18.1.10:41234\";host=echo.default.svc.cluster.local"
        );
        assert_eq!(ConnectHeaders::read(&map), h);
    }

    #[test]
    fn a_service_is_forwarded_without_a_client() {
        let h = ConnectHeaders {
            forwarded_host: Some("echo.default.svc.cluster.local".into()),
            ..ConnectHeaders::default()
        };
        let mut map = HeaderMap::new();
        h.write(&mut map);
        assert_eq!(
            map.get(FORWARDED).unwrap(),
            "host=echo.default.svc.cluster.local"
        );
        assert_eq!(ConnectHeaders::read(&map), h);
        let mut none = HeaderMap::new();
        ConnectHeaders::default().write(&mut none);
        assert!(none.get(FORWARDED).is_none());
    }

    #[test]
    fn malformed_headers_are_ignored() {
        let mut map = HeaderMap::new();
        map.insert(BAGGAGE, HeaderValue::from_static("=,a=,=b,ok=1;prop=2"));
        map.insert(
            FORWARDED,
            HeaderValue::from_static("for=nonsense;host=-bad-"),
        );
        map.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-00000000000000000000000000000000-0000000000000000-00"),
        );
        let h = ConnectHeaders::read(&map);
        assert_eq!(h.baggage, vec![("ok".to_string(), "1".to_string())]);
        assert_eq!(
            (h.forwarded_for, h.forwarded_host, h.traceparent),
            (None, None, None)
        );
    }
}
