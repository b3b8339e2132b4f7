//! The job master: one job's lifecycle, driven by subtask events on a single thread.
//!
//! The job's states each have their module in [`states`], which says what the master does
//! there on each event (Arroyo's controller layout): `created` (build the job graph and the
//! checkpoint coordinator, deploy or reconcile), `running` (supervise: task events,
//! checkpoints, savepoints, region restarts), `restarting` (wait for the old attempt to end
//! and the strategy's delay, restore the newest checkpoint, deploy again), `failing`,
//! `cancelling`, `reconciling` (a new leader JobManager adopts the attempt that kept running
//! on the TaskManagers), `suspended` (this JobManager lost its leadership: it stops without
//! touching the tasks) and `finished`. Every transition is checked by [`StateHistory`]
//! against Flink's legal moves and timestamped. The master also runs the job's checkpoint
//! coordinator on the same thread. It is the only writer of the job's state; REST and the
//! CLI read snapshots of it.

pub mod checkpoint_outcomes;
mod checkpoint_requests;
pub mod effects;
pub mod events;
mod run;
mod states;
pub mod takeover;
pub mod transitions;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::operator::TaskMetrics;
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobId, JobStatus, Lifecycle, StateHistory};

use crate::checkpointing::settings::CheckpointSettings;
use crate::checkpointing::stats::CheckpointStats;
use crate::job_settings::JobSettings;
use crate::jobgraph::JobGraph;

pub use events::MasterEvent;
pub(crate) use run::confine_target;

/// Where a user's checkpoint request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointRequestStatus {
    /// Waiting for a slot or triggered, not complete.
    InProgress,
    /// The checkpoint with this id completed.
    Completed(u64),
    /// No checkpoint completed for it, for this reason.
    Failed(String),
}

/// Where a user's savepoint request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavepointStatus {
    /// Triggered, not complete.
    InProgress,
    /// Complete, at this location.
    Completed(String),
    /// Failed, with this cause.
    Failed(String),
}

/// One failure, as the exceptions history shows it.
#[derive(Clone, Debug)]
pub struct ExceptionEntry {
    /// Error class (`UserFunctionError` ...).
    pub name: String,
    /// The error message.
    pub message: String,
    /// When it happened, epoch milliseconds.
    pub timestamp_ms: u64,
    /// The failed task, e.g. `KeyedProcess -> Sink: out (2/4)`.
    pub task_name: String,
    /// Where it ran.
    pub location: String,
}

/// The host shown for subtasks of the embedded cluster.
pub(crate) const LOCAL_HOST: &str = "localhost";

/// One subtask as the job master tracks it.
pub struct SubtaskRecord {
    /// State and transition times.
    pub history: StateHistory<ExecutionState>,
    /// Live counters.
    pub metrics: Arc<TaskMetrics>,
    /// Where it runs: a TaskManager id, or `localhost` on the embedded cluster.
    pub host: String,
    /// Its input ended and it waits for the job's final checkpoint.
    pub data_ended: bool,
}

/// The state a job master owns; readers lock it briefly to build views.
pub struct JobRecord {
    /// The job's state and transition times.
    pub history: StateHistory<JobStatus>,
    /// The job graph, once built.
    pub job_graph: Option<Arc<JobGraph>>,
    /// Subtasks per vertex.
    pub subtasks: Vec<Vec<SubtaskRecord>>,
    /// Failures, oldest first.
    pub exceptions: Vec<ExceptionEntry>,
    /// Why the job failed, when it did.
    pub failure_cause: Option<String>,
    /// Restarts after failures so far.
    pub restarts: u32,
    /// Savepoint requests by id, with whether a client has read the final status.
    pub savepoints: std::collections::HashMap<String, (SavepointStatus, bool)>,
    /// The checkpoint id each savepoint request was given, for its progress.
    pub savepoint_checkpoints: std::collections::HashMap<String, u64>,
    /// Users' checkpoint requests by id.
    pub checkpoint_requests: std::collections::HashMap<String, CheckpointRequestStatus>,
    /// The snapshot the current attempt restored: (location, checkpoint id, bytes to read).
    pub restore: Option<(String, u64, u64)>,
}

