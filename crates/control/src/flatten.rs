//! Flattening nested service addresses before they go on the wire (the Antrea lesson).
//!
//! A service endpoint that is another service's VIP makes every data plane resolve twice. Where
//! the result is provably the same, the control plane resolves it once: the inner service's
//! workloads become direct endpoints of the outer service, with composed port maps. "Provably the
//! same" means: the inner service has no waypoint and a global scope (so only the outer scope
//! applies, as before), and all its endpoints are workloads in the address endpoint's own
//! cluster (so the outer scope rule looked up for them is the one looked up before). Anything
//! else stays nested; data planes resolve it themselves, in one decision.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_core::model::{
    AddressEndpoint, PortMapping, ScopeRule, Service, ServiceKey, Workload, WorkloadUid,
};
use ferry_core::snapshot::{AddressOwner, Endpoint, Snapshot, SnapshotBuilder};
use ferry_xds::resources::ResourceSet;

/// What the control plane serves for `snap`: its resources, with nested service addresses
/// flattened where that is safe.
pub fn resource_set(snap: &Snapshot) -> ResourceSet {
    match flatten_or_none(snap) {
        Some(flat) => ResourceSet::encode(&flat),
        // Nothing to resolve: encoded as it is, without building the same snapshot again.
        None => ResourceSet::encode(snap),
    }
}

/// The snapshot with every safely flattenable address endpoint resolved. Objects that do not
/// change are shared with the input, not copied.
pub fn flatten(snap: &Snapshot) -> Snapshot {
    flatten_or_none(snap).unwrap_or_else(|| rebuild(snap))
}

/// [`flatten`], or `None` when no address endpoint can be flattened (the snapshot would come
/// out the same).
pub fn flatten_or_none(snap: &Snapshot) -> Option<Snapshot> {
    let mut add: HashMap<WorkloadUid, Vec<(ServiceKey, Vec<PortMapping>)>> = HashMap::new();
    let mut outer: HashMap<ServiceKey, Vec<AddressEndpoint>> = HashMap::new();
    for s in snap.services() {
        for a in &s.address_endpoints {
            match plan(snap, s, a) {
                Some(mappings) => {
                    for (uid, ports) in mappings {
                        add.entry(uid).or_default().push((s.key(), ports));
                    }
                }
                None => outer.entry(s.key()).or_default().push(a.clone()),
            }
        }
    }
    if add.is_empty() {
        return None;
    }
    let mut b = builder_without_services_and_workloads(snap);
    for s in snap.services() {
        let kept = outer.remove(&s.key()).unwrap_or_default();
        if kept.len() == s.address_endpoints.len() {
            b.service_shared(s.clone());
        } else {
            b.service(Service {
                address_endpoints: kept,
                ..(**s).clone()
            });
        }
    }
    for w in snap.workloads() {
        match add.get(&w.uid) {
            None => {
                b.workload_shared(w.clone());
            }
            Some(extra) => {
                let mut w: Workload = (**w).clone();
                let services = w.services.make_mut();
                for (key, ports) in extra {
                    services
                        .entry(key.clone())
                        .or_default()
                        .extend(ports.iter().copied());
                }
                b.workload_shared(Arc::new(w));
            }
        }
    }
    match b.build() {
        Ok(s) => Some(s),
        Err(e) => {
            // Cannot happen for a valid input; serve it nested rather than fail.
            tracing::error!(error = %e, "flattening produced an invalid snapshot; serving it unflattened");
            None
        }
    }
}

/// For address endpoint `a` of `outer`: each inner workload and its composed port map, or `None`
/// when flattening would change what routing does.
fn plan(
    snap: &Snapshot,
    outer: &Service,
    a: &AddressEndpoint,
) -> Option<Vec<(WorkloadUid, Vec<PortMapping>)>> {
    let Some(AddressOwner::Service(inner_key)) = snap.owner(&a.address) else {
        return None;
    };
    let inner = snap.service(inner_key)?;
    let global = inner.scope.default == ScopeRule::Global && inner.scope.by_cluster.is_empty();
    if inner.waypoint.is_some() || !global {
        return None;
    }
    let mut out = Vec::new();
    for ep in snap.endpoints(inner_key) {
        let Endpoint::Workload(uid) = ep else {
            return None;
        };
        let w = snap.workload(uid)?;
        if w.cluster != a.cluster {
            return None;
        }
        let mut ports = Vec::new();
        for p in &outer.ports {
            let inner_port = a
                .ports
                .iter()
                .find(|m| m.service_port == p.port)
                .map_or(p.target_port, |m| m.target_port);
            let inner_sp = inner.port(inner_port)?;
            let target = w
                .target_port(inner_key, inner_port)
                .filter(|t| *t != 0)
                .unwrap_or(inner_sp.target_port);
            ports.push(PortMapping {
                service_port: p.port,
                target_port: target,
            });
        }
        out.push((uid.clone(), ports));
    }
    (!out.is_empty()).then_some(out)
}

/// A builder holding `snap`'s clusters, nodes, gateways and policies (shared, not copied).
fn builder_without_services_and_workloads(snap: &Snapshot) -> SnapshotBuilder {
    let mut b = SnapshotBuilder::new(snap.version());
    for c in snap.clusters() {
        b.cluster(c.clone());
    }
    for n in snap.nodes() {
        b.node(n.clone());
    }
    for g in snap.gateways() {
        b.gateway_shared(g.clone());
    }
    for p in snap.policies() {
        b.policy_shared(p.clone());
    }
    b
}

fn rebuild(snap: &Snapshot) -> Snapshot {
    let mut b = builder_without_services_and_workloads(snap);
    for s in snap.services() {
        b.service_shared(s.clone());
    }
    for w in snap.workloads() {
        b.workload_shared(w.clone());
    }
    b.build().unwrap_or_default()
}
