//! The job master: one job's lifecycle, driven by subtask events on a single thread.
//!
//! Transitions (all checked by [`StateHistory`]): INITIALIZING -> CREATED -> RUNNING, then
//! FINISHED when every subtask finished (or a stop-with-savepoint completed); FAILING ->
//! FAILED when a subtask fails or checkpoints fail beyond the tolerable number and the
//! restart strategy gives up; RUNNING -> RESTARTING -> RUNNING when it restarts the whole
//! job; CANCELLING -> CANCELED on a cancel request. With region failover (the default, for a
//! job running in this process) a failure restarts only its pipelined region while the job
//! stays RUNNING, as in Flink. The master also runs the job's checkpoint coordinator on the same thread. It is
//! the only writer of the job's state; REST and the CLI read snapshots of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::operator::TaskMetrics;
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobId, JobStatus, Lifecycle, StateHistory};

use weir_api::snapshot::TaskControl;

use crate::checkpointing::CheckpointCoordinator;
use crate::checkpointing::RestoreSource;
use crate::checkpointing::coordinator::SnapshotDirs;
use crate::checkpointing::coordinator::{Failure, OperatorInfo, SnapshotRequest};
use crate::checkpointing::settings::CheckpointSettings;
use crate::checkpointing::stats::CheckpointStats;
use crate::checkpointing::writer::{SnapshotWriter, WriteJob, WriteOutcome};
use crate::execution::{CheckpointWiring, TaskEvent, TaskEventKind};
use crate::executor::{AttemptHandle, AttemptSpec, Executor, LocalExecutor};
use crate::jobgraph::{JobGraph, JobSettings};
use crate::restart::{RestartDecision, RestartStrategy};

/// Longest the job master sleeps between looks at its checkpoint schedule.
const SUPERVISOR_TICK: Duration = Duration::from_millis(50);

/// What the supervising loop keeps besides the job record.
struct Supervisor {
    coordinator: CheckpointCoordinator,
    controls: Vec<Vec<Sender<TaskControl>>>,
    source_vertices: Vec<usize>,
    savepoints_url: Option<String>,
    any_finished: bool,
    restart: RestartStrategy,
    /// Set when the current attempt ends in a restart after this delay.
    pending_restart: Option<Duration>,
    started: Instant,
    /// Regions that failed and redeploy once their subtasks ended and the delay passed.
    region_restarts: Vec<(usize, Instant)>,
    /// Kept in region mode so that a region restart can join the running attempt's events.
    task_events: Option<Sender<TaskEvent>>,
    /// Started attempts with their region (one per region in region mode); joined when
    /// their region redeploys or the job ends.
    handles: Vec<(Option<usize>, Box<dyn AttemptHandle>)>,
    /// The number the next deploy takes: every deploy (whole job or one region) has its own,
    /// so TaskManagers and part-file names tell concurrent region attempts apart.
    next_attempt: u32,
    /// Savepoints asked for while subtasks were still starting: they are taken once every
    /// subtask runs, or fail at their deadline.
    waiting_savepoints: Vec<WaitingSavepoint>,
    /// The final checkpoint: the first one triggered after every subtask's input ended.
    /// Once it completes the subtasks are told to finish.
    final_checkpoint: Option<u64>,
    /// The final checkpoint completed and `Finish` went out: no more checkpoints.
    finishing: bool,
}

/// A savepoint request waiting for every subtask to be RUNNING.
struct WaitingSavepoint {
    request_id: String,
    target: Option<String>,
    terminate: bool,
    deadline: Instant,
}

/// How long a savepoint asked for while subtasks start waits for them to run (a job is
/// RUNNING a moment before its subtasks are, so `weir stop` right after `weir run -d` works).
const SAVEPOINT_WAITS_FOR_RUNNING: Duration = Duration::from_secs(30);

/// What every deploy of the job needs.
struct Deployment {
    graph: Arc<StreamGraph>,
    job_graph: Arc<JobGraph>,
    executor: Arc<dyn Executor>,
    exactly_once: bool,
    /// Periodic checkpoints are on: tasks wait at the end of their input for the final one.
    final_checkpoint: bool,
    dirs: SnapshotDirs,
    writer: Sender<WriteJob>,
    snapshot_events: Sender<MasterEvent>,
    /// The snapshot the job was submitted with.
    initial_restore: Option<Arc<RestoreSource>>,
    /// The pipelined region of each vertex when failures restart only their region.
    regions: Option<Arc<Vec<usize>>>,
}

impl Deployment {
    fn in_region(&self, vertex: usize, region: Option<usize>) -> bool {
        match (region, &self.regions) {
            (Some(region), Some(regions)) => regions.get(vertex) == Some(&region),
            _ => true,
        }
    }
}

impl Supervisor {
    fn send_to_sources(&self, message: TaskControl) {
        for vertex in &self.source_vertices {
            for control in &self.controls[*vertex] {
                let _ = control.send(message);
            }
        }
    }

    fn send_to_all(&self, message: TaskControl) {
        // Ended subtasks dropped their receivers; a failed send to them is expected.
        for control in self.controls.iter().flatten() {
            let _ = control.send(message);
        }
    }
}

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
    },
    /// The snapshot writer finished a subtask's snapshot (or could not).
    Snapshot(WriteOutcome),
}

