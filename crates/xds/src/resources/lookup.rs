//! Address resources by the names a node proxy subscribes to them by on demand, as istiod looks
//! them up for ztunnel's on-demand mode: a resource's own name (a workload's uid, a service's
//! `namespace/hostname`), a workload's address as `network/ip`, a service's VIP as `network/ip`.
//!
//! A subscription to a service stands for the service and the workloads backing it (istiod's
//! `Lookup` answers a service key with both), and a node proxy also gets the workloads on its
//! own node (istiod's `AdditionalPodSubscriptions`). The index is built from the encoded
//! resources themselves and brought forward by the differences between two sets
//! ([`AddressLookup::update`]), so only changed resources are decoded again.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ferry_api::workload as wl;
use prost::Message;

use super::{Diff, TypeResources};

/// Address resources by the keys they can be found by (persistent maps: a clone is cheap).
#[derive(Clone, Debug, Default)]
pub struct AddressLookup {
    /// Each key's resources, by name.
    by_key: imbl::HashMap<Key, imbl::OrdSet<String>>,
    /// Each resource's keys, to take them out when it changes or goes.
    keys_of: imbl::HashMap<String, Arc<[Key]>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A workload's address on its network.
    Workload(String, IpAddr),
    /// A service's VIP on its network.
    Vip(String, IpAddr),
    /// The workloads backing a service (`namespace/hostname`).
    Backs(String),
    /// The workloads on a node.
    Node(String),
}

impl AddressLookup {
    /// The index of `resources`.
    pub fn build(resources: &TypeResources) -> Self {
        let mut out = Self::default();
        for (name, v) in resources {
            out.insert(name, keys(&v.body));
        }
        out
    }

    /// Brought from the set it indexes to the one `diff` leads to.
    pub fn update(&mut self, diff: &Diff) {
        for (name, v) in &diff.upserts {
            self.remove(name);
            self.insert(name, keys(&v.body));
        }
        for name in &diff.removed {
            self.remove(name);
        }
    }

