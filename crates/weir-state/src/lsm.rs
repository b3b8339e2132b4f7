//! The `fjall` state backend: keyed state in a local LSM store
//! ([fjall](https://github.com/fjall-rs/fjall), pure Rust), one store entry per key, as
//! Flink's RocksDB backend keeps it, with the same per-key-group hash maps the heap backend
//! uses as a write-back cache in front, so state handles work unchanged.
//!
//! - **Store keys** are `[table: u16 BE][key group: u16 BE][the key's canonical bytes]`, so one
//!   key group of one state is one contiguous range of the store, in key-byte order: a key
//!   group is read out of the store already in the canonical snapshot order, and moves on a
//!   rescale as one range.
//! - **Where a key group is** ([`Residence`]): a group starts in memory, in its map alone,
//!   exactly as in the heap backend. While the maps of the process pass
//!   `state.backend.fjall.memory`, whole groups are written to the store (their entries, and
//!   deletes for the keys removed since the last write, which the map records as tombstones)
//!   and their maps dropped. From then on the store holds the group; an access to a key that
//!   is neither in the map nor removed reads it from the store into the map, where it stays
//!   until the group is written out again.
//! - **Snapshots.** The synchronous part at a barrier shares every group's map (an `Arc`;
//!   the next write to a shared map copies it, so the copies are bounded by the cache's
//!   budget) and takes an MVCC snapshot of the store (a sequence number, no copy). The
//!   checkpoint's writer thread then writes each group: a group in memory from its map, a
//!   stored group by merging its map and tombstones over the store's range. Either way in
//!   key-byte order, so native and canonical snapshots are the same bytes.
//! - **Scratch, not state.** The store is not durable across processes: a restart restores
//!   from the checkpoint, as with `hashmap`. It lives in a directory of its own under
//!   `io.tmp.dirs` and is deleted with the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use weir_types::{Key, KeyGroupRange};

use crate::delta::{ChangeLog, write_delta};
use crate::error::StateError;
use crate::handles::StateKind;
use crate::keymap::{KeyMap, KeyRef, memory_hash};
use crate::scratch;
use crate::spill::SpillOptions;
use crate::table::{Cell, StateTable, TableSnapshot, group_index, lock, verified_entries, write_group, write_varint};

/// State accesses between two looks at the memory budget.
pub const BUDGET_CHECK_EVERY: usize = 4096;

/// The block cache of a store.
const STORE_CACHE_BYTES: u64 = 32 << 20;
/// Memtables of a store, at most, before they are flushed to disk.
const STORE_WRITE_BUFFER_BYTES: u64 = 64 << 20;
/// One memtable.
const STORE_MEMTABLE_BYTES: u32 = 16 << 20;
/// A data block. Point reads decode a whole block, and small blocks made the counter with
/// 10 M keys and a cache of a third of them 20 % faster than fjall's default of 4 KiB.
const STORE_BLOCK_BYTES: u32 = 1024;
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
    /// Its directory, marked in use while the store is open (after `keyspace`, so it
    /// goes once the store closed).
    dir: scratch::ScratchDir,
    /// Keys read from the store on a cache miss, and entries written or deleted there.
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    /// State accesses of a table between two looks at the memory budget.
    check_every: usize,
    /// The options it was made with.
    pub options: SpillOptions,
}

impl std::fmt::Debug for LsmStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LsmStore").field("dir", &self.dir.display()).finish()
    }
}

/// The name of every store's directory starts with this.
pub(crate) const STORE_PREFIX: &str = "weir-fjall";

impl LsmStore {
    /// Opens a fresh store in a new directory under `options.dir`.
    /// Tables look at the memory budget every `check_every` ([`BUDGET_CHECK_EVERY`]) accesses.
    pub fn open(options: SpillOptions, check_every: usize) -> Result<Arc<LsmStore>, StateError> {
        // Also removes the stores a killed process left under the same directory.
        let dir = scratch::claim(&options.dir, STORE_PREFIX)
            .map_err(|e| store_error(&options.dir, "cannot create a store directory", e))?;
        let keyspace = fjall::Config::new(&*dir)
            // Scratch data: a restart restores from the checkpoint, so no journal syncing.
            .manual_journal_persist(true)
            // fjall deletes the directory when the last handle goes (removing it ourselves
            // first made fjall print "Failed to clean up path").
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
                    .max_memtable_size(STORE_MEMTABLE_BYTES)
                    .block_size(STORE_BLOCK_BYTES),
            )
            .map_err(|e| store_error(&dir, "cannot open the entry partition", e))?;
        Ok(Arc::new(LsmStore {
            keyspace,
            entries,
            dir,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            check_every: check_every.max(1),
            options,
        }))
    }

    /// Store reads on cache misses and entries written, so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.reads.load(Ordering::Relaxed), self.writes.load(Ordering::Relaxed))
    }
}

