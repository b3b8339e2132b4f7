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
use crate::job_master::MasterEvent;
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

/// Starts attempts.
pub trait Executor: Send + Sync {
    /// Deploys every subtask of the attempt.
    fn start(&self, spec: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError>;
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
