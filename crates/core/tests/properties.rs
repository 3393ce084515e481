//! Property tests over generated multi-cluster meshes: whatever the topology, routing keeps its
//! invariants (scope, reachability) and never panics.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ferry_core::identity::Identity;
use ferry_core::model::{
    AddressEndpoint, ClusterId, FailoverMinimum, HBONE_PORT, Health, HealthPolicy, LbMode,
    LoadBalancing, LocalityScope, NetworkAddress, PortMapping, ScopeRule, ServiceScope,
    TunnelProtocol, WaypointFor,
};
use ferry_core::random::SplitMix64;
use ferry_core::route::{Destination, Plan, Source, Transport, route};
use ferry_core::snapshot::{AddressOwner, Snapshot};
use ferry_core::testing::Gen;
use ferry_core::testing::{MeshBuilder, waypoint_ref};
use proptest::prelude::*;

/// Per-network address allocator: networks reuse the same addresses on purpose (overlap).
fn addr(net: usize, counters: &mut [u32]) -> String {
    counters[net] += 1;
    let n = counters[net];
    Ipv4Addr::new(198, 18, (n / 250) as u8, (n % 250 + 1) as u8).to_string()
}

fn scope(g: &mut Gen, clusters: &[String]) -> ServiceScope {
    let rule = |g: &mut Gen| match g.below(3) {
        0 => ScopeRule::Global,
        1 => ScopeRule::Local,
        _ => ScopeRule::Clusters(
            clusters
                .iter()
                .filter(|_| g.chance(50))
                .map(|c| ClusterId::from(c.as_str()))
                .collect(),
        ),
    };
    let mut s = ServiceScope {
        default: rule(g),
        by_cluster: Default::default(),
    };
    for c in clusters {
        if g.chance(20) {
            s.by_cluster.insert(c.as_str().into(), rule(g));
        }
    }
    s
}

fn load_balancing(g: &mut Gen) -> Option<LoadBalancing> {
    let all = [
        LocalityScope::Network,
        LocalityScope::Cluster,
        LocalityScope::Region,
        LocalityScope::Zone,
        LocalityScope::Subzone,
        LocalityScope::Node,
    ];
    match g.below(4) {
        0 => None,
        1 => Some(LoadBalancing::prefer_close()),
        _ => {
            let mode = *g.pick(&[LbMode::Standard, LbMode::Strict, LbMode::Failover]);
            // Graduated failover on half of the failover services: its spills must keep scope.
            let failover_minimum = (mode == LbMode::Failover && g.chance(50)).then(|| {
                if g.chance(50) {
                    FailoverMinimum::Endpoints(1 + u32::try_from(g.below(4)).unwrap_or(1))
                } else {
                    FailoverMinimum::Percent(*g.pick(&[10, 50, 70, 100]))
                }
            });
            Some(LoadBalancing {
                mode,
                routing_preference: all.iter().copied().filter(|_| g.chance(50)).collect(),
                health_policy: *g.pick(&[HealthPolicy::OnlyHealthy, HealthPolicy::AllowAll]),
                failover_minimum,
            })
        }
    }
}

