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
use crate::table::{Cell, write_entry, write_varint};
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
    let mut scratch = Vec::with_capacity(64);
    write_varint(out, removed.len() as u64);
    for key in removed {
        scratch.clear();
        scratch = postcard::to_extend(key, scratch).map_err(corrupt)?;
        write_varint(out, scratch.len() as u64);
        out.extend_from_slice(&scratch);
    }
    // The count goes first: the entries are encoded into a buffer and counted as they go.
    let mut entries = Vec::new();
    let mut count = 0u64;
    for (key, cell) in written {
        write_entry(key, cell, &mut scratch, &mut entries).map_err(corrupt)?;
        count += 1;
    }
    write_varint(out, count);
    out.extend_from_slice(&entries);
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
        /// (which makes the delta unknown, so the whole group is written instead).
        #[test]
        fn a_full_block_and_the_deltas_after_it_are_the_full_block_of_now(
            initial in proptest::collection::vec((0u64..300, any::<u32>()), 0..300),
            rounds in proptest::collection::vec(proptest::collection::vec((0u8..4, 0u64..300, any::<u32>()), 0..120), 1..4),
            grow in any::<bool>(),
        ) {
            // Room for every key, so deltas are known unless removals used the room up.
            let mut map: KeyMap<u64, ValueCell<u32>> = KeyMap::with_capacity(if grow { 0 } else { 1024 });
            for (key, value) in &initial {
                map.insert(memory_hash(key.stable_hash()), key, ValueCell(*value));
            }
            let start = full(&map);
            let mut deltas: Vec<Vec<u8>> = Vec::new();
            let mut chain_known = true;
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
                if write_group_delta(&map, 0, "t", &mut delta).unwrap() {
                    prop_assert!(map.changed_count().unwrap() >= delta_items(&delta));
                    deltas.push(delta);
                } else {
                    chain_known = false;
                }
            }
            if chain_known {
                let refs: Vec<&[u8]> = deltas.iter().map(Vec::as_slice).collect();
                prop_assert_eq!(apply_deltas(&start, &refs, "t", 0).unwrap(), full(&map));
            }
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
        // Empty: the first insertion grows the table.
        map.insert(memory_hash(1u64.stable_hash()), &1, ValueCell(1));
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
