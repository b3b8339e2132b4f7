//! The in-flight records of an unaligned checkpoint: what a subtask read after its snapshot
//! that its producers had sent before theirs.
//!
//! At the first notice of an unaligned barrier on any input a subtask snapshots its chain at
//! once. Each input's notice says how many records its producer had sent before its own
//! snapshot; the records of that input from the subtask's snapshot up to that count were in
//! the channels between the two snapshots. They are processed as usual and also recorded
//! here, and the snapshot is handed over once every input's count is reached. A restore
//! replays them before the subtask reads anything else.
//!
//! Each recorded batch is one element of the chain head's union state
//! [`IN_FLIGHT_STATE`](crate::snapshot::IN_FLIGHT_STATE), encoded with postcard as
//! [`InFlightBatch`] (docs/savepoint-format.md). On a restore every subtask reads all of
//! them: records of a key-partitioned exchange (they carry their key hashes) go to the
//! subtask that owns their key group, so a rescale redistributes them as it does keyed
//! state; other records go back to the subtask that recorded them, which needs the same
//! parallelism.

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use weir_types::keygroups::{compute_operator_index_for_key_group, key_group_for_hash};

use crate::error::TaskError;
use crate::exchange::StreamElement;
use crate::operator::TaskContext;
use crate::snapshot::{IN_FLIGHT_STATE, OperatorSnapshotData, OperatorStateData, Redistribution, TaskSnapshot};

/// The version of [`InFlightBatch`]'s encoding.
pub const IN_FLIGHT_FORMAT_VERSION: u8 = 1;

/// One recorded batch of in-flight records (the decoding side).
#[derive(Debug, Deserialize)]
pub struct InFlightBatch<T> {
    /// [`IN_FLIGHT_FORMAT_VERSION`].
    pub version: u8,
    /// The subtask that recorded it.
    pub subtask: u32,
    /// Its operator's parallelism then.
    pub parallelism: u32,
    /// The records, in the order they arrived.
    pub records: Vec<T>,
    /// Their event timestamps, or empty.
    pub timestamps: Vec<i64>,
    /// Their key hashes (a key-partitioned exchange), or empty.
    pub hashes: Vec<u32>,
}

impl<T: Serialize> InFlightBatch<T> {
    /// Its encoding, as a checkpoint holds it.
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_allocvec(&InFlightBatchRef {
            version: self.version,
            subtask: self.subtask,
            parallelism: self.parallelism,
            records: &self.records,
            timestamps: &self.timestamps,
            hashes: &self.hashes,
        })
    }
}

/// The encoding side of [`InFlightBatch`]: borrows the records it encodes.
#[derive(Serialize)]
struct InFlightBatchRef<'a, T> {
    version: u8,
    subtask: u32,
    parallelism: u32,
    records: &'a [T],
    timestamps: &'a [i64],
    hashes: &'a [u32],
}

/// An unaligned checkpoint a subtask has snapshotted and whose in-flight records it is
/// collecting.
pub struct InFlightCapture {
    /// The chain's snapshot, taken at the first notice; handed over when complete.
    pub snapshot: TaskSnapshot,
    /// When the first notice came (the collection's time is reported as alignment).
    pub started: Instant,
    /// Per input, the producer's record count at its snapshot, once its notice came.
    targets: Vec<Option<u64>>,
    /// The recorded batches, encoded.
    batches: Vec<Vec<u8>>,
}

impl InFlightCapture {
    /// Collection for `snapshot`, over `inputs` inputs.
    pub fn new(snapshot: TaskSnapshot, inputs: usize) -> InFlightCapture {
        InFlightCapture { snapshot, started: Instant::now(), targets: vec![None; inputs], batches: Vec::new() }
    }

    /// The checkpoint's id.
    pub fn checkpoint_id(&self) -> u64 {
        self.snapshot.barrier.checkpoint_id
    }

    /// Sets `input`'s count, unless its notice came already.
    pub fn set_target(&mut self, input: usize, records_before: u64) {
        self.targets[input].get_or_insert(records_before);
    }

    /// Whether `input`'s count is known and not yet reached.
    pub fn behind(&self, input: usize, received: u64) -> bool {
        self.targets[input].is_some_and(|target| received < target)
    }

    /// Whether everything `input` sent before its producer's snapshot was read (`received`
    /// records so far).
    pub fn input_complete(&self, input: usize, received: u64) -> bool {
        self.targets[input].is_some_and(|target| received >= target)
    }