impl JobRecord {
    /// A record in `initial` since `at_ms`, with nothing else known yet.
    fn new(initial: JobStatus, at_ms: u64, failure_cause: Option<String>) -> JobRecord {
        JobRecord {
            history: StateHistory::new(initial, at_ms),
            job_graph: None,
            subtasks: Vec::new(),
            exceptions: Vec::new(),
            failure_cause,
            savepoints: std::collections::HashMap::new(),
            savepoint_checkpoints: std::collections::HashMap::new(),
            checkpoint_requests: std::collections::HashMap::new(),
            restore: None,
            restarts: 0,
        }
    }
}

/// The execution configuration `GET /jobs/{id}/config` shows.
fn execution_config(
    restart_strategy: String,
    job_parallelism: u32,
    failover_strategy: &str,
) -> (crate::status::ExecutionConfigInfo, crate::status::WeirExecutionConfig) {
    (
        crate::status::ExecutionConfigInfo {
            restart_strategy,
            job_parallelism,
            object_reuse_mode: false,
            user_config: Default::default(),
        },
        crate::status::WeirExecutionConfig {
            execution_mode: "PIPELINED".into(),
            max_parallelism: 0,
            failover_strategy: failover_strategy.into(),
        },
    )
}

/// A running (or ended) job.
pub struct JobMaster {
    job_id: JobId,
    job_name: String,
    record: Mutex<JobRecord>,
    changed: Condvar,
    control: Sender<MasterEvent>,
    /// Set by [`JobMaster::cancel`] at once, so a deploy waiting for slots stops waiting
    /// (the master thread cannot read its events meanwhile).
    cancel_requested: Arc<AtomicBool>,
    location: String,
    checkpoint_stats: Arc<Mutex<CheckpointStats>>,
    checkpoint_settings: CheckpointSettings,
    execution_config: (crate::status::ExecutionConfigInfo, crate::status::WeirExecutionConfig),
}

impl JobMaster {
    /// Accepts `graph` as job `job_id` and starts its master thread.
    pub fn start(
        job_id: JobId,
        graph: StreamGraph,
        settings: JobSettings,
        location: &str,
    ) -> Result<Arc<JobMaster>, TaskError> {
        let (master, events) = JobMaster::accept(job_id, &graph, &settings, location);
        let runner = Arc::clone(&master);
        std::thread::Builder::new()
            .name(format!("weir-jobmaster-{}", &job_id.to_string()[..8]))
            .spawn(move || states::drive(runner, graph, settings, events))
            .map_err(|e| TaskError::external("starting the job master thread", e))?;
        Ok(master)
    }

    /// The master of a job just accepted (INITIALIZING), with the receiver of its events;
    /// nothing runs it yet.
    fn accept(
        job_id: JobId,
        graph: &StreamGraph,
        settings: &JobSettings,
        location: &str,
    ) -> (Arc<JobMaster>, Receiver<MasterEvent>) {
        let (control, events) = crossbeam_channel::unbounded();
        let execution_config = execution_config(
            settings.restart.describe(),
            settings.default_parallelism,
            if settings.failover_full { "full" } else { "region" },
        );
        let master = Arc::new(JobMaster::assemble(
            job_id,
            &graph.job_name,
            JobRecord::new(JobStatus::Initializing, now_ms(), None),
            control,
            location,
            settings.checkpointing.clone(),
            execution_config,
        ));
        (master, events)
    }

    /// A job that ended under an earlier leader, as the job result store recorded it: it
    /// runs nothing and answers queries (status, failure, `wait_terminal`) so a client that
    /// waits on a job across a JobManager failover learns how it ended.
    pub fn ended(
        job_id: JobId,
        job_name: &str,
        status: JobStatus,
        end_time_ms: u64,
        failure: Option<String>,
        location: &str,
    ) -> Arc<JobMaster> {
        // Nobody reads the events: requests to an ended job are refused by its status first.
        let (control, _) = crossbeam_channel::unbounded();
        let execution_config = execution_config(String::new(), 0, "");
        Arc::new(JobMaster::assemble(
            job_id,
            job_name,
            JobRecord::new(status, end_time_ms, failure),
            control,
            location,
            CheckpointSettings::default(),
            execution_config,
        ))
    }

