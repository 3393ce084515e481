//! The wire format: field numbers proven with hand-built bytes, and lossless round trips.

use std::path::PathBuf;

use ferry_xds::convert::{Decoded, decode_address, decode_authorization};
use ferry_xds::resources::ResourceSet;

/// A length-delimited field.
fn ld(field: u32, bytes: &[u8]) -> Vec<u8> {
    let mut v = varint(u64::from(field << 3 | 2));
    v.extend(varint(bytes.len() as u64));
    v.extend_from_slice(bytes);
    v
}

/// A varint field.
fn vi(field: u32, value: u64) -> Vec<u8> {
    let mut v = varint(u64::from(field << 3));
    v.extend(varint(value));
    v
}

fn varint(mut x: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (x & 0x7f) as u8;
        x >>= 7;
        if x == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

#[test]
fn a_workload_built_byte_by_byte_decodes_with_istios_field_numbers() {
    let uid = "east//v1/Pod/default/sleep-1";
    let mut w = Vec::new();
    w.extend(ld(20, uid.as_bytes())); // uid
    w.extend(ld(1, b"sleep-1")); // name
    w.extend(ld(2, b"default")); // namespace
    w.extend(ld(3, &[198, 18, 1, 10])); // addresses
    w.extend(ld(4, b"net-east")); // network
    w.extend(vi(5, 1)); // tunnel_protocol = HBONE
    w.extend(ld(6, b"cluster.local")); // trust_domain
    w.extend(ld(7, b"sleep")); // service_account
    w.extend(ld(9, b"east-1")); // node
    w.extend(vi(17, 1)); // status = UNHEALTHY
    w.extend(ld(18, b"east")); // cluster_id
    w.extend(ld(24, &[ld(1, b"us-east"), ld(2, b"us-east-1a")].concat())); // locality
    w.extend(ld(27, &vi(1, 3))); // capacity (UInt32Value)
    // services: map<string, PortList> = repeated entry { key = 1, value = 2 }
    let port = [vi(1, 80), vi(2, 8080)].concat();
    let entry = [
        ld(1, b"default/echo.default.svc.cluster.local"),
        ld(2, &ld(1, &port)),
    ]
    .concat();
    w.extend(ld(22, &entry));
    let address = ld(1, &w); // Address.workload
    let Decoded::Workload(d) = decode_address(uid, &address).expect("decodes") else {
        panic!("a workload")
    };
    assert_eq!(d.uid.as_str(), uid);
    assert_eq!(
        (
            d.name.as_str(),
            d.namespace.as_str(),
            d.service_account.as_str()
        ),
        ("sleep-1", "default", "sleep")
    );
    assert_eq!(
        d.addresses,
        ["198.18.1.10".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        (
            d.network.as_str(),
            d.cluster.as_str(),
            d.node.as_ref().unwrap().as_str()
        ),
        ("net-east", "east", "east-1")
    );
    assert_eq!(d.tunnel, ferry_core::model::TunnelProtocol::Hbone);
    assert_eq!(d.health, ferry_core::model::Health::Unhealthy);
    assert_eq!(d.capacity, 3);
    assert_eq!(d.locality.zone, "us-east-1a");
    let key = ferry_core::model::ServiceKey::new("default", "echo.default.svc.cluster.local");
    assert_eq!(d.target_port(&key, 80), Some(8080));
}

#[test]
fn a_policy_built_byte_by_byte_decodes() {
    let m = [ld(3, &ld(2, b"cluster.local/ns/default/")), vi(9, 8080)].concat(); // principals prefix, port
    let rule = ld(1, &ld(2, &m)); // Rule.clauses[0].matches[0]
    let p = [
        ld(1, b"allow-sleep"),
        ld(2, b"default"),
        vi(3, 1),
        vi(4, 1),
        ld(5, &rule),
    ]
    .concat();
    let d = decode_authorization("default/allow-sleep", &p).expect("decodes");
    assert_eq!(d.scope, ferry_core::model::PolicyScope::Namespace);
    assert_eq!(d.action, ferry_core::model::Action::Deny);
    let m = &d.rules[0].clauses[0].matches[0];
    assert_eq!(
        m.principals,
        [ferry_core::model::StringMatch::Prefix(
            "cluster.local/ns/default/".into()
        )]
    );
    assert_eq!(m.destination_ports, [8080]);
}

#[test]
fn every_example_survives_the_wire_unchanged() {
    for name in [
        "single-cluster.yaml",
        "two-clusters.yaml",
        "flat-network.yaml",
        // HTTP policy matches (methods, paths, headers) and HTTP routes ride Ferry's extension
        // fields.
        "lab.yaml",
        "overlap.yaml",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name);
        let snap = ferry_topology::load_file(&path).unwrap().snapshot;
        let set = ResourceSet::from_snapshot(&snap);
        let mut held = ferry_xds::assemble::Held::default();
        for (n, v) in &set.by_type[ferry_api::ADDRESS_TYPE] {
            held.addresses
                .insert(n.clone(), decode_address(n, &v.body).unwrap());
        }
        for (n, v) in &set.by_type[ferry_api::AUTHORIZATION_TYPE] {
            held.policies.insert(
                n.clone(),
                std::sync::Arc::new(decode_authorization(n, &v.body).unwrap()),
            );
        }
        let (back, rejected) = ferry_xds::assemble::assemble(&held, 1);
        let back = back.expect("a snapshot");
        assert!(rejected.is_empty(), "{name}: {rejected:?}");
        for w in snap.workloads() {
            // Labels ride Ferry's `ferry_labels` (route subsets select by them).
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
        let again = ResourceSet::from_snapshot(&snap);
        assert_eq!(set.by_type, again.by_type);
    }
}

#[test]
fn garbage_never_panics_and_is_named() {
    for bytes in [&b""[..], b"\xff\xff\xff", b"\x0a\x05hello", &[0x0a, 0x80]] {
        let _ = decode_address("x", bytes);
        if let Err(e) = decode_authorization("ns/x", bytes) {
            assert!(e.to_string().starts_with("ns/x: "));
        }
    }
}

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
    let set = ResourceSet::from_snapshot(snap);
    let mut held = ferry_xds::assemble::Held::default();
    for (n, v) in &set.by_type[ferry_api::ADDRESS_TYPE] {
        held.addresses
            .insert(n.clone(), decode_address(n, &v.body).unwrap());
    }
    ferry_xds::assemble::assemble(&held, 1)
        .0
        .expect("a snapshot")
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

#[test]
fn versions_do_not_depend_on_map_order() {
    let mut m = ferry_core::testing::MeshBuilder::new();
    m.cluster("c", "net").node("n", "c", "r/z/s");
    m.pod("w", "n", "198.18.1.1");
    for i in 0..8 {
        m.service(
            &format!("s{i}"),
            &[("net", &format!("198.18.100.{}", i + 1))],
            80,
            8080,
        );
        m.backs("w", &format!("s{i}"));
    }
    let snap = m.build();
    let versions: Vec<_> = (0..16)
        .map(|_| ResourceSet::from_snapshot(&snap).by_type[ferry_api::ADDRESS_TYPE]["c//v1/Pod/default/w"].version.clone())
        .collect();
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
}
