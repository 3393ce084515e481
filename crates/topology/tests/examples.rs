//! Every example topology loads, and converts into the mesh it describes.

use std::net::IpAddr;
use std::path::PathBuf;

use ferry_core::model::{
    Action, Cidr, ClusterId, GatewayDestination, HBONE_PORT, LoadBalancing, NetworkAddress,
    NetworkId, PolicyKey, PolicyScope, ScopeRule, ServiceKey, StringMatch, TunnelProtocol,
    WaypointFor, Workload, WorkloadUid,
};
use ferry_core::snapshot::{AddressOwner, Endpoint, Snapshot};
use ferry_topology::{Topology, load_file};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn load(name: &str) -> Topology {
    let path = examples_dir().join(name);
    load_file(&path).unwrap_or_else(|e| panic!("{name} must load:\n{e}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn workload<'a>(snap: &'a Snapshot, uid: &str) -> &'a Workload {
    snap.workload(&WorkloadUid::new(uid))
        .unwrap_or_else(|| panic!("workload {uid} exists"))
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", format!("{name}.default.svc.cluster.local"))
}

#[test]
fn every_example_loads() {
    let mut names: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples directory")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 3,
        "expected the three examples, found {names:?}"
    );
    // The benchmarking ranges: 198.18.0.0/15 (RFC 2544) and its IPv6 counterpart 2001:2::/48
    // (RFC 5180).
    let mesh_range: Cidr = "198.18.0.0/15".parse().expect("cidr");
    let mesh_range_v6: Cidr = "2001:2::/48".parse().expect("cidr");
    for path in names {
        let topo =
            load_file(&path).unwrap_or_else(|e| panic!("{} must load:\n{e}", path.display()));
        let snap = &topo.snapshot;
        assert_eq!(topo.trust_domain, "cluster.local");
        assert!(
            snap.workloads().count() > 0,
            "{} has workloads",
            path.display()
        );
        // Every address is in a benchmarking range.
        let addresses = snap
            .workloads()
            .flat_map(|w| w.addresses.clone())
            .chain(
                snap.services()
                    .flat_map(|s| s.vips.iter().map(|v| v.ip).collect::<Vec<_>>()),
            )
            .chain(snap.gateways().map(|g| g.address))
            .chain(snap.nodes().filter_map(|n| n.address));
        for a in addresses {
            assert!(
                mesh_range.contains(a) || mesh_range_v6.contains(a),
                "{}: {a} is outside 198.18.0.0/15 and 2001:2::/48",
                path.display()
            );
        }
        // Every workload has a valid identity.
        for w in snap.workloads() {
            w.identity().expect("valid identity");
        }
    }
}

#[test]
fn two_clusters_places_workloads_and_gateways() {
    let snap = load("two-clusters.yaml").snapshot;
    assert_eq!(snap.clusters().count(), 2);
    assert_eq!(snap.gateways().count(), 2);

    let sleep = workload(&snap, "east//v1/Pod/default/sleep-east");
    assert_eq!(sleep.cluster, ClusterId::new("east"));
    assert_eq!(sleep.network, NetworkId::new("net-east"));
    assert_eq!(sleep.locality.zone, "us-east-1a");
    assert_eq!(sleep.node.as_ref().map(|n| n.as_str()), Some("east-1"));
    assert_eq!(sleep.tunnel, TunnelProtocol::Hbone);
    let gw = sleep.network_gateway.as_ref().expect("a network gateway");
    assert_eq!(
        gw.destination,
        GatewayDestination::Address(NetworkAddress::new("net-east".into(), ip("198.18.255.1")))
    );
    assert_eq!(gw.hbone_port, HBONE_PORT);

    let west = workload(&snap, "west//v1/Pod/default/echo-west-2");
    let gw = west.network_gateway.as_ref().expect("a network gateway");
    assert_eq!(
        gw.destination,
        GatewayDestination::Address(NetworkAddress::new("net-west".into(), ip("198.19.255.1")))
    );
    assert_eq!(west.target_port(&key("echo"), 80), Some(8080));
    assert_eq!(
        snap.owner(&NetworkAddress::new("net-west".into(), ip("198.19.10.1"))),
        Some(&AddressOwner::Service(Box::new(key("echo"))))
    );
}

#[test]
fn two_clusters_scopes_and_waypoints() {
    let snap = load("two-clusters.yaml").snapshot;
    let ledger = snap.service(&key("ledger")).expect("ledger");
    assert_eq!(ledger.scope.default, ScopeRule::Local);
    assert!(ledger.scope.by_cluster.is_empty());
    assert_eq!(ledger.load_balancing, None);
    let echo = snap.service(&key("echo")).expect("echo");
    assert_eq!(echo.scope.default, ScopeRule::Global);
    assert_eq!(echo.load_balancing, Some(LoadBalancing::prefer_close()));

    // Both use the one shared waypoint.
    let wp_key = key("shared-waypoint");
    for svc in [ledger, echo] {
        let wp = svc.waypoint.as_ref().expect("a waypoint");
        assert_eq!(wp.destination, GatewayDestination::Service(wp_key.clone()));
        assert_eq!(wp.hbone_port, HBONE_PORT);
    }
    let wp = snap.service(&wp_key).expect("waypoint service");
    assert_eq!(wp.waypoint_for, Some(WaypointFor::Service));
    assert_eq!(wp.scope.default, ScopeRule::Global);
    assert_eq!(wp.load_balancing, Some(LoadBalancing::prefer_close()));
    assert_eq!(wp.port(HBONE_PORT).map(|p| p.target_port), Some(HBONE_PORT));
    let instances: Vec<&str> = snap
        .endpoints(&wp_key)
        .iter()
        .filter_map(|e| match e {
            Endpoint::Workload(uid) => Some(uid.as_str()),
            Endpoint::Address(_) => None,
        })
        .collect();
    assert_eq!(
        instances,
        [
            "east//v1/Pod/default/shared-waypoint-east-1",
            "west//v1/Pod/default/shared-waypoint-west-1"
        ]
    );
    let inst = workload(&snap, "west//v1/Pod/default/shared-waypoint-west-1");
    assert_eq!(inst.service_account, "shared-waypoint");
    assert!(inst.labels.is_empty());
    assert!(inst.network_gateway.is_some());

    // The workload-attached waypoint.
    let db = workload(&snap, "east//v1/Pod/default/payments-db");
    let wp = db.waypoint.as_ref().expect("payments-db has a waypoint");
    assert_eq!(
        wp.destination,
        GatewayDestination::Service(key("pod-waypoint"))
    );
    let pod_wp = snap.service(&key("pod-waypoint")).expect("pod-waypoint");
    assert_eq!(pod_wp.waypoint_for, Some(WaypointFor::Workload));
    assert_eq!(snap.endpoints(&key("pod-waypoint")).len(), 2);
}

#[test]
fn two_clusters_nests_catalog_vip() {
    let snap = load("two-clusters.yaml").snapshot;
    let mc = ServiceKey::new("default", "catalog.default.svc.clusterset.local");
    let svc = snap.service(&mc).expect("catalog-mc");
    assert_eq!(svc.scope.default, ScopeRule::Global);
    let eps = snap.endpoints(&mc);
    assert_eq!(eps.len(), 2, "{eps:?}");
    assert!(
        matches!(&eps[0], Endpoint::Workload(uid) if uid.as_str() == "west//v1/Pod/default/catalog-west-1")
    );
    let Endpoint::Address(nested) = &eps[1] else {
        panic!("expected an address endpoint, found {:?}", eps[1])
    };
    let vip = NetworkAddress::new("net-east".into(), ip("198.18.10.3"));
    assert_eq!(nested.address, vip);
    assert_eq!(nested.cluster, ClusterId::new("east"));
    assert_eq!(nested.ports.len(), 1);
    assert_eq!(
        (nested.ports[0].service_port, nested.ports[0].target_port),
        (80, 80)
    );
    // The nested address is catalog's own VIP.
    assert_eq!(
        snap.owner(&vip),
        Some(&AddressOwner::Service(Box::new(key("catalog"))))
    );
    assert_eq!(
        snap.service(&key("catalog"))
            .expect("catalog")
            .scope
            .default,
        ScopeRule::Local
    );
}

#[test]
fn two_clusters_policies() {
    let snap = load("two-clusters.yaml").snapshot;
    let allow = snap
        .policy(&PolicyKey::new("default", "allow-echo"))
        .expect("allow-echo");
    assert_eq!(allow.action, Action::Allow);
    assert_eq!(allow.scope, PolicyScope::WorkloadSelector);
    assert_eq!(allow.rules.len(), 1);
    assert_eq!(
        allow.rules[0].clauses.len(),
        2,
        "a from clause and a to clause"
    );
    assert_eq!(allow.rules[0].clauses[0].matches[0].principals.len(), 2);
    assert_eq!(
        allow.rules[0].clauses[1].matches[0].destination_ports,
        [8080]
    );

    // Selector policies are listed on the workloads they select, and only on those.
    let echo = workload(&snap, "west//v1/Pod/default/echo-west-1");
    let writes = snap
        .policy(&PolicyKey::new("default", "deny-echo-admin-writes"))
        .expect("deny-echo-admin-writes");
    assert_eq!(writes.action, Action::Deny);
    let l7 = &writes.rules[0].clauses[0].matches[0];
    assert!(l7.is_l7(), "methods and paths make it an L7 match");
    let methods: Vec<String> = l7.methods.iter().map(|m| m.to_string()).collect();
    assert_eq!(methods, ["POST", "PUT", "DELETE"]);
    assert_eq!(l7.paths, [StringMatch::Prefix("/admin".into())]);
    let mut keys = echo.authorization_policies.clone();
    keys.sort();
    let mut want = vec![allow.key(), writes.key()];
    want.sort();
    assert_eq!(keys, want);
    let sleep = workload(&snap, "west//v1/Pod/default/sleep-west");
    assert!(sleep.authorization_policies.is_empty());

    let audit = snap
        .policy(&PolicyKey::new("istio-system", "audit-ledger"))
        .expect("audit");
    assert_eq!(
        (audit.scope, audit.action),
        (PolicyScope::Mesh, Action::Audit)
    );
    let db = workload(&snap, "east//v1/Pod/default/payments-db");
    let applied: Vec<String> = snap.policies_for(db).map(|p| p.key().to_string()).collect();
    assert_eq!(
        applied,
        [
            "istio-system/audit-ledger",
            "default/deny-payments-outsiders"
        ]
    );
}

#[test]
fn single_cluster_namespace_policy() {
    let snap = load("single-cluster.yaml").snapshot;
    let allow = snap
        .policy(&PolicyKey::new("default", "allow-sleep-to-echo"))
        .expect("allow");
    assert_eq!(allow.scope, PolicyScope::Namespace);
    let echo3 = workload(&snap, "main//v1/Pod/default/echo-3");
    assert_eq!(echo3.capacity, 0);
    assert_eq!(echo3.network_gateway, None);
    assert_eq!(snap.endpoints(&key("echo")).len(), 3);
    assert_eq!(snap.policies_for(echo3).count(), 2);
}

#[test]
fn flat_network_shares_one_network() {
    let snap = load("flat-network.yaml").snapshot;
    let a = workload(&snap, "alpha//v1/Pod/default/inventory-alpha");
    let b = workload(&snap, "beta//v1/Pod/default/inventory-beta");
    assert_eq!(a.network, b.network);
    assert_ne!(a.cluster, b.cluster);
    assert_eq!(snap.gateways().count(), 0);
    let inventory = snap.service(&key("inventory")).expect("inventory");
    assert_eq!(inventory.scope.default, ScopeRule::Local);
    let wp = snap.service(&key("mesh-waypoint")).expect("waypoint");
    assert_eq!(wp.scope.default, ScopeRule::Global);
    assert!(inventory.scope.admits(&a.cluster, &a.cluster));
    assert!(!inventory.scope.admits(&b.cluster, &a.cluster));
}

/// The examples route the way their comments say (a few seeds, since load balancing is random).
#[test]
fn examples_route_as_documented() {
    use ferry_core::random::SplitMix64;
    use ferry_core::route::{Destination, Source, route};

    let landing = |snap: &Snapshot, src: &Workload, host: &str, seed: u64| -> String {
        let dst = Destination::Host {
            hostname: host.to_string(),
            port: 80,
        };
        let d = route(snap, Source::new(src), &dst, &mut SplitMix64::new(seed));
        let plan = d
            .outcome
            .unwrap_or_else(|e| panic!("{host} from {}: {e}", src.uid));
        plan.landing.expect("lands on a workload").to_string()
    };

    // Flat network: the local service never crosses into beta, not even via beta's waypoint.
    let flat = load("flat-network.yaml").snapshot;
    let sleep = workload(&flat, "alpha//v1/Pod/default/sleep");
    for seed in 0..32 {
        assert_eq!(
            landing(&flat, sleep, "inventory.default.svc.cluster.local", seed),
            "alpha//v1/Pod/default/mesh-waypoint-alpha"
        );
    }

    // Two clusters: west's sleep reaches the local ledger only through west's waypoint instance.
    let two = load("two-clusters.yaml").snapshot;
    let sleep = workload(&two, "west//v1/Pod/default/sleep-west");
    for seed in 0..32 {
        assert_eq!(
            landing(&two, sleep, "ledger.default.svc.cluster.local", seed),
            "west//v1/Pod/default/shared-waypoint-west-1"
        );
    }
    // The clusterset catalog from east prefers the closest endpoint: the nested east VIP, resolved
    // in the same decision to east's own catalog pod. From west, east's VIP is unreachable (an
    // address on another network), so west's pod serves it.
    let sleep = workload(&two, "east//v1/Pod/default/sleep-east");
    for seed in 0..32 {
        assert_eq!(
            landing(&two, sleep, "catalog.default.svc.clusterset.local", seed),
            "east//v1/Pod/default/catalog-east-1"
        );
    }
    let sleep = workload(&two, "west//v1/Pod/default/sleep-west");
    for seed in 0..32 {
        assert_eq!(
            landing(&two, sleep, "catalog.default.svc.clusterset.local", seed),
            "west//v1/Pod/default/catalog-west-1"
        );
    }
}

#[test]
fn selector_clusters_limits_a_selector_to_the_clusters_named() {
    let doc = "\
clusters:
  - {name: east, network: net}
  - {name: west, network: net}
nodes:
  - {name: east-1, cluster: east}
  - {name: west-1, cluster: west}
services:
  - {name: echo, ports: [{port: 80, target_port: 8080}], selector: {app: echo}, selector_clusters: [west]}
  - {name: any, ports: [{port: 80, target_port: 8080}], selector: {app: echo}}
workloads:
  - {name: echo-east, node: east-1, address: 198.18.1.1, labels: {app: echo}}
  - {name: echo-west, node: west-1, address: 198.18.2.1, labels: {app: echo}}
";
    let snap = ferry_topology::parse("t.yaml", doc)
        .expect("valid")
        .snapshot;
    let backing = |svc: &str| -> Vec<String> {
        let mut v: Vec<String> = snap
            .endpoints(&key(svc))
            .iter()
            .filter_map(|e| match e {
                Endpoint::Workload(uid) => Some(uid.as_str().to_string()),
                Endpoint::Address(_) => None,
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        backing("echo"),
        ["west//v1/Pod/default/echo-west"],
        "only west's pods back it"
    );
    assert_eq!(
        backing("any"),
        [
            "east//v1/Pod/default/echo-east",
            "west//v1/Pod/default/echo-west"
        ]
    );
}

#[test]
fn policy_any_namespace_and_clusters_select_the_workloads_named() {
    let doc = "\
clusters:
  - {name: east, network: net}
  - {name: west, network: net}
nodes:
  - {name: east-1, cluster: east}
  - {name: west-1, cluster: west}
workloads:
  - {name: a-east, namespace: a, node: east-1, address: 198.18.1.1, labels: {app: x}}
  - {name: b-east, namespace: b, node: east-1, address: 198.18.1.2, labels: {app: x}}
  - {name: b-west, namespace: b, node: west-1, address: 198.18.2.2, labels: {app: x}}
policies:
  - {name: root, namespace: istio-system, selector: {app: x}, any_namespace: true, action: deny, rules: [{}]}
  - {name: east-only, namespace: b, clusters: [east], action: deny, rules: [{}]}
";
    let snap = ferry_topology::parse("t.yaml", doc)
        .expect("valid")
        .snapshot;
    let attached = |w: &str| -> Vec<String> {
        let mut v: Vec<String> = snap
            .workloads()
            .find(|x| x.name == w)
            .unwrap()
            .authorization_policies
            .iter()
            .map(|k| k.to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(attached("a-east"), ["istio-system/root"]);
    assert_eq!(attached("b-east"), ["b/east-only", "istio-system/root"]);
    assert_eq!(
        attached("b-west"),
        ["istio-system/root"],
        "east's policy stays in east"
    );
}

#[test]
fn a_port_named_grpc_is_sent_http2_by_the_waypoint_and_the_others_http1() {
    use ferry_core::model::AppProtocol;
    use ferry_core::protocol::HttpUpstream;
    let topo = load("lab.yaml");
    let audit = topo.snapshot.service(&key("audit")).expect("audit");
    let declared: Vec<(u16, AppProtocol)> = audit
        .ports
        .iter()
        .map(|p| (p.port, p.app_protocol))
        .collect();
    assert_eq!(
        declared,
        [
            (80, AppProtocol::Unknown),
            (81, AppProtocol::Unknown),
            (82, AppProtocol::Grpc),
        ]
    );
    let grpc = audit.port(82).expect("port 82");
    assert_eq!(grpc.target_port, 50051);
    assert_eq!(grpc.app_protocol.http_upstream(), HttpUpstream::Http2);
}

#[test]
fn app_protocol_wins_over_the_port_name() {
    let text = r#"
clusters: [{name: c, network: n}]
nodes: [{name: c-1, cluster: c}]
services:
  - name: api
    vips: [{network: n, address: 198.18.10.1}]
    ports:
      - {port: 80, target_port: 8080, name: grpc, app_protocol: http}
      - {port: 81, target_port: 8081, name: web, app_protocol: kubernetes.io/h2c}
      - {port: 82, target_port: 8082, name: http2-api}
      - {port: 83, target_port: 8083, app_protocol: grpc-web}
    selector: {app: api}
workloads:
  - {name: api-1, node: c-1, address: 198.18.1.10, labels: {app: api}}
"#;
    use ferry_core::model::AppProtocol::{Http2, Http11, Unknown};
    let topo = ferry_topology::parse("inline.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let api = topo.snapshot.service(&key("api")).expect("api");
    let got: Vec<_> = api.ports.iter().map(|p| p.app_protocol).collect();
    assert_eq!(got, [Http11, Http2, Http2, Unknown]);
}

#[test]
fn dual_stack_workloads_and_vips_have_an_address_of_each_family() {
    let snap = load("dual-stack.yaml").snapshot;
    let net = NetworkId::new("main-net");
    let echo = workload(&snap, "main//v1/Pod/default/echo");
    assert_eq!(echo.addresses, [ip("198.18.2.20"), ip("2001:2::2:20")]);
    assert_eq!(
        workload(&snap, "main//v1/Pod/default/v4only").addresses,
        [ip("198.18.1.11")]
    );
    let svc = snap.service(&key("echo")).expect("echo");
    assert_eq!(
        svc.vips,
        [
            NetworkAddress::new(net.clone(), ip("198.18.10.1")),
            NetworkAddress::new(net.clone(), ip("2001:2::10:1")),
        ]
    );
    // Both of echo's addresses are its, and both VIPs the service's.
    for (addr, owner) in [
        ("2001:2::2:20", AddressOwner::Workload(echo.uid.clone())),
        ("198.18.2.20", AddressOwner::Workload(echo.uid.clone())),
        ("2001:2::10:1", AddressOwner::Service(Box::new(key("echo")))),
    ] {
        assert_eq!(
            snap.owner(&NetworkAddress::new(net.clone(), ip(addr))),
            Some(&owner),
            "{addr}"
        );
    }
}
