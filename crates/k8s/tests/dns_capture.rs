//! DNS from Kubernetes: a pod opts into its node proxy's DNS proxy with Istio's annotation
//! `ambient.istio.io/dns-capture: "true"`, and the names its queries resolve follow the
//! cluster-set: an exported service that runs only in another cluster resolves under its
//! `clusterset.local` name; a service that is not exported, in another cluster, does not.

use ferry_core::dns::{MeshName, lookup};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, translate};

fn cluster(name: &str, extra: &str) -> ClusterObjects {
    ferry_k8s::fixtures::cluster(name, extra).0
}

const BETA: &str = "\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: inventory, namespace: default}
    spec: {clusterIP: 198.18.11.40, ports: [{port: 80, targetPort: 8080}], selector: {app: inventory}}
  - apiVersion: v1
    kind: Pod
    metadata: {name: inventory-beta, namespace: default, labels: {app: inventory}, annotations: {ambient.istio.io/redirection: enabled, ambient.istio.io/dns-capture: 'true'}}
    spec: {nodeName: beta-1, serviceAccountName: inventory, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.3.40, conditions: [{type: Ready, status: 'True'}]}
  - apiVersion: multicluster.x-k8s.io/v1alpha1
    kind: ServiceExport
    metadata: {name: inventory, namespace: default}
  - apiVersion: v1
    kind: Service
    metadata: {name: vault, namespace: default}
    spec: {clusterIP: 198.18.11.41, ports: [{port: 80, targetPort: 8080}], selector: {app: vault}}
  - apiVersion: v1
    kind: Pod
    metadata: {name: vault-beta, namespace: default, labels: {app: vault}, annotations: {ambient.istio.io/redirection: enabled, ambient.istio.io/dns-capture: 'false'}}
    spec: {nodeName: beta-1, serviceAccountName: vault, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.3.41, conditions: [{type: Ready, status: 'True'}]}
  - apiVersion: v1
    kind: Pod
    metadata: {name: unredirected, namespace: default, labels: {app: other}, annotations: {ambient.istio.io/dns-capture: 'true'}}
    spec: {nodeName: beta-1, serviceAccountName: other, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.3.42, conditions: [{type: Ready, status: 'True'}]}
";

fn mesh() -> Snapshot {
    let config = MeshConfig {
        clusterset_cidr: ("198.18.250.0".parse().unwrap(), 24),
        ..MeshConfig::default()
    };
    let (t, _) = translate(&config, &[cluster("alpha", ""), cluster("beta", BETA)])
        .into_topology()
        .unwrap_or_else(|e| panic!("valid: {e}"));
    t.snapshot
}

#[test]
fn istios_annotation_opts_a_pod_in_the_mesh_into_dns_capture() {
    let snap = mesh();
    let capture = |name: &str| {
        snap.workloads()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("{name}"))
            .dns_capture
    };
    assert!(capture("inventory-beta"));
    assert!(!capture("vault-beta"), "\"false\"");
    assert!(!capture("sleep"), "no annotation: off");
    assert!(
        !capture("unredirected"),
        "not in the mesh: nothing of its own is captured"
    );
}

#[test]
fn an_exported_remote_service_resolves_by_its_clusterset_name_and_an_unexported_one_does_not() {
    let snap = mesh();
    let sleep = snap.workloads().find(|w| w.name == "sleep").expect("sleep");
    assert_eq!(sleep.cluster.as_str(), "alpha");
    match lookup(&snap, sleep, "inventory.default.svc.clusterset.local.") {
        MeshName::Resolves(a) => assert_eq!(a.len(), 1, "its ClusterSetIP: {a:?}"),
        other => panic!("the exported service exists only remotely and resolves: {other:?}"),
    }
    assert_eq!(
        lookup(&snap, sleep, "vault.default.svc.cluster.local."),
        MeshName::Hidden,
        "beta's service, not exported, is not alpha's"
    );
    let vault = snap
        .workloads()
        .find(|w| w.name == "vault-beta")
        .expect("vault");
    assert!(matches!(
        lookup(&snap, vault, "vault.default.svc.cluster.local."),
        MeshName::Resolves(_)
    ));
}
