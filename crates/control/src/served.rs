//! What the control plane serves for a mesh, kept so that the next mesh is encoded from it: an
//! edit encodes again only the resources whose inputs changed
//! ([`ferry_xds::resources::ResourceSet::update`]), the rest are shared with the set before.

use std::collections::BTreeSet;
use std::sync::Arc;

use ferry_core::model::WorkloadUid;
use ferry_core::snapshot::Snapshot;
use ferry_xds::resources::{Changes, ResourceSet};

use crate::flatten::flatten_or_none;

/// A mesh as served: the snapshot with nested service addresses flattened, and its resources.
#[derive(Clone, Debug)]
pub struct Served {
    flat: Snapshot,
    set: Arc<ResourceSet>,
}

impl Served {
    /// What is served for `snap` when `set` was encoded for it (flattened as
    /// [`crate::flatten::resource_set`] does).
    pub fn from_parts(snap: &Snapshot, set: Arc<ResourceSet>) -> Self {
        let flat = flatten_or_none(snap).unwrap_or_else(|| snap.clone());
        Self { flat, set }
    }

    /// `snap` flattened and encoded whole.
    pub fn new(snap: &Snapshot) -> Self {
        let flat = flatten_or_none(snap).unwrap_or_else(|| snap.clone());
        let set = Arc::new(ResourceSet::encode(&flat));
        Self { flat, set }
    }

    /// `snap` served, encoded from this one: only what differs between the two flattened
    /// snapshots is encoded again (equal to [`Served::new`] of `snap`).
    #[must_use]
    pub fn next(&self, snap: &Snapshot) -> Self {
        let flat = flatten_or_none(snap).unwrap_or_else(|| snap.clone());
        let changes = Changes::between(&self.flat, &flat);
        self.with(flat, &changes)
    }

    /// `snap`, which differs from the snapshot this serves in `workloads` alone (added, changed
    /// or removed), served: with nothing to flatten in it (no service has address endpoints,
    /// so nothing was flattened in this one either) those workloads are all that changed;
    /// else as [`Served::next`].
    #[must_use]
    pub fn edited(&self, snap: &Snapshot, workloads: &BTreeSet<WorkloadUid>) -> Self {
        if snap.services().any(|s| !s.address_endpoints.is_empty()) {
            return self.next(snap);
        }
        let changes = Changes {
            workloads: workloads.clone(),
            ..Changes::default()
        };
        self.with(snap.clone(), &changes)
    }

    /// The flattened snapshot `flat`, whose differences from this one's are `changes`, served.
    #[must_use]
    pub fn with(&self, flat: Snapshot, changes: &Changes) -> Self {
        let set = if changes.is_empty() {
            self.set.clone()
        } else {
            Arc::new(self.set.update(&self.flat, &flat, changes))
        };
        Self { flat, set }
    }

    /// The resources served.
    pub fn resources(&self) -> &Arc<ResourceSet> {
        &self.set
    }

    /// The snapshot as served (nested service addresses flattened).
    pub fn flat(&self) -> &Snapshot {
        &self.flat
    }
}
