//! Each cluster's objects decoded once and kept between translations, in place of a
//! reflector's store: a watch event's object waits in its kind's [`Pending`] (the last one of
//! each key), and the next translation decodes just those ([`Cache::refresh`]), telling the
//! translation what changed ([`Changed`]). A complete list (the first, or a relist after the
//! watch lost its place) replaces every object of its kind once it is whole, as a reflector's
//! store does; a watch that fails keeps the objects it had.
//!
//! The objects are kept in namespace/name order, as [`crate::translate::incremental`] finds
//! them (the same order in every replica).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;

use crate::objects::{ClusterObjects, HasMeta, Note, strip_unread};
use crate::translate::incremental::Changed;

/// An object's `(namespace, name)`, as its metadata gives them.
pub(super) type Key = (Option<String>, Option<String>);

/// The key of an object with metadata `m`.
pub(super) fn key_of(m: &ObjectMeta) -> Key {
    (m.namespace.clone(), m.name.clone())
}

/// A kind's events not read yet.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// A list being received.
    building: Option<Vec<DynamicObject>>,
    /// The last complete list: it replaces every object of the kind.
    list: Option<Vec<DynamicObject>>,
    /// Objects added or changed (`Some`) and deleted (`None`) since, by key.
    changes: BTreeMap<Key, Option<DynamicObject>>,
}

impl Pending {
    /// Takes in a watch event.
    pub(super) fn push(&mut self, event: watcher::Event<DynamicObject>) {
        match event {
            watcher::Event::Init => self.building = Some(Vec::new()),
            watcher::Event::InitApply(o) => self.building.get_or_insert_with(Vec::new).push(o),
            watcher::Event::InitDone => {
                self.list = Some(self.building.take().unwrap_or_default());
                self.changes.clear();
            }
            watcher::Event::Apply(o) => {
                self.changes.insert(key_of(&o.metadata), Some(o));
            }
            watcher::Event::Delete(o) => {
                self.changes.insert(key_of(&o.metadata), None);
            }
        }
    }
}

/// One watched kind of a cluster.
pub(super) struct Kind {
    pub(super) ar: ApiResource,
    /// Its first list has arrived (or it is not served).
    pub(super) listed: Arc<AtomicBool>,
    pub(super) pending: Arc<Mutex<Pending>>,
}

/// A cluster's decoded objects.
#[derive(Debug, Default)]
pub(super) struct Cache {
    pub(super) objects: ClusterObjects,
    /// The notes of objects that did not decode, by kind (its index) and key.
    notes: BTreeMap<(usize, Key), Vec<Note>>,
    /// Read since every kind listed.
    read: bool,
    /// Left out of the last translation for a kind not listed yet.
    unlisted: bool,
}

impl Cache {
    pub(super) fn new(cluster: &str, network: Option<String>) -> Self {
        let mut objects = ClusterObjects::new(cluster);
        objects.network = network;
        Self {
            objects,
            notes: BTreeMap::new(),
            read: false,
            unlisted: false,
        }
    }

    /// How many objects it holds.
    pub(super) fn len(&self) -> usize {
        let o = &self.objects;
        o.namespaces.len()
            + o.nodes.len()
            + o.pods.len()
            + o.services.len()
            + o.endpoint_slices.len()
            + o.gateways.len()
            + o.http_routes.len()
            + o.policies.len()
            + o.peer_authentications.len()
            + o.service_exports.len()
            + o.service_imports.len()
    }

    /// Brings the objects up to date with `kinds`' events, adding what changed to `changed`;
    /// the notes of objects that do not decode go to `notes`. A cluster some of whose kinds
    /// have not listed yet has no objects: serving its pods without, say, its policies would
    /// fail open.
    pub(super) fn refresh(&mut self, kinds: &[Kind], changed: &mut Changed, notes: &mut Vec<Note>) {
        let cluster = self.objects.cluster.clone();
        if !kinds.iter().all(|k| k.listed.load(Ordering::Acquire)) {
            // Once, as the cluster leaves the mesh (or first, when it has not joined yet):
            // while it stays out, edits elsewhere are no reason to translate whole.
            if !self.unlisted {
                *self = Self::new(&cluster, self.objects.network.take());
                self.unlisted = true;
                changed.whole = true;
            }
            notes.push(Note {
                cluster,
                object: "(cluster)".into(),
                message: "not every kind has listed yet: none of this cluster's objects are served"
                    .into(),
            });
            return;
        }
        for (i, kind) in kinds.iter().enumerate() {
            let (list, changes) = {
                let mut p = kind.pending.lock();
                (p.list.take(), std::mem::take(&mut p.changes))
            };
            if let Some(list) = list {
                self.read_list(i, kind, list);
                changed.whole = true;
            } else if !self.read {
                // Not served by the cluster: none.
                clear(&mut self.objects, &kind.ar.kind);
                changed.whole = true;
            }
            for (key, object) in changes {
                self.put(i, kind, &key, object.as_ref());
                let object = (
                    cluster.clone(),
                    key.0.unwrap_or_else(|| "default".into()),
                    key.1.unwrap_or_default(),
                );
                match (kind.ar.group.as_str(), kind.ar.kind.as_str()) {
                    ("", "Pod") => {
                        changed.pods.insert(object);
                    }
                    ("discovery.k8s.io", "EndpointSlice") => {
                        changed.slices.insert(object);
                    }
                    _ => changed.whole = true,
                }
            }
        }
        self.read = true;
        self.unlisted = false;
        notes.extend(self.notes.values().flatten().cloned());
    }

