//! Restore planning: which subtask of the new job reads which blocks of a snapshot (pure, no I/O).
//!
//! The rules are Flink's (`StateAssignmentOperation`, `RoundRobinOperatorStateRepartitioner`):
//!
//! - **Max parallelism** is fixed by the snapshot. A job that does not set it adopts the
//!   snapshot's; a job that sets a different one is refused. No operator may have a
//!   parallelism above it.
//! - **Operators are matched by uid.** A snapshot operator with state whose uid is not in the
//!   new job is refused unless non-restored state is allowed (then its state is dropped and
//!   listed in [`RestorePlan::non_restored`]); operators without state never block a restore.
//! - **Keyed state** moves in whole key groups: new subtask `i` reads, for every keyed state of
//!   the operator, every key-group block whose group lies in its new range
//!   (`compute_key_group_range_for_operator_index(maxP, newP, i)`), in ascending group order.
//! - **Operator state**, per state name, by mode:
//!   - `split`: the elements of all old subtasks, concatenated in subtask order, are divided
//!     into contiguous runs, the first `total % newP` subtasks getting one more (Flink's even
//!     split). When the parallelism is unchanged each subtask keeps exactly its old elements,
//!     as Flink does.
//!   - `union`: every new subtask gets every element of every old subtask.
//!   - `broadcast`: every new subtask gets old subtask 0's copy (all copies are identical).
//!
//! Every new subtask of a restored operator is told about every state name of the old
//! operator, even when it receives no block for it, so it can declare the state. An operator
//! that is not in the snapshot is not in the plan at all: it starts exactly as in a fresh job
//! (a new source reads from its beginning).
//!
//! **Finished operators** (Flink's FLIP-147): a snapshot records which subtasks' input had
//! ended before the barrier. A new subtask restores as *finished* (no input, no end-of-input
//! output: it emitted that before) when its operator was fully finished, or when the
//! parallelism is unchanged and its own old subtask was. A fully finished operator whose
//! input is new or was still running is refused: records would reach an operator that
//! already ended.

use std::collections::{BTreeMap, BTreeSet};

use weir_types::compute_key_group_range_for_operator_index;

use crate::format::{BlockRef, FormatError, OperatorSnapshot, RedistributionMode, SnapshotMetadata, validate_metadata};

/// A block and the data file (relative to the snapshot directory) that holds it.
pub type FileBlock = (String, BlockRef);

/// One keyed state for a new subtask: (state name, kind, value type, blocks in ascending key-group order).
pub type KeyedStateRestore = (String, String, String, Vec<FileBlock>);

/// One operator state for a new subtask: (state name, mode, elements in order).
pub type OperatorStateRestore = (String, RedistributionMode, Vec<FileBlock>);

/// An operator of the job being started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOperator {
    /// Its uid (matched against the snapshot's operators).
    pub uid: String,
    /// Its parallelism in the new job.
    pub parallelism: u32,
    /// True when it is a keyed operator.
    pub keyed: bool,
    /// The uids of the operators whose output it reads.
    pub inputs: Vec<String>,
}

/// What the new job looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreRequest {
    /// Every operator of the new job (stateless ones included).
    pub operators: Vec<NewOperator>,
    /// `Some` when `pipeline.max-parallelism` is explicitly configured.
    pub max_parallelism: Option<u32>,
    /// `-n/--allow-non-restored-state`: drop the state of operators missing from the job.
    pub allow_non_restored_state: bool,
}

/// What one new subtask restores.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubtaskRestore {
    /// Keyed states: only key groups in the new subtask's range, ascending.
    pub keyed: Vec<KeyedStateRestore>,
    /// Operator (non-keyed) states.
    pub operator_states: Vec<OperatorStateRestore>,
    /// The snapshot's key type for a keyed operator (compare with the job's).
    pub key_type: Option<String>,
    /// The subtask restores as finished: its input had ended before the snapshot and its
    /// end-of-input output is already downstream, so it reads nothing and emits nothing.
    pub finished: bool,
}

