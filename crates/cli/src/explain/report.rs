//! What `ferry explain` reports: one decision per proxy hop and the destination's verdict.

use std::sync::Arc;

use ferry_core::authz::Verdict;
use ferry_core::model::Workload;
use ferry_core::route::Decision;
use serde::Serialize;

/// What `ferry explain` reports for one connection.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) title: Option<String>,
    pub(crate) source: SourceView,
    pub(crate) destination: String,
    pub(crate) seed: u64,
    /// One decision per proxy hop: the source's node proxy, then the waypoint, if any.
    pub(crate) hops: Vec<Hop>,
}

/// One proxy's decision and what the next hop's node proxy decides about it.
#[derive(Debug, Serialize)]
pub(crate) struct Hop {
    /// Who decides: the source's node proxy, or a waypoint instance.
    pub(crate) by: String,
    pub(crate) decision: Decision,
    pub(crate) authorization: Authorization,
    /// HTTP routes this hop applies to each request, in order (the decision shown is for a
    /// request no route matches).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) http_routes: Vec<String>,
}

/// The source as the report shows it.
#[derive(Debug, Serialize)]
pub(crate) struct SourceView {
    pub(crate) workload: Arc<Workload>,
    pub(crate) identity: String,
}

/// What the destination's node proxy decides.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub(crate) enum Authorization {
    Checked {
        at: String,
        peer: String,
        port: u16,
        verdict: Verdict,
    },
    NotEnforced {
        why: String,
    },
}

impl Report {
    pub(crate) fn refused(&self) -> bool {
        self.hops.iter().any(|h| {
            h.decision.outcome.is_err()
                || matches!(&h.authorization, Authorization::Checked { verdict, .. } if !verdict.is_allowed())
        })
    }
}
