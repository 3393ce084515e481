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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::testing::MeshBuilder;

    /// Snapshot `n` holds `n` workloads and has version 1; a reader that saw a half-applied update
    /// would find a count that does not match the addresses it can look up.
    fn mesh(n: usize) -> Snapshot {
        let mut m = MeshBuilder::new();
        m.cluster("c", "net").node("n1", "c", "r/z/s");
        for i in 0..n {
            m.pod(
                &format!("p{i}"),
                "n1",
                &format!("198.18.{}.{}", i / 200, i % 200 + 1),
            );
        }
        m.build()
    }

    #[test]
    fn readers_see_whole_snapshots_while_a_writer_swaps() {
        let store = Arc::new(Store::new(mesh(1)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let snap = store.load();
                        let n = snap.workloads().count();
                        let indexed = snap.workloads_on_node(&"n1".into()).len();
                        assert_eq!(n, indexed, "a reader saw a half-applied snapshot");
                        seen += 1;
                    }
                    seen
                })
            })
            .collect();
        for n in [5, 50, 2, 300, 7] {
            let old = store.publish(mesh(n));
            assert!(old.workloads().count() > 0);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().expect("reader thread") > 0);
        }
        assert_eq!(store.load().workloads().count(), 7);
    }
}
