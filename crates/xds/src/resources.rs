//! Versioned resource sets: what the control plane serves, and what a client has.
//!
//! A set's maps are persistent (`imbl`): a set brought to a new snapshot by
//! [`ResourceSet::update`] shares every resource that did not change with the set before, and
//! the difference of two such sets ([`diff_sets`]) walks only what is not shared.

mod lookup;
mod update;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ferry_core::model::Workload;
use ferry_core::snapshot::Snapshot;
use prost::Message;

use crate::convert;

/// One encoded resource and its version (a digest of its bytes: the same content always has
/// the same version, across control-plane restarts too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub version: String,
    pub body: Arc<Vec<u8>>,
}

impl Versioned {
    pub fn new(body: Vec<u8>) -> Self {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &body);
        Self {
            version: hex(&digest.as_ref()[..8]),
            body: Arc::new(body),
        }
    }
}

/// `bytes` in lower-case hex, written into one string (a `format!` a byte cost more than the
/// digest of a typical resource).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// The resources of one type, by name, in name order (a persistent map: clones share it).
pub type TypeResources = imbl::OrdMap<String, Versioned>;

pub use lookup::AddressLookup;
pub use update::Changes;

/// Everything the control plane serves, by type URL.
#[derive(Clone, Debug, Default)]
pub struct ResourceSet {
    pub by_type: BTreeMap<&'static str, TypeResources>,
}

impl ResourceSet {
    /// Encodes a snapshot as it is. The control plane flattens nested service addresses first
    /// (`ferry_control::flatten::resource_set`). The resources are converted, encoded and
    /// digested on every core ([`encode_all`]); the result does not depend on how many.
    pub fn encode(snap: &Snapshot) -> Self {
        let workloads: Vec<_> = snap.workloads().collect();
        Self::encode_on(snap, &workloads, spread(workloads.len()) > 1)
    }

    /// [`ResourceSet::encode`] of `snap`, whose workloads are `workloads`, with the resources
    /// other than workloads encoded on a thread of their own (`beside`) or after the workloads
    /// on this one: the same set either way.
    fn encode_on(snap: &Snapshot, workloads: &[&Arc<Workload>], beside: bool) -> Self {
        // The rest are few but each costs more (a service's SANs walk its endpoints): with many
        // workloads they are encoded on a thread of their own beside the workloads' threads,
        // and the workloads' map is built while that thread is still at work.
        let rest = || {
            let gateways: Vec<_> = snap.gateways().collect();
            let services: Vec<_> = snap.services().collect();
            let policies: Vec<_> = snap.policies().collect();
            (
                encode_all(&gateways, |g| convert::gateway_address(g)),
                encode_all(&services, |s| convert::service_address(snap, s)),
                encode_all(&policies, |p| convert::policy_resource(snap, p)),
            )
        };
        let workload_map = || -> TypeResources {
            encode_all(workloads, |w| convert::workload_address(w))
                .into_iter()
                .collect()
        };
        let (mut addresses, (gateways, services, policies)) = if beside {
            std::thread::scope(|scope| {
                let rest = scope.spawn(rest);
                let addresses = workload_map();
                (addresses, joined(rest))
            })
        } else {
            (workload_map(), rest())
        };
        // Later entries of one name win: services over gateways over workloads.
        addresses.extend(gateways.into_iter().chain(services));
        let mut by_type = BTreeMap::new();
        by_type.insert(ADDRESS_TYPE, addresses);
        by_type.insert(AUTHORIZATION_TYPE, policies.into_iter().collect());
        Self { by_type }
    }

    pub fn of_type(&self, type_url: &str) -> Option<&TypeResources> {
        self.by_type.get(type_url)
    }

    pub fn len(&self) -> usize {
        self.by_type.values().map(imbl::OrdMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Fewer items than this a thread are encoded on the calling thread alone.
const ENCODE_CHUNK: usize = 4096;

/// `make` of each item, encoded and versioned, in the items' order: split over the available
/// cores when there are many (encoding and digesting is most of the work of a first set).
fn encode_all<T: Sync, M: Message>(
    items: &[T],
    make: impl Fn(&T) -> (String, M) + Sync,
) -> Vec<(String, Versioned)> {
    let one = |chunk: &[T]| -> Vec<(String, Versioned)> {
        chunk
            .iter()
            .map(|i| {
                let (n, m) = make(i);
                (n, Versioned::new(m.encode_to_vec()))
            })
            .collect()
    };
    let threads = spread(items.len());
    if threads == 1 {
        return one(items);
    }
    let per = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = items
            .chunks(per)
            .map(|chunk| scope.spawn(move || one(chunk)))
            .collect();
        parts.into_iter().flat_map(joined).collect()
    })
}

/// How many threads `items` resources are encoded on: one per core, each with at least
/// [`ENCODE_CHUNK`] of them.
fn spread(items: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items / ENCODE_CHUNK)
        .max(1)
}