/// The first bytes of every store key of one key group of one table.
fn group_prefix(table_id: u16, key_group: u32) -> [u8; 4] {
    let [a, b] = table_id.to_be_bytes();
    // Key groups are below the max parallelism, at most 32768.
    let [c, d] = (key_group as u16).to_be_bytes();
    [a, b, c, d]
}

/// Where a key group's entries are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// In its map alone: the store holds nothing of the group.
    Memory,
    /// In the store as of the group's last write; the map caches some entries, with every
    /// change since (entries, and tombstones for removed keys).
    Stored,
}

struct LsmGroup<K, C> {
    map: Arc<KeyMap<K, C>>,
    /// A snapshot may share `map`: before the next change, serialize the group into it. A
    /// `Cell` because [`StateTable::snapshot`] takes `&self`; the table stays on its
    /// subtask's thread.
    shared: std::cell::Cell<bool>,
    residence: Residence,
    /// The newest snapshot taken before the group's last access.
    written_after: u64,
    /// Entries of the group in the store, as of its last write there.
    stored: u64,
    /// Keys of the cache (entries and tombstones) that were read from the store: the group
    /// holds `stored - from_store + map.len()` entries (a stored key enters the cache only
    /// by a read, once, and stays in it, as an entry or a tombstone, until the next write).
    from_store: u64,
    /// Incremental: what evictions wrote to the store since the first access after the
    /// last snapshot (the map records the changes since); `None`: not known, the group's
    /// next checkpoint block is whole. Moved into the snapshot at the barrier.
    written_out: std::cell::Cell<Option<ChangeLog>>,
}

impl<K: Key, C> LsmGroup<K, C> {
    fn entries(&self) -> u64 {
        (self.stored.saturating_sub(self.from_store)).saturating_add(self.map.len() as u64)
    }
}

/// One state's entries: per key group a map, and the store behind it.
pub struct LsmTable<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    store: Arc<LsmStore>,
    table_id: u16,
    groups: Vec<LsmGroup<K, C>>,
    /// The newest snapshot, while it is being written (see [`Self::before_change`]).
    frozen: std::cell::RefCell<std::sync::Weak<FrozenGroups<K, C>>>,
    last_snapshot_id: std::cell::Cell<u64>,
    /// This table's share of [`CACHED_BYTES`], as last counted.
    counted: usize,
    evict_cursor: usize,
    accesses: usize,
    /// Incremental checkpoints: groups record what changed after each snapshot.
    track_changes: bool,
}

fn corrupt(name: &str, key_group: u32, reason: String) -> StateError {
    StateError::Corrupt { name: name.to_string(), key_group, reason }
}

impl<K: Key, C: Cell> LsmTable<K, C> {
    /// An empty table with id `table_id` in `store`.
    pub fn new(name: &str, kind: StateKind, range: KeyGroupRange, store: Arc<LsmStore>, table_id: u16) -> Self {
        let groups = (0..range.len())
            .map(|_| LsmGroup {
                map: Arc::new(KeyMap::default()),
                shared: std::cell::Cell::new(false),
                residence: Residence::Memory,
                written_after: 0,
                stored: 0,
                from_store: 0,
                written_out: std::cell::Cell::new(None),
            })
            .collect();
        LsmTable {
            name: name.to_string(),
            kind,
            range,
            store,
            table_id,
            groups,
            frozen: std::cell::RefCell::new(std::sync::Weak::new()),
            last_snapshot_id: std::cell::Cell::new(0),
            counted: 0,
            evict_cursor: 0,
            accesses: 0,
            track_changes: false,
        }
    }

    /// Makes every key group record what changes from its first access after each snapshot
    /// on (in its map, and in a [`ChangeLog`] of what evictions wrote to the store), so an
    /// incremental checkpoint can write only that as an entry delta.
    pub fn tracking_changes(mut self, on: bool) -> Self {
        self.track_changes = on;
        self
    }

