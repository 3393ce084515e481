//! What the agent reads of a Namespace or a Pod, out of the object as the watch delivers it
//! (a `DynamicObject`: a malformed object is an error naming it and its field, never a failed
//! watch, and the agent keeps what it knew of the object before).

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use serde::Deserialize;

use super::super::enroll::{Labels, PodFacts};

/// Why an object could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("a {kind} without a name")]
    NoName { kind: &'static str },
    #[error("{kind} {key}: {path}: {message}")]
    Field {
        kind: &'static str,
        /// `namespace/name` (a Namespace: its name).
        key: String,
        path: String,
        message: String,
    },
}

impl DecodeError {
    /// The key of the object that failed, when it has one.
    pub(crate) fn key(&self) -> Option<&str> {
        match self {
            Self::NoName { .. } => None,
            Self::Field { key, .. } => Some(key),
        }
    }
}

/// A Namespace's name and labels.
pub(crate) fn namespace(obj: &DynamicObject) -> Result<(String, Labels), DecodeError> {
    let name = obj
        .metadata
        .name
        .clone()
        .ok_or(DecodeError::NoName { kind: "Namespace" })?;
    Ok((name, labels(&obj.metadata.labels)))
}

/// The key a deleted object is removed by (`namespace/name`, or a Namespace's name).
pub(crate) fn key(meta: &ObjectMeta) -> Option<String> {
    let name = meta.name.as_deref()?;
    Some(match meta.namespace.as_deref() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    })
}

#[derive(Default, Deserialize)]
struct RawPod {
    #[serde(default)]
    spec: Option<RawSpec>,
    #[serde(default)]
    status: Option<RawStatus>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    host_network: Option<bool>,
}

#[derive(Default, Deserialize)]
struct RawStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<IpAddr>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Option<Vec<RawPodIp>>,
}

#[derive(Deserialize)]
struct RawPodIp {
    ip: IpAddr,
}

impl RawStatus {
    /// `podIPs`, else `podIP` (an API server may fill in only the latter).
    fn ips(&self) -> Vec<IpAddr> {
        match &self.pod_ips {
            Some(list) if !list.is_empty() => list.iter().map(|p| p.ip).collect(),
            _ => self.pod_ip.into_iter().collect(),
        }
    }
}

/// A Pod's facts (`namespace/name` is [`PodFacts::key`]).
pub(crate) fn pod(obj: &DynamicObject) -> Result<PodFacts, DecodeError> {
    let m = &obj.metadata;
    let name = m.name.clone().ok_or(DecodeError::NoName { kind: "Pod" })?;
    let namespace = m.namespace.clone().unwrap_or_default();
    let raw: RawPod =
        serde_path_to_error::deserialize(&obj.data).map_err(|e| DecodeError::Field {
            kind: "Pod",
            key: format!("{namespace}/{name}"),
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
    let spec = raw.spec.unwrap_or_default();
    let status = raw.status.unwrap_or_default();
    Ok(PodFacts {
        namespace,
        name,
        uid: m.uid.clone().unwrap_or_default(),
        labels: labels(&m.labels),
        annotations: labels(&m.annotations),
        node: spec.node_name,
        host_network: spec.host_network.unwrap_or(false),
        ips: status.ips(),
        phase: status.phase,
    })
}

fn labels(l: &Option<std::collections::BTreeMap<String, String>>) -> Labels {
    l.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_pod_is_read_and_a_malformed_field_is_named() {
        let p = pod(&object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": "node-1", "containers": []},
            "status": {"phase": "Running", "podIP": "198.18.62.10",
                       "podIPs": [{"ip": "198.18.62.10"}, {"ip": "fd00::a"}]},
        })))
        .unwrap();
        assert_eq!(p.key(), "shop/web");
        assert_eq!(p.uid, "u1");
        assert_eq!(p.node.as_deref(), Some("node-1"));
        assert!(!p.host_network);
        assert_eq!(p.phase.as_deref(), Some("Running"));
        assert_eq!(
            p.ips,
            [
                "198.18.62.10".parse::<IpAddr>().unwrap(),
                "fd00::a".parse().unwrap()
            ]
        );
        let e = pod(&object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop"},
            "status": {"podIPs": [{"ip": "198.18.62.300"}]},
        })))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Pod shop/web: status.podIPs[0].ip: invalid IP address syntax"),
            "{e}"
        );
        let e = pod(&object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"nodeName": "node-1", "hostNetwork": "yes"},
        })))
        .unwrap_err();
        assert_eq!(e.key(), Some("shop/web"));
        let text = e.to_string();
        assert!(
            text.starts_with("Pod shop/web: spec.hostNetwork: invalid type: string \"yes\""),
            "{text}"
        );
    }
}
