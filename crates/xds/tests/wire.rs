//! The wire format: field numbers proven with hand-built bytes, and lossless round trips.

mod common;

use common::{ld, vi};

use std::path::PathBuf;

use ferry_xds::convert::{Decoded, decode_address, decode_authorization};
use ferry_xds::resources::ResourceSet;

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
fn a_dual_stack_workload_s_addresses_are_4_and_16_bytes_both_ways() {
    let uid = "main//v1/Pod/default/echo";
    let v6: std::net::Ipv6Addr = "2001:2::2:20".parse().unwrap();
    let mut w = Vec::new();
    w.extend(ld(20, uid.as_bytes())); // uid
    w.extend(ld(1, b"echo"));
    w.extend(ld(2, b"default"));
    w.extend(ld(3, &[198, 18, 2, 20])); // addresses: IPv4, 4 bytes
    w.extend(ld(3, &v6.octets())); // addresses: IPv6, 16 bytes
    w.extend(ld(4, b"main-net"));
    w.extend(ld(6, b"cluster.local"));
    w.extend(ld(7, b"echo"));
    w.extend(ld(18, b"main"));
    let Decoded::Workload(d) = decode_address(uid, &ld(1, &w)).expect("decodes") else {
        panic!("a workload")
    };
    let want: Vec<std::net::IpAddr> = vec!["198.18.2.20".parse().unwrap(), v6.into()];
    assert_eq!(d.addresses, want);
    // And back: the example's dual-stack workloads and VIPs are encoded in the same 4 and 16
    // bytes (every_example_survives_the_wire_unchanged decodes them again).
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/dual-stack.yaml");
    let snap = ferry_topology::load_file(&path).unwrap().snapshot;
    let set = ResourceSet::encode(&snap);
    let (_, echo) = set.by_type[ferry_api::ADDRESS_TYPE]
        .iter()
        .find(|(n, _)| n.ends_with("/echo"))
        .expect("echo's resource");
    let body = &echo.body;
    let has = |bytes: &[u8]| body.windows(bytes.len()).any(|x| x == bytes);
    assert!(has(&ld(3, &[198, 18, 2, 20])), "the IPv4 address, 4 bytes");
    assert!(has(&ld(3, &v6.octets())), "the IPv6 address, 16 bytes");
    // A length that is neither is refused, naming it.
    let mut bad = w.clone();
    bad.extend(ld(3, &[1, 2, 3, 4, 5]));
    let err = decode_address(uid, &ld(1, &bad)).expect_err("5 bytes");
    assert!(err.to_string().contains("4 or 16 bytes, found 5"), "{err}");
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
    // Every file in examples/, so that a new example is covered without being listed here
    // (HTTP policy matches and routes ride Ferry's extension fields: lab.yaml has them).
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
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
        let set = ResourceSet::encode(&snap);
        let mut held = ferry_xds::assemble::Held::default();
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
        let again = ResourceSet::encode(&snap);
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
        .map(|_| {
            ResourceSet::encode(&snap).by_type[ferry_api::ADDRESS_TYPE]["c//v1/Pod/default/w"]
                .version
                .clone()
        })
        .collect();
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
}

/// The resource name of the service `service_with_lb` builds.
const NAME: &str = "default/web.default.svc.cluster.local";

/// A service with `load_balancing` (field 8) holding `lb`, as an Address.
fn service_with_lb(lb: &[u8]) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend(ld(1, b"web")); // name
    s.extend(ld(2, b"default")); // namespace
    s.extend(ld(3, b"web.default.svc.cluster.local")); // hostname
    s.extend(ld(8, lb));
    ld(2, &s) // Address.service
}

#[test]
fn graduated_failover_travels_in_ferry_failover_minimum() {
    use ferry_core::model::{FailoverMinimum, LbMode};
    // mode FAILOVER, routing_preference [ZONE], ferry_failover_minimum { percent: 60 }.
    let good = [vi(2, 2), vi(1, 2), ld(10000, &vi(2, 60))].concat();
    let Decoded::Service(s) =
        decode_address(NAME, &service_with_lb(&good)).unwrap_or_else(|e| panic!("{e}"))
    else {
        panic!("not a service");
    };
    let lb = s.load_balancing.as_ref().expect("load balancing");
    assert_eq!(lb.mode, LbMode::Failover);
    assert_eq!(lb.failover_minimum, Some(FailoverMinimum::Percent(60)));
    let endpoints = [vi(2, 2), ld(10000, &vi(1, 3))].concat();
    let Ok(Decoded::Service(s)) = decode_address(NAME, &service_with_lb(&endpoints)) else {
        panic!("not a service");
    };
    assert_eq!(
        s.load_balancing.as_ref().and_then(|lb| lb.failover_minimum),
        Some(FailoverMinimum::Endpoints(3))
    );
    // Rejected, each with a reason: outside FAILOVER, out of bounds, naming nothing.
    for (lb, why) in [
        (
            [vi(2, 1), ld(10000, &vi(1, 2))].concat(),
            "outside FAILOVER",
        ),
        (
            [vi(2, 2), ld(10000, &vi(2, 150))].concat(),
            "1 to 100 percent",
        ),
        (
            [vi(2, 2), ld(10000, &vi(1, 0))].concat(),
            "at least 1 endpoint",
        ),
        ([vi(2, 2), ld(10000, &[])].concat(), "names no minimum"),
    ] {
        match decode_address(NAME, &service_with_lb(&lb)) {
            Ok(_) => panic!("accepted a bad minimum ({why})"),
            Err(e) => assert!(e.to_string().contains(why), "{e}"),
        }
    }
}

