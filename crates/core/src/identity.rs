//! SPIFFE workload identities: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! This is the only identity form Istio ambient's HBONE accepts in a URI SAN (exactly five path
//! segments after the scheme). Parsing is strict so that a certificate can never be matched
//! against an identity that only looks similar.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const SCHEME: &str = "spiffe://";
const NS: &str = "/ns/";
const SA: &str = "/sa/";

/// A SPIFFE identity of a workload.
///
/// Held as its URI in one shared string, with where its parts end: a copy (a tunnel's accepted
/// identities, a pool key, a log field) is a reference count, and printing it is one write.
/// Compared, ordered and hashed by its parts, trust domain first, as three strings would be.
#[derive(Clone)]
pub struct Identity {
    uri: Arc<str>,
    /// Where the trust domain ends in `uri`.
    td_end: usize,
    /// Where the namespace ends (the service account follows `/sa/`).
    ns_end: usize,
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
        trust_domain: impl AsRef<str>,
        namespace: impl AsRef<str>,
        service_account: impl AsRef<str>,
    ) -> Result<Self, InvalidIdentity> {
        let (td, ns, sa) = (
            trust_domain.as_ref(),
            namespace.as_ref(),
            service_account.as_ref(),
        );
        Self::check(td, ns, sa)?;
        let td_end = SCHEME.len() + td.len();
        Ok(Self {
            uri: uri(td, ns, sa).into(),
            td_end,
            ns_end: td_end + NS.len() + ns.len(),
        })
    }

    /// Whether [`Identity::new`] accepts these parts, with its error, without building the
    /// identity: a node checks every workload it is sent, and keeps none of these.
    pub fn check(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<(), InvalidIdentity> {
        for (part, value) in [
            ("trust domain", trust_domain),
            ("namespace", namespace),
            ("service account", service_account),
        ] {
            if !valid_segment(value) {
                let value = uri(trust_domain, namespace, service_account);
                return Err(InvalidIdentity::Part { value, part });
            }
        }
        Ok(())
    }

    pub fn trust_domain(&self) -> &str {
        &self.uri[SCHEME.len()..self.td_end]
    }

    pub fn namespace(&self) -> &str {
        &self.uri[self.td_end + NS.len()..self.ns_end]
    }

    pub fn service_account(&self) -> &str {
        &self.uri[self.ns_end + SA.len()..]
    }

    /// The URI as the shared string it is held in: another reference to it, not a copy (a
    /// connection's log fields hold it so).
    pub fn shared(&self) -> Arc<str> {
        self.uri.clone()
    }

    /// The identity without the `spiffe://` scheme, the form Istio's authorization policies
    /// compare principals against.
    pub fn principal(&self) -> String {
        self.uri[SCHEME.len()..].to_string()
    }

    fn parts(&self) -> (&str, &str, &str) {
        (
            self.trust_domain(),
            self.namespace(),
            self.service_account(),
        )
    }
}

impl PartialEq for Identity {
    fn eq(&self, other: &Self) -> bool {
        // Segments hold no '/', so equal URIs are equal parts.
        self.uri == other.uri
    }
}

impl Eq for Identity {}

impl Ord for Identity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for Identity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for Identity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("trust_domain", &self.trust_domain())
            .field("namespace", &self.namespace())
            .field("service_account", &self.service_account())
            .finish()
    }
}

/// The URI of an identity of these parts.
fn uri(td: &str, ns: &str, sa: &str) -> String {
    let mut uri =
        String::with_capacity(SCHEME.len() + td.len() + NS.len() + ns.len() + SA.len() + sa.len());
    for part in [SCHEME, td, NS, ns, SA, sa] {
        uri.push_str(part);
    }
    uri
}

/// A segment is non-empty and made of characters allowed in a SPIFFE path or trust domain.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
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
        assert_eq!(
            (id.trust_domain(), id.namespace(), id.service_account()),
            ("cluster.local", "default", "sleep")
        );
    }

    #[test]
    fn ordered_and_hashed_by_parts() {
        use std::hash::BuildHasher;
        let id = |td: &str, ns: &str, sa: &str| Identity::new(td, ns, sa).unwrap();
        // By trust domain first, as three strings compare: "a" < "a.b", though the URI
        // "spiffe://a.b/..." sorts before "spiffe://a/...".
        assert!(id("a", "z", "z") < id("a.b", "a", "a"));
        assert!(id("a", "ns", "b") > id("a", "ns", "a"));
        assert!(id("a", "n", "z") < id("a", "n-2", "a"));
        assert_eq!(id("a", "b", "c"), "spiffe://a/ns/b/sa/c".parse().unwrap());
        let h = std::hash::RandomState::new();
        assert_eq!(
            h.hash_one(id("a", "b", "c")),
            h.hash_one(("a", "b", "c")),
            "hashed as its three parts"
        );
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

    #[test]
    fn a_check_answers_as_building_does() {
        for (td, ns, sa) in [
            ("cluster.local", "default", "sleep"),
            ("", "default", "sleep"),
            ("cluster.local", "de fault", "sleep"),
            ("cluster.local", "default", ""),
            ("cluster.local", "default", "a/b"),
        ] {
            assert_eq!(
                Identity::check(td, ns, sa),
                Identity::new(td, ns, sa).map(|_| ()),
                "{td} {ns} {sa}"
            );
        }
        assert!(Identity::check("cluster.local", "default", "").is_err());
    }
}
