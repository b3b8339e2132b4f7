//! Rewriting a snapshot to another max parallelism: what Flink needs the State Processor API
//! for, in one function.
//!
//! The max parallelism is the number of key groups; a job can never run wider than it, and a
//! restore keeps it. Rewriting moves every entry of every keyed state to the key group its
//! key's stable hash gives under the new number (`murmur3(key bytes) mod max`, the bytes the
//! snapshot stores) and to the subtask that owns that group. The format keeps each key's
//! canonical bytes, so nothing needs the key's or the value's Rust type. Operator state is
//! copied unchanged. The source is only read; the rewritten snapshot is a new directory whose
//! `_metadata` is written last.

use std::collections::BTreeMap;

use bytes::Bytes;
use weir_types::keygroups::{
    MAX_PARALLELISM_UPPER_BOUND, compute_key_group_range_for_operator_index, compute_operator_index_for_key_group,
    key_group_for_hash, murmur3_32,
};

use crate::format::{
    DataFileWriter, KeyedStateHandle, OperatorSnapshot, OperatorStateHandle, SnapshotMetadata, SubtaskSnapshot,
};
use crate::storage::{SnapshotStorage, StorageError};
use crate::{LoadError, load_metadata, read_blocks, write_metadata};

/// The keyed state kind whose entries hold timer timestamps rather than cell bytes.
const TIMERS_KIND: &str = "timers";

/// Why a snapshot could not be rewritten. The source is never changed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The new max parallelism is out of range or below an operator's parallelism.
    #[error("cannot rewrite {location} to max parallelism {requested}: {reason}")]
    BadMaxParallelism {
        /// The snapshot.
        location: String,
        /// The requested max parallelism.
        requested: u32,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The source could not be read or is not valid.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A keyed block does not decode as the format says.
    #[error("{location}: operator '{uid}' keyed state '{state}' key group {key_group} does not decode: {reason}")]
    Corrupt {
        /// The data file.
        location: String,
        /// The operator.
        uid: String,
        /// The state.
        state: String,
        /// The key group.
        key_group: u32,
        /// The decoding error.
        reason: String,
    },
    /// The source is a native snapshot: its layout belongs to its backend.
    #[error(
        "{location} is a native snapshot (of the {backend} backend); only canonical snapshots can be rewritten: take one with `weir savepoint --type canonical JOBID DIR` (or `weir stop --type canonical`) and rewrite that"
    )]
    Native {
        /// The snapshot.
        location: String,
        /// The backend that wrote it.
        backend: String,
    },
    /// The target already holds a snapshot.
    #[error("{location} already holds a snapshot; give a new directory")]
    TargetExists {
        /// The target.
        location: String,
    },
    /// Writing the target failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One entry of a keyed block: a key's canonical bytes and its cell.
enum Cell {
    Bytes(Vec<u8>),
    Timers(Vec<u64>),
}

/// A keyed state's entries bound for one new subtask, by new key group.
type Regrouped = BTreeMap<u32, Vec<(Vec<u8>, Cell)>>;

/// Decodes a keyed block into its entries.
fn decode_entries(bytes: &[u8], kind: &str) -> Result<Vec<(Vec<u8>, Cell)>, postcard::Error> {
    if kind == TIMERS_KIND {
        let entries: Vec<(Vec<u8>, Vec<u64>)> = postcard::from_bytes(bytes)?;
        return Ok(entries.into_iter().map(|(key, timers)| (key, Cell::Timers(timers))).collect());
    }
    let entries: Vec<(Vec<u8>, Vec<u8>)> = postcard::from_bytes(bytes)?;
    Ok(entries.into_iter().map(|(key, cell)| (key, Cell::Bytes(cell))).collect())
}

/// Encodes one key group's entries of a state of `kind`, sorted by key bytes, as the format says.
fn encode_entries(mut entries: Vec<(Vec<u8>, Cell)>, kind: &str) -> Result<Vec<u8>, postcard::Error> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if kind == TIMERS_KIND {
        let timers: Vec<(Vec<u8>, Vec<u64>)> = entries
            .into_iter()
            .filter_map(|(key, cell)| match cell {
                Cell::Timers(t) => Some((key, t)),
                Cell::Bytes(_) => None,
            })
            .collect();
        return postcard::to_allocvec(&timers);
    }
    let cells: Vec<(Vec<u8>, Vec<u8>)> = entries
        .into_iter()
        .filter_map(|(key, cell)| match cell {
            Cell::Bytes(b) => Some((key, b)),
            Cell::Timers(_) => None,
        })
        .collect();
    postcard::to_allocvec(&cells)
}

