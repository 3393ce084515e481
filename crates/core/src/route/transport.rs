//! How the connection is carried to the endpoint picked: directly (HBONE or plain TCP) on the
//! source's network, or through the endpoint network's east-west gateway; and what makes an
//! endpoint on another network reachable at all.

use std::net::{IpAddr, SocketAddr};

use super::decide::{Cand, Cx, SetAside, Target, describe_ref, workload_of};
use super::{Plan, RouteError, Step, Trace, Transport, ip_port};
use crate::identity::Identity;
use crate::model::{GatewayDestination, GatewayRef, HBONE_PORT, Service, TunnelProtocol, Workload};

// === impl Cx ===

impl<'a, T: Trace + ?Sized> Cx<'a, '_, T> {
    /// Carries the connection to endpoint `w` of `svc`, picked among `cands`.
    pub(super) fn deliver(
        &mut self,
        svc: &Service,
        service_port: u16,
        w: &'a Workload,
        target_port: u16,
        cands: &[Cand<'a>],
    ) -> Result<Plan, RouteError> {
        let transport = if w.network == *self.src.placement.network {
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

    pub(super) fn direct_transport(
        &self,
        w: &Workload,
        ip: IpAddr,
        port: u16,
        sans: &[Identity],
    ) -> Transport {
        match w.tunnel {
            TunnelProtocol::Hbone => Transport::Hbone {
                connect_to: SocketAddr::new(ip, HBONE_PORT),
                authority: ip_port(ip, port),
                identities: identities([w], sans),
            },
            TunnelProtocol::Tcp => Transport::Tcp {
                connect_to: SocketAddr::new(ip, port),
            },
        }
    }

    pub(super) fn gateway_transport(
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
    /// Also: a candidate an earlier attempt of this connection failed to reach, or one outlier
    /// detection has ejected.
    pub(super) fn unreachable(&self, cand: &Cand<'_>) -> Option<SetAside<'static>> {
        if let Target::Workload(w) = cand.target
            && self.src.excluded.contains(&w.uid)
        {
            return Some(SetAside::FailedBefore);
        }
        if let Target::Workload(w) = cand.target
            && self.src.ejected.contains(&w.uid)
        {
            return Some(SetAside::Ejected);
        }
        if cand.network == self.src.placement.network {
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
}

/// The sorted, de-duplicated identities of `workloads` plus `extra`.
pub(super) fn identities<'w>(
    workloads: impl IntoIterator<Item = &'w Workload>,
    extra: &[Identity],
) -> Vec<Identity> {
    let workloads = workloads.into_iter();
    let mut ids = Vec::with_capacity(workloads.size_hint().1.unwrap_or(1) + extra.len());
    ids.extend(workloads.filter_map(|w| w.identity().ok()));
    ids.extend_from_slice(extra);
    if ids.len() > 1 {
        ids.sort();
        ids.dedup();
    }
    ids
}
