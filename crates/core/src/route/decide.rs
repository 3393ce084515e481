//! The routing algorithm. See the module docs of [`crate::route`] for the invariants.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{
    CandidateRole, Class, Decision, Destination, DropReason, NoTrace, Plan, RouteError, Source,
    Step, Trace, Transport, describe_ip,
};
use crate::identity::Identity;
use crate::lb::{self, Candidate, Placement};
use crate::model::{
    AddressEndpoint, ClusterId, GatewayDestination, GatewayRef, HBONE_PORT, Health, LoadBalancing,
    Locality, NetworkAddress, NetworkId, NodeName, Service, ServiceKey, TunnelProtocol, Workload,
};
use crate::random::Random;
use crate::snapshot::{AddressOwner, Endpoint, Snapshot};

/// How deep service addresses may nest inside one another before the decision gives up.
pub const MAX_NESTING: usize = 4;

static NO_LOCALITY: Locality = Locality {
    region: String::new(),
    zone: String::new(),
    subzone: String::new(),
};

/// Decides where a connection from `src` to `dst` goes, with every step taken (`ferry explain`).
pub fn route(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    rng: &mut dyn Random,
) -> Decision {
    route_within(snap, src, dst, &Within::default(), rng)
}

/// Limits an HTTP route puts on a decision, beside the usual ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct Within<'a> {
    /// Endpoints of the destination service must carry all of these labels (a route's subset).
    pub subset: Option<&'a BTreeMap<String, String>>,
    /// The service whose route this is: its scope must admit every endpoint too, so a route
    /// never leads a request outside the scope of the service it was sent to.
    pub parent: Option<&'a Service>,
}

/// [`route`], with an HTTP route's limits.
pub fn route_within(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
) -> Decision {
    let mut steps = Vec::new();
    let outcome = route_traced(snap, src, dst, within, rng, &mut steps);
    Decision { steps, outcome }
}

/// The data path's decision: the same plan as [`route`], with no trace built at all.
pub fn plan(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    rng: &mut dyn Random,
) -> Result<Plan, RouteError> {
    plan_within(snap, src, dst, &Within::default(), rng)
}

/// [`plan`], with an HTTP route's limits.
pub fn plan_within(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
) -> Result<Plan, RouteError> {
    route_traced(snap, src, dst, within, rng, &mut NoTrace)
}

/// The decision, with its steps sent to `trace`. [`route_within`] and [`plan_within`] are this
/// with a `Vec<Step>` and with [`NoTrace`].
pub fn route_traced<T: Trace + ?Sized>(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
    trace: &mut T,
) -> Result<Plan, RouteError> {
    let (class, vip) = match dst {
        Destination::Addr(addr) => (classify(snap, src.workload, *addr), Some(*addr)),
        Destination::Host { hostname, port } => {
            let service = resolve_host(snap, src.workload, hostname)?;
            let class = Class::Service {
                service,
                port: *port,
            };
            (class, None)
        }
    };
    if trace.enabled() {
        trace.record(Step::Classified {
            destination: dst.to_string(),
            class: class.clone(),
        });
    }
    let mut cx = Cx {
        snap,
        src,
        within: *within,
        rng,
        trace,
        class: &class,
    };
    match (&class, vip) {
        (Class::Service { service, port }, vip) => cx.service(service, *port, vip, &mut Vec::new()),
        (Class::Workload { workload, port }, _) => {
            let w = snap
                .workload(workload)
                .ok_or_else(|| RouteError::NoAddress {
                    workload: workload.clone(),
                    network: src.workload.network.clone(),
                })?;
            cx.workload(w, *port)
        }
        (Class::OutsideMesh | Class::Gateway { .. }, Some(addr)) => Ok(cx.passthrough(addr)),
        // Only a dialled address classifies as outside the mesh or a gateway.
        (Class::OutsideMesh | Class::Gateway { .. }, None) => Err(RouteError::UnknownHost {
            hostname: dst.to_string(),
        }),
    }
}

/// What the address `addr`, dialled from `src`, belongs to.
fn classify(snap: &Snapshot, src: &Workload, addr: SocketAddr) -> Class {
    let na = NetworkAddress::new(src.network.clone(), addr.ip());
    match snap.owner(&na) {
        Some(AddressOwner::Service(key)) => Class::Service {
            service: key.clone(),
            port: addr.port(),
        },
        Some(AddressOwner::Workload(uid)) => Class::Workload {
            workload: uid.clone(),
            port: addr.port(),
        },
        Some(AddressOwner::Gateway(name)) => Class::Gateway { name: name.clone() },
        None => Class::OutsideMesh,
    }
}

