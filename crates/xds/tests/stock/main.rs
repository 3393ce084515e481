//! What a stock Istio peer (ztunnel) reads from Ferry's xDS: decoded with Istio's upstream
//! messages only, nothing is NACKed, services carry their SANs, and its L4 authorization never
//! admits a connection that Ferry's own evaluation refuses (docs/xds.md, "What a stock Istio
//! peer reads").

mod mtls;
mod peer;

use std::net::IpAddr;
use std::path::PathBuf;

use ferry_core::authz::{self, ConnInfo};
use ferry_core::identity::Identity;
use ferry_core::model::{
    Action, Cidr, Clause, HeaderMatch, Match, Policy, PolicyKey, PolicyScope, Rule,
    ServiceAccountMatch, StringMatch, WaypointFor, Workload,
};
use ferry_core::random::SplitMix64;
use ferry_core::snapshot::Snapshot;
use ferry_core::testing::Gen;
use ferry_core::testing::{MeshBuilder, key, waypoint_ref};
use ferry_xds::convert::decode_authorization;
use ferry_xds::resources::ResourceSet;
use peer::{Conn, DryRun, StockPeer};
use proptest::prelude::*;

/// Ferry's own L4 verdict, with the waypoint exemption a Ferry node computes.
fn ferry_allows(snap: &Snapshot, dst: &Workload, c: &Conn<'_>) -> bool {
    authz::authorize(
        snap,
        dst,
        &ConnInfo {
            source_identity: c.identity,
            source_ip: c.src,
            destination_ip: c.dst,
            destination_port: c.port,
            via_waypoint: authz::is_waypoint_of(snap, dst, c.identity),
        },
    )
    .is_allowed()
}

/// The stock peer admits `c` only if Ferry does, whether or not it honours dry_run.
fn assert_never_looser(snap: &Snapshot, peer: &StockPeer, dst: &Workload, c: &Conn<'_>) {
    for mode in [DryRun::Honoured, DryRun::Ignored] {
        if peer.allows(dst.uid.as_str(), c, mode) {
            assert!(
                ferry_allows(snap, dst, c),
                "a stock peer ({mode:?} dry_run) admits {c:?} to {}, Ferry refuses it; \
                 policies: {:#?}",
                dst.uid,
                snap.policies().collect::<Vec<_>>()
            );
        }
    }
}

fn stock(snap: &Snapshot) -> StockPeer {
    StockPeer::read(&ResourceSet::encode(snap)).unwrap_or_else(|nacks| panic!("NACK: {nacks:?}"))
}

/// Every service with a workload endpoint names its endpoints' identities upstream.
fn assert_sans(snap: &Snapshot, peer: &StockPeer) {
    use ferry_core::snapshot::Endpoint;
    for s in snap.services() {
        let upstream = &peer.services[&s.key().to_string()].subject_alt_names;
        for e in snap.endpoints(&s.key()) {
            if let Endpoint::Workload(u) = e {
                let id = snap.workload(u).unwrap().identity().unwrap().to_string();
                assert!(
                    upstream.contains(&id),
                    "{}: {id} not in {upstream:?}",
                    s.key()
                );
            }
        }
    }
}

#[test]
fn every_example_reads_safely_at_a_stock_peer() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        let snap = ferry_topology::load_file(&path).unwrap().snapshot;
        let peer = stock(&snap);
        assert_sans(&snap, &peer);
        let mut ports: Vec<u16> = snap
            .policies()
            .flat_map(|p| &p.rules)
            .flat_map(|r| &r.clauses)
            .flat_map(|c| &c.matches)
            .flat_map(|m| m.destination_ports.iter().chain(&m.not_destination_ports))
            .copied()
            .chain(
                snap.workloads()
                    .flat_map(|w| w.services.values().flatten().map(|p| p.target_port)),
            )
            .collect();
        ports.sort_unstable();
        ports.dedup();
        let sources: Vec<(IpAddr, Option<Identity>)> = snap
            .workloads()
            .map(|w| (w.addresses[0], w.identity().ok()))
            .chain([("203.0.113.7".parse().unwrap(), None)])
            .collect();
        for dst in snap.workloads() {
            for &ip in &dst.addresses {
                for (src, id) in &sources {
                    for &port in &ports {
                        let c = Conn {
                            src: *src,
                            identity: id.as_ref(),
                            dst: ip,
                            port,
                        };
                        assert_never_looser(&snap, &peer, dst, &c);
                        n += 1;
                    }
                }
            }
        }
    }
    assert!(n > 1000, "only {n} connections checked");
}

