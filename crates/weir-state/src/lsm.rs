//! The `fjall` state backend: every entry of keyed state in a local LSM store
//! ([fjall](https://github.com/fjall-rs/fjall), pure Rust), one store entry per key, as
//! Flink's RocksDB backend keeps it; the entries in use are cached in the same per-key-group
//! hash maps the heap backend uses, so state handles work unchanged.
//!
//! - **Store keys** are `[table: u16 BE][key group: u16 BE][the key's canonical bytes]`, so one
//!   key group of one state is one contiguous range of the store, in key-byte order: a key
//!   group is read out of the store already in the canonical snapshot order, and moves on a
//!   rescale as one range.
//! - **The cache.** An access loads its key from the store into its key group's map (once; a
//!   key not in the store is not looked up again while it is dirty) and marks it dirty. Every
//!   [`FLUSH_EVERY`] dirty keys, and before a snapshot, one write batch puts every dirty key's
//!   current cell into the store, or deletes it when the function cleared it. Then, while the
//!   cached maps of the process pass `state.backend.fjall.memory`, whole key groups' maps are
//!   dropped: they are clean, the store has them.
//! - **Snapshots.** The synchronous part at a barrier is that write batch and an MVCC
//!   snapshot of the store (a sequence number, no copy); the checkpoint's writer thread reads
//!   each key group's range from it while the task goes on writing. Native and canonical
//!   snapshots are the same bytes.
//! - **Scratch, not state.** The store is not durable across processes: a restart restores
//!   from the checkpoint, as with `hashmap`. It lives in a directory of its own under
//!   `io.tmp.dirs` and is deleted with the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use weir_types::{Key, KeyGroupRange};

use crate::error::StateError;
use crate::handles::StateKind;
use crate::keymap::{KeyMap, KeyRef};
use crate::spill::SpillOptions;
use crate::table::{Cell, StateTable, TableSnapshot, verified_entries, write_varint};

/// Dirty keys of a table between two write batches.
pub const FLUSH_EVERY: usize = 4096;

/// The block cache of a store.
const STORE_CACHE_BYTES: u64 = 32 << 20;
/// Memtables of a store, at most, before they are flushed to disk.
const STORE_WRITE_BUFFER_BYTES: u64 = 64 << 20;
/// One memtable.
const STORE_MEMTABLE_BYTES: u32 = 16 << 20;
/// The journal, at most.
const STORE_JOURNAL_BYTES: u64 = 128 << 20;

/// The estimated bytes of cached entries of every `fjall` backend of the process: the budget
/// is for the process, as a TaskManager's managed memory is.
static CACHED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The estimated bytes of cached entries of all `fjall` backends of this process.
pub fn cached_bytes() -> usize {
    CACHED_BYTES.load(Ordering::Relaxed)
}

fn recount(counted: &mut usize, now: usize) {
    if now >= *counted {
        CACHED_BYTES.fetch_add(now - *counted, Ordering::Relaxed);
    } else {
        let gone = *counted - now;
        let _ = CACHED_BYTES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |all| Some(all.saturating_sub(gone)));
    }
    *counted = now;
}

fn store_error(dir: &Path, what: &str, error: impl std::fmt::Display) -> StateError {
    StateError::Spill {
        reason: format!(
            "{what} in the state store {} (state.backend.type: fjall): {error}; check that io.tmp.dirs names a writable local directory with free space",
            dir.display()
        ),
    }
}

/// One keyed backend's store: the entries of all its states.
pub struct LsmStore {
    keyspace: fjall::Keyspace,
    entries: fjall::PartitionHandle,
    dir: PathBuf,
    /// Keys read from the store on a cache miss, and entries written or deleted there.
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    /// Dirty keys of a table between two write batches.
    flush_every: usize,
    /// The options it was made with.
    pub options: SpillOptions,
}

impl std::fmt::Debug for LsmStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LsmStore").field("dir", &self.dir).finish()
    }
}