/// A random mesh, and the addresses worth dialling in it.
fn generate(seed: u64) -> (Snapshot, Vec<(usize, String)>) {
    let mut g = Gen(SplitMix64::new(seed));
    let mut m = MeshBuilder::new();
    let networks = 1 + g.below(3);
    let mut counters = vec![0u32; networks];
    let clusters: Vec<String> = (0..1 + g.below(4)).map(|i| format!("c{i}")).collect();
    let mut cluster_net = Vec::new();
    for c in &clusters {
        let net = g.below(networks);
        cluster_net.push(net);
        m.cluster(c, &format!("n{net}"));
    }
    let mut gw_nets = BTreeSet::new();
    for (ci, c) in clusters.iter().enumerate() {
        let net = cluster_net[ci];
        if g.chance(75) && gw_nets.insert(net) {
            // Gateways are dialled from every network: their addresses are unique mesh-wide.
            let a = format!("198.19.255.{}", ci + 1);
            m.gateway(&format!("gw-{c}"), c, &a);
        }
    }
    let mut nodes = Vec::new();
    for (ci, c) in clusters.iter().enumerate() {
        for k in 0..1 + g.below(3) {
            let name = format!("{c}-node{k}");
            let loc = format!("r{}/z{}/s{}", g.below(2), g.below(2), g.below(2));
            m.node(&name, c, &loc);
            nodes.push((name, cluster_net[ci]));
        }
    }
    let mut dests: Vec<(usize, String)> = Vec::new();
    let mut pods = Vec::new();
    for i in 0..2 + g.below(18) {
        let (node, net) = g.pick(&nodes).clone();
        let a = addr(net, &mut counters);
        let name = format!("pod{i}");
        let w = m.pod(&name, &node, &a);
        w.health = if g.chance(25) {
            Health::Unhealthy
        } else {
            Health::Healthy
        };
        w.capacity = g.below(3) as u32 + u32::from(g.chance(80));
        if g.chance(15) {
            w.tunnel = TunnelProtocol::Tcp;
        }
        dests.push((net, format!("{a}:{}", 8000 + g.below(3))));
        pods.push(name);
    }
    let mut waypoints = Vec::new();
    for i in 0..g.below(3) {
        let name = format!("wp{i}");
        let for_ = *g.pick(&[
            WaypointFor::Service,
            WaypointFor::Workload,
            WaypointFor::All,
        ]);
        let sc = scope(&mut g, &clusters);
        let lb = load_balancing(&mut g);
        let wp = m.waypoint(&name, for_);
        wp.scope = sc;
        wp.load_balancing = lb;
        for k in 0..g.below(4) {
            let (node, net) = g.pick(&nodes).clone();
            let a = addr(net, &mut counters);
            let inst = format!("{name}-i{k}");
            m.waypoint_pod(&name, &inst, &node, &a);
            if g.chance(25) {
                m.workload_mut(&inst).health = Health::Unhealthy;
            }
        }
        waypoints.push((name, for_));
    }
    for p in &pods {
        if g.chance(15)
            && let Some((wp, _)) = waypoints.iter().find(|(_, f)| f.serves_workloads())
        {
            m.workload_mut(p).waypoint = Some(waypoint_ref(wp));
        }
    }
    let mut vips: Vec<(String, usize, String)> = Vec::new();
    let n_services = 1 + g.below(6);
    for i in 0..n_services {
        let name = format!("svc{i}");
        let mut svc_vips = Vec::new();
        for net in 0..networks {
            if g.chance(70) {
                svc_vips.push((format!("n{net}"), addr(net, &mut counters), net));
            }
        }
        let vip_pairs: Vec<(&str, &str)> = svc_vips
            .iter()
            .map(|(n, a, _)| (n.as_str(), a.as_str()))
            .collect();
        let sc = scope(&mut g, &clusters);
        let lb = load_balancing(&mut g);
        let s = m.service(&name, &vip_pairs, 80, 8080);
        s.scope = sc;
        s.load_balancing = lb;
        for (_, a, net) in &svc_vips {
            vips.push((name.clone(), *net, a.clone()));
            dests.push((*net, format!("{a}:80")));
        }
        if g.chance(40)
            && let Some((wp, _)) = waypoints.iter().find(|(_, f)| f.serves_services())
        {
            m.service_mut(&name).waypoint = Some(waypoint_ref(wp));
        }
        for p in &pods {
            if g.chance(35) {
                m.backs(p, &name);
            }
        }
    }
    // Address endpoints: other services' VIPs (cycles allowed) and unknown addresses, on half
    // of the services (a service with any has no reachability for its waypoints).
    for i in 0..n_services {
        let n = if g.chance(50) { 1 + g.below(2) } else { 0 };
        for _ in 0..n {
            let (net, a) = if !vips.is_empty() && g.chance(80) {
                let (_, net, a) = g.pick(&vips).clone();
                (net, a)
            } else {
                let net = g.below(networks);
                (net, addr(net, &mut counters))
            };
            let cluster = g.pick(&clusters).clone();
            m.service_mut(&format!("svc{i}"))
                .address_endpoints
                .push(AddressEndpoint {
                    address: NetworkAddress::new(
                        format!("n{net}").as_str().into(),
                        a.parse().unwrap(),
                    ),
                    cluster: cluster.as_str().into(),
                    ports: if g.chance(50) {
                        vec![PortMapping {
                            service_port: 80,
                            target_port: 80,
                        }]
                    } else {
                        vec![]
                    },
                });
        }
    }
    dests.push((0, "198.19.200.1:443".to_string()));
    (m.build(), dests)
}

