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
    let at = |ip: &str, id: &Identity| proven_source(&snap, dst, ip.parse().unwrap(), id);
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
    let proven = PeerCluster::Proven("west".into());
    assert_eq!(source_cluster(Some(&proven), Some("east".into())), "west");
    assert_eq!(
        source_cluster(Some(&PeerCluster::Unproven), Some("east".into())),
        "east"
    );
    assert_eq!(
        source_cluster(Some(&PeerCluster::Unproven), None),
        "unknown"
    );
    assert_eq!(source_cluster(None, None), "unknown");
}