// === The four cases of issue 19 ===

fn sleep_and_echo() -> MeshBuilder {
    let mut m = MeshBuilder::new();
    m.cluster("c", "net").node("n", "c", "r/z/s");
    m.pod("sleep", "n", "198.18.1.1");
    m.pod("echo", "n", "198.18.1.2");
    m.service("echo", &[("net", "198.18.100.1")], 80, 8080);
    m.backs("echo", "echo");
    m
}

fn policy(name: &str, action: Action, m: Match) -> Policy {
    Policy {
        name: name.into(),
        namespace: "default".into(),
        scope: PolicyScope::Namespace,
        action,
        rules: vec![Rule {
            clauses: vec![Clause { matches: vec![m] }],
        }],
        dry_run: false,
    }
}

fn conn<'a>(snap: &'a Snapshot, from: &str, to: &str, port: u16) -> (Conn<'a>, &'a Workload) {
    let w = |n: &str| snap.workloads().find(|w| w.name == n).unwrap();
    let (src, dst) = (w(from), w(to));
    let id = Box::leak(Box::new(src.identity().unwrap()));
    let c = Conn {
        src: src.addresses[0],
        identity: Some(id),
        dst: dst.addresses[0],
        port,
    };
    (c, dst)
}

#[test]
fn a_get_only_allow_refuses_every_connection_at_a_stock_peer() {
    let mut m = sleep_and_echo();
    m.policy(policy(
        "get-only",
        Action::Allow,
        Match {
            principals: vec![StringMatch::Exact(
                "cluster.local/ns/default/sa/sleep".into(),
            )],
            destination_ports: vec![8080],
            methods: vec![StringMatch::Exact("GET".into())],
            ..Match::default()
        },
    ));
    let snap = m.build();
    let peer = stock(&snap);
    let (c, dst) = conn(&snap, "sleep", "echo", 8080);
    // A POST would ride this connection: a stock peer cannot see the method, so it refuses.
    assert!(!peer.allows(dst.uid.as_str(), &c, DryRun::Honoured));
    assert!(!ferry_allows(&snap, dst, &c));
    // Ferry's decoder still reads the method.
    let set = ResourceSet::encode(&snap);
    let body = &set.by_type[ferry_api::AUTHORIZATION_TYPE]["default/get-only"].body;
    let back = decode_authorization("default/get-only", body).unwrap();
    assert_eq!(
        &back,
        &**snap.policy(&PolicyKey::new("default", "get-only")).unwrap()
    );
}

#[test]
fn a_deny_post_spares_the_waypoints_connection_at_a_stock_destination() {
    let mut m = sleep_and_echo();
    m.waypoint("wp", WaypointFor::All);
    m.waypoint_pod("wp", "wp-1", "n", "198.18.1.3");
    m.service_mut("echo").waypoint = Some(waypoint_ref("wp"));
    m.policy(policy(
        "deny-post",
        Action::Deny,
        Match {
            destination_ports: vec![8080],
            methods: vec![StringMatch::Exact("POST".into())],
            ..Match::default()
        },
    ));
    let snap = m.build();
    let peer = stock(&snap);
    // The waypoint judged each request: its connection to echo goes through.
    let (c, dst) = conn(&snap, "wp-1", "echo", 8080);
    assert!(ferry_allows(&snap, dst, &c));
    assert!(peer.allows(dst.uid.as_str(), &c, DryRun::Honoured));
    // A connection around the waypoint is refused at L4 (fail closed), at both.
    let (c, dst) = conn(&snap, "sleep", "echo", 8080);
    assert!(!ferry_allows(&snap, dst, &c));
    assert!(!peer.allows(dst.uid.as_str(), &c, DryRun::Honoured));
    // Another port is not concerned.
    let (c, dst) = conn(&snap, "sleep", "echo", 9090);
    assert!(peer.allows(dst.uid.as_str(), &c, DryRun::Honoured));
}

