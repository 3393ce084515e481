//! A data-plane snapshot from decoded xDS resources.
//!
//! WDS carries workloads, services and policies, not clusters or nodes: those are taken from the
//! workloads themselves. References to policies or services the client does not have are
//! skipped, as Istio's data plane does. A resource that breaks a snapshot invariant (a duplicate
//! address, a waypoint that resolves to nothing) is set aside and reported, and the rest applies.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_core::keyed_hash::{HashMap, HashSet};

use ferry_core::model::{
    Cluster, ClusterId, Gateway, NetworkId, Node, NodeName, Policy, PortMapping, Service,
    ServiceKey, SharedMap, Workload,
};
use ferry_core::snapshot::{AddressOwner, ObjectRef, Snapshot, SnapshotBuilder, SnapshotError};

use crate::convert::{Decoded, InvalidResource};
use crate::index::Index;

/// The decoded resources a client holds, by resource name.
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// A workload's name is its uid, held here as the workload's own copy of it (the client
    /// keys its version by the same): one copy of each name.
    pub addresses: BTreeMap<Arc<str>, Decoded>,
    pub policies: BTreeMap<String, Arc<Policy>>,
    /// What applying the next push incrementally needs ([`crate::incremental`]).
    pub(crate) index: Index,
}

/// Builds a snapshot from `held`, leaving out (and returning) resources that break it. `None`
/// when no snapshot can be built at all: the caller keeps serving the one it has.
pub fn assemble(held: &Held, version: u64) -> (Option<Snapshot>, Vec<InvalidResource>) {
    let mut excluded: HashSet<String> = HashSet::default();
    let mut rejected = Vec::new();
    loop {
        match try_build(held, version, &excluded) {
            Ok(snap) => return (Some(snap), rejected),
            Err(e) => {
                let culprit = culprit(held, &e).filter(|n| !excluded.contains(n));
                match culprit {
                    Some(name) => {
                        rejected.push(InvalidResource {
                            name: name.clone(),
                            reason: e.to_string(),
                        });
                        excluded.insert(name);
                    }
                    None => {
                        // Nothing to blame: apply nothing new rather than guess.
                        tracing::error!(error = %e, "cannot assemble a snapshot");
                        rejected.push(InvalidResource {
                            name: "*".into(),
                            reason: e.to_string(),
                        });
                        return (None, rejected);
                    }
                }
            }
        }
    }
}

fn try_build(
    held: &Held,
    version: u64,
    excluded: &HashSet<String>,
) -> Result<Snapshot, SnapshotError> {
    let live = |name: &str| !excluded.contains(name);
    let mut clusters: BTreeMap<ClusterId, NetworkId> = BTreeMap::new();
    // Searched once per workload: hashed, not a tree of names compared (added in name order).
    let mut nodes: HashMap<NodeName, Node> = HashMap::default();
    let mut services: Vec<&Arc<Service>> = Vec::new();
    let mut workloads: Vec<&Arc<Workload>> = Vec::new();
    let mut gateways: Vec<&Arc<Gateway>> = Vec::new();
    for (name, d) in held.addresses.iter().filter(|(n, _)| live(n)) {
        let _ = name;
        match d {
            Decoded::Workload(w) => {
                // Looked up before a name is copied: most workloads find theirs there.
                if !clusters.contains_key(&w.cluster) {
                    clusters.insert(w.cluster.clone(), w.network.clone());
                }
                if let Some(n) = w.node.as_ref().filter(|n| !nodes.contains_key(*n)) {
                    nodes.insert(
                        n.clone(),
                        Node {
                            name: n.clone(),
                            cluster: w.cluster.clone(),
                            locality: (*w.locality).clone(),
                            address: None,
                        },
                    );
                }
                workloads.push(w);
            }
            Decoded::Gateway(g) => {
                clusters
                    .entry(g.cluster.clone())
                    .or_insert_with(|| g.network.clone());
                gateways.push(g);
            }
            Decoded::Service(s) => services.push(s),
        }
    }
    let service_keys: HashSet<_> = services.iter().map(|s| s.key()).collect();
    let policy_keys: HashSet<_> = held
        .policies
        .iter()
        .filter(|(n, _)| live(n))
        .map(|(_, p)| p.key())
        .collect();
    let mut b = SnapshotBuilder::new(version);
    for (name, network) in clusters {
        b.cluster(Cluster { name, network });
    }
    let mut nodes: Vec<Node> = nodes.into_values().collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    for n in nodes {
        b.node(n);
    }
    for s in services {
        b.service_shared(s.clone());
    }
    for (_, p) in held.policies.iter().filter(|(n, _)| live(n)) {
        b.policy_shared(p.clone());
    }
    for g in gateways {
        b.gateway_shared(g.clone());
    }
    // Whether a service map names a service not held, by the map's address: the replicas of
    // a deployment share one map, looked up once, not its keys hashed again per workload.
    let mut names_missing: HashMap<usize, bool> = HashMap::default();
    for w in workloads {
        // Copy a workload only when a reference it carries must be skipped.
        let dangling = *names_missing
            .entry(map_at(&w.services))
            .or_insert_with(|| w.services.keys().any(|k| !service_keys.contains(k)))
            || w.authorization_policies
                .iter()
                .any(|k| !policy_keys.contains(k));
        if dangling {
            let mut w = (**w).clone();
            w.services
                .make_mut()
                .retain(|k, _| service_keys.contains(k));
            w.authorization_policies.retain(|k| policy_keys.contains(k));
            b.workload(w);
        } else {
            b.workload_shared(w.clone());
        }
    }
    b.build()
}

/// The address of a workload's service map: equal for the workloads that share one copy (the
/// held resources keep every copy alive while it is used as a key).
pub(crate) fn map_at(m: &SharedMap<ServiceKey, Vec<PortMapping>>) -> usize {
    Arc::as_ptr(m.as_arc()) as usize
}

/// The resource a snapshot error is about.
fn culprit(held: &Held, e: &SnapshotError) -> Option<String> {
    let by_object = |o: &ObjectRef| -> Option<String> {
        match o {
            ObjectRef::Workload(uid) => Some(uid.to_string()),
            ObjectRef::Service(k) => Some(k.to_string()),
            ObjectRef::Policy(k) => Some(k.to_string()),
            // The last one by name: the first keeps its place.
            ObjectRef::Gateway(name) => held.addresses.iter().rev().find_map(|(n, d)| match d {
                Decoded::Gateway(g) if &g.name == name => Some(n.to_string()),
                _ => None,
            }),
            ObjectRef::Cluster(_) | ObjectRef::Node(_) => None,
        }
    };
    let by_owner = |o: &AddressOwner| {
        by_object(&match o {
            AddressOwner::Workload(u) => ObjectRef::Workload(u.clone()),
            AddressOwner::Service(k) => ObjectRef::Service((**k).clone()),
            AddressOwner::Gateway(n) => ObjectRef::Gateway(n.clone()),
        })
    };
    match e {
        SnapshotError::Duplicate { object } => by_object(object),
        SnapshotError::DuplicateAddress { second, .. } => by_owner(second),
        SnapshotError::UnknownCluster { object, .. }
        | SnapshotError::UnknownNode { object, .. }
        | SnapshotError::WrongNetwork { object, .. }
        | SnapshotError::UnknownService { object, .. }
        | SnapshotError::UnknownPolicy { object, .. }
        | SnapshotError::UnresolvedGateway { object, .. }
        | SnapshotError::Identity { object, .. } => by_object(object),
    }
}
