//! The per-key-group map of a state table: one probe per access, keyed by a hash the caller
//! already computed (the key's stable hash, which routing needed anyway).

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use weir_types::Key;

/// Spreads a key's 32-bit stable hash over 64 bits for the in-memory table.
///
/// Needed because every key of one key group has the same stable hash modulo max
/// parallelism: its low bits are nearly constant within a group, and hashbrown indexes
/// buckets by the low bits.
#[inline]
pub fn memory_hash(stable_hash: u32) -> u64 {
    let mixed = u64::from(stable_hash).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed ^ (mixed >> 32)
}

/// A key and its precomputed hashes, located in the subtask's key-group range.
#[derive(Debug)]
pub struct KeyRef<'a, K> {
    /// The key.
    pub key: &'a K,
    /// [`memory_hash`] of the key's stable hash.
    pub hash: u64,
    /// Index of the key's group within the backend's range.
    pub group_index: usize,
}

impl<K> Clone for KeyRef<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for KeyRef<'_, K> {}

/// Entries of one key group.
#[derive(Clone)]
pub struct KeyMap<K, C> {
    table: HashTable<(K, C)>,
    /// Keys removed from the map since tombstones were enabled (the `fjall` backend: a
    /// group whose entries are also in the store must delete them there too).
    tombstones: Option<Box<HashTable<(u64, K)>>>,
}

impl<K, C> Default for KeyMap<K, C> {
    fn default() -> Self {
        KeyMap { table: HashTable::new(), tombstones: None }
    }
}

#[inline]
fn rehash<K: Key, C>(entry: &(K, C)) -> u64 {
    memory_hash(entry.0.stable_hash())
}

impl<K, C> KeyMap<K, C> {
    /// Bytes the map's table holds (its slots and control bytes; not what keys or cells
    /// allocate on the heap themselves).
    pub fn table_bytes(&self) -> usize {
        let capacity = self.table.capacity();
        let entries = if capacity == 0 { 0 } else { capacity * (std::mem::size_of::<(K, C)>() + 1) + 16 };
        let tombstones = self.tombstones.as_ref().map_or(0, |t| t.capacity() * (std::mem::size_of::<(u64, K)>() + 1));
        entries + tombstones
    }

    /// An empty map that records the keys removed from it.
    pub fn with_tombstones() -> KeyMap<K, C> {
        KeyMap { table: HashTable::new(), tombstones: Some(Box::default()) }
    }

    /// The keys removed since the map was made [`Self::with_tombstones`] (and not added
    /// again since, or added again: the map's entries win).
    pub fn tombstones(&self) -> impl Iterator<Item = &K> {
        self.tombstones.iter().flat_map(|t| t.iter().map(|(_, key)| key))
    }
}

impl<K: Key, C> KeyMap<K, C> {
    /// An empty map with room for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> KeyMap<K, C> {
        KeyMap { table: HashTable::with_capacity(capacity), tombstones: None }
    }

    /// The cell of `key` (whose memory hash is `hash`).
    #[inline]
    pub fn get(&self, hash: u64, key: &K) -> Option<&C> {
        self.table.find(hash, |(k, _)| k == key).map(|(_, cell)| cell)
    }

    /// The cell of `key`, mutable.
    #[inline]
    pub fn get_mut(&mut self, hash: u64, key: &K) -> Option<&mut C> {
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, cell)| cell)
    }

    /// The cell of `key`, inserting `init()` first (the key is cloned only then).
    #[inline]
    pub fn get_or_insert_with(&mut self, hash: u64, key: &K, init: impl FnOnce() -> C) -> &mut C {
        match self.table.entry(hash, |(k, _)| k == key, rehash::<K, C>) {
            Entry::Occupied(entry) => &mut entry.into_mut().1,
            Entry::Vacant(entry) => &mut entry.insert((key.clone(), init())).into_mut().1,
        }
    }

    /// Sets the cell of `key`.
    #[inline]
    pub fn insert(&mut self, hash: u64, key: &K, cell: C) {
        match self.table.entry(hash, |(k, _)| k == key, rehash::<K, C>) {
            Entry::Occupied(mut entry) => entry.get_mut().1 = cell,
            Entry::Vacant(entry) => {
                entry.insert((key.clone(), cell));
            }
        }
    }

    /// Sets the cell of an owned key, computing its hash (restores).
    pub fn insert_owned(&mut self, key: K, cell: C) {
        let hash = memory_hash(key.stable_hash());
        match self.table.entry(hash, |(k, _)| *k == key, rehash::<K, C>) {
            Entry::Occupied(mut entry) => entry.get_mut().1 = cell,
            Entry::Vacant(entry) => {
                entry.insert((key, cell));
            }
        }
    }

    /// Removes the cell of `key`.
    #[inline]
    pub fn remove(&mut self, hash: u64, key: &K) -> Option<C> {
        match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(entry) => {
                let ((removed_key, cell), _) = entry.remove();
                if let Some(tombstones) = &mut self.tombstones {
                    Self::add_tombstone(tombstones, hash, removed_key);
                }
                Some(cell)
            }
            Err(_) => None,
        }
    }

    #[cold]
    fn add_tombstone(tombstones: &mut HashTable<(u64, K)>, hash: u64, key: K) {
        if tombstones.find(hash, |(_, k)| *k == key).is_none() {
            tombstones.insert_unique(hash, (hash, key), |(h, _)| *h);
        }
    }

    /// True when `key` was removed from the map since tombstones were enabled.
    #[inline]
    pub fn is_tombstoned(&self, hash: u64, key: &K) -> bool {
        self.tombstones.as_ref().is_some_and(|t| t.find(hash, |(_, k)| k == key).is_some())
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &C)> {
        self.table.iter().map(|(k, c)| (k, c))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((0u8..4, 0u64..50, any::<u32>()), 0..400)) {
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut map: KeyMap<u64, u32> = KeyMap::default();
            for (op, key, value) in ops {
                let hash = memory_hash(key.stable_hash());
                match op {
                    0 => { map.insert(hash, &key, value); model.insert(key, value); }
                    1 => { prop_assert_eq!(map.remove(hash, &key), model.remove(&key)); }
                    2 => { *map.get_or_insert_with(hash, &key, || value) += 0; model.entry(key).or_insert(value); }
                    _ => { prop_assert_eq!(map.get(hash, &key), model.get(&key)); }
                }
                prop_assert_eq!(map.len(), model.len());
            }
        }
    }
}
