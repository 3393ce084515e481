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
    use std::sync::atomic::{AtomicUsize, Ordering};

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
        let done = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (store, done) = (store.clone(), done.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let snap = store.load();
                        let n = snap.workloads().count();
                        let indexed = snap.workloads_on_node(&"n1".into()).len();
                        assert_eq!(n, indexed, "a reader saw a half-applied snapshot");
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        // Swap for as long as the readers read, so they overlap with the swaps.
        let sizes = [5, 50, 2, 300, 7];
        let mut i = 0;
        while done.load(Ordering::SeqCst) < 2 {
            store.publish(mesh(sizes[i % sizes.len()]));
            i += 1;
        }
        for r in readers {
            r.join().expect("reader thread");
        }
        let last = if i == 0 {
            1
        } else {
            sizes[(i - 1) % sizes.len()]
        };
        assert_eq!(
            store.load().workloads().count(),
            last,
            "the last publish wins"
        );
    }
}
