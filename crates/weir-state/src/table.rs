//! A state table: one declared state's entries, one hash map per key group.

use std::any::Any;
use std::hash::Hash;

use serde::Serialize;
use serde::de::DeserializeOwned;
use weir_types::key::with_canonical_bytes;
use weir_types::keygroups::{key_group_for_hash, murmur3_32};
use weir_types::{Key, KeyGroupRange};

use crate::FastMap;
use crate::error::StateError;
use crate::handles::StateKind;
use crate::keymap::KeyMap;

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
    /// A copy for a checkpoint, serialized later on another thread.
    fn snapshot(&self) -> Box<dyn TableSnapshot>;
    /// Restored bytes not yet claimed by a handle, if this is such a table.
    fn as_restored(&self) -> Option<&RestoredTable> {
        None
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
    /// Serializes one key group's entries in canonical order.
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError>;
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
        self.key_groups.values().map(|(_, entries)| *entries as usize).sum()
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
    fn snapshot(&self) -> Box<dyn TableSnapshot> {
        Box::new(self.clone())
    }
    fn as_restored(&self) -> Option<&RestoredTable> {
        Some(self)
    }
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

/// Appends `value` as an unsigned LEB128 varint, postcard's integer and length encoding.
fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// How a table's cells become canonical bytes and back.
pub trait Cell: Clone + Send + 'static {
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

impl<V: Serialize + DeserializeOwned + Clone + Send + 'static> Cell for ValueCell<V> {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        postcard::to_io(&self.0, out).map(|_| ())
    }
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes).map(ValueCell)
    }
}

impl<V: Serialize + DeserializeOwned + Clone + Send + 'static> Cell for ListCell<V> {
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), postcard::Error> {
        postcard::to_io(&self.0, out).map(|_| ())
    }
    fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes).map(ListCell)
    }
}

impl<UK, UV> Cell for MapCell<UK, UV>
where
    UK: Serialize + DeserializeOwned + Eq + Hash + Clone + Send + 'static,
    UV: Serialize + DeserializeOwned + Clone + Send + 'static,
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
#[derive(Clone)]
pub struct Table<K, C> {
    name: String,
    kind: StateKind,
    range: KeyGroupRange,
    groups: Vec<KeyMap<K, C>>,
}

impl<K: Key, C> Table<K, C> {
    /// An empty table for `range`.
    pub fn new(name: &str, kind: StateKind, range: KeyGroupRange) -> Table<K, C> {
        let mut groups = Vec::with_capacity(range.len() as usize);
        for _ in 0..range.len() {
            groups.push(KeyMap::default());
        }
        Table { name: name.to_string(), kind, range, groups }
    }

    /// The map of one key group, by its index within the range.
    #[inline]
    pub fn group_mut(&mut self, group_index: usize) -> &mut KeyMap<K, C> {
        &mut self.groups[group_index]
    }

    /// The map of one key group, by its index within the range.
    #[inline]
    pub fn group(&self, group_index: usize) -> &KeyMap<K, C> {
        &self.groups[group_index]
    }

    /// Every key group's map, in key-group order.
    pub fn groups(&self) -> &[KeyMap<K, C>] {
        &self.groups
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
        let corrupt = |reason: String| StateError::Corrupt { name: self.name.clone(), key_group, reason };
        let entries: Vec<(&[u8], &[u8])> =
            postcard::from_bytes(bytes).map_err(|e| corrupt(format!("cannot decode entries: {e}")))?;
        if expected_entries > 0 && entries.len() as u64 != expected_entries {
            return Err(corrupt(format!(
                "the snapshot records {expected_entries} entries but the block holds {}",
                entries.len()
            )));
        }
        let mut map = KeyMap::with_capacity(entries.len());
        for (key_bytes, cell_bytes) in entries {
            let owner = key_group_for_hash(murmur3_32(key_bytes), max_parallelism);
            if owner != key_group {
                return Err(corrupt(format!("a key of key group {owner} is stored in key group {key_group}")));
            }
            let key: K = postcard::from_bytes(key_bytes).map_err(|e| corrupt(format!("cannot decode a key: {e}")))?;
            let cell = C::decode(cell_bytes).map_err(|e| corrupt(format!("cannot decode a value: {e}")))?;
            map.insert_owned(key, cell);
        }
        self.groups[index] = map;
        Ok(())
    }

    fn index_of(&self, key_group: u32) -> Result<usize, StateError> {
        if !self.range.contains(key_group) {
            return Err(StateError::KeyGroupOutOfRange { key_group, range: self.range.to_string() });
        }
        Ok((key_group - self.range.start) as usize)
    }
}

impl<K: Key, C: Cell> StateTable<K> for Table<K, C> {
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
        self.groups.iter().map(KeyMap::len).sum()
    }

    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        let corrupt = |e: postcard::Error| StateError::Corrupt {
            name: self.name.clone(),
            key_group,
            reason: format!("cannot encode: {e}"),
        };
        // Encode every entry into one buffer (no allocation per entry), sort by key bytes,
        // then emit postcard's encoding of Vec<(Vec<u8>, Vec<u8>)>: the canonical form.
        let group = &self.groups[index];
        let mut buffer = Vec::with_capacity(group.len() * 16);
        let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(group.len());
        for (key, cell) in group.iter() {
            let start = buffer.len();
            buffer = postcard::to_extend(key, buffer).map_err(corrupt)?;
            let key_end = buffer.len();
            cell.encode(&mut buffer).map_err(corrupt)?;
            spans.push((start, key_end, buffer.len()));
        }
        spans.sort_unstable_by(|a, b| buffer[a.0..a.1].cmp(&buffer[b.0..b.1]));
        out.reserve(buffer.len() + spans.len() * 4 + 10);
        write_varint(out, spans.len() as u64);
        for (start, key_end, end) in spans {
            write_varint(out, (key_end - start) as u64);
            out.extend_from_slice(&buffer[start..key_end]);
            write_varint(out, (end - key_end) as u64);
            out.extend_from_slice(&buffer[key_end..end]);
        }
        Ok(())
    }

    fn read_key_group(&mut self, key_group: u32, bytes: &[u8]) -> Result<(), StateError> {
        let index = self.index_of(key_group)?;
        let corrupt = |what: &str, e: postcard::Error| StateError::Corrupt {
            name: self.name.clone(),
            key_group,
            reason: format!("cannot decode {what}: {e}"),
        };
        // Borrowed slices: no allocation per entry while decoding.
        let entries: Vec<(&[u8], &[u8])> = postcard::from_bytes(bytes).map_err(|e| corrupt("entries", e))?;
        let mut map = KeyMap::with_capacity(entries.len());
        for (key_bytes, cell_bytes) in entries {
            let key: K = postcard::from_bytes(key_bytes).map_err(|e| corrupt("a key", e))?;
            let cell = C::decode(cell_bytes).map_err(|e| corrupt("a value", e))?;
            map.insert_owned(key, cell);
        }
        self.groups[index] = map;
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn snapshot(&self) -> Box<dyn TableSnapshot> {
        Box::new(self.clone())
    }
}

impl<K: Key, C: Cell> TableSnapshot for Table<K, C> {
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
        match self.index_of(key_group) {
            Ok(index) => self.groups[index].len() as u64,
            Err(_) => 0,
        }
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        StateTable::write_key_group(self, key_group, out)
    }
}
