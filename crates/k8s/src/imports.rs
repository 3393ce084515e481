//! The `ServiceImport`s that keep the cluster-set addresses Ferry allocated
//! ([`crate::translate::mcs`]), written with server-side apply (field manager `ferry`) and
//! deleted once their service is no longer exported. A write that fails is logged and tried
//! again after the next translation (the translation asks again while the objects differ).

use std::collections::BTreeMap;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};

use crate::translate::mcs::ImportWrite;

/// Writes or deletes every import of `wanted` (`(cluster, namespace, name)`); `clients` by
/// cluster ID.
pub(crate) async fn write(
    clients: &BTreeMap<String, kube::Client>,
    wanted: &BTreeMap<(String, String, String), Option<ImportWrite>>,
) {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ServiceImport",
    ));
    for ((cluster, ns, name), import) in wanted {
        let Some(client) = clients.get(cluster) else {
            continue;
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let result = match import {
            Some(i) => {
                let params = PatchParams::apply("ferry").force();
                api.patch(name, &params, &Patch::Apply(i.object(ns, name)))
                    .await
                    .map(|_| "kept the allocated cluster-set address in the ServiceImport")
            }
            None => api
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| "deleted the ServiceImport of a service no longer exported"),
        };
        match result {
            Ok(what) => tracing::info!(cluster = %cluster, namespace = %ns, name = %name, "{what}"),
            Err(e) => {
                tracing::warn!(cluster = %cluster, namespace = %ns, name = %name, error = %e, "could not write the ServiceImport; will try again");
            }
        }
    }
}