#[test]
fn the_projection_does_not_depend_on_hash_order() {
    // Two destinations with different waypoints: the DENY is split by destination address.
    let build = || {
        let mut m = sleep_and_echo();
        for i in 0..6 {
            m.pod(&format!("echo{i}"), "n", &format!("198.18.2.{}", i + 1));
            m.backs(&format!("echo{i}"), "echo");
        }
        m.waypoint("wp", WaypointFor::All);
        m.waypoint_pod("wp", "wp-1", "n", "198.18.1.3");
        m.workload_mut("echo").waypoint = Some(waypoint_ref("wp"));
        m.policy(policy(
            "deny-post",
            Action::Deny,
            Match {
                methods: vec![StringMatch::Exact("POST".into())],
                ..Match::default()
            },
        ));
        ResourceSet::encode(&m.build()).by_type[ferry_api::AUTHORIZATION_TYPE]["default/deny-post"]
            .clone()
    };
    let first = build();
    for _ in 0..8 {
        assert_eq!(build().version, first.version);
    }
}

#[test]
fn audit_decodes_at_a_stock_peer_and_changes_nothing() {
    let mut m = sleep_and_echo();
    let mut p = policy(
        "audit-sleep",
        Action::Audit,
        Match {
            principals: vec![StringMatch::Presence],
            ..Match::default()
        },
    );
    m.policy(p.clone());
    p.name = "dry-allow".into();
    p.action = Action::Allow;
    p.dry_run = true;
    m.policy(p);
    let snap = m.build();
    let peer = stock(&snap); // no "unknown enumeration value 2"
    let up = &peer.policies["default/audit-sleep"];
    assert_eq!(up.action, ferry_api::stock::security::Action::Deny as i32);
    assert!(up.dry_run && up.rules.is_empty());
    let (c, dst) = conn(&snap, "sleep", "echo", 8080);
    for mode in [DryRun::Honoured, DryRun::Ignored] {
        assert!(peer.allows(dst.uid.as_str(), &c, mode));
    }
    let set = ResourceSet::encode(&snap);
    let body = &set.by_type[ferry_api::AUTHORIZATION_TYPE]["default/audit-sleep"].body;
    assert_eq!(
        decode_authorization("default/audit-sleep", body)
            .unwrap()
            .action,
        Action::Audit
    );
}

#[test]
fn services_behind_a_gateway_carry_their_endpoints_sans() {
    let mut m = MeshBuilder::new();
    m.cluster("east", "net-east").node("e1", "east", "r/z/s");
    m.cluster("west", "net-west").node("w1", "west", "r/z/s");
    m.gateway("gw-west", "west", "198.19.255.2");
    m.pod("sleep", "e1", "198.18.1.1");
    m.pod("echo", "w1", "198.18.2.1");
    m.service("echo", &[("net-east", "198.18.100.1")], 80, 8080);
    m.backs("echo", "echo");
    let snap = m.build();
    let peer = stock(&snap);
    let sans = &peer.services[&key("echo").to_string()].subject_alt_names;
    assert_eq!(sans, &["spiffe://cluster.local/ns/default/sa/echo"]);
    assert_sans(&snap, &peer);
    // Ferry's own decoder still reads the configured SANs (none).
    let set = ResourceSet::encode(&snap);
    let body = &set.by_type[ferry_api::ADDRESS_TYPE][&key("echo").to_string()].body;
    let Ok(ferry_xds::convert::Decoded::Service(s)) =
        ferry_xds::convert::decode_address(&key("echo").to_string(), body)
    else {
        panic!("a service")
    };
    assert!(s.subject_alt_names.is_empty());
}

// === Generated meshes and policies ===

const NAMESPACES: [&str; 2] = ["default", "prod"];
const ACCOUNTS: [&str; 3] = ["sleep", "echo", "wp"];
const PORTS: [u16; 4] = [8080, 9090, 15008, 80];

fn strings(g: &mut Gen, pool: &[StringMatch]) -> Vec<StringMatch> {
    if g.chance(75) {
        return Vec::new();
    }
    (0..1 + g.below(2)).map(|_| g.pick_owned(pool)).collect()
}

fn cidrs(g: &mut Gen) -> Vec<Cidr> {
    if g.chance(80) {
        return Vec::new();
    }
    let pool = [
        "198.18.0.0/16",
        "198.18.1.1/32",
        "198.18.1.2",
        "198.18.2.0/24",
        "10.0.0.0/8",
        "0.0.0.0/0",
        "::/0",
    ];
    (0..1 + g.below(2))
        .map(|_| g.pick_owned(&pool).parse().unwrap())
        .collect()
}