/// The service `hostname` names for `src`: the only one, or the one in `src`'s namespace.
fn resolve_host(snap: &Snapshot, src: &Workload, hostname: &str) -> Result<ServiceKey, RouteError> {
    match snap.services_by_hostname(hostname) {
        [] => Err(RouteError::UnknownHost {
            hostname: hostname.to_string(),
        }),
        [one] => Ok(one.clone()),
        many => many
            .iter()
            .find(|k| k.namespace == src.namespace)
            .cloned()
            .ok_or_else(|| RouteError::AmbiguousHost {
                hostname: hostname.to_string(),
                candidates: many
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
    }
}

/// One decision in progress.
struct Cx<'a, 'r, T: ?Sized> {
    snap: &'a Snapshot,
    src: Source<'a>,
    within: Within<'r>,
    rng: &'r mut dyn Random,
    trace: &'r mut T,
    /// What the destination was classified as: every plan of this decision carries it.
    class: &'r Class,
}

/// What a waypoint is attached to.
#[derive(Clone, Copy)]
enum Attached<'a> {
    Service(&'a Service, u16),
    Workload(&'a Workload, u16),
}

impl Attached<'_> {
    fn describe(&self) -> String {
        match self {
            Self::Service(s, _) => format!("service {}", s.key()),
            Self::Workload(w, _) => format!("workload {}", w.uid),
        }
    }
}

/// The thing behind a candidate.
#[derive(Clone, Copy)]
enum Target<'a> {
    Workload(&'a Workload),
    Address(&'a AddressEndpoint),
}

/// A candidate endpoint that passed scope and reachability filters.
struct Cand<'a> {
    target: Target<'a>,
    cluster: &'a ClusterId,
    network: &'a NetworkId,
    node: Option<&'a NodeName>,
    locality: &'a Locality,
    health: Health,
    capacity: u32,
    target_port: u16,
}

impl<'a> Cand<'a> {
    fn workload(w: &'a Workload, target_port: u16) -> Self {
        Self {
            target: Target::Workload(w),
            cluster: &w.cluster,
            network: &w.network,
            node: w.node.as_ref(),
            locality: &w.locality,
            health: w.health,
            capacity: w.capacity,
            target_port,
        }
    }

    fn address(a: &'a AddressEndpoint, target_port: u16) -> Self {
        Self {
            target: Target::Address(a),
            cluster: &a.cluster,
            network: &a.address.network,
            node: None,
            locality: &NO_LOCALITY,
            health: Health::Healthy,
            capacity: 1,
            target_port,
        }
    }

    /// How traces name this candidate.
    fn label(&self) -> String {
        match self.target {
            Target::Workload(w) => w.uid.to_string(),
            Target::Address(a) => format!("address {}", a.address),
        }
    }

    fn lb(&self) -> Candidate<'a> {
        Candidate {
            placement: Placement {
                cluster: self.cluster,
                network: self.network,
                node: self.node,
                locality: self.locality,
            },
            health: self.health,
            capacity: self.capacity,
        }
    }
}

/// Why a candidate was set aside, borrowed from the snapshot: made into a [`DropReason`] only
/// when the decision is traced.
#[derive(Clone, Copy)]
enum SetAside<'s> {
    /// The scope of this service does not admit the source's cluster for the candidate's.
    OutOfScope(&'s Service),
    WaypointOnOtherNetwork,
    Unreachable(&'static str),
    PortNotMapped(u16),
    NotInSubset(&'s BTreeMap<String, String>),
}

// === impl SetAside ===

impl SetAside<'_> {
    fn reason(self, cand: &Cand<'_>, source_cluster: &ClusterId) -> DropReason {
        match self {
            Self::OutOfScope(s) => DropReason::OutOfScope {
                service: s.key(),
                rule: s.scope.rule_for(cand.cluster).clone(),
                source_cluster: source_cluster.clone(),
            },
            Self::WaypointOnOtherNetwork => DropReason::WaypointOnOtherNetwork {
                network: cand.network.clone(),
            },
            Self::Unreachable(why) => DropReason::Unreachable {
                network: cand.network.clone(),
                why,
            },
            Self::PortNotMapped(port) => DropReason::PortNotMapped { port },
            Self::NotInSubset(labels) => DropReason::NotInSubset {
                subset: labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            },
        }
    }
}

// === impl Cx ===

impl<'a, T: Trace + ?Sized> Cx<'a, '_, T> {
    /// Records the step `f` builds, if the decision is traced; otherwise `f` never runs.
    fn step(&mut self, f: impl FnOnce() -> Step) {
        if self.trace.enabled() {
            self.trace.record(f());
        }
    }

    fn passthrough(&mut self, addr: SocketAddr) -> Plan {
        let transport = Transport::Passthrough { connect_to: addr };
        self.step(|| Step::Transport {
            transport: transport.clone(),
        });
        Plan {
            class: self.class.clone(),
            service: None,
            waypoint: None,
            landing: None,
            landing_port: addr.port(),
            transport,
        }
    }

    /// Routes to `port` of service `key`. `vip` is the address the source dialled, if any.
    fn service(
        &mut self,
        key: &ServiceKey,
        port: u16,
        vip: Option<SocketAddr>,
        chain: &mut Vec<ServiceKey>,
    ) -> Result<Plan, RouteError> {
        let snap = self.snap;
        let svc = snap.service(key).ok_or_else(|| RouteError::UnknownHost {
            hostname: key.hostname.clone(),
        })?;
        let sp = *svc.port(port).ok_or_else(|| RouteError::NoSuchPort {
            service: key.clone(),
            port,
        })?;
        chain.push(key.clone());

        if let Some(wp) = &svc.waypoint {
            if self.src_is_waypoint(wp) {
                self.step(|| Step::WaypointSkipped {
                    waypoint: describe_ref(wp),
                    why: "the source is an instance of this waypoint",
                });
            } else {
                return self.via_waypoint(wp, Attached::Service(svc, port), vip);
            }
        }

        let origin = self.src.origin_cluster;
        let mut cands: Vec<Cand<'a>> = Vec::new();
        let endpoints = snap.endpoints(key);
        for ep in endpoints {
            let cand = match ep {
                Endpoint::Workload(uid) => {
                    let Some(w) = snap.workload(uid) else {
                        continue;
                    };
                    let target = w
                        .target_port(key, port)
                        .filter(|p| *p != 0)
                        .unwrap_or(sp.target_port);
                    Cand::workload(w, target)
                }
                Endpoint::Address(a) => {
                    let target = a
                        .ports
                        .iter()
                        .find(|m| m.service_port == port)
                        .map(|m| m.target_port)
                        .unwrap_or(sp.target_port);
                    Cand::address(a, target)
                }
            };
            let parent = self
                .within
                .parent
                .filter(|p| !p.scope.admits(cand.cluster, origin));
            let subset = self.within.subset.filter(|labels| {
                chain.len() == 1
                    && !labels.is_empty()
                    && match cand.target {
                        Target::Workload(w) => {
                            labels.iter().any(|(k, v)| w.labels.get(k) != Some(v))
                        }
                        Target::Address(_) => true,
                    }
            });
            let reason = if !svc.scope.admits(cand.cluster, origin) {
                Some(SetAside::OutOfScope(svc))
            } else if let Some(p) = parent {
                Some(SetAside::OutOfScope(p))
            } else if let Some(labels) = subset {
                Some(SetAside::NotInSubset(labels))
            } else if cand.target_port == 0 {
                Some(SetAside::PortNotMapped(port))
            } else {
                self.unreachable(&cand)
            };
            if let Some(reason) = reason {
                self.drop_step(CandidateRole::Endpoint, &cand, || {
                    reason.reason(&cand, origin)
                });
            } else {
                cands.push(cand);
            }
        }

        let lb_cfg = svc
            .load_balancing
            .clone()
            .unwrap_or_else(LoadBalancing::standard);
        let Some(picked) = self.choose(CandidateRole::Endpoint, &lb_cfg, &cands) else {
            return Err(RouteError::NoEndpoint {
                service: key.clone(),
                source_cluster: origin.clone(),
                considered: endpoints.len(),
            });
        };
        let cand = &cands[picked];
        match cand.target {
            Target::Workload(w) => self.deliver(svc, port, w, cand.target_port, &cands),
            Target::Address(a) => self.nested(svc, a, cand.target_port, chain),
        }
    }

    /// An address endpoint was picked: resolve it within this decision.
    fn nested(
        &mut self,
        outer: &Service,
        a: &AddressEndpoint,
        port: u16,
        chain: &mut Vec<ServiceKey>,
    ) -> Result<Plan, RouteError> {
        let chain_text = |chain: &[ServiceKey], next: &ServiceKey| {
            chain
                .iter()
                .chain(std::iter::once(next))
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" -> ")
        };
        match self.snap.owner(&a.address) {
            Some(AddressOwner::Service(inner)) => {
                if chain.contains(inner) {
                    return Err(RouteError::NestingCycle {
                        chain: chain_text(chain, inner),
                    });
                }
                if chain.len() >= MAX_NESTING {
                    return Err(RouteError::NestingTooDeep {
                        chain: chain_text(chain, inner),
                        limit: MAX_NESTING,
                    });
                }
                self.step(|| Step::Nested {
                    outer: outer.key(),
                    address: describe_ip(a.address.ip, port),
                    inner: inner.clone(),
                    port,
                });
                let vip = SocketAddr::new(a.address.ip, port);
                self.service(inner, port, Some(vip), chain)
            }
            Some(AddressOwner::Workload(uid)) => {
                let w = self
                    .snap
                    .workload(uid)
                    .ok_or_else(|| RouteError::NoAddress {
                        workload: uid.clone(),
                        network: a.address.network.clone(),
                    })?;
                let cands = [Cand::workload(w, port)];
                self.deliver(outer, port, w, port, &cands)
            }
            Some(AddressOwner::Gateway(_)) | None => {
                let mut plan = self.passthrough(SocketAddr::new(a.address.ip, port));
                plan.service = Some(outer.key());
                Ok(plan)
            }
        }
    }

    /// Routes to a workload addressed directly.
    fn workload(&mut self, w: &'a Workload, port: u16) -> Result<Plan, RouteError> {
        if let Some(wp) = &w.waypoint {
            if self.src_is_waypoint(wp) {
                self.step(|| Step::WaypointSkipped {
                    waypoint: describe_ref(wp),
                    why: "the source is an instance of this waypoint",
                });
            } else {
                return self.via_waypoint(wp, Attached::Workload(w, port), None);
            }
        }
        let ip = self.address_on_source_network(w)?;
        let transport = self.direct_transport(w, ip, port, &[]);
        self.step(|| Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: self.class.clone(),
            service: None,
            waypoint: None,
            landing: Some(w.uid.clone()),
            landing_port: port,
            transport,
        })
    }

    /// Routes through the waypoint `wp` attached to a service or workload.
    fn via_waypoint(
        &mut self,
        wp: &GatewayRef,
        attached: Attached<'a>,
        vip: Option<SocketAddr>,
    ) -> Result<Plan, RouteError> {
        let snap = self.snap;
        let name = describe_ref(wp);
        self.step(|| Step::WaypointRequired {
            waypoint: name.clone(),
            attached_to: attached.describe(),
        });
        let unresolved = || RouteError::UnresolvedWaypoint {
            reference: name.clone(),
            attached_to: attached.describe(),
        };
        let wp_key = match &wp.destination {
            GatewayDestination::Service(key) => Some(key.clone()),
            GatewayDestination::Address(addr) => match snap.owner(addr) {
                Some(AddressOwner::Service(key)) => Some(key.clone()),
                Some(AddressOwner::Workload(_)) => None,
                _ => return Err(unresolved()),
            },
        };
        let wp_svc = match &wp_key {
            Some(k) => Some(snap.service(k).ok_or_else(unresolved)?),
            None => None,
        };
        let instances: Vec<&'a Workload> = match (&wp_key, &wp.destination) {
            (Some(k), _) => snap
                .endpoints(k)
                .iter()
                .filter_map(|e| match e {
                    Endpoint::Workload(uid) => snap.workload(uid).map(|w| &**w),
                    Endpoint::Address(_) => None,
                })
                .collect(),
            (None, GatewayDestination::Address(addr)) => match snap.owner(addr) {
                Some(AddressOwner::Workload(uid)) => {
                    snap.workload(uid).map(|w| &**w).into_iter().collect()
                }
                _ => Vec::new(),
            },
            (None, GatewayDestination::Service(_)) => Vec::new(),
        };

        let origin = self.src.origin_cluster;
        let src_network = &self.src.workload.network;
        let mut cands = Vec::new();
        for inst in &instances {
            let cand = Cand::workload(inst, wp.hbone_port);
            let reason =
                if let Some(ws) = wp_svc.filter(|ws| !ws.scope.admits(cand.cluster, origin)) {
                    Some(SetAside::OutOfScope(ws))
                } else {
                    match attached {
                        Attached::Service(s, _) if !s.scope.admits(cand.cluster, origin) => {
                            Some(SetAside::OutOfScope(s))
                        }
                        Attached::Workload(..) if cand.network != src_network => {
                            Some(SetAside::WaypointOnOtherNetwork)
                        }
                        _ => self.unreachable(&cand),
                    }
                };
            if let Some(reason) = reason {
                self.drop_step(CandidateRole::WaypointEndpoint, &cand, || {
                    reason.reason(&cand, origin)
                });
            } else {
                cands.push(cand);
            }
        }
        let lb_cfg = wp_svc
            .and_then(|s| s.load_balancing.clone())
            .unwrap_or_else(LoadBalancing::prefer_close);
        let Some(picked) = self.choose(CandidateRole::WaypointEndpoint, &lb_cfg, &cands) else {
            return Err(RouteError::NoWaypointEndpoint {
                waypoint: name,
                attached_to: attached.describe(),
                source_cluster: origin.clone(),
                considered: instances.len(),
            });
        };
        let Target::Workload(inst) = cands[picked].target else {
            unreachable!("waypoint candidates are workloads")
        };
        let sans = wp_svc
            .map(|s| s.subject_alt_names.as_slice())
            .unwrap_or(&[]);
        let (port, transport, service) = match attached {
            Attached::Service(s, port) => {
                let transport = if &inst.network == src_network {
                    let ip = self.address_on_source_network(inst)?;
                    let authority = match vip {
                        Some(v) => v.to_string(),
                        None => match s.vip_on(src_network) {
                            Some(v) => SocketAddr::new(v, port).to_string(),
                            None => format!("{}:{port}", s.hostname),
                        },
                    };
                    Transport::Hbone {
                        connect_to: SocketAddr::new(ip, wp.hbone_port),
                        authority,
                        identities: identities([inst], sans),
                    }
                } else {
                    let same_net = cands.iter().filter(|c| c.network == &inst.network);
                    let ids = identities(same_net.filter_map(workload_of), sans);
                    self.gateway_transport(inst, format!("{}:{port}", s.hostname), ids)?
                };
                (port, transport, Some(s.key()))
            }
            Attached::Workload(w, port) => {
                let ip = self.address_on_source_network(inst)?;
                let target = self.address_on_source_network(w)?;
                let transport = Transport::Hbone {
                    connect_to: SocketAddr::new(ip, wp.hbone_port),
                    authority: SocketAddr::new(target, port).to_string(),
                    identities: identities([inst], sans),
                };
                (port, transport, None)
            }
        };
        self.step(|| Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: self.class.clone(),
            service,
            waypoint: Some(name),
            landing: Some(inst.uid.clone()),
            landing_port: port,
            transport,
        })
    }

    /// Carries the connection to endpoint `w` of `svc`, picked among `cands`.
    fn deliver(
        &mut self,
        svc: &Service,
        service_port: u16,
        w: &'a Workload,
        target_port: u16,
        cands: &[Cand<'a>],
    ) -> Result<Plan, RouteError> {
        let transport = if w.network == self.src.workload.network {
            let ip = self.address_on_source_network(w)?;
            self.direct_transport(w, ip, target_port, &svc.subject_alt_names)
        } else {
            // The gateway picks the endpoint on its own network: accept any eligible one there.
            let same_net = cands.iter().filter(|c| c.network == &w.network);
            let ids = identities(same_net.filter_map(workload_of), &svc.subject_alt_names);
            self.gateway_transport(w, format!("{}:{service_port}", svc.hostname), ids)?
        };
        self.step(|| Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: self.class.clone(),
            service: Some(svc.key()),
            waypoint: None,
            landing: Some(w.uid.clone()),
            landing_port: target_port,
            transport,
        })
    }

    fn direct_transport(
        &self,
        w: &Workload,
        ip: std::net::IpAddr,
        port: u16,
        sans: &[Identity],
    ) -> Transport {
        match w.tunnel {
            TunnelProtocol::Hbone => Transport::Hbone {
                connect_to: SocketAddr::new(ip, HBONE_PORT),
                authority: SocketAddr::new(ip, port).to_string(),
                identities: identities([w], sans),
            },
            TunnelProtocol::Tcp => Transport::Tcp {
                connect_to: SocketAddr::new(ip, port),
            },
        }
    }

    fn gateway_transport(
        &self,
        w: &Workload,
        authority: String,
        identities: Vec<Identity>,
    ) -> Result<Transport, RouteError> {
        let unknown = |gateway: String| RouteError::UnknownGateway {
            endpoint: w.uid.to_string(),
            network: w.network.clone(),
            gateway,
        };
        let gref = w
            .network_gateway
            .as_ref()
            .ok_or_else(|| unknown("(none)".into()))?;
        let gw = match &gref.destination {
            GatewayDestination::Address(addr) => self.snap.gateway_at(addr),
            GatewayDestination::Service(_) => None,
        }
        .ok_or_else(|| unknown(describe_ref(gref)))?;
        Ok(Transport::GatewayHbone {
            gateway: SocketAddr::new(gw.address, gref.hbone_port),
            gateway_identity: gw.identity.clone(),
            authority,
            identities,
        })
    }

    /// Why `cand` cannot be reached from the source's network, if it cannot.
    fn unreachable(&self, cand: &Cand<'_>) -> Option<SetAside<'static>> {
        if cand.network == &self.src.workload.network {
            return None;
        }
        let why = match cand.target {
            Target::Address(_) => "an address endpoint on another network",
            Target::Workload(w) if w.tunnel == TunnelProtocol::Tcp => {
                "a plain-TCP endpoint on another network (a gateway delivers only to node proxies)"
            }
            Target::Workload(w) => match &w.network_gateway {
                None => "no east-west gateway for its network",
                Some(GatewayRef {
                    destination: GatewayDestination::Address(a),
                    ..
                }) if self.snap.gateway_at(a).is_some() => {
                    return None;
                }
                Some(_) => "its east-west gateway is unknown",
            },
        };
        Some(SetAside::Unreachable(why))
    }

    fn choose(
        &mut self,
        role: CandidateRole,
        lb_cfg: &LoadBalancing,
        cands: &[Cand<'a>],
    ) -> Option<usize> {
        let w = self.src.workload;
        let src = Placement {
            cluster: &w.cluster,
            network: &w.network,
            node: w.node.as_ref(),
            locality: &w.locality,
        };
        let lb_cands: Vec<Candidate<'_>> = cands.iter().map(Cand::lb).collect();
        let choice = lb::choose(lb_cfg, &src, &lb_cands, self.rng);
        for (i, drop) in choice.dropped {
            self.drop_step(role, &cands[i], || DropReason::Balancer(drop));
        }
        let picked = choice.picked?;
        let c = &cands[picked];
        self.step(|| Step::Picked {
            role,
            candidate: c.label(),
            cluster: c.cluster.clone(),
            network: c.network.clone(),
            rank: choice.rank,
            among: lb_cfg.routing_preference.len(),
        });
        Some(picked)
    }

    fn drop_step(
        &mut self,
        role: CandidateRole,
        cand: &Cand<'_>,
        reason: impl FnOnce() -> DropReason,
    ) {
        self.step(|| Step::Dropped {
            role,
            candidate: cand.label(),
            cluster: cand.cluster.clone(),
            reason: reason(),
        });
    }

    fn address_on_source_network(&self, w: &Workload) -> Result<std::net::IpAddr, RouteError> {
        w.addresses
            .first()
            .copied()
            .ok_or_else(|| RouteError::NoAddress {
                workload: w.uid.clone(),
                network: w.network.clone(),
            })
    }

    /// Is the source itself an instance of waypoint `wp`? Then it does not loop back to it.
    fn src_is_waypoint(&self, wp: &GatewayRef) -> bool {
        let src = self.src.workload;
        match &wp.destination {
            GatewayDestination::Service(key) => src.services.contains_key(key),
            GatewayDestination::Address(addr) => {
                (addr.network == src.network && src.addresses.contains(&addr.ip))
                    || matches!(self.snap.owner(addr), Some(AddressOwner::Service(k)) if src.services.contains_key(k))
            }
        }
    }
}

fn workload_of<'a>(c: &Cand<'a>) -> Option<&'a Workload> {
    match c.target {
        Target::Workload(w) => Some(w),
        Target::Address(_) => None,
    }
}

/// The sorted, de-duplicated identities of `workloads` plus `extra`.
fn identities<'w>(
    workloads: impl IntoIterator<Item = &'w Workload>,
    extra: &[Identity],
) -> Vec<Identity> {
    let mut ids: Vec<Identity> = workloads
        .into_iter()
        .filter_map(|w| w.identity().ok())
        .chain(extra.iter().cloned())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

fn describe_ref(r: &GatewayRef) -> String {
    match &r.destination {
        GatewayDestination::Service(k) => k.to_string(),
        GatewayDestination::Address(a) => a.to_string(),
    }
}
