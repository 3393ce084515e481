//! The hasher of the snapshot's maps: foldhash, several times faster than std's SipHash on the
//! short keys these maps hold (uids, names, network addresses), keyed with secrets drawn from
//! the operating system's randomness (through std's `RandomState`).
//!
//! The keys are not all ours to choose: a pod dials whatever address it likes (`owner` is looked
//! up with it), and names come from objects users create. A keyed hash keeps anyone who does not
//! know the secrets from choosing keys that collide; foldhash's own default seed comes from
//! address-space layout and the clock, so the secrets here come from the OS instead.

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use foldhash::SharedSeed;
use foldhash::fast::{FoldHasher, SeedableRandomState};

/// A persistent hash map hashed with [`Keyed`].
pub(crate) type Map<K, V> = imbl::GenericHashMap<K, V, Keyed, imbl::shared_ptr::DefaultSharedPtr>;

/// A std hash map hashed with [`Keyed`] (the node's xDS client holds its names so).
pub type HashMap<K, V> = std::collections::HashMap<K, V, Keyed>;

/// A std hash set hashed with [`Keyed`].
pub type HashSet<T> = std::collections::HashSet<T, Keyed>;

/// foldhash with a secret per process (the shared seed) and one per map.
#[derive(Clone, Debug)]
pub struct Keyed(SeedableRandomState);

/// 64 bits derived from std's per-process secret SipHash keys, which it reads from the OS once
/// per thread (and steps for each new `RandomState`).
fn os_random() -> u64 {
    RandomState::new().hash_one(0x5eed_u64)
}

impl Default for Keyed {
    fn default() -> Self {
        static SHARED: OnceLock<SharedSeed> = OnceLock::new();
        let shared = SHARED.get_or_init(|| SharedSeed::from_u64(os_random()));
        Self(SeedableRandomState::with_seed(os_random(), shared))
    }
}

impl BuildHasher for Keyed {
    type Hasher = FoldHasher<'static>;

    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_map_hashes_with_its_own_secret() {
        let (a, b) = (Keyed::default(), Keyed::default());
        assert_eq!(a.hash_one("pod-1"), a.hash_one("pod-1"));
        assert_ne!(a.hash_one("pod-1"), b.hash_one("pod-1"));
        // A clone (a snapshot made from another) hashes as the original does.
        assert_eq!(a.clone().hash_one("pod-1"), a.hash_one("pod-1"));
    }
}