fn gen_match(g: &mut Gen, principals: &[String]) -> Match {
    let ns: Vec<StringMatch> = NAMESPACES
        .iter()
        .map(|n| StringMatch::Exact((*n).into()))
        .chain([
            StringMatch::Presence,
            StringMatch::Prefix(String::new()),
            StringMatch::Exact(String::new()),
            StringMatch::Suffix("od".into()),
        ])
        .collect();
    let pr: Vec<StringMatch> = principals
        .iter()
        .map(|p| StringMatch::Exact(p.clone()))
        .chain([
            StringMatch::Presence,
            StringMatch::Prefix("cluster.local/ns/prod/".into()),
            StringMatch::Suffix("/sa/sleep".into()),
            StringMatch::Prefix(String::new()),
        ])
        .collect();
    let sa: Vec<ServiceAccountMatch> = NAMESPACES
        .iter()
        .flat_map(|n| {
            ACCOUNTS.iter().map(|a| ServiceAccountMatch {
                namespace: (*n).into(),
                service_account: (*a).into(),
            })
        })
        .collect();
    let ports = |g: &mut Gen| -> Vec<u16> {
        if g.chance(65) {
            Vec::new()
        } else {
            (0..1 + g.below(2)).map(|_| g.pick_owned(&PORTS)).collect()
        }
    };
    let sas = |g: &mut Gen| -> Vec<ServiceAccountMatch> {
        if g.chance(80) {
            Vec::new()
        } else {
            vec![g.pick_owned(&sa)]
        }
    };
    let verbs = [
        StringMatch::Exact("GET".into()),
        StringMatch::Exact("POST".into()),
    ];
    let mut m = Match {
        namespaces: strings(g, &ns),
        not_namespaces: strings(g, &ns),
        principals: strings(g, &pr),
        not_principals: strings(g, &pr),
        service_accounts: sas(g),
        not_service_accounts: sas(g),
        source_ips: cidrs(g),
        not_source_ips: cidrs(g),
        destination_ips: cidrs(g),
        not_destination_ips: cidrs(g),
        destination_ports: ports(g),
        not_destination_ports: ports(g),
        ..Match::default()
    };
    if g.chance(35) {
        match g.below(4) {
            0 => m.methods = vec![g.pick_owned(&verbs)],
            1 => m.not_methods = vec![g.pick_owned(&verbs)],
            2 => m.paths = vec![StringMatch::Prefix("/admin".into())],
            _ => {
                m.headers = vec![HeaderMatch {
                    name: "x-debug".into(),
                    values: vec![StringMatch::Presence],
                }];
            }
        }
    }
    m
}

fn gen_policy(g: &mut Gen, i: usize, principals: &[String]) -> Policy {
    let rules = (0..g.below(4))
        .map(|_| Rule {
            clauses: (0..g.below(3))
                .map(|_| Clause {
                    matches: (0..g.below(4)).map(|_| gen_match(g, principals)).collect(),
                })
                .collect(),
        })
        .collect();
    Policy {
        name: format!("p{i}"),
        namespace: g.pick_owned(&NAMESPACES).into(),
        scope: g.pick_owned(&[
            PolicyScope::Mesh,
            PolicyScope::Namespace,
            PolicyScope::WorkloadSelector,
        ]),
        action: g.pick_owned(&[Action::Allow, Action::Deny, Action::Deny, Action::Audit]),
        rules,
        dry_run: g.chance(10),
    }
}