    fn assemble(
        job_id: JobId,
        job_name: &str,
        record: JobRecord,
        control: Sender<MasterEvent>,
        location: &str,
        checkpoint_settings: CheckpointSettings,
        execution_config: (crate::status::ExecutionConfigInfo, crate::status::WeirExecutionConfig),
    ) -> JobMaster {
        JobMaster {
            job_id,
            job_name: job_name.to_string(),
            record: Mutex::new(record),
            changed: Condvar::new(),
            control,
            cancel_requested: Arc::new(AtomicBool::new(false)),
            location: location.to_string(),
            checkpoint_stats: Arc::new(Mutex::new(CheckpointStats::default())),
            checkpoint_settings,
            execution_config,
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// The job's name.
    pub fn job_name(&self) -> &str {
        &self.job_name
    }

    /// Locks the job's record for reading.
    pub fn record(&self) -> MutexGuard<'_, JobRecord> {
        match self.record.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The job's current state.
    pub fn status(&self) -> JobStatus {
        self.record().history.current()
    }

    /// Asks the job to cancel; the answer comes as state changes (CANCELLING, CANCELED).
    pub fn cancel(&self) -> Result<(), JobStatus> {
        let status = self.status();
        if status.is_terminal() {
            return Err(status);
        }
        self.cancel_requested.store(true, Ordering::SeqCst);
        let _ = self.control.send(MasterEvent::Cancel);
        Ok(())
    }

    /// Blocks until the job reaches a terminal state or `timeout` passes; returns the state.
    pub fn wait_terminal(&self, timeout: Option<Duration>) -> JobStatus {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut record = self.record();
        loop {
            let status = record.history.current();
            if status.is_terminal() {
                return status;
            }
            let wait = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return status;
                    }
                    deadline - now
                }
                None => Duration::from_secs(3600),
            };
            record = match self.changed.wait_timeout(record, wait) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Asks for a savepoint into `target` (else `state.savepoints.dir`); with `terminate`
    /// the job stops once it completes. Returns the request id to poll.
    pub fn trigger_savepoint(&self, target: Option<String>, terminate: bool) -> Result<String, String> {
        self.trigger_savepoint_as(target, terminate, weir_api::snapshot::SnapshotFormat::Canonical)
    }

    /// [`Self::trigger_savepoint`] in `format` (Flink's `formatType`).
    pub fn trigger_savepoint_as(
        &self,
        target: Option<String>,
        terminate: bool,
        format: weir_api::snapshot::SnapshotFormat,
    ) -> Result<String, String> {
        self.trigger_snapshot(target, terminate, format, false)
    }

    /// Stop-with-savepoint in `format`; with `drain` (Flink's `stop --drain`) the sources
    /// emit the final watermark first, so every event-time window fires before the savepoint.
    pub fn trigger_stop(
        &self,
        target: Option<String>,
        format: weir_api::snapshot::SnapshotFormat,
        drain: bool,
    ) -> Result<String, String> {
        self.trigger_snapshot(target, true, format, drain)
    }

    fn trigger_snapshot(
        &self,
        target: Option<String>,
        terminate: bool,
        format: weir_api::snapshot::SnapshotFormat,
        drain: bool,
    ) -> Result<String, String> {
        let status = self.status();
        if status != JobStatus::Running {
            return Err(format!("job {} is {status}; savepoints are taken of RUNNING jobs only", self.job_id));
        }
        if target.is_none() && self.checkpoint_settings.savepoints_url.is_none() {
            return Err("no savepoint directory: give one, or set state.savepoints.dir".to_string());
        }
        let target = match target {
            Some(target) => Some(confine_target(&target, self.checkpoint_settings.savepoints_url.as_deref())?),
            None => None,
        };
        let request_id = JobId::generate().to_string();
        self.update(|record| {
            record.savepoints.insert(request_id.clone(), (SavepointStatus::InProgress, false));
        });
        let _ = self.control.send(MasterEvent::TriggerSavepoint {
            request_id: request_id.clone(),
            target,
            terminate,
            format,
            drain,
        });
        Ok(request_id)
    }

    /// Asks for a checkpoint now (Flink's `POST /jobs/{id}/checkpoints`): its request id, or
    /// why the job cannot take one. `request_id` is the client's own trigger id, if it chose
    /// one.
    pub fn trigger_checkpoint(&self, request_id: Option<String>, full: bool) -> Result<String, String> {
        let status = self.status();
        if status != JobStatus::Running {
            return Err(format!("job {} is {status}; checkpoints are taken of RUNNING jobs only", self.job_id));
        }
        if self.checkpoint_settings.interval.is_none() {
            return Err(format!(
                "job {} runs without checkpoints; set execution.checkpointing.interval to take them",
                self.job_id
            ));
        }
        let request_id = request_id.unwrap_or_else(|| JobId::generate().to_string());
        let mut fresh = false;
        self.update(|record| {
            if !record.checkpoint_requests.contains_key(&request_id) {
                record.checkpoint_requests.insert(request_id.clone(), CheckpointRequestStatus::InProgress);
                fresh = true;
            }
        });
        if !fresh {
            return Err(format!("trigger id {request_id} was already used; choose another or leave it out"));
        }
        let _ = self.control.send(MasterEvent::TriggerCheckpoint { request_id: request_id.clone(), full });
        Ok(request_id)
    }

    /// The state of checkpoint request `request_id`.
    pub fn checkpoint_request_status(&self, request_id: &str) -> Option<CheckpointRequestStatus> {
        self.record().checkpoint_requests.get(request_id).cloned()
    }

    /// The state of savepoint request `request_id` (reading a final state marks it reported).
    pub fn savepoint_status(&self, request_id: &str) -> Option<SavepointStatus> {
        let mut record = self.record();
        let (status, reported) = record.savepoints.get_mut(request_id)?;
        if *status != SavepointStatus::InProgress {
            *reported = true;
        }
        Some(status.clone())
    }

    /// True while a savepoint request's final state has not been read by its client (an
    /// embedded cluster keeps its REST API up a moment longer for it). A stop's is still in
    /// progress for a moment after the job shows FINISHED: it completes once that is recorded.
    pub fn has_unreported_savepoints(&self) -> bool {
        self.record().savepoints.values().any(|(_, reported)| !reported)
    }

    /// Checkpoint counts and history.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        match self.checkpoint_stats.lock() {
            Ok(stats) => stats.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The execution settings the job was submitted with (max parallelism filled in by
    /// [`JobMaster::config`]).
    pub fn execution_config(&self) -> &(crate::status::ExecutionConfigInfo, crate::status::WeirExecutionConfig) {
        &self.execution_config
    }

    /// The job's checkpoint settings.
    pub fn checkpoint_settings(&self) -> &CheckpointSettings {
        &self.checkpoint_settings
    }

    /// Why the job failed, if it did.
    pub fn failure_cause(&self) -> Option<String> {
        self.record().failure_cause.clone()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut JobRecord)) {
        let mut record = self.record();
        f(&mut record);
        drop(record);
        self.changed.notify_all();
    }

    pub(crate) fn transition_job(&self, record: &mut JobRecord, next: JobStatus) {
        if let Err(illegal) = record.history.transition(next, now_ms()) {
            // A refused move is a bug in this file; keep the job in its state and say so.
            tracing::error!(job_id = %self.job_id, error = %illegal, "job state machine refused a transition");
            // The job master's own tests step it through every path: there it is a failure.
            #[cfg(test)]
            panic!("job {}: {illegal}", self.job_id);
        }
    }
}
