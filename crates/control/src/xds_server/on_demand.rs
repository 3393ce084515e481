//! On-demand subscriptions: a stream that names what it wants instead of subscribing to the
//! wildcard gets only that, as istiod serves ztunnel's on-demand mode.
//!
//! A type is on demand when the stream's first request for it names resources without the
//! wildcard `*` (ztunnel subscribes and unsubscribes `*` in one request to ask for nothing yet);
//! with no names, or with `*`, it is a wildcard subscription and this module is not involved.
//! As in istiod, the choice is made by the first request and kept for the stream.
//!
//! What a stream gets for an address name is what [`AddressLookup::resolve`] finds (a workload
//! by uid or `network/ip`, a service by `namespace/hostname` or VIP with the workloads backing
//! it), plus the workloads on the node the stream's credential proved. A name that finds
//! nothing is answered in `removed_resources`, as istiod does ("removed" for a resource that
//! never existed is how the delta protocol says it). Once sent, a resource stays tracked until
//! it is removed or the name it came by is unsubscribed; updates and removals are sent for
//! the tracked resources only, so an edit elsewhere in the mesh sends such a stream nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ferry_api::ADDRESS_TYPE;
use ferry_xds::resources::{AddressLookup, Diff, ResourceSet, TypeResources, diff_sets};
use parking_lot::Mutex;

/// The wildcard subscription.
const WILDCARD: &str = "*";

/// How a stream's first request for a type subscribes: to everything, or to the names it lists
/// (`resource_names_subscribe` and the names of `initial_resource_versions`, less
/// `resource_names_unsubscribe`), as istiod decides it.
pub(super) fn is_wildcard(subscribe: &[String], unsubscribe: &[String]) -> bool {
    subscribe.is_empty()
        || (subscribe.iter().any(|n| n == WILDCARD) && !unsubscribe.iter().any(|n| n == WILDCARD))
}

/// What one on-demand stream asked for and holds, of one type.
#[derive(Debug, Default)]
pub(super) struct OnDemand {
    /// The names subscribed, as the client wrote them.
    subscribed: BTreeSet<String>,
    /// What the client holds: resource name -> version.
    held: HashMap<String, String>,
    /// Names subscribed since the last response: each is answered, as removed if it finds
    /// nothing.
    asked: BTreeSet<String>,
    /// Names unsubscribed since the last response: what they found is no longer tracked.
    dropped: BTreeSet<String>,
}

impl OnDemand {
    /// The state after a stream's first request for the type: it holds `initial` (name ->
    /// version, its `initial_resource_versions`) and asks for those and `subscribe`.
    pub(super) fn new(
        initial: HashMap<String, String>,
        subscribe: Vec<String>,
        unsubscribe: &[String],
    ) -> Self {
        let mut out = Self {
            held: initial,
            ..Self::default()
        };
        let names = out.held.keys().cloned().collect::<Vec<_>>();
        out.request(names.into_iter().chain(subscribe).collect(), unsubscribe);
        out
    }

    /// Takes a request's subscriptions and unsubscriptions; whether it asked for a name not
    /// subscribed before (which is answered even when nothing is found).
    pub(super) fn request(&mut self, subscribe: Vec<String>, unsubscribe: &[String]) -> bool {
        let mut asked = false;
        for n in subscribe {
            if n != WILDCARD && self.subscribed.insert(n.clone()) {
                self.dropped.remove(&n);
                self.asked.insert(n);
                asked = true;
            }
        }
        for n in unsubscribe {
            if self.subscribed.remove(n) {
                self.asked.remove(n);
                self.dropped.insert(n.clone());
            }
        }
        asked
    }

    /// What brings the client from what it holds to `current` for what it asked for; it is
    /// taken to hold that from then on. `lookup` indexes `current` (address type only); `node`
    /// is the node the stream's credential proved.
    pub(super) fn push(
        &mut self,
        current: &TypeResources,
        lookup: Option<&AddressLookup>,
        node: &str,
    ) -> Diff {
        let resolve = |names: &BTreeSet<String>, out: &mut BTreeSet<String>| {
            for n in names {
                match lookup {
                    Some(l) => l.resolve(current, n, out),
                    None if current.contains_key(n) => drop(out.insert(n.clone())),
                    None => {}
                }
            }
        };
        let finds = |name: &String| {
            let mut found = BTreeSet::new();
            resolve(&BTreeSet::from([name.clone()]), &mut found);
            !found.is_empty()
        };
        let mut wanted = BTreeSet::new();
        resolve(&self.subscribed, &mut wanted);
        if let Some(l) = lookup {
            l.on_node(node, &mut wanted);
        }
        if !self.dropped.is_empty() {
            let mut gone = self.dropped.clone();
            resolve(&self.dropped, &mut gone);
            self.held
                .retain(|n, _| wanted.contains(n) || !gone.contains(n));
            self.dropped.clear();
        }
        wanted.extend(self.held.keys().cloned());

        let mut d = Diff::default();
        for name in wanted {
            match current.get(&name) {
                Some(v) => {
                    if self.held.get(&name) != Some(&v.version) {
                        self.held.insert(name.clone(), v.version.clone());
                        d.upserts.push((name, v.clone()));
                    }
                }
                // Gone; or, if it finds something, a name the client held by (a reconnecting
                // client lists the names it asked for among those it holds), not a resource.
                None => {
                    if self.held.remove(&name).is_some() && !finds(&name) {
                        d.removed.push(name);
                    }
                }
            }
        }
        for name in std::mem::take(&mut self.asked) {
            if !finds(&name) && !d.removed.contains(&name) {
                d.removed.push(name);
            }
        }
        d
    }
}

