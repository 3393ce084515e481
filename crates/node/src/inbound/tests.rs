use ferry_core::model::ServiceScope;
use ferry_core::testing::MeshBuilder;

use super::*;

/// echo (in east) behind service echo, global until a test says otherwise; west is another
/// cluster.
fn mesh() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").cluster("west", "net-west");
    m.node("east-1", "east", "us-east/a/r1");
    m.pod("echo", "east-1", "198.18.2.20");
    m.service("echo", &[("net-east", "198.18.100.1")], 80, 8080);
    m.backs("echo", "echo");
    m
}

/// A tunnel from a `sleep` identity whose certificate proves `cluster`, for `target`, to echo
/// on 8080, judged in `snap`.
fn judge_tunnel(snap: &Snapshot, cluster: &str, target: &str) -> Result<(), ConnError> {
    let dst = snap.workloads().find(|w| w.name == "echo").unwrap();
    let peer: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
        .parse()
        .unwrap();
    let target = match target.parse::<SocketAddr>() {
        Ok(addr) => Destination::Addr(addr),
        Err(_) => {
            let (hostname, port) = target.rsplit_once(':').unwrap();
            Destination::Host {
                hostname: hostname.into(),
                port: port.parse().unwrap(),
            }
        }
    };
    let tunnel = TunnelFacts {
        peer: &peer,
        cluster: &PeerCluster::Proven(cluster.into()),
        target: &target,
    };
    judge(
        snap,
        dst,
        dst.addresses[0],
        "198.18.9.10:40000".parse().unwrap(),
        8080,
        Some(tunnel),
    )
}

#[test]
fn a_held_tunnel_is_judged_again_for_scope_and_a_scope_change_ends_it() {
    let global = mesh().build();
    for target in ["198.18.2.20:8080", "echo.default.svc.cluster.local:80"] {
        judge_tunnel(&global, "west", target).expect("a global service admits west");
    }
    // The same tunnel once the service is local: west is no longer admitted, by pod address
    // or by the service's name; east still is.
    let mut m = mesh();
    m.service_mut("echo").scope = ServiceScope::local();
    let local = m.build();
    for target in ["198.18.2.20:8080", "echo.default.svc.cluster.local:80"] {
        let e = judge_tunnel(&local, "west", target).expect_err("out of scope");
        assert!(
            matches!(e.kind, ConnErrorKind::OutOfScope(_)),
            "{target}: {e}"
        );
        assert_eq!(e.flag, ResponseFlag::Deny);
        judge_tunnel(&local, "east", target).expect("its own cluster is admitted");
    }
}

#[test]
fn plain_tcp_from_outside_the_mesh_has_no_scope_to_lose() {
    let mut m = mesh();
    m.service_mut("echo").scope = ServiceScope::local();
    let snap = m.build();
    let dst = snap.workloads().find(|w| w.name == "echo").unwrap();
    judge(
        &snap,
        dst,
        dst.addresses[0],
        "198.18.9.90:40000".parse().unwrap(),
        8080,
        None,
    )
    .expect("no cluster proven, no scope checked: policy only");
}

#[test]
fn a_held_connection_stays_small() {
    // Kept for each held connection's whole life, inside its boxed re-check.
    let size = std::mem::size_of::<Held>();
    assert!(size <= 192, "Held is {size} bytes");
}

#[test]
fn the_source_workload_is_named_only_when_its_address_holds_the_proven_identity() {
    let mut m = mesh();
    m.pod("sleep", "east-1", "198.18.2.10");
    m.gateway("gw-east", "east", "198.18.255.1");
    let snap = m.build();
    let dst = snap.workloads().find(|w| w.name == "echo").unwrap();
    let sleep: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
        .parse()
        .unwrap();
    let other: Identity = "spiffe://cluster.local/ns/default/sa/other"
        .parse()
        .unwrap();
    let at = |ip: &str, id: &Identity| {
        proven_source(&snap, dst, ip.parse().unwrap(), id).map(|w| w.name.as_str())
    };
    assert_eq!(at("198.18.2.10", &sleep), Some("sleep"));
    // The address holds another identity than the certificate's: no name.
    assert_eq!(at("198.18.2.10", &other), None);
    // Relayed by a gateway, or from an address no workload has: no name.
    assert_eq!(at("198.18.255.1", &sleep), None);
    assert_eq!(at("198.18.9.9", &sleep), None);
}

/// A terminating pod keeps its open connections: the re-check on each snapshot change judges
/// scope and policy only, never health, so marking it terminating (or unhealthy) ends none.
#[test]
fn a_held_tunnel_to_a_terminating_pod_is_not_ended_by_the_re_check() {
    use ferry_core::model::Health;
    for health in [Health::Terminating, Health::Unhealthy] {
        let mut m = mesh();
        m.workload_mut("echo").health = health;
        let snap = m.build();
        for target in ["198.18.2.20:8080", "echo.default.svc.cluster.local:80"] {
            judge_tunnel(&snap, "west", target)
                .unwrap_or_else(|e| panic!("{health:?}, {target}: {e}"));
        }
    }
}