/// Checks one plan against the invariants.
fn check_plan(
    snap: &Snapshot,
    src: &ferry_core::model::Workload,
    plan: &Plan,
) -> Result<(), String> {
    let origin = &src.cluster;
    let landing = plan.landing.as_ref().and_then(|u| snap.workload(u));
    // Scope: the final service admits the landing cluster (also when it is a waypoint instance).
    if let (Some(key), Some(l)) = (&plan.service, landing) {
        let svc = snap.service(key).ok_or("plan names an unknown service")?;
        if !svc.scope.admits(&l.cluster, origin) {
            return Err(format!(
                "service {key} scope does not admit {} from {origin}",
                l.cluster
            ));
        }
        if let Some(wp) = &plan.waypoint {
            for wk in snap.waypoints_served_by(l) {
                let ws = snap.service(wk).unwrap();
                if !ws.scope.admits(&l.cluster, origin) {
                    return Err(format!(
                        "waypoint {wp} scope does not admit {} from {origin}",
                        l.cluster
                    ));
                }
            }
        }
    }
    // Workload-attached waypoints: only on the source's network.
    if plan.waypoint.is_some() && plan.service.is_none() {
        let l = landing.ok_or("waypoint plan without landing")?;
        if l.network != src.network {
            return Err(format!("workload waypoint {} on another network", l.uid));
        }
    }
    // Reachability: the next hop is on the source's network, or is another network's gateway.
    match &plan.transport {
        Transport::Hbone {
            connect_to,
            identities,
            ..
        } => {
            let owner = snap.owner(&NetworkAddress::new(src.network.clone(), connect_to.ip()));
            if !matches!(owner, Some(AddressOwner::Workload(_))) || connect_to.port() != HBONE_PORT
            {
                return Err(format!(
                    "HBONE next hop {connect_to} is not a workload on {}",
                    src.network
                ));
            }
            if identities.is_empty() {
                return Err("HBONE without expected identities".into());
            }
        }
        Transport::Tcp { connect_to } => {
            let owner = snap.owner(&NetworkAddress::new(src.network.clone(), connect_to.ip()));
            if !matches!(owner, Some(AddressOwner::Workload(_))) {
                return Err(format!(
                    "TCP next hop {connect_to} is not a workload on {}",
                    src.network
                ));
            }
        }
        Transport::GatewayHbone {
            gateway,
            identities,
            ..
        } => {
            let gw = snap
                .gateways()
                .find(|g| SocketAddr::new(g.address, g.hbone_port) == *gateway)
                .ok_or_else(|| format!("{gateway} is not a gateway"))?;
            if gw.network == src.network {
                return Err("gateway hop on the source's own network".into());
            }
            // Every identity the inner handshake accepts belongs to an admitted endpoint there.
            let key = plan
                .service
                .as_ref()
                .ok_or("gateway hop without a service")?;
            let svc = snap.service(key).unwrap();
            for id in identities {
                let ok = snap.workloads().any(|w| {
                    w.identity().ok().as_ref() == Some(id)
                        && w.network == gw.network
                        && (svc.scope.admits(&w.cluster, origin) || plan.waypoint.is_some())
                });
                if !ok && !svc.subject_alt_names.contains(id) {
                    return Err(format!(
                        "inner identity {id} is not an admitted endpoint on {}",
                        gw.network
                    ));
                }
            }
        }
        Transport::Passthrough { connect_to } => {
            let owner = snap.owner(&NetworkAddress::new(src.network.clone(), connect_to.ip()));
            if matches!(
                owner,
                Some(AddressOwner::Workload(_) | AddressOwner::Service(_))
            ) {
                return Err(format!("mesh address {connect_to} passed through"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn routing_keeps_scope_and_reachability(seed in any::<u64>(), rng_seed in any::<u64>()) {
        let (snap, dests) = generate(seed);
        let mut rng = SplitMix64::new(rng_seed);
        let sources: Vec<_> = snap.workloads().cloned().collect();
        for src in &sources {
            for (_, d) in &dests {
                let dst = Destination::Addr(d.parse().unwrap());
                let decision = route(&snap, Source::new(src), &dst, &mut rng);
                if let Ok(plan) = &decision.outcome
                    && let Err(e) = check_plan(&snap, src, plan) {
                        prop_assert!(false, "seed {seed}: {} -> {d}: {e}\nsteps: {:#?}", src.uid, decision.steps);
                    }
            }
            for s in snap.services() {
                let dst = Destination::Host { hostname: s.hostname.clone(), port: 80 };
                let decision = route(&snap, Source::new(src), &dst, &mut rng);
                if let Ok(plan) = &decision.outcome
                    && let Err(e) = check_plan(&snap, src, plan) {
                        prop_assert!(false, "seed {seed}: {} -> {}: {e}", src.uid, s.hostname);
                    }
            }
        }
    }

    #[test]
    fn a_waypoint_acting_for_another_cluster_respects_that_cluster(seed in any::<u64>()) {
        let (snap, dests) = generate(seed);
        let clusters: Vec<ClusterId> = snap.clusters().map(|c| c.name.clone()).collect();
        let mut rng = SplitMix64::new(seed);
        for src in snap.workloads() {
            for origin in &clusters {
                for (_, d) in &dests {
                    let dst = Destination::Addr(d.parse().unwrap());
                    let decision = route(&snap, Source::on_behalf_of(src, origin), &dst, &mut rng);
                    if let (Ok(plan), Some(key)) = (&decision.outcome, decision.outcome.as_ref().ok().and_then(|p| p.service.clone()))
                        && let Some(l) = plan.landing.as_ref().and_then(|u| snap.workload(u)) {
                            let svc = snap.service(&key).unwrap();
                            prop_assert!(svc.scope.admits(&l.cluster, origin), "seed {seed}: {key} leaked to {} for {origin}", l.cluster);
                        }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A retry before the first byte: the same decision with the failed landing set aside. Its
    /// plan keeps scope and reachability, never lands on the failed endpoint, and fails rather
    /// than reach outside the scope when nothing else is left.
    #[test]
    fn a_retry_never_moves_a_pick_out_of_scope(seed in any::<u64>(), rng_seed in any::<u64>()) {
        let (snap, dests) = generate(seed);
        let mut rng = SplitMix64::new(rng_seed);
        for src in snap.workloads() {
            for (_, d) in &dests {
                let dst = Destination::Addr(d.parse().unwrap());
                let Ok(first) = route(&snap, Source::new(src), &dst, &mut rng).outcome else {
                    continue;
                };
                let (Some(_), Some(failed)) = (&first.service, first.landing.clone()) else {
                    continue;
                };
                let failed = [failed];
                let retry = route(&snap, Source::new(src).excluding(&failed), &dst, &mut rng);
                if let Ok(plan) = &retry.outcome {
                    if let Err(e) = check_plan(&snap, src, plan) {
                        prop_assert!(false, "seed {seed}: retry {} -> {d}: {e}", src.uid);
                    }
                    prop_assert!(plan.landing.as_ref() != Some(&failed[0]), "seed {seed}: retried onto {}", failed[0]);
                }
            }
        }
    }

    /// Outlier detection fed random connect failures (and successes), then every decision with
    /// its ejections: a plan still keeps scope and reachability, never lands on an ejected
    /// endpoint, and at most half of any service's endpoints are ejected.
    #[test]
    fn ejection_never_moves_a_pick_out_of_scope(seed in any::<u64>(), rng_seed in any::<u64>()) {
        use ferry_core::outlier::{OutlierConfig, Outliers};
        use ferry_core::snapshot::Endpoint;
        let (snap, dests) = generate(seed);
        let mut g = Gen(SplitMix64::new(rng_seed));
        let uids: Vec<_> = snap.workloads().map(|w| w.uid.clone()).collect();
        let mut o = Outliers::new(OutlierConfig { consecutive_failures: 2, ..OutlierConfig::default() });
        let now = std::time::Instant::now();
        for _ in 0..uids.len() * 4 {
            let u = g.pick(&uids);
            if g.chance(80) {
                o.failure(&snap, u, now);
            } else {
                o.success(u);
            }
        }
        let ejected = o.ejected();
        for s in snap.services() {
            let eps = snap.endpoints(&s.key());
            let out = eps.iter().filter(|e| matches!(e, Endpoint::Workload(u) if ejected.contains(u))).count();
            prop_assert!(out * 2 <= eps.len(), "seed {seed}: {out} of {} endpoints of {} ejected", eps.len(), s.key());
        }
        let mut rng = SplitMix64::new(rng_seed);
        for src in snap.workloads() {
            for (_, d) in &dests {
                let dst = Destination::Addr(d.parse().unwrap());
                let decision = route(&snap, Source::new(src).ejecting(&ejected), &dst, &mut rng);
                if let Ok(plan) = &decision.outcome {
                    if let Err(e) = check_plan(&snap, src, plan) {
                        prop_assert!(false, "seed {seed}: {} -> {d}: {e}", src.uid);
                    }
                    // A service's endpoint (a decision that chose among candidates) is never an
                    // ejected one; a workload dialled by its own address is not a pick.
                    if plan.service.is_some() && let Some(l) = &plan.landing {
                        prop_assert!(!ejected.contains(l), "seed {seed}: {} -> {d} landed on ejected {l}", src.uid);
                    }
                }
            }
        }
    }
}

#[test]
fn generated_meshes_are_not_trivial() {
    // Guards the generator itself: across seeds it must produce every kind of outcome, or the
    // properties above would be vacuous.
    let mut kinds = BTreeSet::new();
    for seed in 0..600 {
        let (snap, dests) = generate(seed);
        let mut rng = SplitMix64::new(seed);
        for src in snap.workloads() {
            for (_, d) in &dests {
                let dst = Destination::Addr(d.parse().unwrap());
                let decision = route(&snap, Source::new(src), &dst, &mut rng);
                let kind = match &decision.outcome {
                    Ok(p) => match (&p.transport, &p.waypoint) {
                        (Transport::GatewayHbone { .. }, _) => "gateway",
                        (Transport::Hbone { .. }, Some(_)) => "waypoint",
                        (Transport::Hbone { .. }, None) => "hbone",
                        (Transport::Tcp { .. }, _) => "tcp",
                        (Transport::Passthrough { .. }, _) => "passthrough",
                    },
                    Err(e) => match e {
                        ferry_core::route::RouteError::NoEndpoint { .. } => "no-endpoint",
                        ferry_core::route::RouteError::NoWaypointEndpoint { .. } => "no-waypoint",
                        ferry_core::route::RouteError::NestingCycle { .. } => "cycle",
                        _ => "other-error",
                    },
                };
                kinds.insert(kind);
                for step in &decision.steps {
                    match step {
                        ferry_core::route::Step::Nested { .. } => {
                            kinds.insert("nested");
                        }
                        // A graduated failover that shared the traffic between tiers.
                        ferry_core::route::Step::Tiers { tiers, .. }
                            if tiers.iter().filter(|t| t.share_ppm > 0).count() > 1 =>
                        {
                            kinds.insert("spill");
                        }
                        ferry_core::route::Step::Dropped {
                            reason: ferry_core::route::DropReason::NoLiveBackendsNear { .. },
                            ..
                        } => {
                            kinds.insert("reach");
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    for k in [
        "gateway",
        "waypoint",
        "hbone",
        "tcp",
        "passthrough",
        "no-endpoint",
        "no-waypoint",
        "cycle",
        "nested",
        "spill",
        "reach",
    ] {
        assert!(kinds.contains(k), "generator never produced {k}: {kinds:?}");
    }
    let _ = (
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        Identity::new("a", "b", "c"),
    );
}
