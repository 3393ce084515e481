//! A lab whose control plane reads recorded Kubernetes objects instead of the topology file
//! (`ferry lab up examples/mcs.yaml --kubernetes examples/kubernetes/mcs`): each cluster's
//! objects are served by an API server over the list/watch protocol in the control plane's
//! namespace, the local cluster by kubeconfig, the other by remote secret.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::Has::{Field, Text};
use crate::harness::{Lab, eventually};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// West exports `catalog`; east has no Service of that name, only the ServiceImport with its
/// ClusterSetIP. A pod in east reaches it there, through west's east-west gateway.
#[test]
fn a_remote_only_mcs_service_is_reached_at_its_clusterset_ip_through_the_gateway() {
    // What would make this pass without the recorded objects: the topology file the lab lays
    // out has no service at all, so 198.18.10.9 is nothing unless the control plane reads it
    // from east's ServiceImport.
    let topology = examples().join("mcs.yaml");
    let text = std::fs::read_to_string(&topology).unwrap();
    let file = ferry_topology::parse("mcs.yaml", &text).unwrap();
    assert_eq!(
        file.snapshot.services().count(),
        0,
        "mcs.yaml names no service"
    );
    let objects = examples().join("kubernetes/mcs");
    let Some(lab) = Lab::up_with_up_args(
        Some("mcs.yaml"),
        "fQ",
        &["--kubernetes", objects.to_str().unwrap()],
    ) else {
        return;
    };
    // The control plane reads both clusters from their API servers (east by kubeconfig, west
    // by remote secret) and serves what it translated.
    let mut debug = String::new();
    let mut status = serde_json::Value::Null;
    let synced = eventually(Duration::from_secs(10), || {
        debug = lab.admin_get("east-1", "198.19.254.1:15014", "/debug/kubernetes");
        status = debug
            .find('{')
            .and_then(|at| serde_json::from_str(&debug[at..]).ok())
            .unwrap_or(serde_json::Value::Null);
        ["east", "west"]
            .iter()
            .all(|c| status["clusters"][c]["synced"] == true)
    });
    assert!(synced, "both clusters synced, in {debug}");
    assert_eq!(status["notes"], serde_json::json!([]), "{status}");
    let r = lab
        .send("sleep-east", "198.18.10.9:80", "clusterset")
        .expect("catalog at its ClusterSetIP in east");
    assert!(
        r.starts_with("catalog-west-1 port 8080") && r.contains("clusterset"),
        "{r}"
    );
    // Through west's east-west gateway (double HBONE, by the cluster-set hostname), with
    // sleep's identity at the destination.
    lab.log_line(
        "gateway-eastwest-west",
        &[
            Field("direction", "gateway"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
            Field("dst.addr", "catalog.default.svc.clusterset.local:80"),
            Text("connection complete"),
        ],
    );
    lab.log_line(
        "west-1",
        &[
            Field("direction", "inbound"),
            Field("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
        ],
    );
}
