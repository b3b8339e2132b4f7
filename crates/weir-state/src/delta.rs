//! Entry deltas of a key group: what an incremental checkpoint writes for a key group of
//! which few entries changed since the previous checkpoint, and how a restore applies a
//! chain of them.
//!
//! A delta block is postcard's encoding of `(Vec<Vec<u8>>, Vec<(Vec<u8>, Vec<u8>)>)`: the
//! key bytes of the keys removed, then the entries written (key bytes, cell bytes), in no
//! particular order. Applied over the entries of the key group before it (a full block, or
//! a full block and the deltas after it), removals first: a key removed and written again
//! is in both lists.

use crate::error::StateError;
use crate::keymap::KeyMap;
use crate::table::{Cell, write_entry, write_prefixed, write_varint};
use weir_types::Key;

/// Writes the changes of `map` since it started tracking them as a delta block into `out`;
/// `false` (nothing written) when they are not known.
pub(crate) fn write_group_delta<K: Key, C: Cell>(
    map: &KeyMap<K, C>,
    key_group: u32,
    name: &str,
    out: &mut Vec<u8>,
) -> Result<bool, StateError> {
    let corrupt = |e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot encode: {e}"),
    };
    let Some((written, removed)) = map.changed() else { return Ok(false) };
    write_varint(out, removed.len() as u64);
    for key in removed {
        write_prefixed(out, |out| postcard::to_io(key, out).map(|_| ())).map_err(corrupt)?;
    }
    // The count goes first: the entries are encoded into a buffer and counted as they go.
    let mut entries = Vec::new();
    let mut count = 0u64;
    for (key, cell) in written {
        write_entry(key, cell, &mut entries).map_err(corrupt)?;
        count += 1;
    }
    write_varint(out, count);
    out.extend_from_slice(&entries);
    Ok(true)
}

/// What a `fjall` key group wrote to its store since the first access after the last
/// snapshot, in order: each eviction of the group's cache appends the entries the cache had
/// written and the keys it had removed. With the cache's own changes after it, the log names
/// every key changed since that snapshot, each with its value at the last change (or as
/// removed): an entry delta once [`write_delta`] keeps each key's last change.
///
/// Records: `0, key` (removed) or `1, key, value`, lengths as varints.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChangeLog {
    bytes: Vec<u8>,
    changes: u64,
}

impl ChangeLog {
    /// Changes recorded (a key changed twice counts twice).
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Bytes the log holds.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) {
        self.bytes.push(1);
        write_varint(&mut self.bytes, key.len() as u64);
        self.bytes.extend_from_slice(key);
        write_varint(&mut self.bytes, value.len() as u64);
        self.bytes.extend_from_slice(value);
        self.changes += 1;
    }

    pub(crate) fn remove(&mut self, key: &[u8]) {
        self.bytes.push(0);
        write_varint(&mut self.bytes, key.len() as u64);
        self.bytes.extend_from_slice(key);
        self.changes += 1;
    }

    /// Appends what `map` names as changed since it started tracking (removals first: a key
    /// removed and written again is written); `false`, appending nothing, when the map does
    /// not know.
    pub(crate) fn append_map<K: Key, C: Cell>(
        &mut self,
        map: &KeyMap<K, C>,
        key_group: u32,
        name: &str,
    ) -> Result<bool, StateError> {
        let corrupt = |e: postcard::Error| StateError::Corrupt {
            name: name.to_string(),
            key_group,
            reason: format!("cannot encode: {e}"),
        };
        let Some((written, removed)) = map.changed() else { return Ok(false) };
        let mut key_bytes = Vec::with_capacity(32);
        let mut value = Vec::with_capacity(32);
        for key in removed {
            key_bytes.clear();
            key_bytes = postcard::to_extend(key, key_bytes).map_err(corrupt)?;
            self.remove(&key_bytes);
        }
        for (key, cell) in written {
            key_bytes.clear();
            key_bytes = postcard::to_extend(key, key_bytes).map_err(corrupt)?;
            value.clear();
            cell.encode(&mut value).map_err(corrupt)?;
            self.put(&key_bytes, &value);
        }
        Ok(true)
    }

    /// The records, in order: (key, `None` removed or `Some(value)`).
    fn records(&self) -> impl Iterator<Item = Option<(&[u8], Option<&[u8]>)>> + '_ {
        let mut at = 0usize;
        std::iter::from_fn(move || {
            if at >= self.bytes.len() {
                return None;
            }
            let record = read_record(&self.bytes, &mut at);
            if record.is_none() {
                at = self.bytes.len();
            }
            Some(record)
        })
    }
}

