//! What one job's run keeps across its states ([`JobRun`]), and the work several states share:
//! deploying attempts, restoring the newest checkpoint, and handling task events, snapshots,
//! savepoint requests and checkpoint ticks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::snapshot::TaskControl;
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobStatus, Lifecycle, StateHistory};

use super::{ExceptionEntry, JobMaster, JobRecord, LOCAL_HOST, MasterEvent, SavepointStatus, SubtaskRecord};
use crate::checkpointing::coordinator::{Failure, SnapshotRequest};
use crate::checkpointing::ended::EndedCheckpoints;
use crate::checkpointing::writer::{SnapshotWriter, WriteJob, WriteOutcome};
use crate::checkpointing::{CheckpointCoordinator, RestoreOpenError, RestoreSource};
use crate::control_clock::ControlClock;
use crate::execution::{CheckpointWiring, TaskEvent, TaskEventKind};
use crate::executor::{AttemptHandle, AttemptSpec, ReportedAttempt};
use crate::job_master::checkpoint_outcomes::{self, OutcomeAction};
use crate::job_master::effects::{Answer, EffectError, HaWrite, MasterEffect, MasterIo, Recipients};
use crate::job_master::transitions::{self, FailurePlan};
use crate::jobgraph::JobGraph;
use crate::restart::RestartStrategy;

/// Longest the job master sleeps between looks at its checkpoint schedule.
pub(super) const SUPERVISOR_TICK: Duration = Duration::from_millis(50);

/// How long a savepoint asked for while subtasks start waits for them to run (a job is
/// RUNNING a moment before its subtasks are, so `weir stop` right after `weir run -d` works).
const SAVEPOINT_WAITS_FOR_RUNNING: Duration = Duration::from_secs(30);

/// A savepoint request waiting for every subtask to be RUNNING.
pub(super) struct WaitingSavepoint {
    request_id: String,
    target: Option<String>,
    terminate: bool,
    format: weir_api::snapshot::SnapshotFormat,
    drain: bool,
    deadline: Instant,
}

/// What the states keep between events besides the job record.
pub(super) struct Supervisor {
    pub(super) coordinator: CheckpointCoordinator,
    pub(super) savepoints_url: Option<String>,
    pub(super) any_finished: bool,
    pub(super) restart: RestartStrategy,
    /// Set when the current attempt ends in a restart after this delay.
    pub(super) pending_restart: Option<Duration>,
    pub(super) started: Instant,
    /// Regions that failed and redeploy once their subtasks ended and the delay passed.
    pub(super) region_restarts: Vec<(usize, Instant)>,
    /// Kept in region mode so that a region restart can join the running attempt's events.
    pub(super) task_events: Option<Sender<TaskEvent>>,
    /// Started attempts with their region (one per region in region mode); joined when
    /// their region redeploys or the job ends.
    pub(super) handles: Vec<(Option<usize>, Box<dyn AttemptHandle>)>,
    /// The number the next deploy takes: every deploy (whole job or one region) has its own,
    /// so TaskManagers and part-file names tell concurrent region attempts apart.
    pub(super) next_attempt: u32,
    /// Savepoints asked for while subtasks were still starting: they are taken once every
    /// subtask runs, or fail at their deadline.
    pub(super) waiting_savepoints: Vec<WaitingSavepoint>,
    /// Users' checkpoint requests waiting for a free checkpoint slot or running subtasks:
    /// (request id, asked for a full checkpoint).
    pub(super) waiting_checkpoints: Vec<(String, bool)>,
    /// Triggered checkpoints of users' requests: (checkpoint id, request id).
    pub(super) manual_checkpoints: Vec<(u64, String)>,
    /// The final checkpoint: the first one triggered after every subtask's input ended.
    /// Once it completes the subtasks are told to finish.
    pub(super) final_checkpoint: Option<u64>,
    /// The final checkpoint completed and `Finish` went out: no more checkpoints.
    pub(super) finishing: bool,
    /// A stop-with-savepoint whose savepoint completed while the subtasks stop: (request
    /// id, location). Reported complete once the job ended FINISHED and that is recorded;
    /// failed if the job does anything else first (Flink's StopWithSavepointStoppingException).
    pub(super) completed_stop: Option<(String, String)>,
    /// Every subtask of the RUNNING job finished: it goes FINISHED once its result is
    /// recorded (states/finished.rs).
    pub(super) all_finished: bool,
}

/// What every deploy of the job needs.
pub(super) struct Deployment {
    pub(super) graph: Arc<StreamGraph>,
    pub(super) job_graph: Arc<JobGraph>,
    pub(super) exactly_once: bool,
    /// Periodic checkpoints are on: tasks wait at the end of their input for the final one.
    pub(super) final_checkpoint: bool,
    /// Incremental checkpoints, every n-th full.
    pub(super) incremental: Option<u32>,
    /// The spillable state backend's options.
    pub(super) spill: Option<weir_state::spill::SpillOptions>,
    pub(super) ended: Arc<EndedCheckpoints>,
    pub(super) writer: Sender<WriteJob>,
    pub(super) snapshot_events: Sender<MasterEvent>,
    /// The snapshot the job was submitted with.
    pub(super) initial_restore: Option<Arc<RestoreSource>>,
    /// The pipelined region of each vertex when failures restart only their region.
    pub(super) regions: Option<Arc<Vec<usize>>>,
}