impl SubtaskRestore {
    /// True when there is nothing to restore (no state name at all).
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.operator_states.is_empty()
    }
}

/// The result of planning: per new operator uid, one [`SubtaskRestore`] per new subtask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePlan {
    /// The max parallelism the job runs with (the snapshot's).
    pub max_parallelism: u32,
    /// Per uid of the new job that the snapshot holds, indexed by new subtask. Operators absent
    /// from the snapshot are absent here: they start as in a fresh job.
    pub operators: BTreeMap<String, Vec<SubtaskRestore>>,
    /// Uids of snapshot operators whose state is dropped (allowed by `allow_non_restored_state`).
    pub non_restored: Vec<String>,
}

/// `'a', 'b', 'c'`.
fn quoted(uids: &[String]) -> String {
    uids.iter().map(|uid| format!("'{uid}'")).collect::<Vec<_>>().join(", ")
}

/// Why a snapshot cannot be restored into the job as configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The snapshot's metadata breaks the format's invariants.
    #[error(transparent)]
    InvalidSnapshot(#[from] FormatError),
    /// The job sets a max parallelism other than the snapshot's.
    #[error(
        "the snapshot was taken with max parallelism {snapshot} and the job now sets {configured}; max parallelism is fixed when a job first starts — remove pipeline.max-parallelism or set it to {snapshot}, or rewrite the snapshot first with `weir savepoint rewrite --max-parallelism {configured} <snapshot> <dir>`"
    )]
    MaxParallelismChanged {
        /// The snapshot's max parallelism.
        snapshot: u32,
        /// The configured one.
        configured: u32,
    },
    /// An operator's parallelism exceeds the snapshot's max parallelism.
    #[error(
        "operator '{uid}' has parallelism {parallelism}, which is above the snapshot's max parallelism {max_parallelism} (a key group cannot be split between subtasks); lower -p to {max_parallelism} or less, or give the snapshot more key groups first with `weir savepoint rewrite --max-parallelism {parallelism} <snapshot> <dir>`"
    )]
    ParallelismAboveMax {
        /// The operator.
        uid: String,
        /// Its parallelism in the new job.
        parallelism: u32,
        /// The snapshot's max parallelism.
        max_parallelism: u32,
    },
    /// An operator has parallelism 0.
    #[error("operator '{uid}' has parallelism 0; a parallelism must be at least 1")]
    ZeroParallelism {
        /// The operator.
        uid: String,
    },
    /// Two operators of the new job share a uid.
    #[error(
        "two operators of the job have uid '{uid}'; give every stateful operator its own uid so its state can be matched"
    )]
    DuplicateUid {
        /// The uid.
        uid: String,
    },
    /// Snapshot operators with state are missing from the job.
    #[error(
        "the snapshot holds state for operators that are not in the job: {}; pass -n/--allow-non-restored-state to start without their state (it is dropped), or keep operators with those uids",
        quoted(.uids)
    )]
    NonRestoredState {
        /// Every such operator's uid.
        uids: Vec<String>,
    },
    /// The snapshot has keyed state for an operator that is not keyed in the job.
    #[error(
        "operator '{uid}' has keyed state in the snapshot but is not keyed in the job; key its input again (key_by), or give it a new uid and pass -n/--allow-non-restored-state to drop the old state"
    )]
    KeyedStateToNonKeyed {
        /// The operator.
        uid: String,
    },
    /// A fully finished operator would read records from an input that is new or unfinished.
    #[error(
        "operator '{uid}' had finished (its input ended) when the snapshot was taken, but its input '{input}' {why}; a finished operator cannot take records again — restore a snapshot taken before '{uid}' finished, or give '{uid}' a new uid and pass -n/--allow-non-restored-state to start it empty"
    )]
    FinishedAfterUnfinished {
        /// The finished operator.
        uid: String,
        /// Its input that is not finished.
        input: String,
        /// "is new in the job" or "had not finished".
        why: &'static str,
    },
    /// The snapshot has non-keyed state for an operator that is keyed in the job.
    #[error(
        "operator '{uid}' was not keyed when the snapshot was taken but is keyed in the job, so its state cannot be restored; remove the key_by, or give it a new uid and pass -n/--allow-non-restored-state to drop the old state"
    )]
    NonKeyedStateToKeyed {
        /// The operator.
        uid: String,
    },
}