impl From<WriteOutcome> for MasterEvent {
    fn from(outcome: WriteOutcome) -> MasterEvent {
        MasterEvent::Snapshot(outcome)
    }
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

impl From<TaskEvent> for MasterEvent {
    fn from(event: TaskEvent) -> MasterEvent {
        MasterEvent::Task(event)
    }
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
const LOCAL_HOST: &str = "localhost";

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
    /// The snapshot the current attempt restored: (location, checkpoint id, bytes to read).
    pub restore: Option<(String, u64, u64)>,
}

/// A running (or ended) job.
pub struct JobMaster {
    job_id: JobId,
    job_name: String,
    record: Mutex<JobRecord>,
    changed: Condvar,
    control: Sender<MasterEvent>,
    /// The cancel flags of the running subtasks: one per attempt, or one per region in
    /// region mode (a restart gets a fresh one).
    cancel: Mutex<Vec<Arc<AtomicBool>>>,
    /// Set by [`JobMaster::cancel`] at once, so a deploy waiting for slots stops waiting
    /// (the master thread cannot read its events meanwhile).
    cancel_requested: Arc<AtomicBool>,
    location: String,
    checkpoint_stats: Arc<Mutex<CheckpointStats>>,
    checkpoint_settings: CheckpointSettings,
    execution_config: crate::status::ExecutionConfigInfo,
}

impl JobMaster {
    /// Accepts `graph` as job `job_id` and starts its master thread.
    pub fn start(
        job_id: JobId,
        graph: StreamGraph,
        settings: JobSettings,
        location: &str,
    ) -> Result<Arc<JobMaster>, TaskError> {
        let (control, events) = crossbeam_channel::unbounded();
        let master = Arc::new(JobMaster {
            job_id,
            job_name: graph.job_name.clone(),
            record: Mutex::new(JobRecord {
                history: StateHistory::new(JobStatus::Initializing, now_ms()),
                job_graph: None,
                subtasks: Vec::new(),
                exceptions: Vec::new(),
                failure_cause: None,
                savepoints: std::collections::HashMap::new(),
                savepoint_checkpoints: std::collections::HashMap::new(),
                restore: None,
                restarts: 0,
            }),
            changed: Condvar::new(),
            control,
            cancel: Mutex::new(Vec::new()),
            cancel_requested: Arc::new(AtomicBool::new(false)),
            location: location.to_string(),
            checkpoint_stats: Arc::new(Mutex::new(CheckpointStats::default())),
            checkpoint_settings: settings.checkpointing.clone(),
            execution_config: crate::status::ExecutionConfigInfo {
                execution_mode: "PIPELINED".into(),
                restart_strategy: settings.restart.describe(),
                job_parallelism: settings.default_parallelism,
                max_parallelism: 0,
                failover_strategy: if settings.failover_full { "full" } else { "region" }.into(),
                object_reuse_mode: false,
            },
        });
        let runner = Arc::clone(&master);
        std::thread::Builder::new()
            .name(format!("weir-jobmaster-{}", &job_id.to_string()[..8]))
            .spawn(move || runner.run(graph, settings, events))
            .map_err(|e| TaskError::external("starting the job master thread", e))?;
        Ok(master)
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
        let _ = self.control.send(MasterEvent::TriggerSavepoint { request_id: request_id.clone(), target, terminate });
        Ok(request_id)
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

    /// True while a finished savepoint request has not been read by its client (an embedded
    /// cluster keeps its REST API up a moment longer for it).
    pub fn has_unreported_savepoints(&self) -> bool {
        self.record().savepoints.values().any(|(status, reported)| *status != SavepointStatus::InProgress && !reported)
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
    pub fn execution_config(&self) -> &crate::status::ExecutionConfigInfo {
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

    fn update(&self, f: impl FnOnce(&mut JobRecord)) {
        let mut record = self.record();
        f(&mut record);
        drop(record);
        self.changed.notify_all();
    }

    fn transition_job(&self, record: &mut JobRecord, next: JobStatus) {
        if let Err(illegal) = record.history.transition(next, now_ms()) {
            // A refused move is a bug in this file; keep the job in its state and say so.
            tracing::error!(job_id = %self.job_id, error = %illegal, "job state machine refused a transition");
        }
    }

    fn run(self: Arc<Self>, graph: StreamGraph, settings: JobSettings, events: Receiver<MasterEvent>) {
        let job_graph = match JobGraph::build(&graph, &settings) {
            Ok(job_graph) => Arc::new(job_graph),
            Err(error) => {
                self.update(|record| {
                    record.failure_cause = Some(error.to_string());
                    self.transition_job(record, JobStatus::Failed);
                });
                return;
            }
        };
        let metrics = job_graph.new_task_metrics();
        self.update(|record| {
            record.job_graph = Some(Arc::clone(&job_graph));
            record.subtasks = metrics
                .iter()
                .map(|vertex| {
                    vertex
                        .iter()
                        .map(|m| SubtaskRecord {
                            history: StateHistory::new(ExecutionState::Created, now_ms()),
                            metrics: Arc::clone(m),
                            host: LOCAL_HOST.to_string(),
                            data_ended: false,
                        })
                        .collect()
                })
                .collect();
            self.transition_job(record, JobStatus::Created);
        });

        // A cancel that arrived while the job was being created ends it before it runs.
        if let Ok(MasterEvent::Cancel) = events.try_recv() {
            self.update(|record| {
                self.transition_job(record, JobStatus::Cancelling);
                self.transition_job(record, JobStatus::Canceled);
            });
            return;
        }

        let mut operators = Vec::new();
        for node in graph.nodes() {
            let vertex = &job_graph.vertices[job_graph.vertex_of_node[node.id]];
            operators.push(OperatorInfo {
                uid: node.uid_or_generated(),
                name: node.name.clone(),
                parallelism: vertex.parallelism,
                vertex: job_graph.vertex_of_node[node.id],
            });
        }
        let first_id = settings.restore.as_ref().map(|r| r.metadata.checkpoint_id + 1).unwrap_or(1);
        if let Some(restore) = &settings.restore
            && let Ok(mut stats) = self.checkpoint_stats.lock()
        {
            stats.restored = Some((restore.metadata.checkpoint_id, restore.location.clone(), now_ms()));
        }
        if let Some(restore) = &settings.restore {
            let total = restore.total_bytes();
            self.update(|record| {
                record.restore = Some((restore.location.clone(), restore.metadata.checkpoint_id, total));
            });
        }
        let coordinator = match CheckpointCoordinator::new(
            settings.checkpointing.clone(),
            &self.job_id.to_string(),
            &self.job_name,
            job_graph.max_parallelism,
            operators,
            job_graph.subtask_count() as usize,
            first_id,
            Arc::clone(&self.checkpoint_stats),
        ) {
            Ok(coordinator) => coordinator,
            Err(error) => return self.fail_before_start(error),
        };
        let (snapshot_events, snapshot_receiver) = crossbeam_channel::unbounded::<MasterEvent>();
        let writer = match SnapshotWriter::start(snapshot_events.clone()) {
            Ok(writer) => writer,
            Err(error) => return self.fail_before_start(format!("cannot start the snapshot writer threads: {error}")),
        };
        let graph = Arc::new(graph);
        let source_vertices: Vec<usize> = job_graph
            .vertices
            .iter()
            .enumerate()
            .filter(|(_, v)| graph.nodes()[v.nodes[0]].role == weir_api::graph::NodeRole::Source)
            .map(|(index, _)| index)
            .collect();
        let seed =
            (self.job_id.to_string().bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))) | 1;
        let mut supervisor = Supervisor {
            coordinator,
            controls: Vec::new(),
            source_vertices,
            savepoints_url: settings.checkpointing.savepoints_url.clone(),
            any_finished: false,
            restart: RestartStrategy::new(settings.restart.clone(), seed),
            pending_restart: None,
            started: Instant::now(),
            region_restarts: Vec::new(),
            task_events: None,
            handles: Vec::new(),
            next_attempt: 0,
            waiting_savepoints: Vec::new(),
            final_checkpoint: None,
            finishing: false,
        };
        // A job of one region restarts whole anyway.
        let regions = Some(job_graph.regions())
            .filter(|regions| !settings.failover_full && regions.iter().any(|r| *r > 0))
            .map(Arc::new);
        let region_count = regions.as_ref().map(|r| r.iter().max().map_or(0, |m| m + 1));
        let deployment = Deployment {
            graph,
            job_graph: Arc::clone(&job_graph),
            executor: match &settings.executor {
                Some(executor) => Arc::clone(executor),
                None => Arc::new(LocalExecutor),
            },
            exactly_once: settings.checkpointing.exactly_once,
            final_checkpoint: settings.checkpointing.interval.is_some(),
            dirs: supervisor.coordinator.dirs(),
            writer: writer.queue(),
            snapshot_events: snapshot_events.clone(),
            initial_restore: settings.restore.clone(),
            regions,
        };
        let mut restore = settings.restore.clone();
        loop {
            self.update(|record| self.transition_job(record, JobStatus::Running));
            supervisor.controls = vec![Vec::new(); job_graph.vertices.len()];
            let (task_events, task_receiver) = crossbeam_channel::unbounded::<TaskEvent>();
            let deployed = match region_count {
                None => self.deploy(&deployment, &mut supervisor, None, restore.clone(), task_events),
                Some(count) => {
                    let deployed = (0..count).try_for_each(|region| {
                        self.deploy(&deployment, &mut supervisor, Some(region), restore.clone(), task_events.clone())
                    });
                    supervisor.task_events = Some(task_events);
                    deployed
                }
            };
            if let Err(error) = deployed {
                self.stop_tasks();
                if matches!(error, TaskError::Cancelled) && self.cancel_requested.load(Ordering::SeqCst) {
                    self.cancel_before_start();
                } else {
                    self.fail_before_start(error.to_string());
                }
                supervisor.task_events = None;
                supervisor.handles.drain(..).for_each(|(_, handle)| handle.join());
                break;
            }
            supervisor.any_finished = false;
            supervisor.final_checkpoint = None;
            supervisor.finishing = false;
            supervisor.pending_restart = None;
            self.supervise(&deployment, &events, &task_receiver, &snapshot_receiver, &mut supervisor);
            supervisor.task_events = None;
            supervisor.handles.drain(..).for_each(|(_, handle)| handle.join());
            let Some(delay) = supervisor.pending_restart.take() else {
                break;
            };
            if !self.wait_before_restart(delay, &events) {
                break;
            }
            match self.restore_for_restart(&supervisor, &deployment.graph, &job_graph) {
                Ok(Some(latest)) => restore = Some(latest),
                Ok(None) => {}
                Err(cause) => {
                    self.fail_before_start(cause);
                    break;
                }
            }
            tracing::info!(job_id = %self.job_id, attempt = supervisor.next_attempt, "restarting the job");
        }
        writer.shutdown();
    }

    fn cancel_flags(&self) -> MutexGuard<'_, Vec<Arc<AtomicBool>>> {
        match self.cancel.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Tells every running subtask to stop.
    fn stop_tasks(&self) {
        for flag in self.cancel_flags().iter() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Starts the subtasks of `region` (of the whole job when `None`) as a new attempt
    /// restoring `restore`.
    fn deploy(
        &self,
        deployment: &Deployment,
        supervisor: &mut Supervisor,
        region: Option<usize>,
        restore: Option<Arc<RestoreSource>>,
        task_events: Sender<TaskEvent>,
    ) -> Result<(), TaskError> {
        let job_graph = &deployment.job_graph;
        let attempt = supervisor.next_attempt;
        supervisor.next_attempt += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let mut flags = self.cancel_flags();
            match region {
                Some(region) => {
                    if flags.len() <= region {
                        flags.resize_with(region + 1, || Arc::new(AtomicBool::new(false)));
                    }
                    flags[region] = Arc::clone(&cancel);
                }
                None => *flags = vec![Arc::clone(&cancel)],
            }
        }
        let metrics = job_graph.new_task_metrics();
        self.update(|record| {
            for (vertex, vertex_metrics) in metrics.iter().enumerate() {
                if !deployment.in_region(vertex, region) {
                    continue;
                }
                let records = vertex_metrics
                    .iter()
                    .map(|m| {
                        // SCHEDULED while the executor finds slots, then DEPLOYING.
                        let mut history = StateHistory::new(ExecutionState::Created, now_ms());
                        let _ = history.transition(ExecutionState::Scheduled, now_ms());
                        SubtaskRecord {
                            history,
                            metrics: Arc::clone(m),
                            host: LOCAL_HOST.to_string(),
                            data_ended: false,
                        }
                    })
                    .collect();
                if let Some(slot) = record.subtasks.get_mut(vertex) {
                    *slot = records;
                }
            }
        });
        let mut control_receivers = Vec::with_capacity(job_graph.vertices.len());
        for (index, vertex) in job_graph.vertices.iter().enumerate() {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..vertex.parallelism).map(|_| crossbeam_channel::unbounded::<TaskControl>()).unzip();
            if deployment.in_region(index, region)
                && let Some(slot) = supervisor.controls.get_mut(index)
            {
                *slot = senders;
            }
            control_receivers.push(receivers);
        }
        let spec = AttemptSpec {
            job_id: self.job_id,
            job_name: self.job_name.clone(),
            attempt,
            graph: Arc::clone(&deployment.graph),
            job_graph: Arc::clone(job_graph),
            metrics,
            controls: control_receivers,
            wiring: CheckpointWiring {
                exactly_once: deployment.exactly_once,
                final_checkpoint: deployment.final_checkpoint,
                dirs: Arc::clone(&deployment.dirs),
                writer: deployment.writer.clone(),
                restore: restore.clone(),
            },
            cancel,
            job_cancelled: Arc::clone(&self.cancel_requested),
            task_events,
            snapshot_events: deployment.snapshot_events.clone(),
            restore,
            region: region.zip(deployment.regions.clone()).map(|(region, regions)| (regions, region)),
        };
        let handle = deployment.executor.start(spec)?;
        self.update(|record| {
            for (vertex, subtasks) in record.subtasks.iter_mut().enumerate() {
                if deployment.in_region(vertex, region) {
                    for (index, subtask) in subtasks.iter_mut().enumerate() {
                        subtask.host = handle.host_of(index as u32).unwrap_or_else(|| LOCAL_HOST.to_string());
                        // Task events are applied only after this deploy returns, so no
                        // subtask has reported INITIALIZING yet.
                        let _ = subtask.history.transition(ExecutionState::Deploying, now_ms());
                    }
                }
            }
        });
        supervisor.handles.push((region, handle));
        Ok(())
    }