/// Checks that `new_max` can hold every operator of `metadata`.
fn check_max_parallelism(metadata: &SnapshotMetadata, location: &str, new_max: u32) -> Result<(), RewriteError> {
    let bad =
        |reason: String| RewriteError::BadMaxParallelism { location: location.to_string(), requested: new_max, reason };
    if new_max == 0 || new_max > MAX_PARALLELISM_UPPER_BOUND {
        return Err(bad(format!("it must be between 1 and {MAX_PARALLELISM_UPPER_BOUND}")));
    }
    if let Some(widest) = metadata.operators.iter().max_by_key(|o| o.parallelism)
        && widest.parallelism > new_max
    {
        return Err(bad(format!(
            "operator '{}' ran at parallelism {}, more than {new_max} key groups can serve; give at least {}",
            widest.uid, widest.parallelism, widest.parallelism
        )));
    }
    Ok(())
}

/// Rewrites the snapshot at `source` into the empty directory `target` with `new_max` key
/// groups; returns the new metadata. Operators keep their parallelism.
pub async fn rewrite_max_parallelism(
    source: &SnapshotStorage,
    target: &SnapshotStorage,
    new_max: u32,
) -> Result<SnapshotMetadata, RewriteError> {
    let metadata = load_metadata(source).await?;
    if !metadata.format.is_canonical() {
        return Err(RewriteError::Native {
            location: source.display().to_string(),
            backend: metadata.backend().to_string(),
        });
    }
    check_max_parallelism(&metadata, source.display(), new_max)?;
    if target.exists(crate::METADATA_FILE).await? {
        return Err(RewriteError::TargetExists { location: target.display().to_string() });
    }
    let mut operators = Vec::with_capacity(metadata.operators.len());
    for (operator_index, operator) in metadata.operators.iter().enumerate() {
        operators.push(rewrite_operator(source, target, operator_index, operator, new_max).await?);
    }
    let rewritten = SnapshotMetadata {
        format_version: crate::format::FORMAT_VERSION,
        max_parallelism: new_max,
        operators,
        ..metadata
    };
    crate::validate_metadata(&rewritten, target.display()).map_err(LoadError::from)?;
    write_metadata(target, &rewritten).await?;
    Ok(rewritten)
}

