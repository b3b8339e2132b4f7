//! Checkpoint statistics as `GET /jobs/{id}/checkpoints` shows them (Flink's shape).

use serde::{Deserialize, Serialize};

/// Status of one checkpoint in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointStatus {
    /// Waiting for acknowledgements.
    InProgress,
    /// Every subtask acknowledged and `_metadata` is written.
    Completed,
    /// Declined, timed out or aborted.
    Failed,
}

/// One checkpoint or savepoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckpointEntry {
    /// The checkpoint id.
    pub id: u64,
    /// Status.
    pub status: CheckpointStatus,
    /// True for savepoints.
    pub is_savepoint: bool,
    /// True for the savepoint of a stop (Flink's synchronous savepoint).
    #[serde(default)]
    pub is_stop: bool,
    /// True for an unaligned checkpoint.
    #[serde(default)]
    pub unaligned: bool,
    /// A savepoint's format: `CANONICAL` or `NATIVE`.
    #[serde(default)]
    pub savepoint_format: Option<String>,
    /// When it was triggered, epoch ms.
    pub trigger_timestamp: u64,
    /// When the last acknowledgement arrived, epoch ms (0 while in progress).
    pub latest_ack_timestamp: u64,
    /// Milliseconds from trigger to completion (or failure).
    pub end_to_end_duration: u64,
    /// Bytes of the whole state the checkpoint holds (for an incremental checkpoint, the
    /// reused blocks included).
    pub state_size: u64,
    /// Bytes this checkpoint wrote (equal to `state_size` unless incremental).
    #[serde(default)]
    pub checkpointed_size: u64,
    /// Subtasks that acknowledged.
    pub num_acknowledged_subtasks: u32,
    /// Subtasks expected.
    pub num_subtasks: u32,
    /// Where it is (completed only).
    pub external_path: Option<String>,
    /// Why it failed.
    pub failure_message: Option<String>,
    /// Bytes per operator uid.
    pub operator_sizes: std::collections::BTreeMap<String, u64>,
    /// Each subtask that acknowledged, in the order they did.
    #[serde(default)]
    pub subtasks: Vec<SubtaskCheckpoint>,
}

/// One subtask's acknowledgement of a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubtaskCheckpoint {
    /// Its vertex's index in the job graph.
    pub vertex: usize,
    /// The subtask index.
    pub subtask: u32,
    /// When its acknowledgement arrived, epoch ms.
    pub ack_timestamp: u64,
    /// Bytes it wrote.
    pub checkpointed_size: u64,
    /// Bytes of its state (reused blocks of an incremental checkpoint included).
    pub state_size: u64,
    /// How long its parts took (zeros from a weir before they were timed).
    #[serde(default)]
    pub timings: weir_api::snapshot::SnapshotTimings,
}

/// Counts and history kept by the coordinator.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckpointStats {
    /// Completed checkpoints and savepoints.
    pub completed: u64,
    /// Failed ones.
    pub failed: u64,
    /// In progress.
    pub in_progress: u64,
    /// Restored from, if the job was restored: (checkpoint id, path, time).
    pub restored: Option<(u64, String, u64)>,
    /// Recent entries, oldest first (bounded).
    pub history: std::collections::VecDeque<CheckpointEntry>,
}

/// History entries kept, at most (Flink's `web.checkpoints.history` default).
pub const HISTORY_MAX: usize = 10;