    /// Redeploys the failed regions whose subtasks all ended and whose restart delay passed,
    /// each restoring the newest completed checkpoint.
    fn redeploy_regions(&self, deployment: &Deployment, supervisor: &mut Supervisor) {
        let now = Instant::now();
        let ready: Vec<usize> = {
            let record = self.record();
            if record.history.current() != JobStatus::Running {
                // The job is ending (cancel, or a failure the strategy gave up on).
                supervisor.region_restarts.clear();
                return;
            }
            supervisor
                .region_restarts
                .iter()
                .filter(|(region, at)| {
                    *at <= now
                        && record.subtasks.iter().enumerate().all(|(vertex, subtasks)| {
                            !deployment.in_region(vertex, Some(*region))
                                || subtasks.iter().all(|s| s.history.current().is_terminal())
                        })
                })
                .map(|(region, _)| *region)
                .collect()
        };
        for region in ready {
            supervisor.region_restarts.retain(|(r, _)| *r != region);
            // The region's subtasks all ended: its old attempt gives back its slots.
            let (ended, running): (Vec<_>, Vec<_>) =
                supervisor.handles.drain(..).partition(|(r, _)| *r == Some(region));
            supervisor.handles = running;
            ended.into_iter().for_each(|(_, handle)| handle.join());
            let restore = match self.restore_for_restart(supervisor, &deployment.graph, &deployment.job_graph) {
                Ok(Some(latest)) => Ok(Some(latest)),
                Ok(None) => Ok(deployment.initial_restore.clone()),
                Err(cause) => Err(cause),
            };
            let deployed = restore.and_then(|restore| match supervisor.task_events.clone() {
                Some(events) => self
                    .deploy(deployment, supervisor, Some(region), restore, events)
                    .map_err(|e| format!("cannot redeploy pipelined region {region}: {e}")),
                None => Err(format!("cannot redeploy pipelined region {region}: the attempt has ended")),
            });
            match deployed {
                Ok(()) => {
                    tracing::info!(job_id = %self.job_id, region, attempt = supervisor.next_attempt - 1, "restarted a pipelined region")
                }
                Err(_) if self.cancel_requested.load(Ordering::SeqCst) => {
                    // A cancel stopped the wait for slots: the job ends CANCELED, not FAILED.
                    self.update(|record| self.on_cancel(record));
                    supervisor.region_restarts.clear();
                    return;
                }
                Err(cause) => {
                    self.update(|record| {
                        record.failure_cause = Some(cause);
                        self.transition_job(record, JobStatus::Failing);
                        self.stop_tasks();
                        mark_canceling(record, |_| true);
                        self.settle(record, false);
                    });
                    supervisor.region_restarts.clear();
                    return;
                }
            }
        }
    }

