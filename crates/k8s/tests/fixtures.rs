//! A two-cluster mesh described only as Kubernetes objects (as `kubectl get -o yaml` prints
//! them) decides like the same mesh written as a topology file.

use std::path::PathBuf;

use ferry_core::authz::{ConnInfo, authorize};
use ferry_core::identity::Identity;
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, route};
use ferry_core::snapshot::Snapshot;
use ferry_k8s::{ClusterObjects, MeshConfig, Note, translate};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-clusters")
}

fn cluster(name: &str) -> ClusterObjects {
    let path = fixtures().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    let mut c = ClusterObjects::new(name);
    let notes = c
        .add_yaml(&path.display().to_string(), &text)
        .expect("yaml");
    assert_eq!(notes, Vec::<Note>::new(), "every fixture object decodes");
    c
}

fn from_kubernetes(clusters: &[ClusterObjects]) -> (Snapshot, Vec<Note>) {
    let (t, notes) = translate(&MeshConfig::default(), clusters)
        .into_topology()
        .unwrap_or_else(|e| panic!("the translated mesh is valid: {e}"));
    (t.snapshot, notes)
}

fn from_file() -> Snapshot {
    ferry_topology::load_file(&fixtures().join("topology.yaml"))
        .expect("topology file")
        .snapshot
}

/// Every decision of `snap` for `src` to `dst`, over several seeds, as text.
fn decisions(snap: &Snapshot, src: &str, dst: &str) -> Vec<String> {
    let w = snap
        .workloads()
        .find(|w| w.name == src)
        .unwrap_or_else(|| panic!("no workload {src}"))
        .clone();
    let dst = Destination::Addr(dst.parse().expect("ip:port"));
    (0..16)
        .map(|seed| {
            let d = route(snap, Source::new(&w), &dst, &mut SplitMix64::new(seed));
            format!("{:?}", d.outcome)
        })
        .collect()
}

const SOURCES: &[&str] = &["sleep", "echo-beta", "audit-alpha", "legacy"];
const DESTINATIONS: &[&str] = &[
    "198.18.10.1:80",   // echo, global, prefer close, alpha's address
    "198.18.11.1:80",   // echo, beta's address
    "198.18.10.2:80",   // ledger, local
    "198.18.11.2:80",   // ledger, beta's address
    "198.18.10.5:80",   // audit, local, behind a global waypoint
    "198.18.3.30:8080", // ledger-beta's pod
    "198.18.1.20:9090", // echo-alpha-1's denied port
    "198.18.3.90:8080", // legacy, not in the mesh
    "198.18.2.50:15008",
];

#[test]
fn kubernetes_objects_route_like_the_topology_file() {
    let (k8s, notes) = from_kubernetes(&[cluster("beta"), cluster("alpha")]);
    assert_eq!(notes, Vec::<Note>::new());
    let file = from_file();
    for src in SOURCES {
        for dst in DESTINATIONS {
            assert_eq!(
                decisions(&k8s, src, dst),
                decisions(&file, src, dst),
                "{src} -> {dst}"
            );
        }
    }
}

#[test]
fn kubernetes_objects_authorize_like_the_topology_file() {
    let (k8s, _) = from_kubernetes(&[cluster("alpha"), cluster("beta")]);
    let file = from_file();
    let sleep = Identity::new("cluster.local", "default", "sleep").unwrap();
    let echo = Identity::new("cluster.local", "default", "echo").unwrap();
    let mut checked = 0;
    for dst in ["echo-alpha-1", "ledger-alpha", "ledger-beta", "audit-beta"] {
        for port in [8080, 9090] {
            for id in [&sleep, &echo] {
                let verdict = |snap: &Snapshot| {
                    let w = snap.workloads().find(|w| w.name == dst).unwrap();
                    let conn = ConnInfo {
                        source_identity: Some(id),
                        source_ip: "198.18.1.10".parse().unwrap(),
                        destination_ip: w.addresses[0],
                        destination_port: port,
                        via_waypoint: false,
                    };
                    format!("{:?}", authorize(snap, w, &conn))
                };
                assert_eq!(verdict(&k8s), verdict(&file), "{id} -> {dst}:{port}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 16);
}

#[test]
fn a_local_service_behind_a_global_waypoint_never_leaves_its_cluster() {
    // audit is local; its waypoint's only ready instance is in beta.
    let (k8s, _) = from_kubernetes(&[cluster("alpha"), cluster("beta")]);
    for d in decisions(&k8s, "sleep", "198.18.10.5:80") {
        assert!(d.starts_with("Err("), "fails rather than cross: {d}");
    }
    for d in decisions(&k8s, "echo-beta", "198.18.11.5:80") {
        assert!(
            d.contains("audit-waypoint-beta"),
            "beta's own waypoint: {d}"
        );
    }
}
