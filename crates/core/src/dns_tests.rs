//! Table tests of [`super::lookup`]: which mesh names resolve for which source, and to what.

use super::{MeshName, lookup};
use crate::model::{
    AddressEndpoint, ClusterId, NetworkAddress, PortMapping, ScopeRule, ServiceScope,
};
use crate::snapshot::Snapshot;
use crate::testing::{MeshBuilder, ip};

/// alpha and beta on one network, gamma on another; services:
/// - `echo`: global, endpoints in alpha and beta;
/// - `remote`: global, only in beta (its name exists only remotely for alpha);
/// - `ledger`: local, only in beta;
/// - `audit`: local, in alpha and beta;
/// - `pair`: only alpha and gamma may reach it (an allow-list), only in beta;
/// - `remote.default.svc.clusterset.local`: the cluster-set service of `remote`, an address
///   endpoint in beta;
/// - `empty` (global) and `empty-local` (local): no endpoints.
fn mesh() -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat")
        .cluster("beta", "flat")
        .cluster("gamma", "far");
    m.node("alpha-1", "alpha", "r1/z1")
        .node("beta-1", "beta", "r2/z1")
        .node("gamma-1", "gamma", "r3/z1");
    m.pod("sleep", "alpha-1", "198.18.1.10");
    m.pod("echo-a", "alpha-1", "198.18.1.20");
    m.pod("echo-b", "beta-1", "198.18.3.20");
    m.pod("remote-b", "beta-1", "198.18.3.21");
    m.pod("ledger-b", "beta-1", "198.18.3.30");
    m.pod("audit-a", "alpha-1", "198.18.1.60");
    m.pod("audit-b", "beta-1", "198.18.3.60");
    m.pod("pair-b", "beta-1", "198.18.3.70");
    m.pod("far", "gamma-1", "198.19.1.10");
    m.service(
        "echo",
        &[("flat", "198.18.10.1"), ("far", "198.19.10.1")],
        80,
        8080,
    );
    m.service("remote", &[("flat", "198.18.10.2")], 80, 8080);
    m.service("ledger", &[("flat", "198.18.10.3")], 80, 8080)
        .scope = ServiceScope::local();
    m.service("audit", &[("flat", "198.18.10.4")], 80, 8080)
        .scope = ServiceScope::local();
    m.service("pair", &[("flat", "198.18.10.5")], 80, 8080)
        .scope = ServiceScope::clusters([ClusterId::from("alpha"), ClusterId::from("gamma")]);
    m.service("empty", &[("flat", "198.18.10.6")], 80, 8080);
    m.service("empty-local", &[("flat", "198.18.10.7")], 80, 8080)
        .scope = ServiceScope::local();
    let mc = m.service("remote-mc", &[("flat", "198.18.10.8")], 80, 80);
    mc.hostname = "remote.default.svc.clusterset.local".into();
    mc.address_endpoints.push(AddressEndpoint {
        address: NetworkAddress::new("flat".into(), ip("198.18.10.2")),
        cluster: "beta".into(),
        ports: vec![PortMapping {
            service_port: 80,
            target_port: 80,
        }],
    });
    m.backs("echo-a", "echo")
        .backs("echo-b", "echo")
        .backs("remote-b", "remote")
        .backs("ledger-b", "ledger")
        .backs("audit-a", "audit")
        .backs("audit-b", "audit")
        .backs("pair-b", "pair");
    m.build()
}

fn ask(snap: &Snapshot, from: &str, name: &str) -> MeshName {
    let source = snap
        .workloads()
        .find(|w| w.name == from)
        .expect("source pod");
    lookup(snap, source, name)
}

fn resolves(addresses: &[&str]) -> MeshName {
    MeshName::Resolves(addresses.iter().map(|a| ip(a)).collect())
}