fn read_bytes<'a>(bytes: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let (length, used) = read_varint(bytes.get(*at..)?)?;
    let start = at.checked_add(used)?;
    let end = start.checked_add(usize::try_from(length).ok()?)?;
    let slice = bytes.get(start..end)?;
    *at = end;
    Some(slice)
}

fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f).checked_shl(7 * i as u32)?;
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

fn read_record<'a>(bytes: &'a [u8], at: &mut usize) -> Option<(&'a [u8], Option<&'a [u8]>)> {
    let tag = *bytes.get(*at)?;
    *at += 1;
    let key = read_bytes(bytes, at)?;
    match tag {
        0 => Some((key, None)),
        1 => Some((key, Some(read_bytes(bytes, at)?))),
        _ => None,
    }
}

/// Each key's last change in `logs`, in order.
fn last_changes<'a>(
    logs: &[&'a ChangeLog],
    name: &str,
    key_group: u32,
) -> Result<std::collections::BTreeMap<&'a [u8], Option<&'a [u8]>>, StateError> {
    let mut last = std::collections::BTreeMap::new();
    for log in logs {
        for record in log.records() {
            let (key, value) = record.ok_or_else(|| StateError::Corrupt {
                name: name.to_string(),
                key_group,
                reason: "a change log of the fjall backend does not decode (a bug: please report it)".into(),
            })?;
            last.insert(key, value);
        }
    }
    Ok(last)
}

impl ChangeLog {
    /// Keeps each key's last change only (evictions of a group log a key each time it
    /// changed in between).
    pub(crate) fn compact(&mut self, name: &str, key_group: u32) -> Result<(), StateError> {
        let mut compacted = ChangeLog::default();
        for (key, value) in last_changes(&[self], name, key_group)? {
            match value {
                Some(value) => compacted.put(key, value),
                None => compacted.remove(key),
            }
        }
        *self = compacted;
        Ok(())
    }
}

/// Writes the entry delta of `logs`, in order (each key's last change wins), into `out`:
/// the removed keys and the written entries, sorted by key bytes. `false`, writing nothing,
/// when more than `at_most` keys changed.
pub(crate) fn write_delta(
    logs: &[&ChangeLog],
    at_most: u64,
    out: &mut Vec<u8>,
    name: &str,
    key_group: u32,
) -> Result<bool, StateError> {
    let last = last_changes(logs, name, key_group)?;
    if last.len() as u64 > at_most {
        return Ok(false);
    }
    let removed = last.values().filter(|value| value.is_none()).count();
    write_varint(out, removed as u64);
    for (key, _) in last.iter().filter(|(_, value)| value.is_none()) {
        write_varint(out, key.len() as u64);
        out.extend_from_slice(key);
    }
    write_varint(out, (last.len() - removed) as u64);
    for (key, value) in &last {
        if let Some(value) = value {
            write_varint(out, key.len() as u64);
            out.extend_from_slice(key);
            write_varint(out, value.len() as u64);
            out.extend_from_slice(value);
        }
    }
    Ok(true)
}

/// A delta block decoded: the keys removed and the entries written.
type DecodedDelta<'a> = (Vec<&'a [u8]>, Vec<(&'a [u8], &'a [u8])>);