/// Plans which new subtask reads which blocks of `metadata`, by Flink's rules (module docs).
pub fn plan_restore(metadata: &SnapshotMetadata, request: &RestoreRequest) -> Result<RestorePlan, RestoreError> {
    validate_metadata(metadata, "the snapshot's _metadata")?;
    let max_p = metadata.max_parallelism;
    if let Some(configured) = request.max_parallelism
        && configured != max_p
    {
        return Err(RestoreError::MaxParallelismChanged { snapshot: max_p, configured });
    }
    let mut new_uids = BTreeSet::new();
    for operator in &request.operators {
        if !new_uids.insert(operator.uid.as_str()) {
            return Err(RestoreError::DuplicateUid { uid: operator.uid.clone() });
        }
        if operator.parallelism == 0 {
            return Err(RestoreError::ZeroParallelism { uid: operator.uid.clone() });
        }
        if operator.parallelism > max_p {
            return Err(RestoreError::ParallelismAboveMax {
                uid: operator.uid.clone(),
                parallelism: operator.parallelism,
                max_parallelism: max_p,
            });
        }
    }
    let non_restored: Vec<String> = metadata
        .operators
        .iter()
        .filter(|old| old.has_state() && !new_uids.contains(old.uid.as_str()))
        .map(|old| old.uid.clone())
        .collect();
    if !non_restored.is_empty() && !request.allow_non_restored_state {
        return Err(RestoreError::NonRestoredState { uids: non_restored });
    }
    let old_by_uid: BTreeMap<&str, &OperatorSnapshot> =
        metadata.operators.iter().map(|old| (old.uid.as_str(), old)).collect();
    check_finished_inputs(request, &old_by_uid)?;
    let mut operators = BTreeMap::new();
    for new in &request.operators {
        let p = new.parallelism;
        let Some(old) = old_by_uid.get(new.uid.as_str()) else {
            continue;
        };
        if old.has_keyed_state() && !new.keyed {
            return Err(RestoreError::KeyedStateToNonKeyed { uid: new.uid.clone() });
        }
        if new.keyed && old.key_type.is_none() && old.has_state() {
            return Err(RestoreError::NonKeyedStateToKeyed { uid: new.uid.clone() });
        }
        let fully_finished = old.is_fully_finished();
        let same_parallelism = old.parallelism == p;
        let mut subtasks: Vec<SubtaskRestore> = (0..p)
            .map(|index| SubtaskRestore {
                keyed: Vec::new(),
                operator_states: Vec::new(),
                key_type: if new.keyed { old.key_type.clone() } else { None },
                finished: fully_finished
                    || (same_parallelism && old.subtasks.get(index as usize).is_some_and(|s| s.finished)),
            })
            .collect();
        assign_keyed(old, max_p, &mut subtasks);
        assign_operator_states(old, &mut subtasks);
        operators.insert(new.uid.clone(), subtasks);
    }
    Ok(RestorePlan { max_parallelism: max_p, operators, non_restored })
}

