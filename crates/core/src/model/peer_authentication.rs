//! Istio's `PeerAuthentication`: whether a workload accepts plain TCP (mutual TLS not
//! required) or only mutual TLS, mesh-wide, per namespace, per workload and per port.
//!
//! Nothing enforces these directly: istiod turns them into authorization policies (a DENY of
//! every connection without a peer identity) and lists those on the workloads they govern;
//! [`crate::peer_auth`] does the same conversion, so a node proxy (Ferry's or Istio's) receives
//! what it would receive from istiod.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// Istio's `PeerAuthentication.MutualTLS.Mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MtlsMode {
    /// Inherit from the level above (workload from namespace, namespace from mesh); at the
    /// top, not strict.
    #[default]
    Unset,
    /// Plain TCP accepted. In ambient mode the same as `Permissive` (the node proxy always
    /// tunnels between mesh workloads).
    Disable,
    /// Mutual TLS and plain TCP both accepted.
    Permissive,
    /// Only connections with a peer identity (HBONE from a mesh workload).
    Strict,
}

/// One `PeerAuthentication`. Several may apply at one level; the oldest wins there (Istio's
/// `creationTimestamp`): in a list of them, the first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerAuthentication {
    pub name: String,
    pub namespace: String,
    /// The workloads of `namespace` whose labels include these; empty: the whole namespace,
    /// or the whole mesh when `namespace` is the root namespace.
    pub selector: BTreeMap<String, String>,
    pub mode: MtlsMode,
    /// Per target port, overriding `mode` (only with a selector, as Istio validates).
    pub port_level: BTreeMap<u16, MtlsMode>,
}

// === impl MtlsMode ===

impl MtlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unset => "unset",
            Self::Disable => "disable",
            Self::Permissive => "permissive",
            Self::Strict => "strict",
        }
    }

    pub fn is_strict(self) -> bool {
        self == Self::Strict
    }

    /// Permissive or disabled: plain TCP accepted.
    pub fn is_open(self) -> bool {
        matches!(self, Self::Permissive | Self::Disable)
    }
}

impl fmt::Display for MtlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