    /// Reads kind `i` whole from its list.
    fn read_list(&mut self, i: usize, kind: &Kind, mut state: Vec<DynamicObject>) {
        state.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        // One object per key, the last listed (as a store keeps it).
        state.reverse();
        state.dedup_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name) == (&b.metadata.namespace, &b.metadata.name)
        });
        state.reverse();
        clear(&mut self.objects, &kind.ar.kind);
        self.notes.retain(|(k, _), _| *k != i);
        for obj in state {
            let key = key_of(&obj.metadata);
            let mut notes = Vec::new();
            decode(&mut self.objects, &kind.ar, &obj, &mut notes);
            if !notes.is_empty() {
                self.notes.insert((i, key), notes);
            }
        }
    }

    /// Puts `object` in place of the object `key` of kind `i` (`None`: deleted).
    fn put(&mut self, i: usize, kind: &Kind, key: &Key, object: Option<&DynamicObject>) {
        let mut one = ClusterObjects::new(self.objects.cluster.clone());
        let mut notes = Vec::new();
        if let Some(obj) = object {
            decode(&mut one, &kind.ar, obj, &mut notes);
        }
        self.notes.remove(&(i, key.clone()));
        if !notes.is_empty() {
            self.notes.insert((i, key.clone()), notes);
        }
        place(&mut self.objects, &mut one, &kind.ar.kind, key);
    }
}

/// Decodes `obj` (of kind `ar`) into `objects`.
fn decode(
    objects: &mut ClusterObjects,
    ar: &ApiResource,
    obj: &DynamicObject,
    notes: &mut Vec<Note>,
) {
    match serde_json::to_value(obj) {
        Ok(mut v) => {
            // Kept for as long as the object lives: only what the translation reads.
            strip_unread(&ar.group, &ar.kind, &mut v);
            objects.add_as(&ar.group, &ar.kind, v, notes);
        }
        Err(e) => notes.push(Note {
            cluster: objects.cluster.clone(),
            object: ar.kind.clone(),
            message: format!("left out: it does not encode ({e})"),
        }),
    }
}

/// Empties the list of kind `kind`.
fn clear(objects: &mut ClusterObjects, kind: &str) {
    match kind {
        "Namespace" => objects.namespaces.clear(),
        "Node" => objects.nodes.clear(),
        "Pod" => objects.pods.clear(),
        "Service" => objects.services.clear(),
        "EndpointSlice" => objects.endpoint_slices.clear(),
        "Gateway" => objects.gateways.clear(),
        "HTTPRoute" => objects.http_routes.clear(),
        "AuthorizationPolicy" => objects.policies.clear(),
        "PeerAuthentication" => objects.peer_authentications.clear(),
        "ServiceExport" => objects.service_exports.clear(),
        "ServiceImport" => objects.service_imports.clear(),
        _ => {}
    }
}

/// Puts the object of `one` (of kind `kind`; none: it is gone) in place of `key` in `objects`.
fn place(objects: &mut ClusterObjects, one: &mut ClusterObjects, kind: &str, key: &Key) {
    match kind {
        "Namespace" => put_sorted(&mut objects.namespaces, one.namespaces.pop(), key),
        "Node" => put_sorted(&mut objects.nodes, one.nodes.pop(), key),
        "Pod" => put_sorted(&mut objects.pods, one.pods.pop(), key),
        "Service" => put_sorted(&mut objects.services, one.services.pop(), key),
        "EndpointSlice" => put_sorted(&mut objects.endpoint_slices, one.endpoint_slices.pop(), key),
        "Gateway" => put_sorted(&mut objects.gateways, one.gateways.pop(), key),
        "HTTPRoute" => put_sorted(&mut objects.http_routes, one.http_routes.pop(), key),
        "AuthorizationPolicy" => put_sorted(&mut objects.policies, one.policies.pop(), key),
        "PeerAuthentication" => put_sorted(
            &mut objects.peer_authentications,
            one.peer_authentications.pop(),
            key,
        ),
        "ServiceExport" => put_sorted(&mut objects.service_exports, one.service_exports.pop(), key),
        "ServiceImport" => put_sorted(&mut objects.service_imports, one.service_imports.pop(), key),
        _ => {}
    }
}