    /// Waits the restart strategy's delay in RESTARTING, answering cancel and savepoint
    /// requests meanwhile. False when the job was cancelled instead.
    fn wait_before_restart(&self, delay: Duration, events: &Receiver<MasterEvent>) -> bool {
        let deadline = Instant::now() + delay;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            match events.recv_timeout(deadline - now) {
                Ok(MasterEvent::Cancel) => {
                    self.update(|record| {
                        self.transition_job(record, JobStatus::Cancelling);
                        self.transition_job(record, JobStatus::Canceled);
                    });
                    return false;
                }
                Ok(MasterEvent::TriggerSavepoint { request_id, .. }) => self.update(|record| {
                    let cause = format!("job {} is RESTARTING; take the savepoint once it runs again", self.job_id);
                    record.savepoints.insert(request_id, (SavepointStatus::Failed(cause), false));
                }),
                Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return true,
            }
        }
    }

    /// The newest completed checkpoint as a restore source (same job, same parallelism).
    fn restore_for_restart(
        &self,
        supervisor: &Supervisor,
        graph: &StreamGraph,
        job_graph: &JobGraph,
    ) -> Result<Option<Arc<RestoreSource>>, String> {
        let Some((checkpoint_id, url)) = supervisor.coordinator.latest_retained() else {
            return Ok(None);
        };
        let storage = weir_checkpoint::SnapshotStorage::from_url(&url).map_err(|e| e.to_string())?;
        let blocking = storage.blocking();
        let metadata = blocking
            .block_on(weir_checkpoint::load_metadata(&storage))
            .map_err(|e| format!("cannot read checkpoint {checkpoint_id} to restart from: {e}"))?;
        let request = crate::cluster::resources::restore_request(graph, job_graph, false);
        let plan = weir_checkpoint::plan_restore(&metadata, &request)
            .map_err(|e| format!("cannot restart from checkpoint {checkpoint_id}: {e}"))?;
        if let Ok(mut stats) = self.checkpoint_stats.lock() {
            stats.restored = Some((checkpoint_id, url.clone(), now_ms()));
        }
        let source = RestoreSource { storage: blocking, location: url, metadata, plan };
        let total = source.total_bytes();
        self.update(|record| record.restore = Some((source.location.clone(), checkpoint_id, total)));
        Ok(Some(Arc::new(source)))
    }