    fn store_key(&self, key_group: u32, key: &K) -> Result<Vec<u8>, StateError> {
        let mut bytes = Vec::with_capacity(24);
        bytes.extend_from_slice(&group_prefix(self.table_id, key_group));
        postcard::to_extend(key, bytes).map_err(|e| corrupt(&self.name, key_group, format!("cannot encode a key: {e}")))
    }

    /// The map of `key`'s group, with `key`'s entry in it when the group is stored and the
    /// store has one.
    #[inline]
    pub fn access(&mut self, key: KeyRef<'_, K>) -> Result<&mut KeyMap<K, C>, StateError> {
        self.accesses += 1;
        if self.accesses >= self.store.check_every {
            self.accesses = 0;
            self.enforce_budget()?;
        }
        let index = key.group_index;
        let first_after_snapshot = self.groups[index].shared.get();
        if first_after_snapshot {
            self.before_change(index);
        }
        let needs_load = {
            let group = &self.groups[index];
            group.residence == Residence::Stored
                && group.map.get(key.hash, key.key).is_none()
                && !group.map.is_tombstoned(key.hash, key.key)
        };
        if needs_load {
            self.load(key)?;
        }
        let group = &mut self.groups[index];
        group.written_after = self.last_snapshot_id.get();
        // Copies the map only while a snapshot still holds it.
        let map = Arc::make_mut(&mut group.map);
        if first_after_snapshot {
            // What changes from now on is what changed since the snapshot `written_after`
            // names: nothing changed since it was taken.
            if self.track_changes {
                map.track_changes();
                group.written_out.set(Some(ChangeLog::default()));
            } else {
                map.untrack_changes();
            }
        }
        Ok(map)
    }

    /// The first change to a group after a snapshot shared it: if the snapshot has not
    /// written the group yet, serialize it into the snapshot now (its entries and
    /// tombstones, a fraction of the map's memory) and let the snapshot's reference go, so
    /// the map is changed in place rather than copied.
    #[cold]
    fn before_change(&mut self, index: usize) {
        let group = &self.groups[index];
        group.shared.set(false);
        let Some(frozen) = self.frozen.borrow().upgrade() else { return };
        let mut slot = lock(&frozen.slots[index]);
        let FrozenGroup::Shared { map, .. } = &*slot else { return };
        if !Arc::ptr_eq(map, &group.map) {
            // An older snapshot's map: copy-on-write handles it.
            return;
        }
        let key_group = self.range.start + index as u32;
        // On an encoding error the writer meets (and reports) it; the map is copied.
        let Ok(serialized) = freeze(&group.map, key_group, &self.name) else { return };
        // The delta, when the writer may want one: the evictions' log and the map's changes.
        let changes = match std::mem::replace(&mut *slot, FrozenGroup::Released) {
            FrozenGroup::Shared { written_out: Some(log), .. } => {
                let mut log = Arc::try_unwrap(log).unwrap_or_else(|shared| ChangeLog::clone(&shared));
                match log.append_map(&group.map, key_group, &self.name) {
                    Ok(true) => Some(log),
                    _ => None,
                }
            }
            _ => None,
        };
        *slot = FrozenGroup::Serialized { frozen: serialized, changes };
    }

    /// Reads `key` from the store into its group's map, if the store has it.
    #[cold]
    fn load(&mut self, key: KeyRef<'_, K>) -> Result<(), StateError> {
        let key_group = self.range.start + key.group_index as u32;
        let store_key = self.store_key(key_group, key.key)?;
        let value = self.store.entries.get(&store_key).map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
        self.store.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(bytes) = value {
            let cell =
                C::decode(&bytes).map_err(|e| corrupt(&self.name, key_group, format!("cannot decode a value: {e}")))?;
            let group = &mut self.groups[key.group_index];
            // A read, not a change: an entry delta leaves it out.
            Arc::make_mut(&mut group.map).insert_unchanged(key.hash, key.key, cell);
            group.from_store += 1;
        }
        Ok(())
    }