/// A mesh of pods in two namespaces and a few service accounts, waypoints, services and
/// policies.
fn generate(seed: u64) -> Option<Snapshot> {
    let mut g = Gen(SplitMix64::new(seed));
    let mut m = MeshBuilder::new();
    m.cluster("c0", "n0").node("c0-n", "c0", "r/z/s");
    let two = g.chance(50);
    if two {
        m.cluster("c1", "n1").node("c1-n", "c1", "r/z/s");
        m.gateway("gw-c1", "c1", "198.19.255.2");
    }
    let node = |g: &mut Gen| if two && g.chance(40) { "c1-n" } else { "c0-n" };
    let mut addr = 0;
    let mut next = || {
        addr += 1;
        format!("198.18.{}.{}", 1 + addr / 200, 1 + addr % 200)
    };
    let mut waypoints = Vec::new();
    for i in 0..g.below(3) {
        let name = format!("wp{i}");
        m.waypoint(&name, WaypointFor::All);
        for k in 0..1 + g.below(2) {
            let inst = format!("{name}-{k}");
            let n = node(&mut g);
            m.waypoint_pod(&name, &inst, n, &next());
            let w = m.workload_mut(&inst);
            w.service_account = if g.chance(50) {
                "wp".into()
            } else {
                inst.clone()
            };
        }
        waypoints.push(name);
    }
    let mut pods = Vec::new();
    for i in 0..2 + g.below(6) {
        let name = format!("pod{i}");
        let n = node(&mut g);
        let a = next();
        let w = m.pod(&name, n, &a);
        w.namespace = g.pick_owned(&NAMESPACES).into();
        w.service_account = g.pick_owned(&ACCOUNTS).into();
        pods.push(name);
    }
    for p in &pods {
        if !waypoints.is_empty() && g.chance(25) {
            let wp = g.pick_owned(&waypoints);
            m.workload_mut(p).waypoint = Some(waypoint_ref(&wp));
        }
    }
    for i in 0..1 + g.below(3) {
        let name = format!("svc{i}");
        let vip = next();
        m.service(&name, &[("n0", &vip)], 80, g.pick_owned(&PORTS));
        if !waypoints.is_empty() && g.chance(40) {
            let wp = g.pick_owned(&waypoints);
            m.service_mut(&name).waypoint = Some(waypoint_ref(&wp));
        }
        for p in &pods {
            if g.chance(40) {
                m.backs(p, &name);
            }
        }
    }
    let principals: Vec<String> = m
        .workloads
        .iter()
        .map(|w| format!("cluster.local/ns/{}/sa/{}", w.namespace, w.service_account))
        .collect();
    for i in 0..1 + g.below(4) {
        let p = gen_policy(&mut g, i, &principals);
        if p.scope == PolicyScope::WorkloadSelector {
            for w in &mut m.workloads {
                if g.chance(50) {
                    w.authorization_policies.push(p.key());
                }
            }
        }
        m.policy(p);
    }
    m.try_build().ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Thousands of (policy, connection) cases: a stock peer never admits what Ferry refuses,
    /// never NACKs, and Ferry's decoder reads every policy back unchanged.
    #[test]
    fn a_stock_peer_never_admits_what_ferry_refuses(seed in any::<u64>()) {
        let Some(snap) = generate(seed) else {
            return Ok(());
        };
        let set = ResourceSet::encode(&snap);
        let peer = StockPeer::read(&set).unwrap_or_else(|n| panic!("NACK: {n:?}"));
        assert_sans(&snap, &peer);
        for p in snap.policies() {
            let name = p.key().to_string();
            let body = &set.by_type[ferry_api::AUTHORIZATION_TYPE][&name].body;
            prop_assert_eq!(&decode_authorization(&name, body).unwrap(), &**p);
        }
        let sources: Vec<(IpAddr, Option<Identity>)> = snap
            .workloads()
            .map(|w| (w.addresses[0], w.identity().ok()))
            .chain([("10.1.2.3".parse().unwrap(), None)])
            .collect();
        let mut g = Gen(SplitMix64::new(seed ^ 0x5eed));
        for dst in snap.workloads() {
            for _ in 0..12 {
                let (src, id) = g.pick_owned(&sources);
                let c = Conn {
                    src,
                    identity: id.as_ref(),
                    dst: dst.addresses[0],
                    port: g.pick_owned(&PORTS),
                };
                assert_never_looser(&snap, &peer, dst, &c);
            }
        }
    }
}

/// A terminating workload: a stock peer reads UNHEALTHY (so it opens no new connection to it
/// either, no more than Ferry), and Ferry reads it back as terminating.
#[test]
fn a_terminating_workload_is_unhealthy_at_a_stock_peer_and_terminating_at_ferry() {
    use ferry_core::model::Health;
    let mut m = sleep_and_echo();
    m.workload_mut("echo").health = Health::Terminating;
    let snap = m.build();
    let peer = stock(&snap);
    let echo = peer.workloads.values().find(|w| w.name == "echo").unwrap();
    assert_eq!(
        echo.status,
        ferry_api::stock::workload::WorkloadStatus::Unhealthy as i32
    );
    let set = ResourceSet::encode(&snap);
    let mut seen = 0;
    for (n, v) in &set.by_type[ferry_api::ADDRESS_TYPE] {
        if let ferry_xds::convert::Decoded::Workload(w) =
            ferry_xds::convert::decode_address(n, &v.body).unwrap()
        {
            let want = if w.name == "echo" {
                Health::Terminating
            } else {
                Health::Healthy
            };
            assert_eq!(w.health, want, "{n}");
            seen += 1;
        }
    }
    assert_eq!(seen, 2);
}
