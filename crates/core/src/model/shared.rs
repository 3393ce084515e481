//! A map that many objects hold the same copy of: the replicas of one deployment carry the
//! same labels and back the same services, and a node of a large mesh holds each such map once
//! (`ferry_xds`'s decoder hands out one copy per distinct map).

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::ops::Deref;
use std::sync::Arc;

use serde::Serialize;

/// An ordered map held in one shared allocation. Read it as the `BTreeMap` it derefs to; a
/// copy is a reference count, and [`SharedMap::make_mut`] changes this holder's copy only.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SharedMap<K, V>(Arc<BTreeMap<K, V>>);

impl<K, V> SharedMap<K, V> {
    /// This holder's map to change, copied first if another holds it too.
    pub fn make_mut(&mut self) -> &mut BTreeMap<K, V>
    where
        K: Clone,
        V: Clone,
    {
        Arc::make_mut(&mut self.0)
    }

    /// The shared allocation itself (another holder's copy to compare or share).
    pub fn as_arc(&self) -> &Arc<BTreeMap<K, V>> {
        &self.0
    }

    /// Do both hold the same copy?
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<K, V> Default for SharedMap<K, V> {
    fn default() -> Self {
        Self(Arc::new(BTreeMap::new()))
    }
}

impl<K, V> Deref for SharedMap<K, V> {
    type Target = BTreeMap<K, V>;

    fn deref(&self) -> &BTreeMap<K, V> {
        &self.0
    }
}

impl<K, V> From<BTreeMap<K, V>> for SharedMap<K, V> {
    fn from(m: BTreeMap<K, V>) -> Self {
        Self(Arc::new(m))
    }
}

impl<K, V> From<Arc<BTreeMap<K, V>>> for SharedMap<K, V> {
    fn from(m: Arc<BTreeMap<K, V>>) -> Self {
        Self(m)
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SharedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(Arc::new(iter.into_iter().collect()))
    }
}

impl<'a, K, V> IntoIterator for &'a SharedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = btree_map::Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_shared_until_changed() {
        let a: SharedMap<String, String> =
            [("app".to_string(), "a".to_string())].into_iter().collect();
        let mut b = a.clone();
        assert!(a.ptr_eq(&b));
        b.make_mut().insert("version".into(), "v1".into());
        assert!(!a.ptr_eq(&b));
        assert_eq!(a.len(), 1);
        assert_eq!(b.get("version").map(String::as_str), Some("v1"));
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"app":"a"}"#);
    }
}
