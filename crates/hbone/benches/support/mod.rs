//! What both HBONE benchmarks set up alike: the two identities and a server handler that
//! admits every CONNECT.

use ferry_core::identity::Identity;
use ferry_hbone::headers::Refusal;
use ferry_hbone::server::{ConnectRequest, Handler};

pub(crate) const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
pub(crate) const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

/// Admits every CONNECT: the benchmarks measure the tunnel, not policy.
pub(crate) struct AllowAll;

impl Handler for AllowAll {
    type Admit = ();

    fn admit(&self, _: &ConnectRequest) -> Result<(), Refusal> {
        Ok(())
    }
}

/// `s` as an identity; the benchmarks' constants are valid SPIFFE IDs.
pub(crate) fn id(s: &str) -> Identity {
    s.parse().expect("a SPIFFE identity")
}

pub(crate) mod rig;