#[test]
fn a_port_s_app_protocol_travels_in_istios_field_3_with_istios_values() {
    use ferry_core::model::AppProtocol;
    // ports (5): {service_port 80, target_port 8080, app_protocol}; GRPC = 3, HTTP2 = 2,
    // HTTP11 = 1, TCP = 4 and a value this build does not know: no HTTP, not refused.
    for (value, want) in [
        (3, AppProtocol::Grpc),
        (2, AppProtocol::Http2),
        (1, AppProtocol::Http11),
        (0, AppProtocol::Unknown),
        (4, AppProtocol::Unknown),
        (99, AppProtocol::Unknown),
    ] {
        let mut s = Vec::new();
        s.extend(ld(1, b"web"));
        s.extend(ld(2, b"default"));
        s.extend(ld(3, b"web.default.svc.cluster.local"));
        s.extend(ld(5, &[vi(1, 80), vi(2, 8080), vi(3, value)].concat()));
        let Ok(Decoded::Service(svc)) = decode_address(NAME, &ld(2, &s)) else {
            panic!("app_protocol {value}: not a service");
        };
        assert_eq!(svc.ports[0].app_protocol, want, "app_protocol {value}");
    }
    // And out: the lab's gRPC port (named `grpc`) as istiod sends it, GRPC in field 3.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab.yaml");
    let snap = ferry_topology::load_file(&path).unwrap().snapshot;
    let set = ResourceSet::encode(&snap);
    let audit = &set.by_type[ferry_api::ADDRESS_TYPE]["default/audit.default.svc.cluster.local"];
    let grpc_port = ld(5, &[vi(1, 82), vi(2, 50051), vi(3, 3)].concat());
    let plain_port = ld(5, &[vi(1, 81), vi(2, 8081)].concat());
    let body = &audit.body[..];
    let has = |part: &[u8]| body.windows(part.len()).any(|w| w == part);
    assert!(has(&grpc_port), "no GRPC port 82 in {body:?}");
    assert!(
        has(&plain_port),
        "port 81 carries an app_protocol: {body:?}"
    );
}

/// A workload `uid` with these labels entries, service map entries and locality occurrences
/// (each already a field's bytes), as one `Address`.
fn workload_with(uid: &str, fields: &[Vec<u8>]) -> Vec<u8> {
    let mut w = Vec::new();
    w.extend(ld(20, uid.as_bytes()));
    w.extend(ld(1, uid.as_bytes()));
    w.extend(ld(2, b"default"));
    w.extend(ld(3, &[198, 18, 1, 10]));
    w.extend(ld(4, b"net-east"));
    w.extend(ld(18, b"east"));
    for f in fields {
        w.extend_from_slice(f);
    }
    ld(1, &w)
}

fn label(k: &str, v: &str) -> Vec<u8> {
    ld(10001, &[ld(1, k.as_bytes()), ld(2, v.as_bytes())].concat())
}

fn backs(service: &str, port: u64) -> Vec<u8> {
    let ports = ld(1, &[vi(1, port), vi(2, 8080)].concat());
    ld(22, &[ld(1, service.as_bytes()), ld(2, &ports)].concat())
}

fn workload(
    d: Result<Decoded, ferry_xds::convert::InvalidResource>,
) -> std::sync::Arc<ferry_core::model::Workload> {
    match d {
        Ok(Decoded::Workload(w)) => w,
        other => panic!("not a workload: {other:?}"),
    }
}

