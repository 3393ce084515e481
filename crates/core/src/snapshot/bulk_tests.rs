use super::*;
use crate::model::{
    Action, GatewayDestination, GatewayRef, Policy, PolicyKey, PolicyScope, WaypointFor,
};
use crate::snapshot::SnapshotError;
use crate::testing::{MeshBuilder, key, waypoint_ref};

/// Two clusters on two networks with an east-west gateway each, three nodes, four services
/// (one a waypoint), a workload-selector policy; `pods` pods spread over the nodes, each
/// backing a service, every fifth selected by the policy and every seventh with a waypoint.
fn mesh(pods: usize) -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("n0", "east", "r0/z0/").node("n1", "east", "r0/z1/");
    m.node("n2", "west", "r1/z0/");
    m.gateway("gw-east", "east", "198.19.255.1");
    m.gateway("gw-west", "west", "198.19.255.2");
    for s in 0..3 {
        m.service(
            &format!("svc{s}"),
            &[("net-east", &format!("198.19.0.{s}"))],
            80,
            8080,
        );
    }
    m.waypoint("wp", WaypointFor::Workload);
    m.waypoint_pod("wp", "wp-0", "n0", "198.19.1.1");
    m.policy(Policy {
        name: "selected".into(),
        namespace: "default".into(),
        scope: PolicyScope::WorkloadSelector,
        action: Action::Allow,
        rules: vec![],
        dry_run: false,
    });
    for i in 0..pods {
        let name = format!("pod{i}");
        let w = m.pod(
            &name,
            &format!("n{}", i % 3),
            &format!("198.18.{}.{}", i / 250, i % 250),
        );
        if i % 5 == 0 {
            w.authorization_policies = vec![PolicyKey::new("default", "selected")];
        }
        if i % 7 == 0 {
            w.waypoint = Some(waypoint_ref("wp"));
        }
        m.backs(&name, &format!("svc{}", i % 3));
    }
    m
}

/// The bulk build on one thread and on two, and the build one object at a time.
fn builds(m: &MeshBuilder) -> [Option<Result<Snapshot, SnapshotError>>; 3] {
    let b = m.builder();
    [
        b.bulk(usize::MAX).map(Ok),
        b.bulk(0).map(Ok),
        Some(b.build_one_by_one()),
    ]
}

#[test]
fn a_valid_set_builds_in_bulk_on_one_thread_or_two_to_what_one_by_one_builds() {
    for pods in [0, 1, 40, 600] {
        let m = mesh(pods);
        let [one_thread, two, one_by_one] = builds(&m);
        let one_by_one = one_by_one.expect("built").expect("a valid mesh");
        assert_eq!(one_by_one.workloads().count(), pods + 1);
        assert_eq!(one_thread.expect("valid").as_ref(), Ok(&one_by_one));
        assert_eq!(two.expect("valid").as_ref(), Ok(&one_by_one));
        assert_eq!(m.builder().build().as_ref(), Ok(&one_by_one));
    }
}

#[test]
fn a_set_that_breaks_an_invariant_is_built_one_by_one_to_name_the_first_broken() {
    type Break = fn(&mut MeshBuilder);
    let breaks: [(&str, Break); 13] = [
        ("a service's VIP taken by another service", |m| {
            m.services[1].vips = m.services[0].vips.clone();
        }),
        ("a service's VIP listed twice", |m| {
            let vip = m.services[2].vips[0].clone();
            m.services[2].vips.push(vip);
        }),
        ("a service's VIP that is a workload's address", |m| {
            // pod0, on n0 in the east.
            let ip = m.workloads[1].addresses[0];
            m.services[0].vips = vec![crate::model::NetworkAddress {
                network: "net-east".into(),
                ip,
            }];
        }),
        ("an address taken twice", |m| {
            // pod0 and pod3, both on n0.
            m.workloads[4].addresses = m.workloads[1].addresses.clone();
        }),
        ("a service's address", |m| {
            m.workloads[4].addresses = vec![crate::testing::ip("198.19.0.1")];
        }),
        ("a uid twice", |m| {
            let mut w = m.workloads[6].clone();
            w.addresses = vec![crate::testing::ip("198.18.200.1")];
            m.workloads.push(w);
        }),
        ("a node that does not exist", |m| {
            m.workloads[5].node = Some("nowhere".into());
        }),
        ("a node of another cluster", |m| {
            let w = &mut m.workloads[9];
            w.cluster = "west".into();
            w.network = "net-west".into();
            w.node = Some("n0".into());
        }),
        ("a service that does not exist", |m| {
            m.workloads[10]
                .services
                .make_mut()
                .insert(key("nope"), vec![]);
        }),
        ("a policy that does not exist", |m| {
            m.workloads[11].authorization_policies = vec![PolicyKey::new("default", "nope")];
        }),
        ("another network than its cluster's", |m| {
            // pod15, on n0 in the east.
            m.workloads[16].network = "net-west".into();
        }),
        ("an invalid identity", |m| {
            m.workloads[13].service_account = String::new();
        }),
        ("a waypoint that resolves to nothing", |m| {
            m.workloads[14].waypoint = Some(GatewayRef {
                destination: GatewayDestination::Service(key("nope")),
                hbone_port: 15008,
            });
        }),
    ];
    for (what, break_it) in breaks {
        let mut m = mesh(40);
        break_it(&mut m);
        let [one_thread, two, one_by_one] = builds(&m);
        assert!(
            one_thread.is_none() && two.is_none(),
            "{what}: built in bulk"
        );
        let err = one_by_one.expect("built").expect_err(what);
        assert_eq!(m.builder().build().expect_err(what), err, "{what}");
    }
}
