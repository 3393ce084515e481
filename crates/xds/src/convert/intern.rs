//! What many resources repeat, held once by a decoder: the names of networks, clusters and
//! nodes, a workload's locality (the workloads of one node carry the same), and its service map
//! and labels (the replicas of one deployment carry the same). A node of a 100,000-workload mesh then holds a few hundred of each instead of one
//! per workload.
//!
//! The map pools drop what nothing else holds whenever they have doubled since they were last
//! trimmed, and a name pool that fills starts again with twice the room, so names and maps
//! that leave the mesh do not stay behind for long.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;

use ferry_core::keyed_hash::{HashMap, HashSet};
use ferry_core::model::{ClusterId, Locality, NetworkId, NodeName, PortMapping, ServiceKey};

/// A workload's services with their port maps, as the model holds them.
pub type ServiceMap = BTreeMap<ServiceKey, Vec<PortMapping>>;

/// One shared copy of each name and map seen.
#[derive(Clone, Debug, Default)]
pub struct Interner {
    networks: Pool<NetworkId>,
    clusters: Pool<ClusterId>,
    nodes: Pool<NodeName>,
    localities: Maps<Locality>,
    services: Maps<ServiceMap>,
    labels: Maps<BTreeMap<String, String>>,
}

impl Interner {
    pub fn network(&mut self, s: &str) -> NetworkId {
        self.networks.get(s, |s| NetworkId::new(s))
    }

    pub fn cluster(&mut self, s: &str) -> ClusterId {
        self.clusters.get(s, |s| ClusterId::new(s))
    }

    pub fn node(&mut self, s: &str) -> NodeName {
        self.nodes.get(s, |s| NodeName::new(s))
    }

    pub fn locality(&mut self, l: Locality) -> Arc<Locality> {
        self.localities.get(l)
    }

    pub fn services(&mut self, m: ServiceMap) -> Arc<ServiceMap> {
        self.services.get(m)
    }

    pub fn labels(&mut self, m: BTreeMap<String, String>) -> Arc<BTreeMap<String, String>> {
        self.labels.get(m)
    }

    /// This interner's copy of a network name handed out by another (a push decoded on
    /// several threads, each with its own interner): the one it holds, else `n` itself.
    pub(crate) fn adopt_network(&mut self, n: &NetworkId) -> NetworkId {
        self.networks.get(n.as_str(), |_| n.clone())
    }

    pub(crate) fn adopt_cluster(&mut self, c: &ClusterId) -> ClusterId {
        self.clusters.get(c.as_str(), |_| c.clone())
    }

    pub(crate) fn adopt_node(&mut self, n: &NodeName) -> NodeName {
        self.nodes.get(n.as_str(), |_| n.clone())
    }

    pub(crate) fn adopt_locality(&mut self, l: &Arc<Locality>) -> Arc<Locality> {
        self.localities.adopt(l)
    }

    pub(crate) fn adopt_services(&mut self, m: &Arc<ServiceMap>) -> Arc<ServiceMap> {
        self.services.adopt(m)
    }

    pub(crate) fn adopt_labels(
        &mut self,
        m: &Arc<BTreeMap<String, String>>,
    ) -> Arc<BTreeMap<String, String>> {
        self.labels.adopt(m)
    }
}

/// Names by their text. The name types keep their string private (a pool cannot tell which
/// names are still held), so a pool that fills starts again empty with twice the room: names
/// handed out stay valid, and a mesh of more names than the room shares them again once the
/// room has grown past them.
#[derive(Clone, Debug)]
struct Pool<T> {
    by_text: HashMap<String, T>,
    trim_at: usize,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self {
            by_text: HashMap::default(),
            trim_at: 64,
        }
    }
}

impl<T: Clone> Pool<T> {
    fn get(&mut self, s: &str, make: impl FnOnce(&str) -> T) -> T {
        if let Some(t) = self.by_text.get(s) {
            return t.clone();
        }
        if self.by_text.len() >= self.trim_at {
            self.trim_at = self.by_text.len() * 2;
            self.by_text.clear();
        }
        let t = make(s);
        self.by_text.insert(s.to_string(), t.clone());
        t
    }
}

/// Maps by their content. One that outgrows twice its size at the last trim drops the maps
/// it alone holds.
#[derive(Clone, Debug)]
struct Maps<M> {
    set: HashSet<Arc<M>>,
    trim_at: usize,
}

impl<M> Default for Maps<M> {
    fn default() -> Self {
        Self {
            set: HashSet::default(),
            trim_at: 1024,
        }
    }
}

impl<M: Hash + Eq> Maps<M> {
    fn get(&mut self, m: M) -> Arc<M> {
        if let Some(shared) = self.set.get(&m) {
            return shared.clone();
        }
        self.insert(Arc::new(m))
    }

    /// The copy held of a map shared elsewhere, else that map itself.
    fn adopt(&mut self, m: &Arc<M>) -> Arc<M> {
        if let Some(shared) = self.set.get(&**m) {
            return shared.clone();
        }
        self.insert(m.clone())
    }

    fn insert(&mut self, shared: Arc<M>) -> Arc<M> {
        if self.set.len() >= self.trim_at {
            self.set.retain(|m| Arc::strong_count(m) > 1);
            self.trim_at = (self.set.len() * 2).max(1024);
        }
        self.set.insert(shared.clone());
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_and_maps_are_one_copy() {
        let mut i = Interner::default();
        let (a, b) = (i.node("node-1"), i.node("node-1"));
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(i.cluster("east").as_str(), "east");
        let labels = |v: &str| BTreeMap::from([("app".to_string(), v.to_string())]);
        let (x, y) = (i.labels(labels("a")), i.labels(labels("a")));
        assert!(Arc::ptr_eq(&x, &y));
        assert!(!Arc::ptr_eq(&x, &i.labels(labels("b"))));
    }

    #[test]
    fn pools_stay_bounded_as_names_and_maps_come_and_go() {
        let mut i = Interner::default();
        for n in 0..10_000 {
            i.node(&format!("node-{n}"));
            // Held by no one but the pool once returned.
            i.labels(BTreeMap::from([("app".to_string(), n.to_string())]));
        }
        assert!(i.nodes.by_text.len() < 16_384, "{}", i.nodes.by_text.len());
        assert!(i.labels.set.len() <= 1024, "{}", i.labels.set.len());
        // A map still held elsewhere survives a trim.
        let kept = i.labels(BTreeMap::from([("app".to_string(), "kept".to_string())]));
        for n in 0..5_000 {
            i.labels(BTreeMap::from([("x".to_string(), n.to_string())]));
        }
        let again = i.labels(BTreeMap::from([("app".to_string(), "kept".to_string())]));
        assert!(Arc::ptr_eq(&kept, &again));
    }
}
