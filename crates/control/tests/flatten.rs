//! Nested service addresses flattened by the control plane, as a node proxy decodes them.

use ferry_xds::assemble::{Held, assemble};
use ferry_xds::convert::decode_address;

fn nested_mesh(inner_scope: ferry_core::model::ServiceScope) -> ferry_core::snapshot::Snapshot {
    use ferry_core::model::{AddressEndpoint, NetworkAddress, PortMapping};
    let mut m = ferry_core::testing::MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "r/a/s")
        .node("west-1", "west", "r/b/s");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.service("catalog", &[("net", "198.18.100.2")], 80, 9090)
        .scope = inner_scope;
    m.pod("catalog-east", "east-1", "198.18.1.30");
    m.backs("catalog-east", "catalog");
    m.service("catalog-mc", &[("net", "198.18.100.3")], 8080, 80)
        .address_endpoints
        .push(AddressEndpoint {
            address: NetworkAddress::new("net".into(), "198.18.100.2".parse().unwrap()),
            cluster: "east".into(),
            ports: vec![PortMapping {
                service_port: 8080,
                target_port: 80,
            }],
        });
    m.build()
}

fn over_the_wire(snap: &ferry_core::snapshot::Snapshot) -> ferry_core::snapshot::Snapshot {
    let set = ferry_control::flatten::resource_set(snap);
    let mut held = Held::default();
    for (n, v) in &set.by_type[ferry_api::ADDRESS_TYPE] {
        held.addresses
            .insert(n.as_str().into(), decode_address(n, &v.body).unwrap());
    }
    assemble(&held, 1).0.expect("a snapshot")
}

fn route_to_mc(snap: &ferry_core::snapshot::Snapshot) -> ferry_core::route::Decision {
    let src = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .clone();
    let dst = ferry_core::route::Destination::Addr("198.18.100.3:8080".parse().unwrap());
    ferry_core::route::route(
        snap,
        ferry_core::route::Source::new(&src),
        &dst,
        &mut ferry_core::random::SplitMix64::new(1),
    )
}

#[test]
fn a_global_inner_service_is_flattened_into_direct_endpoints() {
    let snap = nested_mesh(ferry_core::model::ServiceScope::global());
    let node = over_the_wire(&snap);
    let mc = node
        .services()
        .find(|s| s.name == "catalog-mc")
        .unwrap()
        .clone();
    assert!(
        mc.address_endpoints.is_empty(),
        "the nested address is resolved by the control plane"
    );
    let d = route_to_mc(&node);
    let plan = d.outcome.as_ref().unwrap();
    assert_eq!(
        plan.landing.as_ref().unwrap().as_str(),
        "east//v1/Pod/default/catalog-east"
    );
    assert_eq!(plan.landing_port, 9090, "8080 -> 80 -> 9090, composed");
    assert!(
        !d.steps
            .iter()
            .any(|s| matches!(s, ferry_core::route::Step::Nested { .. }))
    );
    // The same landing as the nested form decides.
    let nested = route_to_mc(&snap);
    assert_eq!(nested.outcome.as_ref().unwrap().landing, plan.landing);
    assert_eq!(
        nested.outcome.as_ref().unwrap().landing_port,
        plan.landing_port
    );
}

#[test]
fn a_local_inner_service_stays_nested() {
    let node = over_the_wire(&nested_mesh(ferry_core::model::ServiceScope::local()));
    let mc = node
        .services()
        .find(|s| s.name == "catalog-mc")
        .unwrap()
        .clone();
    assert_eq!(
        mc.address_endpoints.len(),
        1,
        "flattening would drop the inner scope"
    );
    let d = route_to_mc(&node);
    assert!(
        d.steps
            .iter()
            .any(|s| matches!(s, ferry_core::route::Step::Nested { .. }))
    );
    assert_eq!(
        d.outcome.unwrap().landing.unwrap().as_str(),
        "east//v1/Pod/default/catalog-east"
    );
}

/// What the control plane serves for every example (flattened where safe) decodes on a node to
/// the same mesh: none of the examples nests a service address that flattening would change.
#[test]
fn every_example_is_served_unchanged() {
    use ferry_xds::convert::decode_authorization;
    // Every file in examples/, so that a new example is covered without being listed here
    // (HTTP policy matches and routes ride Ferry's extension fields: lab.yaml has them).
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut examples: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    examples.sort();
    for want in ["lab.yaml", "overlap.yaml", "waypoint-across-networks.yaml"] {
        assert!(
            examples.iter().any(|p| p.ends_with(want)),
            "{want} not found in {dir:?}"
        );
    }
    for path in examples {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let snap = ferry_topology::load_file(&path).unwrap().snapshot;
        let set = ferry_control::flatten::resource_set(&snap);
        let mut held = Held::default();
        for (n, v) in &set.by_type[ferry_api::ADDRESS_TYPE] {
            held.addresses
                .insert(n.as_str().into(), decode_address(n, &v.body).unwrap());
        }
        for (n, v) in &set.by_type[ferry_api::AUTHORIZATION_TYPE] {
            held.policies.insert(
                n.clone(),
                std::sync::Arc::new(decode_authorization(n, &v.body).unwrap()),
            );
        }
        let (back, rejected) = assemble(&held, 1);
        let back = back.expect("a snapshot");
        assert!(rejected.is_empty(), "{name}: {rejected:?}");
        for w in snap.workloads() {
            assert_eq!(**back.workload(&w.uid).unwrap(), **w, "{name}: {}", w.uid);
        }
        for s in snap.services() {
            assert_eq!(
                **back.service(&s.key()).unwrap(),
                **s,
                "{name}: {}",
                s.key()
            );
        }
        for p in snap.policies() {
            assert_eq!(**back.policy(&p.key()).unwrap(), **p, "{name}: {}", p.key());
        }
        assert_eq!(back.gateways().count(), snap.gateways().count());
        // The same content always has the same version.
        let again = ferry_control::flatten::resource_set(&snap);
        assert_eq!(set.by_type, again.by_type);
    }
}
