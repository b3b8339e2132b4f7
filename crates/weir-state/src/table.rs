//! A state table: one declared state's entries, one hash map per key group.

use std::any::Any;
use std::cell::Cell as Flag;
use std::hash::Hash;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use weir_types::key::with_canonical_bytes;
use weir_types::keygroups::{key_group_for_hash, murmur3_32};
use weir_types::{Key, KeyGroupRange};

use crate::FastMap;
use crate::error::StateError;
use crate::handles::StateKind;
use crate::keymap::KeyMap;
use crate::spill::{SpillStore, SpilledGroup};

/// The type-erased view of a table that the backend and snapshots use.
pub trait StateTable<K>: Send {
    /// The state's declared name.
    fn name(&self) -> &str;
    /// Value, list, map or reducing.
    fn kind(&self) -> StateKind;
    /// The Rust type of the stored cells, recorded so a restore can detect a changed type.
    fn cell_type(&self) -> &'static str;
    /// Number of keys with an entry.
    fn entry_count(&self) -> usize;
    /// Serializes one key group's entries in canonical order (sorted by key bytes).
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError>;
    /// Replaces one key group's entries with those decoded from `bytes`.
    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError>;
    /// For typed access through a handle.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// A copy for checkpoint `checkpoint_id`, serialized later on another thread, in the
    /// native format (the table's own order) or the canonical one (sorted by key bytes).
    fn snapshot(&self, native: bool, checkpoint_id: u64) -> Box<dyn TableSnapshot>;
    /// Restored bytes not yet claimed by a handle, if this is such a table.
    fn as_restored(&self) -> Option<&RestoredTable> {
        None
    }
    /// An estimate of the memory of the key groups in memory (the `spillable` backend's
    /// budget counts it): entries times the size of a key and a cell in the map.
    fn resident_bytes(&self) -> usize {
        0
    }
    /// Starts loading the entry of in-memory `hash` in key group index `group_index` into the
    /// cache, if the table keeps one there ([`crate::keymap::KeyMap::prefetch`]).
    fn prefetch(&self, _group_index: usize, _hash: u64) {}
    /// Spills resident key groups to `store`, starting at group index `cursor`, until about
    /// `bytes` are freed or every group was looked at; returns the bytes freed and the next
    /// cursor.
    fn spill(&mut self, _store: &Arc<SpillStore>, _bytes: usize, cursor: usize) -> Result<(usize, usize), StateError> {
        Ok((0, cursor))
    }
}

/// A copy of one table taken at a checkpoint barrier; written out asynchronously.
pub trait TableSnapshot: Send {
    /// The state's name.
    fn name(&self) -> &str;
    /// The state's kind.
    fn kind(&self) -> StateKind;
    /// The recorded type of the cells.
    fn cell_type(&self) -> &str;
    /// Entries of one key group.
    fn key_group_entries(&self, key_group: u32) -> u64;
    /// Serializes one key group's entries in the snapshot's format.
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError>;
    /// Lets go of one key group once it is written, so the task's next write to it needs no
    /// copy.
    fn release_key_group(&mut self, _key_group: u32) {}
    /// The id of the newest snapshot taken before the key group was last written (0: not
    /// written since the table was created or restored). The group is unchanged since
    /// checkpoint `b` when this is below `b`, so an incremental checkpoint may reuse what `b`
    /// wrote for it. `u64::MAX`: unknown, always written.
    fn written_after(&self, _key_group: u32) -> u64 {
        u64::MAX
    }
    /// How many entries of the key group were written or removed since the snapshot
    /// [`Self::written_after`] names, when the table tracked that (the `hashmap` and `fjall` backends of
    /// an incremental job); `None` otherwise.
    fn changed_entries(&self, _key_group: u32) -> Option<u64> {
        None
    }
    /// Serializes what [`Self::changed_entries`] counts as an entry delta ([`crate::apply_deltas`]
    /// applies it over the block of snapshot [`Self::written_after`]); `false` when not known
    /// or not worth it (more than half the group changed), and then nothing is written.
    fn write_key_group_delta(&self, _key_group: u32, _out: &mut Vec<u8>) -> Result<bool, StateError> {
        Ok(false)
    }
}

/// A state read back from a snapshot, kept as canonical bytes per key group until the
/// function declares it (then it becomes a typed table, after a type check).
#[derive(Clone, Debug)]
pub struct RestoredTable {
    /// The state's name.
    pub name: String,
    /// The recorded kind.
    pub kind: StateKind,
    /// The recorded cell type.
    pub cell_type: String,
    /// Canonical bytes and entry count per key group.
    pub key_groups: std::collections::BTreeMap<u32, (Vec<u8>, u64)>,
}

impl<K> StateTable<K> for RestoredTable {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> StateKind {
        self.kind
    }
    fn cell_type(&self) -> &'static str {
        "restored state not yet declared"
    }
    fn entry_count(&self) -> usize {
        // Recorded counts come from the snapshot: a crafted one may claim any number.
        let entries = self.key_groups.values().fold(0u64, |sum, (_, entries)| sum.saturating_add(*entries));
        usize::try_from(entries).unwrap_or(usize::MAX)
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        TableSnapshot::write_key_group(self, key_group, out)
    }
    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError> {
        self.key_groups.insert(key_group, (bytes.to_vec(), 0));
        Ok(())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn snapshot(&self, native: bool, _checkpoint_id: u64) -> Box<dyn TableSnapshot> {
        Box::new(RestoredSnapshot { table: self.clone(), canonical: !native })
    }
    fn as_restored(&self) -> Option<&RestoredTable> {
        Some(self)
    }
}