/// Refuses a fully finished operator fed by an operator that is new or not fully finished.
fn check_finished_inputs(
    request: &RestoreRequest,
    old_by_uid: &BTreeMap<&str, &OperatorSnapshot>,
) -> Result<(), RestoreError> {
    let finished = |uid: &str| old_by_uid.get(uid).is_some_and(|old| old.is_fully_finished());
    for new in &request.operators {
        if !finished(&new.uid) {
            continue;
        }
        for input in &new.inputs {
            if finished(input) {
                continue;
            }
            let why = if old_by_uid.contains_key(input.as_str()) { "had not finished" } else { "is new in the job" };
            return Err(RestoreError::FinishedAfterUnfinished { uid: new.uid.clone(), input: input.clone(), why });
        }
    }
    Ok(())
}

/// Gives each new subtask the key-group blocks of its new range, for every keyed state.
fn assign_keyed(old: &OperatorSnapshot, max_p: u32, subtasks: &mut [SubtaskRestore]) {
    /// Name, kind, value type, and every block of every old subtask with its key group.
    type State<'a> = (&'a str, &'a str, &'a str, Vec<(u32, FileBlock)>);
    // Per state name, in first-appearance order.
    let mut states: Vec<State<'_>> = Vec::new();
    for subtask in &old.subtasks {
        for state in &subtask.keyed_states {
            let index = match states.iter().position(|(name, ..)| *name == state.name) {
                Some(index) => index,
                None => {
                    states.push((&state.name, &state.kind, &state.value_type, Vec::new()));
                    states.len() - 1
                }
            };
            // Validation guarantees a file whenever there are blocks, and a key group per block.
            states[index].3.extend(state.key_groups.iter().map(|block| {
                (block.key_group.unwrap_or_default(), (subtask.block_file(block).unwrap_or_default(), *block))
            }));
        }
    }
    let p = subtasks.len() as u32;
    for (_, _, _, blocks) in &mut states {
        blocks.sort_by_key(|(group, _)| *group);
    }
    for (index, restore) in subtasks.iter_mut().enumerate() {
        let range = compute_key_group_range_for_operator_index(max_p, p, index as u32);
        for (name, kind, value_type, blocks) in &states {
            let start = blocks.partition_point(|(group, _)| *group < range.start);
            let end = blocks.partition_point(|(group, _)| *group <= range.end).max(start);
            let mine = if range.is_empty() {
                Vec::new()
            } else {
                blocks[start..end].iter().map(|(_, fb)| fb.clone()).collect()
            };
            restore.keyed.push((name.to_string(), kind.to_string(), value_type.to_string(), mine));
        }
    }
}

/// Redistributes the operator states by mode.
fn assign_operator_states(old: &OperatorSnapshot, subtasks: &mut [SubtaskRestore]) {
    struct State<'a> {
        name: &'a str,
        mode: RedistributionMode,
        /// Per old subtask, its elements.
        per_old_subtask: Vec<Vec<FileBlock>>,
    }
    let mut states: Vec<State<'_>> = Vec::new();
    for (old_index, subtask) in old.subtasks.iter().enumerate() {
        for state in &subtask.operator_states {
            let index = match states.iter().position(|known| known.name == state.name) {
                Some(index) => index,
                None => {
                    states.push(State {
                        name: &state.name,
                        mode: state.mode,
                        per_old_subtask: vec![Vec::new(); old.subtasks.len()],
                    });
                    states.len() - 1
                }
            };
            states[index].per_old_subtask[old_index] =
                state.elements.iter().map(|block| (subtask.block_file(block).unwrap_or_default(), *block)).collect();
        }
    }
    let new_p = subtasks.len();
    for state in &states {
        let assigned: Vec<Vec<FileBlock>> = match state.mode {
            RedistributionMode::Split if new_p == state.per_old_subtask.len() => state.per_old_subtask.clone(),
            RedistributionMode::Split => {
                let all: Vec<FileBlock> = state.per_old_subtask.iter().flatten().cloned().collect();
                even_split(&all, new_p)
            }
            RedistributionMode::Union => {
                let all: Vec<FileBlock> = state.per_old_subtask.iter().flatten().cloned().collect();
                vec![all; new_p]
            }
            RedistributionMode::Broadcast => {
                let copy = state.per_old_subtask.first().cloned().unwrap_or_default();
                vec![copy; new_p]
            }
        };
        for (restore, elements) in subtasks.iter_mut().zip(assigned) {
            restore.operator_states.push((state.name.to_string(), state.mode, elements));
        }
    }
}

