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
    /// What was written since tracking (re)started, for entry deltas of incremental
    /// checkpoints; `None`: not tracked (everything counts as changed).
    changes: Option<Box<ChangeSet<K>>>,
}

/// The entries of a map written since [`KeyMap::track_changes`]: a bitmap over the table's
/// buckets (a write marks its entry's bucket) and the keys removed. Bucket indices stay valid
/// as long as the table keeps its layout, which only an insertion that grows or rehashes the
/// table changes; before such an insertion the marked keys are found again in the new
/// layout ([`KeyMap::grow_keeping_marks`]).
#[derive(Clone)]
pub struct ChangeSet<K> {
    buckets: Vec<u64>,
    marked: usize,
    /// The table's layout changed: every entry counts as changed.
    everything: bool,
    removed: Vec<K>,
}

impl<K> ChangeSet<K> {
    fn new(buckets: usize) -> ChangeSet<K> {
        ChangeSet { buckets: vec![0; buckets.div_ceil(64)], marked: 0, everything: false, removed: Vec::new() }
    }

    #[inline]
    fn mark(&mut self, bucket: usize) {
        if let Some(word) = self.buckets.get_mut(bucket / 64) {
            let bit = 1u64 << (bucket % 64);
            if *word & bit == 0 {
                *word |= bit;
                self.marked += 1;
            }
        } else {
            self.everything = true;
        }
    }

    /// A bucket emptied: what lands in it next is marked only if written.
    #[inline]
    fn unmark(&mut self, bucket: usize) {
        if let Some(word) = self.buckets.get_mut(bucket / 64) {
            let bit = 1u64 << (bucket % 64);
            if *word & bit != 0 {
                *word &= !bit;
                self.marked -= 1;
            }
        }
    }

    /// The buckets written, ascending.
    fn marked_buckets(&self) -> impl Iterator<Item = usize> + '_ {
        self.buckets.iter().enumerate().flat_map(|(word_index, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(word_index * 64 + bit)
            })
        })
    }
}

impl<K, C> Default for KeyMap<K, C> {
    fn default() -> Self {
        KeyMap { table: HashTable::new(), tombstones: None, changes: None }
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
        KeyMap { table: HashTable::new(), tombstones: Some(Box::default()), changes: None }
    }

    /// Starts (or restarts) recording what is written: [`Self::changed`] then names every
    /// entry written and key removed from now on.
    pub fn track_changes(&mut self) {
        self.changes = Some(Box::new(ChangeSet::new(self.table.num_buckets())));
    }

    /// Stops recording what is written.
    pub fn untrack_changes(&mut self) {
        self.changes = None;
    }

    /// The entries written and the keys removed since [`Self::track_changes`] (the current
    /// entries and cells of the keys written, in bucket order; a key removed and added again
    /// is in both), or `None` when that is not known (not tracked, or the table was
    /// reorganized since).
    pub fn changed(&self) -> Option<(impl Iterator<Item = (&K, &C)>, &[K])> {
        let changes = self.changes.as_ref().filter(|c| !c.everything)?;
        let written = changes.marked_buckets().filter_map(|bucket| self.table.get_bucket(bucket)).map(|(k, c)| (k, c));
        Some((written, changes.removed.as_slice()))
    }

    /// How many entries [`Self::changed`] names, at most (written buckets plus removed keys);
    /// `None` when it is not known.
    pub fn changed_count(&self) -> Option<usize> {
        let changes = self.changes.as_ref().filter(|c| !c.everything)?;
        Some(changes.marked + changes.removed.len())
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
        KeyMap { table: HashTable::with_capacity(capacity), tombstones: None, changes: None }
    }

    /// Before an insertion: when the table is full it grows or rehashes, moving entries to
    /// other buckets; a tracked map then grows first and marks its written keys again.
    #[inline]
    fn before_insert(&mut self) {
        if self.changes.is_some() && self.table.len() == self.table.capacity() {
            self.grow_keeping_marks();
        }
    }

    /// Grows the full table of a tracked map and marks the buckets its written keys moved to
    /// (a cost in proportion to the growth's own: the `fjall` backend's cache maps grow with
    /// every load, and marking everything changed then would make every delta whole).
    #[cold]
    fn grow_keeping_marks(&mut self) {
        let Some(changes) = &mut self.changes else { return };
        if changes.everything {
            self.table.reserve(1, rehash::<K, C>);
            return;
        }
        let written: Vec<(u64, K)> = changes
            .marked_buckets()
            .filter_map(|bucket| self.table.get_bucket(bucket))
            .map(|(key, _)| (memory_hash(key.stable_hash()), key.clone()))
            .collect();
        self.table.reserve(1, rehash::<K, C>);
        let mut moved = ChangeSet::new(self.table.num_buckets());
        moved.removed = std::mem::take(&mut changes.removed);
        for (hash, key) in &written {
            match self.table.find_bucket_index(*hash, |(k, _)| k == key) {
                Some(bucket) => moved.mark(bucket),
                None => moved.everything = true,
            }
        }
        **changes = moved;
    }