#[test]
fn the_source_cluster_label_is_the_proven_one_and_a_claim_only_without_proof() {
    let snap = mesh().build();
    let echo = snap.workloads().find(|w| w.name == "echo").unwrap();
    let claiming = |cluster: Option<&str>| ConnectHeaders {
        baggage: Baggage {
            cluster: cluster.map(str::to_string),
            ..Baggage::default()
        }
        .to_pairs(),
        ..ConnectHeaders::default()
    };
    let proven = PeerCluster::Proven("west".into());
    let unproven = PeerCluster::Unproven;
    let east = claiming(Some("east"));
    assert_eq!(source_cluster(&proven, None, &east), "west");
    assert_eq!(source_cluster(&proven, Some(echo), &east), "west");
    // Without a proven cluster: the proven workload's, else the claim, else unknown.
    assert_eq!(
        source_cluster(&unproven, Some(echo), &claiming(Some("x"))),
        "east"
    );
    assert_eq!(source_cluster(&unproven, None, &east), "east");
    assert_eq!(source_cluster(&unproven, None, &claiming(None)), "unknown");
}

/// A tunnel's labels at the destination: the source workload is the one its certificate and
/// address prove; a baggage that claims another names nothing but the unproven cluster.
#[test]
fn the_destination_labels_the_proven_source_and_never_a_claimed_one() {
    use ferry_hbone::headers::{WorkloadKind, WorkloadName};
    let mut m = mesh();
    m.pod("sleep", "east-1", "198.18.2.10").labels = [("app", "sleeper"), ("version", "v3")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let snap = m.build();
    let dst = snap.workloads().find(|w| w.name == "echo").unwrap();
    let sleep: Identity = "spiffe://cluster.local/ns/default/sa/sleep"
        .parse()
        .unwrap();
    let claim = Baggage {
        cluster: Some("claimed-cluster".into()),
        namespace: Some("claimed-ns".into()),
        workload: Some(WorkloadName {
            kind: WorkloadKind::Deployment,
            name: "claimed".into(),
        }),
        service: Some("claimed-svc".into()),
        revision: Some("claimed-rev".into()),
        ..Baggage::default()
    };
    let headers = ConnectHeaders {
        baggage: claim.to_pairs(),
        forwarded_host: Some("echo.default.svc.cluster.local".into()),
        forwarded_network: Some("claimed-net".into()),
        ..ConnectHeaders::default()
    };
    let service =
        ferry_core::telemetry::inbound_service(&snap, dst, headers.forwarded_host.as_deref(), 8080)
            .map(|s| &**s);
    let tunnel = |from: &str, cluster: &PeerCluster| {
        let facts = SourceFacts {
            peer: &sleep,
            cluster,
            workload: proven_source(&snap, dst, from.parse().unwrap(), &sleep),
            headers: &headers,
        };
        labels(
            dst,
            &dst.identity().unwrap(),
            service,
            Some(facts),
            ResponseFlag::None,
        )
    };
    let source = |l: &Labels| {
        [
            l.source_workload.clone(),
            l.source_workload_namespace.clone(),
            l.source_canonical_service.clone(),
            l.source_canonical_revision.clone(),
            l.source_cluster.clone(),
            l.source_network.clone(),
        ]
    };

    // Proven: sleep's own labels, its cluster and network.
    let proven = tunnel("198.18.2.10", &PeerCluster::Proven("east".into()));
    assert_eq!(
        source(&proven),
        ["sleep", "default", "sleeper", "v3", "east", "net-east"]
    );
    assert_eq!(proven.source_principal, sleep.to_string());
    assert_eq!(proven.connection_security_policy, SecurityPolicy::MutualTls);
    assert_eq!(
        [
            proven.destination_workload.as_str(),
            &proven.destination_workload_namespace,
            &proven.destination_canonical_service,
            &proven.destination_canonical_revision,
            &proven.destination_service,
            &proven.destination_service_name,
            &proven.destination_service_namespace,
            &proven.destination_cluster,
        ],
        [
            "echo",
            "default",
            "echo",
            "latest",
            "echo.default.svc.cluster.local",
            "echo",
            "default",
            "east",
        ]
    );
    // Proven by the certificate but not by the address (relayed, or spoofed): the identity
    // only. The baggage's workload, namespace and canonical service are claims: unknown.
    let relayed = tunnel("198.18.255.1", &PeerCluster::Proven("east".into()));
    assert_eq!(
        source(&relayed),
        [
            "unknown",
            "unknown",
            "unknown",
            "unknown",
            "east",
            "claimed-net"
        ]
    );
    assert_eq!(relayed.source_principal, sleep.to_string());
    // A certificate that proves no cluster: the baggage's is taken, as Istio takes it.
    let unproven = tunnel("198.18.255.1", &PeerCluster::Unproven);
    assert_eq!(unproven.source_cluster, "claimed-cluster");
    assert_eq!(unproven.source_workload, "unknown");
    // ... unless the workload is proven: its cluster.
    let by_address = tunnel("198.18.2.10", &PeerCluster::Unproven);
    assert_eq!(by_address.source_cluster, "east");

    // Plain TCP from outside the mesh: no source, `none`; the service by port.
    let plain = labels(
        dst,
        &dst.identity().unwrap(),
        service,
        None,
        ResponseFlag::None,
    );
    assert_eq!(
        source(&plain),
        [
            "unknown", "unknown", "unknown", "unknown", "unknown", "unknown"
        ]
    );
    assert_eq!(plain.source_principal, "unknown");
    assert_eq!(plain.connection_security_policy, SecurityPolicy::None);
    assert_eq!(plain.destination_service_name, "echo");
}
