//! Open inbound connections, re-authorized whenever the mesh's configuration changes.
//!
//! A connection allowed when it opened is closed as soon as a policy change denies it, as in
//! Istio: every tracked connection keeps a duplicate of its upstream socket, and a denied one
//! is shut down in both directions, which ends its copy loop and so the tunnel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ferry_core::authz::{self, ConnInfo};
use ferry_core::identity::Identity;
use parking_lot::Mutex;

use crate::node::Pod;

struct Tracked {
    pod: Arc<Pod>,
    peer: Option<Identity>,
    src: SocketAddr,
    port: u16,
    upstream: socket2::Socket,
}

/// The registry.
#[derive(Default)]
pub(crate) struct Conns {
    map: Mutex<HashMap<u64, Tracked>>,
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("open", &self.map.lock().len())
            .finish()
    }
}

impl Conns {
    pub(crate) fn track(
        &self,
        id: u64,
        pod: Arc<Pod>,
        peer: Option<Identity>,
        src: SocketAddr,
        port: u16,
        upstream: &tokio::net::TcpStream,
    ) {
        match socket2::SockRef::from(upstream).try_clone() {
            Ok(upstream) => {
                self.map.lock().insert(
                    id,
                    Tracked {
                        pod,
                        peer,
                        src,
                        port,
                        upstream,
                    },
                );
            }
            Err(e) => tracing::warn!(error = %e, "cannot track a connection for policy re-checks"),
        }
    }

    pub(crate) fn forget(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Re-authorizes every open connection against `snap`; closes and returns the count of those
    /// no longer allowed.
    pub(crate) fn recheck(&self, snap: &ferry_core::snapshot::Snapshot) -> usize {
        let mut closed = 0;
        self.map.lock().retain(|id, t| {
            let Some(dst) = snap.workload(&t.pod.uid) else { return true };
            let conn = ConnInfo { source_identity: t.peer.as_ref(), source_ip: t.src.ip(), destination_ip: t.pod.ip, destination_port: t.port, via_waypoint: authz::is_waypoint_of(snap, dst, t.peer.as_ref()) };
            let verdict = authz::authorize(snap, dst, &conn);
            if verdict.is_allowed() {
                return true;
            }
            let _ = t.upstream.shutdown(std::net::Shutdown::Both);
            closed += 1;
            tracing::info!(
                target: "access",
                conn_id = *id,
                src.addr = %t.src,
                src.identity = %t.peer.as_ref().map_or_else(|| "(none)".to_string(), ToString::to_string),
                dst.workload = %t.pod.uid,
                dst.port = t.port,
                reason = ?verdict.reason,
                "connection closed: no longer allowed by policy"
            );
            false
        });
        closed
    }
}
