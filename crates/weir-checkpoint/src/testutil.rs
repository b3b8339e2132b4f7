//! Test helpers: consistent random snapshots (metadata plus data files).

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use weir_types::compute_key_group_range_for_operator_index;

use crate::format::{
    DataFileWriter, FORMAT_VERSION, KeyedStateHandle, OperatorSnapshot, OperatorStateHandle, RedistributionMode,
    SnapshotKind, SnapshotMetadata, SubtaskSnapshot,
};
use crate::paths::data_file_name;

/// One operator of a generated snapshot.
#[derive(Clone, Debug)]
pub(crate) struct OperatorSpec {
    pub uid: String,
    pub parallelism: u32,
    pub keyed: bool,
    /// Number of keyed states (keyed operators only).
    pub keyed_states: u32,
    /// Drives which key groups are present, entry counts and element counts.
    pub seed: u64,
    /// When false every key group holds data.
    pub sparse: bool,
    pub split: bool,
    pub union: bool,
    pub broadcast: bool,
}

/// A generated snapshot.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotSpec {
    pub max_parallelism: u32,
    pub operators: Vec<OperatorSpec>,
}

impl SnapshotSpec {
    /// A small fixed snapshot: a source with all three operator-state modes, a keyed
    /// counter, a stateless sink.
    pub fn sample() -> SnapshotSpec {
        let operator = |uid: &str, parallelism, keyed, keyed_states, state: bool| OperatorSpec {
            uid: uid.to_string(),
            parallelism,
            keyed,
            keyed_states,
            seed: 42,
            sparse: false,
            split: state,
            union: state,
            broadcast: state,
        };
        SnapshotSpec {
            max_parallelism: 8,
            operators: vec![
                operator("source", 2, false, 0, true),
                operator("counter", 2, true, 1, false),
                operator("sink", 1, false, 0, false),
            ],
        }
    }
}

fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Builds the metadata and the data files (by relative name) of `spec`.
pub(crate) fn build_snapshot(spec: &SnapshotSpec) -> (SnapshotMetadata, BTreeMap<String, Bytes>) {
    let max_p = spec.max_parallelism;
    let mut files = BTreeMap::new();
    let mut operators = Vec::new();
    for (vertex, op) in spec.operators.iter().enumerate() {
        let mut counter = op.seed;
        let mut next = move || {
            counter = counter.wrapping_add(1);
            mix(counter)
        };
        let broadcast_count = next() % 3;
        let mut subtasks = Vec::new();
        for index in 0..op.parallelism {
            let mut writer = DataFileWriter::new();
            let range = op.keyed.then(|| compute_key_group_range_for_operator_index(max_p, op.parallelism, index));
            let mut keyed_states = Vec::new();
            if let Some(range) = range {
                for state in 0..op.keyed_states {
                    let mut key_groups = Vec::new();
                    for group in range.iter() {
                        if op.sparse && next() % 3 == 0 {
                            continue;
                        }
                        let bytes = format!("{}/state-{state}/kg-{group}", op.uid);
                        key_groups.push(writer.add_block(bytes.as_bytes(), Some(group), 1 + next() % 5));
                    }
                    keyed_states.push(KeyedStateHandle {
                        name: format!("state-{state}"),
                        kind: "value".into(),
                        value_type: "i64".into(),
                        key_groups,
                    });
                }
            }
            let mut operator_states = Vec::new();
            let elements = |writer: &mut DataFileWriter, label: &str, count: u64, same: bool| {
                (0..count)
                    .map(|element| {
                        let bytes = if same {
                            format!("{}/{label}/{element}", op.uid)
                        } else {
                            format!("{}/{label}/{index}/{element}", op.uid)
                        };
                        writer.add_block(bytes.as_bytes(), None, 1)
                    })
                    .collect::<Vec<_>>()
            };
            if op.split {
                let count = next() % 5;
                let elements = elements(&mut writer, "split", count, false);
                operator_states.push(OperatorStateHandle {
                    name: "split-state".into(),
                    mode: RedistributionMode::Split,
                    elements,
                });
            }
            if op.union {
                let count = next() % 4;
                let elements = elements(&mut writer, "union", count, false);
                operator_states.push(OperatorStateHandle {
                    name: "union-state".into(),
                    mode: RedistributionMode::Union,
                    elements,
                });
            }
            if op.broadcast {
                let elements = elements(&mut writer, "broadcast", broadcast_count, true);
                operator_states.push(OperatorStateHandle {
                    name: "broadcast-state".into(),
                    mode: RedistributionMode::Broadcast,
                    elements,
                });
            }
            let file = if writer.is_empty() {
                None
            } else {
                let name = data_file_name(vertex, index);
                files.insert(name.clone(), writer.finish());
                Some(name)
            };
            subtasks.push(SubtaskSnapshot {
                subtask: index,
                key_group_range: range,
                file,
                keyed_states,
                operator_states,
                finished: false,
                shared_files: Vec::new(),
            });
        }
        operators.push(OperatorSnapshot {
            uid: op.uid.clone(),
            name: format!("Operator {}", op.uid),
            parallelism: op.parallelism,
            key_type: op.keyed.then(|| "u64".to_string()),
            subtasks,
        });
    }
    let metadata = SnapshotMetadata {
        format_version: FORMAT_VERSION,
        kind: SnapshotKind::Savepoint,
        job_id: "0123456789abcdef0123456789abcdef".into(),
        job_name: "test job".into(),
        checkpoint_id: 7,
        timestamp_ms: 1_700_000_000_123,
        max_parallelism: max_p,
        operators,
        format: crate::format::SnapshotFormat::Canonical,
        state_backend: Some("hashmap".into()),
    };
    (metadata, files)
}

