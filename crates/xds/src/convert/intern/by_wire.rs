//! Maps found by the bytes they were sent as ([`super::Maps::get_wire`]).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use ferry_core::keyed_hash::Keyed;
use hashbrown::HashTable;

/// Maps by the bytes they were sent as: each held with its bytes in one buffer (each entry's
/// length, then its bytes) and their hash. A lookup hashes the entries as they came, without
/// copying them, and compares them with that one buffer: one read of memory fewer than a key
/// of one vector per entry (the list, then each entry), on tables of 66,000 maps where each
/// read is a cache miss.
#[derive(Clone, Debug)]
pub(super) struct ByWire<M> {
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
    pub(super) fn hash(&self, entries: &[Vec<u8>]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_usize(entries.len());
        for e in entries {
            h.write_usize(e.len());
            h.write(e);
        }
        h.finish()
    }

    pub(super) fn get(&self, hash: u64, entries: &[Vec<u8>]) -> Option<&Arc<M>> {
        self.table
            .find(hash, |w| w.hash == hash && same(&w.bytes, entries))
            .map(|w| &w.map)
    }

    pub(super) fn insert(&mut self, hash: u64, entries: &[Vec<u8>], map: Arc<M>) {
        let mut bytes = Vec::with_capacity(entries.iter().map(|e| LEN + e.len()).sum());
        for e in entries {
            bytes.extend_from_slice(&(e.len() as u64).to_le_bytes());
            bytes.extend_from_slice(e);
        }
        let bytes = bytes.into_boxed_slice();
        self.table
            .insert_unique(hash, Wire { hash, bytes, map }, |w| w.hash);
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn clear(&mut self) {
        self.table.clear();
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Arc<M>) -> bool) {
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