/// A restored table no handle claimed yet, in a new snapshot: its bytes as they were read,
/// sorted again for a canonical snapshot (they may come from a native one).
struct RestoredSnapshot {
    table: RestoredTable,
    canonical: bool,
}

impl TableSnapshot for RestoredSnapshot {
    fn name(&self) -> &str {
        &self.table.name
    }
    fn kind(&self) -> StateKind {
        self.table.kind
    }
    fn cell_type(&self) -> &str {
        &self.table.cell_type
    }
    fn key_group_entries(&self, key_group: u32) -> u64 {
        TableSnapshot::key_group_entries(&self.table, key_group)
    }
    fn written_after(&self, _key_group: u32) -> u64 {
        // Restored bytes no handle claimed never change.
        0
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let Some((bytes, _)) = self.table.key_groups.get(&key_group) else {
            return TableSnapshot::write_key_group(&self.table, key_group, out);
        };
        if !self.canonical {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        sort_encoded(bytes, &self.table.name, key_group, out)
    }
}

/// Writes the encoded entries `bytes` (native or canonical) in canonical order into `out`.
fn sort_encoded(bytes: &[u8], name: &str, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
    let corrupt = |e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot decode entries: {e}"),
    };
    let mut entries: Vec<(&[u8], &[u8])> = postcard::from_bytes(bytes).map_err(corrupt)?;
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    write_varint(out, entries.len() as u64);
    for (key, value) in entries {
        write_varint(out, key.len() as u64);
        out.extend_from_slice(key);
        write_varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }
    Ok(())
}

impl TableSnapshot for RestoredTable {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> StateKind {
        self.kind
    }
    fn cell_type(&self) -> &str {
        &self.cell_type
    }
    fn key_group_entries(&self, key_group: u32) -> u64 {
        self.key_groups.get(&key_group).map(|(_, entries)| *entries).unwrap_or(0)
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        match self.key_groups.get(&key_group) {
            Some((bytes, _)) => out.extend_from_slice(bytes),
            // An empty key group in canonical form: a zero-length entry list.
            None => out.push(0),
        }
        Ok(())
    }
}

/// The memory of a key group besides its map's table (the `Arc` and the group's fields).
const GROUP_OVERHEAD_BYTES: usize = 64;

/// Decodes a key group written by [`write_group`] or [`write_group_native`] (borrowed slices:
/// no allocation per entry while decoding).
fn decode_group<K: Key, C: Cell>(bytes: &[u8], name: &str, key_group: u32) -> Result<KeyMap<K, C>, StateError> {
    let corrupt = |what: &str, e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot decode {what}: {e}"),
    };
    let entries: Vec<(&[u8], &[u8])> = postcard::from_bytes(bytes).map_err(|e| corrupt("entries", e))?;
    let mut map = KeyMap::with_capacity(entries.len());
    for (key_bytes, cell_bytes) in entries {
        let key: K = postcard::from_bytes(key_bytes).map_err(|e| corrupt("a key", e))?;
        let cell = C::decode(cell_bytes).map_err(|e| corrupt("a value", e))?;
        map.insert_owned(key, cell);
    }
    Ok(map)
}

/// Writes one key group's entries in canonical form: postcard's encoding of
/// `Vec<(Vec<u8>, Vec<u8>)>`, sorted by key bytes.
pub(crate) fn write_group<K: Key, C: Cell>(
    group: &KeyMap<K, C>,
    key_group: u32,
    name: &str,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    let corrupt = |e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot encode: {e}"),
    };
    // Every entry goes into one buffer in its final form (length-prefixed key and cell: no
    // allocation per entry); the entries are sorted as (key prefix, index) pairs and copied
    // out whole.
    let mut buffer = Vec::with_capacity(group.len() * 12);
    let mut starts: Vec<usize> = Vec::with_capacity(group.len() + 1);
    let mut entries: Vec<SortEntry> = Vec::with_capacity(group.len());
    for (index, (key, cell)) in group.iter().enumerate() {
        starts.push(buffer.len());
        let key_bytes = write_entry(key, cell, &mut buffer).map_err(corrupt)?;
        entries.push(SortEntry { prefix: key_prefix(&buffer[key_bytes]), index });
    }
    starts.push(buffer.len());
    sort_entries(&buffer, &starts, &mut entries);
    out.reserve(buffer.len() + 10);
    write_varint(out, entries.len() as u64);
    for entry in &entries {
        out.extend_from_slice(&buffer[starts[entry.index]..starts[entry.index + 1]]);
    }
    Ok(())
}

