//! The job master stepped by hand, with no thread of its own: a fake executor records each
//! attempt it is asked to deploy, the test plays that attempt's subtasks (their events go
//! through the attempt's own channel) and the user (cancel), and looks at the job after each
//! settled step. `random.rs` plays the subtasks at random, seed by seed.

mod flaky_ha;
mod lineage;
mod random;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_api::error::TaskError;
use weir_api::prelude::*;
use weir_api::testing::{CollectSink, VecSource};
use weir_types::{ExecutionState, JobId, JobStatus};

use super::{Poll, State, created, step};
use crate::control_clock::ControlClock;
use crate::execution::{TaskEvent, TaskEventKind};
use crate::executor::{AttemptHandle, AttemptSpec, Executor, ReportedAttempt};
use crate::job_master::JobMaster;
use crate::job_master::effects::{Answer, EffectError, MasterEffect, MasterIo};
use crate::job_master::run::JobRun;
use crate::job_master::run::{Incoming, SUPERVISOR_TICK};
use crate::job_settings::JobSettings;
use crate::restart::RestartStrategyConfig;

/// What the test's executors share with the test, across the JobManagers of a run.
#[derive(Clone, Default)]
pub(super) struct Deployments {
    /// Every attempt deployed, in order; an attempt a new leader takes over keeps its place,
    /// its spec replaced by the new leader's.
    pub(super) attempts: Arc<Mutex<Vec<AttemptSpec>>>,
    /// Starts still to refuse.
    pub(super) refusals: Arc<AtomicUsize>,
    /// Starts refused so far.
    pub(super) refused: Arc<AtomicUsize>,
    /// What the TaskManagers report to a new leader (the test fills it).
    pub(super) reports: Arc<Mutex<Vec<ReportedAttempt>>>,
    /// Places in `attempts` a new leader took over, not yet seen by the test.
    pub(super) adopted: Arc<Mutex<Vec<usize>>>,
    /// Takeovers and cancels of reported attempts, for the trace.
    pub(super) log: Arc<Mutex<Vec<String>>>,
}

