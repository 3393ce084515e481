//! Who may ask for which identity: the co-location check, as a pure function of the snapshot.

use ferry_core::identity::Identity;
use ferry_core::model::{ClusterId, NodeName};
use ferry_core::snapshot::Snapshot;

/// The credential name prefix of east-west gateways (`gateway.<gateway name>`).
pub const GATEWAY_PREFIX: &str = "gateway.";

/// Why a node may not have a certificate for an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("node {node} is not part of the mesh")]
    UnknownNode { node: NodeName },
    #[error("no workload in the mesh has identity {identity}")]
    UnknownIdentity { identity: Identity },
    #[error("no workload with identity {identity} runs on node {node} (it runs on: {elsewhere})")]
    OnAnotherNode {
        identity: Identity,
        node: NodeName,
        elsewhere: String,
    },
}

/// Allows `node` to obtain `identity` only if a workload with that identity is scheduled on it.
///
/// Returns the cluster the certificate is for, which the CA binds into it
/// ([`ferry_tls::cluster`]): the node's cluster (a waypoint instance's too: it authenticates as
/// the node it runs on), or the gateway's. It is the cluster of whoever holds the key, so every
/// hop can take a tunnel's origin cluster from the certificate instead of the caller's word.
pub fn authorize(
    snap: &Snapshot,
    node: &NodeName,
    identity: &Identity,
) -> Result<ClusterId, Denial> {
    // An east-west gateway authenticates as `gateway.<name>` and may hold only its own identity.
    if let Some(gw) = node.as_str().strip_prefix(GATEWAY_PREFIX) {
        return match snap.gateways().find(|g| g.name == gw) {
            Some(g) if &g.identity == identity => Ok(g.cluster.clone()),
            Some(g) => Err(Denial::OnAnotherNode {
                identity: identity.clone(),
                node: node.clone(),
                elsewhere: format!("gateway {} holds only {}", g.name, g.identity),
            }),
            None => Err(Denial::UnknownNode { node: node.clone() }),
        };
    }
    let Some(this) = snap.node(node) else {
        return Err(Denial::UnknownNode { node: node.clone() });
    };
    let has = |uid| {
        snap.workload(uid)
            .and_then(|w| w.identity().ok())
            .is_some_and(|id| &id == identity)
    };
    if snap.workloads_on_node(node).iter().any(has) {
        return Ok(this.cluster.clone());
    }
    let mut elsewhere: Vec<String> = snap
        .workloads()
        .filter(|w| w.identity().ok().as_ref() == Some(identity))
        .map(|w| {
            w.node
                .as_ref()
                .map_or_else(|| "(no node)".to_string(), ToString::to_string)
        })
        .collect();
    if elsewhere.is_empty() {
        return Err(Denial::UnknownIdentity {
            identity: identity.clone(),
        });
    }
    elsewhere.sort();
    elsewhere.dedup();
    Err(Denial::OnAnotherNode {
        identity: identity.clone(),
        node: node.clone(),
        elsewhere: elsewhere.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use ferry_core::testing::MeshBuilder;

    use super::*;

    #[test]
    fn a_granted_identity_comes_with_the_cluster_of_whoever_holds_the_key() {
        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east").cluster("west", "net-west");
        m.node("east-1", "east", "r/z/s")
            .node("west-1", "west", "r/z/s");
        m.pod("sleep", "east-1", "198.18.1.10");
        m.pod("sleep-west", "west-1", "198.19.1.10");
        m.gateway("gw-west", "west", "198.19.255.1");
        let snap = m.build();
        let id = |name: &str| {
            snap.workloads()
                .find(|w| w.name == name)
                .unwrap()
                .identity()
                .unwrap()
        };
        let gw = snap.gateways().next().unwrap().identity.clone();
        assert_eq!(
            authorize(&snap, &"east-1".into(), &id("sleep")),
            Ok(ClusterId::new("east"))
        );
        assert_eq!(
            authorize(&snap, &"west-1".into(), &id("sleep-west")),
            Ok(ClusterId::new("west"))
        );
        assert_eq!(
            authorize(&snap, &"gateway.gw-west".into(), &gw),
            Ok(ClusterId::new("west"))
        );
        // Refusals carry no cluster at all.
        assert!(authorize(&snap, &"west-1".into(), &id("sleep")).is_err());
    }
}