/// Contiguous runs of `elements` for `parts` subtasks; the first `len % parts` get one more.
fn even_split<T: Clone>(elements: &[T], parts: usize) -> Vec<Vec<T>> {
    let base = elements.len() / parts;
    let remainder = elements.len() % parts;
    (0..parts)
        .map(|index| {
            let start = index * base + index.min(remainder);
            let length = base + usize::from(index < remainder);
            elements[start..start + length].to_vec()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{SnapshotSpec, arb_spec, build_snapshot};
    use proptest::prelude::*;
    use weir_types::compute_operator_index_for_key_group;

    /// The request that keeps every operator, each at the given parallelism.
    fn request_for(metadata: &SnapshotMetadata, parallelisms: &[u32]) -> RestoreRequest {
        RestoreRequest {
            operators: metadata
                .operators
                .iter()
                .zip(parallelisms)
                .map(|(old, p)| NewOperator {
                    uid: old.uid.clone(),
                    parallelism: *p,
                    keyed: old.key_type.is_some(),
                    inputs: Vec::new(),
                })
                .collect(),
            max_parallelism: None,
            allow_non_restored_state: false,
        }
    }

    fn elements_of(old: &OperatorSnapshot, name: &str) -> Vec<Vec<FileBlock>> {
        old.subtasks
            .iter()
            .map(|subtask| {
                let file = subtask.file.clone().unwrap_or_default();
                subtask
                    .operator_states
                    .iter()
                    .filter(|state| state.name == name)
                    .flat_map(|state| state.elements.iter().map(|block| (file.clone(), *block)))
                    .collect()
            })
            .collect()
    }

    fn restored_elements(restores: &[SubtaskRestore], name: &str) -> Vec<Vec<FileBlock>> {
        restores
            .iter()
            .map(|restore| {
                restore
                    .operator_states
                    .iter()
                    .filter(|(state, ..)| state == name)
                    .flat_map(|(_, _, elements)| elements.clone())
                    .collect()
            })
            .collect()
    }

    fn arb_case() -> impl Strategy<Value = (SnapshotSpec, Vec<u32>)> {
        arb_spec().prop_flat_map(|spec| {
            let count = spec.operators.len();
            let max_p = spec.max_parallelism;
            (Just(spec), proptest::collection::vec(1..=max_p, count))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn keyed_groups_go_to_exactly_their_new_owner((spec, new_ps) in arb_case()) {
            let (metadata, _) = build_snapshot(&spec);
            let plan = plan_restore(&metadata, &request_for(&metadata, &new_ps)).unwrap();
            let max_p = metadata.max_parallelism;
            prop_assert_eq!(plan.max_parallelism, max_p);
            for (old, new_p) in metadata.operators.iter().zip(&new_ps) {
                let restores = &plan.operators[&old.uid];
                prop_assert_eq!(restores.len(), *new_p as usize);
                let names: BTreeSet<&str> = old.subtasks.iter()
                    .flat_map(|subtask| subtask.keyed_states.iter().map(|state| state.name.as_str())).collect();
                for name in names {
                    let mut expected: Vec<FileBlock> = old.subtasks.iter().flat_map(|subtask| {
                        let file = subtask.file.clone().unwrap_or_default();
                        subtask.keyed_states.iter().filter(|state| state.name == name)
                            .flat_map(move |state| state.key_groups.iter().map({ let file = file.clone(); move |block| (file.clone(), *block) }))
                            .collect::<Vec<_>>()
                    }).collect();
                    let mut seen = Vec::new();
                    for (index, restore) in restores.iter().enumerate() {
                        let (_, kind, value_type, blocks) = restore.keyed.iter().find(|(state, ..)| state == name).unwrap();
                        prop_assert_eq!(kind, "value");
                        prop_assert_eq!(value_type, "i64");
                        prop_assert_eq!(restore.key_type.as_deref(), Some("u64"));
                        let mut previous = None;
                        for (file, block) in blocks {
                            let group = block.key_group.unwrap();
                            prop_assert_eq!(compute_operator_index_for_key_group(max_p, *new_p, group), index as u32);
                            prop_assert!(previous < Some(group), "ascending");
                            previous = Some(group);
                            seen.push((file.clone(), *block));
                        }
                    }
                    expected.sort_by_key(|(_, block)| block.key_group);
                    seen.sort_by_key(|(_, block)| block.key_group);
                    prop_assert_eq!(seen, expected);
                }
            }
        }

        #[test]
        fn operator_states_follow_their_mode((spec, new_ps) in arb_case()) {
            let (metadata, _) = build_snapshot(&spec);
            let plan = plan_restore(&metadata, &request_for(&metadata, &new_ps)).unwrap();
            for (old, new_p) in metadata.operators.iter().zip(&new_ps) {
                let restores = &plan.operators[&old.uid];
                let new_p = *new_p as usize;
                let stateful = old.has_state();
                for restore in restores {
                    prop_assert_eq!(restore.is_empty(), !stateful);
                }

                if spec.operators.iter().any(|op| op.uid == old.uid && op.split) {
                    let before = elements_of(old, "split-state");
                    let after = restored_elements(restores, "split-state");
                    prop_assert_eq!(after.len(), new_p);
                    let flat_before: Vec<_> = before.iter().flatten().cloned().collect();
                    let flat_after: Vec<_> = after.iter().flatten().cloned().collect();
                    prop_assert_eq!(&flat_after, &flat_before, "each element once, order kept");
                    if new_p == before.len() {
                        prop_assert_eq!(&after, &before, "unchanged parallelism keeps the assignment");
                    } else {
                        let total = flat_before.len();
                        for (index, elements) in after.iter().enumerate() {
                            prop_assert_eq!(elements.len(), total / new_p + usize::from(index < total % new_p));
                        }
                    }
                }
                if spec.operators.iter().any(|op| op.uid == old.uid && op.union) {
                    let all: Vec<_> = elements_of(old, "union-state").into_iter().flatten().collect();
                    for elements in restored_elements(restores, "union-state") {
                        prop_assert_eq!(&elements, &all);
                    }
                }
                if spec.operators.iter().any(|op| op.uid == old.uid && op.broadcast) {
                    let first = elements_of(old, "broadcast-state").swap_remove(0);
                    let after = restored_elements(restores, "broadcast-state");
                    prop_assert_eq!(after.len(), new_p);
                    for elements in after {
                        prop_assert_eq!(&elements, &first);
                    }
                }
            }
        }

        #[test]
        fn parallelism_above_max_is_refused((spec, mut new_ps) in arb_case(), extra in 1u32..100, victim in any::<prop::sample::Index>()) {
            let (metadata, _) = build_snapshot(&spec);
            let victim = victim.index(new_ps.len());
            new_ps[victim] = metadata.max_parallelism + extra;
            let error = plan_restore(&metadata, &request_for(&metadata, &new_ps)).unwrap_err();
            let is_above = matches!(&error, RestoreError::ParallelismAboveMax { uid, .. } if *uid == metadata.operators[victim].uid);
            prop_assert!(is_above, "{}", error);
            let message = error.to_string();
            prop_assert!(message.contains(&format!("parallelism {}", new_ps[victim])), "{}", message);
            prop_assert!(message.contains(&format!("max parallelism {}", metadata.max_parallelism)), "{}", message);
        }

        #[test]
        fn orphans_are_refused_unless_allowed((spec, new_ps) in arb_case(), victim in any::<prop::sample::Index>()) {
            let (metadata, _) = build_snapshot(&spec);
            let mut request = request_for(&metadata, &new_ps);
            let victim = victim.index(request.operators.len());
            let removed = request.operators.remove(victim);
            let has_state = metadata.operators[victim].has_state();
            match plan_restore(&metadata, &request) {
                Err(RestoreError::NonRestoredState { uids }) => {
                    prop_assert!(has_state);
                    prop_assert_eq!(uids, vec![removed.uid.clone()]);
                }
                Ok(plan) => {
                    prop_assert!(!has_state);
                    prop_assert!(plan.non_restored.is_empty());
                }
                Err(other) => prop_assert!(false, "unexpected {}", other),
            }
            request.allow_non_restored_state = true;
            let plan = plan_restore(&metadata, &request).unwrap();
            prop_assert!(!plan.operators.contains_key(&removed.uid));
            prop_assert_eq!(plan.non_restored.len(), usize::from(has_state));
        }
    }

    fn sample() -> SnapshotMetadata {
        build_snapshot(&SnapshotSpec::sample()).0
    }

    #[test]
    fn max_parallelism_is_adopted_or_must_match() {
        let metadata = sample();
        let mut request = request_for(&metadata, &[2, 2, 1]);
        assert_eq!(plan_restore(&metadata, &request).unwrap().max_parallelism, 8);
        request.max_parallelism = Some(8);
        assert!(plan_restore(&metadata, &request).is_ok());
        request.max_parallelism = Some(256);
        let error = plan_restore(&metadata, &request).unwrap_err();
        assert_eq!(error, RestoreError::MaxParallelismChanged { snapshot: 8, configured: 256 });
        assert!(
            error.to_string().contains(
                "the snapshot was taken with max parallelism 8 and the job now sets 256; max parallelism is fixed when a job first starts — remove pipeline.max-parallelism or set it to 8"
            ),
            "{error}"
        );
    }

    #[test]
    fn several_orphans_are_listed_in_one_error() {
        let metadata = sample();
        let request = RestoreRequest {
            operators: vec![NewOperator { uid: "sink".into(), parallelism: 1, keyed: false, inputs: Vec::new() }],
            max_parallelism: None,
            allow_non_restored_state: false,
        };
        let error = plan_restore(&metadata, &request).unwrap_err();
        assert_eq!(error, RestoreError::NonRestoredState { uids: vec!["source".into(), "counter".into()] });
        let message = error.to_string();
        assert!(message.contains("'source', 'counter'") && message.contains("-n/--allow-non-restored-state"));
    }

    #[test]
    fn keyedness_must_match() {
        let metadata = sample();
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[1].keyed = false;
        assert_eq!(
            plan_restore(&metadata, &request).unwrap_err(),
            RestoreError::KeyedStateToNonKeyed { uid: "counter".into() }
        );
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[0].keyed = true;
        let error = plan_restore(&metadata, &request).unwrap_err();
        assert_eq!(error, RestoreError::NonKeyedStateToKeyed { uid: "source".into() });
        // A stateless operator may change freely.
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[2].keyed = true;
        assert!(plan_restore(&metadata, &request).is_ok());
    }

    #[test]
    fn new_operators_and_bad_requests() {
        let metadata = sample();
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators.push(NewOperator {
            uid: "brand-new".into(),
            parallelism: 3,
            keyed: true,
            inputs: vec!["source".into()],
        });
        let plan = plan_restore(&metadata, &request).unwrap();
        assert!(!plan.operators.contains_key("brand-new"), "a new operator starts as in a fresh job");

        let mut duplicate = request.clone();
        duplicate.operators.push(NewOperator { uid: "sink".into(), parallelism: 1, keyed: false, inputs: Vec::new() });
        assert_eq!(plan_restore(&metadata, &duplicate).unwrap_err(), RestoreError::DuplicateUid { uid: "sink".into() });

        let mut zero = request.clone();
        zero.operators[0].parallelism = 0;
        assert_eq!(plan_restore(&metadata, &zero).unwrap_err(), RestoreError::ZeroParallelism { uid: "source".into() });
    }

    #[test]
    fn rescaling_keyed_state_by_hand() {
        // max parallelism 8, old p 2 ([0..=3], [4..=7]), new p 3 ([0..=2], [3..=5], [6..=7]).
        let metadata = sample();
        let plan = plan_restore(&metadata, &request_for(&metadata, &[1, 3, 1])).unwrap();
        let groups: Vec<Vec<(String, u32)>> = plan.operators["counter"]
            .iter()
            .map(|restore| {
                restore.keyed[0].3.iter().map(|(file, block)| (file.clone(), block.key_group.unwrap())).collect()
            })
            .collect();
        let from = |subtask: u32, groups: &[u32]| -> Vec<(String, u32)> {
            groups.iter().map(|group| (crate::paths::data_file_name(1, subtask), *group)).collect()
        };
        assert_eq!(groups[0], from(0, &[0, 1, 2]));
        assert_eq!(groups[1], [from(0, &[3]), from(1, &[4, 5])].concat());
        assert_eq!(groups[2], from(1, &[6, 7]));
    }

    #[test]
    fn finished_operators_restore_finished_and_refuse_unfinished_inputs() {
        let mut metadata = sample();
        // source finished on both subtasks, counter on one of its two.
        for subtask in &mut metadata.operators[0].subtasks {
            subtask.finished = true;
        }
        metadata.operators[1].subtasks[0].finished = true;
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[1].inputs = vec!["source".into()];
        request.operators[2].inputs = vec!["counter".into()];
        let plan = plan_restore(&metadata, &request).unwrap();
        assert!(plan.operators["source"].iter().all(|s| s.finished), "fully finished");
        let counter: Vec<bool> = plan.operators["counter"].iter().map(|s| s.finished).collect();
        assert_eq!(counter, vec![true, false], "same parallelism: each subtask as it was");
        assert!(!plan.operators["sink"][0].finished);
        // Rescaled, a partly finished operator restores unfinished; a fully finished one stays.
        let plan = plan_restore(&metadata, &request_for(&metadata, &[3, 3, 1])).unwrap();
        assert!(plan.operators["source"].iter().all(|s| s.finished));
        assert!(plan.operators["counter"].iter().all(|s| !s.finished));

        // A fully finished counter behind a new source is refused, naming both.
        metadata.operators[1].subtasks[1].finished = true;
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[0].uid = "new-source".into();
        request.operators[1].inputs = vec!["new-source".into()];
        request.allow_non_restored_state = true;
        let error = plan_restore(&metadata, &request).unwrap_err();
        assert_eq!(
            error,
            RestoreError::FinishedAfterUnfinished {
                uid: "counter".into(),
                input: "new-source".into(),
                why: "is new in the job"
            }
        );
        assert!(error.to_string().contains("give 'counter' a new uid"), "{error}");
        // ... and so is one behind a source that had not finished.
        for subtask in &mut metadata.operators[0].subtasks {
            subtask.finished = false;
        }
        let mut request = request_for(&metadata, &[2, 2, 1]);
        request.operators[1].inputs = vec!["source".into()];
        let error = plan_restore(&metadata, &request).unwrap_err();
        assert!(matches!(error, RestoreError::FinishedAfterUnfinished { why: "had not finished", .. }), "{error}");
    }

    #[test]
    fn even_split_matches_flink() {
        let split = even_split(&[1, 2, 3, 4, 5, 6, 7], 3);
        assert_eq!(split, vec![vec![1, 2, 3], vec![4, 5], vec![6, 7]]);
        assert_eq!(even_split::<u8>(&[], 2), vec![Vec::<u8>::new(), Vec::new()]);
    }
}
