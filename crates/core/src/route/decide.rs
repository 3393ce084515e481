//! The routing algorithm's entry points and shared parts: classification, the decision in
//! progress ([`Cx`]), candidates and the pick. Routing to a service is in `service.rs`, through
//! a waypoint in `waypoint.rs`, the transports in `transport.rs`. See the module docs of
//! [`crate::route`] for the invariants.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{
    CandidateRole, Class, Compact, Decision, Destination, DropReason, NoTrace, Plan, RouteError,
    Source, Step, Trace, Transport,
};
use crate::lb::{self, Candidate, Placement};
use crate::model::{
    AddressEndpoint, ClusterId, GatewayDestination, GatewayRef, Health, LoadBalancing, Locality,
    NetworkId, NodeName, Service, ServiceKey, Workload,
};
use crate::random::Random;
use crate::snapshot::{AddressOwner, Snapshot};

/// How deep service addresses may nest inside one another before the decision gives up.
pub(crate) const MAX_NESTING: usize = 4;

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

/// [`plan`], with an HTTP route's limits (the waypoint's routed requests).
pub fn plan_within(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
) -> Result<Plan, RouteError> {
    route_traced(snap, src, dst, within, rng, &mut NoTrace)
}

/// [`plan_within`], keeping the decision's steps in `trace` up to its fixed budget: what a
/// connection record shows of the decision ([`Compact::summary`]).
pub fn plan_compact(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
    trace: &mut Compact,
) -> Result<Plan, RouteError> {
    route_traced(snap, src, dst, within, rng, trace)
}

