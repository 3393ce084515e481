//! The routing algorithm. See the module docs of [`crate::route`] for the invariants.

use std::net::SocketAddr;

use super::{
    CandidateRole, Class, Decision, Destination, DropReason, Plan, RouteError, Source, Step,
    Transport, describe_ip,
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

/// Decides where a connection from `src` to `dst` goes.
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
    pub subset: Option<&'a std::collections::BTreeMap<String, String>>,
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
    let mut cx = Cx {
        snap,
        src,
        within: *within,
        rng,
        steps: Vec::new(),
    };
    let outcome = cx.route(dst);
    Decision {
        steps: cx.steps,
        outcome,
    }
}

struct Cx<'a, 'r> {
    snap: &'a Snapshot,
    src: Source<'a>,
    within: Within<'r>,
    rng: &'r mut dyn Random,
    steps: Vec<Step>,
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
    label: String,
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
            label: w.uid.to_string(),
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
            label: format!("address {}", a.address),
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

// === impl Cx ===

impl<'a> Cx<'a, '_> {
    fn route(&mut self, dst: &Destination) -> Result<Plan, RouteError> {
        let src = self.src.workload;
        match dst {
            Destination::Addr(addr) => {
                let na = NetworkAddress::new(src.network.clone(), addr.ip());
                let class = match self.snap.owner(&na) {
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
                };
                self.steps.push(Step::Classified {
                    destination: addr.to_string(),
                    class: class.clone(),
                });
                let mut plan = match &class {
                    Class::Service { service, port } => {
                        let mut chain = Vec::new();
                        self.service(service, *port, Some(*addr), &mut chain)?
                    }
                    Class::Workload { workload, port } => {
                        let w =
                            self.snap
                                .workload(workload)
                                .ok_or_else(|| RouteError::NoAddress {
                                    workload: workload.clone(),
                                    network: src.network.clone(),
                                })?;
                        self.workload(w, *port)?
                    }
                    Class::OutsideMesh | Class::Gateway { .. } => {
                        self.passthrough(*addr, class.clone())
                    }
                };
                plan.class = class;
                Ok(plan)
            }
            Destination::Host { hostname, port } => {
                let key = self.resolve_host(hostname)?;
                let class = Class::Service {
                    service: key.clone(),
                    port: *port,
                };
                self.steps.push(Step::Classified {
                    destination: dst.to_string(),
                    class: class.clone(),
                });
                let mut chain = Vec::new();
                let mut plan = self.service(&key, *port, None, &mut chain)?;
                plan.class = class;
                Ok(plan)
            }
        }
    }

    fn resolve_host(&self, hostname: &str) -> Result<ServiceKey, RouteError> {
        let keys = self.snap.services_by_hostname(hostname);
        match keys {
            [] => Err(RouteError::UnknownHost {
                hostname: hostname.to_string(),
            }),
            [one] => Ok(one.clone()),
            many => many
                .iter()
                .find(|k| k.namespace == self.src.workload.namespace)
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

    fn passthrough(&mut self, addr: SocketAddr, class: Class) -> Plan {
        let transport = Transport::Passthrough { connect_to: addr };
        self.steps.push(Step::Transport {
            transport: transport.clone(),
        });
        Plan {
            class,
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
                self.steps.push(Step::WaypointSkipped {
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
                Some(DropReason::OutOfScope {
                    service: key.clone(),
                    rule: svc.scope.rule_for(cand.cluster).clone(),
                    source_cluster: origin.clone(),
                })
            } else if let Some(p) = parent {
                Some(DropReason::OutOfScope {
                    service: p.key(),
                    rule: p.scope.rule_for(cand.cluster).clone(),
                    source_cluster: origin.clone(),
                })
            } else if let Some(labels) = subset {
                Some(DropReason::NotInSubset {
                    subset: labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                })
            } else if cand.target_port == 0 {
                Some(DropReason::PortNotMapped { port })
            } else {
                self.unreachable(&cand)
            };
            if let Some(reason) = reason {
                self.drop_step(CandidateRole::Endpoint, &cand, reason);
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
                self.steps.push(Step::Nested {
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
                let mut plan =
                    self.passthrough(SocketAddr::new(a.address.ip, port), Class::OutsideMesh);
                plan.service = Some(outer.key());
                Ok(plan)
            }
        }
    }

    /// Routes to a workload addressed directly.
    fn workload(&mut self, w: &'a Workload, port: u16) -> Result<Plan, RouteError> {
        if let Some(wp) = &w.waypoint {
            if self.src_is_waypoint(wp) {
                self.steps.push(Step::WaypointSkipped {
                    waypoint: describe_ref(wp),
                    why: "the source is an instance of this waypoint",
                });
            } else {
                return self.via_waypoint(wp, Attached::Workload(w, port), None);
            }
        }
        let ip = self.address_on_source_network(w)?;
        let transport = self.direct_transport(w, ip, port, &[]);
        self.steps.push(Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: Class::Workload {
                workload: w.uid.clone(),
                port,
            },
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
        self.steps.push(Step::WaypointRequired {
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
                    Some(DropReason::OutOfScope {
                        service: ws.key(),
                        rule: ws.scope.rule_for(cand.cluster).clone(),
                        source_cluster: origin.clone(),
                    })
                } else {
                    match attached {
                        Attached::Service(s, _) if !s.scope.admits(cand.cluster, origin) => {
                            Some(DropReason::OutOfScope {
                                service: s.key(),
                                rule: s.scope.rule_for(cand.cluster).clone(),
                                source_cluster: origin.clone(),
                            })
                        }
                        Attached::Workload(..) if cand.network != src_network => {
                            Some(DropReason::WaypointOnOtherNetwork {
                                network: cand.network.clone(),
                            })
                        }
                        _ => self.unreachable(&cand),
                    }
                };
            if let Some(reason) = reason {
                self.drop_step(CandidateRole::WaypointEndpoint, &cand, reason);
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
        self.steps.push(Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: Class::OutsideMesh,
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
        self.steps.push(Step::Transport {
            transport: transport.clone(),
        });
        Ok(Plan {
            class: Class::OutsideMesh,
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
    fn unreachable(&self, cand: &Cand<'_>) -> Option<DropReason> {
        if cand.network == &self.src.workload.network {
            return None;
        }
        let network = cand.network.clone();
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
        Some(DropReason::Unreachable { network, why })
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
            self.drop_step(role, &cands[i], DropReason::Balancer(drop));
        }
        let picked = choice.picked?;
        let c = &cands[picked];
        self.steps.push(Step::Picked {
            role,
            candidate: c.label.clone(),
            cluster: c.cluster.clone(),
            network: c.network.clone(),
            rank: choice.rank,
            among: lb_cfg.routing_preference.len(),
        });
        Some(picked)
    }

    fn drop_step(&mut self, role: CandidateRole, cand: &Cand<'_>, reason: DropReason) {
        self.steps.push(Step::Dropped {
            role,
            candidate: cand.label.clone(),
            cluster: cand.cluster.clone(),
            reason,
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
