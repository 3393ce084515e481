//! The two-cluster fixtures the tests read (`tests/fixtures/two-clusters/<cluster>.yaml`,
//! written as `kubectl get -o yaml` prints them), in one place for every test file.

use crate::{ClusterObjects, Note};

/// The text of cluster `name`'s fixture.
pub fn two_clusters(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/two-clusters/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// Cluster `name` of the fixtures with the objects of `extra` (YAML), and the notes of both.
pub fn cluster(name: &str, extra: &str) -> (ClusterObjects, Vec<Note>) {
    let mut c = ClusterObjects::new(name);
    let mut notes = c
        .add_yaml("fixture", &two_clusters(name))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    notes.extend(
        c.add_yaml("extra", extra)
            .unwrap_or_else(|e| panic!("extra objects of {name}: {e}")),
    );
    (c, notes)
}
