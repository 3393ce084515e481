//! What a pod's status and labels say about it, for every part of the translation.

use k8s_openapi::api::core::v1::Pod;

/// The label Gateway API implementations put on a gateway's pods.
pub(super) const GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";

/// The pod's `Ready` condition.
pub(super) fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod's addresses (`status.podIPs`, else `status.podIP`), those that parse.
pub(super) fn pod_ips(p: &Pod) -> Vec<String> {
    let Some(status) = p.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|i| i.ip.clone())
        .collect();
    if ips.is_empty() {
        ips.extend(status.pod_ip.clone());
    }
    ips.retain(|ip| ip.parse::<std::net::IpAddr>().is_ok());
    ips
}