impl LsmStore {
    /// Opens a fresh store in a new directory under `options.dir`.
    /// Tables write their dirty keys every `flush_every` ([`FLUSH_EVERY`]) of them.
    pub fn open(options: SpillOptions, flush_every: usize) -> Result<Arc<LsmStore>, StateError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!("weir-fjall-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let dir = options.dir.join(name);
        let keyspace = fjall::Config::new(&dir)
            // Scratch data: a restart restores from the checkpoint, so no journal syncing.
            .manual_journal_persist(true)
            .temporary(true)
            .cache_size(STORE_CACHE_BYTES)
            .max_write_buffer_size(STORE_WRITE_BUFFER_BYTES)
            .max_journaling_size(STORE_JOURNAL_BYTES)
            .open()
            .map_err(|e| store_error(&dir, "cannot open", e))?;
        let entries = keyspace
            .open_partition(
                "entries",
                fjall::PartitionCreateOptions::default()
                    .manual_journal_persist(true)
                    .max_memtable_size(STORE_MEMTABLE_BYTES),
            )
            .map_err(|e| store_error(&dir, "cannot open the entry partition", e))?;
        Ok(Arc::new(LsmStore {
            keyspace,
            entries,
            dir,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flush_every: flush_every.max(1),
            options,
        }))
    }

    /// Bytes the store holds on disk.
    pub fn disk_space(&self) -> u64 {
        self.keyspace.disk_space()
    }

    /// Store reads on cache misses and entries written, so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.reads.load(Ordering::Relaxed), self.writes.load(Ordering::Relaxed))
    }
}

impl Drop for LsmStore {
    fn drop(&mut self) {
        // `temporary` removes the directory when the keyspace goes; make sure of it.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first bytes of every store key of one key group of one table.
fn group_prefix(table_id: u16, key_group: u32) -> [u8; 4] {
    let [a, b] = table_id.to_be_bytes();
    // Key groups are below the max parallelism, at most 32768.
    let [c, d] = (key_group as u16).to_be_bytes();
    [a, b, c, d]
}

/// A key accessed since the last write batch.
struct Dirty<K> {
    group_index: u32,
    key: K,
    hash: u64,
    /// The key had an entry (in the store or the cache) before its first access.
    existed: bool,
}

/// One state's entries in an [`LsmStore`], the hot ones cached per key group.
pub struct LsmTable<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    store: Arc<LsmStore>,
    table_id: u16,
    /// Cached entries per key group: every dirty key's truth, and clean copies of others.
    cache: Vec<KeyMap<K, C>>,
    /// Entries per key group in the store as of the last write batch.
    entries: Vec<u64>,
    /// Per key group, the newest snapshot taken before its last access (see
    /// [`TableSnapshot::written_after`]).
    written_after: Vec<u64>,
    dirty: HashTable<Dirty<K>>,
    last_snapshot_id: std::cell::Cell<u64>,
    /// This table's share of [`CACHED_BYTES`], as last counted.
    counted: usize,
    evict_cursor: usize,
}

impl<K: Key, C: Cell> LsmTable<K, C> {
    /// An empty table with id `table_id` in `store`.
    pub fn new(name: &str, kind: StateKind, range: KeyGroupRange, store: Arc<LsmStore>, table_id: u16) -> Self {
        let groups = range.len() as usize;
        LsmTable {
            name: name.to_string(),
            kind,
            range,
            store,
            table_id,
            cache: (0..groups).map(|_| KeyMap::default()).collect(),
            entries: vec![0; groups],
            written_after: vec![0; groups],
            dirty: HashTable::new(),
            last_snapshot_id: std::cell::Cell::new(0),
            counted: 0,
            evict_cursor: 0,
        }
    }

    fn corrupt(&self, key_group: u32, reason: String) -> StateError {
        StateError::Corrupt { name: self.name.clone(), key_group, reason }
    }

    fn store_key(&self, group_index: usize, key: &K) -> Result<Vec<u8>, StateError> {
        let key_group = self.range.start + group_index as u32;
        let mut bytes = Vec::with_capacity(24);
        bytes.extend_from_slice(&group_prefix(self.table_id, key_group));
        postcard::to_extend(key, bytes).map_err(|e| self.corrupt(key_group, format!("cannot encode a key: {e}")))
    }