#[test]
fn mesh_names_resolve_by_scope_for_the_asking_pod() {
    let snap = mesh();
    let cases: &[(&str, &str, MeshName)] = &[
        // Global, with an endpoint in the source's cluster and elsewhere.
        (
            "sleep",
            "echo.default.svc.cluster.local",
            resolves(&["198.18.10.1"]),
        ),
        // Global, only in beta: exists only remotely, and resolves.
        (
            "sleep",
            "remote.default.svc.cluster.local",
            resolves(&["198.18.10.2"]),
        ),
        // Its cluster-set name, a service of its own.
        (
            "sleep",
            "remote.default.svc.clusterset.local",
            resolves(&["198.18.10.8"]),
        ),
        // Local to beta: hidden from alpha, visible in beta.
        (
            "sleep",
            "ledger.default.svc.cluster.local",
            MeshName::Hidden,
        ),
        (
            "echo-b",
            "ledger.default.svc.cluster.local",
            resolves(&["198.18.10.3"]),
        ),
        // Local with an instance in each cluster: each sees its own.
        (
            "sleep",
            "audit.default.svc.cluster.local",
            resolves(&["198.18.10.4"]),
        ),
        // An allow-list: alpha and gamma are listed, beta (where it runs) is not.
        (
            "sleep",
            "pair.default.svc.cluster.local",
            resolves(&["198.18.10.5"]),
        ),
        ("echo-b", "pair.default.svc.cluster.local", MeshName::Hidden),
        // gamma is listed but has no VIP on its network: the name exists without address.
        ("far", "pair.default.svc.cluster.local", resolves(&[])),
        // The VIP of the source's own network.
        (
            "far",
            "echo.default.svc.cluster.local",
            resolves(&["198.19.10.1"]),
        ),
        // No endpoints: only a global default rule lets the name exist.
        (
            "sleep",
            "empty.default.svc.cluster.local",
            resolves(&["198.18.10.6"]),
        ),
        (
            "sleep",
            "empty-local.default.svc.cluster.local",
            MeshName::Hidden,
        ),
        // Any case, with the root's dot.
        (
            "sleep",
            "Echo.Default.SVC.cluster.local.",
            resolves(&["198.18.10.1"]),
        ),
        // Not mesh names: forwarded.
        ("sleep", "example.com", MeshName::Outside),
        (
            "sleep",
            "echo.default.svc.cluster.local.default.svc.cluster.local",
            MeshName::Outside,
        ),
        ("sleep", "echo", MeshName::Outside),
        ("sleep", "", MeshName::Outside),
        ("sleep", ".", MeshName::Outside),
    ];
    for (from, name, want) in cases {
        assert_eq!(&ask(&snap, from, name), want, "{from} asking {name:?}");
    }
}

#[test]
fn a_scope_override_for_the_endpoint_cluster_is_what_counts() {
    let mut m = MeshBuilder::new();
    m.cluster("alpha", "flat").cluster("beta", "flat");
    m.node("alpha-1", "alpha", "r1/z1")
        .node("beta-1", "beta", "r2/z1");
    m.pod("sleep", "alpha-1", "198.18.1.10");
    m.pod("svc-b", "beta-1", "198.18.3.10");
    let s = m.service("svc", &[("flat", "198.18.10.1")], 80, 8080);
    s.scope = ServiceScope::global();
    s.scope.by_cluster.insert("beta".into(), ScopeRule::Local);
    m.backs("svc-b", "svc");
    let snap = m.build();
    assert_eq!(
        ask(&snap, "sleep", "svc.default.svc.cluster.local"),
        MeshName::Hidden,
        "beta's endpoints are local to beta, whatever the default says"
    );
}

#[test]
fn a_server_address_is_ip_and_port_or_ip_alone_on_port_53() {
    use super::server_address;
    assert_eq!(
        server_address("198.18.3.53"),
        Ok("198.18.3.53:53".parse().unwrap())
    );
    assert_eq!(
        server_address("198.18.3.53:5353"),
        Ok("198.18.3.53:5353".parse().unwrap())
    );
    assert_eq!(server_address("::1"), Ok("[::1]:53".parse().unwrap()));
    let e = server_address("resolver.local").unwrap_err();
    assert!(e.contains("\"resolver.local\""), "{e}");
}
