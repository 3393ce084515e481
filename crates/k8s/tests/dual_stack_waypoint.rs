//! A waypoint pod with an address of each family (`status.podIPs`) is an instance at both, so
//! it is reached in the family a connection came in on.

use std::net::IpAddr;

use ferry_k8s::{ClusterObjects, MeshConfig, translate};

fn cluster(name: &str, extra: &str) -> ClusterObjects {
    ferry_k8s::fixtures::cluster(name, extra).0
}

/// A second instance of the fixture's audit-waypoint, dual-stack.
const ALPHA: &str = "\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Pod
    metadata: {name: audit-waypoint-dual, namespace: default, uid: 0000-audit-waypoint-dual, labels: {gateway.networking.k8s.io/gateway-name: audit-waypoint}}
    spec: {nodeName: alpha-2, serviceAccountName: audit-waypoint, containers: [{name: app, image: x}]}
    status: {phase: Running, podIP: 198.18.2.51, podIPs: [{ip: 198.18.2.51}, {ip: '2001:2::2:51'}], conditions: [{type: Ready, status: 'True'}]}
";

#[test]
fn a_dual_stack_waypoint_pod_is_an_instance_at_both_addresses() {
    let (t, _) = translate(
        &MeshConfig::default(),
        &[cluster("alpha", ALPHA), cluster("beta", "")],
    )
    .into_topology()
    .unwrap_or_else(|e| panic!("valid: {e}"));
    let w = t
        .snapshot
        .workloads()
        .find(|w| w.name == "audit-waypoint-dual")
        .expect("the instance");
    let want: Vec<IpAddr> = vec![
        "198.18.2.51".parse().unwrap(),
        "2001:2::2:51".parse().unwrap(),
    ];
    assert_eq!(w.addresses, want);
    assert!(
        w.services
            .keys()
            .any(|k| k.hostname.starts_with("audit-waypoint.")),
        "backs the waypoint service: {:?}",
        w.services.keys().collect::<Vec<_>>()
    );
}
