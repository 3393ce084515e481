//! Table tests for the origin cluster a hop decides for, and the destination's scope check.

use std::net::SocketAddr;

use super::*;
use crate::model::ServiceScope;
use crate::testing::MeshBuilder;

/// east and west on one network. `app` (east, 198.18.1.20) backs `shared-local` (local) and
/// `shared-global` (global), both on its port 8080, and `admin-local` (local) on 9090; `web`
/// (east) backs only `web-global`; `bare` (east) backs nothing.
fn mesh() -> Snapshot {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net").cluster("west", "net");
    m.node("east-1", "east", "r/z/s")
        .node("west-1", "west", "r/z/s");
    m.pod("app", "east-1", "198.18.1.20");
    m.pod("web", "east-1", "198.18.1.30");
    m.pod("bare", "east-1", "198.18.1.40");
    m.service("shared-local", &[("net", "198.18.10.1")], 80, 8080)
        .scope = ServiceScope::local();
    m.service("shared-global", &[("net", "198.18.10.2")], 80, 8080);
    m.service("admin-local", &[("net", "198.18.10.3")], 90, 9090)
        .scope = ServiceScope::local();
    m.service("web-global", &[("net", "198.18.10.4")], 80, 8080);
    m.service("west-only", &[("net", "198.18.10.5")], 80, 8080)
        .scope = ServiceScope::clusters([ClusterId::new("west")]);
    m.backs("app", "shared-local")
        .backs("app", "shared-global")
        .backs("app", "admin-local")
        .backs("web", "web-global")
        .backs("web", "west-only");
    m.gateway("gw", "east", "198.18.255.1");
    m.build()
}

/// case, peer, claim, target, expected.
type HopRow<'a> = (
    &'static str,
    PeerCluster,
    Option<&'a ClusterId>,
    Destination,
    Result<Origin, OriginError>,
);

/// case, pod, target, its port, peer, expected.
type DestRow<'a> = (
    &'static str,
    &'a Workload,
    Destination,
    u16,
    PeerCluster,
    Result<(), OriginError>,
);

fn host(name: &str, port: u16) -> Destination {
    Destination::Host {
        hostname: crate::testing::hostname(name),
        port,
    }
}

fn addr(s: &str) -> Destination {
    Destination::Addr(s.parse::<SocketAddr>().unwrap())
}

#[test]
fn a_hop_decides_for_the_proven_cluster_and_only_notes_the_claim() {
    let snap = mesh();
    let (east, west, far) = (
        ClusterId::new("east"),
        ClusterId::new("west"),
        ClusterId::new("far"),
    );
    let net = NetworkId::new("net");
    let hop = Hop {
        cluster: &east,
        network: &net,
    };
    let proven = |c: &ClusterId| PeerCluster::Proven(c.clone());
    let ok = |cluster: &ClusterId, unproven, disputed: Option<&ClusterId>| {
        Ok(Origin {
            cluster: cluster.clone(),
            unproven,
            disputed_claim: disputed.cloned(),
        })
    };
    let unproven = |t: &str| {
        Err(OriginError::Unproven {
            target: t.to_string(),
        })
    };
    #[rustfmt::skip]
    let table: Vec<HopRow<'_>> = vec![
        // Proven: the certificate's cluster, whatever the baggage says (kept for the log).
        ("proven, no claim", proven(&west), None, host("shared-local", 80), ok(&west, false, None)),
        ("proven, same claim", proven(&west), Some(&west), host("shared-local", 80), ok(&west, false, None)),
        ("proven, another claim", proven(&west), Some(&east), host("shared-local", 80), ok(&west, false, Some(&east))),
        ("proven, unknown cluster claimed", proven(&east), Some(&far), addr("198.18.10.1:80"), ok(&east, false, Some(&far))),
        // Unproven (an istiod certificate): only targets admitted to every cluster, as the hop.
        ("unproven, global hostname", PeerCluster::Unproven, Some(&west), host("shared-global", 80), ok(&east, true, None)),
        ("unproven, global VIP", PeerCluster::Unproven, None, addr("198.18.10.2:80"), ok(&east, true, None)),
        ("unproven, local hostname", PeerCluster::Unproven, Some(&east), host("shared-local", 80),
            unproven("shared-local.default.svc.cluster.local:80")),
        ("unproven, local VIP", PeerCluster::Unproven, None, addr("198.18.10.1:80"), unproven("198.18.10.1:80")),
        ("unproven, allow-list hostname", PeerCluster::Unproven, None, host("west-only", 80),
            unproven("west-only.default.svc.cluster.local:80")),
        // A pod address: every service on that port must be global.
        ("unproven, pod behind local and global", PeerCluster::Unproven, None, addr("198.18.1.20:8080"),
            unproven("198.18.1.20:8080")),
        ("unproven, a port no service maps to", PeerCluster::Unproven, None, addr("198.18.1.30:9999"), ok(&east, true, None)),
        ("unproven, pod behind nothing", PeerCluster::Unproven, None, addr("198.18.1.40:8080"), ok(&east, true, None)),
        ("unproven, no one's address", PeerCluster::Unproven, None, addr("198.18.9.9:80"), unproven("198.18.9.9:80")),
        ("unproven, a gateway's address", PeerCluster::Unproven, None, addr("198.18.255.1:15008"), unproven("198.18.255.1:15008")),
        ("unproven, unknown hostname", PeerCluster::Unproven, None, host("nothing", 80),
            unproven("nothing.default.svc.cluster.local:80")),
    ];
    for (case, peer, claim, target, want) in table {
        assert_eq!(
            origin_cluster(&snap, hop, &peer, claim, &target),
            want,
            "{case}"
        );
    }
}

