//! The messages a job master takes: subtask events, users' requests, snapshot outcomes. Kept
//! apart from the master itself, so the executors and the cluster's resources that send them
//! do not depend on the job master.

use crate::checkpointing::writer::WriteOutcome;
use crate::execution::TaskEvent;

/// Messages to a job master.
#[derive(Debug)]
pub enum MasterEvent {
    /// A subtask changed state.
    Task(TaskEvent),
    /// A user asked to cancel the job.
    Cancel,
    /// A user asked for a savepoint (REST), optionally stopping the job after it.
    TriggerSavepoint {
        /// The request id the user polls.
        request_id: String,
        /// Target directory (else `state.savepoints.dir`).
        target: Option<String>,
        /// Stop the job once the savepoint completes.
        terminate: bool,
        /// Canonical (default) or native.
        format: weir_api::snapshot::SnapshotFormat,
        /// With `terminate`: fire every event-time window first (`stop --drain`).
        drain: bool,
    },
    /// The snapshot writer finished a subtask's snapshot (or could not).
    Snapshot(WriteOutcome),
    /// A user asked for a checkpoint now (REST), polled by the request id.
    TriggerCheckpoint {
        /// The request id the user polls.
        request_id: String,
        /// `checkpointType: FULL`: every key group written whole.
        full: bool,
    },
}

impl From<WriteOutcome> for MasterEvent {
    fn from(outcome: WriteOutcome) -> MasterEvent {
        MasterEvent::Snapshot(outcome)
    }
}

impl From<TaskEvent> for MasterEvent {
    fn from(event: TaskEvent) -> MasterEvent {
        MasterEvent::Task(event)
    }
}
