//! Table tests for a hop's trust in the origin cluster a tunnel claims.

use super::*;
use crate::testing::{MeshBuilder, ip};

/// case, hop, claim, peer address, peer identity, when unclaimed, expected.
type Row<'a> = (
    &'static str,
    Hop<'a>,
    Option<&'a ClusterId>,
    &'static str,
    Identity,
    Unclaimed,
    Result<ClusterId, OriginError>,
);

#[test]
fn the_claimed_origin_cluster_is_checked_against_the_tunnels_peer() {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "r/z/s")
        .node("west-1", "west", "r/z/s");
    m.pod("sleep", "east-1", "198.18.1.10");
    m.pod("sleep-west", "west-1", "198.18.2.10");
    m.pod("wp", "east-1", "198.18.1.5");
    let snap = m.build();
    let id = |name: &str| {
        snap.workloads()
            .find(|w| w.name == name)
            .unwrap()
            .identity()
            .unwrap()
    };
    let (east, west, far) = (
        ClusterId::new("east"),
        ClusterId::new("west"),
        ClusterId::new("far"),
    );
    let net = NetworkId::new("net");
    let other_net = NetworkId::new("net-other");
    let hop = Hop {
        cluster: &east,
        network: &net,
    };
    let sleep_uid = snap
        .workloads()
        .find(|w| w.name == "sleep")
        .unwrap()
        .uid
        .clone();
    use Unclaimed::{OwnCluster, Refuse};
    #[rustfmt::skip]
    let table: Vec<Row<'_>> = vec![
        // A known peer presenting its own identity: its cluster, whatever is claimed.
        ("peer agrees", hop, Some(&east), "198.18.1.10", id("sleep"), OwnCluster, Ok(east.clone())),
        ("peer, no claim", hop, None, "198.18.2.10", id("sleep-west"), Refuse, Ok(west.clone())),
        ("peer contradicts", hop, Some(&west), "198.18.1.10", id("sleep"), OwnCluster,
            Err(OriginError::Contradicted { claimed: west.clone(), workload: sleep_uid, actual: east.clone() })),
        // The address is a workload's, but the identity is not: the claim stands.
        ("someone else's address", hop, Some(&west), "198.18.1.10", id("sleep-west"), OwnCluster, Ok(west.clone())),
        // Not a workload on the hop's network (a gateway's peer, say): the claim stands.
        ("unknown peer", hop, Some(&far), "198.18.9.9", id("sleep"), Refuse, Ok(far.clone())),
        ("other network", Hop { cluster: &east, network: &other_net }, Some(&west), "198.18.1.10", id("sleep"), Refuse, Ok(west.clone())),
        // Nothing claimed and nothing known: the hop's policy.
        ("waypoint default", hop, None, "198.18.9.9", id("sleep"), OwnCluster, Ok(east.clone())),
        ("gateway refuses", hop, None, "198.18.9.9", id("sleep"), Refuse, Err(OriginError::Unclaimed)),
    ];
    for (case, hop, claim, peer_ip, peer, unclaimed, want) in table {
        assert_eq!(
            origin_cluster(&snap, hop, claim, ip(peer_ip), &peer, unclaimed),
            want,
            "{case}"
        );
    }
}