/// Writes one key group's entries as [`write_group`] does, in the map's own order: no sort,
/// and straight into `out`.
fn write_group_native<K: Key, C: Cell>(
    group: &KeyMap<K, C>,
    key_group: u32,
    name: &str,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    let corrupt = |e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot encode: {e}"),
    };
    out.reserve(group.len() * 8 + 10);
    write_varint(out, group.len() as u64);
    for (key, cell) in group.iter() {
        write_entry(key, cell, out).map_err(corrupt)?;
    }
    Ok(())
}

/// Appends one entry as blocks hold it, `[varint key length][key][varint cell length][cell]`;
/// returns where the key's bytes are in `out`. Both parts are encoded straight into `out`.
pub(crate) fn write_entry<K: Key, C: Cell>(
    key: &K,
    cell: &C,
    out: &mut Vec<u8>,
) -> Result<std::ops::Range<usize>, postcard::Error> {
    let key_bytes = write_prefixed(out, |out| postcard::to_io(key, out).map(|_| ()))?;
    write_prefixed(out, |out| cell.encode(out))?;
    Ok(key_bytes)
}

/// Appends what `encode` writes, preceded by its length as a varint; returns where the
/// encoded bytes are. One byte is set aside for the length (below 128 for nearly every key
/// and cell) and widened afterwards when the part is longer: no copy through a buffer.
pub(crate) fn write_prefixed(
    out: &mut Vec<u8>,
    encode: impl FnOnce(&mut Vec<u8>) -> Result<(), postcard::Error>,
) -> Result<std::ops::Range<usize>, postcard::Error> {
    let at = out.len();
    out.push(0);
    if let Err(error) = encode(out) {
        out.truncate(at);
        return Err(error);
    }
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
        return Ok(at + 1..out.len());
    }
    let mut prefix = Vec::with_capacity(10);
    write_varint(&mut prefix, len as u64);
    let widened = prefix.len() - 1;
    out.splice(at..at + 1, prefix);
    Ok(at + 1 + widened..out.len())
}

/// The key bytes of an entry `[varint key length][key][varint cell length][cell]` that this
/// module wrote itself.
fn entry_key(entry: &[u8]) -> &[u8] {
    let (len, used) = read_varint_prefix(entry);
    entry.get(used..used + len).unwrap_or(&[])
}

/// A varint at the start of `bytes` and the bytes it took (0 and 0 for a malformed one, which
/// only this module's own output reaches).
fn read_varint_prefix(bytes: &[u8]) -> (usize, usize) {
    let mut value = 0usize;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= usize::from(byte & 0x7f).checked_shl(7 * i as u32).unwrap_or(0);
        if byte & 0x80 == 0 {
            return (value, i + 1);
        }
    }
    (0, 0)
}

/// An entry of a key group being sorted: the first 8 key bytes as a big-endian integer, and
/// the entry's index in the map's order.
#[derive(Clone, Copy, Default)]
struct SortEntry {
    prefix: u64,
    index: usize,
}

/// The first 8 bytes of `key` as a big-endian integer, zero-padded.
fn key_prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

/// Sorts `entries` by their key bytes in `buffer`. Most keys differ in their first 8 bytes:
/// a least-significant-digit radix sort by those as a big-endian integer, over only the byte
/// positions in which the prefixes differ, orders them in a few linear passes; only runs of
/// equal prefixes (longer keys that share 8 bytes, or a key and its zero-padded extension)
/// compare whole keys.
fn sort_entries(buffer: &[u8], starts: &[usize], entries: &mut Vec<SortEntry>) {
    let compare = |a: &SortEntry, b: &SortEntry| compare_entries(buffer, starts, a, b);
    let (all, any) = entries.iter().fold((u64::MAX, 0u64), |(all, any), e| (all & e.prefix, any | e.prefix));
    let differing = all ^ any;
    if entries.len() < 256 {
        entries.sort_unstable_by(compare);
        return;
    }
    let mut scratch = vec![SortEntry::default(); entries.len()];
    for shift in (0..64).step_by(8) {
        if (differing >> shift) & 0xff == 0 {
            continue;
        }
        let digit = |e: &SortEntry| ((e.prefix >> shift) & 0xff) as usize;
        let mut next = [0usize; 256];
        for entry in entries.iter() {
            next[digit(entry)] += 1;
        }
        let mut sum = 0;
        for slot in next.iter_mut() {
            let count = *slot;
            *slot = sum;
            sum += count;
        }
        for entry in entries.iter() {
            let d = digit(entry);
            scratch[next[d]] = *entry;
            next[d] += 1;
        }
        std::mem::swap(entries, &mut scratch);
    }
    let mut run = 0;
    while run < entries.len() {
        let mut end = run + 1;
        while end < entries.len() && entries[end].prefix == entries[run].prefix {
            end += 1;
        }
        if end - run > 1 {
            entries[run..end].sort_unstable_by(compare);
        }
        run = end;
    }
}

fn compare_entries(buffer: &[u8], starts: &[usize], a: &SortEntry, b: &SortEntry) -> std::cmp::Ordering {
    let key = |e: &SortEntry| entry_key(&buffer[starts[e.index]..starts[e.index + 1]]);
    a.prefix.cmp(&b.prefix).then_with(|| key(a).cmp(key(b)))
}