/// The entries of a key group whose full block is `full` (native or canonical) after the
/// delta blocks `deltas`, in order: canonical bytes (sorted by key bytes), as a full block.
pub fn apply_deltas(full: &[u8], deltas: &[&[u8]], name: &str, key_group: u32) -> Result<Vec<u8>, StateError> {
    let corrupt = |what: &str, e: postcard::Error| StateError::Corrupt {
        name: name.to_string(),
        key_group,
        reason: format!("cannot decode {what}: {e}"),
    };
    let base: Vec<(&[u8], &[u8])> = postcard::from_bytes(full).map_err(|e| corrupt("entries", e))?;
    let mut entries: std::collections::BTreeMap<&[u8], &[u8]> = base.into_iter().collect();
    for delta in deltas {
        let (removed, written): DecodedDelta<'_> =
            postcard::from_bytes(delta).map_err(|e| corrupt("an entry delta", e))?;
        for key in removed {
            entries.remove(key);
        }
        entries.extend(written);
    }
    let mut out = Vec::with_capacity(full.len() + deltas.iter().map(|d| d.len()).sum::<usize>());
    write_varint(&mut out, entries.len() as u64);
    for (key, cell) in entries {
        write_varint(&mut out, key.len() as u64);
        out.extend_from_slice(key);
        write_varint(&mut out, cell.len() as u64);
        out.extend_from_slice(cell);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keymap::memory_hash;
    use crate::table::{ValueCell, write_group};
    use proptest::prelude::*;

    fn full(map: &KeyMap<u64, ValueCell<u32>>) -> Vec<u8> {
        let mut out = Vec::new();
        write_group(map, 0, "t", &mut out).unwrap();
        out
    }

    proptest! {
        /// A map's full block before some writes, with the delta of those writes applied,
        /// is the full block after them: also across removals, re-insertions, and growth
        /// (the marks move with the entries).
        #[test]
        fn a_full_block_and_the_deltas_after_it_are_the_full_block_of_now(
            initial in proptest::collection::vec((0u64..300, any::<u32>()), 0..300),
            rounds in proptest::collection::vec(proptest::collection::vec((0u8..4, 0u64..300, any::<u32>()), 0..120), 1..4),
            grow in any::<bool>(),
        ) {
            // With room for every key, or growing from empty.
            let mut map: KeyMap<u64, ValueCell<u32>> = KeyMap::with_capacity(if grow { 0 } else { 1024 });
            for (key, value) in &initial {
                map.insert(memory_hash(key.stable_hash()), key, ValueCell(*value));
            }
            let start = full(&map);
            let mut deltas: Vec<Vec<u8>> = Vec::new();
            for ops in rounds {
                map.track_changes();
                for (op, key, value) in ops {
                    let hash = memory_hash(key.stable_hash());
                    match op {
                        0 => map.insert(hash, &key, ValueCell(value)),
                        1 => { map.remove(hash, &key); }
                        2 => { map.get_or_insert_with(hash, &key, || ValueCell(value)).0 ^= 1; }
                        _ => { if let Some(cell) = map.get_mut(hash, &key) { cell.0 = cell.0.wrapping_add(1); } }
                    }
                }
                let mut delta = Vec::new();
                prop_assert!(write_group_delta(&map, 0, "t", &mut delta).unwrap(), "growth lost the changes");
                prop_assert!(map.changed_count().unwrap() >= delta_items(&delta));
                deltas.push(delta);
            }
            let refs: Vec<&[u8]> = deltas.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(apply_deltas(&start, &refs, "t", 0).unwrap(), full(&map));
        }
    }

    proptest! {
        /// A mutated delta (or full block under it) applies or fails with an error, never
        /// a panic or an allocation of a claimed length.
        #[test]
        fn mutated_deltas_apply_or_fail_cleanly(
            keys in proptest::collection::vec(0u64..500, 1..200),
            changed in proptest::collection::vec(0u64..500, 1..40),
            mutate_full in any::<bool>(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let mut map: KeyMap<u64, ValueCell<u32>> = KeyMap::with_capacity(1024);
            for key in &keys {
                map.insert(memory_hash(key.stable_hash()), key, ValueCell(*key as u32));
            }
            let mut base = full(&map);
            map.track_changes();
            for key in &changed {
                let hash = memory_hash(key.stable_hash());
                if key % 3 == 0 { map.remove(hash, key); } else { map.insert(hash, key, ValueCell(7)); }
            }
            let mut delta = Vec::new();
            prop_assert!(write_group_delta(&map, 0, "t", &mut delta).unwrap());
            if mutate_full {
                base = weir_types::fuzzing::mutate(&base, &mutations);
            } else {
                delta = weir_types::fuzzing::mutate(&delta, &mutations);
            }
            let applied = weir_types::fuzzing::with_allocation_cap(64 << 20, || {
                apply_deltas(&base, &[&delta], "t", 0).map(|bytes| bytes.len())
            });
            prop_assert!(applied.is_ok(), "applying asked for {:?} bytes at once", applied.err());
        }
    }

    fn delta_items(delta: &[u8]) -> usize {
        let (removed, written): DecodedDelta<'_> = postcard::from_bytes(delta).unwrap();
        removed.len() + written.len()
    }

    #[test]
    fn an_untracked_or_reorganized_map_has_no_delta() {
        let mut map: KeyMap<u64, ValueCell<u32>> = KeyMap::default();
        let mut out = Vec::new();
        assert!(!write_group_delta(&map, 0, "t", &mut out).unwrap());
        map.track_changes();
        // A restore's insertion reorganizes what the map knows.
        map.insert_owned(1, ValueCell(1));
        assert!(!write_group_delta(&map, 0, "t", &mut out).unwrap());
        map.track_changes();
        map.insert(memory_hash(1u64.stable_hash()), &1, ValueCell(2));
        assert!(write_group_delta(&map, 0, "t", &mut out).unwrap());
        assert_eq!(delta_items(&out), 1);
    }

    #[test]
    fn a_corrupt_delta_is_an_error_naming_the_state_and_key_group() {
        let map: KeyMap<u64, ValueCell<u32>> = KeyMap::default();
        let error = apply_deltas(&full(&map), &[&[5, 1]], "counts", 7).unwrap_err().to_string();
        assert!(error.contains("counts") && error.contains('7') && error.contains("entry delta"), "{error}");
    }
}
