//! SPIFFE workload identities: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! This is the only identity form Istio ambient's HBONE accepts in a URI SAN (exactly five path
//! segments after the scheme). Parsing is strict so that a certificate can never be matched
//! against an identity that only looks similar.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A SPIFFE identity of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Why a string is not a SPIFFE workload identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdentity {
    #[error("identity {0:?} does not start with \"spiffe://\"")]
    Scheme(String),
    #[error(
        "identity {0:?} is not of the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"
    )]
    Shape(String),
    #[error("identity {value:?} has an empty or invalid {part}")]
    Part { value: String, part: &'static str },
}

// === impl Identity ===

impl Identity {
    /// Builds an identity from its parts, checking each of them.
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Result<Self, InvalidIdentity> {
        let id = Self {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        };
        for (part, value) in [
            ("trust domain", &id.trust_domain),
            ("namespace", &id.namespace),
            ("service account", &id.service_account),
        ] {
            if !valid_segment(value) {
                return Err(InvalidIdentity::Part {
                    value: id.to_string(),
                    part,
                });
            }
        }
        Ok(id)
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The identity without the `spiffe://` scheme, the form Istio's authorization policies
    /// compare principals against.
    pub(crate) fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// A segment is non-empty and made of characters allowed in a SPIFFE path or trust domain.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for Identity {
    type Err = InvalidIdentity;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| InvalidIdentity::Scheme(s.to_string()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] => Self::new(*td, *ns, *sa),
            _ => Err(InvalidIdentity::Shape(s.to_string())),
        }
    }
}

impl Serialize for Identity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        let id = Identity::new("cluster.local", "default", "sleep").unwrap();
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/default/sa/sleep");
        assert_eq!(id.to_string().parse::<Identity>().unwrap(), id);
        assert_eq!(id.principal(), "cluster.local/ns/default/sa/sleep");
    }

    #[test]
    fn rejects_lookalikes() {
        for bad in [
            "cluster.local/ns/default/sa/sleep",
            "spiffe://cluster.local/ns/default/sa/sleep/extra",
            "spiffe://cluster.local/ns/default/sa/",
            "spiffe://cluster.local/namespace/default/sa/sleep",
            "spiffe:///ns/default/sa/sleep",
            "spiffe://cluster.local/ns/de fault/sa/sleep",
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad} must be rejected");
        }
    }
}