/// The index of `key_group` within `range`, or the error naming both.
pub(crate) fn group_index(range: KeyGroupRange, key_group: u32) -> Result<usize, StateError> {
    if !range.contains(key_group) {
        return Err(StateError::KeyGroupOutOfRange { key_group, range: range.to_string() });
    }
    Ok((key_group - range.start) as usize)
}

/// One entry of an encoded key group: its key's and its cell's bytes.
pub(crate) type EncodedEntry<'a> = (&'a [u8], &'a [u8]);

/// A restored key group's entries (key and cell bytes), checked against what the snapshot
/// claims: every key hashes to `key_group` under `max_parallelism`, and there are
/// `expected_entries` of them (when recorded, that is above 0).
pub(crate) fn verified_entries<'a>(
    bytes: &'a [u8],
    name: &str,
    key_group: u32,
    max_parallelism: u32,
    expected_entries: u64,
) -> Result<Vec<EncodedEntry<'a>>, StateError> {
    let corrupt = |reason: String| StateError::Corrupt { name: name.to_string(), key_group, reason };
    let entries: Vec<(&[u8], &[u8])> =
        postcard::from_bytes(bytes).map_err(|e| corrupt(format!("cannot decode entries: {e}")))?;
    if expected_entries > 0 && entries.len() as u64 != expected_entries {
        return Err(corrupt(format!(
            "the snapshot records {expected_entries} entries but the block holds {}",
            entries.len()
        )));
    }
    for (key_bytes, _) in &entries {
        let owner = key_group_for_hash(murmur3_32(key_bytes), max_parallelism);
        if owner != key_group {
            return Err(corrupt(format!("a key of key group {owner} is stored in key group {key_group}")));
        }
    }
    Ok(entries)
}

/// Appends `value` as an unsigned LEB128 varint, postcard's integer and length encoding.
pub(crate) fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// How a table's cells become canonical bytes and back.
pub trait Cell: Clone + Send + Sync + 'static {
    /// Appends the canonical encoding.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error>;
    /// Decodes from the canonical encoding.
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error>
    where
        Self: Sized;
}

/// The cell of a value or reducing state.
#[derive(Clone)]
pub struct ValueCell<V>(pub V);
/// The cell of a list state.
#[derive(Clone)]
pub struct ListCell<V>(pub Vec<V>);
/// The cell of a map state.
#[derive(Clone)]
pub struct MapCell<UK, UV>(pub FastMap<UK, UV>);

impl<V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Cell for ValueCell<V> {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        postcard::to_io(&self.0, out).map(|_| ())
    }
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes).map(ValueCell)
    }
}

impl<V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Cell for ListCell<V> {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        postcard::to_io(&self.0, out).map(|_| ())
    }
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes).map(ListCell)
    }
}

impl<UK, UV> Cell for MapCell<UK, UV>
where
    UK: Serialize + DeserializeOwned + Eq + Hash + Clone + Send + Sync + 'static,
    UV: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        // Canonical: entries sorted by the user key's canonical bytes.
        let mut entries: Vec<(Vec<u8>, &UV)> = Vec::with_capacity(self.0.len());
        for (user_key, user_value) in &self.0 {
            entries.push((with_canonical_bytes(user_key, <[u8]>::to_vec), user_value));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        postcard::to_io(&entries, out).map(|_| ())
    }
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        let pairs: Vec<(Vec<u8>, UV)> = postcard::from_bytes(bytes)?;
        let mut map = FastMap::default();
        for (key_bytes, user_value) in pairs {
            let user_key: UK = postcard::from_bytes(&key_bytes)?;
            map.insert(user_key, user_value);
        }
        Ok(MapCell(map))
    }
}

/// One state's entries: a map per key group in the owning subtask's range.
///
/// Each key group's map is behind an `Arc` so a checkpoint's copy is a clone of the `Arc`s,
/// not of the entries (copy-on-write, as Flink's `CopyOnWriteStateMap` at key-group
/// granularity): the first write to a key group a snapshot still holds clones that group
/// alone, and a group the writer already serialized and released is written in place.
pub struct Table<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    groups: Vec<CowGroup<K, C>>,
    /// The newest snapshot still being written: before its first write to a key group the
    /// snapshot still shares, the task serializes that group into it, so the group needs no
    /// copy (the serialized bytes are a fraction of the map's memory).
    frozen: std::cell::RefCell<Option<Arc<FrozenGroups<K, C>>>>,
    /// The id of the newest snapshot taken of the table (0: none yet).
    last_snapshot_id: Flag<u64>,
    /// Each group records the entries written since the snapshot before its first write
    /// (incremental checkpoints write them as entry deltas).
    track_changes: bool,
}

/// One key group's map and whether a snapshot may share it.
struct CowGroup<K, C> {
    map: Arc<KeyMap<K, C>>,
    /// True from a snapshot's `Arc` clone until the next write made the map unique again.
    /// A `Cell` because [`StateTable::snapshot`] takes `&self`; the table stays on its
    /// subtask's thread.
    shared: Flag<bool>,
    /// The id of the newest snapshot taken before the group's last write (0: none). Set on
    /// the first write after each snapshot, which is the one that finds `shared` set, so
    /// later writes pay nothing for it.
    written_after: u64,
    /// The `spillable` backend moved the group to disk: `map` is empty and the entries are
    /// here until the next access loads them.
    spilled: Option<Arc<SpilledGroup>>,
}