    /// Counts the maps into the process's estimate and, while that is over the budget,
    /// writes whole key groups to the store and drops their maps (down to 90 % of it).
    pub fn enforce_budget(&mut self) -> Result<(), StateError> {
        let now: usize = self.groups.iter().map(|g| g.map.table_bytes() + log_bytes(&g.written_out)).sum();
        recount(&mut self.counted, now);
        let budget = self.store.options.memory_budget;
        let total = cached_bytes();
        if total <= budget {
            return Ok(());
        }
        let mut to_free = (total - budget * 9 / 10).min(self.counted);
        let count = self.groups.len();
        let mut freed = 0;
        for _ in 0..count {
            if to_free == 0 {
                break;
            }
            let index = self.evict_cursor % count;
            self.evict_cursor = (index + 1) % count;
            let bytes = self.groups[index].map.table_bytes();
            if bytes == 0 {
                continue;
            }
            self.write_out(index)?;
            freed += bytes;
            to_free = to_free.saturating_sub(bytes);
        }
        if to_free > 0 {
            // Every map is out and the change logs alone are over the budget: the next
            // checkpoint writes these groups whole instead.
            for group in &self.groups {
                freed += log_bytes(&group.written_out);
                group.written_out.set(None);
            }
        }
        recount(&mut self.counted, now.saturating_sub(freed));
        Ok(())
    }