/// Replaces the object of `key` in `v` (sorted by key) with `new`, or takes it out.
fn put_sorted<T: HasMeta>(v: &mut Vec<T>, new: Option<T>, key: &Key) {
    let at = v.binary_search_by(|o| {
        let m = o.meta();
        (m.namespace.as_deref(), m.name.as_deref()).cmp(&(key.0.as_deref(), key.1.as_deref()))
    });
    match (at, new) {
        (Ok(i), Some(n)) => v[i] = n,
        (Ok(i), None) => {
            v.remove(i);
        }
        (Err(i), Some(n)) => v.insert(i, n),
        (Err(_), None) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{ApiResource, DynamicObject};
    use kube::runtime::watcher::Event;
    use parking_lot::Mutex;

    use super::{Cache, Kind, Pending};
    use crate::translate::incremental::Changed;

    fn pod(name: &str, version: u64) -> DynamicObject {
        let ar = ApiResource::erase::<Pod>(&());
        DynamicObject::new(name, &ar).within("ns").data(
            serde_json::json!({"spec": {"containers": [], "nodeName": format!("n{version}")}}),
        )
    }

    /// Random watch events (changes, deletes, relists, a relist cut short by another), read
    /// in random batches: the cache holds what a reflector's store would, in order, and says
    /// which pods changed.
    #[test]
    fn the_cache_holds_what_a_store_would() {
        let ar = ApiResource::erase::<Pod>(&());
        for seed in 0..50u64 {
            let mut g = ferry_core::testing::Gen(ferry_core::random::SplitMix64::new(seed));
            let kind = Kind {
                ar: ar.clone(),
                listed: Arc::new(AtomicBool::new(true)),
                pending: Arc::new(Mutex::new(Pending::default())),
            };
            let mut cache = Cache::new("c", None);
            // What a store holds: the last complete list and the changes since.
            let mut store: BTreeMap<String, u64> = BTreeMap::new();
            let mut building: Option<BTreeMap<String, u64>> = None;
            let event = |e: Event<DynamicObject>| kind.pending.lock().push(e);
            let mut before: Vec<(String, String)> = Vec::new();
            event(Event::Init);
            event(Event::InitDone);
            for step in 0..200u64 {
                let name = format!("p{}", g.below(12));
                match g.below(10) {
                    0..5 if building.is_none() => {
                        event(Event::Apply(pod(&name, step)));
                        store.insert(name, step);
                    }
                    5..7 if building.is_none() => {
                        event(Event::Delete(pod(&name, step)));
                        store.remove(&name);
                    }
                    7 => {
                        event(Event::Init);
                        building = Some(BTreeMap::new());
                    }
                    _ => match building.as_mut() {
                        Some(b) if g.chance(70) => {
                            event(Event::InitApply(pod(&name, step)));
                            b.insert(name, step);
                        }
                        Some(_) => {
                            event(Event::InitDone);
                            store = building.take().unwrap_or_default();
                        }
                        None => {}
                    },
                }
                if g.chance(20) {
                    let mut changed = Changed::default();
                    let mut notes = Vec::new();
                    cache.refresh(std::slice::from_ref(&kind), &mut changed, &mut notes);
                    let held: Vec<(String, String)> = cache
                        .objects
                        .pods
                        .iter()
                        .map(|p| {
                            let spec = p.spec.as_ref().and_then(|s| s.node_name.clone());
                            (
                                p.metadata.name.clone().unwrap_or_default(),
                                spec.unwrap_or_default(),
                            )
                        })
                        .collect();
                    let want: Vec<(String, String)> = store
                        .iter()
                        .map(|(n, v)| (n.clone(), format!("n{v}")))
                        .collect();
                    assert_eq!(held, want, "seed {seed} step {step}");
                    assert!(notes.is_empty(), "{notes:?}");
                    // Every pod that differs is named, unless everything is to be translated.
                    let differ = held
                        .iter()
                        .filter(|p| !before.contains(p))
                        .chain(before.iter().filter(|p| !held.contains(p)));
                    for (name, _) in differ {
                        let key = ("c".to_string(), "ns".to_string(), name.clone());
                        assert!(
                            changed.whole || changed.pods.contains(&key),
                            "seed {seed} step {step}: {name} changed unnamed"
                        );
                    }
                    before = held;
                }
            }
        }
    }
}