impl Deployment {
    pub(super) fn in_region(&self, vertex: usize, region: Option<usize>) -> bool {
        match (region, &self.regions) {
            (Some(region), Some(regions)) => regions.get(vertex) == Some(&region),
            _ => true,
        }
    }
}

/// What the master's wait for its next event brought.
pub(super) enum Incoming {
    /// A message.
    Event(MasterEvent),
    /// Every subtask thread of the attempt ended and dropped its sender.
    TasksClosed,
    /// Nothing within the wait.
    Nothing,
}

/// One job's run across its states.
pub(super) struct JobRun {
    pub(super) master: Arc<JobMaster>,
    pub(super) events: Receiver<MasterEvent>,
    pub(super) snapshots: Receiver<MasterEvent>,
    /// The current deploy round's task events (`None` before the first deploy).
    pub(super) tasks: Option<Receiver<TaskEvent>>,
    pub(super) sup: Supervisor,
    pub(super) dep: Deployment,
    /// What the next whole-job deploy restores.
    pub(super) restore: Option<Arc<RestoreSource>>,
    /// The number of pipelined regions in region failover mode.
    pub(super) region_count: Option<usize>,
    pub(super) writer: Option<SnapshotWriter>,
    /// Carries out what the master decides: deploys, control messages, HA writes.
    pub(super) io: Box<dyn MasterIo>,
    /// How long a new leader waits for the TaskManagers to report the running attempt.
    pub(super) reconcile_timeout: Duration,
    /// Savepoint requests the previous leader had in flight (failed once the job runs).
    pub(super) orphaned_savepoints: Vec<String>,
    /// Restart delays, checkpoint schedules and deadlines follow this clock.
    pub(super) clock: ControlClock,
}

/// How long a restart waits for the HA store to say which checkpoint is the newest.
const RESTART_POINT_WAIT_MAX: Duration = Duration::from_secs(30);

impl JobRun {
    /// Waits up to `wait` for a control message, a snapshot outcome or a task event.
    pub(super) fn next_event(&self, wait: Duration) -> Incoming {
        let never = crossbeam_channel::never();
        let tasks = self.tasks.as_ref().unwrap_or(&never);
        crossbeam_channel::select! {
            recv(self.events) -> message => message.map_or(Incoming::Nothing, Incoming::Event),
            recv(self.snapshots) -> message => message.map_or(Incoming::Nothing, Incoming::Event),
            recv(tasks) -> message => match message {
                Ok(event) => Incoming::Event(MasterEvent::Task(event)),
                Err(_) => Incoming::TasksClosed,
            },
            default(wait) => Incoming::Nothing,
        }
    }

    /// True when the job may act: no HA, or this JobManager still holds its leadership.
    pub(super) fn leading(&self) -> bool {
        self.io.leading()
    }

    /// Carries out an effect whose failure changes nothing the master decides (a control
    /// message, a stop; refused once the leadership is lost): a failure is logged.
    pub(super) fn tell(&mut self, effect: MasterEffect) {
        if let Err(error) = self.io.carry_out(effect) {
            tracing::warn!(job_id = %self.master.job_id, %error, "a job master effect failed");
        }
    }

    /// Sends `message` to every source subtask.
    pub(super) fn send_to_sources(&mut self, message: TaskControl) {
        self.tell(MasterEffect::Control { to: Recipients::Sources, message });
    }

    /// Sends `message` to every running subtask (ended ones dropped their channels).
    pub(super) fn send_to_all(&mut self, message: TaskControl) {
        self.tell(MasterEffect::Control { to: Recipients::All, message });
    }

    /// Tells every running subtask to stop.
    pub(super) fn stop_tasks(&mut self) {
        self.tell(MasterEffect::StopTasks { region: None });
    }

    /// Forgets the previous attempts' control channels (they ended or are being taken over).
    pub(super) fn forget_tasks(&mut self) {
        self.tell(MasterEffect::ForgetTasks);
    }

    /// Deploys or takes over an attempt (`effect` is one of those): its handle.
    fn start_attempt(&mut self, effect: MasterEffect) -> Result<Box<dyn AttemptHandle>, TaskError> {
        match self.io.carry_out(effect) {
            Ok(Answer::Deployed(handle)) => Ok(handle),
            Ok(Answer::Done) => Err(TaskError::Internal("the job master's io started no attempt".into())),
            Err(error) => Err(error.into_task_error()),
        }
    }

    /// Writes to the HA store (nothing without high availability).
    pub(super) fn record(&mut self, write: HaWrite) -> Result<(), EffectError> {
        self.io.carry_out(MasterEffect::Record(write)).map(|_| ())
    }

    /// Joins every attempt handle (their subtasks ended).
    pub(super) fn join_handles(&mut self) {
        self.sup.task_events = None;
        self.sup.handles.drain(..).for_each(|(_, handle)| handle.join());
    }

    /// Deploys the whole job (every region in region mode) as a new round, restoring
    /// `self.restore`.
    pub(super) fn deploy_round(&mut self) -> Result<(), TaskError> {
        self.forget_tasks();
        let (task_events, task_receiver) = crossbeam_channel::unbounded::<TaskEvent>();
        self.tasks = Some(task_receiver);
        let restore = self.restore.clone();
        let deployed = match self.region_count {
            None => self.deploy(None, restore, task_events),
            Some(count) => {
                let deployed =
                    (0..count).try_for_each(|region| self.deploy(Some(region), restore.clone(), task_events.clone()));
                self.sup.task_events = Some(task_events);
                deployed
            }
        };
        self.sup.any_finished = false;
        self.sup.final_checkpoint = None;
        self.sup.finishing = false;
        self.sup.pending_restart = None;
        deployed
    }

