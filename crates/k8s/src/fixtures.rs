//! The two-cluster fixtures the tests read (`tests/fixtures/two-clusters/<cluster>.yaml`,
//! written as `kubectl get -o yaml` prints them), in one place for every test file; and the
//! generated mesh the benchmarks serve ([`generated`]).

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

/// The objects of cluster `c` (named `c<c>`, of `clusters`) of a generated mesh of `pods` pods
/// and `services` services in all, spread evenly over the clusters: one node per 100 pods, 10
/// namespaces, each service global and selecting 10 pods, one ALLOW policy per service. The
/// addresses are data only (10.64-66.x.x pods, 10.96-98.x.x services); nothing is sent to them.
pub fn generated(
    c: usize,
    clusters: usize,
    pods: usize,
    services: usize,
) -> Vec<serde_json::Value> {
    use serde_json::json;
    let cluster = format!("c{c}");
    let mut out = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "istio-system", "labels": {"topology.istio.io/network": "flat"}}})];
    for ns in 0..10 {
        out.push(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("ns{ns}"), "labels": {"istio.io/dataplane-mode": "ambient"}}}));
    }
    let pods = pods / clusters;
    let services = services / clusters;
    for n in 0..pods.div_ceil(100) {
        out.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("{cluster}-node-{n}"), "labels": {"topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": format!("z{}", n % 3)}}}));
    }
    for p in 0..pods {
        let ip = format!("10.{}.{}.{}", 64 + c, p / 250, p % 250 + 1);
        out.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{p}"), "namespace": format!("ns{}", p % 10), "labels": {"app": format!("app-{}", (p / 10) % services.max(1))}, "annotations": {"ambient.istio.io/redirection": "enabled"}},
            "spec": {"nodeName": format!("{cluster}-node-{}", p / 100), "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x"}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}));
    }
    for s in 0..services {
        let ip = format!("10.{}.{}.{}", 96 + c, s / 250, s % 250 + 1);
        let ns = s % 10;
        out.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{s}"), "namespace": format!("ns{ns}"), "labels": {"istio.io/global": "true"}},
            "spec": {"clusterIP": ip, "ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": format!("app-{s}")}}}));
        out.push(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": format!("allow-{s}"), "namespace": format!("ns{ns}")},
            "spec": {"selector": {"matchLabels": {"app": format!("app-{s}")}}, "action": "ALLOW",
                     "rules": [{"from": [{"source": {"namespaces": [format!("ns{ns}")]}}], "to": [{"operation": {"ports": ["8080"]}}]}]}}));
    }
    out
}