    /// Writes group `index` to the store (its entries, and deletes for its tombstones) and
    /// drops its map.
    fn write_out(&mut self, index: usize) -> Result<(), StateError> {
        let key_group = self.range.start + index as u32;
        let entries = self.groups[index].entries();
        let mut log = self.groups[index].written_out.take();
        if let Some(known) = &mut log
            && !known.append_map(&self.groups[index].map, key_group, &self.name)?
        {
            log = None;
        }
        // Past half the group's entries a delta is not written: the log can go, once it
        // holds each key once.
        if let Some(known) = &mut log
            && known.changes().saturating_mul(2) > entries
        {
            known.compact(&self.name, key_group)?;
        }
        let log = log.filter(|log| log.changes().saturating_mul(2) <= entries);
        let mut fresh = KeyMap::with_tombstones();
        if log.is_some() {
            fresh.track_changes();
        }
        self.groups[index].written_out.set(log);
        let map = std::mem::replace(&mut self.groups[index].map, Arc::new(fresh));
        let mut batch = self.store.keyspace.batch().durability(None);
        let mut written = 0u64;
        let mut value = Vec::with_capacity(16);
        for (key, cell) in map.iter() {
            value.clear();
            cell.encode(&mut value)
                .map_err(|e| corrupt(&self.name, key_group, format!("cannot encode a value: {e}")))?;
            batch.insert(&self.store.entries, self.store_key(key_group, key)?, value.as_slice());
            written += 1;
        }
        if self.groups[index].residence == Residence::Stored {
            for key in map.tombstones() {
                if map.get(memory_hash(key.stable_hash()), key).is_none() {
                    batch.remove(&self.store.entries, self.store_key(key_group, key)?);
                    written += 1;
                }
            }
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write", e))?;
        let group = &mut self.groups[index];
        group.residence = Residence::Stored;
        group.stored = entries;
        group.from_store = 0;
        self.store.writes.fetch_add(written, Ordering::Relaxed);
        Ok(())
    }

    /// Replaces one key group's entries with the canonical `bytes` of a snapshot, after the
    /// heap backend's checks (every key in `key_group` under `max_parallelism`,
    /// `expected_entries` of them when recorded, every key and cell decodes). They go to
    /// the store; accesses bring them into the map.
    pub fn restore_key_group(
        &mut self,
        key_group: u32,
        bytes: &[u8],
        max_parallelism: u32,
        expected_entries: u64,
    ) -> Result<(), StateError> {
        let entries = verified_entries(bytes, &self.name, key_group, max_parallelism, expected_entries)?;
        self.put_group(key_group, &entries)
    }

    fn put_group(&mut self, key_group: u32, entries: &[(&[u8], &[u8])]) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        self.clear_group(index)?;
        let mut batch = self.store.keyspace.batch().durability(None);
        let prefix = group_prefix(self.table_id, key_group);
        for (key_bytes, cell_bytes) in entries {
            postcard::from_bytes::<K>(key_bytes)
                .map_err(|e| corrupt(&self.name, key_group, format!("cannot decode a key: {e}")))?;
            C::decode(cell_bytes).map_err(|e| corrupt(&self.name, key_group, format!("cannot decode a value: {e}")))?;
            let mut store_key = Vec::with_capacity(prefix.len() + key_bytes.len());
            store_key.extend_from_slice(&prefix);
            store_key.extend_from_slice(key_bytes);
            batch.insert(&self.store.entries, store_key, *cell_bytes);
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write restored state", e))?;
        self.store.writes.fetch_add(entries.len() as u64, Ordering::Relaxed);
        let group = &mut self.groups[index];
        group.map = Arc::new(KeyMap::with_tombstones());
        group.residence = Residence::Stored;
        group.stored = entries.len() as u64;
        group.from_store = 0;
        // Restored: what changes from here on is not tracked until the next snapshot.
        group.written_out.set(None);
        Ok(())
    }

    /// Removes every entry of one key group, from the map and the store.
    fn clear_group(&mut self, index: usize) -> Result<(), StateError> {
        let group = &mut self.groups[index];
        group.map = Arc::new(KeyMap::default());
        group.stored = 0;
        group.from_store = 0;
        group.written_out.set(None);
        if group.residence == Residence::Memory {
            return Ok(());
        }
        group.residence = Residence::Memory;
        let prefix = group_prefix(self.table_id, self.range.start + index as u32);
        let mut batch = self.store.keyspace.batch().durability(None);
        for item in self.store.entries.prefix(prefix) {
            let (key, _) = item.map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
            batch.remove(&self.store.entries, key);
        }
        batch.commit().map_err(|e| store_error(&self.store.dir, "cannot write", e))
    }

    /// Calls `f` for every entry of the table, in no particular order.
    pub fn for_each(&mut self, mut f: impl FnMut(&K, &C)) -> Result<(), StateError> {
        for index in 0..self.groups.len() {
            let key_group = self.range.start + index as u32;
            let group = &self.groups[index];
            for (key, cell) in group.map.iter() {
                f(key, cell);
            }
            if group.residence == Residence::Memory {
                continue;
            }
            for item in self.store.entries.prefix(group_prefix(self.table_id, key_group)) {
                let (store_key, value) = item.map_err(|e| store_error(&self.store.dir, "cannot read", e))?;
                let key: K = postcard::from_bytes(&store_key[4..])
                    .map_err(|e| corrupt(&self.name, key_group, format!("cannot decode a key: {e}")))?;
                let hash = memory_hash(key.stable_hash());
                if group.map.get(hash, &key).is_some() || group.map.is_tombstoned(hash, &key) {
                    continue;
                }
                let cell = C::decode(&value)
                    .map_err(|e| corrupt(&self.name, key_group, format!("cannot decode a value: {e}")))?;
                f(&key, &cell);
            }
        }
        Ok(())
    }

    fn index_of(&self, key_group: u32) -> Result<usize, StateError> {
        group_index(self.range, key_group)
    }
}

fn log_bytes(log: &std::cell::Cell<Option<ChangeLog>>) -> usize {
    let taken = log.take();
    let bytes = taken.as_ref().map_or(0, ChangeLog::memory_bytes);
    log.set(taken);
    bytes
}

/// A group's cached part at a barrier: its map's entries in canonical form and its
/// tombstones' key bytes, sorted.
struct FrozenBytes {
    entries: Vec<u8>,
    tombstones: Vec<Vec<u8>>,
}

fn freeze<K: Key, C: Cell>(map: &KeyMap<K, C>, key_group: u32, name: &str) -> Result<FrozenBytes, StateError> {
    let mut entries = Vec::new();
    write_group(map, key_group, name, &mut entries)?;
    let mut tombstones = Vec::new();
    for key in map.tombstones() {
        tombstones.push(
            postcard::to_allocvec(key).map_err(|e| corrupt(name, key_group, format!("cannot encode a key: {e}")))?,
        );
    }
    tombstones.sort_unstable();
    Ok(FrozenBytes { entries, tombstones })
}

/// One key group as a snapshot writes it: the canonical entry list's body (without its
/// count) and the count. A stored group is its cached entries and tombstones merged over
/// the store's range, all in key-byte order.
fn encode_group(
    frozen: &FrozenBytes,
    residence: Residence,
    store: &fjall::Snapshot,
    (name, dir): (&str, &Path),
    (table_id, key_group): (u16, u32),
) -> Result<(u64, Vec<u8>), StateError> {
    let cached: Vec<(&[u8], &[u8])> = postcard::from_bytes(&frozen.entries)
        .map_err(|e| corrupt(name, key_group, format!("cannot decode cached entries: {e}")))?;
    let mut body = Vec::with_capacity(frozen.entries.len());
    let emit = |body: &mut Vec<u8>, key: &[u8], value: &[u8]| {
        write_varint(body, key.len() as u64);
        body.extend_from_slice(key);
        write_varint(body, value.len() as u64);
        body.extend_from_slice(value);
    };
    if residence == Residence::Memory {
        for (key, value) in &cached {
            emit(&mut body, key, value);
        }
        return Ok((cached.len() as u64, body));
    }
    let mut count = 0u64;
    let mut pending = cached.iter().peekable();
    for item in store.prefix(group_prefix(table_id, key_group)) {
        let (store_key, value) = item.map_err(|e| store_error(dir, "cannot read a snapshot", e))?;
        let key = &store_key[4..];
        // Cached entries up to this key first; an equal one replaces the stored entry.
        let mut replaced = false;
        while let Some((cached_key, cached_value)) = pending.peek() {
            if *cached_key > key {
                break;
            }
            replaced |= *cached_key == key;
            emit(&mut body, cached_key, cached_value);
            count += 1;
            pending.next();
        }
        if replaced || frozen.tombstones.binary_search_by(|t| t.as_slice().cmp(key)).is_ok() {
            continue;
        }
        emit(&mut body, key, &value);
        count += 1;
    }
    for (cached_key, cached_value) in pending {
        emit(&mut body, cached_key, cached_value);
        count += 1;
    }
    Ok((count, body))
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
        self.groups.iter().map(|g| g.entries() as usize).sum()
    }

    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let group = &self.groups[self.index_of(key_group)?];
        let snapshot = self.store.entries.snapshot();
        let identity = (self.name.as_str(), &*self.store.dir);
        let frozen = freeze(&group.map, key_group, &self.name)?;
        let (count, body) = encode_group(&frozen, group.residence, &snapshot, identity, (self.table_id, key_group))?;
        write_varint(out, count);
        out.extend_from_slice(&body);
        Ok(())
    }

    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError> {
        let entries: Vec<(&[u8], &[u8])> = postcard::from_bytes(bytes)
            .map_err(|e| corrupt(&self.name, key_group, format!("cannot decode entries: {e}")))?;
        self.put_group(key_group, &entries)
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn snapshot(&self, _native: bool, checkpoint_id: u64) -> Box<dyn TableSnapshot> {
        self.last_snapshot_id.set(checkpoint_id);
        for group in &self.groups {
            group.shared.set(true);
        }
        let frozen = Arc::new(FrozenGroups {
            slots: self
                .groups
                .iter()
                .map(|g| {
                    std::sync::Mutex::new(FrozenGroup::Shared {
                        map: Arc::clone(&g.map),
                        written_out: g.written_out.take().map(Arc::new),
                    })
                })
                .collect(),
            residence: self.groups.iter().map(|g| g.residence).collect(),
            entries: self.groups.iter().map(LsmGroup::entries).collect(),
        });
        *self.frozen.borrow_mut() = Arc::downgrade(&frozen);
        Box::new(LsmSnapshot {
            name: self.name.clone(),
            kind: self.kind,
            range: self.range,
            table_id: self.table_id,
            store: self.store.entries.snapshot(),
            dir: self.store.dir.to_path_buf(),
            frozen,
            written_after: self.groups.iter().map(|g| g.written_after).collect(),
        })
    }
}

