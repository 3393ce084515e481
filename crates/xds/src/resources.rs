//! Versioned resource sets: what the control plane serves, and what a client has.
//!
//! A set's maps are persistent (`imbl`): a set brought to a new snapshot by
//! [`ResourceSet::update`] shares every resource that did not change with the set before, and
//! the difference of two such sets ([`diff_sets`]) walks only what is not shared.

mod update;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ferry_api::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
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
        let version = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Self {
            version,
            body: Arc::new(body),
        }
    }
}

/// The resources of one type, by name, in name order (a persistent map: clones share it).
pub type TypeResources = imbl::OrdMap<String, Versioned>;

pub use update::Changes;

/// Everything the control plane serves, by type URL.
#[derive(Clone, Debug, Default)]
pub struct ResourceSet {
    pub by_type: BTreeMap<&'static str, TypeResources>,
}

impl ResourceSet {
    /// Encodes a snapshot as it is. The control plane flattens nested service addresses first
    /// (`ferry_control::flatten::resource_set`).
    pub fn encode(snap: &Snapshot) -> Self {
        let mut by_type = BTreeMap::new();
        by_type.insert(
            ADDRESS_TYPE,
            convert::address_resources(snap)
                .into_iter()
                .map(|(n, m)| (n, Versioned::new(m.encode_to_vec())))
                .collect(),
        );
        by_type.insert(
            AUTHORIZATION_TYPE,
            convert::authorization_resources(snap)
                .into_iter()
                .map(|(n, m)| (n, Versioned::new(m.encode_to_vec())))
                .collect(),
        );
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
