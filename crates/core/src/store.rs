//! The current snapshot, swapped atomically.
//!
//! Readers call [`Store::load`] and keep the returned `Arc` for as long as one decision takes:
//! they never block and never see a half-applied update. Writers build a whole new snapshot off
//! to the side and publish it with one swap.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::snapshot::Snapshot;

/// Holds the mesh's current snapshot.
#[derive(Debug)]
pub struct Store {
    current: ArcSwap<Snapshot>,
}

impl Store {
    pub fn new(initial: Snapshot) -> Self {
        Self {
            current: ArcSwap::from_pointee(initial),
        }
    }

    /// The current snapshot. Lock-free; the caller holds it for the length of one decision.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Replaces the current snapshot, returning the one it replaced.
    pub fn publish(&self, next: Snapshot) -> Arc<Snapshot> {
        self.current.swap(Arc::new(next))
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new(Snapshot::default())
    }
}
