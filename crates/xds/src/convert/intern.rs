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
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use ferry_core::keyed_hash::{HashMap, Keyed};
use ferry_core::model::{ClusterId, Locality, NetworkId, NodeName, PortMapping, ServiceKey};
use hashbrown::HashTable;

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

/// Maps by the bytes they were sent as: each held with its bytes in one buffer (each entry's
/// length, then its bytes) and their hash. A lookup hashes the entries as they came, without
/// copying them, and compares them with that one buffer: one read of memory fewer than a key
/// of one vector per entry (the list, then each entry), on tables of 66,000 maps where each
/// read is a cache miss.
#[derive(Clone, Debug)]
struct ByWire<M> {
    table: HashTable<Wire<M>>,
    hasher: Keyed,
}

impl<M> Default for ByWire<M> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: Keyed::default(),
        }
    }
}

#[derive(Clone, Debug)]
struct Wire<M> {
    hash: u64,
    bytes: Box<[u8]>,
    map: Arc<M>,
}

/// An entry's length as the buffer holds it.
const LEN: usize = size_of::<u64>();

impl<M> ByWire<M> {
    fn hash(&self, entries: &[Vec<u8>]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_usize(entries.len());
        for e in entries {
            h.write_usize(e.len());
            h.write(e);
        }
        h.finish()
    }

    fn get(&self, hash: u64, entries: &[Vec<u8>]) -> Option<&Arc<M>> {
        self.table
            .find(hash, |w| w.hash == hash && same(&w.bytes, entries))
            .map(|w| &w.map)
    }

    fn insert(&mut self, hash: u64, entries: &[Vec<u8>], map: Arc<M>) {
        let mut bytes = Vec::with_capacity(entries.iter().map(|e| LEN + e.len()).sum());
        for e in entries {
            bytes.extend_from_slice(&(e.len() as u64).to_le_bytes());
            bytes.extend_from_slice(e);
        }
        let bytes = bytes.into_boxed_slice();
        self.table
            .insert_unique(hash, Wire { hash, bytes, map }, |w| w.hash);
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn clear(&mut self) {
        self.table.clear();
    }

    fn retain(&mut self, mut keep: impl FnMut(&Arc<M>) -> bool) {
        self.table.retain(|w| keep(&w.map));
    }
}

/// Whether `bytes`, a [`ByWire`] buffer, holds `entries`.
fn same(mut bytes: &[u8], entries: &[Vec<u8>]) -> bool {
    for e in entries {
        let Some((len, rest)) = bytes.split_first_chunk::<LEN>() else {
            return false;
        };
        if u64::from_le_bytes(*len) != e.len() as u64 {
            return false;
        }
        let Some((sent, rest)) = rest.split_at_checked(e.len()) else {
            return false;
        };
        if sent != e.as_slice() {
            return false;
        }
        bytes = rest;
    }
    bytes.is_empty()
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
mod tests {
    use super::*;

    #[test]
    fn another_interners_copy_is_adopted_by_content_even_where_a_dropped_one_was() {
        // The client holds its own copy of each; each round's other copies are dropped with
        // their interner, and a new one may be given the address of the one before, which the
        // table must not take for it.
        let mut mine = Interner::default();
        let mut from = Adopted::default();
        for i in 0..1_000 {
            let labels = BTreeMap::from([("app".to_string(), format!("a{i}"))]);
            let name = format!("node-{i}");
            let (my_labels, my_node) = (mine.labels(labels.clone()), mine.node(&name));
            let mut theirs = Interner::default();
            let (m, n) = (theirs.labels(labels), theirs.node(&name));
            assert!(Arc::ptr_eq(&mine.adopt_labels(&m, &mut from), &my_labels));
            assert!(std::ptr::eq(
                mine.adopt_node(&n, &mut from).as_str(),
                my_node.as_str()
            ));
        }
    }

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
    fn a_map_is_found_by_its_bytes_and_shared_still_once_they_are_forgotten() {
        let mut i = Interner::default();
        let wire = || vec![b"app=a".to_vec()];
        let make =
            |_: &[Vec<u8>]| Ok::<_, ()>(BTreeMap::from([("app".to_string(), "a".to_string())]));
        let a = i.labels_wire(&wire(), make).expect("made");
        // Found by its bytes: not made again.
        let b = i.labels_wire(&wire(), |_| Err(())).expect("found");
        assert!(Arc::ptr_eq(&a, &b));
        i.forget_wire();
        assert_eq!(i.labels.by_wire.len(), 0);
        let c = i.labels_wire(&wire(), make).expect("made");
        assert!(Arc::ptr_eq(&a, &c), "found by its content");
    }

    #[test]
    fn bytes_are_found_only_as_the_same_entries() {
        let mut i = Interner::default();
        let labels = |v: &str| BTreeMap::from([("app".to_string(), v.to_string())]);
        let a = i
            .labels_wire(&[b"ab".to_vec()], |_| Ok::<_, ()>(labels("a")))
            .expect("made");
        // The same bytes cut into other entries, or with one more entry, are other bytes.
        for other in [
            vec![b"a".to_vec(), b"b".to_vec()],
            vec![b"ab".to_vec(), Vec::new()],
            vec![],
        ] {
            let m = i
                .labels_wire(&other, |_| Ok::<_, ()>(labels("b")))
                .expect("made");
            assert!(!Arc::ptr_eq(&a, &m), "{other:?}");
        }
        let again = i
            .labels_wire(&[b"ab".to_vec()], |_| Err(()))
            .expect("found");
        assert!(Arc::ptr_eq(&a, &again));
    }

    /// Two inputs with one hash are told apart by their content, by bytes and by map.
    #[test]
    fn one_hash_for_other_bytes_or_another_map_finds_nothing() {
        let map = |v: &str| Arc::new(BTreeMap::from([("app".to_string(), v.to_string())]));
        let mut b = ByWire::default();
        b.insert(7, &[b"ab".to_vec()], map("a"));
        assert!(b.get(7, &[b"ab".to_vec()]).is_some());
        assert!(b.get(7, &[b"a".to_vec(), b"b".to_vec()]).is_none());
        assert!(b.get(7, &[b"ac".to_vec()]).is_none());
        let mut m = Maps::default();
        m.insert(7, map("a"));
        assert!(m.find(7, &map("a")).is_some());
        assert!(m.find(7, &map("b")).is_none());
    }

    #[test]
    fn a_map_still_held_is_found_by_its_bytes_after_a_trim() {
        let mut i = Interner::default();
        let wire = |n: usize| vec![format!("app={n}").into_bytes()];
        let make = |n: usize| {
            move |_: &[Vec<u8>]| Ok::<_, ()>(BTreeMap::from([("app".to_string(), n.to_string())]))
        };
        // Enough maps for the pool to be trimmed several times, all still held.
        let held: Vec<_> = (0..5_000)
            .map(|n| i.labels_wire(&wire(n), make(n)).expect("made"))
            .collect();
        for (n, m) in held.iter().enumerate() {
            // Found by its bytes: not made again.
            let again = i
                .labels_wire(&wire(n), |_| Err(()))
                .expect("found by its bytes");
            assert!(Arc::ptr_eq(m, &again));
        }
        // Once no longer held, a map goes with its bytes at the next trim.
        drop(held);
        for n in 5_000..15_000 {
            i.labels_wire(&wire(n), make(n)).expect("made");
        }
        assert!(i.labels.set.len() <= 1024, "{}", i.labels.set.len());
        assert!(i.labels.by_wire.len() <= 1024, "{}", i.labels.by_wire.len());
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