    /// Takes the next attempt number (recorded in HA first, so no later leader reuses it).
    fn take_attempt(&mut self) -> Result<u32, TaskError> {
        let attempt = self.sup.next_attempt;
        self.record(HaWrite::NextAttempt(attempt + 1))
            .map_err(|e| TaskError::external("recording the attempt number", e))?;
        self.sup.next_attempt += 1;
        Ok(attempt)
    }

    /// Fresh subtask records for the vertices of `region`, in `state`.
    fn reset_subtasks(
        &self,
        region: Option<usize>,
        metrics: &[Vec<Arc<weir_api::operator::TaskMetrics>>],
        state: ExecutionState,
    ) {
        self.master.update(|record| {
            for (vertex, vertex_metrics) in metrics.iter().enumerate() {
                if !self.dep.in_region(vertex, region) {
                    continue;
                }
                let records = vertex_metrics
                    .iter()
                    .map(|m| {
                        let mut history = StateHistory::new(ExecutionState::Created, now_ms());
                        let _ = history.transition(state, now_ms());
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
    }

    /// The attempt spec for `region` (the whole job when `None`); the io connects its control
    /// channels when it deploys.
    fn attempt_spec(
        &self,
        attempt: u32,
        region: Option<usize>,
        restore: Option<Arc<RestoreSource>>,
        task_events: Sender<TaskEvent>,
        metrics: Vec<Vec<Arc<weir_api::operator::TaskMetrics>>>,
    ) -> AttemptSpec {
        let job_graph = &self.dep.job_graph;
        AttemptSpec {
            job_id: self.master.job_id,
            job_name: self.master.job_name.clone(),
            attempt,
            graph: Arc::clone(&self.dep.graph),
            job_graph: Arc::clone(job_graph),
            metrics,
            controls: Vec::new(),
            wiring: CheckpointWiring {
                exactly_once: self.dep.exactly_once,
                final_checkpoint: self.dep.final_checkpoint,
                incremental: self.dep.incremental,
                spill: self.dep.spill.clone(),
                ended: Arc::clone(&self.dep.ended),
                writer: self.dep.writer.clone(),
                restore: restore.clone(),
            },
            cancel: Arc::new(AtomicBool::new(false)),
            job_cancelled: Arc::clone(&self.master.cancel_requested),
            task_events,
            snapshot_events: self.dep.snapshot_events.clone(),
            restore,
            region: region.zip(self.dep.regions.clone()).map(|(region, regions)| (regions, region)),
        }
    }

    /// Starts the subtasks of `region` (of the whole job when `None`) as a new attempt
    /// restoring `restore`.
    pub(super) fn deploy(
        &mut self,
        region: Option<usize>,
        restore: Option<Arc<RestoreSource>>,
        task_events: Sender<TaskEvent>,
    ) -> Result<(), TaskError> {
        let attempt = self.take_attempt()?;
        let metrics = self.dep.job_graph.new_task_metrics();
        // SCHEDULED while the executor finds slots, then DEPLOYING.
        self.reset_subtasks(region, &metrics, ExecutionState::Scheduled);
        let spec = self.attempt_spec(attempt, region, restore, task_events, metrics);
        let handle = self.start_attempt(MasterEffect::Deploy(spec)).inspect_err(|_| {
            // Never deployed: its subtasks end here, or a restart would wait for them forever.
            let dep = &self.dep;
            self.master.update(|record| mark_never_deployed(record, |vertex| dep.in_region(vertex, region)));
        })?;
        self.master.update(|record| {
            for (vertex, subtasks) in record.subtasks.iter_mut().enumerate() {
                if self.dep.in_region(vertex, region) {
                    for (index, subtask) in subtasks.iter_mut().enumerate() {
                        subtask.host = handle.host_of(index as u32).unwrap_or_else(|| LOCAL_HOST.to_string());
                        // Task events are applied only after this deploy returns, so no
                        // subtask has reported INITIALIZING yet.
                        let _ = subtask.history.transition(ExecutionState::Deploying, now_ms());
                    }
                }
            }
        });
        self.sup.handles.push((region, handle));
        Ok(())
    }

    /// Takes over `reported`, an attempt that kept running on the TaskManagers while no
    /// JobManager led: its subtasks keep running and report to this master from now on.
    pub(super) fn adopt(
        &mut self,
        reported: &ReportedAttempt,
        task_events: Sender<TaskEvent>,
    ) -> Result<(), TaskError> {
        let region = reported.region;
        let metrics = self.dep.job_graph.new_task_metrics();
        self.reset_subtasks(region, &metrics, ExecutionState::Reconciling);
        let spec = self.attempt_spec(reported.attempt, region, None, task_events, metrics);
        let handle = self.start_attempt(MasterEffect::Adopt { spec, reported: reported.clone() })?;
        self.master.update(|record| {
            for subtask in &reported.subtasks {
                let Some(slot) =
                    record.subtasks.get_mut(subtask.vertex).and_then(|v| v.get_mut(subtask.subtask as usize))
                else {
                    continue;
                };
                slot.host = subtask.taskmanager.clone();
                slot.data_ended = subtask.data_ended;
                let _ = slot.history.transition(subtask.state, now_ms());
            }
        });
        self.sup.next_attempt = self.sup.next_attempt.max(reported.attempt + 1);
        self.sup.handles.push((region, handle));
        Ok(())
    }

    /// Redeploys the failed regions whose subtasks all ended and whose restart delay passed,
    /// each restoring the newest completed checkpoint.
    pub(super) fn redeploy_regions(&mut self) {
        let now = self.clock.now();
        let ready: Vec<usize> = {
            let record = self.master.record();
            if record.history.current() != JobStatus::Running {
                // The job is ending (cancel, or a failure the strategy gave up on).
                self.sup.region_restarts.clear();
                return;
            }
            self.sup
                .region_restarts
                .iter()
                .filter(|(region, at)| {
                    *at <= now
                        && record.subtasks.iter().enumerate().all(|(vertex, subtasks)| {
                            !self.dep.in_region(vertex, Some(*region))
                                || subtasks.iter().all(|s| s.history.current().is_terminal())
                        })
                })
                .map(|(region, _)| *region)
                .collect()
        };
        for region in ready {
            self.sup.region_restarts.retain(|(r, _)| *r != region);
            // The region's subtasks all ended: its old attempt gives back its slots.
            let (ended, running): (Vec<_>, Vec<_>) = self.sup.handles.drain(..).partition(|(r, _)| *r == Some(region));
            self.sup.handles = running;
            ended.into_iter().for_each(|(_, handle)| handle.join());
            let restore = match self.restore_for_restart() {
                Ok(Some(latest)) => Ok(Some(latest)),
                Ok(None) => Ok(self.dep.initial_restore.clone()),
                Err(cause) => Err(cause),
            };
            let deployed = restore.and_then(|restore| match self.sup.task_events.clone() {
                Some(events) => self
                    .deploy(Some(region), restore, events)
                    .map_err(|e| format!("cannot redeploy pipelined region {region}: {e}")),
                None => Err(format!("cannot redeploy pipelined region {region}: the attempt has ended")),
            });
            match deployed {
                Ok(()) => {
                    tracing::info!(job_id = %self.master.job_id, region, attempt = self.sup.next_attempt - 1, "restarted a pipelined region")
                }
                Err(_) if self.master.cancel_requested.load(Ordering::SeqCst) => {
                    // A cancel stopped the wait for slots: the job ends CANCELED, not FAILED.
                    let master = Arc::clone(&self.master);
                    master.update(|record| self.on_cancel(record));
                    self.sup.region_restarts.clear();
                    return;
                }
                Err(cause) => {
                    // A failure the restart strategy decides on, as a subtask's is (the HA
                    // store not answering once must not fail a job with restarts left).
                    let master = Arc::clone(&self.master);
                    master.update(|record| self.on_failure(record, Some(region), "the restart", &cause));
                    if master.status() != JobStatus::Running {
                        self.sup.region_restarts.clear();
                        return;
                    }
                }
            }
        }
    }

    /// Where a restart starts, asking the HA store again (for up to half a minute, while this
    /// JobManager leads) when it does not answer.
    fn restart_point(&self) -> Result<Option<(u64, String)>, String> {
        let deadline = self.clock.now() + RESTART_POINT_WAIT_MAX;
        loop {
            match self.sup.coordinator.restart_point() {
                Ok(point) => return Ok(point),
                Err(error) if self.clock.now() < deadline && self.leading() => {
                    tracing::warn!(job_id = %self.master.job_id, %error, "no restart point yet; asking the HA store again");
                    self.clock.sleep(Duration::from_millis(200));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The newest completed checkpoint as a restore source (same job, same parallelism).
    pub(super) fn restore_for_restart(&self) -> Result<Option<Arc<RestoreSource>>, String> {
        let Some((checkpoint_id, url)) = self.restart_point()? else {
            return Ok(None);
        };
        let request = crate::cluster::resources::restore_request(&self.dep.graph, &self.dep.job_graph, false);
        let source = RestoreSource::open(&url, &request).map_err(|e| match e {
            RestoreOpenError::Plan(e) => format!("cannot restart from checkpoint {checkpoint_id}: {e}"),
            e => format!("cannot read checkpoint {checkpoint_id} to restart from: {e}"),
        })?;
        if let Ok(mut stats) = self.master.checkpoint_stats.lock() {
            stats.restored = Some((checkpoint_id, url.clone(), now_ms()));
        }
        let total = source.total_bytes();
        self.master.update(|record| record.restore = Some((source.location.clone(), checkpoint_id, total)));
        Ok(Some(Arc::new(source)))
    }

    /// A cancel stopped the deploy: CANCELLING if the job showed RUNNING (its end, CANCELED,
    /// is recorded before it shows: `finished::end_before_start`).
    pub(super) fn cancel_before_start(&self) {
        let master = &self.master;
        master.update(|record| {
            if record.history.current() == JobStatus::Running {
                master.transition_job(record, JobStatus::Cancelling);
            }
            mark_canceling(record, |_| true);
        });
    }

    /// The deploy failed with `cause`: FAILING if the job showed RUNNING (its end, FAILED,
    /// is recorded before it shows: `finished::end_before_start`).
    pub(super) fn fail_before_start(&self, cause: String) {
        let master = &self.master;
        master.update(|record| {
            record.failure_cause = Some(cause);
            if matches!(record.history.current(), JobStatus::Running | JobStatus::Reconciling) {
                master.transition_job(record, JobStatus::Failing);
            }
        });
    }

    /// True when every subtask runs: only then can a barrier reach every subtask.
    pub(super) fn all_running(record: &JobRecord) -> bool {
        record.history.current() == JobStatus::Running
            && record.subtasks.iter().flatten().all(|s| s.history.current() == ExecutionState::Running)
    }

    /// Checkpoint timeouts, waiting savepoints, and the periodic and final checkpoints.
    pub(super) fn on_tick(&mut self, record: &mut JobRecord) {
        let now = self.clock.now();
        let failures = self.sup.coordinator.expire(now);
        self.on_checkpoint_failures(record, failures);
        self.on_waiting_savepoints(record, now);
        self.on_waiting_checkpoints(record);
        if self.sup.finishing || self.sup.any_finished || !Self::all_running(record) || !self.leading() {
            return;
        }
        if self.sup.completed_stop.is_some() {
            // The stop-with-savepoint completed and the subtasks are ending: its sources
            // would drop a new trigger, which could then only be aborted (Flink keeps its
            // checkpoint scheduler stopped after a stop-with-savepoint too).
            return;
        }
        if self.sup.final_checkpoint.is_none()
            && self.sup.region_restarts.is_empty()
            && record.subtasks.iter().flatten().all(|s| s.data_ended)
        {
            if !self.sup.coordinator.periodic_slot_free() {
                // execution.checkpointing.max-concurrent-checkpoints binds the final one too.
                return;
            }
            // Every input ended: the next checkpoint is the final one; take it now.
            match self.sup.coordinator.trigger(SnapshotRequest::Periodic, None) {
                Ok(barrier) => {
                    tracing::info!(job_id = %self.master.job_id, checkpoint = barrier.checkpoint_id, "every input ended: final checkpoint");
                    self.sup.final_checkpoint = Some(barrier.checkpoint_id);
                    self.send_to_sources(TaskControl::TriggerCheckpoint(barrier));
                }
                // Another checkpoint is in flight or the pause runs: try again on the next tick.
                Err(reason) => tracing::debug!(job_id = %self.master.job_id, %reason, "final checkpoint deferred"),
            }
            return;
        }
        if !self.sup.coordinator.periodic_due(now) {
            return;
        }
        match self.sup.coordinator.trigger(SnapshotRequest::Periodic, None) {
            Ok(barrier) => self.send_to_sources(TaskControl::TriggerCheckpoint(barrier)),
            Err(error) => tracing::warn!(job_id = %self.master.job_id, error = %error, "cannot trigger a checkpoint"),
        }
    }

    /// Takes the waiting savepoints once every subtask runs; fails those past their deadline,
    /// and all of them once the job cannot run every subtask any more.
    pub(super) fn on_waiting_savepoints(&mut self, record: &mut JobRecord, now: Instant) {
        if self.sup.waiting_savepoints.is_empty() {
            return;
        }
        let ready = Self::all_running(record) || self.sup.any_finished;
        for waiting in std::mem::take(&mut self.sup.waiting_savepoints) {
            if ready {
                // Triggers it, or fails it because a subtask finished.
                self.on_trigger_savepoint(
                    record,
                    waiting.request_id,
                    waiting.target,
                    waiting.terminate,
                    waiting.format,
                    waiting.drain,
                );
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
                    self.master.job_id,
                    SAVEPOINT_WAITS_FOR_RUNNING.as_secs(),
                    states.len(),
                    states.first().map(String::as_str).unwrap_or("not RUNNING")
                );
                self.savepoint_failed(record, &waiting.request_id, cause);
            } else {
                self.sup.waiting_savepoints.push(waiting);
            }
        }
    }

    /// Records a savepoint request's failure (and forgets it in HA).
    pub(super) fn savepoint_failed(&mut self, record: &mut JobRecord, request_id: &str, cause: String) {
        record.savepoints.insert(request_id.to_string(), (SavepointStatus::Failed(cause), false));
        if let Err(error) = self.record(HaWrite::ForgetSavepointRequest { request_id: request_id.to_string() }) {
            tracing::warn!(job_id = %self.master.job_id, %error, "cannot remove a savepoint request from the HA store");
        }
    }

    /// The job went `state` (not FINISHED) after its stop's savepoint completed: the stop
    /// failed, though its savepoint is there and consistent.
    pub(super) fn fail_completed_stop(&mut self, record: &mut JobRecord, state: JobStatus) {
        let Some((request_id, location)) = self.sup.completed_stop.take() else { return };
        let job_id = self.master.job_id;
        let why = record.exceptions.last().map(|e| format!(" ({})", e.message)).unwrap_or_default();
        let next = match state {
            JobStatus::Restarting => {
                "it restarts from that savepoint and runs on: stop it again once `weir list` shows it RUNNING"
                    .to_string()
            }
            JobStatus::Suspended => {
                "this JobManager lost its leadership; the next leader restores the job from that savepoint".to_string()
            }
            _ => format!(
                "it went {state}; to go on from where it stopped, start it from that savepoint (weir run -s {location})"
            ),
        };
        let cause = format!(
            "the savepoint {location} completed, but job {job_id} did not finish while its subtasks were stopping{why}; {next} (Flink: StopWithSavepointStoppingException)"
        );
        self.savepoint_failed(record, &request_id, cause);
    }

    /// Fails every savepoint still waiting to be taken: the job went `state` first.
    pub(super) fn fail_waiting_savepoints(&mut self, record: &mut JobRecord, state: JobStatus) {
        for waiting in std::mem::take(&mut self.sup.waiting_savepoints) {
            let cause =
                format!("job {} went {state} before every subtask ran; no savepoint was taken", self.master.job_id);
            self.savepoint_failed(record, &waiting.request_id, cause);
        }
    }

    pub(super) fn on_trigger_savepoint(
        &mut self,
        record: &mut JobRecord,
        request_id: String,
        target: Option<String>,
        terminate: bool,
        format: weir_api::snapshot::SnapshotFormat,
        drain: bool,
    ) {
        if self.sup.any_finished || self.sup.finishing {
            let cause = format!(
                "job {} is finishing: its input ended and its subtasks are ending; a savepoint needs every subtask RUNNING",
                self.master.job_id
            );
            return self.savepoint_failed(record, &request_id, cause);
        }
        if !Self::all_running(record) {
            // Subtasks are still being deployed or restored (or a region restarts): take the
            // savepoint as soon as they all run.
            self.sup.waiting_savepoints.push(WaitingSavepoint {
                request_id,
                target,
                terminate,
                format,
                drain,
                deadline: self.clock.now() + SAVEPOINT_WAITS_FOR_RUNNING,
            });
            return;
        }
        if let Err(error) = self.record(HaWrite::SavepointRequest { request_id: request_id.clone(), terminate }) {
            return self.savepoint_failed(record, &request_id, error.to_string());
        }
        let root = target.or_else(|| self.sup.savepoints_url.clone());
        let request = SnapshotRequest::Savepoint { request_id: request_id.clone(), terminate, format, drain };
        match self.sup.coordinator.trigger(request, root.as_deref()) {
            Ok(barrier) => {
                record.savepoint_checkpoints.insert(request_id.clone(), barrier.checkpoint_id);
                self.send_to_sources(TaskControl::TriggerCheckpoint(barrier));
                if terminate {
                    crate::crash::point("stop-savepoint-triggered");
                }
            }
            Err(cause) => self.savepoint_failed(record, &request_id, cause),
        }
    }

    pub(super) fn on_snapshot(&mut self, record: &mut JobRecord, outcome: WriteOutcome) {
        let result = match outcome {
            WriteOutcome::Acknowledged(ack) => self.sup.coordinator.acknowledge(ack),
            WriteOutcome::Declined { checkpoint_id, reason } => {
                self.sup.coordinator.decline(checkpoint_id, reason).map(Err)
            }
        };
        match result {
            None => {}
            Some(Ok(completion)) => {
                tracing::info!(job_id = %self.master.job_id, checkpoint = completion.checkpoint_id, location = %completion.location, "checkpoint completed");
                for action in checkpoint_outcomes::on_completion(&completion, self.sup.final_checkpoint) {
                    self.carry_out(record, action);
                }
                self.checkpoint_requests_completed(record, completion.checkpoint_id);
                let subsumed = self.sup.coordinator.take_subsumed();
                self.on_checkpoint_failures(record, subsumed);
            }
            Some(Err(failure)) => self.on_checkpoint_failures(record, vec![failure]),
        }
    }

    pub(super) fn on_checkpoint_failures(&mut self, record: &mut JobRecord, failures: Vec<Failure>) {
        self.end_checkpoints(record, failures, false);
    }

    /// Ends checkpoints that will not complete; `expected` when that is the normal course
    /// (a stop-with-savepoint completed and the job ends: checkpoints in flight beside it
    /// are superseded, which is no warning).
    pub(super) fn end_checkpoints(&mut self, record: &mut JobRecord, failures: Vec<Failure>, expected: bool) {
        self.checkpoint_requests_failed(record, &failures);
        let tolerable = self.sup.coordinator.settings().tolerable_failures;
        for failure in failures {
            if expected {
                tracing::info!(job_id = %self.master.job_id, checkpoint = failure.checkpoint_id, reason = %failure.reason, "checkpoint aborted");
            } else {
                tracing::warn!(job_id = %self.master.job_id, checkpoint = failure.checkpoint_id, reason = %failure.reason, "checkpoint failed");
            }
            if self.sup.final_checkpoint == Some(failure.checkpoint_id) {
                // A bounded job ends only after a checkpoint past its input completes.
                tracing::warn!(
                    job_id = %self.master.job_id,
                    checkpoint = failure.checkpoint_id,
                    "the final checkpoint failed: the job finishes once a later one completes (if every checkpoint expires, raise execution.checkpointing.timeout)"
                );
            }
            let running = record.history.current() == JobStatus::Running;
            for action in checkpoint_outcomes::on_failure(&failure, &mut self.sup.final_checkpoint, running, tolerable)
            {
                self.carry_out(record, action);
            }
        }
    }

    /// Carries out what the job master decided about a checkpoint's outcome.
    fn carry_out(&mut self, record: &mut JobRecord, action: OutcomeAction) {
        match action {
            OutcomeAction::Commit(id) => self.send_to_all(TaskControl::CheckpointComplete(id)),
            OutcomeAction::Abort(id) => self.send_to_all(TaskControl::CheckpointAborted(id)),
            OutcomeAction::ReleaseShared => self.sup.coordinator.release_shared(),
            OutcomeAction::Finish => {
                // Everything up to the end of every input is committed: finish.
                self.sup.finishing = true;
                self.send_to_all(TaskControl::Finish);
            }
            OutcomeAction::SavepointCompleted { request_id, location, stop: true } => {
                // Its sinks commit now; the job ends once its subtasks finish. Until then a
                // failure restarts the job from this savepoint, and the stop fails.
                self.sup.completed_stop = Some((request_id, location));
            }
            OutcomeAction::SavepointCompleted { request_id, location, stop: false } => {
                if let Err(error) = self.record(HaWrite::ForgetSavepointRequest { request_id: request_id.clone() }) {
                    tracing::warn!(job_id = %self.master.job_id, %error, "cannot remove a savepoint request from the HA store");
                }
                record.savepoints.insert(request_id, (SavepointStatus::Completed(location), false));
            }
            OutcomeAction::SavepointFailed { request_id, cause } => self.savepoint_failed(record, &request_id, cause),
            OutcomeAction::FailOver { name, message } => {
                record.exceptions.push(ExceptionEntry {
                    name: name.into(),
                    message: message.clone(),
                    timestamp_ms: now_ms(),
                    task_name: "checkpoint coordinator".into(),
                    location: self.master.location.clone(),
                });
                self.on_failure(record, None, "stop-with-savepoint (drain)", &message);
            }
            OutcomeAction::FailJob { message } => {
                record.exceptions.push(ExceptionEntry {
                    name: "CheckpointFailure".into(),
                    message: message.clone(),
                    timestamp_ms: now_ms(),
                    task_name: "checkpoint coordinator".into(),
                    location: self.master.location.clone(),
                });
                record.failure_cause = Some(message);
                self.master.transition_job(record, JobStatus::Failing);
                self.stop_tasks();
                mark_canceling(record, |_| true);
            }
        }
    }

    pub(super) fn on_cancel(&mut self, record: &mut JobRecord) {
        if !transitions::cancellable(record.history.current()) || !self.leading() {
            // A JobManager that lost its leadership touches no task: the job is suspended
            // here, and the new leader runs it (and takes the cancel).
            return;
        }
        self.sup.pending_restart = None;
        self.sup.region_restarts.clear();
        self.master.transition_job(record, JobStatus::Cancelling);
        self.stop_tasks();
        mark_canceling(record, |_| true);
    }

    /// Applies a subtask's state change; while RUNNING a failure goes to the restart
    /// strategy (the whole job, or its pipelined region).
    pub(super) fn on_task_event(&mut self, record: &mut JobRecord, event: TaskEvent) {
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
                if self.sup.completed_stop.is_some() {
                    // It committed what the stop's savepoint staged.
                    crate::crash::point("stop-subtask-finished");
                }
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
                if !matches!(subtask.history.current(), ExecutionState::Canceling | ExecutionState::Reconciling) {
                    let _ = subtask.history.transition(ExecutionState::Canceling, now);
                }
                let _ = subtask.history.transition(ExecutionState::Canceled, now);
            }
            TaskEventKind::Failed(error) => {
                let _ = subtask.history.transition(ExecutionState::Failed, now);
                self.on_task_failure(record, event.vertex, event.subtask, error, now);
            }
        }
        let regions_pending = !self.sup.region_restarts.is_empty();
        let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
        self.sup.all_finished =
            transitions::settled(record.history.current(), all_ended, regions_pending) == Some(JobStatus::Finished);
    }

    fn on_task_failure(&mut self, record: &mut JobRecord, vertex_index: usize, index: u32, error: TaskError, now: u64) {
        if !self.leading() {
            // A JobManager that lost its leadership decides nothing (its TaskManager
            // connections dropped because another leads): the job is suspended here.
            return;
        }
        let job_graph = &self.dep.job_graph;
        let vertex = &job_graph.vertices[vertex_index];
        let task_name = format!("{} ({}/{})", vertex.name, index + 1, vertex.parallelism);
        let region = self.dep.regions.as_ref().and_then(|regions| regions.get(vertex_index).copied());
        let region_restarting = region.is_some_and(|region| self.sup.region_restarts.iter().any(|(r, _)| *r == region));
        if !transitions::failure_counts(record.history.current(), region_restarting) {
            tracing::info!(job_id = %self.master.job_id, task = %task_name, error = %error, "subtask failed while the job or its region was already going down");
            return;
        }
        // One exceptions entry per failure: the first error of a failover is its root cause;
        // errors of other subtasks while the job (or the region) is going down are its
        // consequences and are only logged.
        let location = record
            .subtasks
            .get(vertex_index)
            .and_then(|subtasks| subtasks.get(index as usize))
            .map(|subtask| subtask.host.clone())
            .filter(|host| host != LOCAL_HOST)
            .unwrap_or_else(|| self.master.location.clone());
        record.exceptions.push(ExceptionEntry {
            name: error.class_name().to_string(),
            message: error.to_string(),
            timestamp_ms: now,
            task_name: task_name.clone(),
            // Where the subtask ran: its TaskManager on a cluster.
            location,
        });
        self.on_failure(record, region, &task_name, &error.to_string());
    }

    /// A failure the restart strategy decides on: restart `region` (the whole job when
    /// `None`), or give up. A JobManager that lost its leadership decides nothing: the job is
    /// suspended here, its tasks left to the new leader.
    pub(super) fn on_failure(&mut self, record: &mut JobRecord, region: Option<usize>, what: &str, error: &str) {
        if !self.leading() {
            tracing::info!(job_id = %self.master.job_id, what, error, "a failure after the leadership was lost: left to the new leader");
            return;
        }
        let elapsed_ms = self.clock.now().saturating_duration_since(self.sup.started).as_millis() as u64;
        // After a stop's savepoint completed, or the final checkpoint (`Finish` went out),
        // the other regions are finishing: the whole job restarts from that snapshot (as
        // Flink's stop-with-savepoint fails over globally). A region restarted alone would
        // wait for a `Finish` nobody sends again: no checkpoint is taken once subtasks finish.
        let region = region.filter(|_| self.sup.completed_stop.is_none() && !self.sup.finishing);
        let plan = transitions::failure_plan(&mut self.sup.restart, elapsed_ms, region, what, error);
        if !matches!(plan, FailurePlan::Fail { .. }) {
            // Pending snapshots cannot complete without the failed subtasks.
            let failures = self.sup.coordinator.abort_all("the job is restarting after a failure");
            // Decided as every failed checkpoint is (an aborted final one is taken again, a
            // savepoint fails), without counting against the tolerance: the restart is the
            // job's answer. The aborts go out only when regions keep running: a source
            // stopped at a stop-with-savepoint's barrier emits nothing until that savepoint
            // completes or is aborted.
            let region_restart = matches!(plan, FailurePlan::RestartRegion { .. });
            for failure in &failures {
                for action in checkpoint_outcomes::on_failure(failure, &mut self.sup.final_checkpoint, false, 0) {
                    match action {
                        OutcomeAction::Abort(_) if !region_restart => {}
                        action => self.carry_out(record, action),
                    }
                }
            }
            self.checkpoint_requests_failed(record, &failures);
            record.restarts += 1;
        }
        match plan {
            FailurePlan::RestartRegion { region, delay } => {
                tracing::warn!(job_id = %self.master.job_id, task = %what, error = %error, region, delay_ms = delay.as_millis() as u64, "subtask failed; restarting its pipelined region");
                self.sup.region_restarts.push((region, self.clock.now() + delay));
                self.tell(MasterEffect::StopTasks { region: Some(region) });
                let dep = &self.dep;
                mark_canceling(record, |vertex| dep.in_region(vertex, Some(region)));
            }
            FailurePlan::RestartJob { delay } => {
                tracing::warn!(job_id = %self.master.job_id, task = %what, error = %error, delay_ms = delay.as_millis() as u64, "failure; restarting the job");
                self.sup.pending_restart = Some(delay);
                // A restart that failed before it deployed is RESTARTING already.
                if record.history.current() != JobStatus::Restarting {
                    self.master.transition_job(record, JobStatus::Restarting);
                }
                self.stop_tasks();
                mark_canceling(record, |_| true);
            }
            FailurePlan::Fail { cause } => {
                record.failure_cause = Some(cause);
                self.master.transition_job(record, JobStatus::Failing);
                self.stop_tasks();
                mark_canceling(record, |_| true);
            }
        }
    }

    /// Joins every attempt and stops the writer threads (the job's run ended here).
    pub(super) fn shutdown(mut self) {
        self.sup.coordinator.release_shared();
        self.sup.coordinator.release_job_dir();
        self.join_handles();
        let writer = self.writer.take();
        // The writer threads end once every sender of their queue is gone, the deployment's
        // included: drop the run first, or the join below waits forever (a thread per job
        // and its writers would outlive every ended job).
        drop(self);
        if let Some(writer) = writer {
            writer.shutdown();
        }
    }
}

/// Checks a savepoint target a client gave. With `state.savepoints.dir` configured the
/// target must lie inside it (a relative target is taken relative to it): clients never make
/// the cluster write elsewhere. `..` segments are refused in any case.
pub(crate) fn confine_target(target: &str, savepoints_root: Option<&str>) -> Result<String, String> {
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

/// Subtasks of the selected vertices whose attempt never started end FAILED.
fn mark_never_deployed(record: &mut JobRecord, include: impl Fn(usize) -> bool) {
    let now = now_ms();
    let selected = record.subtasks.iter_mut().enumerate().filter(|(vertex, _)| include(*vertex));
    for subtask in selected.flat_map(|(_, subtasks)| subtasks.iter_mut()) {
        if !subtask.history.current().is_terminal() {
            let _ = subtask.history.transition(ExecutionState::Failed, now);
        }
    }
}

/// Marks the running subtasks of the vertices `include` selects as CANCELING (subtasks
/// never deployed, or not yet reconciled, as CANCELED).
pub(super) fn mark_canceling(record: &mut JobRecord, include: impl Fn(usize) -> bool) {
    let now = now_ms();
    let selected = record.subtasks.iter_mut().enumerate().filter(|(vertex, _)| include(*vertex));
    for subtask in selected.flat_map(|(_, subtasks)| subtasks.iter_mut()) {
        let state = subtask.history.current();
        if state.is_terminal() {
            continue;
        }
        if matches!(state, ExecutionState::Created | ExecutionState::Reconciling) {
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
