//! The source address a pod's app sees on a connection the mesh delivers: the client's own
//! address when it is proven, else the proxy's (the pod's own address, as before).
//!
//! A destination's node proxy connects to the app from the original source address
//! (`IP_TRANSPARENT` in the pod's namespace), so app logs, rate limits and network policies see
//! the client. What it may use is decided here, on what is proven, never on what a peer
//! claims alone:
//!
//! - **A tunnel** ([`for_destination`], [`for_waypoint`]): the address in its `forwarded: for=`
//!   (looked up on the network `x-forwarded-network` names, else this hop's), then its TCP
//!   peer's address (on this hop's network), each only if the snapshot says that address belongs
//!   to a workload whose identity is the identity the peer's certificate proves. A peer can
//!   therefore name only an address of its own identity. Double HBONE: the inner tunnel's peer is
//!   the source pod's node proxy, so its forwarded address (the source pod's, on the source's
//!   network) is proven by the inner certificate; the gateway's address (the TCP peer) belongs to
//!   no workload of that identity and is never used.
//! - **A relay the destination trusts**: the address forwarded by a peer that stands for the
//!   connection's source by the mesh's own configuration, used as it is. At a destination node
//!   proxy that is the destination's own waypoint (its instances' identities, [`is_waypoint_of`]):
//!   the waypoint applied this same rule to its own peer and forwards only what it proved.
//!   At a waypoint it is the landing workload's own identity relaying plain TCP from outside the
//!   mesh (its node proxy says so in the baggage): the address it forwards is the TCP peer it
//!   accepted, and only the pod that receives the connection is concerned by it. ztunnel uses
//!   its TCP peer only (a waypoint's own address reaches the app); Ferry carries the original
//!   client through the waypoint instead.
//! - **Plain TCP** captured on the pod's inbound port ([`for_plain`]): its TCP peer, which the
//!   kernel saw.
//!
//! Otherwise (nothing proven, or an address no socket can take: unspecified, loopback,
//! multicast, another family than the target's) the app sees the pod's own address, and the
//! decision says why ([`AppSource::Own`]).

use std::net::IpAddr;

use crate::authz::is_waypoint_of;
use crate::identity::Identity;
use crate::model::{NetworkAddress, NetworkId, Workload};
use crate::snapshot::{AddressOwner, Snapshot};

/// What a tunnel tells about its source: the proven peer, where its TCP connection came from,
/// and what its CONNECT claims.
#[derive(Clone, Copy, Debug)]
pub struct TunnelSource<'a> {
    /// The identity the peer's certificate proves.
    pub peer: &'a Identity,
    /// The TCP peer's address (for double HBONE, the gateway's).
    pub peer_ip: IpAddr,
    /// The network of this hop (where the TCP peer's address is looked up).
    pub network: &'a NetworkId,
    /// `forwarded: for=`, if the CONNECT carries one.
    pub forwarded_for: Option<IpAddr>,
    /// `x-forwarded-network`, if the CONNECT carries one (the inner tunnel of double HBONE).
    pub forwarded_network: Option<&'a str>,
}

/// Why an address is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The tunnel's forwarded address belongs to a workload of the peer's identity.
    Forwarded,
    /// The tunnel's TCP peer address belongs to a workload of the peer's identity.
    PeerAddress,
    /// Forwarded by the destination's own waypoint.
    FromWaypoint,
    /// Forwarded by the landing workload's own node proxy, relaying plain TCP.
    RelayedPlain,
    /// The TCP peer of plain TCP.
    PlainPeer,
}

/// Why the app sees the pod's own address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    #[error(
        "neither the forwarded address ({forwarded}) nor the peer's ({peer_ip}) belongs to a workload of the peer's identity"
    )]
    NotThePeers { forwarded: Shown, peer_ip: IpAddr },
    #[error("{0} cannot be a connection's source")]
    Unusable(IpAddr),
}

/// An optional address as a log shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown(pub Option<IpAddr>);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{ip}"),
            None => f.write_str("none"),
        }
    }
}

/// The source address the app sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppSource {
    /// Connect to the app from this address.
    Use { ip: IpAddr, proof: Proof },
    /// Connect from the pod's own address.
    Own(Unproven),
}

// === impl AppSource ===

impl AppSource {
    /// The address to connect from, if not the pod's own.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Self::Use { ip, .. } => Some(*ip),
            Self::Own(_) => None,
        }
    }
}