#[test]
fn the_destination_checks_the_scope_of_what_the_connect_names() {
    let snap = mesh();
    let pod = |name: &str| snap.workloads().find(|w| w.name == name).unwrap().clone();
    let (app, web, bare) = (pod("app"), pod("web"), pod("bare"));
    let (east, west) = (ClusterId::new("east"), ClusterId::new("west"));
    let proven = |c: &ClusterId| PeerCluster::Proven(c.clone());
    let out = |svc: &str, origin: PeerCluster| {
        Err(OriginError::OutOfScope {
            service: crate::testing::key(svc),
            origin,
            endpoint_cluster: ClusterId::new("east"),
        })
    };
    #[rustfmt::skip]
    let table: Vec<DestRow<'_>> = vec![
        // By hostname (the inner tunnel of double HBONE): that service's scope.
        ("global name, from west", &app, host("shared-global", 80), 8080, proven(&west), Ok(())),
        ("local name, from west", &app, host("shared-local", 80), 8080, proven(&west), out("shared-local", proven(&west))),
        ("local name, from east", &app, host("shared-local", 80), 8080, proven(&east), Ok(())),
        ("allow-list name, from west", &web, host("west-only", 80), 8080, proven(&west), Ok(())),
        ("allow-list name, from east", &web, host("west-only", 80), 8080, proven(&east), out("west-only", proven(&east))),
        // By pod address: every service the pod serves on that port.
        ("pod behind local and global, from west", &app, addr("198.18.1.20:8080"), 8080, proven(&west),
            out("shared-local", proven(&west))),
        ("pod behind local and global, from east", &app, addr("198.18.1.20:8080"), 8080, proven(&east), Ok(())),
        ("another port, only local behind it, from west", &app, addr("198.18.1.20:9090"), 9090, proven(&west),
            out("admin-local", proven(&west))),
        ("a port no service maps to, from west", &app, addr("198.18.1.20:7000"), 7000, proven(&west), Ok(())),
        ("pod behind global and allow-list, from west", &web, addr("198.18.1.30:8080"), 8080, proven(&west), Ok(())),
        ("pod behind global and allow-list, from east", &web, addr("198.18.1.30:8080"), 8080, proven(&east),
            out("west-only", proven(&east))),
        ("pod behind nothing, from west", &bare, addr("198.18.1.40:8080"), 8080, proven(&west), Ok(())),
        // No cluster proven: global only.
        ("unproven, global name", &app, host("shared-global", 80), 8080, PeerCluster::Unproven, Ok(())),
        ("unproven, local name", &app, host("shared-local", 80), 8080, PeerCluster::Unproven,
            out("shared-local", PeerCluster::Unproven)),
        ("unproven, pod behind local and global", &app, addr("198.18.1.20:8080"), 8080, PeerCluster::Unproven,
            out("shared-local", PeerCluster::Unproven)),
        ("unproven, pod behind nothing", &bare, addr("198.18.1.40:8080"), 8080, PeerCluster::Unproven, Ok(())),
    ];
    for (case, pod, target, port, peer, want) in table {
        assert_eq!(
            destination_admits(&snap, pod, &target, port, &peer),
            want,
            "{case}"
        );
    }
}
