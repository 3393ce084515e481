//! East-west gateways: the one entry point of a network for traffic from other networks.

use std::net::IpAddr;

use serde::Serialize;

use super::{ClusterId, NetworkAddress, NetworkId};
use crate::identity::Identity;

/// An east-west gateway. Other networks reach it on `address:hbone_port` with double HBONE.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gateway {
    pub name: String,
    pub network: NetworkId,
    pub cluster: ClusterId,
    /// Reachable from every network (this is the address other networks dial).
    pub address: IpAddr,
    pub hbone_port: u16,
    pub identity: Identity,
}

impl Gateway {
    pub fn network_address(&self) -> NetworkAddress {
        NetworkAddress::new(self.network.clone(), self.address)
    }
}
