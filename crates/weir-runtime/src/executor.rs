//! Where a job attempt's subtasks run: in this process (the embedded cluster) or on the
//! TaskManagers of a standalone cluster. The job master is the same either way.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::operator::{SystemClock, TaskMetrics};
use weir_api::snapshot::TaskControl;
use weir_types::JobId;

use crate::checkpointing::RestoreSource;
use crate::execution::{CheckpointWiring, JobContext, Placement, TaskEvent, deploy};
use crate::job_master::events::MasterEvent;
use crate::jobgraph::JobGraph;

/// Everything needed to start one attempt of a job.
pub struct AttemptSpec {
    /// The job.
    pub job_id: JobId,
    /// Its name.
    pub job_name: String,
    /// 0, then +1 per restart.
    pub attempt: u32,
    /// The stream graph.
    pub graph: Arc<StreamGraph>,
    /// The job graph.
    pub job_graph: Arc<JobGraph>,
    /// Counters per vertex and subtask.
    pub metrics: Vec<Vec<Arc<TaskMetrics>>>,
    /// Control channels per vertex and subtask.
    pub controls: Vec<Vec<Receiver<TaskControl>>>,
    /// Checkpointing wiring (local writer, directories).
    pub wiring: CheckpointWiring,
    /// Set to stop this attempt's subtasks.
    pub cancel: Arc<AtomicBool>,
    /// Set when the job is cancelled: an executor still waiting for resources gives up.
    pub job_cancelled: Arc<AtomicBool>,
    /// Where subtask events go.
    pub task_events: Sender<TaskEvent>,
    /// Where snapshot outcomes of remote subtasks go.
    pub snapshot_events: Sender<MasterEvent>,
    /// The snapshot this attempt restores, if any.
    pub restore: Option<Arc<RestoreSource>>,
    /// Deploy only one pipelined region: `(region of each vertex, the region)`.
    pub region: Option<(Arc<Vec<usize>>, usize)>,
}

/// A started attempt.
pub trait AttemptHandle: Send {
    /// Waits until the attempt's subtasks have ended (after the job master saw them end).
    fn join(self: Box<Self>);

    /// Where subtask `i` of every vertex of the attempt runs (a TaskManager id); `None`
    /// for this process.
    fn host_of(&self, _subtask: u32) -> Option<String> {
        None
    }
}

/// One subtask of an attempt that kept running while no JobManager led, as its TaskManager
/// reports it to the new leader.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportedSubtask {
    /// The vertex.
    pub vertex: usize,
    /// The subtask index.
    pub subtask: u32,
    /// Its state on the TaskManager.
    pub state: weir_types::ExecutionState,
    /// Its input ended and it waits for the job's final checkpoint.
    pub data_ended: bool,
    /// The TaskManager running it.
    #[serde(default)]
    pub taskmanager: String,
}

/// An attempt of a job found running on the TaskManagers (a new leader JobManager takes it
/// over instead of restarting it).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportedAttempt {
    /// The attempt number.
    pub attempt: u32,
    /// Its pipelined region, when it runs one region.
    pub region: Option<usize>,
    /// The data address of each slot (subtask `i` of every vertex runs in slot `i`).
    pub slot_addresses: Vec<String>,
    /// Every subtask reported so far (from all the TaskManagers running the attempt).
    pub subtasks: Vec<ReportedSubtask>,
}

/// Starts attempts.
pub trait Executor: Send + Sync {
    /// Deploys every subtask of the attempt.
    fn start(&self, spec: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError>;

    /// The attempts of `job_id` running already, as reported by the TaskManagers that
    /// registered with this (new leader) JobManager.
    fn running_attempts(&self, _job_id: &str) -> Vec<ReportedAttempt> {
        Vec::new()
    }

    /// Takes over `reported` as the running attempt `spec` describes (same number, same
    /// region): its subtasks keep running and report to `spec`'s channels from now on.
    fn adopt(&self, _spec: AttemptSpec, reported: &ReportedAttempt) -> Result<Box<dyn AttemptHandle>, TaskError> {
        Err(TaskError::Internal(format!(
            "attempt {} cannot be taken over: this executor runs no remote tasks",
            reported.attempt
        )))
    }

    /// Stops a reported attempt nobody takes over (an older one of the same region).
    fn cancel_attempt(&self, _job_id: &str, _attempt: u32) {}

    /// The job master of `job_id` left RECONCILING: whatever of the job is still reported
    /// (not taken over) is stopped and its slots freed, and later reports of the job (a
    /// TaskManager that was frozen or cut off) are stopped at once.
    fn reconciled(&self, _job_id: &str) {}
}

/// Runs every subtask as a thread of this process.
pub struct LocalExecutor;

struct LocalAttempt {
    threads: Vec<JoinHandle<()>>,
}

impl AttemptHandle for LocalAttempt {
    fn join(self: Box<Self>) {
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

impl Executor for LocalExecutor {
    fn start(&self, spec: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError> {
        let job_ctx = JobContext {
            job_id: spec.job_id,
            job_name: spec.job_name.clone(),
            cancel: spec.cancel,
            clock: Arc::new(SystemClock),
            attempt: spec.attempt,
            placement: match &spec.region {
                Some((regions, region)) => {
                    let (regions, region) = (Arc::clone(regions), *region);
                    Placement {
                        is_local: Arc::new(move |vertex, _| regions.get(vertex) == Some(&region)),
                        network: None,
                    }
                }
                None => Placement::all_local(),
            },
        };
        let threads = deploy(
            &spec.graph,
            &spec.job_graph,
            &job_ctx,
            &spec.metrics,
            spec.controls,
            &spec.wiring,
            &spec.task_events,
        )?;
        Ok(Box::new(LocalAttempt { threads }))
    }
}
