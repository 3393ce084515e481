//! What a connection's metrics say about its ends, derived as Istio derives it: a workload's
//! canonical service and revision, and the service a destination believes it was reached
//! through.
//!
//! Telemetry only: nothing here is an input to a routing or authorization decision.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{Service, Workload};
use crate::snapshot::Snapshot;

/// The labels that name a workload's canonical service, first present wins (Istio's
/// `pkg/config/labels`): Istio's own, Kubernetes' recommended one, then `app`.
pub const CANONICAL_NAME_LABELS: [&str; 3] = [
    "service.istio.io/canonical-name",
    "app.kubernetes.io/name",
    "app",
];

/// The labels that name a workload's canonical revision, first present wins.
pub const CANONICAL_REVISION_LABELS: [&str; 3] = [
    "service.istio.io/canonical-revision",
    "app.kubernetes.io/version",
    "version",
];

/// The revision of a workload none of [`CANONICAL_REVISION_LABELS`] names.
pub const DEFAULT_REVISION: &str = "latest";

/// A workload's canonical service: its name and revision (Istio's `source_canonical_service`,
/// `source_canonical_revision` and their `destination_` twins).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Canonical<'a> {
    pub service: &'a str,
    pub revision: &'a str,
}

/// The canonical service and revision of `w`: what the control plane sent (istiod's
/// `canonical_name` and `canonical_revision`), else derived from its labels and name as istiod
/// derives them.
pub fn canonical(w: &Workload) -> Canonical<'_> {
    Canonical {
        service: match w.canonical_name.as_str() {
            "" => canonical_name(&w.labels, &w.name),
            given => given,
        },
        revision: match w.canonical_revision.as_str() {
            "" => canonical_revision(&w.labels),
            given => given,
        },
    }
}

/// The canonical service name `labels` give, else `workload_name`. A label that is present
/// counts even when empty, as in Istio.
pub fn canonical_name<'a>(labels: &'a BTreeMap<String, String>, workload_name: &'a str) -> &'a str {
    first_label(labels, &CANONICAL_NAME_LABELS).unwrap_or(workload_name)
}

/// The canonical revision `labels` give, else [`DEFAULT_REVISION`].
pub fn canonical_revision(labels: &BTreeMap<String, String>) -> &str {
    first_label(labels, &CANONICAL_REVISION_LABELS).unwrap_or(DEFAULT_REVISION)
}

fn first_label<'a>(labels: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| labels.get(*k)).map(String::as_str)
}

/// The service a connection arriving at `dst` on `target_port` is counted under (Istio's
/// `destination_service*` at the destination, ztunnel's `guess_inbound_service`): among the
/// services `dst` backs (so a claim cannot name any other), the one `forwarded_host` names
/// (the CONNECT's `Forwarded: host=`), else the first whose port `dst` serves on
/// `target_port`. `None` when `dst` backs none that fits.
pub fn inbound_service<'s>(
    snap: &'s Snapshot,
    dst: &Workload,
    forwarded_host: Option<&str>,
    target_port: u16,
) -> Option<&'s Arc<Service>> {
    let backed = || dst.services.keys().filter_map(|k| snap.service(k));
    if let Some(host) = forwarded_host
        && let Some(named) = backed().find(|s| s.hostname == host)
    {
        return Some(named);
    }
    backed().find(|s| {
        let key = s.key();
        s.ports
            .iter()
            .any(|p| dst.serving_port(&key, p) == target_port)
    })
}

#[cfg(test)]
#[path = "telemetry_tests.rs"]
mod tests;
