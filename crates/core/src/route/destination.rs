//! Where a connection is headed: [`Destination`], with the CONNECT authority form it travels in.

use std::fmt;
use std::net::SocketAddr;

use serde::Serialize;

/// Where the connection was headed, as captured, or where a tunnel asks to go.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// `ip:port`: the original destination of a captured connection, a workload address, or a
    /// service VIP at a waypoint.
    Addr(SocketAddr),
    /// `hostname:port`: a service, resolved by the receiver (`ferry explain`, or the inner tunnel
    /// of double HBONE through a gateway).
    Host { hostname: String, port: u16 },
}

/// Why an authority is not a destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("authority {authority:?}: {why}")]
pub struct BadAuthority {
    pub authority: String,
    pub why: &'static str,
}

// === impl Destination ===

impl Destination {
    /// The destination port.
    pub fn port(&self) -> u16 {
        match self {
            Self::Addr(a) => a.port(),
            Self::Host { port, .. } => *port,
        }
    }

    /// Parses a CONNECT authority: `ip:port`, `[v6]:port` or `hostname:port` (an RFC 1123
    /// hostname, lowercased). Port 0 is refused.
    pub fn parse_authority(authority: &str) -> Result<Self, BadAuthority> {
        let bad = |why| BadAuthority {
            authority: authority.to_string(),
            why,
        };
        if let Ok(addr) = authority.parse::<SocketAddr>() {
            if addr.port() == 0 {
                return Err(bad("port 0"));
            }
            return Ok(Self::Addr(addr));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| bad("expected host:port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
        if port == 0 {
            return Err(bad("port 0"));
        }
        if !valid_hostname(host) {
            return Err(bad("expected an IP address or a DNS hostname"));
        }
        Ok(Self::Host {
            hostname: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl fmt::Display for Destination {
    /// The authority form: `ip:port`, `[v6]:port` or `hostname:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(a) => write!(f, "{a}"),
            Self::Host { hostname, port } => write!(f, "{hostname}:{port}"),
        }
    }
}

impl std::str::FromStr for Destination {
    type Err = BadAuthority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_authority(s)
    }
}

/// RFC 1123 hostnames: dot-separated labels of letters, digits and inner hyphens, not all digits.
pub fn valid_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && !h.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse_and_print_back() {
        let table: [(&str, Result<&str, &str>); 14] = [
            ("198.18.1.10:8080", Ok("198.18.1.10:8080")),
            ("[fd00::1]:443", Ok("[fd00::1]:443")),
            (
                "App.Default.svc.cluster.local:80",
                Ok("app.default.svc.cluster.local:80"),
            ),
            ("a-b.c:1", Ok("a-b.c:1")),
            ("198.18.1.10:0", Err("port 0")),
            ("app.svc:0", Err("port 0")),
            ("app.svc", Err("expected host:port")),
            (
                "app.svc:http",
                Err("the port is not a number from 1 to 65535"),
            ),
            (
                "app.svc:65536",
                Err("the port is not a number from 1 to 65535"),
            ),
            (
                "-app.svc:80",
                Err("expected an IP address or a DNS hostname"),
            ),
            (
                "app..svc:80",
                Err("expected an IP address or a DNS hostname"),
            ),
            ("1.2.3:80", Err("expected an IP address or a DNS hostname")),
            (":80", Err("expected an IP address or a DNS hostname")),
            (
                "fd00::1:443",
                Err("expected an IP address or a DNS hostname"),
            ),
        ];
        for (authority, want) in table {
            let got = Destination::parse_authority(authority);
            match want {
                Ok(text) => {
                    let d = got.unwrap_or_else(|e| panic!("{authority}: {e}"));
                    assert_eq!(d.to_string(), text);
                    assert_eq!(text.parse::<Destination>(), Ok(d));
                }
                Err(why) => assert_eq!(
                    got,
                    Err(BadAuthority {
                        authority: authority.to_string(),
                        why
                    }),
                    "{authority}"
                ),
            }
        }
        assert_eq!(
            Destination::parse_authority("app.svc:80").map(|d| d.port()),
            Ok(80)
        );
    }
}