    /// Ends the job CANCELED when a cancel arrived while it was being deployed.
    fn cancel_before_start(&self) {
        self.update(|record| {
            if matches!(record.history.current(), JobStatus::Running | JobStatus::Created | JobStatus::Restarting) {
                self.transition_job(record, JobStatus::Cancelling);
                mark_canceling(record, |_| true);
                self.settle(record, false);
            }
            if record.history.current() == JobStatus::Cancelling {
                self.transition_job(record, JobStatus::Canceled);
            }
        });
    }

    fn fail_before_start(&self, cause: String) {
        self.update(|record| {
            record.failure_cause = Some(cause);
            if record.history.current() == JobStatus::Running {
                self.transition_job(record, JobStatus::Failing);
            }
            self.transition_job(record, JobStatus::Failed);
        });
    }

    fn supervise(
        &self,
        deployment: &Deployment,
        control: &Receiver<MasterEvent>,
        tasks: &Receiver<TaskEvent>,
        snapshots: &Receiver<MasterEvent>,
        supervisor: &mut Supervisor,
    ) {
        loop {
            let now = Instant::now();
            let wait = match supervisor.coordinator.next_wakeup() {
                Some(at) => at.saturating_duration_since(now).min(SUPERVISOR_TICK),
                None => SUPERVISOR_TICK,
            };
            let event = crossbeam_channel::select! {
                recv(control) -> message => message.ok(),
                recv(snapshots) -> message => message.ok(),
                recv(tasks) -> message => match message {
                    Ok(event) => Some(MasterEvent::Task(event)),
                    // Every subtask thread ended and dropped its sender.
                    Err(_) => return,
                },
                default(wait) => None,
            };
            let mut finished = false;
            self.update(|record| {
                match event {
                    Some(MasterEvent::Cancel) => {
                        supervisor.pending_restart = None;
                        supervisor.region_restarts.clear();
                        self.on_cancel(record)
                    }
                    Some(MasterEvent::Task(task)) => {
                        if matches!(task.kind, TaskEventKind::Finished) && !supervisor.any_finished {
                            // Finished subtasks cannot take part in checkpoints any more.
                            supervisor.any_finished = true;
                            let failures =
                                supervisor.coordinator.abort_all("a subtask finished before the checkpoint completed");
                            self.on_checkpoint_failures(record, supervisor, failures);
                        }
                        self.on_task_event(record, deployment, task, supervisor);
                    }
                    Some(MasterEvent::TriggerSavepoint { request_id, target, terminate }) => {
                        self.on_trigger_savepoint(record, supervisor, request_id, target, terminate)
                    }
                    Some(MasterEvent::Snapshot(outcome)) => self.on_snapshot(record, supervisor, outcome),
                    None => {}
                }
                self.on_tick(record, supervisor);
                let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
                // A restart ends this attempt once every subtask has stopped.
                finished = record.history.current().is_terminal()
                    || (record.history.current() == JobStatus::Restarting && all_ended);
                if finished {
                    let failures = supervisor.coordinator.abort_all("the job ended");
                    self.on_checkpoint_failures(record, supervisor, failures);
                    let state = record.history.current();
                    for waiting in supervisor.waiting_savepoints.drain(..) {
                        let cause = format!(
                            "job {} went {state} before every subtask ran; no savepoint was taken",
                            self.job_id
                        );
                        record.savepoints.insert(waiting.request_id, (SavepointStatus::Failed(cause), false));
                    }
                }
            });
            if finished {
                return;
            }
            if !supervisor.region_restarts.is_empty() {
                self.redeploy_regions(deployment, supervisor);
            }
        }
    }

