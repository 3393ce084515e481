//! The objects of one cluster that the translation reads, and how they are read from YAML as
//! `kubectl get -o yaml` prints them (a `List`, single objects, or several documents).
//!
//! One bad object never blocks the rest: an object that does not decode is left out with a
//! [`Note`] naming it and what was wrong, and the others are kept. An `AuthorizationPolicy`
//! that does not decode is kept in a form that fails closed (see
//! [`crate::crd::AuthorizationPolicy::invalid`]), because leaving a policy out grants what it
//! would have refused.

use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::crd::{
    AuthorizationPolicy, Gateway, HttpRoute, PeerAuthentication, PolicySpec, ServiceExport,
    ServiceImport, WorkloadSelector,
};

/// Everything of one cluster the translation reads.
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    /// The cluster's ID (Istio's `CLUSTER_ID`).
    pub cluster: String,
    /// Its network; when `None`, the `topology.istio.io/network` label of the system
    /// namespace, else the cluster ID.
    pub network: Option<String>,
    pub namespaces: Vec<Namespace>,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1` slices: their endpoints' conditions are their pods' state.
    pub endpoint_slices: Vec<EndpointSlice>,
    pub gateways: Vec<Gateway>,
    pub policies: Vec<AuthorizationPolicy>,
    pub peer_authentications: Vec<PeerAuthentication>,
    pub service_exports: Vec<ServiceExport>,
    pub service_imports: Vec<ServiceImport>,
    /// Gateway API routes: those attached to a Service are its waypoint's routes.
    pub http_routes: Vec<HttpRoute>,
}

/// An object with metadata.
pub(crate) trait HasMeta {
    fn meta(&self) -> &ObjectMeta;
}

macro_rules! has_meta {
    ($($t:ty),*) => {
        $(impl HasMeta for $t {
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
        })*
    };
}

has_meta!(
    Namespace,
    Node,
    Pod,
    Service,
    EndpointSlice,
    Gateway,
    HttpRoute,
    AuthorizationPolicy,
    PeerAuthentication,
    ServiceExport,
    ServiceImport
);

/// Something the translation left out or changed, and why: logged and counted by the caller.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Note {
    pub cluster: String,
    /// `Kind namespace/name` (or `Kind name` for cluster-wide kinds).
    pub object: String,
    pub message: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cluster {}: {}: {}",
            self.cluster, self.object, self.message
        )
    }
}

/// Why a YAML text could not be read at all (a single bad object is a [`Note`] instead).
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: expected Kubernetes objects in YAML, found: {message}")]
pub struct LoadError {
    pub source_name: String,
    pub message: String,
}

impl ClusterObjects {
    /// No objects yet, for cluster `cluster`.
    pub fn new(cluster: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            ..Self::default()
        }
    }

    /// Adds the objects in `text` (`source_name` names it in errors). Kinds the translation
    /// does not read are ignored; objects that do not decode are left out, each with a note.
    pub fn add_yaml(&mut self, source_name: &str, text: &str) -> Result<Vec<Note>, LoadError> {
        let mut notes = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let value = Value::deserialize(doc).map_err(|e| LoadError {
                source_name: source_name.to_string(),
                message: e.to_string(),
            })?;
            match value {
                Value::Null => {}
                v if kind_of(&v) == "List" => {
                    if let Some(Value::Array(items)) = v.get("items") {
                        for item in items {
                            self.add_value(item.clone(), &mut notes);
                        }
                    }
                }
                v => self.add_value(v, &mut notes),
            }
        }
        Ok(notes)
    }

    /// Adds one object given as JSON, of the kind its `apiVersion` and `kind` say.
    pub fn add_value(&mut self, value: Value, notes: &mut Vec<Note>) {
        let kind = kind_of(&value).to_string();
        let group = api_version_of(&value)
            .split_once('/')
            .map_or("", |(g, _)| g)
            .to_string();
        self.add_as(&group, &kind, value, notes);
    }

    /// Adds one object of API group `group` (`""` for the core group) and kind `kind`, given
    /// as JSON (list items from an API server carry no `kind` of their own).
    pub fn add_as(&mut self, group: &str, kind: &str, value: Value, notes: &mut Vec<Note>) {
        let object = object_name(kind, &value);
        let mut bad = |e: serde_json::Error| {
            notes.push(Note {
                cluster: self.cluster.clone(),
                object: object.clone(),
                message: format!("left out: it does not decode ({e})"),
            });
        };
        match (group, kind) {
            ("", "Namespace") => match serde_json::from_value(value) {
                Ok(o) => self.namespaces.push(o),
                Err(e) => bad(e),
            },
            ("", "Node") => match serde_json::from_value(value) {
                Ok(o) => self.nodes.push(o),
                Err(e) => bad(e),
            },
            ("", "Pod") => match serde_json::from_value(value) {
                Ok(o) => self.pods.push(o),
                Err(e) => bad(e),
            },
            ("", "Service") => match serde_json::from_value(value) {
                Ok(o) => self.services.push(o),
                Err(e) => bad(e),
            },
            ("discovery.k8s.io", "EndpointSlice") => match serde_json::from_value(value) {
                Ok(o) => self.endpoint_slices.push(o),
                Err(e) => bad(e),
            },
            ("gateway.networking.k8s.io", "Gateway") => match serde_json::from_value(value) {
                Ok(o) => self.gateways.push(o),
                Err(e) => bad(e),
            },
            ("gateway.networking.k8s.io", "HTTPRoute") => match serde_json::from_value(value) {
                Ok(o) => self.http_routes.push(o),
                Err(e) => bad(e),
            },
            ("multicluster.x-k8s.io", "ServiceExport") => match serde_json::from_value(value) {
                Ok(o) => self.service_exports.push(o),
                Err(e) => bad(e),
            },
            ("multicluster.x-k8s.io", "ServiceImport") => match serde_json::from_value(value) {
                Ok(o) => self.service_imports.push(o),
                Err(e) => bad(e),
            },
            ("security.istio.io", "PeerAuthentication") => {
                match serde_json::from_value::<PeerAuthentication>(value) {
                    Ok(o) => self.peer_authentications.push(o),
                    Err(e) => bad(e),
                }
            }
            ("security.istio.io", "AuthorizationPolicy") => {
                match serde_json::from_value::<AuthorizationPolicy>(value.clone()) {
                    Ok(o) => self.policies.push(o),
                    Err(e) => {
                        let p = failed_policy(&value, &e);
                        notes.push(Note {
                            cluster: self.cluster.clone(),
                            object,
                            message: format!(
                                "does not decode ({e}); kept as a policy that fails closed"
                            ),
                        });
                        self.policies.push(p);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Takes out of `v`, an object of kind `kind` as JSON, what no translation reads and a watch
/// would otherwise keep for every object: `metadata.managedFields`, kubectl's
/// last-applied-configuration annotation and, of a Pod, all of its spec but the node, service
/// account, host network and containers' names and ports, and all of its status but the phase,
/// addresses and conditions (container statuses, volumes, environments, images).
pub(crate) fn strip_unread(group: &str, kind: &str, v: &mut Value) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(LAST_APPLIED);
        }
    }
    if (group, kind) != ("", "Pod") {
        return;
    }
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
        spec.retain(|k, _| {
            matches!(
                k.as_str(),
                "nodeName" | "serviceAccountName" | "hostNetwork" | "containers"
            )
        });
        if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter_map(Value::as_object_mut) {
                c.retain(|k, _| matches!(k.as_str(), "name" | "ports"));
            }
        }
    }
    if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
        status.retain(|k, _| matches!(k.as_str(), "phase" | "podIP" | "podIPs" | "conditions"));
    }
}

/// kubectl's copy of what was last applied: often the largest annotation, read by no one here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fail-closed stand-in for a policy that does not decode: its metadata, selector and
/// action as far as they can be read, and the reason.
fn failed_policy(value: &Value, error: &serde_json::Error) -> AuthorizationPolicy {
    let metadata: ObjectMeta = value
        .get("metadata")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    let spec = value.get("spec");
    let selector: Option<WorkloadSelector> = spec
        .and_then(|s| s.get("selector"))
        .map(|s| serde_json::from_value(s.clone()).unwrap_or_default());
    let action = spec
        .and_then(|s| s.get("action"))
        .and_then(Value::as_str)
        .map(str::to_string);
    AuthorizationPolicy {
        metadata,
        spec: PolicySpec {
            selector,
            action,
            ..PolicySpec::default()
        },
        invalid: Some(error.to_string()),
    }
}

fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

fn api_version_of(v: &Value) -> &str {
    v.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// `Kind namespace/name`, as far as the object says.
fn object_name(kind: &str, v: &Value) -> String {
    let meta = v.get("metadata");
    let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str);
    match (field("namespace"), field("name")) {
        (Some(ns), Some(n)) => format!("{kind} {ns}/{n}"),
        (None, Some(n)) => format!("{kind} {n}"),
        _ => format!("{kind} (unnamed)"),
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use serde_json::json;

    use super::strip_unread;
    use crate::translate::{MeshConfig, translate};

    /// A pod as an API server sends it: managed fields, kubectl's annotation, volumes,
    /// environments, images, container statuses.
    fn bloat(v: &mut serde_json::Value) {
        v["metadata"]["managedFields"] = json!([{"manager": "kubelet", "operation": "Update",
            "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]);
        v["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
            json!("{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}");
        v["spec"]["volumes"] = json!([{"name": "token", "projected": {"sources": []}}]);
        v["spec"]["restartPolicy"] = json!("Always");
        for c in v["spec"]["containers"].as_array_mut().into_iter().flatten() {
            c["image"] = json!("registry.example/app:1.2.3");
            c["env"] = json!([{"name": "MODE", "value": "prod"}]);
            c["resources"] = json!({"requests": {"cpu": "100m"}});
        }
        v["status"]["containerStatuses"] = json!([{"name": "app", "ready": true,
            "restartCount": 0, "image": "registry.example/app:1.2.3", "imageID": "sha256:00"}]);
        v["status"]["hostIP"] = json!("198.18.0.1");
    }

    /// What is taken out of a pod is what no translation reads: the mesh is the same.
    #[test]
    fn pods_stripped_of_what_is_not_read_translate_the_same() {
        let (alpha, _) = crate::fixtures::cluster("alpha", "");
        let mut slim = alpha.clone();
        slim.pods.clear();
        let mut notes = Vec::new();
        for p in &alpha.pods {
            let mut v = serde_json::to_value(p).unwrap();
            bloat(&mut v);
            let before = v.to_string().len();
            strip_unread("", "Pod", &mut v);
            assert!(v["metadata"].get("managedFields").is_none());
            assert!(v["status"].get("containerStatuses").is_none());
            assert!(v["spec"].get("volumes").is_none());
            assert!(v.to_string().len() < before);
            slim.add_as("", "Pod", v, &mut notes);
        }
        assert!(notes.is_empty(), "{notes:?}");
        let mesh = MeshConfig::default();
        let whole = translate(&mesh, &[alpha]).into_topology().unwrap().0;
        let stripped = translate(&mesh, &[slim]).into_topology().unwrap().0;
        assert!(whole.snapshot == stripped.snapshot);
        assert!(whole.snapshot.workloads().count() > 3);
    }
}