/// The maps a workload repeats are found by their bytes (decoded once), and decode as
/// `ferry_api` decodes them: a key sent twice keeps its last value, a message sent twice is
/// merged, equal maps sent in another order share one copy, and bytes that do not decode
/// are named with `ferry_api`'s error.
#[test]
fn a_workload_s_maps_decode_as_ferry_api_does_and_are_shared_by_their_bytes() {
    use ferry_xds::convert::{Interner, decode_address_with};
    let mut intern = Interner::default();
    let svc = "default/echo.default.svc.cluster.local";
    let fields = [
        label("app", "old"),
        label("version", "v1"),
        label("app", "echo"),
        backs(svc, 81),
        backs(svc, 80),
        ld(24, &ld(1, b"us-east")),
        ld(24, &ld(2, b"us-east-1a")),
    ];
    let a = workload(decode_address_with(
        &mut intern,
        "a",
        &workload_with("a", &fields),
    ));
    let labels: Vec<_> = a
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(labels, [("app", "echo"), ("version", "v1")]);
    let key = ferry_core::model::ServiceKey::new("default", "echo.default.svc.cluster.local");
    assert_eq!(a.target_port(&key, 80), Some(8080));
    assert_eq!(a.target_port(&key, 81), None);
    assert_eq!(
        (a.locality.region.as_str(), a.locality.zone.as_str()),
        ("us-east", "us-east-1a")
    );
    // The same bytes: the same copies. The same labels in another order: the same copy too.
    let b = workload(decode_address_with(
        &mut intern,
        "b",
        &workload_with("b", &fields),
    ));
    assert!(a.labels.ptr_eq(&b.labels) && a.services.ptr_eq(&b.services));
    assert!(std::sync::Arc::ptr_eq(&a.locality, &b.locality));
    let reordered = [label("version", "v1"), label("app", "echo"), backs(svc, 80)];
    let c = workload(decode_address_with(
        &mut intern,
        "c",
        &workload_with("c", &reordered),
    ));
    assert!(a.labels.ptr_eq(&c.labels) && a.services.ptr_eq(&c.services));
    // Bytes that do not decode (a key that is not UTF-8), seen first or after good ones.
    for bad in [
        ld(10001, &ld(1, &[0xff, 0xfe])),
        ld(22, &[0x0a, 0x05, b'x']),
    ] {
        let bytes = workload_with("d", &[bad]);
        let expected = <ferry_api::workload::Address as prost::Message>::decode(bytes.as_slice())
            .expect_err("ferry_api does not decode it");
        for intern in [&mut Interner::default(), &mut intern] {
            let e = decode_address_with(intern, "d", &bytes).expect_err("rejected");
            assert_eq!(
                e.reason,
                format!("not an istio.workload.Address: {expected}")
            );
        }
    }
    // A service map that decodes but is wrong is named where the workload's checks reach it.
    let bytes = workload_with("e", &[backs("no-slash", 80)]);
    let e = decode_address_with(&mut intern, "e", &bytes).expect_err("rejected");
    assert!(e.reason.contains("is not namespace/hostname"), "{e}");
}

/// A service whose one route (field 10003) holds `route`'s fields and a backend, as an Address.
fn service_with_route(route: &[u8]) -> Vec<u8> {
    let backend = [ld(1, b"default/web.default.svc.cluster.local"), vi(4, 1)].concat();
    let route = [ld(1, b"r"), route.to_vec(), ld(3, &backend)].concat();
    let mut s = Vec::new();
    s.extend(ld(1, b"web"));
    s.extend(ld(2, b"default"));
    s.extend(ld(3, b"web.default.svc.cluster.local"));
    s.extend(ld(10003, &route));
    ld(2, &s)
}

