//! A resource set brought from one snapshot to the next by encoding again only the resources
//! whose inputs changed ([`ResourceSet::update`]), equal to encoding the new snapshot whole.
//!
//! What each resource reads (see `convert::to_wire`):
//! - a workload's or an east-west gateway's address resource: that object alone;
//! - a service's: the service, and the identities of its endpoints, which are the workloads
//!   listing it in their `services` and its address endpoints (through the services those name,
//!   transitively);
//! - a policy's: the policy alone, except a DENY naming HTTP facts, which reads the workloads it
//!   applies to and their waypoints ([`policy_reads_workloads`]).
//!
//! So a changed workload re-encodes itself and the services it backed before or backs after; a
//! service with address endpoints and a policy that reads workloads are encoded again on any
//! change (they are few); a changed cluster or node, or two resources of one name (which the
//! whole encoding resolves by order), encodes everything again.

use std::collections::BTreeSet;

use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::model::{PolicyKey, ServiceKey, WorkloadUid};
use ferry_core::snapshot::Snapshot;
use prost::Message;

use super::{ResourceSet, TypeResources, Versioned};
use crate::convert::{
    gateway_address, gateway_name, policy_reads_workloads, policy_resource, service_address,
    workload_address,
};

/// What differs between two snapshots, by key: added, changed or removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub workloads: BTreeSet<WorkloadUid>,
    pub services: BTreeSet<ServiceKey>,
    pub policies: BTreeSet<PolicyKey>,
    /// Any east-west gateway (they are few: all are encoded again).
    pub gateways: bool,
    /// A cluster or a node: everything is encoded again.
    pub everything: bool,
}

impl Changes {
    /// Compares `before` and `after` object by object: shared objects (the same `Arc`, as an
    /// applied delta keeps them) at once, others by value.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let clusters = before.clusters().count() == after.clusters().count()
            && after.clusters().all(|c| before.cluster(&c.name) == Some(c));
        let nodes = before.nodes().count() == after.nodes().count()
            && after.nodes().all(|n| before.node(&n.name) == Some(n));
        let mut c = Self {
            everything: !clusters || !nodes,
            gateways: !before
                .gateways()
                .map(|g| &**g)
                .eq(after.gateways().map(|g| &**g)),
            ..Self::default()
        };
        for w in after.workloads() {
            if before.workload(&w.uid) != Some(w) {
                c.workloads.insert(w.uid.clone());
            }
        }
        for w in before.workloads() {
            if after.workload(&w.uid).is_none() {
                c.workloads.insert(w.uid.clone());
            }
        }
        for s in after.services() {
            if before.service(&s.key()) != Some(s) {
                c.services.insert(s.key());
            }
        }
        for s in before.services() {
            if after.service(&s.key()).is_none() {
                c.services.insert(s.key());
            }
        }
        for p in after.policies() {
            if before.policy(&p.key()) != Some(p) {
                c.policies.insert(p.key());
            }
        }
        for p in before.policies() {
            if after.policy(&p.key()).is_none() {
                c.policies.insert(p.key());
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        !self.everything
            && !self.gateways
            && self.workloads.is_empty()
            && self.services.is_empty()
            && self.policies.is_empty()
    }
}

impl ResourceSet {
    /// This set, encoded from `before`, brought to `after` (whose differences from `before`
    /// are `changes`, e.g. [`Changes::between`]): the same set as [`ResourceSet::encode`] of
    /// `after`, sharing every resource that did not change with this one.
    #[must_use]
    pub fn update(&self, before: &Snapshot, after: &Snapshot, changes: &Changes) -> Self {
        if changes.is_empty() {
            return self.clone();
        }
        if changes.everything {
            return Self::encode(after);
        }
        // Services to encode again: changed, backed by a changed workload before or after, or
        // reading other services' endpoints.
        let mut services = changes.services.clone();
        for uid in &changes.workloads {
            for snap in [before, after] {
                if let Some(w) = snap.workload(uid) {
                    services.extend(w.services.keys().cloned());
                }
            }
        }
        services.extend(
            after
                .services()
                .filter(|s| !s.address_endpoints.is_empty())
                .map(|s| s.key()),
        );
        if names_clash(before, changes, &services) || names_clash(after, changes, &services) {
            return Self::encode(after);
        }
        let mut addresses = self.of_type(ADDRESS_TYPE).cloned().unwrap_or_default();
        let mut policies = self
            .of_type(AUTHORIZATION_TYPE)
            .cloned()
            .unwrap_or_default();

        for uid in &changes.workloads {
            match after.workload(uid) {
                Some(w) => put(&mut addresses, workload_address(w)),
                None => drop(addresses.remove(uid.as_str())),
            }
        }
        if changes.gateways {
            for g in before.gateways() {
                addresses.remove(&gateway_name(g));
            }
            for g in after.gateways() {
                put(&mut addresses, gateway_address(g));
            }
        }
        for key in &services {
            match after.service(key) {
                Some(s) => put(&mut addresses, service_address(after, s)),
                None => drop(addresses.remove(&key.to_string())),
            }
        }

        let mut keys = changes.policies.clone();
        keys.extend(
            after
                .policies()
                .filter(|p| policy_reads_workloads(p))
                .map(|p| p.key()),
        );
        for key in &keys {
            match after.policy(key) {
                Some(p) => put(&mut policies, policy_resource(after, p)),
                None => drop(policies.remove(&key.to_string())),
            }
        }

        let mut by_type = self.by_type.clone();
        by_type.insert(ADDRESS_TYPE, addresses);
        by_type.insert(AUTHORIZATION_TYPE, policies);
        Self { by_type }
    }
}

fn put<M: Message>(map: &mut TypeResources, (name, message): (String, M)) {
    map.insert(name, Versioned::new(message.encode_to_vec()));
}

/// Does an address resource about to be written (a changed workload, any gateway when they
/// changed, a service in `services`) share its name with another object of `snap`? The whole
/// encoding keeps the last of them; an update would not know which, so it encodes everything.
fn names_clash(snap: &Snapshot, changes: &Changes, services: &BTreeSet<ServiceKey>) -> bool {
    let gateways: BTreeSet<String> = snap.gateways().map(|g| gateway_name(g)).collect();
    let is_service = |name: &str| {
        name.split_once('/')
            .is_some_and(|(ns, host)| snap.service(&ServiceKey::new(ns, host)).is_some())
    };
    let is_workload = |name: &str| snap.workload(&WorkloadUid::new(name)).is_some();
    let workload_clash = changes
        .workloads
        .iter()
        .any(|uid| gateways.contains(uid.as_str()) || is_service(uid.as_str()));
    let service_clash = services.iter().any(|key| {
        let name = key.to_string();
        gateways.contains(&name) || is_workload(&name)
    });
    let gateway_clash =
        changes.gateways && gateways.iter().any(|n| is_workload(n) || is_service(n));
    workload_clash || service_clash || gateway_clash
}
