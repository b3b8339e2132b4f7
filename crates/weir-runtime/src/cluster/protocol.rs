//! The control protocol between the JobManager and its TaskManagers: JSON lines.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use weir_api::snapshot::TaskControl;

use crate::checkpointing::writer::WriteOutcome;
use crate::execution::TaskEvent;

/// A job as submitted to a cluster: everything a process needs to build the same graph.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobSubmission {
    /// The catalog name.
    pub job: String,
    /// The job's own arguments.
    pub args: Vec<String>,
    /// Configuration overrides (`key=value`), applied over the cluster's configuration.
    #[serde(default)]
    pub config: Vec<String>,
    /// `-p`.
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// `-s`: a savepoint or retained checkpoint to start from.
    #[serde(default)]
    pub savepoint: Option<String>,
    /// `-n`.
    #[serde(default)]
    pub allow_non_restored_state: bool,
}

/// One attempt of a job, deployed to a TaskManager.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeploySpec {
    /// The job id.
    pub job_id: String,
    /// The job's name.
    pub job_name: String,
    /// The attempt.
    pub attempt: u32,
    /// How to build the graph.
    pub submission: JobSubmission,
    /// Parallelism the job graph was built with.
    pub default_parallelism: u32,
    /// Max parallelism of the job.
    pub max_parallelism: u32,
    /// Data address of the TaskManager owning each slot; subtask `i` of every task runs in
    /// slot `i` (slot sharing).
    pub slot_addresses: Vec<String>,
    /// Exactly-once alignment.
    pub exactly_once: bool,
    /// Periodic checkpoints are on: tasks wait for the job's final checkpoint at the end of
    /// their input.
    #[serde(default)]
    pub final_checkpoint: bool,
    /// Incremental checkpoints, every n-th full (`execution.checkpointing.incremental`).
    #[serde(default)]
    pub incremental: Option<u32>,
    /// `state.backend.type: spillable` (the job's; each TaskManager spills into the
    /// directory it names, on its own machine).
    #[serde(default)]
    pub spill: Option<weir_state::spill::SpillOptions>,
    /// The snapshot to restore (a checkpoint or savepoint location).
    pub restore: Option<String>,
    /// `pipeline.auto-watermark-interval`, ms.
    #[serde(default)]
    pub auto_watermark_interval_ms: Option<u64>,
    /// Deploy only this pipelined region (`JobGraph::regions()` numbering); `None`: all.
    /// `slot_addresses` then hold the region's slots.
    #[serde(default)]
    pub region: Option<usize>,
}

/// Messages to the JobManager.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToJobManager {
    /// A TaskManager offers its slots.
    Register {
        /// Its id.
        taskmanager_id: String,
        /// Its slots.
        slots: u32,
        /// Where its data server listens.
        data_address: String,
        /// The attempts it kept running while it had no JobManager (a new leader takes them
        /// over instead of restarting them).
        #[serde(default)]
        running: Vec<RunningAttempt>,
    },
    /// Still alive.
    Heartbeat,
    /// A subtask changed state.
    TaskEvent {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The event.
        event: TaskEvent,
    },
    /// A subtask's snapshot was written (or not).
    Snapshot {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The outcome.
        outcome: WriteOutcome,
    },
    /// The counters of the attempt's subtasks on this TaskManager (sent periodically, and
    /// once more when they ended), so that REST and `/metrics` on the JobManager show them.
    Metrics {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// One entry per local subtask.
        subtasks: Vec<SubtaskCounters>,
    },
}

/// An attempt a TaskManager runs, with its local subtasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningAttempt {
    /// The job.
    pub job_id: String,
    /// The attempt and its subtasks on this TaskManager.
    pub attempt: crate::executor::ReportedAttempt,
}

/// One subtask's counters (totals since the attempt started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskCounters {
    /// The vertex index in the job graph.
    pub vertex: usize,
    /// The subtask index.
    pub subtask: u32,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Milliseconds backpressured.
    pub backpressured_ms: u64,
    /// Snapshot bytes read while restoring.
    #[serde(default)]
    pub restored_bytes: u64,
    /// Each chained operator's records out, head first.
    #[serde(default)]
    pub operators: Vec<u64>,
    /// A source's split positions.
    #[serde(default)]
    pub splits: Vec<weir_api::operator::SplitPosition>,
    /// Records a source skipped as undeserialisable.
    #[serde(default)]
    pub records_skipped: u64,
    /// Records that came too late for their windows.
    #[serde(default)]
    pub records_late: u64,
    /// Of `records_late`, those dropped (not sent to a late-data side output).
    #[serde(default)]
    pub records_late_dropped: u64,
    /// The input watermark (order-preserving `u64`, 0 for none: [`weir_api::operator::TaskMetrics::input_watermark`]).
    #[serde(default)]
    pub input_watermark: u64,
}

/// One message to a TaskManager with the leadership epoch of the JobManager that sent it (0
/// without high availability): every message carries it, and a TaskManager refuses (drops)
/// any whose epoch is lower than the highest it has seen.
#[derive(Debug, Serialize, Deserialize)]
pub struct Frame<M> {
    /// The sender's leadership epoch.
    pub epoch: i64,
    /// The message.
    pub message: M,
}

/// Messages to a TaskManager, each sent in a [`Frame`] with the leader's epoch.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToTaskManager {
    /// The first answer to a registration. A TaskManager refuses a JobManager whose epoch (the
    /// frame's) is lower than one it already followed, and with it every message of that
    /// connection.
    Welcome,
    /// Run the subtasks of these slots.
    Deploy(Box<DeploySpec>),
    /// A control message for one subtask.
    Control {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// The vertex.
        vertex: usize,
        /// The subtask.
        subtask: u32,
        /// The message.
        control: TaskControl,
    },
    /// Where the files of a checkpoint go.
    CheckpointDir {
        /// The job.
        job_id: String,
        /// The checkpoint.
        checkpoint_id: u64,
        /// The directory URL.
        url: String,
    },
    /// Stop the attempt's subtasks.
    Cancel {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
    },
}

/// Writes one message as a JSON line.
pub fn send<T: Serialize>(writer: &mut impl Write, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    writer.write_all(&line)?;
    writer.flush()
}

/// Reads one message; `Ok(None)` at the end of the connection.
pub fn receive<T: for<'de> Deserialize<'de>>(reader: &mut impl BufRead) -> std::io::Result<Option<T>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    serde_json::from_str(&line).map(Some).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
