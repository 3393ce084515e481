//! Routing through a waypoint: the instances that serve it, those the source may use, and the
//! tunnel to the one load balancing picks.

use std::borrow::Cow;
use std::net::SocketAddr;

use super::decide::{Attached, Cand, Cx, SetAside, Target, describe_ref, workload_of};
use super::transport::identities;
use super::{CandidateRole, DropReason, Plan, RouteError, Step, Trace, Transport, ip_port, reach};
use crate::model::{
    ClusterId, GatewayDestination, GatewayRef, LoadBalancing, Service, ServiceKey, Workload,
};
use crate::snapshot::{AddressOwner, Endpoint, Snapshot};

/// A waypoint reference resolved against the snapshot: the waypoint service (when it is one) and
/// the workloads that serve it.
///
/// The routing decision and [`crate::inbound::waypoint_instance`] both start from it, and both
/// keep an instance only if [`WaypointInstances::admits`] it. Each then applies its own rules:
/// routing also checks the attached service's scope and the network, and load-balances;
/// inbound keeps healthy instances on the destination's network and picks its own cluster first.
#[derive(Clone, Debug)]
pub(crate) struct WaypointInstances<'a> {
    /// The waypoint service; `None` for a waypoint given as one workload's address.
    pub key: Option<&'a ServiceKey>,
    pub service: Option<&'a Service>,
    pub instances: Vec<&'a Workload>,
}

// === impl WaypointInstances ===

impl<'a> WaypointInstances<'a> {
    /// Resolves `wp`. `None` when it names nothing: a service the snapshot lacks, or an address
    /// that is a gateway's or no one's.
    pub(crate) fn resolve(snap: &'a Snapshot, wp: &'a GatewayRef) -> Option<Self> {
        let key = match &wp.destination {
            GatewayDestination::Service(key) => key,
            GatewayDestination::Address(addr) => match snap.owner(addr)? {
                AddressOwner::Service(key) => key,
                AddressOwner::Workload(uid) => {
                    return Some(Self {
                        key: None,
                        service: None,
                        instances: snap.workload(uid).map(|w| &**w).into_iter().collect(),
                    });
                }
                AddressOwner::Gateway(_) => return None,
            },
        };
        let service = snap.service(key)?;
        let instances = snap
            .endpoints(key)
            .iter()
            .filter_map(|e| match e {
                Endpoint::Workload(uid) => snap.workload(uid).map(|w| &**w),
                Endpoint::Address(_) => None,
            })
            .collect();
        Some(Self {
            key: Some(key),
            service: Some(service),
            instances,
        })
    }

    /// Whether the waypoint's own scope admits instance `inst` for a source in cluster `origin`.
    /// A waypoint given as one workload's address has no scope of its own.
    pub(crate) fn admits(&self, inst: &Workload, origin: &ClusterId) -> bool {
        self.service
            .is_none_or(|s| s.scope.admits(&inst.cluster, origin))
    }
}

// === impl Cx ===

impl<'a, T: Trace + ?Sized> Cx<'a, '_, T> {
    /// Routes through the waypoint `wp` attached to a service or workload.
    pub(super) fn via_waypoint(
        &mut self,
        wp: &'a GatewayRef,
        attached: Attached<'a>,
        vip: Option<SocketAddr>,
    ) -> Result<Plan, RouteError> {
        let snap: &'a Snapshot = self.snap;
        let name = describe_ref(wp);
        self.step(|| Step::WaypointRequired {
            waypoint: name.clone(),
            attached_to: attached.describe(),
        });
        let unresolved = || RouteError::UnresolvedWaypoint {
            reference: name.clone(),
            attached_to: attached.describe(),
        };
        let set = WaypointInstances::resolve(snap, wp).ok_or_else(unresolved)?;
        let wp_svc = set.service;

        let origin = self.src.origin_cluster;
        let src_network = self.src.placement.network;
        let mut cands = Vec::with_capacity(set.instances.len());
        let mut lost = Vec::new();
        for inst in &set.instances {
            let cand = Cand::workload(inst, wp.hbone_port);
            let reason = if let Some(ws) = wp_svc.filter(|_| !set.admits(inst, origin)) {
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
                if reason.is_lost() {
                    lost.push(cand);
                }
            } else {
                cands.push(cand);
            }
        }
        if let Attached::Service(s, _) = attached {
            self.by_reach(s, &mut cands);
        }
        let lb_cfg = wp_svc
            .and_then(|s| s.load_balancing.as_ref())
            .map_or_else(|| Cow::Owned(LoadBalancing::prefer_close()), Cow::Borrowed);
        let Some(picked) = self.choose(CandidateRole::WaypointEndpoint, &lb_cfg, &cands, &lost)
        else {
            return Err(RouteError::NoWaypointEndpoint {
                waypoint: name,
                attached_to: attached.describe(),
                source_cluster: origin.clone(),
                considered: set.instances.len(),
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
                        Some(v) => ip_port(v.ip(), v.port()),
                        None => match s.vip_on(src_network) {
                            Some(v) => ip_port(v, port),
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
                    authority: ip_port(target, port),
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

    /// Waypoints chosen by what they reach (`reach.rs`): sets aside the instances in `cands` in
    /// front of dead backends of `svc`, when another has live ones near it.
    fn by_reach(&mut self, svc: &'a Service, cands: &mut Vec<Cand<'a>>) {
        let instances: Vec<&Workload> = cands.iter().filter_map(workload_of).collect();
        let Some((near, live, dead)) =
            reach::reach(self.snap, svc, self.src.origin_cluster, &instances)
        else {
            return;
        };
        self.step(|| Step::WaypointReach {
            service: svc.key(),
            near,
            instances: cands
                .iter()
                .zip(&live)
                .map(|(c, r)| (c.label(), *r))
                .collect(),
        });
        let mut kept = Vec::with_capacity(cands.len());
        for (cand, dead) in cands.drain(..).zip(dead) {
            if dead {
                self.drop_step(CandidateRole::WaypointEndpoint, &cand, || {
                    DropReason::NoLiveBackendsNear {
                        service: svc.key(),
                        near,
                    }
                });
            } else {
                kept.push(cand);
            }
        }
        *cands = kept;
    }

    /// Is the source itself an instance of waypoint `wp`, or did one send the tunnel (to a
    /// gateway)? Then it does not loop back to it.
    pub(super) fn src_is_waypoint(&self, wp: &GatewayRef) -> bool {
        if let Some(peer) = self.src.sent_by
            && WaypointInstances::resolve(self.snap, wp).is_some_and(|set| {
                set.instances
                    .iter()
                    .any(|i| i.identity().ok().as_ref() == Some(peer))
            })
        {
            return true;
        }
        let Some(src) = self.src.workload else {
            return false;
        };
        match &wp.destination {
            GatewayDestination::Service(key) => src.services.contains_key(key),
            GatewayDestination::Address(addr) => {
                (addr.network == src.network && src.addresses.contains(&addr.ip))
                    || matches!(self.snap.owner(addr), Some(AddressOwner::Service(k)) if src.services.contains_key(k))
            }
        }
    }
}