impl<K: Clone, C: Clone> CowGroup<K, C> {
    fn new(map: KeyMap<K, C>) -> Self {
        CowGroup { map: Arc::new(map), shared: Flag::new(false), written_after: 0, spilled: None }
    }

    #[inline]
    fn get_mut(&mut self) -> &mut KeyMap<K, C> {
        if self.shared.get() {
            // Clones the map only if a snapshot still holds it.
            Arc::make_mut(&mut self.map);
            self.shared.set(false);
        }
        self.unique_mut()
    }

    /// The map, for a caller that found `shared` false.
    #[inline(always)]
    fn unique_mut(&mut self) -> &mut KeyMap<K, C> {
        debug_assert!(!self.shared.get(), "a shared key group written in place");
        // SAFETY: `shared` is false only while this table holds the only reference to the
        // map: `make_mut` just made it unique (or it was created unique), and the only place
        // that clones the `Arc` is `share`, which sets `shared` first. Other threads can only
        // drop their clones, which never makes a unique `Arc` shared. So no other reference
        // to the map exists, and the atomic check `Arc::get_mut` would do (a compare-and-swap
        // on every state access) is not needed.
        unsafe { &mut *(Arc::as_ptr(&self.map) as *mut KeyMap<K, C>) }
    }

    fn share(&self) -> Arc<KeyMap<K, C>> {
        self.shared.set(true);
        Arc::clone(&self.map)
    }
}

impl<K: Key, C: Clone> CowGroup<K, C> {
    /// Entries of the group, in memory or on disk.
    fn len(&self) -> usize {
        match &self.spilled {
            Some(spilled) => spilled.entries as usize,
            None => self.map.len(),
        }
    }
}

impl<K: Clone, C: Clone> Clone for Table<K, C> {
    fn clone(&self) -> Self {
        Table {
            name: self.name.clone(),
            kind: self.kind,
            range: self.range,
            groups: self
                .groups
                .iter()
                .map(|g| CowGroup {
                    written_after: g.written_after,
                    spilled: g.spilled.clone(),
                    ..CowGroup::new(KeyMap::clone(&g.map))
                })
                .collect(),
            frozen: std::cell::RefCell::new(None),
            last_snapshot_id: Flag::new(self.last_snapshot_id.get()),
            track_changes: self.track_changes,
        }
    }
}

impl<K: Key, C: Clone> Table<K, C> {
    /// An empty table for `range`.
    pub fn new(name: &str, kind: StateKind, range: KeyGroupRange) -> Table<K, C> {
        let mut groups = Vec::with_capacity(range.len() as usize);
        for _ in 0..range.len() {
            groups.push(CowGroup::new(KeyMap::default()));
        }
        Table {
            name: name.to_string(),
            kind,
            range,
            groups,
            frozen: std::cell::RefCell::new(None),
            last_snapshot_id: Flag::new(0),
            track_changes: false,
        }
    }

    /// Makes every key group record what is written to it from its first write after each
    /// snapshot on, so an incremental checkpoint can write only that
    /// ([`TableSnapshot::write_key_group_delta`]).
    pub fn tracking_changes(mut self, on: bool) -> Table<K, C> {
        self.track_changes = on;
        self
    }

    /// The map of one key group, by its index within the range.
    ///
    /// Once per state access: the common case (the group is this table's alone and in
    /// memory) is two flag tests, and must stay small enough to inline into the keyed
    /// function; the rest is out of line.
    #[inline(always)]
    pub fn group_mut(&mut self, group_index: usize) -> Result<&mut KeyMap<K, C>, StateError>
    where
        C: Cell,
    {
        let group = &self.groups[group_index];
        if group.shared.get() || group.spilled.is_some() {
            return self.group_mut_first(group_index);
        }
        Ok(self.groups[group_index].unique_mut())
    }

    /// [`Self::group_mut`] of a group a snapshot may share, or a spilled one.
    #[cold]
    #[inline(never)]
    fn group_mut_first(&mut self, group_index: usize) -> Result<&mut KeyMap<K, C>, StateError>
    where
        C: Cell,
    {
        self.first_access(group_index)?;
        let track = self.track_changes && self.groups[group_index].spilled.is_none();
        let map = self.groups[group_index].get_mut();
        if track {
            // What is written from now on is what changed since the snapshot
            // `written_after` names (nothing was written since it was taken).
            map.track_changes();
        } else {
            map.untrack_changes();
        }
        Ok(map)
    }

    /// The first access after a snapshot, or to a spilled group: records the write for
    /// incremental checkpoints, loads a spilled group, and lets a snapshot that still shares
    /// the group have it first.
    #[cold]
    fn first_access(&mut self, group_index: usize) -> Result<(), StateError>
    where
        C: Cell,
    {
        self.groups[group_index].written_after = self.last_snapshot_id.get();
        if let Some(spilled) = self.groups[group_index].spilled.clone() {
            let key_group = self.range.start + group_index as u32;
            let bytes = spilled.read()?;
            let map = decode_group::<K, C>(&bytes, &self.name, key_group)?;
            let group = &mut self.groups[group_index];
            group.map = Arc::new(map);
            group.spilled = None;
            // A snapshot holding the spilled bytes reads them from disk: the loaded map is
            // this table's alone.
            group.shared.set(false);
            return Ok(());
        }
        self.before_first_write(group_index);
        Ok(())
    }

