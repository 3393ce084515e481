//! What many resources repeat, held once by a decoder: the names of networks, clusters and
//! nodes, a workload's locality (the workloads of one node carry the same), and its service map
//! and labels (the replicas of one deployment carry the same). A node of a 100,000-workload mesh then holds a few hundred of each instead of one
//! per workload.
//!
//! A workload's maps are found by the bytes they were sent as (`*_wire`, [`super::wire`]):
//! a replica's map is then one hash of its bytes and one compare, not a map decoded, built,
//! hashed, compared and dropped. The bytes are kept for one push ([`Interner::forget_wire`]).
//!
//! The map pools drop what nothing else holds whenever they have doubled since they were last
//! trimmed, and a name pool that fills starts again with twice the room, so names and maps
//! that leave the mesh do not stay behind for long.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use ferry_core::keyed_hash::{HashMap, Keyed};
use ferry_core::model::{ClusterId, Locality, NetworkId, NodeName, PortMapping, ServiceKey};
use hashbrown::HashTable;

mod by_wire;

use by_wire::ByWire;

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
    labels: Maps<Labels>,
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

    /// The copy held of the service map whose entries were sent as `wire` (each entry's
    /// bytes): found by those bytes when they were seen before, else `make` decodes and
    /// converts them (an `Err` from it is returned, and nothing kept).
    pub(crate) fn services_wire<E>(
        &mut self,
        wire: &[Vec<u8>],
        make: impl FnOnce(&[Vec<u8>]) -> Result<Result<ServiceMap, String>, E>,
    ) -> Result<Result<Arc<ServiceMap>, String>, E> {
        self.services.get_wire(wire, make)
    }

    /// Forgets the bytes the maps were sent as, keeping the maps: what a client does after
    /// each push (a first sync meets most maps many times; the node then keeps the maps alone,
    /// not each one's bytes and its slot in the table as well).
    pub(crate) fn forget_wire(&mut self) {
        self.services.by_wire = ByWire::default();
        self.labels.by_wire = ByWire::default();
        self.localities.by_wire = ByWire::default();
    }

    /// [`Interner::services_wire`] for a workload's labels.
    pub(crate) fn labels_wire<E>(
        &mut self,
        wire: &[Vec<u8>],
        make: impl FnOnce(&[Vec<u8>]) -> Result<Labels, E>,
    ) -> Result<Arc<Labels>, E> {
        let m = self.labels.get_wire(wire, |w| make(w).map(Ok))?;
        Ok(m.unwrap_or_else(|never: Infallible| match never {}))
    }

    /// [`Interner::services_wire`] for a workload's locality.
    pub(crate) fn locality_wire<E>(
        &mut self,
        wire: &[Vec<u8>],
        make: impl FnOnce(&[Vec<u8>]) -> Result<Locality, E>,
    ) -> Result<Arc<Locality>, E> {
        let m = self.localities.get_wire(wire, |w| make(w).map(Ok))?;
        Ok(m.unwrap_or_else(|never: Infallible| match never {}))
    }

    /// This interner's copy of a network name handed out by another (a push decoded on
    /// several threads, each with its own interner): the one it holds, else `n` itself.
    /// Found by address in `from` when another resource of that interner brought the same
    /// copy: one probe of a small table instead of hashing and comparing the text.
    pub(crate) fn adopt_network(&mut self, n: &NetworkId, from: &mut Adopted) -> NetworkId {
        adopt_name(&mut self.networks, &mut from.networks, n, n.as_str())
    }

    pub(crate) fn adopt_cluster(&mut self, c: &ClusterId, from: &mut Adopted) -> ClusterId {
        adopt_name(&mut self.clusters, &mut from.clusters, c, c.as_str())
    }

    pub(crate) fn adopt_node(&mut self, n: &NodeName, from: &mut Adopted) -> NodeName {
        adopt_name(&mut self.nodes, &mut from.nodes, n, n.as_str())
    }

    pub(crate) fn adopt_locality(
        &mut self,
        l: &Arc<Locality>,
        from: &mut Adopted,
    ) -> Arc<Locality> {
        adopt_map(&mut self.localities, &mut from.localities, l)
    }

    pub(crate) fn adopt_services(
        &mut self,
        m: &Arc<ServiceMap>,
        from: &mut Adopted,
    ) -> Arc<ServiceMap> {
        adopt_map(&mut self.services, &mut from.services, m)
    }

    pub(crate) fn adopt_labels(&mut self, m: &Arc<Labels>, from: &mut Adopted) -> Arc<Labels> {
        adopt_map(&mut self.labels, &mut from.labels, m)
    }
}

/// A workload's labels, as the model holds them.
pub type Labels = BTreeMap<String, String>;

/// Another interner's copies met so far, by their address, each with this one's
/// ([`Interner::adopt_network`] and the like; [`super::share`]). Each entry keeps the other's
/// copy too: while the table lives no other name or map can take its address, even after
/// that interner drops it (its pools are trimmed as it goes on decoding).
#[derive(Debug, Default)]
pub(crate) struct Adopted {
    networks: HashMap<usize, (NetworkId, NetworkId)>,
    clusters: HashMap<usize, (ClusterId, ClusterId)>,
    nodes: HashMap<usize, (NodeName, NodeName)>,
    localities: HashMap<usize, (Arc<Locality>, Arc<Locality>)>,
    services: HashMap<usize, (Arc<ServiceMap>, Arc<ServiceMap>)>,
    labels: HashMap<usize, (Arc<Labels>, Arc<Labels>)>,
}

