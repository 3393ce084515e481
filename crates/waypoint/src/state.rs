//! A waypoint instance's state, and what it opens to carry a connection on.

use std::net::IpAddr;
use std::sync::Arc;

use ferry_core::identity::Identity;
use ferry_core::model::{ClusterId, NetworkId, WorkloadUid};
use ferry_core::store::Store;
use ferry_hbone::pool::Pool;
use ferry_hbone::upstream::{Forward, Upstream};
use ferry_runtime::conn::ConnError;
use ferry_tls::certs::CertManager;
use ferry_tls::config::TrustBundle;

use crate::l7::Link;

/// One waypoint instance.
pub(crate) struct Waypoint {
    pub(crate) store: Arc<Store>,
    pub(crate) certs: CertManager,
    pub(crate) pool: Pool,
    pub(crate) bundle: TrustBundle,
    pub(crate) uid: WorkloadUid,
    pub(crate) identity: Identity,
    /// Its addresses (at least one): a tunnel it opens leaves from the one of the destination's
    /// family.
    pub(crate) addresses: Vec<IpAddr>,
    pub(crate) cluster: ClusterId,
    pub(crate) network: NetworkId,
    pub(crate) metrics: Arc<crate::metrics::RequestMetrics>,
    pub(crate) netns: Option<Arc<ferry_runtime::netns::Netns>>,
    /// Tells of each new snapshot: every tunnel judges itself again on it.
    pub(crate) changes: tokio::sync::watch::Receiver<u64>,
    /// Turns true at the drain deadline: tunnels carried at L4 end cleanly then.
    pub(crate) finish: tokio::sync::watch::Receiver<bool>,
    /// Accepts HBONE; refuses (and counts) when descriptors run out.
    pub(crate) acceptor: Arc<ferry_runtime::accept::Acceptor>,
    /// Itself, for the tasks that serve its tunnels.
    pub(crate) this: std::sync::Weak<Self>,
}

/// What a waypoint opened to carry a connection on.
pub(crate) enum Opened {
    /// TCP, or one tunnel.
    Direct(Upstream),
    /// The inner tunnel of double HBONE through another network's gateway.
    Double(ferry_hbone::double::Inner),
}

// === impl Opened ===

impl Opened {
    pub(crate) fn into_link(self) -> Link {
        match self {
            Self::Direct(u) => Box::new(u),
            Self::Double(inner) => Box::new(inner),
        }
    }

    /// A tunnel carried as it is: the HBONE server copies to a direct upstream; an inner
    /// tunnel is relayed here, and how that ended is told to `served`.
    pub(crate) fn into_forward(
        self,
        finish: tokio::sync::watch::Receiver<bool>,
        served: Arc<parking_lot::Mutex<Option<ConnError>>>,
    ) -> Forward {
        match self {
            Self::Direct(u) => Forward::Stream(u),
            Self::Double(mut inner) => Forward::Serve(Box::new(move |mut tunnel| {
                Box::pin(async move {
                    let bounds = ferry_hbone::copy::Bounds {
                        finish: Some(finish),
                        ..crate::upstream::waypoint_bounds()
                    };
                    if let Err(e) = ferry_hbone::copy::relay(&mut tunnel, &mut inner, bounds).await
                    {
                        tracing::debug!(error = %e, "waypoint tunnel through a gateway ended");
                        *served.lock() = Some(ConnError::from(e));
                    }
                })
            })),
        }
    }
}

/// What a tunnel the waypoint opens carries on from the one it came in: the source's metadata
/// (for the next hop's logs) and the connection's trace.
#[derive(Clone, Debug)]
pub(crate) struct Onward {
    pub(crate) baggage: Vec<(String, String)>,
    pub(crate) traceparent: Option<String>,
}