    /// The first write to a key group a snapshot may still share: if the newest snapshot has
    /// not written the group yet, serialize it into the snapshot now and let the snapshot's
    /// reference go, so the map stays unique and is written in place.
    #[cold]
    fn before_first_write(&mut self, group_index: usize)
    where
        C: Cell,
    {
        let frozen = self.frozen.borrow().clone();
        let Some(frozen) = frozen else { return };
        if frozen.is_done() {
            *self.frozen.borrow_mut() = None;
            return;
        }
        let key_group = self.range.start + group_index as u32;
        frozen.serialize_before_write(group_index, &self.groups[group_index].map, key_group, &self.name);
    }

    /// The map of one key group, by its index within the range.
    #[inline]
    pub fn group(&self, group_index: usize) -> &KeyMap<K, C> {
        &self.groups[group_index].map
    }

    /// Every key group's map in memory, in key-group order (a spilled group shows as empty;
    /// [`Self::group_mut`] loads it).
    pub fn groups(&self) -> impl Iterator<Item = &KeyMap<K, C>> {
        self.groups.iter().map(|g| &*g.map)
    }

    /// The number of key groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Decodes a restored key group as [`StateTable::read_key_group`] does, and checks what
    /// the snapshot claims (paired with what was written): every key hashes to `key_group`
    /// under `max_parallelism`, and there are `expected_entries` of them (when recorded).
    pub fn read_key_group_verified(
        &mut self,
        key_group: u32,
        bytes: &[u8],
        max_parallelism: u32,
        expected_entries: u64,
    ) -> Result<(), StateError>
    where
        C: Cell,
    {
        let index = self.index_of(key_group)?;
        let entries = verified_entries(bytes, &self.name, key_group, max_parallelism, expected_entries)?;
        let corrupt = |reason: String| StateError::Corrupt { name: self.name.clone(), key_group, reason };
        let mut map = KeyMap::with_capacity(entries.len());
        for (key_bytes, cell_bytes) in entries {
            let key: K = postcard::from_bytes(key_bytes).map_err(|e| corrupt(format!("cannot decode a key: {e}")))?;
            let cell = C::decode(cell_bytes).map_err(|e| corrupt(format!("cannot decode a value: {e}")))?;
            map.insert_owned(key, cell);
        }
        self.groups[index] = CowGroup::new(map);
        Ok(())
    }

    fn index_of(&self, key_group: u32) -> Result<usize, StateError> {
        group_index(self.range, key_group)
    }
}

impl<K: Key, C: Cell> StateTable<K> for Table<K, C> {
    fn name(&self) -> &str {
        &self.name
    }

    #[inline]
    fn prefetch(&self, group_index: usize, hash: u64) {
        if let Some(group) = self.groups.get(group_index) {
            group.map.prefetch(hash);
        }
    }

    fn kind(&self) -> StateKind {
        self.kind
    }

    fn cell_type(&self) -> &'static str {
        std::any::type_name::<C>()
    }

    fn entry_count(&self) -> usize {
        self.groups.iter().map(CowGroup::len).sum()
    }

    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        if let Some(spilled) = &self.groups[index].spilled {
            return sort_encoded(&spilled.read()?, &self.name, key_group, out);
        }
        write_group(&self.groups[index].map, key_group, &self.name, out)
    }

    fn resident_bytes(&self) -> usize {
        self.groups.iter().filter(|g| g.spilled.is_none()).map(|g| g.map.table_bytes() + GROUP_OVERHEAD_BYTES).sum()
    }

    fn spill(&mut self, store: &Arc<SpillStore>, bytes: usize, cursor: usize) -> Result<(usize, usize), StateError> {
        let count = self.groups.len();
        let mut freed = 0;
        let mut at = cursor % count.max(1);
        for _ in 0..count {
            if freed >= bytes {
                break;
            }
            let index = at;
            at = (at + 1) % count;
            let group = &self.groups[index];
            if group.spilled.is_some() || group.map.is_empty() {
                continue;
            }
            let key_group = self.range.start + index as u32;
            let mut encoded = Vec::with_capacity(group.map.len() * 8);
            write_group_native(&group.map, key_group, &self.name, &mut encoded)?;
            let entries = group.map.len();
            let group_bytes = group.map.table_bytes();
            let spilled = store.put(&encoded, entries as u64)?;
            let group = &mut self.groups[index];
            // A snapshot may still hold the old map (it writes from it); the table lets go.
            group.map = Arc::new(KeyMap::default());
            group.shared.set(false);
            group.spilled = Some(Arc::new(spilled));
            freed += group_bytes;
        }
        Ok((freed, at))
    }

    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        self.groups[index] = CowGroup::new(decode_group::<K, C>(bytes, &self.name, key_group)?);
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn snapshot(&self, native: bool, checkpoint_id: u64) -> Box<dyn TableSnapshot> {
        self.last_snapshot_id.set(checkpoint_id);
        let groups = Arc::new(FrozenGroups {
            native,
            written_after: self.groups.iter().map(|g| g.written_after).collect(),
            slots: self
                .groups
                .iter()
                .map(|g| {
                    std::sync::Mutex::new(match &g.spilled {
                        Some(spilled) => FrozenGroup::Spilled(Arc::clone(spilled)),
                        None => FrozenGroup::Shared(g.share()),
                    })
                })
                .collect(),
            released: std::sync::atomic::AtomicUsize::new(0),
        });
        *self.frozen.borrow_mut() = Some(Arc::clone(&groups));
        Box::new(FrozenTable { name: self.name.clone(), kind: self.kind, range: self.range, groups })
    }
}

