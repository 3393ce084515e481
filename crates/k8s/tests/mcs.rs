//! The Multi-Cluster Services API: exported services become cluster-set services reachable
//! from every cluster, in one hop, at a stable address, with conflicts reported.

use ferry_core::model::ServiceKey;
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, Step, route};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};

fn cluster(name: &str, extra: &str) -> ClusterObjects {
    let (c, notes) = ferry_k8s::fixtures::cluster(name, extra);
    assert_eq!(notes, Vec::<Note>::new());
    c
}

fn mesh(alpha: &str, beta: &str) -> (Snapshot, Vec<Note>) {
    let config = MeshConfig {
        clusterset_cidr: ("198.18.250.0".parse().unwrap(), 24),
        ..MeshConfig::default()
    };
    let (t, notes) = translate(&config, &[cluster("alpha", alpha), cluster("beta", beta)])
        .into_topology()
        .unwrap_or_else(|e| panic!("valid: {e}"));
    (t.snapshot, notes)
}

fn export(name: &str) -> String {
    format!(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {{name: {name}, namespace: default}}\n"
    )
}

fn clusterset(name: &str) -> ServiceKey {
    ServiceKey::new("default", format!("{name}.default.svc.clusterset.local"))
}

/// Landings of `src` connecting to the service's address on `port`, over several seeds, and
/// whether any decision took a second step through a nested address.
fn landings(snap: &Snapshot, src: &str, svc: &ServiceKey, port: u16) -> (Vec<String>, bool) {
    let w = snap.workloads().find(|w| w.name == src).unwrap().clone();
    let vip = snap.service(svc).expect("the cluster-set service").vips[0].ip;
    let dst = Destination::Addr(std::net::SocketAddr::new(vip, port));
    let mut out = Vec::new();
    let mut nested = false;
    for seed in 0..32 {
        let d = route(snap, Source::new(&w), &dst, &mut SplitMix64::new(seed));
        nested |= d.steps.iter().any(|s| matches!(s, Step::Nested { .. }));
        out.push(match d.outcome {
            Ok(p) => p.landing.map(|l| l.to_string()).unwrap_or_default(),
            Err(e) => format!("error: {e}"),
        });
    }
    out.sort();
    out.dedup();
    (out, nested)
}

#[test]
fn an_exported_service_is_one_cluster_set_service_landing_on_pods_in_one_hop() {
    let (snap, notes) = mesh(&export("ledger"), &export("ledger"));
    assert_eq!(notes, Vec::<Note>::new());
    let svc = snap.service(&clusterset("ledger")).expect("exported");
    let vip = svc.vips[0].ip.to_string();
    assert!(
        vip.starts_with("198.18.250."),
        "allocated from the range: {vip}"
    );
    let (landed, nested) = landings(&snap, "sleep", &clusterset("ledger"), 80);
    assert_eq!(
        landed,
        [
            "alpha//v1/Pod/default/ledger-alpha",
            "beta//v1/Pod/default/ledger-beta"
        ],
        "both clusters' pods, directly"
    );
    assert!(!nested, "one decision, one hop");
    // The per-cluster service keeps its own (local) scope.
    let (local, _) = landings(
        &snap,
        "sleep",
        &ServiceKey::new("default", "ledger.default.svc.cluster.local"),
        80,
    );
    assert_eq!(local, ["alpha//v1/Pod/default/ledger-alpha"]);
}

#[test]
fn a_service_exported_only_remotely_is_reachable_where_it_has_no_copy() {
    let inventory = "\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: inventory, namespace: default}
    spec: {clusterIP: 198.18.11.40, ports: [{port: 80, targetPort: 8080}], selector: {app: inventory}}
  - apiVersion: v1
    kind: Pod
    metadata: {name: inventory-beta, namespace: default, labels: {app: inventory}, annotations: {ambient.istio.io/redirection: enabled}}
    spec: {nodeName: beta-1, serviceAccountName: inventory, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.3.40, conditions: [{type: Ready, status: 'True'}]}
  - apiVersion: multicluster.x-k8s.io/v1alpha1
    kind: ServiceExport
    metadata: {name: inventory, namespace: default}
";
    let (snap, _) = mesh("", inventory);
    assert!(
        snap.service(&ServiceKey::new(
            "default",
            "inventory.default.svc.cluster.local"
        ))
        .is_some_and(|s| s.vips.len() == 1),
        "only beta has a copy"
    );
    let (landed, _) = landings(&snap, "sleep", &clusterset("inventory"), 80);
    assert_eq!(landed, ["beta//v1/Pod/default/inventory-beta"]);
}