    /// True when every subtask runs: only then can a barrier reach every subtask.
    fn all_running(record: &JobRecord) -> bool {
        record.history.current() == JobStatus::Running
            && record.subtasks.iter().flatten().all(|s| s.history.current() == ExecutionState::Running)
    }

    fn on_tick(&self, record: &mut JobRecord, supervisor: &mut Supervisor) {
        let now = Instant::now();
        let failures = supervisor.coordinator.expire(now);
        self.on_checkpoint_failures(record, supervisor, failures);
        self.on_waiting_savepoints(record, supervisor, now);
        if supervisor.finishing || supervisor.any_finished || !Self::all_running(record) {
            return;
        }
        if supervisor.final_checkpoint.is_none()
            && supervisor.region_restarts.is_empty()
            && record.subtasks.iter().flatten().all(|s| s.data_ended)
        {
            if !supervisor.coordinator.periodic_slot_free() {
                // execution.checkpointing.max-concurrent-checkpoints binds the final one too.
                return;
            }
            // Every input ended: the next checkpoint is the final one; take it now.
            match supervisor.coordinator.trigger(SnapshotRequest::Periodic, None) {
                Ok(barrier) => {
                    tracing::info!(job_id = %self.job_id, checkpoint = barrier.checkpoint_id, "every input ended: final checkpoint");
                    supervisor.final_checkpoint = Some(barrier.checkpoint_id);
                    supervisor.send_to_sources(TaskControl::TriggerCheckpoint(barrier));
                }
                // Another checkpoint is in flight or the pause runs: try again on the next tick.
                Err(reason) => tracing::debug!(job_id = %self.job_id, %reason, "final checkpoint deferred"),
            }
            return;
        }
        if !supervisor.coordinator.periodic_due(now) {
            return;
        }
        match supervisor.coordinator.trigger(SnapshotRequest::Periodic, None) {
            Ok(barrier) => supervisor.send_to_sources(TaskControl::TriggerCheckpoint(barrier)),
            Err(error) => tracing::warn!(job_id = %self.job_id, error = %error, "cannot trigger a checkpoint"),
        }
    }

    /// Takes the waiting savepoints once every subtask runs; fails those past their deadline,
    /// and all of them once the job cannot run every subtask any more.
    fn on_waiting_savepoints(&self, record: &mut JobRecord, supervisor: &mut Supervisor, now: Instant) {
        if supervisor.waiting_savepoints.is_empty() {
            return;
        }
        let ready = Self::all_running(record) || supervisor.any_finished;
        for waiting in std::mem::take(&mut supervisor.waiting_savepoints) {
            if ready {
                // Triggers it, or fails it because a subtask finished.
                self.on_trigger_savepoint(record, supervisor, waiting.request_id, waiting.target, waiting.terminate);
            } else if now >= waiting.deadline {
                let states: Vec<String> = record
                    .subtasks
                    .iter()
                    .flatten()
                    .map(|s| s.history.current())
                    .filter(|s| *s != ExecutionState::Running)
                    .map(|s| s.name().to_string())
                    .collect();
                let cause = format!(
                    "job {} did not run every subtask within {} s of the savepoint request ({} subtask(s) {}); retry once `weir list` and the Web UI show them RUNNING",
                    self.job_id,
                    SAVEPOINT_WAITS_FOR_RUNNING.as_secs(),
                    states.len(),
                    states.first().map(String::as_str).unwrap_or("not RUNNING")
                );
                record.savepoints.insert(waiting.request_id, (SavepointStatus::Failed(cause), false));
            } else {
                supervisor.waiting_savepoints.push(waiting);
            }
        }
    }

    fn on_trigger_savepoint(
        &self,
        record: &mut JobRecord,
        supervisor: &mut Supervisor,
        request_id: String,
        target: Option<String>,
        terminate: bool,
    ) {
        let fail = |record: &mut JobRecord, cause: String| {
            record.savepoints.insert(request_id.clone(), (SavepointStatus::Failed(cause), false));
        };
        if supervisor.any_finished || supervisor.finishing {
            let cause = format!(
                "job {} is finishing: its input ended and its subtasks are ending; a savepoint needs every subtask RUNNING",
                self.job_id
            );
            return fail(record, cause);
        }
        if !Self::all_running(record) {
            // Subtasks are still being deployed or restored (or a region restarts): take the
            // savepoint as soon as they all run.
            supervisor.waiting_savepoints.push(WaitingSavepoint {
                request_id,
                target,
                terminate,
                deadline: Instant::now() + SAVEPOINT_WAITS_FOR_RUNNING,
            });
            return;
        }
        let root = target.or_else(|| supervisor.savepoints_url.clone());
        let request = SnapshotRequest::Savepoint { request_id: request_id.clone(), terminate };
        match supervisor.coordinator.trigger(request, root.as_deref()) {
            Ok(barrier) => {
                record.savepoint_checkpoints.insert(request_id.clone(), barrier.checkpoint_id);
                supervisor.send_to_sources(TaskControl::TriggerCheckpoint(barrier));
            }
            Err(cause) => fail(record, cause),
        }
    }