/// The entries of `map` an entry delta would hold, when one is worth writing: the changes
/// are known and at most half the entries changed (past that, a chain costs the restore
/// more than it saves).
fn worth_a_delta<K: Key, C>(map: &KeyMap<K, C>) -> Option<usize> {
    map.changed_count().filter(|changed| changed.saturating_mul(2) <= map.len())
}

/// One key group of a snapshot in progress.
enum FrozenGroup<K, C> {
    /// Not written yet: the map as it was at the barrier, shared with the live table.
    Shared(Arc<KeyMap<K, C>>),
    /// Not written yet, and on disk at the barrier (the `spillable` backend): its bytes are
    /// in the native encoding.
    Spilled(Arc<SpilledGroup>),
    /// Serialized by the task just before its first write to the group after the barrier.
    Serialized {
        /// Entries in `bytes`.
        entries: u64,
        /// The group in the snapshot's format.
        bytes: Vec<u8>,
        /// The group's entry delta and what it counts, when its changes were tracked and
        /// few.
        delta: Option<(u64, Vec<u8>)>,
    },
    /// Written out by the writer.
    Released,
}

/// The key groups of a snapshot in progress, shared by the live table (which may serialize a
/// group into it before writing to that group) and the snapshot's writer. A group's mutex is
/// taken only by the writer and by the task's first write to the group after the barrier.
pub(crate) struct FrozenGroups<K, C> {
    native: bool,
    /// Each group's [`TableSnapshot::written_after`] at the barrier.
    written_after: Vec<u64>,
    slots: Vec<std::sync::Mutex<FrozenGroup<K, C>>>,
    /// Groups the writer is done with.
    released: std::sync::atomic::AtomicUsize,
}

/// A snapshot's slot lock; a writer that panicked mid-write leaves nothing half-changed in a
/// slot, so a poisoned lock is taken as it is.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<K: Key, C: Cell> FrozenGroups<K, C> {
    fn is_done(&self) -> bool {
        self.released.load(std::sync::atomic::Ordering::Relaxed) == self.slots.len()
    }

    fn encode(&self, map: &KeyMap<K, C>, key_group: u32, name: &str, out: &mut Vec<u8>) -> Result<(), StateError> {
        if self.native { write_group_native(map, key_group, name, out) } else { write_group(map, key_group, name, out) }
    }

    /// The task's side: serializes group `index` (whose live map is `map`) unless the writer
    /// has it already, and drops the snapshot's reference to the map.
    fn serialize_before_write(&self, index: usize, map: &Arc<KeyMap<K, C>>, key_group: u32, name: &str) {
        let mut slot = lock(&self.slots[index]);
        let FrozenGroup::Shared(frozen) = &*slot else { return };
        if !Arc::ptr_eq(frozen, map) {
            // An older snapshot's map: copy-on-write handles it.
            return;
        }
        let mut bytes = Vec::new();
        // On an encoding error the writer meets (and reports) it; the group is copied.
        if self.encode(map, key_group, name, &mut bytes).is_ok() {
            // The writer decides between the two: the delta is a fraction of the group.
            let delta = match worth_a_delta(map) {
                Some(changed) => {
                    let mut delta = Vec::new();
                    match crate::delta::write_group_delta(map, key_group, name, &mut delta) {
                        Ok(true) => Some((changed as u64, delta)),
                        _ => None,
                    }
                }
                None => None,
            };
            *slot = FrozenGroup::Serialized { entries: map.len() as u64, bytes, delta };
        }
    }
}

/// A table as it was at a barrier ([`FrozenGroups`]).
pub struct FrozenTable<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    groups: Arc<FrozenGroups<K, C>>,
}

impl<K: Key, C: Cell> FrozenTable<K, C> {
    fn index(&self, key_group: u32) -> Result<usize, StateError> {
        group_index(self.range, key_group)
    }
}