async fn rewrite_operator(
    source: &SnapshotStorage,
    target: &SnapshotStorage,
    operator_index: usize,
    operator: &OperatorSnapshot,
    new_max: u32,
) -> Result<OperatorSnapshot, RewriteError> {
    let p = operator.parallelism;
    let keyed = operator.key_type.is_some();
    // Keyed entries by state name, then new subtask, then new key group; the state's kind and
    // value type in the order states first appear.
    let mut states: Vec<(String, String, String)> = Vec::new();
    let mut regrouped: BTreeMap<String, Vec<Regrouped>> = BTreeMap::new();
    // Operator state elements per old subtask, copied as they are.
    let mut elements: Vec<Vec<(OperatorStateHandle, Vec<Bytes>)>> = Vec::with_capacity(p as usize);
    for subtask in &operator.subtasks {
        let mut copied = Vec::new();
        let Some(file) = &subtask.file else {
            elements.push(copied);
            continue;
        };
        let location = source.location(file);
        for state in &subtask.keyed_states {
            if !states.iter().any(|(name, _, _)| *name == state.name) {
                states.push((state.name.clone(), state.kind.clone(), state.value_type.clone()));
            }
            let per_subtask =
                regrouped.entry(state.name.clone()).or_insert_with(|| (0..p).map(|_| BTreeMap::new()).collect());
            let blocks = read_blocks(source, file, &state.key_groups).await?;
            for (block, bytes) in state.key_groups.iter().zip(blocks) {
                let entries = decode_entries(&bytes, &state.kind).map_err(|e| RewriteError::Corrupt {
                    location: location.clone(),
                    uid: operator.uid.clone(),
                    state: state.name.clone(),
                    key_group: block.key_group.unwrap_or_default(),
                    reason: e.to_string(),
                })?;
                for (key, cell) in entries {
                    let group = key_group_for_hash(murmur3_32(&key), new_max);
                    let owner = compute_operator_index_for_key_group(new_max, p, group) as usize;
                    per_subtask[owner].entry(group).or_default().push((key, cell));
                }
            }
        }
        for state in &subtask.operator_states {
            let blocks = read_blocks(source, file, &state.elements).await?;
            copied.push((state.clone(), blocks));
        }
        elements.push(copied);
    }
    let mut subtasks = Vec::with_capacity(p as usize);
    for index in 0..p {
        let mut writer = DataFileWriter::new();
        let mut keyed_states = Vec::new();
        for (name, kind, value_type) in &states {
            let Some(groups) = regrouped.get_mut(name).map(|per| std::mem::take(&mut per[index as usize])) else {
                continue;
            };
            let mut key_groups = Vec::with_capacity(groups.len());
            for (group, entries) in groups {
                let count = entries.len() as u64;
                let bytes = encode_entries(entries, kind).map_err(|e| RewriteError::Corrupt {
                    location: target.display().to_string(),
                    uid: operator.uid.clone(),
                    state: name.clone(),
                    key_group: group,
                    reason: e.to_string(),
                })?;
                key_groups.push(writer.add_block(&bytes, Some(group), count));
            }
            keyed_states.push(KeyedStateHandle {
                name: name.clone(),
                kind: kind.clone(),
                value_type: value_type.clone(),
                key_groups,
            });
        }
        let mut operator_states = Vec::new();
        for (state, blocks) in elements.get_mut(index as usize).map(std::mem::take).unwrap_or_default() {
            let refs = state
                .elements
                .iter()
                .zip(&blocks)
                .map(|(old, bytes)| writer.add_block(bytes, None, old.entries))
                .collect();
            operator_states.push(OperatorStateHandle { name: state.name, mode: state.mode, elements: refs });
        }
        let file = if writer.is_empty() {
            None
        } else {
            let name = format!("rewritten-{operator_index}-{index}.state");
            target.put(&name, writer.finish()).await?;
            Some(name)
        };
        subtasks.push(SubtaskSnapshot {
            subtask: index,
            key_group_range: keyed.then(|| compute_key_group_range_for_operator_index(new_max, p, index)),
            file,
            keyed_states,
            operator_states,
            finished: operator.subtasks.get(index as usize).is_some_and(|old| old.finished),
            shared_files: Vec::new(),
        });
    }
    Ok(OperatorSnapshot { subtasks, ..operator.clone() })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_types::keygroups::assign_to_key_group;

    use super::*;
    use crate::format::{FORMAT_VERSION, RedistributionMode, SnapshotKind};

    /// A key's canonical bytes and its cell's bytes.
    type Entry = (Vec<u8>, Vec<u8>);

    /// A snapshot of a keyed counter (`count` per u64 key, p=2) and a source with one split
    /// state element per subtask, under `max` key groups, written to `storage`.
    fn write_snapshot(storage: &SnapshotStorage, keys: &[u64], max: u32) -> SnapshotMetadata {
        let p = 2;
        let mut counter_subtasks = Vec::new();
        let mut source_subtasks = Vec::new();
        for subtask in 0..p {
            let range = compute_key_group_range_for_operator_index(max, p, subtask);
            let mut groups: BTreeMap<u32, Vec<Entry>> = BTreeMap::new();
            for key in keys {
                let group = assign_to_key_group(key, max);
                if range.contains(group) {
                    let value = postcard::to_allocvec(&(key * 10)).unwrap();
                    groups.entry(group).or_default().push((postcard::to_allocvec(key).unwrap(), value));
                }
            }
            let mut writer = DataFileWriter::new();
            let mut blocks = Vec::new();
            for (group, mut entries) in groups {
                entries.sort();
                let count = entries.len() as u64;
                blocks.push(writer.add_block(&postcard::to_allocvec(&entries).unwrap(), Some(group), count));
            }
            let file = format!("task-1-{subtask}.state");
            storage.blocking().put(&file, writer.finish()).unwrap();
            counter_subtasks.push(SubtaskSnapshot {
                subtask,
                key_group_range: Some(range),
                file: Some(file),
                keyed_states: vec![KeyedStateHandle {
                    name: "count".into(),
                    kind: "value".into(),
                    value_type: "u64".into(),
                    key_groups: blocks,
                }],
                operator_states: Vec::new(),
                finished: false,
                shared_files: Vec::new(),
            });
            let mut writer = DataFileWriter::new();
            let element = writer.add_block(format!("position of {subtask}").as_bytes(), None, 1);
            let file = format!("task-0-{subtask}.state");
            storage.blocking().put(&file, writer.finish()).unwrap();
            source_subtasks.push(SubtaskSnapshot {
                subtask,
                key_group_range: None,
                file: Some(file),
                keyed_states: Vec::new(),
                operator_states: vec![OperatorStateHandle {
                    name: "source-positions".into(),
                    mode: RedistributionMode::Split,
                    elements: vec![element],
                }],
                finished: false,
                shared_files: Vec::new(),
            });
        }
        let metadata = SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind: SnapshotKind::Savepoint,
            job_id: "00000000000000000000000000000001".into(),
            job_name: "rewrite".into(),
            checkpoint_id: 7,
            timestamp_ms: 1,
            max_parallelism: max,
            operators: vec![
                OperatorSnapshot {
                    uid: "source".into(),
                    name: "source".into(),
                    parallelism: p,
                    key_type: None,
                    subtasks: source_subtasks,
                },
                OperatorSnapshot {
                    uid: "counter".into(),
                    name: "counter".into(),
                    parallelism: p,
                    key_type: Some("u64".into()),
                    subtasks: counter_subtasks,
                },
            ],
            format: crate::format::SnapshotFormat::Canonical,
            state_backend: None,
        };
        storage.blocking().block_on(write_metadata(storage, &metadata)).unwrap();
        metadata
    }

    #[test]
    fn every_key_moves_to_its_group_under_the_new_max_parallelism_with_its_value() {
        let source = SnapshotStorage::from_url("memory://rewrite-test/source").unwrap();
        let target = SnapshotStorage::from_url("memory://rewrite-test/target").unwrap();
        let keys: Vec<u64> = (0..500).map(|i| i * 7919).collect();
        write_snapshot(&source, &keys, 8);
        let blocking = source.blocking();
        let rewritten = blocking.block_on(rewrite_max_parallelism(&source, &target, 64)).unwrap();
        assert_eq!(rewritten.max_parallelism, 64);
        let reloaded = blocking.block_on(load_metadata(&target)).unwrap();
        assert_eq!(reloaded, rewritten, "the written _metadata is the one returned");

        let mut found = BTreeMap::new();
        let counter = &reloaded.operators[1];
        for subtask in &counter.subtasks {
            let range = subtask.key_group_range.unwrap();
            assert_eq!(range, compute_key_group_range_for_operator_index(64, 2, subtask.subtask));
            let state = &subtask.keyed_states[0];
            let file = subtask.file.as_ref().unwrap();
            let blocks = blocking.block_on(read_blocks(&target, file, &state.key_groups)).unwrap();
            for (block, bytes) in state.key_groups.iter().zip(blocks) {
                let entries: Vec<(Vec<u8>, Vec<u8>)> = postcard::from_bytes(&bytes).unwrap();
                assert_eq!(block.entries, entries.len() as u64);
                assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "entries sorted by key bytes");
                for (key, value) in entries {
                    let key: u64 = postcard::from_bytes(&key).unwrap();
                    let value: u64 = postcard::from_bytes(&value).unwrap();
                    assert_eq!(block.key_group, Some(assign_to_key_group(&key, 64)), "key {key}");
                    assert!(range.contains(assign_to_key_group(&key, 64)));
                    found.insert(key, value);
                }
            }
        }
        let expected: BTreeMap<u64, u64> = keys.iter().map(|k| (*k, k * 10)).collect();
        assert_eq!(found, expected, "every key once, with its value");
        // Operator state is copied subtask by subtask.
        let source_op = &reloaded.operators[0];
        for subtask in &source_op.subtasks {
            let handle = &subtask.operator_states[0];
            let bytes =
                blocking.block_on(read_blocks(&target, subtask.file.as_ref().unwrap(), &handle.elements)).unwrap();
            assert_eq!(&bytes[0][..], format!("position of {}", subtask.subtask).as_bytes());
        }
        // A second rewrite into the same target is refused; the source is untouched.
        assert!(matches!(
            blocking.block_on(rewrite_max_parallelism(&source, &target, 32)),
            Err(RewriteError::TargetExists { .. })
        ));
        assert_eq!(blocking.block_on(load_metadata(&source)).unwrap().max_parallelism, 8);
    }

    #[test]
    fn a_max_parallelism_below_an_operators_parallelism_is_refused() {
        let source = SnapshotStorage::from_url("memory://rewrite-test-2/source").unwrap();
        let target = SnapshotStorage::from_url("memory://rewrite-test-2/target").unwrap();
        write_snapshot(&source, &[1, 2, 3], 8);
        let error = source.blocking().block_on(rewrite_max_parallelism(&source, &target, 1)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("ran at parallelism 2") && message.contains("give at least 2"), "{message}");
        let error = source.blocking().block_on(rewrite_max_parallelism(&source, &target, 40_000)).unwrap_err();
        assert!(error.to_string().contains("between 1 and 32768"), "{error}");
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A valid keyed block (cells or timers), mutated: decoding is an error or entries,
        /// never a panic or an allocation of a claimed length.
        #[test]
        fn mutated_keyed_blocks_decode_or_fail_cleanly(
            entries in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..12), proptest::collection::vec(any::<u64>(), 0..4)), 0..8),
            timers in any::<bool>(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let kind = if timers { TIMERS_KIND } else { "value" };
            let cells = entries.into_iter().map(|(key, values)| {
                let cell = if timers { Cell::Timers(values) } else { Cell::Bytes(postcard::to_allocvec(&values).unwrap()) };
                (key, cell)
            }).collect();
            let valid = encode_entries(cells, kind).unwrap();
            let bytes = weir_types::fuzzing::mutate(&valid, &mutations);
            let decoded = weir_types::fuzzing::with_allocation_cap(64 << 20, || decode_entries(&bytes, kind).map(|e| e.len()));
            prop_assert!(decoded.is_ok(), "decoding asked for {:?} bytes at once", decoded.err());
        }
    }
}