    /// The cached map of `key`'s group, with `key`'s entry loaded into it if the store has
    /// one; the key is dirty from now until the next write batch.
    #[inline]
    pub fn access(&mut self, key: KeyRef<'_, K>) -> Result<&mut KeyMap<K, C>, StateError> {
        if self.dirty.len() >= self.store.flush_every {
            self.flush()?;
            self.enforce_budget();
        }
        let index = key.group_index;
        self.written_after[index] = self.last_snapshot_id.get();
        let found = self.dirty.find(key.hash, |d| d.group_index == index as u32 && d.key == *key.key).is_some();
        if !found {
            let existed = if self.cache[index].get(key.hash, key.key).is_some() { true } else { self.load(key)? };
            let entry = self.dirty.entry(key.hash, |d| d.group_index == index as u32 && d.key == *key.key, |d| d.hash);
            if let Entry::Vacant(vacant) = entry {
                vacant.insert(Dirty { group_index: index as u32, key: key.key.clone(), hash: key.hash, existed });
            }
        }
        Ok(&mut self.cache[index])
    }

    /// Reads `key` from the store into the cache; false when the store has no entry.
    #[cold]
    fn load(&mut self, key: KeyRef<'_, K>) -> Result<bool, StateError> {
        let store_key = self.store_key(key.group_index, key.key)?;
        let value = self.store.entries.get(&store_key).map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
        self.store.reads.fetch_add(1, Ordering::Relaxed);
        let Some(bytes) = value else { return Ok(false) };
        let key_group = self.range.start + key.group_index as u32;
        let cell = C::decode(&bytes).map_err(|e| self.corrupt(key_group, format!("cannot decode a value: {e}")))?;
        self.cache[key.group_index].insert(key.hash, key.key, cell);
        Ok(true)
    }

    /// Writes every dirty key's cell to the store (or deletes it) in one batch.
    pub fn flush(&mut self) -> Result<(), StateError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let mut batch = self.store.keyspace.batch().durability(None);
        let mut written = 0u64;
        let dirty = std::mem::take(&mut self.dirty);
        for d in dirty {
            let index = d.group_index as usize;
            let store_key = self.store_key(index, &d.key)?;
            match self.cache[index].get(d.hash, &d.key) {
                Some(cell) => {
                    let mut value = Vec::with_capacity(16);
                    cell.encode(&mut value).map_err(|e| {
                        self.corrupt(self.range.start + d.group_index, format!("cannot encode a value: {e}"))
                    })?;
                    batch.insert(&self.store.entries, store_key, value);
                    if !d.existed {
                        self.entries[index] += 1;
                    }
                    written += 1;
                }
                None if d.existed => {
                    batch.remove(&self.store.entries, store_key);
                    self.entries[index] = self.entries[index].saturating_sub(1);
                    written += 1;
                }
                None => {}
            }
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write", e))?;
        self.store.writes.fetch_add(written, Ordering::Relaxed);
        Ok(())
    }

    /// Counts the cache into the process's estimate and, while that is over the budget,
    /// drops whole key groups' maps (down to 90 % of it). Only right after a flush: every
    /// cached entry is then in the store.
    fn enforce_budget(&mut self) {
        let now: usize = self.cache.iter().map(KeyMap::table_bytes).sum();
        recount(&mut self.counted, now);
        let budget = self.store.options.memory_budget;
        let total = cached_bytes();
        if total <= budget {
            return;
        }
        let mut to_free = (total - budget * 9 / 10).min(self.counted);
        let groups = self.cache.len();
        let mut freed = 0;
        for _ in 0..groups {
            if to_free == 0 {
                break;
            }
            let index = self.evict_cursor % groups;
            self.evict_cursor = (index + 1) % groups;
            let bytes = self.cache[index].table_bytes();
            if bytes == 0 {
                continue;
            }
            self.cache[index] = KeyMap::default();
            freed += bytes;
            to_free = to_free.saturating_sub(bytes);
        }
        let now = self.counted.saturating_sub(freed);
        recount(&mut self.counted, now);
    }

