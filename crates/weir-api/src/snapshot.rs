//! What travels between tasks and the checkpoint coordinator: barriers, the state a subtask
//! snapshots at a barrier, the state a subtask restores from, and control messages.

use std::collections::HashMap;
use std::sync::Arc;

use weir_state::{KeyedBackendSnapshot, RestoredTable};

pub use weir_types::SnapshotFormat;

/// What a barrier asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BarrierKind {
    /// A checkpoint (native format), periodic or asked for.
    Checkpoint {
        /// Every key group written whole, none reused from an earlier checkpoint (Flink's
        /// `checkpointType: FULL`); the next incremental checkpoints build on it.
        full: bool,
        /// Unaligned (`execution.checkpointing.unaligned.enabled`): a subtask snapshots at
        /// the first notice of the barrier on any input, which overtakes the records queued
        /// before it, and records those records as in-flight state instead of waiting for
        /// them (crate::in_flight).
        #[serde(default)]
        unaligned: bool,
    },
    /// A savepoint; with `terminate`, the job stops once it completes (stop-with-savepoint).
    Savepoint {
        /// Stop after this savepoint.
        terminate: bool,
        /// Its format.
        format: SnapshotFormat,
        /// Flink's `stop --drain`: sources emit the final watermark before this barrier, so
        /// every event-time window and timer fires before the snapshot (and its output is
        /// committed with it). For ending a job for good: resuming from it can repeat or miss
        /// window results.
        #[serde(default)]
        drain: bool,
    },
}

impl BarrierKind {
    /// The format this snapshot is written in.
    pub fn format(&self) -> SnapshotFormat {
        match self {
            BarrierKind::Checkpoint { .. } => SnapshotFormat::Native,
            BarrierKind::Savepoint { format, .. } => *format,
        }
    }
}

/// A checkpoint barrier: flows in-band with the records, from the sources to the sinks.
///
/// It carries where its snapshot is written (as Flink's barrier carries its
/// `CheckpointStorageLocationReference`): a subtask writes what it snapshots at the barrier
/// there, with no lookup that could race the barrier or miss a directory sent separately.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Barrier {
    /// The checkpoint (or savepoint) id, increasing per job.
    pub checkpoint_id: u64,
    /// When the coordinator triggered it, epoch ms.
    pub timestamp_ms: u64,
    /// Checkpoint or savepoint.
    pub kind: BarrierKind,
    /// The URL of the directory the snapshot is written into (`file://`, `s3://`,
    /// `memory://`), as the coordinator opened it for this checkpoint.
    pub location: Arc<str>,
}

impl Barrier {
    /// True for stop-with-savepoint: tasks end once this snapshot completes.
    pub fn terminates(&self) -> bool {
        matches!(self.kind, BarrierKind::Savepoint { terminate: true, .. })
    }

    /// True for an unaligned checkpoint.
    pub fn is_unaligned(&self) -> bool {
        matches!(self.kind, BarrierKind::Checkpoint { unaligned: true, .. })
    }

    /// True for stop-with-savepoint with drain: the final watermark goes first.
    pub fn drains(&self) -> bool {
        matches!(self.kind, BarrierKind::Savepoint { drain: true, .. })
    }
}

/// How non-keyed operator state is spread over subtasks on restore (Flink's modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redistribution {
    /// Elements of all subtasks concatenated and split evenly (list state).
    Split,
    /// Every subtask gets every element (union list state).
    Union,
    /// Every subtask gets subtask 0's copy (broadcast state).
    Broadcast,
}

/// One named non-keyed state of an operator: a list of encoded elements.
#[derive(Clone, Debug)]
pub struct OperatorStateData {
    /// The state's name.
    pub name: String,
    /// How it is redistributed on restore.
    pub mode: Redistribution,
    /// The elements, each encoded by its owner.
    pub elements: Vec<Vec<u8>>,
}

/// One operator's part of a subtask snapshot.
pub struct OperatorSnapshotData {
    /// The operator's uid.
    pub uid: String,
    /// Keyed state, copied at the barrier; serialized later.
    pub keyed: Option<KeyedBackendSnapshot>,
    /// Non-keyed states.
    pub operator_states: Vec<OperatorStateData>,
}