    /// Records the part of a batch of `input` that belongs to the checkpoint: its records
    /// numbered `before..` up to the input's count (all of them while the count is unknown).
    pub fn record<T: serde::Serialize>(
        &mut self,
        input: usize,
        before: u64,
        (records, timestamps, hashes): (&[T], &[i64], &[u32]),
        ctx: &TaskContext,
    ) -> Result<(), TaskError> {
        let limit = self.targets[input].unwrap_or(u64::MAX);
        if before >= limit || records.is_empty() {
            return Ok(());
        }
        let taken = records.len().min(usize::try_from(limit - before).unwrap_or(usize::MAX));
        let batch = InFlightBatchRef {
            version: IN_FLIGHT_FORMAT_VERSION,
            subtask: ctx.subtask_index,
            parallelism: ctx.parallelism,
            records: &records[..taken],
            timestamps: &timestamps[..taken.min(timestamps.len())],
            hashes: &hashes[..taken.min(hashes.len())],
        };
        let bytes = postcard::to_allocvec(&batch).map_err(|e| {
            TaskError::Internal(format!("{}: encoding in-flight records for a checkpoint: {e}", ctx.task_name))
        })?;
        self.batches.push(bytes);
        Ok(())
    }

    /// The snapshot with the recorded batches as the chain head's union state.
    pub fn into_snapshot(mut self, head_uid: &str) -> TaskSnapshot {
        if self.batches.is_empty() {
            return self.snapshot;
        }
        let state = OperatorStateData {
            name: IN_FLIGHT_STATE.to_string(),
            mode: Redistribution::Union,
            elements: self.batches,
        };
        match self.snapshot.operators.iter_mut().find(|operator| operator.uid == head_uid) {
            Some(head) => head.operator_states.push(state),
            None => self.snapshot.operators.push(OperatorSnapshotData {
                uid: head_uid.to_string(),
                keyed: None,
                operator_states: vec![state],
            }),
        }
        self.snapshot
    }
}

/// The restored in-flight records this subtask replays, in the order they were recorded.
pub fn restored_in_flight<T: serde::de::DeserializeOwned>(
    ctx: &TaskContext,
) -> Result<VecDeque<StreamElement<T>>, TaskError> {
    let mut replay = VecDeque::new();
    let Some(elements) = ctx.restored_operator().and_then(|restored| restored.operator_states.get(IN_FLIGHT_STATE))
    else {
        return Ok(replay);
    };
    for bytes in elements {
        let batch: InFlightBatch<T> = postcard::from_bytes(bytes).map_err(|e| {
            TaskError::Internal(format!(
                "{}: the in-flight records of the unaligned checkpoint being restored do not decode as this job's records ({e}); restore the job build that took it, or a savepoint",
                ctx.task_name
            ))
        })?;
        if batch.version != IN_FLIGHT_FORMAT_VERSION {
            return Err(TaskError::Internal(format!(
                "{}: in-flight records of format version {} (this weir reads {IN_FLIGHT_FORMAT_VERSION}); restore with the weir that took the checkpoint",
                ctx.task_name, batch.version
            )));
        }
        if let Some(element) = assign(batch, ctx)? {
            replay.push_back(element);
        }
    }
    Ok(replay)
}

/// The part of `batch` this subtask replays: keyed records by key group, others whole to
/// the subtask that recorded them.
fn assign<T>(batch: InFlightBatch<T>, ctx: &TaskContext) -> Result<Option<StreamElement<T>>, TaskError> {
    let InFlightBatch { subtask, parallelism, records, timestamps, hashes, .. } = batch;
    if hashes.is_empty() {
        if parallelism != ctx.parallelism {
            return Err(TaskError::Internal(format!(
                "{}: the unaligned checkpoint being restored holds in-flight records of an exchange that is not keyed, taken at parallelism {parallelism}; such records return only to the subtask that read them, so restore at parallelism {parallelism}, or take a savepoint (always aligned) and rescale from it",
                ctx.task_name
            )));
        }
        if subtask != ctx.subtask_index {
            return Ok(None);
        }
        return Ok(Some(if timestamps.is_empty() {
            StreamElement::Records(records)
        } else {
            StreamElement::TimestampedRecords { records, timestamps, hashes }
        }));
    }
    let (max_parallelism, new_parallelism) = (ctx.max_parallelism, ctx.parallelism);
    let mine = |hash: u32| {
        let key_group = key_group_for_hash(hash, max_parallelism);
        compute_operator_index_for_key_group(max_parallelism, new_parallelism, key_group) == ctx.subtask_index
    };
    let timestamped = !timestamps.is_empty();
    let (mut kept_records, mut kept_timestamps, mut kept_hashes) = (Vec::new(), Vec::new(), Vec::new());
    for (index, (record, hash)) in records.into_iter().zip(hashes).enumerate() {
        if mine(hash) {
            kept_records.push(record);
            kept_hashes.push(hash);
            if timestamped {
                kept_timestamps.push(timestamps.get(index).copied().unwrap_or(crate::operator::NO_TIMESTAMP));
            }
        }
    }
    if kept_records.is_empty() {
        return Ok(None);
    }
    Ok(Some(if timestamped {
        StreamElement::TimestampedRecords { records: kept_records, timestamps: kept_timestamps, hashes: kept_hashes }
    } else {
        StreamElement::KeyedRecords { records: kept_records, hashes: kept_hashes }
    }))
}
