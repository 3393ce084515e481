//! `/api/mesh`: a mesh (the lab's live topology, or a control plane's current snapshot) as the
//! map draws it.

use ferry_core::model::{GatewayDestination, GatewayRef, ScopeRule, Service, ServiceScope};
use ferry_core::snapshot::Snapshot;
use serde_json::{Value, json};

/// The mesh of `snap`: clusters, networks, nodes with their locality, workloads, services
/// (waypoints apart), waypoints with their instances, and gateways.
pub(super) fn describe(snap: &Snapshot) -> Value {
    let mut networks: Vec<String> = snap.clusters().map(|c| c.network.to_string()).collect();
    networks.sort();
    networks.dedup();
    let by_name = |a: &Value, b: &Value| a["name"].as_str().cmp(&b["name"].as_str());
    let mut clusters: Vec<Value> = snap
        .clusters()
        .map(|c| json!({"name": c.name.to_string(), "network": c.network.to_string()}))
        .collect();
    clusters.sort_by(by_name);
    let mut nodes: Vec<Value> = snap
        .nodes()
        .map(|n| {
            json!({
                "name": n.name.to_string(),
                "cluster": n.cluster.to_string(),
                "locality": {
                    "region": n.locality.region,
                    "zone": n.locality.zone,
                    "subzone": n.locality.subzone,
                },
            })
        })
        .collect();
    nodes.sort_by(by_name);
    let mut workloads: Vec<Value> = snap
        .workloads()
        .map(|w| {
            let waypoint_of: Vec<String> = snap
                .waypoints_served_by(w)
                .filter_map(|k| snap.service(k))
                .map(|s| s.name.clone())
                .collect();
            json!({
                "uid": w.uid.to_string(),
                "name": w.name,
                "namespace": w.namespace,
                "cluster": w.cluster.to_string(),
                "network": w.network.to_string(),
                "node": w.node.as_ref().map(ToString::to_string),
                "addresses": w.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "health": w.health,
                "in_mesh": w.tunnel == ferry_core::model::TunnelProtocol::Hbone,
                "waypoint_of": waypoint_of,
            })
        })
        .collect();
    workloads.sort_by(by_name);
    let mut services = Vec::new();
    let mut waypoints = Vec::new();
    for s in snap.services() {
        if s.waypoint_for.is_some() {
            let key = s.key();
            let mut instances: Vec<&str> = snap
                .workloads()
                .filter(|w| snap.waypoints_served_by(w).any(|k| *k == key))
                .map(|w| w.name.as_str())
                .collect();
            // The snapshot's workload order is not stable across processes.
            instances.sort_unstable();
            waypoints.push(json!({
                "name": s.name,
                "namespace": s.namespace,
                "scope": scope_text(&s.scope),
                "instances": instances,
            }));
        } else {
            services.push(service(snap, s));
        }
    }
    services.sort_by(by_name);
    waypoints.sort_by(by_name);
    let mut gateways: Vec<Value> = snap
        .gateways()
        .map(|g| {
            json!({
                "name": g.name,
                "cluster": g.cluster.to_string(),
                "network": g.network.to_string(),
                "address": g.address.to_string(),
            })
        })
        .collect();
    gateways.sort_by(by_name);
    json!({
        "version": snap.version(),
        "clusters": clusters,
        "networks": networks,
        "nodes": nodes,
        "workloads": workloads,
        "services": services,
        "waypoints": waypoints,
        "gateways": gateways,
    })
}

fn service(snap: &Snapshot, s: &Service) -> Value {
    json!({
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "vips": s.vips.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "ports": s.ports.iter().map(|p| p.port).collect::<Vec<_>>(),
        "scope": scope_text(&s.scope),
        "waypoint": s.waypoint.as_ref().map(|w| waypoint_name(snap, w)),
        "endpoints": snap
            .workloads()
            .filter(|w| w.services.contains_key(&s.key()))
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>(),
    })
}

/// A waypoint by its service's name (or its address, when it is one).
fn waypoint_name(snap: &Snapshot, w: &GatewayRef) -> String {
    match &w.destination {
        GatewayDestination::Service(k) => snap
            .service(k)
            .map_or_else(|| k.to_string(), |s| s.name.clone()),
        GatewayDestination::Address(a) => a.to_string(),
    }
}

/// `global`, `local`, `clusters: a, b`; then each per-cluster override (`; in beta: local`).
fn scope_text(scope: &ServiceScope) -> String {
    let rule = |r: &ScopeRule| match r {
        ScopeRule::Global => "global".to_string(),
        ScopeRule::Local => "local".to_string(),
        ScopeRule::Clusters(set) => format!(
            "clusters: {}",
            set.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = rule(&scope.default);
    for (cluster, r) in &scope.by_cluster {
        text.push_str(&format!("; in {cluster}: {}", rule(r)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_example_is_described() {
        let text = include_str!("../../../../examples/lab.yaml");
        let t = ferry_topology::parse("lab.yaml", text).unwrap();
        let m = describe(&t.snapshot);
        assert_eq!(m["clusters"].as_array().unwrap().len(), 2);
        assert_eq!(m["networks"], json!(["flat"]));
        let audit = m["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "audit")
            .unwrap();
        assert_eq!(audit["scope"], "local");
        assert_eq!(audit["waypoint"], "audit-waypoint");
        assert_eq!(m["waypoints"][0]["name"], "audit-waypoint");
        assert_eq!(
            m["waypoints"][0]["instances"],
            json!(["audit-waypoint-alpha", "audit-waypoint-beta"])
        );
    }
}
