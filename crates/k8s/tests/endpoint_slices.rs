//! A Service's EndpointSlices decide the state of the pods their endpoints name, over the
//! pods' own `Ready` condition: a terminating endpoint takes no new connection, one that is
//! not serving is unhealthy.

mod support;

use ferry_core::model::Health;
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Source, route};
use ferry_core::snapshot::Snapshot;
use support::{cluster, mesh};

/// alpha's slice of `echo`: echo-alpha-1 is draining (terminating, still serving), echo-alpha-2
/// is not serving; both pods' `Ready` is still `True` in the fixtures.
const ECHO_SLICE: &str = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-x7k2p
  namespace: default
  labels: {kubernetes.io/service-name: echo, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [198.18.1.20]
    conditions: {ready: false, serving: true, terminating: true}
    nodeName: alpha-1
    targetRef: {kind: Pod, namespace: default, name: echo-alpha-1, uid: 0000-echo-alpha-1}
  - addresses: [198.18.2.20]
    conditions: {ready: false, serving: false}
    nodeName: alpha-2
    targetRef: {kind: Pod, namespace: default, name: echo-alpha-2, uid: 0000-echo-alpha-2}
";

/// The workloads new connections from sleep to echo's address land on, over many seeds.
fn landings(snap: &Snapshot) -> Vec<String> {
    let sleep = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let echo = Destination::Addr("198.18.10.1:80".parse().unwrap());
    let mut out: Vec<String> = (0..64)
        .map(|seed| {
            let d = route(snap, Source::new(&sleep), &echo, &mut SplitMix64::new(seed));
            let landing = d.outcome.expect("a route").landing.expect("a landing");
            let w = snap.workloads().find(|w| w.uid == landing).unwrap();
            w.name.clone()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn health(snap: &Snapshot, name: &str) -> Health {
    snap.workloads().find(|w| w.name == name).unwrap().health
}

#[test]
fn a_terminating_endpoint_takes_no_new_connection_and_one_not_serving_is_unhealthy() {
    let (before, _) = mesh("", "");
    assert!(
        landings(&before).contains(&"echo-alpha-1".to_string()),
        "without the slice, echo-alpha-1 takes connections: {:?}",
        landings(&before)
    );

    let (alpha, _) = cluster("alpha", ECHO_SLICE);
    for name in ["echo-alpha-1", "echo-alpha-2"] {
        let pod = alpha
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap();
        let conditions = pod.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "{name}'s own Ready is still True"
        );
    }
    let (snap, notes) = mesh(ECHO_SLICE, "");
    assert_eq!(notes, Vec::new());
    assert_eq!(health(&snap, "echo-alpha-1"), Health::Terminating);
    assert_eq!(health(&snap, "echo-alpha-2"), Health::Unhealthy);
    assert_eq!(
        health(&snap, "echo-beta"),
        Health::Healthy,
        "beta's pods have no slice: their own Ready"
    );
    assert_eq!(landings(&snap), ["echo-beta"]);
}