/// At a destination node proxy, for a tunnel to `dst` whose target is `target_ip`: the
/// forwarded address of `dst`'s own waypoint, else a proven one ([`proven`]).
pub fn for_destination(
    snap: &Snapshot,
    dst: &Workload,
    target_ip: IpAddr,
    t: &TunnelSource<'_>,
) -> AppSource {
    let trusted = is_waypoint_of(snap, dst, Some(t.peer)).then_some(Proof::FromWaypoint);
    decide(snap, target_ip, t, trusted)
}

/// At a waypoint, for a tunnel landing on `landing` (if it lands on a workload) at
/// `target_ip`: the forwarded address of plain TCP relayed by `landing`'s own node proxy
/// (`relayed_plaintext`: its baggage says so; only `landing`'s identity may), else a proven one.
pub fn for_waypoint(
    landing: Option<&Workload>,
    snap: &Snapshot,
    target_ip: IpAddr,
    t: &TunnelSource<'_>,
    relayed_plaintext: bool,
) -> AppSource {
    let relayed =
        relayed_plaintext && landing.is_some_and(|w| w.identity().ok().as_ref() == Some(t.peer));
    decide(snap, target_ip, t, relayed.then_some(Proof::RelayedPlain))
}

/// For plain TCP from `peer_ip` to `target_ip`: the TCP peer, if a socket can take it.
pub fn for_plain(peer_ip: IpAddr, target_ip: IpAddr) -> AppSource {
    if usable(peer_ip, target_ip) {
        AppSource::Use {
            ip: peer_ip,
            proof: Proof::PlainPeer,
        }
    } else {
        AppSource::Own(Unproven::Unusable(peer_ip))
    }
}

fn decide(
    snap: &Snapshot,
    target_ip: IpAddr,
    t: &TunnelSource<'_>,
    trusted: Option<Proof>,
) -> AppSource {
    let forwarded = t.forwarded_for.filter(|ip| usable(*ip, target_ip));
    if let (Some(proof), Some(ip)) = (trusted, forwarded) {
        return AppSource::Use { ip, proof };
    }
    match proven(snap, target_ip, t) {
        Some(ip) => AppSource::Use {
            ip,
            proof: if Some(ip) == forwarded {
                Proof::Forwarded
            } else {
                Proof::PeerAddress
            },
        },
        None => AppSource::Own(Unproven::NotThePeers {
            forwarded: Shown(t.forwarded_for),
            peer_ip: t.peer_ip,
        }),
    }
}

/// The tunnel's source address that the snapshot proves belongs to the peer and a socket
/// connecting to `target_ip` can take: its forwarded address on the network it names (else
/// this hop's), else its TCP peer's on this hop's network.
pub fn proven(snap: &Snapshot, target_ip: IpAddr, t: &TunnelSource<'_>) -> Option<IpAddr> {
    let forwarded_network = t
        .forwarded_network
        .map_or_else(|| t.network.clone(), NetworkId::new);
    let forwarded = t
        .forwarded_for
        .filter(|ip| usable(*ip, target_ip) && owned_by(snap, &forwarded_network, *ip, t.peer));
    forwarded.or_else(|| {
        (usable(t.peer_ip, target_ip) && owned_by(snap, t.network, t.peer_ip, t.peer))
            .then_some(t.peer_ip)
    })
}

/// Whether `ip` on `network` is the address of a workload whose identity is `peer`.
fn owned_by(snap: &Snapshot, network: &NetworkId, ip: IpAddr, peer: &Identity) -> bool {
    let addr = NetworkAddress::new(network.clone(), ip);
    let Some(AddressOwner::Workload(uid)) = snap.owner(&addr) else {
        return false;
    };
    snap.workload(uid)
        .is_some_and(|w| w.identity().ok().as_ref() == Some(peer))
}

/// Whether a socket connecting to `target` can be bound to `ip`.
fn usable(ip: IpAddr, target: IpAddr) -> bool {
    let unicast = match ip {
        IpAddr::V4(v4) => !v4.is_broadcast() && !v4.is_multicast(),
        IpAddr::V6(v6) => !v6.is_multicast(),
    };
    unicast && !ip.is_unspecified() && !ip.is_loopback() && ip.is_ipv4() == target.is_ipv4()
}

#[cfg(test)]
#[path = "app_source_tests.rs"]
mod tests;
