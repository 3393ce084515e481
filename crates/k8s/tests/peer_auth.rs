//! `PeerAuthentication` objects become what istiod sends ztunnel for them: the static STRICT
//! policy and converted port-level ones, listed on the workloads they govern.

use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};

fn cluster(name: &str, extra: &str) -> ClusterObjects {
    let (c, notes) = ferry_k8s::fixtures::cluster(name, extra);
    assert_eq!(notes, Vec::<Note>::new());
    c
}

fn mesh(alpha: &str, beta: &str) -> (Snapshot, Vec<Note>) {
    let (t, notes) = translate(
        &MeshConfig::default(),
        &[cluster("alpha", alpha), cluster("beta", beta)],
    )
    .into_topology()
    .unwrap_or_else(|e| panic!("valid: {e}"));
    let notes = notes
        .into_iter()
        .filter(|n| n.object.starts_with("PeerAuthentication"))
        .collect();
    (t.snapshot, notes)
}

fn peer_authentication(ns: &str, name: &str, created: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec: {spec}\n"
    )
}

fn listed(snap: &Snapshot, name: &str) -> Vec<String> {
    snap.workloads()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("{name}"))
        .authorization_policies
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_strict_mesh_with_an_open_workload_port_is_what_istiod_sends() {
    let strict_mesh = peer_authentication(
        "istio-system",
        "default",
        "2024-01-01T00:00:00Z",
        "{mtls: {mode: STRICT}}",
    );
    let echo_open = peer_authentication(
        "default",
        "echo-open",
        "2024-01-02T00:00:00Z",
        "{selector: {matchLabels: {app: echo}}, mtls: {mode: STRICT}, portLevelMtls: {\"9090\": {mode: PERMISSIVE}}}",
    );
    let root_selector = peer_authentication(
        "istio-system",
        "ignored",
        "2024-01-03T00:00:00Z",
        "{selector: {matchLabels: {app: sleep}}, mtls: {mode: PERMISSIVE}}",
    );
    let echo_other = peer_authentication(
        "default",
        "echo-open",
        "2024-01-02T00:00:00Z",
        "{selector: {matchLabels: {app: echo}}, mtls: {mode: PERMISSIVE}}",
    );
    let (snap, notes) = mesh(
        &format!("{strict_mesh}{echo_open}{root_selector}"),
        &format!("{strict_mesh}{echo_other}"),
    );
    // The identical mesh-wide copies are one; beta's differing copy and the root namespace's
    // selector are left out, each with a note.
    let said: Vec<(&str, &str)> = notes
        .iter()
        .map(|n| (n.object.as_str(), n.message.as_str()))
        .collect();
    assert_eq!(notes.len(), 2, "{said:?}");
    assert!(
        said.iter()
            .any(|(o, m)| *o == "PeerAuthentication default/echo-open"
                && m.contains("differs from cluster alpha's copy")),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|(o, m)| *o == "PeerAuthentication istio-system/ignored"
                && m.contains("root namespace")),
        "{said:?}"
    );
    let keys: Vec<String> = snap.policies().map(|p| p.key().to_string()).collect();
    assert!(
        keys.contains(&"istio-system/istio_converted_static_strict".to_string())
            && keys.contains(&"default/converted_peer_authentication_echo-open".to_string()),
        "{keys:?}"
    );
    // STRICT mesh-wide: every workload lists the static policy, echo's pods their converted
    // one instead, after their own policies (the fixture's deny-admin-port).
    assert_eq!(
        listed(&snap, "sleep"),
        ["istio-system/istio_converted_static_strict"]
    );
    for echo in ["echo-alpha-1", "echo-alpha-2"] {
        assert_eq!(
            listed(&snap, echo),
            [
                "default/deny-admin-port",
                "default/converted_peer_authentication_echo-open"
            ],
            "{echo}"
        );
    }
}

#[test]
fn the_oldest_namespace_wide_one_wins_and_bad_modes_are_left_out() {
    let older = peer_authentication(
        "default",
        "older",
        "2024-01-01T00:00:00Z",
        "{mtls: {mode: PERMISSIVE}}",
    );
    let newer = peer_authentication(
        "default",
        "a-newer",
        "2024-02-01T00:00:00Z",
        "{mtls: {mode: STRICT}}",
    );
    let bad = peer_authentication(
        "default",
        "bad",
        "2024-03-01T00:00:00Z",
        "{selector: {matchLabels: {app: sleep}}, mtls: {mode: STRICTEST}}",
    );
    let (snap, notes) = mesh(&format!("{newer}{older}{bad}"), "");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes
            .iter()
            .any(|n| n.object == "PeerAuthentication default/a-newer"
                && n.message.contains("the oldest wins"))
    );
    assert!(notes.iter().any(
        |n| n.object == "PeerAuthentication default/bad" && n.message.contains("\"STRICTEST\"")
    ));
    // The older (PERMISSIVE) decides: nothing strict to list.
    assert!(listed(&snap, "sleep").is_empty());
}