impl Deployments {
    /// Tells every subtask of attempt number `attempt`, except at the places in `keep`, to
    /// stop (its TaskManagers cancel it).
    fn cancel(&self, attempt: u32, keep: &[usize]) {
        let attempts = self.attempts.lock().unwrap();
        for (place, spec) in attempts.iter().enumerate() {
            if spec.attempt == attempt && !keep.contains(&place) {
                spec.cancel.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// Deploys nothing: keeps each attempt's spec so the test can speak for its subtasks, or
/// refuses to start it (no slots) when the test said so. To a new leader it reports what
/// the test says still runs, and takes it over by handing the test the new spec.
struct RecordingExecutor {
    deployments: Deployments,
    /// Places this JobManager took over.
    taken_over: Mutex<Vec<usize>>,
}

struct Joined;

impl AttemptHandle for Joined {
    fn join(self: Box<Self>) {}
}

/// Deploys nothing, ever: no slots.
struct RefusingExecutor;

impl Executor for RefusingExecutor {
    fn start(&self, _: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError> {
        Err(TaskError::Internal("no slots for the job".into()))
    }
}

impl Executor for RecordingExecutor {
    fn start(&self, spec: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError> {
        let d = &self.deployments;
        if d.refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            d.refused.fetch_add(1, Ordering::SeqCst);
            return Err(TaskError::Internal("played: the executor found no slots".into()));
        }
        d.attempts.lock().unwrap().push(spec);
        Ok(Box::new(Joined))
    }

    fn running_attempts(&self, _job_id: &str) -> Vec<ReportedAttempt> {
        self.deployments.reports.lock().unwrap().clone()
    }

    fn adopt(&self, spec: AttemptSpec, reported: &ReportedAttempt) -> Result<Box<dyn AttemptHandle>, TaskError> {
        let d = &self.deployments;
        let mut attempts = d.attempts.lock().unwrap();
        let place = attempts
            .iter()
            .rposition(|a| a.attempt == reported.attempt)
            .ok_or_else(|| TaskError::Internal(format!("played: attempt {} is not running", reported.attempt)))?;
        attempts[place] = spec;
        self.taken_over.lock().unwrap().push(place);
        d.adopted.lock().unwrap().push(place);
        d.log.lock().unwrap().push(format!("attempt {} (place {place}) taken over", reported.attempt));
        Ok(Box::new(Joined))
    }

    fn cancel_attempt(&self, _job_id: &str, attempt: u32) {
        self.deployments.log.lock().unwrap().push(format!("reported attempt {attempt} cancelled"));
        self.deployments.cancel(attempt, &self.taken_over.lock().unwrap());
    }

    fn reconciled(&self, _job_id: &str) {
        let d = &self.deployments;
        let reports = std::mem::take(&mut *d.reports.lock().unwrap());
        let kept = self.taken_over.lock().unwrap().clone();
        for report in reports {
            d.cancel(report.attempt, &kept);
        }
        d.log.lock().unwrap().push("reconciled: what was not taken over is cancelled".into());
    }
}

/// Called after an effect: a line for the log, and whether the JobManager's process died.
pub(super) type AfterEffect = Box<dyn FnMut() -> Option<(String, bool)> + Send>;

/// What the stepped tests see of the job master's effects.
#[derive(Default)]
pub(super) struct EffectWatch {
    /// Every effect carried out since the test last looked, as trace lines.
    pub(super) log: Vec<String>,
    /// Effects on the tasks carried out while this JobManager did not lead.
    pub(super) without_leadership: Vec<String>,
    /// Called after each effect carried out while leading (the random test loses the
    /// leadership there, at an effect boundary, or kills the JobManager's process): a line
    /// for the log, and whether the process is dead.
    pub(super) after_effect: Option<AfterEffect>,
    /// The JobManager's process was killed: nothing it decides leaves it any more.
    pub(super) dead: bool,
}

/// The JobManager's io, watched: every effect goes through [`EffectWatch`].
struct WatchedIo {
    inner: Box<dyn MasterIo>,
    watch: Arc<Mutex<EffectWatch>>,
}

impl MasterIo for WatchedIo {
    fn carry_out(&mut self, effect: MasterEffect) -> Result<Answer, EffectError> {
        if self.watch.lock().unwrap().dead {
            // A dead process sends nothing; what it would have asked fails as a lost
            // leadership does (the lease ran out with the process).
            return match effect {
                MasterEffect::Control { .. } | MasterEffect::ForgetTasks => Ok(Answer::Done),
                _ => Err(EffectError::Ha(weir_ha::HaError::LostLeadership)),
            };
        }
        let line = format!("{effect:?}");
        let (leading, touches_tasks) = (self.inner.leading(), effect.touches_tasks());
        let answer = self.inner.carry_out(effect);
        let mut watch = self.watch.lock().unwrap();
        if touches_tasks && !leading && answer.is_ok() {
            watch.without_leadership.push(line.clone());
        }
        let failed = if answer.is_err() { " (failed)" } else { "" };
        watch.log.push(format!("effect {line}{failed}"));
        if leading && let Some((line, dead)) = watch.after_effect.as_mut().and_then(|after| after()) {
            watch.log.push(line);
            watch.dead = dead;
        }
        answer
    }

    fn reported_attempts(&self) -> Vec<ReportedAttempt> {
        self.inner.reported_attempts()
    }

    fn leading(&self) -> bool {
        self.inner.leading()
    }
}

pub(super) struct SteppedJob {
    pub(super) master: Arc<JobMaster>,
    /// Taken when the test ends it.
    run: Option<JobRun>,
    pub(super) state: State,
    /// What the executor shares with the test: the attempts deployed, the starts to refuse.
    pub(super) deployments: Deployments,
    /// The job master's effects.
    pub(super) watch: Arc<Mutex<EffectWatch>>,
}

impl SteppedJob {
    /// A source feeding a sink through a map, two subtasks each, deployed (RUNNING).
    fn start(restart: RestartStrategyConfig) -> SteppedJob {
        let env = StreamExecutionEnvironment::new();
        pipeline(&env);
        SteppedJob::of(&env, JobSettings { restart, failover_full: true, ..JobSettings::with_parallelism(2) })
    }

    /// The job `env` builds, created and deployed (RUNNING) under `settings`, its attempts
    /// recorded instead of run.
    pub(super) fn of(env: &StreamExecutionEnvironment, settings: JobSettings) -> SteppedJob {
        SteppedJob::of_job(JobId::generate(), env, settings)
    }

    /// [`SteppedJob::of`] with the job's id chosen by the caller (its HA keys name it).
    pub(super) fn of_job(job_id: JobId, env: &StreamExecutionEnvironment, settings: JobSettings) -> SteppedJob {
        SteppedJob::of_job_on(job_id, env, settings, Deployments::default())
    }

    /// [`SteppedJob::of_job`] on `deployments` (a new leader's job master goes on with the
    /// attempts of the one before it).
    pub(super) fn of_job_on(
        job_id: JobId,
        env: &StreamExecutionEnvironment,
        settings: JobSettings,
        deployments: Deployments,
    ) -> SteppedJob {
        let graph = env.build("stepped").unwrap();
        // The test's own executor, if it brings one (then no attempt is recorded).
        let executor = settings.executor.clone().unwrap_or_else(|| {
            let taken_over = Mutex::new(Vec::new());
            let recording: Arc<dyn Executor> =
                Arc::new(RecordingExecutor { deployments: deployments.clone(), taken_over });
            recording
        });
        let settings = JobSettings { executor: Some(executor), clock: ControlClock::manual(), ..settings };
        let (master, events) = JobMaster::accept(job_id, &graph, &settings, "test-jobmanager");
        let watch = Arc::new(Mutex::new(EffectWatch::default()));
        let watched = Arc::clone(&watch);
        let wrap = move |inner| -> Box<dyn MasterIo> { Box::new(WatchedIo { inner, watch: watched }) };
        let (run, state) =
            created::run_with_io(Arc::clone(&master), graph, settings, events, wrap).expect("the job is created");
        let mut job = SteppedJob { master, run: Some(run), state, deployments, watch };
        job.settle();
        job
    }

    pub(super) fn status(&self) -> JobStatus {
        self.master.status()
    }

    fn attempt_count(&self) -> usize {
        self.deployments.attempts.lock().unwrap().len()
    }

    /// Every subtask (vertex, index) of the job.
    fn subtasks(&self) -> Vec<(usize, u32)> {
        let attempts = self.deployments.attempts.lock().unwrap();
        let spec = attempts.last().expect("an attempt was deployed");
        let vertices = spec.job_graph.vertices.iter().enumerate();
        vertices.flat_map(|(vertex, v)| (0..v.parallelism).map(move |index| (vertex, index))).collect()
    }

    /// Subtask (vertex, index) of the newest attempt reports `kind`.
    fn report(&self, (vertex, subtask): (usize, u32), kind: TaskEventKind) {
        let attempts = self.deployments.attempts.lock().unwrap();
        let spec = attempts.last().expect("an attempt was deployed");
        spec.task_events.send(TaskEvent { vertex, subtask, kind }).unwrap();
    }

    fn report_all(&self, kind: impl Fn() -> TaskEventKind) {
        for subtask in self.subtasks() {
            self.report(subtask, kind());
        }
    }

    fn subtask_state(&self, (vertex, index): (usize, u32)) -> ExecutionState {
        self.master.record().subtasks[vertex][index as usize].history.current()
    }

    /// Steps until every sent event is handled and the state waits with nothing to do (or
    /// the run ended). A waiting state gets one tick (the clock moves on by what it waits for,
    /// at most the supervisor's tick) before the test goes on.
    pub(super) fn settle(&mut self) {
        let mut ticked = false;
        for _ in 0..1000 {
            if matches!(self.state, State::Ended) {
                return;
            }
            let run = self.run.as_mut().expect("the run has not ended");
            if !pending(run) {
                match self.state.poll(run) {
                    Poll::Go(next) => self.state = next,
                    Poll::Wait(_) if ticked => return,
                    Poll::Wait(wait) => {
                        ticked = true;
                        run.clock.advance(wait.min(SUPERVISOR_TICK));
                        if let Some(next) = self.state.on_event(run, Incoming::Nothing) {
                            self.state = next;
                        }
                    }
                }
                continue;
            }
            ticked = false;
            let state = std::mem::replace(&mut self.state, State::Ended);
            self.state = step(run, state);
        }
        panic!("the job master did not settle in 1000 steps");
    }

    fn run_all(&mut self) {
        self.report_all(|| TaskEventKind::Initializing);
        self.report_all(|| TaskEventKind::Running);
        self.settle();
        assert!(self.subtasks().iter().all(|s| self.subtask_state(*s) == ExecutionState::Running));
    }

    /// Fails subtask (0, 0) of the running attempt.
    fn fail_one(&mut self) {
        let failed = (0, 0);
        self.report(failed, TaskEventKind::Failed(TaskError::Internal("disk on fire".into())));
        self.settle();
    }

    /// Every subtask but the failed one (0, 0) reports it stopped.
    fn others_stopped(&mut self) {
        for subtask in self.subtasks().into_iter().filter(|s| *s != (0, 0)) {
            self.report(subtask, TaskEventKind::Canceled);
        }
        self.settle();
    }
}

/// True when an event waits for the master.
fn pending(run: &JobRun) -> bool {
    !run.events.is_empty() || !run.snapshots.is_empty() || run.tasks.as_ref().is_some_and(|tasks| !tasks.is_empty())
}

impl Drop for SteppedJob {
    /// Ends the run as the driver does, once the attempts' subtasks are gone (their specs
    /// hold senders of the snapshot writers' queue); fails when that hangs.
    fn drop(&mut self) {
        self.deployments.attempts.lock().unwrap().clear();
        let Some(run) = self.run.take() else { return };
        let (done, ended) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            run.shutdown();
            let _ = done.send(());
        });
        if ended.recv_timeout(Duration::from_secs(10)).is_err() && !std::thread::panicking() {
            panic!("the job's run did not shut down within 10 s: its snapshot writer threads still wait");
        }
    }
}

/// A source feeding a sink through a map and a rebalance.
pub(super) fn pipeline(env: &StreamExecutionEnvironment) {
    env.from_source(VecSource::new(vec![1u64, 2, 3])).map(|x| x + 1).rebalance().sink_to(CollectSink::default());
}

fn restarts(attempts: u32, delay: Duration) -> RestartStrategyConfig {
    RestartStrategyConfig::FixedDelay { attempts, delay }
}

#[test]
fn a_failure_restarts_the_whole_job_once_its_subtasks_ended() {
    let mut job = SteppedJob::start(restarts(1, Duration::ZERO));
    assert_eq!(job.status(), JobStatus::Running);
    assert_eq!(job.attempt_count(), 1);
    job.run_all();
    job.fail_one();
    assert_eq!(job.status(), JobStatus::Restarting);
    assert!(matches!(job.state, State::Restarting(_)));
    assert!(
        job.deployments.attempts.lock().unwrap()[0].cancel.load(std::sync::atomic::Ordering::SeqCst),
        "told to stop"
    );
    assert_eq!(job.subtask_state((1, 1)), ExecutionState::Canceling);
    assert_eq!(job.attempt_count(), 1, "no attempt deploys while the failed one still runs");
    job.others_stopped();
    assert_eq!(job.status(), JobStatus::Running);
    assert_eq!(job.attempt_count(), 2);
    assert_eq!(job.deployments.attempts.lock().unwrap()[1].attempt, 1);
    let record = job.master.record();
    assert_eq!(record.restarts, 1);
    assert_eq!(record.exceptions.len(), 1, "one root cause");
    assert!(record.exceptions[0].message.contains("disk on fire"), "{:?}", record.exceptions);
}

#[test]
fn a_restart_strategy_that_gives_up_fails_the_job_once_its_subtasks_ended() {
    let mut job = SteppedJob::start(RestartStrategyConfig::None);
    job.run_all();
    job.fail_one();
    assert_eq!(job.status(), JobStatus::Failing);
    job.others_stopped();
    assert_eq!(job.status(), JobStatus::Failed);
    assert!(matches!(job.state, State::Ended));
    let cause = job.master.failure_cause().unwrap_or_default();
    assert!(cause.contains("disk on fire") && cause.contains("not restarted"), "{cause}");
}

#[test]
fn a_cancel_during_the_restart_delay_ends_the_job_without_a_new_attempt() {
    let mut job = SteppedJob::start(restarts(3, Duration::from_secs(3600)));
    job.run_all();
    job.fail_one();
    job.others_stopped();
    assert_eq!(job.status(), JobStatus::Restarting, "waiting out the delay");
    let refused = job.master.trigger_checkpoint(None, false).unwrap_err();
    assert!(refused.contains("RESTARTING"), "{refused}");
    job.master.cancel().unwrap();
    job.settle();
    assert_eq!(job.status(), JobStatus::Canceled);
    assert_eq!(job.attempt_count(), 1);
}

#[test]
fn a_cancelled_job_is_canceled_once_every_subtask_stopped() {
    let mut job = SteppedJob::start(RestartStrategyConfig::None);
    job.run_all();
    job.master.cancel().unwrap();
    job.settle();
    assert_eq!(job.status(), JobStatus::Cancelling);
    let subtasks = job.subtasks();
    for subtask in &subtasks[1..] {
        job.report(*subtask, TaskEventKind::Canceled);
    }
    job.settle();
    assert_eq!(job.status(), JobStatus::Cancelling, "one subtask still runs");
    job.report(subtasks[0], TaskEventKind::Canceled);
    job.settle();
    assert_eq!(job.status(), JobStatus::Canceled);
}

#[test]
fn a_job_whose_subtasks_all_finished_is_finished() {
    let mut job = SteppedJob::start(RestartStrategyConfig::None);
    job.run_all();
    job.report_all(|| TaskEventKind::EndOfData);
    job.report_all(|| TaskEventKind::Finished);
    job.settle();
    assert_eq!(job.status(), JobStatus::Finished);
    assert!(matches!(job.state, State::Ended));
}

/// A job whose first deploy fails shows FAILED only once its result is in the HA store: it
/// was recorded as submitted, and a new leader would otherwise recover it and run it again.
#[test]
fn a_job_whose_deploy_fails_is_failed_with_its_result_recorded_in_the_ha_store() {
    let env = StreamExecutionEnvironment::new();
    pipeline(&env);
    let job_id = JobId::generate();
    let dir = tempfile::tempdir().unwrap();
    let storage = format!("file://{}/ha", dir.path().display());
    let (ha, job_ha) = flaky_ha::PlayedHa::new(job_id, storage, weir_types::seeded::SeededRng::new(1));
    let settings = JobSettings {
        executor: Some(Arc::new(RefusingExecutor)),
        ha: Some(job_ha),
        restart: restarts(3, Duration::ZERO),
        ..JobSettings::with_parallelism(2)
    };
    let job = SteppedJob::of_job(job_id, &env, settings);
    assert_eq!(job.status(), JobStatus::Failed);
    assert!(job.master.failure_cause().unwrap_or_default().contains("no slots"));
    assert!(ha.records_result(), "FAILED without its result in the HA store");
}
