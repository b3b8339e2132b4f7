//! The `spillable` state backend's disk side: key groups that do not fit in the memory budget
//! are written, in the native snapshot encoding, to a local [fjall] LSM store (Flink's
//! FLIP-50 "spillable heap backend", with an LSM as the spill store).
//!
//! A spilled key group is a [`SpilledGroup`] behind an `Arc`, shared like a resident map: a
//! snapshot taken while the group is on disk holds the `Arc` and reads the bytes when it is
//! written, and each spill writes a new key, so a group loaded, changed and spilled again
//! never overwrites what a snapshot still reads. The key is removed when the last `Arc` goes.
//!
//! The store is scratch space: it is not durable across processes (checkpoints are), lives
//! in a directory of its own under `io.tmp.dirs`, and is deleted with the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::StateError;
use crate::scratch;

/// Where and how much: the options of the backends that keep state on local disk
/// (`spillable` and `fjall`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpillOptions {
    /// The directory under which each backend makes its store (`io.tmp.dirs`).
    pub dir: PathBuf,
    /// Bytes of resident key groups or cached entries (an estimate of their maps' memory)
    /// the process keeps in hash maps (`state.backend.spillable.memory`,
    /// `state.backend.fjall.memory`).
    pub memory_budget: usize,
    /// How state is laid out on disk.
    #[serde(default)]
    pub layout: DiskLayout,
}

/// How a backend with a local store keeps its state there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DiskLayout {
    /// `spillable`: every key group in a hash map, cold key groups spilled whole.
    #[default]
    KeyGroups,
    /// `fjall`: every entry in the LSM store, the hot ones cached in hash maps
    /// ([`crate::lsm`]).
    Entries,
}

impl SpillOptions {
    /// The backend's name as `state.backend.type` and snapshots spell it.
    pub fn backend_name(&self) -> &'static str {
        match self.layout {
            DiskLayout::KeyGroups => "spillable",
            DiskLayout::Entries => "fjall",
        }
    }
}

/// The estimated bytes of resident state of every spillable backend of the process: the
/// budget is for the process, as a TaskManager's managed memory is.
static RESIDENT_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The estimated bytes of resident state of all spillable backends of this process.
pub fn resident_bytes() -> usize {
    RESIDENT_BYTES.load(Ordering::Relaxed)
}

pub(crate) fn add_resident(bytes: usize) {
    RESIDENT_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn remove_resident(bytes: usize) {
    let _ = RESIDENT_BYTES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| Some(now.saturating_sub(bytes)));
}

/// The block cache of a store.
const STORE_CACHE_BYTES: u64 = 4 << 20;
/// Memtables of a store, at most, before they are flushed to disk.
const STORE_WRITE_BUFFER_BYTES: u64 = 8 << 20;
/// One memtable.
const STORE_MEMTABLE_BYTES: u32 = 4 << 20;
/// The journal, at most.
const STORE_JOURNAL_BYTES: u64 = 32 << 20;

/// One backend's spill store.
pub struct SpillStore {
    keyspace: fjall::Keyspace,
    groups: fjall::PartitionHandle,
    /// Its directory, marked in use while the store is open (after `keyspace`, so it
    /// goes once the store closed).
    dir: scratch::ScratchDir,
    next_key: AtomicU64,
    /// Key groups spilled and loaded back, for metrics and tests.
    pub(crate) spills: AtomicU64,
    pub(crate) loads: AtomicU64,
    /// The options it was made with.
    pub options: SpillOptions,
}

impl std::fmt::Debug for SpillStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillStore").field("dir", &self.dir.display()).finish()
    }
}

/// The name of every spill store's directory starts with this.
pub(crate) const STORE_PREFIX: &str = "weir-spill";

fn spill_error(dir: &Path, what: &str, error: impl std::fmt::Display) -> StateError {
    StateError::Spill {
        reason: format!(
            "{what} in the spill store {}: {error}; check that io.tmp.dirs names a writable local directory with free space",
            dir.display()
        ),
    }
}