#[test]
fn route_methods_queries_and_header_edits_travel_in_new_field_numbers() {
    use ferry_core::model::HeaderModifier;
    // FerryRouteMatch: method (4), query_params (5: name 1, exact 2).
    let m = [ld(4, b"GET"), ld(5, &[ld(1, b"v"), ld(2, b"a b")].concat())].concat();
    // FerryHttpRoute: request_headers (6), response_headers (7); FerryHeaderModifier: set
    // (1), add (2), remove (3); FerryHeader: name (1), value (2).
    let header = |n: &[u8], v: &[u8]| [ld(1, n), ld(2, v)].concat();
    let request = [
        ld(1, &header(b"x-env", b"prod")),
        ld(2, &header(b"X-Hop", b"wp")),
        ld(3, b"x-debug"),
    ]
    .concat();
    let response = ld(2, &header(b"x-served-by", b"wp"));
    let route = [ld(2, &m), ld(6, &request), ld(7, &response)].concat();
    let Decoded::Service(s) =
        decode_address(NAME, &service_with_route(&route)).unwrap_or_else(|e| panic!("{e}"))
    else {
        panic!("not a service");
    };
    let r = &s.http_routes[0];
    assert_eq!(r.matches[0].method.as_deref(), Some("GET"));
    assert_eq!(r.matches[0].query, [("v".to_string(), "a b".to_string())]);
    assert_eq!(
        *r.request_headers,
        HeaderModifier {
            set: vec![("x-env".into(), "prod".into())],
            add: vec![("x-hop".into(), "wp".into())],
            remove: vec!["x-debug".into()],
        }
    );
    assert_eq!(
        r.response_headers.add,
        [("x-served-by".to_string(), "wp".to_string())]
    );
    // And back: the model encodes to what decodes to it again (through the topology file).
    let doc = "clusters: [{name: c, network: n}]\nwaypoints: [{name: wp}]\nservices:\n  - name: web\n    ports: [{port: 80, target_port: 8080}]\n    waypoint: wp\n    routes:\n      - name: r\n        match: [{method: PATCH, query: {v: '2', q: 'a&b'}}, {}]\n        backends: [{service: web}]\n        request_headers: {set: {x-a: '1'}, add: {x-b: '2'}, remove: [x-c]}\n        response_headers: {remove: [server]}\n";
    let snap = ferry_topology::parse("t.yaml", doc).unwrap().snapshot;
    let set = ResourceSet::encode(&snap);
    let body = &set.by_type[ferry_api::ADDRESS_TYPE][NAME].body;
    let Ok(Decoded::Service(back)) = decode_address(NAME, body) else {
        panic!("not a service");
    };
    let want = snap.services().find(|s| s.name == "web").unwrap();
    assert_eq!(back.http_routes, want.http_routes);
    assert_eq!(
        back.http_routes[0].matches[0].method.as_deref(),
        Some("PATCH")
    );
    assert_eq!(back.http_routes[0].response_headers.remove, ["server"]);
    // A route without the new fields sends none of them: what it sent before they existed.
    let plain = "clusters: [{name: c, network: n}]\nwaypoints: [{name: wp}]\nservices:\n  - name: web\n    ports: [{port: 80, target_port: 8080}]\n    waypoint: wp\n    routes: [{name: r, match: [{path: /a}], backends: [{service: web}]}]\n";
    let snap = ferry_topology::parse("t.yaml", plain).unwrap().snapshot;
    let body = &ResourceSet::encode(&snap).by_type[ferry_api::ADDRESS_TYPE][NAME].body;
    let address = <ferry_api::workload::Address as prost::Message>::decode(&body[..]).unwrap();
    let Some(ferry_api::workload::address::Type::Service(svc)) = address.r#type else {
        panic!("not a service");
    };
    let route = &svc.ferry_http_routes[0];
    assert_eq!(
        (&route.request_headers, &route.response_headers),
        (&None, &None)
    );
    assert_eq!(route.matches[0].method, "");
    assert!(route.matches[0].query_params.is_empty());
}

#[test]
fn a_route_with_an_edit_no_route_may_make_is_rejected_naming_the_field() {
    let header = |n: &[u8], v: &[u8]| [ld(1, n), ld(2, v)].concat();
    for (route, why) in [
        (
            ld(6, &ld(1, &header(b"Host", b"evil"))),
            "ferry_http_routes[0]: request_headers.set[0].name: expected a header a route may edit, found \"host\"",
        ),
        (
            ld(7, &ld(3, b":status")),
            "ferry_http_routes[0]: response_headers.remove[0]: expected a header name, found the pseudo-header",
        ),
        (
            ld(6, &ld(2, &header(b"x-a", b"a\r\nb: c"))),
            "ferry_http_routes[0]: request_headers.add[0].value: expected a valid header value",
        ),
        (
            ld(7, &ld(1, &header(b"content-length", b"0"))),
            "ferry_http_routes[0]: response_headers.set[0].name: expected a header a route may edit",
        ),
        (
            ld(6, &ld(1, &header(b"bad name", b"x"))),
            "ferry_http_routes[0]: request_headers.set[0].name: expected a valid header name",
        ),
        // A match's problem names the match (FerryHttpRoute.matches is field 2).
        (
            ld(2, &ld(4, b"get")),
            "ferry_http_routes[0].matches[0].method: expected one of GET",
        ),
        (
            [ld(2, &ld(1, b"/a")), ld(2, &ld(4, b"get"))].concat(),
            "ferry_http_routes[0].matches[1].method: expected one of GET",
        ),
        (
            [ld(2, &[]), ld(2, &ld(5, &ld(2, b"x")))].concat(),
            "ferry_http_routes[0].matches[1].query_params[0]: query parameter name is required",
        ),
        (
            ld(2, &ld(2, b"a")),
            "ferry_http_routes[0].matches[0].path: \"a\" does not start with /",
        ),
        (
            ld(2, &ld(3, &ld(1, b"x-a"))),
            "ferry_http_routes[0].matches[0].headers[0]: header \"x-a\" has no value match",
        ),
    ] {
        match decode_address(NAME, &service_with_route(&route)) {
            Ok(_) => panic!("accepted a bad route ({why})"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(why), "{e}");
            }
        }
    }
}