    fn on_snapshot(&self, record: &mut JobRecord, supervisor: &mut Supervisor, outcome: WriteOutcome) {
        let result = match outcome {
            WriteOutcome::Acknowledged(ack) => supervisor.coordinator.acknowledge(ack),
            WriteOutcome::Declined { checkpoint_id, reason } => {
                supervisor.coordinator.decline(checkpoint_id, reason).map(Err)
            }
        };
        match result {
            None => {}
            Some(Ok(completion)) => {
                tracing::info!(job_id = %self.job_id, checkpoint = completion.checkpoint_id, location = %completion.location, "checkpoint completed");
                if let SnapshotRequest::Savepoint { request_id, .. } = &completion.request {
                    record
                        .savepoints
                        .insert(request_id.clone(), (SavepointStatus::Completed(completion.location.clone()), false));
                }
                // An intermediate savepoint is no restore point for failover (a restart restores
                // the newest checkpoint), so it commits nothing: what its sinks staged is
                // committed by the next checkpoint (Flink since 1.15, FLINK-25191). A
                // stop-with-savepoint ends the job, so it commits.
                let commits = match completion.request {
                    SnapshotRequest::Periodic => true,
                    SnapshotRequest::Savepoint { terminate, .. } => terminate,
                };
                if commits {
                    supervisor.send_to_all(TaskControl::CheckpointComplete(completion.checkpoint_id));
                }
                if supervisor.final_checkpoint == Some(completion.checkpoint_id) {
                    // Everything up to the end of every input is committed: finish.
                    supervisor.finishing = true;
                    supervisor.send_to_all(TaskControl::Finish);
                }
                let subsumed = supervisor.coordinator.take_subsumed();
                self.on_checkpoint_failures(record, supervisor, subsumed);
            }
            Some(Err(failure)) => self.on_checkpoint_failures(record, supervisor, vec![failure]),
        }
    }

    fn on_checkpoint_failures(&self, record: &mut JobRecord, supervisor: &mut Supervisor, failures: Vec<Failure>) {
        for failure in failures {
            tracing::warn!(job_id = %self.job_id, checkpoint = failure.checkpoint_id, reason = %failure.reason, "checkpoint failed");
            if supervisor.final_checkpoint == Some(failure.checkpoint_id) {
                supervisor.final_checkpoint = None;
            }
            supervisor.send_to_all(TaskControl::CheckpointAborted(failure.checkpoint_id));
            if let SnapshotRequest::Savepoint { request_id, .. } = &failure.request {
                record.savepoints.insert(request_id.clone(), (SavepointStatus::Failed(failure.reason.clone()), false));
            }
            if failure.fail_job && record.history.current() == JobStatus::Running {
                let message = format!(
                    "exceeded execution.checkpointing.tolerable-failed-checkpoints ({}): {}",
                    supervisor.coordinator.settings().tolerable_failures,
                    failure.reason
                );
                record.exceptions.push(ExceptionEntry {
                    name: "CheckpointFailure".into(),
                    message: message.clone(),
                    timestamp_ms: now_ms(),
                    task_name: "checkpoint coordinator".into(),
                    location: self.location.clone(),
                });
                record.failure_cause = Some(message);
                self.transition_job(record, JobStatus::Failing);
                self.stop_tasks();
                mark_canceling(record, |_| true);
            }
        }
    }

    fn on_cancel(&self, record: &mut JobRecord) {
        let status = record.history.current();
        if !matches!(status, JobStatus::Running | JobStatus::Created | JobStatus::Restarting) {
            return;
        }
        self.transition_job(record, JobStatus::Cancelling);
        self.stop_tasks();
        mark_canceling(record, |_| true);
        self.settle(record, false);
    }

    fn on_task_event(
        &self,
        record: &mut JobRecord,
        deployment: &Deployment,
        event: TaskEvent,
        supervisor: &mut Supervisor,
    ) {
        let job_graph = &deployment.job_graph;
        let Some(subtask) = record.subtasks.get_mut(event.vertex).and_then(|v| v.get_mut(event.subtask as usize))
        else {
            return;
        };
        let now = now_ms();
        match event.kind {
            TaskEventKind::Initializing => {
                let _ = subtask.history.transition(ExecutionState::Initializing, now);
            }
            TaskEventKind::Running => {
                let _ = subtask.history.transition(ExecutionState::Running, now);
            }
            TaskEventKind::EndOfData => subtask.data_ended = true,
            TaskEventKind::Finished => {
                // A subtask that completes after it was asked to cancel counts as canceled,
                // as in Flink.
                let next = if subtask.history.current() == ExecutionState::Canceling {
                    ExecutionState::Canceled
                } else {
                    ExecutionState::Finished
                };
                let _ = subtask.history.transition(next, now);
            }
            TaskEventKind::Canceled => {
                if subtask.history.current() != ExecutionState::Canceling {
                    let _ = subtask.history.transition(ExecutionState::Canceling, now);
                }
                let _ = subtask.history.transition(ExecutionState::Canceled, now);
            }
            TaskEventKind::Failed(error) => {
                let _ = subtask.history.transition(ExecutionState::Failed, now);
                let vertex = &job_graph.vertices[event.vertex];
                let task_name = format!("{} ({}/{})", vertex.name, event.subtask + 1, vertex.parallelism);
                let region = deployment.regions.as_ref().and_then(|regions| regions.get(event.vertex).copied());
                let region_restarting =
                    region.is_some_and(|region| supervisor.region_restarts.iter().any(|(r, _)| *r == region));
                if record.history.current() == JobStatus::Running && !region_restarting {
                    // One exceptions entry per failure: the first error of a failover is its
                    // root cause; errors of other subtasks while the job (or the region) is
                    // going down are its consequences and are only logged.
                    record.exceptions.push(ExceptionEntry {
                        name: error.class_name().to_string(),
                        message: error.to_string(),
                        timestamp_ms: now,
                        task_name: task_name.clone(),
                        // Where the subtask ran: its TaskManager on a cluster.
                        location: record
                            .subtasks
                            .get(event.vertex)
                            .and_then(|subtasks| subtasks.get(event.subtask as usize))
                            .map(|subtask| subtask.host.clone())
                            .filter(|host| host != LOCAL_HOST)
                            .unwrap_or_else(|| self.location.clone()),
                    });
                    let elapsed_ms = supervisor.started.elapsed().as_millis() as u64;
                    match supervisor.restart.on_failure(elapsed_ms) {
                        RestartDecision::RestartAfter(delay) => {
                            // Pending snapshots cannot complete without the failed subtasks.
                            let failures = supervisor.coordinator.abort_all("the job is restarting after a failure");
                            for failure in &failures {
                                if let SnapshotRequest::Savepoint { request_id, .. } = &failure.request {
                                    let status = SavepointStatus::Failed(failure.reason.clone());
                                    record.savepoints.insert(request_id.clone(), (status, false));
                                }
                            }
                            record.restarts += 1;
                            match region {
                                Some(region) => {
                                    tracing::warn!(job_id = %self.job_id, task = %task_name, error = %error, region, delay_ms = delay.as_millis() as u64, "subtask failed; restarting its pipelined region");
                                    supervisor.region_restarts.push((region, Instant::now() + delay));
                                    if let Some(flag) = self.cancel_flags().get(region) {
                                        flag.store(true, Ordering::SeqCst);
                                    }
                                    mark_canceling(record, |vertex| deployment.in_region(vertex, Some(region)));
                                }
                                None => {
                                    tracing::warn!(job_id = %self.job_id, task = %task_name, error = %error, delay_ms = delay.as_millis() as u64, "subtask failed; restarting the job");
                                    supervisor.pending_restart = Some(delay);
                                    self.transition_job(record, JobStatus::Restarting);
                                    self.stop_tasks();
                                    mark_canceling(record, |_| true);
                                }
                            }
                        }
                        RestartDecision::GiveUp(reason) => {
                            record.failure_cause =
                                Some(format!("{task_name} failed: {error} (not restarted: {reason})"));
                            self.transition_job(record, JobStatus::Failing);
                            self.stop_tasks();
                            mark_canceling(record, |_| true);
                        }
                    }
                } else {
                    tracing::info!(job_id = %self.job_id, task = %task_name, error = %error, "subtask failed while the job or its region was already going down");
                }
            }
        }
        let regions_pending = !supervisor.region_restarts.is_empty();
        self.settle(record, regions_pending);
    }