    /// Replaces one key group's entries with the canonical `bytes` of a snapshot, after the
    /// same checks as the heap backend's restore (every key in `key_group` under
    /// `max_parallelism`, `expected_entries` of them when recorded, every key and cell
    /// decodes).
    pub fn restore_key_group(
        &mut self,
        key_group: u32,
        bytes: &[u8],
        max_parallelism: u32,
        expected_entries: u64,
    ) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        let entries = verified_entries(bytes, &self.name, key_group, max_parallelism, expected_entries)?;
        self.clear_group(index)?;
        let mut batch = self.store.keyspace.batch().durability(None);
        let prefix = group_prefix(self.table_id, key_group);
        for (key_bytes, cell_bytes) in &entries {
            postcard::from_bytes::<K>(key_bytes)
                .map_err(|e| self.corrupt(key_group, format!("cannot decode a key: {e}")))?;
            C::decode(cell_bytes).map_err(|e| self.corrupt(key_group, format!("cannot decode a value: {e}")))?;
            let mut store_key = Vec::with_capacity(prefix.len() + key_bytes.len());
            store_key.extend_from_slice(&prefix);
            store_key.extend_from_slice(key_bytes);
            batch.insert(&self.store.entries, store_key, *cell_bytes);
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write restored state", e))?;
        self.entries[index] = entries.len() as u64;
        self.store.writes.fetch_add(entries.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Removes every entry of one key group, cached, dirty and stored.
    fn clear_group(&mut self, index: usize) -> Result<(), StateError> {
        self.flush()?;
        self.cache[index] = KeyMap::default();
        let prefix = group_prefix(self.table_id, self.range.start + index as u32);
        let mut batch = self.store.keyspace.batch().durability(None);
        for item in self.store.entries.prefix(prefix) {
            let (key, _) = item.map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
            batch.remove(&self.store.entries, key);
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write", e))?;
        self.entries[index] = 0;
        Ok(())
    }

    /// Calls `f` for every entry of the table, in key-group and key-byte order.
    pub fn for_each(&mut self, mut f: impl FnMut(&K, &C)) -> Result<(), StateError> {
        self.flush()?;
        for index in 0..self.cache.len() {
            let key_group = self.range.start + index as u32;
            for item in self.store.entries.prefix(group_prefix(self.table_id, key_group)) {
                let (store_key, value) = item.map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
                let key: K = postcard::from_bytes(&store_key[4..])
                    .map_err(|e| self.corrupt(key_group, format!("cannot decode a key: {e}")))?;
                let cell =
                    C::decode(&value).map_err(|e| self.corrupt(key_group, format!("cannot decode a value: {e}")))?;
                f(&key, &cell);
            }
        }
        Ok(())
    }

    fn index_of(&self, key_group: u32) -> Result<usize, StateError> {
        if !self.range.contains(key_group) {
            return Err(StateError::KeyGroupOutOfRange { key_group, range: self.range.to_string() });
        }
        Ok((key_group - self.range.start) as usize)
    }

    /// One key group's entries as key and cell bytes, store and dirty cache merged, sorted by
    /// key bytes.
    fn merged_group(&self, index: usize) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>, StateError> {
        let key_group = self.range.start + index as u32;
        let mut merged = std::collections::BTreeMap::new();
        for item in self.store.entries.prefix(group_prefix(self.table_id, key_group)) {
            let (store_key, value) = item.map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
            merged.insert(store_key[4..].to_vec(), value.to_vec());
        }
        for d in self.dirty.iter().filter(|d| d.group_index as usize == index) {
            let key_bytes = self.store_key(index, &d.key)?[4..].to_vec();
            match self.cache[index].get(d.hash, &d.key) {
                Some(cell) => {
                    let mut value = Vec::new();
                    cell.encode(&mut value)
                        .map_err(|e| self.corrupt(key_group, format!("cannot encode a value: {e}")))?;
                    merged.insert(key_bytes, value);
                }
                None => {
                    merged.remove(&key_bytes);
                }
            }
        }
        Ok(merged)
    }
}

impl<K, C> Drop for LsmTable<K, C> {
    fn drop(&mut self) {
        recount(&mut self.counted, 0);
    }
}

impl<K: Key, C: Cell> StateTable<K> for LsmTable<K, C> {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> StateKind {
        self.kind
    }

    fn cell_type(&self) -> &'static str {
        std::any::type_name::<C>()
    }

    fn entry_count(&self) -> usize {
        let stored: u64 = self.entries.iter().sum();
        let mut count = stored as i64;
        for d in self.dirty.iter() {
            let now = self.cache[d.group_index as usize].get(d.hash, &d.key).is_some();
            count += i64::from(now) - i64::from(d.existed);
        }
        count.max(0) as usize
    }

    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let merged = self.merged_group(self.index_of(key_group)?)?;
        write_varint(out, merged.len() as u64);
        for (key, value) in merged {
            write_varint(out, key.len() as u64);
            out.extend_from_slice(&key);
            write_varint(out, value.len() as u64);
            out.extend_from_slice(&value);
        }
        Ok(())
    }

    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError> {
        // Unchecked ownership, as the heap table's `read_key_group`: any max parallelism whose
        // key group this is; every key's group is `key_group` by the caller's word.
        let index = self.index_of(key_group)?;
        let entries: Vec<(&[u8], &[u8])> =
            postcard::from_bytes(bytes).map_err(|e| self.corrupt(key_group, format!("cannot decode entries: {e}")))?;
        self.clear_group(index)?;
        let prefix = group_prefix(self.table_id, key_group);
        let mut batch = self.store.keyspace.batch().durability(None);
        for (key_bytes, cell_bytes) in &entries {
            C::decode(cell_bytes).map_err(|e| self.corrupt(key_group, format!("cannot decode a value: {e}")))?;
            let mut store_key = prefix.to_vec();
            store_key.extend_from_slice(key_bytes);
            batch.insert(&self.store.entries, store_key, *cell_bytes);
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write", e))?;
        self.entries[index] = entries.len() as u64;
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn prepare_snapshot(&mut self) -> Result<(), StateError> {
        self.flush()
    }

    fn snapshot(&self, _native: bool, checkpoint_id: u64) -> Box<dyn TableSnapshot> {
        // `prepare_snapshot` wrote every dirty key: the store is the whole table.
        self.last_snapshot_id.set(checkpoint_id);
        Box::new(LsmSnapshot {
            name: self.name.clone(),
            kind: self.kind,
            cell_type: std::any::type_name::<C>(),
            range: self.range,
            table_id: self.table_id,
            snapshot: self.store.entries.snapshot(),
            dir: self.store.dir.clone(),
            entries: self.entries.clone(),
            written_after: self.written_after.clone(),
        })
    }
}

/// A table as it was at a barrier: an MVCC snapshot of the store, read by the writer.
struct LsmSnapshot {
    name: String,
    kind: StateKind,
    cell_type: &'static str,
    range: KeyGroupRange,
    table_id: u16,
    snapshot: fjall::Snapshot,
    dir: PathBuf,
    entries: Vec<u64>,
    written_after: Vec<u64>,
}

impl LsmSnapshot {
    fn index(&self, key_group: u32) -> Result<usize, StateError> {
        if !self.range.contains(key_group) {
            return Err(StateError::KeyGroupOutOfRange { key_group, range: self.range.to_string() });
        }
        Ok((key_group - self.range.start) as usize)
    }
}

impl TableSnapshot for LsmSnapshot {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> StateKind {
        self.kind
    }
    fn cell_type(&self) -> &str {
        self.cell_type
    }
    fn key_group_entries(&self, key_group: u32) -> u64 {
        self.index(key_group).map_or(0, |index| self.entries[index])
    }
    fn written_after(&self, key_group: u32) -> u64 {
        self.index(key_group).map_or(u64::MAX, |index| self.written_after[index])
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        // The store's order is key-byte order: the canonical form, streamed as read.
        let expected = self.entries[self.index(key_group)?];
        write_varint(out, expected);
        let mut count = 0u64;
        for item in self.snapshot.prefix(group_prefix(self.table_id, key_group)) {
            let (store_key, value) = item.map_err(|e| store_error(&self.dir, "cannot read a snapshot", e))?;
            let key = &store_key[4..];
            write_varint(out, key.len() as u64);
            out.extend_from_slice(key);
            write_varint(out, value.len() as u64);
            out.extend_from_slice(&value);
            count += 1;
        }
        if count != expected {
            return Err(StateError::Corrupt {
                name: self.name.clone(),
                key_group,
                reason: format!("the state store holds {count} entries where {expected} were counted"),
            });
        }
        Ok(())
    }
}