    /// The resources of `resources` (the set this index describes) that a subscription to
    /// `name` stands for, added to `out`, in istiod's order of lookup: a resource of that name
    /// (with the workloads backing it when it is a service); else, for `network/ip`, the
    /// workloads with that address, or failing those the services with that VIP and the
    /// workloads backing them. Nothing when none matches.
    pub fn resolve(&self, resources: &TypeResources, name: &str, out: &mut BTreeSet<String>) {
        if resources.contains_key(name) {
            out.insert(name.to_string());
            self.add(&Key::Backs(name.to_string()), out);
            return;
        }
        let Some((network, ip)) = name.split_once('/') else {
            return;
        };
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return;
        };
        if self.add(&Key::Workload(network.to_string(), ip), out) {
            return;
        }
        if let Some(services) = self.by_key.get(&Key::Vip(network.to_string(), ip)) {
            for s in services {
                out.insert(s.clone());
                self.add(&Key::Backs(s.clone()), out);
            }
        }
    }

    /// The workloads on `node`, added to `out`.
    pub fn on_node(&self, node: &str, out: &mut BTreeSet<String>) {
        self.add(&Key::Node(node.to_string()), out);
    }

    /// Adds `key`'s resources to `out`; whether it has any.
    fn add(&self, key: &Key, out: &mut BTreeSet<String>) -> bool {
        match self.by_key.get(key) {
            Some(names) if !names.is_empty() => {
                out.extend(names.iter().cloned());
                true
            }
            _ => false,
        }
    }

    fn insert(&mut self, name: &str, keys: Vec<Key>) {
        if keys.is_empty() {
            return;
        }
        for k in &keys {
            self.by_key
                .entry(k.clone())
                .or_default()
                .insert(name.to_string());
        }
        self.keys_of.insert(name.to_string(), keys.into());
    }

    fn remove(&mut self, name: &str) {
        let Some(keys) = self.keys_of.remove(name) else {
            return;
        };
        for k in keys.iter() {
            if let Some(names) = self.by_key.get_mut(k) {
                names.remove(name);
                if names.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
    }
}

/// The keys an encoded `istio.workload.Address` is found by. A body that does not decode (the
/// control plane's own encoding always does) is found by its name only.
fn keys(body: &[u8]) -> Vec<Key> {
    let Ok(address) = wl::Address::decode(body) else {
        return Vec::new();
    };
    match address.r#type {
        Some(wl::address::Type::Workload(w)) => {
            let mut out: Vec<Key> = w
                .addresses
                .iter()
                .filter_map(|a| ip(a))
                .map(|ip| Key::Workload(w.network.clone(), ip))
                .collect();
            out.extend(w.services.into_keys().map(Key::Backs));
            if !w.node.is_empty() {
                out.push(Key::Node(w.node));
            }
            out
        }
        Some(wl::address::Type::Service(s)) => s
            .addresses
            .into_iter()
            .filter_map(|a| Some(Key::Vip(a.network, ip(&a.address)?)))
            .collect(),
        None => Vec::new(),
    }
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{Versioned, diff_sets};
    use super::*;

    fn workload(uid: &str, ip: [u8; 4], services: &[&str], node: &str) -> (String, Versioned) {
        let w = wl::Workload {
            uid: uid.to_string(),
            addresses: vec![ip.to_vec()],
            network: "net".to_string(),
            node: node.to_string(),
            services: services
                .iter()
                .map(|s| (s.to_string(), wl::PortList::default()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        };
        let a = wl::Address {
            r#type: Some(wl::address::Type::Workload(w)),
        };
        (uid.to_string(), Versioned::new(a.encode_to_vec()))
    }

    fn service(name: &str, vip: [u8; 4]) -> (String, Versioned) {
        let s = wl::Service {
            addresses: vec![wl::NetworkAddress {
                network: "net".to_string(),
                address: vip.to_vec(),
                length: None,
            }],
            ..Default::default()
        };
        let a = wl::Address {
            r#type: Some(wl::address::Type::Service(s)),
        };
        (name.to_string(), Versioned::new(a.encode_to_vec()))
    }

    fn resolve(l: &AddressLookup, set: &TypeResources, name: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        l.resolve(set, name, &mut out);
        out.into_iter().collect()
    }

    /// Each way istiod looks an address up finds what it finds there, and an index brought
    /// forward by a difference equals one built from the new set.
    #[test]
    fn names_addresses_and_vips_find_their_resources() {
        let set: TypeResources = [
            workload("w1", [198, 18, 0, 1], &["ns/svc"], "n1"),
            workload("w2", [198, 18, 0, 2], &["ns/svc"], "n2"),
            workload("w3", [198, 18, 0, 3], &[], "n1"),
            service("ns/svc", [198, 18, 9, 1]),
        ]
        .into_iter()
        .collect();
        let l = AddressLookup::build(&set);
        assert_eq!(resolve(&l, &set, "w3"), ["w3"]);
        assert_eq!(resolve(&l, &set, "net/198.18.0.2"), ["w2"]);
        assert_eq!(resolve(&l, &set, "ns/svc"), ["ns/svc", "w1", "w2"]);
        assert_eq!(resolve(&l, &set, "net/198.18.9.1"), ["ns/svc", "w1", "w2"]);
        assert!(resolve(&l, &set, "other/198.18.0.2").is_empty());
        assert!(resolve(&l, &set, "net/198.18.0.99").is_empty());
        assert!(resolve(&l, &set, "ns/missing").is_empty());
        let mut node = BTreeSet::new();
        l.on_node("n1", &mut node);
        assert_eq!(node.into_iter().collect::<Vec<_>>(), ["w1", "w3"]);

        // w2 moves and leaves the service, w3 goes, w4 comes.
        let mut next = set.clone();
        next.insert("w2".into(), workload("w2", [198, 18, 0, 22], &[], "n2").1);
        next.remove("w3");
        let (n, v) = workload("w4", [198, 18, 0, 2], &["ns/svc"], "n1");
        next.insert(n, v);
        let mut moved = l.clone();
        moved.update(&diff_sets(&set, &next));
        let built = AddressLookup::build(&next);
        for name in [
            "w2",
            "w3",
            "net/198.18.0.2",
            "net/198.18.0.22",
            "ns/svc",
            "net/198.18.9.1",
        ] {
            assert_eq!(resolve(&moved, &next, name), resolve(&built, &next, name));
        }
        assert_eq!(resolve(&moved, &next, "net/198.18.0.2"), ["w4"]);
        assert_eq!(resolve(&moved, &next, "ns/svc"), ["ns/svc", "w1", "w4"]);
        assert_eq!(moved.by_key.len(), built.by_key.len());
    }
}