fn text_at(s: &str) -> usize {
    s.as_ptr() as usize
}

/// `mine`'s copy of `name` (its text `text`), another interner's, found by the text's address
/// in `seen` when that copy was met before, else by the text (then remembered; `seen` keeps
/// the other's copy, so that no later copy takes its address).
fn adopt_name<T: Clone>(
    mine: &mut Pool<T>,
    seen: &mut HashMap<usize, (T, T)>,
    name: &T,
    text: &str,
) -> T {
    seen.entry(text_at(text))
        .or_insert_with(|| (name.clone(), mine.get(text, |_| name.clone())))
        .1
        .clone()
}

/// `mine`'s copy of `m`, another interner's map, found by `m`'s address in `seen` when that
/// copy was met before, else by its content (then remembered).
fn adopt_map<M: Hash + Eq>(
    mine: &mut Maps<M>,
    seen: &mut HashMap<usize, (Arc<M>, Arc<M>)>,
    m: &Arc<M>,
) -> Arc<M> {
    seen.entry(Arc::as_ptr(m) as usize)
        .or_insert_with(|| (m.clone(), mine.adopt(m)))
        .1
        .clone()
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

/// Maps by their content, and by the bytes they were sent as. One that outgrows twice its
/// size at the last trim drops the maps it alone holds, with their bytes.
#[derive(Clone, Debug)]
struct Maps<M> {
    /// Each map with the hash of its content: the table grows (66,000 maps of a million
    /// workloads, doubling from 1,024) without hashing every map's content again.
    set: HashTable<(u64, Arc<M>)>,
    hasher: Keyed,
    /// The wire bytes a map was decoded from (its entries' or occurrences'), to its copy.
    by_wire: ByWire<M>,
    trim_at: usize,
}

impl<M> Default for Maps<M> {
    fn default() -> Self {
        Self {
            set: HashTable::new(),
            hasher: Keyed::default(),
            by_wire: ByWire::default(),
            trim_at: 1024,
        }
    }
}

impl<M: Hash + Eq> Maps<M> {
    fn get(&mut self, m: M) -> Arc<M> {
        let hash = self.hasher.hash_one(&m);
        if let Some(shared) = self.find(hash, &m) {
            return shared.clone();
        }
        self.insert(hash, Arc::new(m))
    }

    fn find(&self, hash: u64, m: &M) -> Option<&Arc<M>> {
        self.set
            .find(hash, |(h, held)| *h == hash && **held == *m)
            .map(|(_, held)| held)
    }

    /// The copy of the map sent as `wire`: by its bytes, else as `make` decodes them (by
    /// content, then remembered by its bytes). The same bytes always decode to the same map;
    /// equal maps sent as different bytes (entries in another order) still share one copy.
    fn get_wire<I, E>(
        &mut self,
        wire: &[Vec<u8>],
        make: impl FnOnce(&[Vec<u8>]) -> Result<Result<M, I>, E>,
    ) -> Result<Result<Arc<M>, I>, E> {
        let hash = self.by_wire.hash(wire);
        if let Some(shared) = self.by_wire.get(hash, wire) {
            return Ok(Ok(shared.clone()));
        }
        let m = match make(wire)? {
            Ok(m) => self.get(m),
            Err(invalid) => return Ok(Err(invalid)),
        };
        if self.by_wire.len() >= self.trim_at {
            // Only maps sent as many encodings get here before the set is trimmed.
            self.by_wire.clear();
        }
        self.by_wire.insert(hash, wire, m.clone());
        Ok(Ok(m))
    }

    /// The copy held of a map shared elsewhere, else that map itself.
    fn adopt(&mut self, m: &Arc<M>) -> Arc<M> {
        let hash = self.hasher.hash_one(&**m);
        if let Some(shared) = self.find(hash, m) {
            return shared.clone();
        }
        self.insert(hash, m.clone())
    }

    /// Holds `shared`, whose content hashes to `hash`.
    fn insert(&mut self, hash: u64, shared: Arc<M>) -> Arc<M> {
        if self.set.len() >= self.trim_at {
            // A map that the set and its bytes alone hold is held by nothing else: its bytes
            // go, then the map. The bytes of a map still held stay, so that it is found by them
            // again (a first sync meets the 66,000 maps of a million workloads many times: were
            // they forgotten at each doubling, each would be decoded, hashed and compared again).
            // A map sent as several encodings keeps them all until the push ends.
            self.by_wire.retain(|m| Arc::strong_count(m) > 2);
            self.set.retain(|(_, m)| Arc::strong_count(m) > 1);
            self.trim_at = (self.set.len() * 2).max(1024);
        }
        self.set
            .insert_unique(hash, (hash, shared.clone()), |(h, _)| *h);
        shared
    }
}

#[cfg(test)]
#[path = "intern_tests.rs"]
mod tests;