/// The index of the latest resource set's addresses, built when an on-demand stream first needs
/// it and then brought forward by each change's difference (shared by every stream).
#[derive(Debug, Default)]
pub(super) struct Lookups {
    latest: Mutex<Option<(Arc<ResourceSet>, Arc<AddressLookup>)>>,
}

impl Lookups {
    /// The index of `set`'s addresses.
    pub(super) fn of(&self, set: &Arc<ResourceSet>) -> Arc<AddressLookup> {
        let mut latest = self.latest.lock();
        if let Some((s, l)) = &*latest
            && Arc::ptr_eq(s, set)
        {
            return l.clone();
        }
        let empty = TypeResources::default();
        let to = set.of_type(ADDRESS_TYPE).unwrap_or(&empty);
        let lookup = match &*latest {
            Some((s, l)) => {
                let mut l = (**l).clone();
                l.update(&diff_sets(s.of_type(ADDRESS_TYPE).unwrap_or(&empty), to));
                l
            }
            None => AddressLookup::build(to),
        };
        let lookup = Arc::new(lookup);
        *latest = Some((set.clone(), lookup.clone()));
        lookup
    }
}

#[cfg(test)]
mod tests {
    use ferry_api::workload as wl;
    use ferry_xds::resources::Versioned;
    use prost::Message as _;

    use super::*;

    fn workload(uid: &str, ip: [u8; 4]) -> (String, Versioned) {
        let w = wl::Workload {
            uid: uid.to_string(),
            addresses: vec![ip.to_vec()],
            network: "net".to_string(),
            ..Default::default()
        };
        let a = wl::Address {
            r#type: Some(wl::address::Type::Workload(w)),
        };
        (uid.to_string(), Versioned::new(a.encode_to_vec()))
    }

    fn service(name: &str, port: u32) -> (String, Versioned) {
        let s = wl::Service {
            ports: vec![wl::Port {
                service_port: port,
                target_port: port,
                ..Default::default()
            }],
            ..Default::default()
        };
        let a = wl::Address {
            r#type: Some(wl::address::Type::Service(s)),
        };
        (name.to_string(), Versioned::new(a.encode_to_vec()))
    }

    fn names(d: &Diff) -> Vec<&str> {
        d.upserts.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// A reconnecting on-demand node lists what it holds, the names it asked by among them: what
    /// it holds at the served version is not sent again, a name it asked by is not "removed",
    /// a resource that is gone is. Later it asks for more, and unsubscribing stops updates.
    #[test]
    fn a_reconnecting_node_keeps_what_it_holds_and_unsubscribing_stops_updates() {
        let w1 = workload("w1", [198, 18, 0, 1]);
        let set: TypeResources = [w1.clone(), service("ns/svc", 80)].into_iter().collect();
        let lookup = AddressLookup::build(&set);
        let initial = HashMap::from([
            ("w1".to_string(), w1.1.version),
            ("net/198.18.0.1".to_string(), String::new()),
            ("gone".to_string(), "x".to_string()),
        ]);
        let star = vec![WILDCARD.to_string()];
        assert!(!is_wildcard(&star, &star), "ztunnel's on-demand request");
        assert!(is_wildcard(&star, &[]) && is_wildcard(&[], &[]));
        let mut od = OnDemand::new(initial, star.clone(), &star);
        let d = od.push(&set, Some(&lookup), "node");
        assert!(d.upserts.is_empty(), "{:?}", names(&d));
        assert_eq!(d.removed, ["gone"]);

        assert!(od.request(vec!["ns/svc".into()], &[]));
        assert!(!od.request(vec!["ns/svc".into()], &[]), "nothing new");
        let d = od.push(&set, Some(&lookup), "node");
        assert_eq!(names(&d), ["ns/svc"]);
        assert!(d.removed.is_empty());

        assert!(!od.request(vec![], &["ns/svc".to_string()]));
        let mut next = set.clone();
        let (n, v) = service("ns/svc", 81);
        next.insert(n, v);
        let lookup = AddressLookup::build(&next);
        let d = od.push(&next, Some(&lookup), "node");
        assert!(d.is_empty(), "{d:?}");
    }
}