impl<K: Key, C: Cell> TableSnapshot for FrozenTable<K, C> {
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
        let Ok(index) = self.index(key_group) else { return 0 };
        match &*lock(&self.groups.slots[index]) {
            FrozenGroup::Shared(map) => map.len() as u64,
            FrozenGroup::Spilled(spilled) => spilled.entries,
            FrozenGroup::Serialized { entries, .. } => *entries,
            FrozenGroup::Released => 0,
        }
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let index = self.index(key_group)?;
        let slot = lock(&self.groups.slots[index]);
        match &*slot {
            FrozenGroup::Shared(map) => {
                // Serialized outside the lock: the task may want the slot meanwhile (it then
                // serializes the group itself or copies it).
                let map = Arc::clone(map);
                drop(slot);
                self.groups.encode(&map, key_group, &self.name, out)
            }
            FrozenGroup::Spilled(spilled) => {
                let spilled = Arc::clone(spilled);
                drop(slot);
                let bytes = spilled.read()?;
                if self.groups.native {
                    out.extend_from_slice(&bytes);
                    Ok(())
                } else {
                    sort_encoded(&bytes, &self.name, key_group, out)
                }
            }
            FrozenGroup::Serialized { bytes, .. } => {
                out.extend_from_slice(bytes);
                Ok(())
            }
            FrozenGroup::Released => Err(StateError::Corrupt {
                name: self.name.clone(),
                key_group,
                reason: "written after it was released".into(),
            }),
        }
    }
    fn written_after(&self, key_group: u32) -> u64 {
        self.index(key_group).map_or(u64::MAX, |index| self.groups.written_after[index])
    }
    fn changed_entries(&self, key_group: u32) -> Option<u64> {
        let index = self.index(key_group).ok()?;
        match &*lock(&self.groups.slots[index]) {
            FrozenGroup::Shared(map) => worth_a_delta(map).map(|changed| changed as u64),
            FrozenGroup::Serialized { delta, .. } => delta.as_ref().map(|(changed, _)| *changed),
            FrozenGroup::Spilled(_) | FrozenGroup::Released => None,
        }
    }
    fn write_key_group_delta(&self, key_group: u32, out: &mut Vec<u8>) -> Result<bool, StateError> {
        let index = self.index(key_group)?;
        let slot = lock(&self.groups.slots[index]);
        match &*slot {
            FrozenGroup::Shared(map) => {
                let map = Arc::clone(map);
                drop(slot);
                crate::delta::write_group_delta(&map, key_group, &self.name, out)
            }
            FrozenGroup::Serialized { delta: Some((_, bytes)), .. } => {
                out.extend_from_slice(bytes);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn release_key_group(&mut self, key_group: u32) {
        if let Ok(index) = self.index(key_group) {
            let mut slot = lock(&self.groups.slots[index]);
            if !matches!(*slot, FrozenGroup::Released) {
                *slot = FrozenGroup::Released;
                self.groups.released.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// An entry is postcard's `(Vec<u8>, Vec<u8>)` of its key's and cell's bytes, for
        /// parts shorter than 128 bytes (the length in the byte set aside) and longer ones
        /// (the length widened), and the returned range holds the key's bytes.
        #[test]
        fn an_entry_is_its_length_prefixed_key_and_cell(key in ".{0,300}", value in proptest::collection::vec(any::<u8>(), 0..300), before in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut out = before.clone();
            let key_bytes = write_entry(&key, &ValueCell(value.clone()), &mut out).unwrap();
            let expected_key = postcard::to_allocvec(&key).unwrap();
            let expected_cell = postcard::to_allocvec(&value).unwrap();
            let mut expected = before.clone();
            expected.extend(postcard::to_allocvec(&(&expected_key, &expected_cell)).unwrap());
            prop_assert_eq!(&out[key_bytes], &expected_key[..]);
            prop_assert_eq!(out, expected);
        }

        /// The canonical form is postcard's `Vec<(Vec<u8>, Vec<u8>)>` sorted by whole key
        /// bytes, also for keys that share their first 8 bytes or are a zero-padded
        /// extension of another, and for groups large enough for the radix passes.
        #[test]
        fn canonical_groups_are_sorted_by_whole_key_bytes(
            keys in proptest::collection::hash_set("(user-|a|\\x00){0,4}[0-9a]{0,3}", 0..700),
            wide in proptest::collection::hash_set(any::<u64>(), 0..400),
        ) {
            let mut strings: KeyMap<String, ValueCell<u32>> = KeyMap::default();
            for (i, key) in keys.iter().enumerate() {
                strings.insert(crate::keymap::memory_hash(key.stable_hash()), key, ValueCell(i as u32));
            }
            let mut numbers: KeyMap<u64, ValueCell<u32>> = KeyMap::default();
            for (i, key) in wide.iter().enumerate() {
                numbers.insert(crate::keymap::memory_hash(key.stable_hash()), key, ValueCell(i as u32));
            }
            prop_assert_eq!(canonical(&strings), reference(&strings));
            prop_assert_eq!(canonical(&numbers), reference(&numbers));
        }
    }

    fn canonical<K: Key, C: Cell>(map: &KeyMap<K, C>) -> Vec<u8> {
        let mut out = Vec::new();
        write_group(map, 0, "t", &mut out).unwrap();
        out
    }

    fn reference<K: Key, C: Cell>(map: &KeyMap<K, C>) -> Vec<u8> {
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = map
            .iter()
            .map(|(key, cell)| {
                let mut value = Vec::new();
                cell.encode(&mut value).unwrap();
                (postcard::to_allocvec(key).unwrap(), value)
            })
            .collect();
        entries.sort();
        postcard::to_allocvec(&entries).unwrap()
    }
}