/// One key group of a snapshot in progress.
enum FrozenGroup<K, C> {
    /// Not written yet: the map as it was at the barrier, shared with the live table, and
    /// what evictions wrote since the snapshot before (when known).
    Shared { map: Arc<KeyMap<K, C>>, written_out: Option<Arc<ChangeLog>> },
    /// Serialized by the task just before its first change to the group after the barrier:
    /// the cached part, and everything changed since the snapshot before (when known).
    Serialized { frozen: FrozenBytes, changes: Option<ChangeLog> },
    /// Written out by the writer.
    Released,
}

/// The key groups of a snapshot in progress, shared by the live table (which serializes a
/// group into it before changing it) and the snapshot's writer.
struct FrozenGroups<K, C> {
    slots: Vec<std::sync::Mutex<FrozenGroup<K, C>>>,
    residence: Vec<Residence>,
    /// Each group's entries at the barrier.
    entries: Vec<u64>,
}

/// A table as it was at a barrier: every group's map (shared, or serialized before the task
/// changed it) and an MVCC snapshot of the store, written by the checkpoint's writer.
struct LsmSnapshot<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    table_id: u16,
    store: fjall::Snapshot,
    dir: PathBuf,
    frozen: Arc<FrozenGroups<K, C>>,
    written_after: Vec<u64>,
}

