//! Authorizing one tunnel's traffic at the waypoint: each HTTP request, or the connection at L4.

use std::net::IpAddr;
use std::sync::Arc;

use ferry_core::identity::Identity;
use ferry_core::inbound::InboundError;
use ferry_core::model::WorkloadUid;
use ferry_core::route::Family;
use ferry_core::snapshot::Snapshot;
use ferry_core::store::Store;
use ferry_runtime::conn::{ConnError, ConnErrorKind, Denial};
use ferry_runtime::telemetry::{Denials, Reporter};

/// What a waypoint knows to authorize the traffic of one tunnel.
pub(crate) struct Judge {
    pub(crate) store: Arc<Store>,
    pub(crate) landing: WorkloadUid,
    /// `None` for plain TCP from outside the mesh.
    pub(crate) source: Option<Identity>,
    pub(crate) source_ip: IpAddr,
    pub(crate) port: u16,
    /// Where a denial is counted (`ferry_policy_denied_total`).
    pub(crate) denials: Denials,
}

impl Judge {
    /// One HTTP request, or (`None`) the whole connection at L4; `Err` says why it is denied
    /// (a [`Denial`], or the destination left the mesh).
    pub(crate) fn judge(
        &self,
        request: Option<&ferry_core::authz::HttpRequest<'_>>,
    ) -> Result<(), ConnError> {
        self.judge_in(&self.store.load(), request)
    }

    /// Judges again what was allowed (the policy changed): `Err` with the denial if it is no
    /// longer. A destination that left the mesh keeps what it has (it ends with it).
    pub(crate) fn recheck(
        &self,
        request: Option<&ferry_core::authz::HttpRequest<'_>>,
    ) -> Result<(), Denial> {
        match self.judge(request) {
            Err(ConnError {
                kind: ConnErrorKind::Denied(denial),
                ..
            }) => Err(denial),
            _ => Ok(()),
        }
    }

    /// [`Judge::judge`] in `snap`, the snapshot the caller decided the rest in.
    pub(crate) fn judge_in(
        &self,
        snap: &Snapshot,
        request: Option<&ferry_core::authz::HttpRequest<'_>>,
    ) -> Result<(), ConnError> {
        let dst = snap
            .workload(&self.landing)
            .ok_or_else(|| ConnError::from(InboundError::LeftMesh))?;
        let conn = ferry_core::authz::ConnInfo {
            source_identity: self.source.as_ref(),
            source_ip: self.source_ip,
            destination_ip: Family::of_ip(self.source_ip)
                .pick(&dst.addresses)
                .unwrap_or(self.source_ip),
            destination_port: self.port,
            via_waypoint: false,
        };
        let verdict = match request {
            Some(r) => ferry_core::authz::authorize_request(snap, dst, &conn, r),
            None => ferry_core::authz::authorize(snap, dst, &conn),
        };
        if verdict.is_allowed() {
            Ok(())
        } else {
            self.denials.count(Reporter::Destination, &verdict);
            Err(Denial(verdict).into())
        }
    }
}
