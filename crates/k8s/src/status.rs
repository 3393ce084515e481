//! The MCS API's `Conflict` condition, written back to each `ServiceExport`'s status (as the
//! Multi-Cluster Services API asks of an implementation), only when it changed. A write that
//! fails is logged and tried again after the next translation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

/// `(cluster, namespace, name)` of a `ServiceExport`.
pub(crate) type ExportKey = (String, String, String);

/// The conditions written so far.
#[derive(Debug, Default)]
pub(crate) struct ExportStatus {
    written: BTreeMap<ExportKey, Option<String>>,
}

impl ExportStatus {
    /// Writes every condition of `desired` that differs from what was written; `clients` by
    /// cluster ID.
    pub(crate) async fn write(
        &mut self,
        clients: &BTreeMap<String, kube::Client>,
        desired: &BTreeMap<ExportKey, Option<String>>,
    ) {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "multicluster.x-k8s.io",
            "v1alpha1",
            "ServiceExport",
        ));
        for (key, conflict) in desired {
            if self.written.get(key) == Some(conflict) {
                continue;
            }
            let (cluster, ns, name) = key;
            let Some(client) = clients.get(cluster) else {
                continue;
            };
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            let patch =
                serde_json::json!({"status": {"conditions": [condition(conflict.as_deref())]}});
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.written.insert(key.clone(), conflict.clone());
                }
                Err(e) => {
                    tracing::warn!(cluster = %cluster, namespace = %ns, name = %name, error = %e, "could not write the ServiceExport's Conflict condition; will try again");
                }
            }
        }
        // Exports that are gone need nothing more.
        self.written.retain(|k, _| desired.contains_key(k));
    }
}

/// The `Conflict` condition for `conflict` (its message), or its absence.
fn condition(conflict: Option<&str>) -> serde_json::Value {
    let c = Condition {
        type_: "Conflict".into(),
        status: if conflict.is_some() { "True" } else { "False" }.into(),
        reason: if conflict.is_some() {
            "ConflictFound"
        } else {
            "NoConflicts"
        }
        .into(),
        message: conflict.unwrap_or_default().into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    };
    serde_json::to_value(c).unwrap_or_default()
}