/// The decision, with its steps sent to `trace`. [`route_within`] and [`plan`] are this with a
/// `Vec<Step>` and with [`NoTrace`].
pub(crate) fn route_traced<T: Trace + ?Sized>(
    snap: &Snapshot,
    src: Source<'_>,
    dst: &Destination,
    within: &Within<'_>,
    rng: &mut dyn Random,
    trace: &mut T,
) -> Result<Plan, RouteError> {
    let (class, vip) = match dst {
        Destination::Addr(addr) => (classify(snap, src.placement.network, *addr), Some(*addr)),
        Destination::Host { hostname, port } => {
            let service = resolve_host(snap, src.namespace, hostname)?;
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
        family: Family::of(dst),
    };
    match (&class, vip) {
        (Class::Service { service, port }, vip) => cx.service(service, *port, vip, &mut Vec::new()),
        (Class::Workload { workload, port }, _) => {
            let w = snap
                .workload(workload)
                .ok_or_else(|| RouteError::NoAddress {
                    workload: workload.clone(),
                    network: src.placement.network.clone(),
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
fn classify(snap: &Snapshot, network: &NetworkId, addr: SocketAddr) -> Class {
    match snap.owner_on(network, addr.ip()) {
        Some(AddressOwner::Service(key)) => Class::Service {
            service: (**key).clone(),
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

/// The service `hostname` names for a source in `namespace`: the only one, or the one in
/// that namespace.
pub(crate) fn resolve_host(
    snap: &Snapshot,
    namespace: &str,
    hostname: &str,
) -> Result<ServiceKey, RouteError> {
    match snap.services_by_hostname(hostname) {
        [] => Err(RouteError::UnknownHost {
            hostname: hostname.to_string(),
        }),
        [one] => Ok(one.clone()),
        many => many
            .iter()
            .find(|k| k.namespace == namespace)
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
pub(super) struct Cx<'a, 'r, T: ?Sized> {
    pub(super) snap: &'a Snapshot,
    pub(super) src: Source<'a>,
    pub(super) within: Within<'r>,
    pub(super) rng: &'r mut dyn Random,
    pub(super) trace: &'r mut T,
    /// What the destination was classified as: every plan of this decision carries it.
    pub(super) class: &'r Class,
    /// The address family the source dialled in ([`Family::of`]): a dual-stack endpoint is
    /// reached at its address of that family.
    pub(super) family: Family,
}

/// An address family. A connection to an IPv6 address goes on over IPv6 where the endpoint has
/// an IPv6 address, and over IPv4 otherwise (and likewise the other way round); a hostname
/// goes on over IPv4 first, as its endpoints' first addresses are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of a dialled destination: an address's own, IPv4 for a hostname.
    pub fn of(dst: &Destination) -> Self {
        match dst {
            Destination::Addr(a) => Self::of_ip(a.ip()),
            Destination::Host { .. } => Self::V4,
        }
    }

    /// The family of an address.
    pub fn of_ip(ip: std::net::IpAddr) -> Self {
        if ip.is_ipv6() { Self::V6 } else { Self::V4 }
    }

    /// The address of `addresses` to reach a workload at: the first of this family, else the
    /// first of any.
    pub fn pick(self, addresses: &[std::net::IpAddr]) -> Option<std::net::IpAddr> {
        addresses
            .iter()
            .find(|a| a.is_ipv6() == (self == Self::V6))
            .or(addresses.first())
            .copied()
    }
}

/// What a waypoint is attached to.
#[derive(Clone, Copy)]
pub(super) enum Attached<'a> {
    Service(&'a Service, u16),
    Workload(&'a Workload, u16),
}

impl Attached<'_> {
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Service(s, _) => format!("service {}", s.key()),
            Self::Workload(w, _) => format!("workload {}", w.uid),
        }
    }
}

/// The thing behind a candidate.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Workload(&'a Workload),
    Address(&'a AddressEndpoint),
}

/// A candidate endpoint that passed scope and reachability filters.
pub(super) struct Cand<'a> {
    pub(super) target: Target<'a>,
    pub(super) cluster: &'a ClusterId,
    pub(super) network: &'a NetworkId,
    pub(super) node: Option<&'a NodeName>,
    pub(super) locality: &'a Locality,
    pub(super) health: Health,
    pub(super) capacity: u32,
    pub(super) target_port: u16,
}

impl<'a> Cand<'a> {
    pub(super) fn workload(w: &'a Workload, target_port: u16) -> Self {
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

    pub(super) fn address(a: &'a AddressEndpoint, target_port: u16) -> Self {
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
    pub(super) fn label(&self) -> String {
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
pub(super) enum SetAside<'s> {
    /// The scope of this service does not admit the source's cluster for the candidate's.
    OutOfScope(&'s Service),
    WaypointOnOtherNetwork,
    Unreachable(&'static str),
    PortNotMapped(u16),
    NotInSubset(&'s BTreeMap<String, String>),
    /// A connect to it failed, before any byte was sent, on an earlier attempt.
    FailedBefore,
    /// Ejected by this node's outlier detection (its connects kept failing).
    Ejected,
}

// === impl SetAside ===

impl SetAside<'_> {
    /// Set aside for what happened to it on this node (a failed connect, an ejection), not for
    /// what it is: graduated failover counts it as its tier's lost capacity.
    pub(super) fn is_lost(self) -> bool {
        matches!(self, Self::FailedBefore | Self::Ejected)
    }

    pub(super) fn reason(self, cand: &Cand<'_>, source_cluster: &ClusterId) -> DropReason {
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
            Self::FailedBefore => DropReason::FailedBefore,
            Self::Ejected => DropReason::Ejected,
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
    pub(super) fn step(&mut self, f: impl FnOnce() -> Step) {
        if self.trace.enabled() {
            self.trace.record(f());
        }
    }

    pub(super) fn passthrough(&mut self, addr: SocketAddr) -> Plan {
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

    /// Load-balances over `cands`; `absent` are the candidates set aside as ejected or failed
    /// before, which graduated failover counts as lost capacity of their tier.
    pub(super) fn choose(
        &mut self,
        role: CandidateRole,
        lb_cfg: &LoadBalancing,
        cands: &[Cand<'a>],
        absent: &[Cand<'a>],
    ) -> Option<usize> {
        let src = self.src.placement;
        let lb_cands: Vec<Candidate<'_>> = cands.iter().map(Cand::lb).collect();
        let lb_absent: Vec<Candidate<'_>> = absent.iter().map(Cand::lb).collect();
        let choice = lb::choose_among(lb_cfg, &src, &lb_cands, &lb_absent, self.rng);
        if let Some(minimum) = lb_cfg.failover_minimum
            && !choice.tiers.is_empty()
        {
            let tiers = choice.tiers.clone();
            self.step(|| Step::Tiers {
                role,
                minimum,
                tiers,
            });
        }
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

    pub(super) fn drop_step(
        &mut self,
        role: CandidateRole,
        cand: &Cand<'_>,
        reason: impl FnOnce() -> DropReason,
    ) {
        if !self.trace.wants_drop() {
            return;
        }
        self.step(|| Step::Dropped {
            role,
            candidate: cand.label(),
            cluster: cand.cluster.clone(),
            reason: reason(),
        });
    }

    pub(super) fn address_on_source_network(
        &self,
        w: &Workload,
    ) -> Result<std::net::IpAddr, RouteError> {
        self.family
            .pick(&w.addresses)
            .ok_or_else(|| RouteError::NoAddress {
                workload: w.uid.clone(),
                network: w.network.clone(),
            })
    }
}

pub(super) fn workload_of<'a>(c: &Cand<'a>) -> Option<&'a Workload> {
    match c.target {
        Target::Workload(w) => Some(w),
        Target::Address(_) => None,
    }
}

pub(super) fn describe_ref(r: &GatewayRef) -> String {
    match &r.destination {
        GatewayDestination::Service(k) => k.to_string(),
        GatewayDestination::Address(a) => a.to_string(),
    }
}
