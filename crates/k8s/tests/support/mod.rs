//! What the fixture tests share: the two-cluster fixtures with extra objects, translated.

use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};

/// Cluster `name` of the fixtures with the objects of `extra` (YAML), and the notes of both.
pub(crate) fn cluster(name: &str, extra: &str) -> (ClusterObjects, Vec<Note>) {
    ferry_k8s::fixtures::cluster(name, extra)
}

/// The two clusters, each with its extra objects, translated; every note on the way.
pub(crate) fn mesh(alpha_extra: &str, beta_extra: &str) -> (Snapshot, Vec<Note>) {
    let (a, mut notes) = cluster("alpha", alpha_extra);
    let (b, more) = cluster("beta", beta_extra);
    notes.extend(more);
    let (t, n) = translate(&MeshConfig::default(), &[a, b])
        .into_topology()
        .unwrap_or_else(|e| panic!("a mesh despite the bad objects: {e}"));
    notes.extend(n);
    (t.snapshot, notes)
}