impl SpillStore {
    /// Opens a fresh store in a new directory under `options.dir`.
    pub fn open(options: SpillOptions) -> Result<Arc<SpillStore>, StateError> {
        // Also removes the stores a killed process left under the same directory.
        let dir = scratch::claim(&options.dir, STORE_PREFIX)
            .map_err(|e| spill_error(&options.dir, "cannot create a store directory", e))?;
        let keyspace = fjall::Config::new(&*dir)
            // Scratch data: nothing needs to survive a crash, so no journal syncing.
            .manual_journal_persist(true)
            // fjall deletes the directory when the last handle goes (removing it ourselves
            // first made fjall print "Failed to clean up path").
            .temporary(true)
            // The point is to use less memory: small write buffers and block cache.
            .cache_size(STORE_CACHE_BYTES)
            .max_write_buffer_size(STORE_WRITE_BUFFER_BYTES)
            .max_journaling_size(STORE_JOURNAL_BYTES)
            .open()
            .map_err(|e| spill_error(&dir, "cannot open", e))?;
        let groups = keyspace
            .open_partition(
                "key-groups",
                fjall::PartitionCreateOptions::default().max_memtable_size(STORE_MEMTABLE_BYTES),
            )
            .map_err(|e| spill_error(&dir, "cannot open the key-group partition", e))?;
        Ok(Arc::new(SpillStore {
            keyspace,
            groups,
            dir,
            next_key: AtomicU64::new(0),
            spills: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            options,
        }))
    }

    /// Writes one key group's bytes; the handle removes them when dropped.
    pub(crate) fn put(self: &Arc<Self>, bytes: &[u8], entries: u64) -> Result<SpilledGroup, StateError> {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        self.groups.insert(key, bytes).map_err(|e| spill_error(&self.dir, "cannot write a key group", e))?;
        self.spills.fetch_add(1, Ordering::Relaxed);
        Ok(SpilledGroup { store: Arc::clone(self), key, entries, length: bytes.len() })
    }

    fn get(&self, key: &[u8; 8]) -> Result<Vec<u8>, StateError> {
        match self.groups.get(key) {
            Ok(Some(bytes)) => Ok(bytes.to_vec()),
            Ok(None) => Err(spill_error(&self.dir, "a spilled key group is missing", "not found")),
            Err(e) => Err(spill_error(&self.dir, "cannot read a key group", e)),
        }
    }

    /// Bytes the store holds on disk.
    pub fn disk_space(&self) -> u64 {
        self.keyspace.disk_space()
    }
}

/// A key group on disk: its bytes in the native encoding, until the last holder drops it.
pub struct SpilledGroup {
    store: Arc<SpillStore>,
    key: [u8; 8],
    /// Entries in the group.
    pub entries: u64,
    /// Bytes of the encoding.
    pub length: usize,
}

impl SpilledGroup {
    /// The group's bytes (the native encoding of its entries).
    pub fn read(&self) -> Result<Vec<u8>, StateError> {
        let bytes = self.store.get(&self.key)?;
        self.store.loads.fetch_add(1, Ordering::Relaxed);
        Ok(bytes)
    }
}

impl Drop for SpilledGroup {
    fn drop(&mut self) {
        // Removing a key only writes a tombstone; errors leave garbage that the store's
        // directory takes with it when the backend ends.
        let _ = self.store.groups.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spilled_group_reads_back_and_goes_with_its_last_holder() {
        let dir = std::env::temp_dir();
        let store = SpillStore::open(SpillOptions { dir, memory_budget: 0, layout: DiskLayout::KeyGroups }).unwrap();
        let first = Arc::new(store.put(b"abc", 3).unwrap());
        let held = Arc::clone(&first);
        let second = store.put(b"defg", 4).unwrap();
        assert_eq!(first.read().unwrap(), b"abc");
        assert_eq!(second.read().unwrap(), b"defg");
        drop(first);
        assert_eq!(held.read().unwrap(), b"abc", "a snapshot still holds it");
        let key = held.key;
        drop(held);
        assert!(store.groups.get(key).unwrap().is_none());
        let path = store.dir.to_path_buf();
        drop(second);
        drop(store);
        assert!(!path.exists());
    }
}