/// Random operator specs for a given max parallelism.
pub(crate) fn arb_operator(index: usize, max_p: u32) -> impl Strategy<Value = OperatorSpec> {
    (any::<u32>(), any::<bool>(), 0u32..=2, any::<u64>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
        .prop_map(move |(p_seed, keyed, keyed_states, seed, sparse, split, union, broadcast)| OperatorSpec {
            uid: format!("op-{index}"),
            parallelism: 1 + p_seed % max_p,
            keyed,
            keyed_states,
            seed,
            sparse,
            split,
            union,
            broadcast,
        })
}

/// Random snapshots: max parallelism 1..=40, one to three operators.
pub(crate) fn arb_spec() -> impl Strategy<Value = SnapshotSpec> {
    (1u32..=40, 1usize..=3).prop_flat_map(|(max_p, count)| {
        let operators: Vec<_> = (0..count).map(|index| arb_operator(index, max_p)).collect();
        operators.prop_map(move |operators| SnapshotSpec { max_parallelism: max_p, operators })
    })
}

/// Makes `metadata` an incremental checkpoint: each subtask with a data file names the shared
/// files `names(operator uid, subtask index)` instead, and all its blocks are in the first.
pub(crate) fn move_blocks_to_shared(metadata: &mut SnapshotMetadata, names: impl Fn(&str, usize) -> Vec<String>) {
    metadata.kind = crate::format::SnapshotKind::Checkpoint;
    for operator in &mut metadata.operators {
        for (index, subtask) in operator.subtasks.iter_mut().enumerate() {
            if subtask.file.take().is_some() {
                subtask.shared_files = names(&operator.uid, index);
                let blocks = subtask.keyed_states.iter_mut().flat_map(|k| k.key_groups.iter_mut());
                let elements = subtask.operator_states.iter_mut().flat_map(|o| o.elements.iter_mut());
                for block in blocks.chain(elements) {
                    block.shared_file = Some(0);
                }
            }
        }
    }
}

/// The encoded `_metadata` of an incremental checkpoint whose subtasks' blocks are all in
/// the shared files `names` (every subtask names all of them).
pub(crate) fn metadata_naming_shared(names: &[&str]) -> Vec<u8> {
    let (mut metadata, _files) = build_snapshot(&SnapshotSpec::sample());
    move_blocks_to_shared(&mut metadata, |_, _| names.iter().map(|n| n.to_string()).collect());
    crate::format::encode_metadata(&metadata).to_vec()
}
