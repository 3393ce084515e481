//! The data-plane programs with an open xDS stream, and the admin address each gave in its node
//! metadata ([`ferry_xds::client::ADMIN_ADDRESS_KEY`]): where the mesh map of
//! `ferry control serve --ui` gathers connection records from.
//!
//! A program is listed from its stream's first request to the stream's end; one that
//! reconnects is listed again under its new stream. Only authenticated streams get that far
//! (outside the plaintext mode), so an address comes from a holder of a node credential.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_api::discovery::Node;
use parking_lot::Mutex;

/// The programs connected now.
#[derive(Debug, Default)]
pub struct Connected {
    streams: Mutex<BTreeMap<u64, ConnectedNode>>,
    next: AtomicU64,
}

/// One connected program, as its stream told it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectedNode {
    /// The node its credential proved (`(unauthenticated)` in the plaintext mode).
    pub node: String,
    /// Its xDS node id (`ferry~east-1`, a waypoint's uid, ...).
    pub id: String,
    /// Its cluster, as it said.
    pub cluster: String,
    /// Its admin endpoint, if it gave one; an unspecified IP (`0.0.0.0:15000`) is replaced by
    /// the address the stream came from.
    pub admin: Option<SocketAddr>,
}

/// Lists a stream's program while it lives.
#[derive(Debug)]
pub struct Registration {
    connected: Arc<Connected>,
    key: u64,
}

// === impl Connected ===

impl Connected {
    /// Lists the program that sent `node` on a stream from `peer`, until the registration is
    /// dropped.
    pub fn register(
        self: &Arc<Self>,
        authenticated: &str,
        node: &Node,
        peer: Option<SocketAddr>,
    ) -> Registration {
        let admin = admin_address(node, peer);
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(
            key,
            ConnectedNode {
                node: authenticated.to_string(),
                id: node.id.clone(),
                cluster: node.cluster.clone(),
                admin,
            },
        );
        Registration {
            connected: self.clone(),
            key,
        }
    }

    /// Every connected program, in the order their streams opened.
    pub fn list(&self) -> Vec<ConnectedNode> {
        self.streams.lock().values().cloned().collect()
    }

    /// The distinct admin addresses of the connected programs.
    pub fn admins(&self) -> Vec<(String, SocketAddr)> {
        let mut seen = std::collections::BTreeSet::new();
        self.list()
            .into_iter()
            .filter_map(|n| Some((n.id, n.admin?)))
            .filter(|(_, a)| seen.insert(*a))
            .collect()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connected.streams.lock().remove(&self.key);
    }
}

/// The admin address in `node`'s metadata, if it is an `IP:port`.
fn admin_address(node: &Node, peer: Option<SocketAddr>) -> Option<SocketAddr> {
    use prost_types::value::Kind;
    let value = node
        .metadata
        .as_ref()?
        .fields
        .get(ferry_xds::client::ADMIN_ADDRESS_KEY)?;
    let Some(Kind::StringValue(text)) = &value.kind else {
        return None;
    };
    let mut addr: SocketAddr = text.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(peer?.ip());
    }
    Some(addr)
}

#[cfg(test)]
mod tests {
    use prost_types::{Struct, Value, value::Kind};

    use super::*;

    fn node(admin: Option<&str>) -> Node {
        Node {
            id: "ferry~east-1".into(),
            cluster: "east".into(),
            metadata: admin.map(|a| Struct {
                fields: [(
                    ferry_xds::client::ADMIN_ADDRESS_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue(a.into())),
                    },
                )]
                .into_iter()
                .collect(),
            }),
        }
    }

    #[test]
    fn a_stream_is_listed_while_it_lives_with_its_admin_address() {
        let c = Arc::new(Connected::default());
        let peer: SocketAddr = "10.0.0.7:40000".parse().unwrap();
        let a = c.register("east-1", &node(Some("10.0.0.7:15000")), Some(peer));
        let b = c.register("east-2", &node(Some("0.0.0.0:15000")), Some(peer));
        let d = c.register("east-3", &node(Some("not an address")), Some(peer));
        let e = c.register("east-4", &node(None), Some(peer));
        let admins: Vec<SocketAddr> = c.list().iter().filter_map(|n| n.admin).collect();
        assert_eq!(
            admins,
            [
                "10.0.0.7:15000".parse().unwrap(),
                "10.0.0.7:15000".parse().unwrap()
            ],
            "an unspecified IP is the stream's own"
        );
        assert_eq!(c.admins().len(), 1, "one address is asked once");
        assert_eq!(c.list().len(), 4);
        drop((a, b, d, e));
        assert!(c.list().is_empty());
    }
}
