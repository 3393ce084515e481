//! Istio's enrollment marks, read by the control plane's translation (is a pod the mesh's?) and
//! by the CNI agent (is a pod to be captured?), so that both read them by one rule.
//!
//! - `istio.io/dataplane-mode` on a namespace or a pod: `ambient` asks the pod into the mesh;
//!   the pod's own label, when it has one, wins over its namespace's, so `none` on a pod opts it
//!   out of an enrolled namespace (and `ambient` on a pod enrolls it alone).
//! - `ambient.istio.io/redirection: enabled` on a pod: the CNI side (Istio's, or `ferry cni
//!   agent`) has handed it to its node proxy; removed when the pod leaves the mesh.

/// Istio's enrollment label, on a namespace or a pod.
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// The value of [`DATAPLANE_MODE`] that asks for the mesh.
pub const AMBIENT: &str = "ambient";
/// Set by the CNI side once the pod's traffic is redirected to its node proxy.
pub const REDIRECTION: &str = "ambient.istio.io/redirection";
/// The value of [`REDIRECTION`] that says so.
pub const REDIRECTION_ENABLED: &str = "enabled";

/// Whether a pod is asked into the mesh, from its own [`DATAPLANE_MODE`] label and its
/// namespace's: the pod's decides when it has one (`ambient`: yes; anything else, `none`
/// included: no), else the namespace's (`ambient`: yes).
pub fn asked(pod_mode: Option<&str>, namespace_mode: Option<&str>) -> bool {
    match pod_mode {
        Some(mode) => mode == AMBIENT,
        None => namespace_mode == Some(AMBIENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_label_wins_over_its_namespaces() {
        assert!(asked(None, Some("ambient")));
        assert!(!asked(None, None));
        assert!(!asked(None, Some("none")));
        assert!(asked(Some("ambient"), None));
        assert!(!asked(Some("none"), Some("ambient")));
        assert!(!asked(Some("sidecar"), Some("ambient")));
    }
}
