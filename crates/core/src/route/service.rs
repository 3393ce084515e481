//! Routing to a service: its endpoints as candidates (or why each is set aside), the pick, and
//! endpoints that are themselves service addresses, resolved in the same decision.

use std::borrow::Cow;
use std::net::SocketAddr;

use super::decide::{Attached, Cand, Cx, MAX_NESTING, SetAside, Target, describe_ref};
use super::{CandidateRole, Plan, RouteError, Step, Trace, ip_port};
use crate::model::{AddressEndpoint, LoadBalancing, Service, ServiceKey};
use crate::snapshot::{AddressOwner, Endpoint};

// === impl Cx ===

impl<'a, T: Trace + ?Sized> Cx<'a, '_, T> {
    /// Routes to `port` of service `key`. `vip` is the address the source dialled, if any.
    ///
    /// `chain` holds the services resolved so far in this decision, outermost first.
    pub(super) fn service<'k>(
        &mut self,
        key: &'k ServiceKey,
        port: u16,
        vip: Option<SocketAddr>,
        chain: &mut Vec<&'k ServiceKey>,
    ) -> Result<Plan, RouteError>
    where
        'a: 'k,
    {
        let snap = self.snap;
        let svc = snap.service(key).ok_or_else(|| RouteError::UnknownHost {
            hostname: key.hostname.clone(),
        })?;
        let sp = *svc.port(port).ok_or_else(|| RouteError::NoSuchPort {
            service: key.clone(),
            port,
        })?;
        chain.push(key);

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
        let endpoints = snap.endpoints(key);
        let mut cands: Vec<Cand<'a>> = Vec::with_capacity(endpoints.len());
        let mut lost: Vec<Cand<'a>> = Vec::new();
        for ep in endpoints {
            let cand = match ep {
                Endpoint::Workload(uid) => {
                    let Some(w) = snap.workload(uid) else {
                        continue;
                    };
                    let target = w.serving_port(key, &sp);
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
                if reason.is_lost() {
                    lost.push(cand);
                }
            } else {
                cands.push(cand);
            }
        }

        let lb_cfg = svc
            .load_balancing
            .as_ref()
            .map_or_else(|| Cow::Owned(LoadBalancing::standard()), Cow::Borrowed);
        let Some(picked) = self.choose(CandidateRole::Endpoint, &lb_cfg, &cands, &lost) else {
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
    pub(super) fn nested<'k>(
        &mut self,
        outer: &Service,
        a: &AddressEndpoint,
        port: u16,
        chain: &mut Vec<&'k ServiceKey>,
    ) -> Result<Plan, RouteError>
    where
        'a: 'k,
    {
        let chain_text = |chain: &[&ServiceKey], next: &ServiceKey| {
            chain
                .iter()
                .copied()
                .chain(std::iter::once(next))
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" -> ")
        };
        match self.snap.owner(&a.address) {
            Some(AddressOwner::Service(inner)) => {
                let inner: &ServiceKey = inner;
                if chain.contains(&inner) {
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
                    address: ip_port(a.address.ip, port),
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
}