#[test]
fn a_service_import_gives_the_address_and_the_same_objects_give_the_same_one() {
    let import = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: ledger, namespace: default}\nspec: {ips: [198.18.251.7], type: ClusterSetIP}\n";
    let (snap, _) = mesh(
        &format!("{}---\n{import}", export("ledger")),
        &export("ledger"),
    );
    let vips: Vec<String> = snap
        .service(&clusterset("ledger"))
        .unwrap()
        .vips
        .iter()
        .map(|v| v.ip.to_string())
        .collect();
    assert_eq!(
        vips,
        ["198.18.251.7"],
        "the import's address covers the flat network"
    );
    let (a, _) = mesh(&export("ledger"), &export("ledger"));
    let (b, _) = mesh(&export("ledger"), &export("ledger"));
    assert_eq!(
        a.service(&clusterset("ledger")).unwrap().vips,
        b.service(&clusterset("ledger")).unwrap().vips,
        "allocation is deterministic"
    );
}

#[test]
fn exports_that_disagree_on_ports_are_a_conflict_on_the_export() {
    let beta = format!(
        "{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: ledger, namespace: default}}\nspec: {{clusterIP: 198.18.11.2, ports: [{{port: 80, targetPort: 9999}}], selector: {{app: ledger}}}}\n",
        export("ledger")
    );
    let mut b = cluster("beta", "");
    b.services
        .retain(|s| s.metadata.name.as_deref() != Some("ledger"));
    b.add_yaml("extra", &beta).unwrap();
    let (_, notes) = translate(
        &MeshConfig::default(),
        &[cluster("alpha", &export("ledger")), b],
    )
    .into_topology()
    .unwrap();
    assert!(
        notes.iter().any(|n| n.cluster == "beta"
            && n.object == "ServiceExport default/ledger"
            && n.message
                .starts_with("Conflict: ports differ from cluster alpha's export")),
        "{notes:?}"
    );
}

#[test]
fn an_export_scope_narrows_the_cluster_set_service() {
    let beta = "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: ledger, namespace: default, annotations: {ferry.dev/scope: beta}}\n";
    let (snap, _) = mesh(&export("ledger"), beta);
    let (landed, _) = landings(&snap, "sleep", &clusterset("ledger"), 80);
    assert_eq!(
        landed,
        ["alpha//v1/Pod/default/ledger-alpha"],
        "beta's endpoints admit beta's sources only"
    );
    let (landed, _) = landings(&snap, "echo-beta", &clusterset("ledger"), 80);
    assert_eq!(
        landed,
        [
            "alpha//v1/Pod/default/ledger-alpha",
            "beta//v1/Pod/default/ledger-beta"
        ]
    );
}

#[test]
fn a_workload_waypoint_on_another_network_is_never_chosen() {
    // beta on a network of its own, with an east-west gateway, and the only instance of a
    // workload waypoint that alpha's echo-alpha-1 is attached to.
    let beta_extra = "\
apiVersion: v1
kind: List
items:
  - apiVersion: gateway.networking.k8s.io/v1
    kind: Gateway
    metadata: {name: wl-waypoint, namespace: default, labels: {istio.io/waypoint-for: workload}}
    spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
  - apiVersion: v1
    kind: Pod
    metadata: {name: wl-waypoint-beta, namespace: default, labels: {gateway.networking.k8s.io/gateway-name: wl-waypoint}, annotations: {ambient.istio.io/redirection: enabled}}
    spec: {nodeName: beta-1, serviceAccountName: wl-waypoint, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.3.55, conditions: [{type: Ready, status: 'True'}]}
  - apiVersion: gateway.networking.k8s.io/v1
    kind: Gateway
    metadata: {name: eastwest, namespace: istio-system}
    spec: {gatewayClassName: istio-east-west, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
    status: {addresses: [{type: IPAddress, value: 198.19.255.2}]}
";
    let mut alpha = cluster("alpha", "");
    // echo-alpha-1 uses the workload waypoint.
    for p in &mut alpha.pods {
        if p.metadata.name.as_deref() == Some("echo-alpha-1") {
            p.metadata
                .labels
                .get_or_insert_default()
                .insert("istio.io/use-waypoint".into(), "wl-waypoint".into());
        }
    }
    let mut beta = cluster("beta", beta_extra);
    beta.network = Some("far".into());
    let (t, _) = translate(&MeshConfig::default(), &[alpha, beta])
        .into_topology()
        .unwrap_or_else(|e| panic!("valid: {e}"));
    let snap = t.snapshot;
    let echo = snap.workloads().find(|w| w.name == "echo-alpha-1").unwrap();
    assert!(echo.waypoint.is_some(), "attached to the workload waypoint");
    let sleep = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let dst = Destination::Addr("198.18.1.20:8080".parse().unwrap());
    for seed in 0..16 {
        let d = route(&snap, Source::new(&sleep), &dst, &mut SplitMix64::new(seed));
        let text = format!("{:?}", d.outcome);
        assert!(
            !text.contains("wl-waypoint-beta"),
            "never the waypoint on beta's network: {text}"
        );
    }
}