/// Everything one subtask snapshots at one barrier.
pub struct TaskSnapshot {
    /// The barrier.
    pub barrier: Barrier,
    /// One entry per stateful operator of the chain.
    pub operators: Vec<OperatorSnapshotData>,
    /// The subtask's input had ended and its chain's end-of-input output went out before the
    /// barrier: a restore must not run it again (Flink's finished tasks, FLIP-147).
    pub finished: bool,
    /// How long the subtask's parts of the checkpoint took (the writer adds `async_ms`).
    pub timings: SnapshotTimings,
}

impl TaskSnapshot {
    /// An empty snapshot for `barrier`.
    pub fn new(barrier: Barrier) -> TaskSnapshot {
        TaskSnapshot { barrier, operators: Vec::new(), finished: false, timings: SnapshotTimings::default() }
    }
}

/// The parts of one subtask's checkpoint, in milliseconds, as Flink's checkpoint statistics
/// show them per subtask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotTimings {
    /// From the trigger to the subtask's first barrier (or, at a source, to the trigger
    /// reaching it): the time the barrier spent behind records.
    pub start_delay_ms: u64,
    /// From the first barrier to the last, across the subtask's inputs (0 at a source).
    pub alignment_ms: u64,
    /// The synchronous part at the barrier: the chain's `snapshot_state`.
    pub sync_ms: u64,
    /// The asynchronous part: serializing and writing the state.
    pub async_ms: u64,
}

/// Receives the snapshots of one subtask (the runtime writes them asynchronously).
pub trait SnapshotSink: Send + Sync {
    /// Hands over a subtask's snapshot; the call returns at once.
    fn submit(&self, snapshot: TaskSnapshot);
    /// Checkpoint `checkpoint_id` completed (the subtask heard it): an incremental
    /// checkpoint may build on it.
    fn checkpoint_complete(&self, _checkpoint_id: u64) {}
}

/// One operator's restored state, as planned for one new subtask.
#[derive(Clone, Debug, Default)]
pub struct RestoredOperator {
    /// The recorded key type, for keyed operators.
    pub key_type: Option<String>,
    /// Keyed tables, with the key groups of this subtask.
    pub keyed: Vec<RestoredTable>,
    /// Non-keyed states: name -> elements assigned to this subtask.
    pub operator_states: HashMap<String, Vec<Vec<u8>>>,
    /// The operator had finished for this subtask when the snapshot was taken: it restores
    /// its state but reads no input (a source) and does not emit its end-of-input results
    /// again.
    pub finished: bool,
    /// The job that took the snapshot (32 hex): a sink may take over that job's leftovers.
    pub snapshot_job_id: String,
}

impl RestoredOperator {
    /// True when `restored` (a [`TaskContext::restored_operator`](crate::operator::TaskContext::restored_operator))
    /// says the operator finished before the snapshot.
    pub fn is_finished(restored: Option<&RestoredOperator>) -> bool {
        restored.is_some_and(|restored| restored.finished)
    }
}

/// Messages from the job master to a running subtask.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum TaskControl {
    /// Sources only: snapshot and emit this barrier.
    TriggerCheckpoint(Barrier),
    /// The checkpoint completed everywhere: commit what was staged for it.
    CheckpointComplete(u64),
    /// The checkpoint was abandoned: stop aligning it; a stopping task resumes.
    CheckpointAborted(u64),
    /// Every task's input ended and a checkpoint after that completed: end now.
    Finish,
}

/// The name of a source's read-position state.
pub const SOURCE_POSITIONS_STATE: &str = "source-positions";
/// The name of the in-flight records an unaligned checkpoint recorded at a subtask's inputs
/// (union state of the chain's head operator; docs/savepoint-format.md).
pub const IN_FLIGHT_STATE: &str = "weir.in-flight-records";
/// The name of a sink's pending-commit state.
pub const SINK_COMMITTABLES_STATE: &str = "sink-committables";
