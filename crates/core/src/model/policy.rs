//! Authorization policies with Istio's `istio.security.Authorization` structure and semantics.
//!
//! A policy holds rules (OR); a rule holds clauses (AND); a clause holds matches (OR); inside one
//! match every populated field must hold (AND), the values of one field OR, and the `not_*`
//! lists must not match. Evaluation lives in [`crate::authz`].

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::Serialize;

use super::PolicyKey;

/// Which workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyScope {
    /// Every workload in the mesh (Istio's `GLOBAL`, a policy in the root namespace).
    Mesh,
    /// Every workload in the policy's namespace.
    Namespace,
    /// The workloads that list this policy in `Workload::authorization_policies`.
    WorkloadSelector,
}

/// What a matching policy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    /// Recorded, never changes the verdict.
    Audit,
}

/// Istio's `StringMatch`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    /// Any value, as long as there is one.
    Presence,
}

impl StringMatch {
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(s) => value == s,
            Self::Prefix(s) => value.starts_with(s.as_str()),
            Self::Suffix(s) => value.ends_with(s.as_str()),
            Self::Presence => !value.is_empty(),
        }
    }

    /// As [`StringMatch::matches`], ignoring ASCII case (host names).
    pub(crate) fn matches_ignore_case(&self, value: &str) -> bool {
        let v = value.to_ascii_lowercase();
        match self {
            Self::Exact(s) => v == s.to_ascii_lowercase(),
            Self::Prefix(s) => v.starts_with(&s.to_ascii_lowercase()),
            Self::Suffix(s) => v.ends_with(&s.to_ascii_lowercase()),
            Self::Presence => !v.is_empty(),
        }
    }

    /// Istio's Kubernetes API form: `*` is presence, `x*` a prefix, `*x` a suffix.
    pub fn from_pattern(pattern: &str) -> Self {
        if pattern == "*" {
            Self::Presence
        } else if let Some(p) = pattern.strip_suffix('*') {
            Self::Prefix(p.to_string())
        } else if let Some(s) = pattern.strip_prefix('*') {
            Self::Suffix(s.to_string())
        } else {
            Self::Exact(pattern.to_string())
        }
    }
}

impl fmt::Display for StringMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(s) => f.write_str(s),
            Self::Prefix(s) => write!(f, "{s}*"),
            Self::Suffix(s) => write!(f, "*{s}"),
            Self::Presence => f.write_str("*"),
        }
    }
}

/// An address block: Istio's `Address` (address + prefix length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

/// Why a string is not a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an IP address or CIDR block ({reason})")]
pub struct InvalidCidr {
    pub value: String,
    pub reason: &'static str,
}

impl Cidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, InvalidCidr> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(InvalidCidr {
                value: format!("{addr}/{prefix}"),
                reason: "prefix length too long for the address family",
            });
        }
        Ok(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| InvalidCidr {
            value: s.to_string(),
            reason,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("bad address"))?;
        let prefix = match prefix {
            Some(p) => p.parse().map_err(|_| bad("bad prefix length"))?,
            None if addr.is_ipv4() => 32,
            None => 128,
        };
        Self::new(addr, prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Istio's `ServiceAccountMatch`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ServiceAccountMatch {
    pub namespace: String,
    pub service_account: String,
}

/// Istio's `Match`: every populated field must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Match {
    pub namespaces: Vec<StringMatch>,
    pub not_namespaces: Vec<StringMatch>,
    pub principals: Vec<StringMatch>,
    pub not_principals: Vec<StringMatch>,
    pub service_accounts: Vec<ServiceAccountMatch>,
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    pub source_ips: Vec<Cidr>,
    pub not_source_ips: Vec<Cidr>,
    pub destination_ips: Vec<Cidr>,
    pub not_destination_ips: Vec<Cidr>,
    pub destination_ports: Vec<u16>,
    pub not_destination_ports: Vec<u16>,
    /// L7 (Ferry's extension, enforced by waypoints): HTTP methods, paths and hosts. At L4 a
    /// match with any of these never holds.
    pub methods: Vec<StringMatch>,
    pub not_methods: Vec<StringMatch>,
    pub paths: Vec<StringMatch>,
    pub not_paths: Vec<StringMatch>,
    pub hosts: Vec<StringMatch>,
    pub not_hosts: Vec<StringMatch>,
    /// Request headers that must be present with a matching value (all of them).
    pub headers: Vec<HeaderMatch>,
}

/// A request header (name in lower case) with a value matching one of `values`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeaderMatch {
    pub name: String,
    pub values: Vec<StringMatch>,
}

impl Match {
    /// Whether it needs an HTTP request to be judged.
    pub fn is_l7(&self) -> bool {
        !(self.methods.is_empty()
            && self.not_methods.is_empty()
            && self.paths.is_empty()
            && self.not_paths.is_empty()
            && self.hosts.is_empty()
            && self.not_hosts.is_empty()
            && self.headers.is_empty())
    }

    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Istio's `Clause`: matches OR.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Clause {
    pub matches: Vec<Match>,
}

/// Istio's `Rule`: clauses AND.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub clauses: Vec<Clause>,
}

/// An authorization policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub name: String,
    pub namespace: String,
    pub scope: PolicyScope,
    pub action: Action,
    /// Rules OR. A policy with no rules matches nothing.
    pub rules: Vec<Rule>,
    /// Evaluated and reported, never enforced.
    pub dry_run: bool,
}

impl Policy {
    pub fn key(&self) -> PolicyKey {
        PolicyKey::new(&self.namespace, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_containment() {
        let c: Cidr = "198.18.0.0/15".parse().unwrap();
        assert!(c.contains("198.19.255.255".parse().unwrap()));
        assert!(!c.contains("198.20.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let one: Cidr = "198.18.0.7".parse().unwrap();
        assert_eq!(one.prefix, 32);
        assert!(one.contains("198.18.0.7".parse().unwrap()));
        assert!(!one.contains("198.18.0.8".parse().unwrap()));
        assert!("198.18.0.0/33".parse::<Cidr>().is_err());
        assert!("fd00::/129".parse::<Cidr>().is_err());
        assert!("nonsense/8".parse::<Cidr>().is_err());
    }

    #[test]
    fn string_match_patterns() {
        assert_eq!(StringMatch::from_pattern("*"), StringMatch::Presence);
        assert!(
            StringMatch::from_pattern("cluster.local/ns/a/*").matches("cluster.local/ns/a/sa/x")
        );
        assert!(StringMatch::from_pattern("*/sa/x").matches("cluster.local/ns/a/sa/x"));
        assert!(!StringMatch::from_pattern("a").matches("ab"));
        assert!(!StringMatch::Presence.matches(""));
    }
}
