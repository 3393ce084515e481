//! The recorded objects `ferry lab up examples/mcs.yaml --kubernetes examples/kubernetes/mcs`
//! serves to its control plane: they describe the lab's own pods, nodes and gateways, and
//! west's exported `catalog` is reached from east, which has no Service of that name, at its
//! ClusterSetIP through west's east-west gateway. (The lab e2e test `kubernetes::` runs it.)

use ferry_core::model::ServiceKey;
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, route};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};

fn examples() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn cluster(name: &str) -> ClusterObjects {
    let path = examples().join(format!("kubernetes/mcs/{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut c = ClusterObjects::new(name);
    let notes = c.add_yaml(name, &text).unwrap();
    assert_eq!(notes, Vec::<Note>::new());
    c
}

fn recorded() -> Snapshot {
    let (t, notes) = translate(&MeshConfig::default(), &[cluster("east"), cluster("west")])
        .into_topology()
        .unwrap_or_else(|e| panic!("valid: {e}"));
    assert_eq!(notes, Vec::<Note>::new());
    t.snapshot
}

/// What the lab lays out from the topology file and the control plane learns from the
/// objects agree: workloads (cluster, node, service account, addresses), nodes, gateways.
#[test]
fn the_recorded_objects_describe_the_labs_pods_nodes_and_gateways() {
    let text = std::fs::read_to_string(examples().join("mcs.yaml")).unwrap();
    let lab = ferry_topology::parse("mcs.yaml", &text).unwrap().snapshot;
    let k8s = recorded();
    let workloads = |s: &Snapshot| {
        let mut v: Vec<String> = s
            .workloads()
            .map(|w| {
                format!(
                    "{}/{} {} {:?} {} {:?} {}",
                    w.namespace,
                    w.name,
                    w.cluster,
                    w.node,
                    w.service_account,
                    w.addresses,
                    w.network
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(workloads(&k8s), workloads(&lab));
    let nodes = |s: &Snapshot| {
        s.nodes()
            .map(|n| format!("{} {}", n.name, n.cluster))
            .collect::<Vec<_>>()
    };
    assert_eq!(nodes(&k8s), nodes(&lab));
    let gateways = |s: &Snapshot| {
        s.gateways()
            .map(|g| format!("{} {} {}", g.name, g.network, g.address))
            .collect::<Vec<_>>()
    };
    assert_eq!(gateways(&k8s), gateways(&lab));
    // The topology file has no service: the mesh's services are the objects' alone.
    assert_eq!(lab.services().count(), 0);
}

#[test]
fn east_reaches_wests_exported_catalog_at_its_clusterset_ip_through_the_gateway() {
    let snap = recorded();
    let key = ServiceKey::new("default", "catalog.default.svc.clusterset.local");
    let svc = snap.service(&key).expect("the cluster-set service");
    let vips: Vec<String> = svc.vips.iter().map(|v| v.ip.to_string()).collect();
    assert!(vips.contains(&"198.18.10.9".to_string()), "{vips:?}");
    let sleep = snap
        .workloads()
        .find(|w| w.name == "sleep-east")
        .unwrap()
        .clone();
    let dst = Destination::Addr("198.18.10.9:80".parse().unwrap());
    for seed in 0..8 {
        let d = route(&snap, Source::new(&sleep), &dst, &mut SplitMix64::new(seed));
        let text = format!("{:?}", d.outcome);
        assert!(
            text.contains("eastwest-west") && text.contains("catalog.default.svc.clusterset.local"),
            "{text}"
        );
    }
}
