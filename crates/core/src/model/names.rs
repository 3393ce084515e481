//! Names and keys: newtypes so a cluster name can never be passed where a network name belongs.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

/// A name held in one shared string: a copy (into a plan, an index bucket, a record) is a
/// reference count. Compared, ordered and hashed as the string.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl AsRef<str>) -> Self {
                Self(Arc::from(s.as_ref()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The shared string itself: another reference to it, not a copy.
            pub fn shared(&self) -> Arc<str> {
                self.0.clone()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(Arc::from(s))
            }
        }
    };
}

name_type!(
    /// A Kubernetes cluster, e.g. `east`. Istio's `cluster_id`.
    ClusterId
);
name_type!(
    /// An L3 network: pod addresses are unique only within one network. Istio's `network`.
    NetworkId
);
name_type!(
    /// A Kubernetes node: one `ferry node` runs per node.
    NodeName
);
name_type!(
    /// A workload's unique id, e.g. `east//v1/Pod/default/sleep-1`. Istio's `Workload.uid`.
    WorkloadUid
);

/// A service's key: `namespace/hostname`, the xDS resource name of an Istio `Service`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServiceKey {
    pub namespace: String,
    pub hostname: String,
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, hostname: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            hostname: hostname.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// A policy's key: `namespace/name`, the xDS resource name of an Istio `Authorization`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PolicyKey {
    pub namespace: String,
    pub name: String,
}

impl PolicyKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An IP address qualified by its network. Pod ranges of two networks may overlap, so every
/// address lookup in Ferry is keyed by this pair, never by the bare IP.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct NetworkAddress {
    pub network: NetworkId,
    pub ip: IpAddr,
}

impl NetworkAddress {
    pub fn new(network: NetworkId, ip: IpAddr) -> Self {
        Self { network, ip }
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_one_shared_string_that_reads_as_before() {
        let a = WorkloadUid::from("east//v1/Pod/default/a");
        let copy = a.clone();
        assert!(std::ptr::eq(a.as_str(), copy.as_str()), "a copy shares it");
        assert_eq!(a, WorkloadUid::new(String::from("east//v1/Pod/default/a")));
        assert_eq!(a.to_string(), "east//v1/Pod/default/a");
        assert_eq!(format!("{a:?}"), r#"WorkloadUid("east//v1/Pod/default/a")"#);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#""east//v1/Pod/default/a""#
        );
        assert!(ClusterId::new("east") < ClusterId::new("west"));
    }
}