    /// Starts loading into the cache the entry that `hash` most likely names, without
    /// waiting for it: a keyed operator calls it for a record a few ahead of the one it
    /// processes, so the probe's cache miss overlaps with the work before it. Reads only the
    /// table's control bytes; a wrong guess costs one wasted cache line.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if let Some(entry) = self.table.iter_hash(hash).next() {
            prefetch_line(entry);
        }
    }

    /// The cell of `key` (whose memory hash is `hash`).
    #[inline]
    pub fn get(&self, hash: u64, key: &K) -> Option<&C> {
        self.table.find(hash, |(k, _)| k == key).map(|(_, cell)| cell)
    }

    /// The cell of `key`, mutable.
    #[inline]
    pub fn get_mut(&mut self, hash: u64, key: &K) -> Option<&mut C> {
        let Some(changes) = &mut self.changes else {
            return self.table.find_mut(hash, |(k, _)| k == key).map(|(_, cell)| cell);
        };
        let bucket = self.table.find_bucket_index(hash, |(k, _)| k == key)?;
        changes.mark(bucket);
        self.table.get_bucket_mut(bucket).map(|(_, cell)| cell)
    }

    /// The cell of `key`, inserting `init()` first (the key is cloned only then).
    #[inline]
    pub fn get_or_insert_with(&mut self, hash: u64, key: &K, init: impl FnOnce() -> C) -> &mut C {
        self.before_insert();
        let entry = match self.table.entry(hash, |(k, _)| k == key, rehash::<K, C>) {
            Entry::Occupied(entry) => entry,
            Entry::Vacant(entry) => entry.insert((key.clone(), init())),
        };
        if let Some(changes) = &mut self.changes {
            changes.mark(entry.bucket_index());
        }
        &mut entry.into_mut().1
    }

    /// Sets the cell of `key`.
    #[inline]
    pub fn insert(&mut self, hash: u64, key: &K, cell: C) {
        self.before_insert();
        let entry = match self.table.entry(hash, |(k, _)| k == key, rehash::<K, C>) {
            Entry::Occupied(mut entry) => {
                entry.get_mut().1 = cell;
                entry
            }
            Entry::Vacant(entry) => entry.insert((key.clone(), cell)),
        };
        if let Some(changes) = &mut self.changes {
            changes.mark(entry.bucket_index());
        }
    }

    /// Sets the cell of `key` as it already is elsewhere (the `fjall` backend's read from
    /// its store into the cache): not a change.
    #[inline]
    pub fn insert_unchanged(&mut self, hash: u64, key: &K, cell: C) {
        self.before_insert();
        match self.table.entry(hash, |(k, _)| k == key, rehash::<K, C>) {
            Entry::Occupied(mut entry) => entry.get_mut().1 = cell,
            Entry::Vacant(entry) => {
                entry.insert((key.clone(), cell));
            }
        }
    }

    /// Sets the cell of an owned key, computing its hash (restores).
    pub fn insert_owned(&mut self, key: K, cell: C) {
        // Restores build untracked maps; a tracked one stops telling its changes apart.
        if let Some(changes) = &mut self.changes {
            changes.everything = true;
        }
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
                let bucket = entry.bucket_index();
                let ((removed_key, cell), _) = entry.remove();
                if let Some(changes) = &mut self.changes {
                    changes.unmark(bucket);
                    changes.removed.push(removed_key.clone());
                }
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

/// A hint to the CPU to load the cache line at `value` (no effect where there is no
/// prefetch instruction).
#[inline(always)]
fn prefetch_line<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, and `value` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
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

        /// Through growth: a tracked map names exactly the keys written since tracking
        /// started (and still there), and every key removed; reads from elsewhere
        /// ([`KeyMap::insert_unchanged`]) are not changes.
        #[test]
        fn tracked_changes_survive_growth(
            before in proptest::collection::vec(0u64..300, 0..200),
            ops in proptest::collection::vec((0u8..3, 0u64..300), 0..600),
        ) {
            let mut map: KeyMap<u64, u32> = KeyMap::default();
            for key in &before {
                map.insert(memory_hash(key.stable_hash()), key, 0);
            }
            map.track_changes();
            let mut written = std::collections::BTreeSet::new();
            let mut removed = std::collections::BTreeSet::new();
            for (op, key) in ops {
                let hash = memory_hash(key.stable_hash());
                match op {
                    0 => { map.insert(hash, &key, 1); written.insert(key); }
                    1 => if map.remove(hash, &key).is_some() { written.remove(&key); removed.insert(key); },
                    _ => if map.get(hash, &key).is_none() { map.insert_unchanged(hash, &key, 2); },
                }
            }
            let (named, named_removed) = map.changed().expect("tracked, never reorganized without its marks");
            let named: std::collections::BTreeSet<u64> = named.map(|(k, _)| *k).collect();
            prop_assert_eq!(named, written);
            let named_removed: std::collections::BTreeSet<u64> = named_removed.iter().copied().collect();
            prop_assert_eq!(named_removed, removed);
        }
    }
}