/// What a scoped thread returned. A panic in a conversion is a bug: it surfaces as it would
/// on one thread.
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// What a client holding `known` (name -> version) needs to match `current`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub upserts: Vec<(String, Versioned)>,
    pub removed: Vec<String>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removed.is_empty()
    }
}

/// What a client holding exactly `held` needs to match `current`: one ordered walk over both
/// that skips what the two share (a set updated from another shares all it did not change), the
/// same [`Diff`] as [`diff`] would give for `held`'s versions.
pub fn diff_sets(held: &TypeResources, current: &TypeResources) -> Diff {
    let mut out = Diff::default();
    for item in held.diff(current) {
        match item {
            imbl::ordmap::DiffItem::Add(name, v) => out.upserts.push((name.clone(), v.clone())),
            imbl::ordmap::DiffItem::Update {
                old: (_, was),
                new: (name, v),
            } => {
                if was.version != v.version {
                    out.upserts.push((name.clone(), v.clone()));
                }
            }
            imbl::ordmap::DiffItem::Remove(name, _) => out.removed.push(name.clone()),
        }
    }
    out
}

pub fn diff(known: &HashMap<String, String>, current: &TypeResources) -> Diff {
    let upserts = current
        .iter()
        .filter(|(n, v)| known.get(*n) != Some(&v.version))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let mut removed: Vec<String> = known
        .keys()
        .filter(|n| !current.contains_key(*n))
        .cloned()
        .collect();
    removed.sort();
    Diff { upserts, removed }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Names from a small alphabet (so sets overlap), each with one of two bodies.
    fn set() -> impl Strategy<Value = TypeResources> {
        proptest::collection::btree_map("[a-e]{1,2}", 0u8..2, 0..12).prop_map(|m| {
            m.into_iter()
                .map(|(n, b)| (n, Versioned::new(vec![b])))
                .collect()
        })
    }

    /// A version is the first 8 bytes of the body's SHA-256 in lower-case hex (what nodes
    /// hold across restarts).
    #[test]
    fn a_version_is_the_hex_of_the_digests_first_8_bytes() {
        // SHA-256("abc") = ba7816bf8f01cfea 414140de5dae2223 ...
        assert_eq!(Versioned::new(b"abc".to_vec()).version, "ba7816bf8f01cfea");
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    /// Split over threads or not, the items come out encoded in their order.
    #[test]
    fn encoding_on_many_threads_keeps_the_order() {
        let items: Vec<u32> = (0..(3 * ENCODE_CHUNK as u32 + 17)).collect();
        let make = |i: &u32| {
            (
                format!("r{i}"),
                prost_types::Duration {
                    seconds: i64::from(*i),
                    nanos: 0,
                },
            )
        };
        let all = encode_all(&items, make);
        let one_by_one: Vec<_> = items
            .iter()
            .map(|i| {
                let (n, m) = make(i);
                (n, Versioned::new(m.encode_to_vec()))
            })
            .collect();
        assert_eq!(all, one_by_one);
    }

    /// A large mesh with a service, a gateway and a policy: encoded with the other resources
    /// beside the workloads, it is the set encoded one kind after the other.
    #[test]
    fn encoding_the_rest_beside_the_workloads_gives_the_same_set() {
        use ferry_core::model::{Action, Policy, PolicyScope};
        use ferry_core::testing::{MeshBuilder, key};

        let mut m = MeshBuilder::new();
        m.cluster("east", "net-east").node("n1", "east", "r/z/");
        m.service("svc", &[("net-east", "10.10.0.1")], 80, 8080);
        m.gateway("gw", "east", "10.20.0.1");
        m.policy(Policy {
            name: "allow".into(),
            namespace: "default".into(),
            scope: PolicyScope::Namespace,
            action: Action::Allow,
            rules: vec![],
            dry_run: false,
        });
        for i in 0..2 * ENCODE_CHUNK + 3 {
            m.pod(
                &format!("pod{i}"),
                "n1",
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
            );
            m.workloads.last_mut().expect("just made").services = BTreeMap::from([(
                key("svc"),
                vec![ferry_core::model::PortMapping {
                    service_port: 80,
                    target_port: 8080,
                }],
            )])
            .into();
        }
        let snap = m.build();
        let workloads: Vec<_> = snap.workloads().collect();
        let beside = ResourceSet::encode_on(&snap, &workloads, true);
        let after = ResourceSet::encode_on(&snap, &workloads, false);
        assert_eq!(beside.by_type, after.by_type);
        assert_eq!(beside.len(), 2 * ENCODE_CHUNK + 3 + 3);
    }

    proptest! {
        /// Walking two sets gives what looking up the held versions one by one gives.
        #[test]
        fn diff_sets_is_diff_of_the_held_versions(held in set(), current in set()) {
            let known: HashMap<String, String> = held
                .iter()
                .map(|(n, v)| (n.clone(), v.version.clone()))
                .collect();
            prop_assert_eq!(diff_sets(&held, &current), diff(&known, &current));
        }
    }
}