    /// Moves the job to its terminal state once every subtask has ended (a RUNNING job with
    /// regions waiting to restart has not finished).
    fn settle(&self, record: &mut JobRecord, regions_pending: bool) {
        let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
        if !all_ended {
            return;
        }
        let next = match record.history.current() {
            JobStatus::Running if !regions_pending => JobStatus::Finished,
            JobStatus::Failing => JobStatus::Failed,
            JobStatus::Cancelling => JobStatus::Canceled,
            _ => return,
        };
        self.transition_job(record, next);
    }
}

/// Checks a savepoint target a client gave. With `state.savepoints.dir` configured the
/// target must lie inside it (a relative target is taken relative to it): clients never make
/// the cluster write elsewhere. `..` segments are refused in any case.
fn confine_target(target: &str, savepoints_root: Option<&str>) -> Result<String, String> {
    if target.split('/').any(|segment| segment == "..") {
        return Err(format!("savepoint target '{target}' contains '..'; give a directory without parent references"));
    }
    let Some(root) = savepoints_root else {
        return Ok(target.to_string());
    };
    let normalize = |url: &str| {
        let trimmed = url.trim_end_matches('/');
        trimmed.strip_prefix("file://").unwrap_or(trimmed).to_string()
    };
    let root_path = normalize(root);
    let is_relative = !target.contains("://") && !target.starts_with('/');
    if is_relative {
        return Ok(format!("{}/{}", root.trim_end_matches('/'), target));
    }
    let target_path = normalize(target);
    if target_path == root_path || target_path.starts_with(&format!("{root_path}/")) {
        return Ok(target.to_string());
    }
    Err(format!(
        "savepoint target '{target}' is outside state.savepoints.dir ({root}); this cluster writes savepoints only there — give a directory inside it, or none for the default"
    ))
}

/// Marks the running subtasks of the vertices `include` selects as CANCELING.
fn mark_canceling(record: &mut JobRecord, include: impl Fn(usize) -> bool) {
    let now = now_ms();
    let selected = record.subtasks.iter_mut().enumerate().filter(|(vertex, _)| include(*vertex));
    for subtask in selected.flat_map(|(_, subtasks)| subtasks.iter_mut()) {
        let state = subtask.history.current();
        if state.is_terminal() {
            continue;
        }
        if state == ExecutionState::Created {
            let _ = subtask.history.transition(ExecutionState::Canceled, now);
        } else {
            let _ = subtask.history.transition(ExecutionState::Canceling, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::confine_target;

    #[test]
    fn savepoint_targets_stay_inside_the_configured_directory() {
        assert_eq!(confine_target("/any/dir", None).unwrap(), "/any/dir");
        assert!(confine_target("/a/../etc", None).is_err());
        let root = Some("file:///data/savepoints");
        assert_eq!(confine_target("/data/savepoints/team-a", root).unwrap(), "/data/savepoints/team-a");
        assert_eq!(confine_target("file:///data/savepoints", root).unwrap(), "file:///data/savepoints");
        assert_eq!(confine_target("team-a", root).unwrap(), "file:///data/savepoints/team-a");
        let outside = confine_target("/tmp/elsewhere", root).unwrap_err();
        assert!(outside.contains("outside state.savepoints.dir"), "{outside}");
        assert!(confine_target("/data/savepoints-other", root).is_err());
        assert!(confine_target("s3://bucket/x", root).is_err());
    }
}