impl<K: Key, C: Cell> LsmSnapshot<K, C> {
    fn index(&self, key_group: u32) -> Result<usize, StateError> {
        group_index(self.range, key_group)
    }

    /// The group's count and body, as [`encode_group`] writes them.
    fn encoded(&self, key_group: u32) -> Result<(u64, Vec<u8>), StateError> {
        let index = self.index(key_group)?;
        let residence = self.frozen.residence[index];
        let identity = (self.name.as_str(), self.dir.as_path());
        let slot = lock(&self.frozen.slots[index]);
        match &*slot {
            FrozenGroup::Shared { map, .. } => {
                // Serialized outside the lock: the task may want the slot meanwhile (it
                // then serializes the group itself or copies the map).
                let map = Arc::clone(map);
                drop(slot);
                let frozen = freeze(&map, key_group, &self.name)?;
                encode_group(&frozen, residence, &self.store, identity, (self.table_id, key_group))
            }
            FrozenGroup::Serialized { frozen, .. } => {
                encode_group(frozen, residence, &self.store, identity, (self.table_id, key_group))
            }
            FrozenGroup::Released => Err(corrupt(&self.name, key_group, "written after it was released".into())),
        }
    }
}

impl<K: Key, C: Cell> TableSnapshot for LsmSnapshot<K, C> {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> StateKind {
        self.kind
    }
    fn cell_type(&self) -> &str {
        std::any::type_name::<C>()
    }
    fn key_group_entries(&self, key_group: u32) -> u64 {
        self.index(key_group).map_or(0, |index| self.frozen.entries[index])
    }
    fn written_after(&self, key_group: u32) -> u64 {
        self.index(key_group).map_or(u64::MAX, |index| self.written_after[index])
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let (count, body) = self.encoded(key_group)?;
        let expected = self.key_group_entries(key_group);
        if count != expected {
            // The block would not restore (its recorded count is checked): decline instead.
            return Err(corrupt(
                &self.name,
                key_group,
                format!(
                    "holds {count} entries but {expected} were counted at the barrier (a bug of the fjall backend: please report it; the checkpoint is declined, the job's state is intact)"
                ),
            ));
        }
        write_varint(out, count);
        out.extend_from_slice(&body);
        Ok(())
    }
    fn changed_entries(&self, key_group: u32) -> Option<u64> {
        let index = self.index(key_group).ok()?;
        let changed = match &*lock(&self.frozen.slots[index]) {
            FrozenGroup::Shared { map, written_out: Some(log) } => {
                map.changed_count().map(|changed| changed as u64 + log.changes())
            }
            FrozenGroup::Serialized { changes: Some(log), .. } => Some(log.changes()),
            _ => None,
        }?;
        // At most: a key changed twice counts twice. The delta's write counts exactly.
        Some(changed)
    }
    fn write_key_group_delta(&self, key_group: u32, out: &mut Vec<u8>) -> Result<bool, StateError> {
        let index = self.index(key_group)?;
        // Past half the group, a chain costs the restore more than it saves.
        let half = self.frozen.entries[index] / 2;
        let slot = lock(&self.frozen.slots[index]);
        match &*slot {
            FrozenGroup::Shared { map, written_out: Some(log) } => {
                let (map, log) = (Arc::clone(map), Arc::clone(log));
                drop(slot);
                let mut cached = ChangeLog::default();
                if !cached.append_map(&map, key_group, &self.name)? {
                    return Ok(false);
                }
                write_delta(&[&log, &cached], half, out, &self.name, key_group)
            }
            FrozenGroup::Serialized { changes: Some(log), .. } => write_delta(&[log], half, out, &self.name, key_group),
            _ => Ok(false),
        }
    }
    fn release_key_group(&mut self, key_group: u32) {
        if let Ok(index) = self.index(key_group) {
            *lock(&self.frozen.slots[index]) = FrozenGroup::Released;
        }
    }
}
