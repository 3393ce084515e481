//! Who may ask for which identity: the co-location check, as a pure function of the snapshot.

use ferry_core::identity::Identity;
use ferry_core::model::NodeName;
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
pub fn authorize(snap: &Snapshot, node: &NodeName, identity: &Identity) -> Result<(), Denial> {
    // An east-west gateway authenticates as `gateway.<name>` and may hold only its own identity.
    if let Some(gw) = node.as_str().strip_prefix(GATEWAY_PREFIX) {
        return match snap.gateways().find(|g| g.name == gw) {
            Some(g) if &g.identity == identity => Ok(()),
            Some(g) => Err(Denial::OnAnotherNode {
                identity: identity.clone(),
                node: node.clone(),
                elsewhere: format!("gateway {} holds only {}", g.name, g.identity),
            }),
            None => Err(Denial::UnknownNode { node: node.clone() }),
        };
    }
    if snap.node(node).is_none() {
        return Err(Denial::UnknownNode { node: node.clone() });
    }
    let has = |uid| {
        snap.workload(uid)
            .and_then(|w| w.identity().ok())
            .is_some_and(|id| &id == identity)
    };
    if snap.workloads_on_node(node).iter().any(has) {
        return Ok(());
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
