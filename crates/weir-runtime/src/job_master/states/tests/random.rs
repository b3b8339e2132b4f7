//! The real job master with its subtasks played at random, one seed at a time: subtasks
//! start, run, emit records, end their input and finish, or fail; a user may cancel or take
//! a savepoint; failures stop after a while. The job runs under the whole-job or the region
//! failover, with a random restart budget, and on most seeds with periodic checkpoints: the
//! sources take the barriers the real checkpoint coordinator triggers, every subtask
//! acknowledges them in its own time, the sinks commit what a completion names
//! (`lineage.rs`). After every settled step:
//!
//! - no pipelined region (the whole job, under full failover) has two attempts alive: a
//!   restart deploys only once every subtask of the failed attempt ended;
//! - every restart the record counts deploys its attempts (one region's, or one per region)
//!   once the failed ones ended, and no attempt deploys without one;
//! - a terminal job has no subtask alive, and its end is the one its story allows: FINISHED
//!   when every subtask finished, CANCELED only after a cancel, FAILED only once the restart
//!   budget is spent;
//! - no barrier is triggered once a stop-with-savepoint completed (its subtasks are ending);
//! - each region's committed records are 1..=n, none twice, and a FINISHED job committed
//!   every record its sources had;
//! - with high availability (half the seeds: the real HA job store on a memory store whose
//!   calls fail, or lose their answer, at random while faults run): an attempt restores only
//!   a checkpoint the HA store records, a barrier's id is below the recorded checkpoint
//!   counter, and an ended job's result is recorded; a JobManager that lost its leadership
//!   (now and then while faults run, between steps or right after any effect it carries
//!   out) deploys nothing, touches no task and writes nothing to the HA store any more, and
//!   goes SUSPENDED. A new leader is then elected (a new epoch in the store), recovers the
//!   job as a JobManager does (`HaStore::recoverable_jobs`) and runs a second real job
//!   master through RECONCILING over what the played TaskManagers report: it takes the
//!   attempt over (the subtasks follow its channels), cancels stale attempts, or gives up
//!   and restarts; the old master is stepped on beside it;
//!
//! and once failures stop, the job ends (liveness). A failure names its seed and prints the
//! trace; `JOB_MASTER_SEED=n cargo test -p weir-runtime --lib random_subtasks` replays it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_api::error::TaskError;
use weir_api::graph::NodeRole;
use weir_api::prelude::*;
use weir_api::snapshot::{BarrierKind, TaskControl};
use weir_types::seeded::SeededRng;
use weir_types::{ExecutionState, JobId, JobStatus, Lifecycle};

use super::flaky_ha::PlayedHa;
use super::lineage::{Lineage, TakenBarrier};
use super::{SteppedJob, pipeline};
use crate::checkpointing::CheckpointSettings;
use crate::checkpointing::writer::{SubtaskAck, WriteOutcome};
use crate::execution::{TaskEvent, TaskEventKind};
use crate::executor::{AttemptSpec, ReportedAttempt, ReportedSubtask};
use crate::job_master::MasterEvent;
use crate::job_settings::JobSettings;
use crate::restart::RestartStrategyConfig;

/// Seeds per test run (`JOB_MASTER_SEEDS` sets another number).
const SEEDS: u64 = 1000;
/// Seeds beyond the first thousand that find a guarded rule broken (mutations.sh):
/// - 1219: a periodic checkpoint triggered while a stop-with-savepoint is in flight;
/// - 1384: a restart's deploy after the leadership was lost (the io's fence);
/// - 3106: a subtask reported DEPLOYING to a new leader, not taken over;
/// - 27526: a takeover that leaves the old leader's checkpoints in flight.
const REGRESSION_SEEDS: &[u64] = &[1219, 1384, 3106, 27526];
/// Steps of a seed after which subtasks stop failing and users stop cancelling.
const FAULT_STEPS: usize = 400;
/// Steps a seed may take in all.
const MAX_STEPS: usize = 4000;
/// One effect in this many, while faults run on an HA seed, is followed by a lost leadership.
const EFFECTS_PER_LOSS: u64 = 200;
/// Records each region's sources have.
const RECORDS: u64 = 30;

#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
enum Stage {
    Deployed,
    Initializing,
    Running,
    InputEnded,
    Ended,
}

/// A subtask of a deployed attempt, as the test plays it.
struct PlayedSubtask {
    attempt: usize,
    vertex: usize,
    index: u32,
    stage: Stage,
    source: bool,
    sink: bool,
    /// How many of its attempt's barriers it acknowledged.
    acked: usize,
    /// `Finish` reached it (after the final checkpoint).
    may_finish: bool,
    /// The completion of the stop its attempt's sources stopped at reached it.
    stop_completed: bool,
}

/// What a played subtask does on its turn.
#[derive(Debug)]
enum Move {
    Report(TaskEventKind),
    /// Acknowledges a barrier (its input had ended before it, or not).
    Acknowledge {
        id: u64,
        finished: bool,
    },
    /// Declines a savepoint's barrier: its snapshot failed.
    Decline(u64),
    /// A source emitted a record, or a subtask waits (for its input's end, or `Finish`).
    Nothing,
}

struct Play {
    rng: SeededRng,
    /// The executor's refusals draw from a stream of their own (the other choices of a seed
    /// stay as they were without them).
    executor_rng: SeededRng,
    /// And so does the loss of the leadership.
    leadership_rng: SeededRng,
    job: SteppedJob,
    subtasks: Vec<PlayedSubtask>,
    /// Attempts whose subtasks are in `subtasks`.
    known_attempts: usize,
    /// Attempts the first deploy made (one per region under region failover).
    first_attempts: usize,
    restart_budget: Option<u32>,
    cancelled: bool,
    /// A user asked to stop the job with a savepoint.
    stopped: bool,
    /// Periodic checkpoints run (and the sinks commit through them).
    checkpoints: bool,
    /// Each region's records (`None`: the whole job's, under full failover).
    lineages: BTreeMap<Option<usize>, Lineage>,
    /// Where checkpoints and savepoints go.
    dir: tempfile::TempDir,
    /// The HA store, on HA seeds.
    ha: Option<PlayedHa>,
    /// This JobManager lost its leadership: the attempts deployed and the HA store's
    /// revision then (neither may change afterwards). Set between steps, or by the job
    /// master's io after an effect.
    lost_leadership: Arc<Mutex<Option<(usize, i64)>>>,
    /// Faults run (the io reads it to lose the leadership only then).
    faults: Arc<AtomicBool>,
    /// When a new leader takes over after a loss (a random stream of its own).
    takeover_rng: SeededRng,
    /// When a TaskManager's connection drops (a random stream of its own).
    network_rng: SeededRng,
    /// New leaders so far: the current job master is number `takeovers`.
    takeovers: usize,
    /// The job masters of earlier leaders, still stepped (they must not act any more).
    old_jobs: Vec<SteppedJob>,
    /// The job master that deployed or took over each attempt place.
    master_of: Vec<usize>,
    /// The job's end was recorded by a JobManager that then lost its leadership: a new
    /// leader finds nothing to recover.
    ended_unseen: bool,
    /// What every leader's job master is built from (the HA wiring aside).
    job_id: JobId,
    regions: bool,
    settings: JobSettings,
    seed: u64,
    trace: Vec<String>,
}

/// The region of an attempt (`None`: the whole job) and whether it deploys `vertex`.
fn deploys(spec: &AttemptSpec, vertex: usize) -> bool {
    match &spec.region {
        Some((regions, region)) => regions.get(vertex) == Some(region),
        None => true,
    }
}

fn region_of(spec: &AttemptSpec) -> Option<usize> {
    spec.region.as_ref().map(|(_, region)| *region)
}

impl Play {
    fn new(seed: u64) -> Play {
        let mut rng = SeededRng::new(seed);
        let env = StreamExecutionEnvironment::new();
        pipeline(&env);
        let regions = rng.one_in(2);
        if regions {
            // A second, disconnected pipeline: two pipelined regions.
            pipeline(&env);
        }
        let restart_budget = (!rng.one_in(5)).then(|| rng.below(4) as u32);
        let restart = match restart_budget {
            Some(attempts) => RestartStrategyConfig::FixedDelay { attempts, delay: Duration::ZERO },
            None => RestartStrategyConfig::None,
        };
        let checkpoints = !rng.one_in(4);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let checkpointing = CheckpointSettings {
            interval: checkpoints.then_some(Duration::from_millis(100)),
            // Short enough to expire within a seed: a checkpoint nobody can finish fails.
            timeout: Duration::from_secs(60),
            checkpoints_url: format!("file://{}/checkpoints", dir.path().display()),
            savepoints_url: Some(format!("file://{}/savepoints", dir.path().display())),
            ..CheckpointSettings::default()
        };
        // High availability draws from a stream of its own: the other choices of a seed, and
        // the seeds mutations.sh prints, stay as they were without it.
        let mut ha_rng = SeededRng::new(seed ^ 0x6861_5f66_6c61_6b79);
        let job_id = JobId::generate();
        let (ha, job_ha) = match ha_rng.one_in(2) {
            true => {
                let (played, job_ha) = PlayedHa::new(job_id, format!("file://{}/ha", dir.path().display()), ha_rng);
                (Some(played), Some(job_ha))
            }
            false => (None, None),
        };
        let settings =
            JobSettings { restart, failover_full: !regions, checkpointing, ..JobSettings::with_parallelism(2) };
        let job = SteppedJob::of_job(job_id, &env, JobSettings { ha: job_ha, ..settings.clone() });
        let first_attempts = job.deployments.attempts.lock().unwrap().len();
        let mut play = Play {
            rng,
            executor_rng: SeededRng::new(seed ^ 0x7265_6675_7365_7321),
            leadership_rng: SeededRng::new(seed ^ 0x6c65_6164_6572_7321),
            job,
            subtasks: Vec::new(),
            known_attempts: 0,
            first_attempts,
            restart_budget,
            cancelled: false,
            stopped: false,
            checkpoints,
            lineages: BTreeMap::new(),
            dir,
            trace: vec![format!(
                "regions: {regions}, restart budget: {restart_budget:?}, checkpoints: {checkpoints}, HA: {}",
                ha.is_some()
            )],
            ha,
            lost_leadership: Arc::new(Mutex::new(None)),
            faults: Arc::new(AtomicBool::new(true)),
            takeover_rng: SeededRng::new(seed ^ 0x7461_6b65_6f76_6572),
            network_rng: SeededRng::new(seed ^ 0x6e65_7477_6f72_6b21),
            takeovers: 0,
            old_jobs: Vec::new(),
            master_of: Vec::new(),
            ended_unseen: false,
            job_id,
            regions,
            settings,
            seed,
        };
        play.lose_leadership_at_effects();
        play.see_new_attempts();
        play
    }

    /// On HA seeds, while faults run, the JobManager may lose its leadership right after any
    /// effect it carries out (a random stream of its own: the seeds' other choices stay).
    fn lose_leadership_at_effects(&mut self) {
        let seed = self.seed;
        let Some(ha) = self.ha.clone() else { return };
        let mut rng = SeededRng::new(seed ^ 0x6566_6665_6374_7321 ^ (self.takeovers as u64) << 48);
        let (lost, faults, attempts) =
            (Arc::clone(&self.lost_leadership), Arc::clone(&self.faults), Arc::clone(&self.job.deployments.attempts));
        self.job.watch.lock().unwrap().after_effect = Some(Box::new(move || {
            let mut lost = lost.lock().unwrap();
            if lost.is_some() || !faults.load(Ordering::SeqCst) || !rng.one_in(EFFECTS_PER_LOSS) {
                return None;
            }
            *lost = Some((attempts.lock().unwrap().len(), ha.lose_leadership()));
            // Frozen (it wakes to find another leader), or its process killed (kill -9).
            if rng.one_in(2) {
                return Some(("this JobManager's process is killed after that effect".into(), true));
            }
            Some(("this JobManager loses its leadership after that effect".into(), false))
        }));
    }

    /// Another JobManager leads and recovers the job (on an HA seed whose leader lost its
    /// leadership): its job master starts RECONCILING with what the TaskManagers report.
    /// The old one is stepped on; it must touch nothing any more.
    fn take_over(&mut self) {
        let Some(ha) = self.ha.as_mut() else { return };
        let elected = ha.new_leader();
        // The election moved the store's revision: the old leader's writes are counted from here.
        let attempts = self.job.deployments.attempts.lock().unwrap().len();
        *self.lost_leadership.lock().unwrap() = Some((attempts, ha.revision()));
        let job_ha = match elected {
            Ok(Some(job_ha)) => job_ha,
            Ok(None) => {
                // The old leader recorded the job's end before it lost its leadership.
                self.trace.push("a new leader finds the job's result recorded: nothing to recover".into());
                self.ended_unseen = true;
                return;
            }
            Err(error) => {
                self.trace.push(format!("a new leader cannot read the HA store yet: {error}"));
                return;
            }
        };
        self.report_running();
        let env = StreamExecutionEnvironment::new();
        pipeline(&env);
        if self.regions {
            pipeline(&env);
        }
        let settings = JobSettings { ha: Some(job_ha), ..self.settings.clone() };
        self.takeovers += 1;
        self.trace.push(format!("JobManager {} leads and recovers the job", self.takeovers));
        let job = SteppedJob::of_job_on(self.job_id, &env, settings, self.job.deployments.clone());
        self.old_jobs.push(std::mem::replace(&mut self.job, job));
        *self.lost_leadership.lock().unwrap() = None;
        self.lose_leadership_at_effects();
    }

    /// What the TaskManagers report to a new leader: every subtask alive and not told to
    /// stop, by attempt.
    fn report_running(&self) {
        let attempts = self.job.deployments.attempts.lock().unwrap();
        let mut reports: BTreeMap<u32, ReportedAttempt> = BTreeMap::new();
        for subtask in self.subtasks.iter().filter(|s| s.stage != Stage::Ended) {
            let spec = &attempts[subtask.attempt];
            if spec.cancel.load(Ordering::SeqCst) {
                continue;
            }
            let report = reports.entry(spec.attempt).or_insert_with(|| ReportedAttempt {
                attempt: spec.attempt,
                region: region_of(spec),
                ..ReportedAttempt::default()
            });
            let state = match subtask.stage {
                Stage::Deployed => ExecutionState::Deploying,
                Stage::Initializing => ExecutionState::Initializing,
                _ => ExecutionState::Running,
            };
            report.subtasks.push(ReportedSubtask {
                vertex: subtask.vertex,
                subtask: subtask.index,
                state,
                data_ended: subtask.stage == Stage::InputEnded,
                taskmanager: format!("tm-{}", subtask.index),
            });
        }
        *self.job.deployments.reports.lock().unwrap() = reports.into_values().collect();
    }

    /// Plays the subtasks of attempts deployed since the last look; a new attempt of a
    /// region whose older attempt still has a subtask alive breaks the first invariant.
    fn see_new_attempts(&mut self) -> Option<String> {
        let deployments = self.job.deployments.clone();
        for place in std::mem::take(&mut *deployments.adopted.lock().unwrap()) {
            self.master_of[place] = self.takeovers;
        }
        self.trace.extend(std::mem::take(&mut *deployments.log.lock().unwrap()));
        let attempts = self.job.deployments.attempts.lock().unwrap();
        for (number, spec) in attempts.iter().enumerate().skip(self.known_attempts) {
            self.master_of.push(self.takeovers);
            // An earlier leader's attempt that the current one did not take over was told to
            // stop (the current leader does not wait for it).
            let alive_before = self.subtasks.iter().find(|s| {
                s.stage != Stage::Ended
                    && region_of(&attempts[s.attempt]) == region_of(spec)
                    && s.attempt != number
                    && self.master_of[s.attempt] == self.takeovers
            });
            if let Some(alive) = alive_before {
                return Some(format!(
                    "attempt {number} (region {:?}) deployed while subtask {}/{} of attempt {} is {:?}",
                    region_of(spec),
                    alive.vertex,
                    alive.index,
                    alive.attempt,
                    alive.stage
                ));
            }
            let restored = spec.restore.as_ref().map(|r| r.metadata.checkpoint_id);
            if let (Some(ha), Some(id)) = (&self.ha, restored)
                && !ha.records_checkpoint(id)
            {
                return Some(format!("attempt {number} restores checkpoint {id}, which the HA store does not record"));
            }
            self.trace
                .push(format!("attempt {number} deployed (region {:?}, restoring {restored:?})", region_of(spec)));
            if let Err(broken) = self.lineages.entry(region_of(spec)).or_default().start(number, restored) {
                return Some(broken);
            }
            let nodes = spec.graph.nodes();
            for (vertex, v) in spec.job_graph.vertices.iter().enumerate().filter(|(vertex, _)| deploys(spec, *vertex)) {
                let source = nodes[v.nodes[0]].role == NodeRole::Source;
                let sink = v.nodes.iter().any(|node| nodes[*node].role == NodeRole::Sink);
                for index in 0..v.parallelism {
                    let stage = Stage::Deployed;
                    let (acked, may_finish, stop_completed) = (0, false, false);
                    let played = PlayedSubtask {
                        attempt: number,
                        vertex,
                        index,
                        stage,
                        source,
                        sink,
                        acked,
                        may_finish,
                        stop_completed,
                    };
                    self.subtasks.push(played);
                }
            }
        }
        self.known_attempts = attempts.len();
        None
    }

    /// The faults of a step beside the subtasks' own (each from a random stream of its own):
    /// an executor that refuses its next start, a dropped connection, a new leader taking
    /// over after a loss.
    fn infrastructure_faults(&mut self, faults: bool) {
        if faults && self.executor_rng.one_in(250) {
            // No slots for the next attempt: a restart that cannot deploy.
            self.job.deployments.refusals.store(1, Ordering::SeqCst);
            self.trace.push("the executor will refuse its next start".into());
        }
        if !faults {
            self.job.deployments.refusals.store(0, Ordering::SeqCst);
        }
        self.faults.store(faults, Ordering::SeqCst);
        if faults && self.network_rng.one_in(600) {
            let taskmanager = self.network_rng.below(2) as u32;
            self.drop_connection(taskmanager);
        }
        if self.lost_leadership.lock().unwrap().is_some() && !self.ended_unseen {
            // A new leader takes over a while after the loss (at once once faults stopped, or
            // once the old job master ended).
            let old_ended = matches!(self.job.state, super::State::Ended);
            if old_ended || !faults || self.takeover_rng.one_in(20) {
                self.take_over();
            }
        }
    }

    /// One move of the test: a subtask acts, or the user cancels or asks for a savepoint;
    /// then the master settles.
    fn act(&mut self, faults: bool) -> Result<(), String> {
        self.infrastructure_faults(faults);
        if let Some(ha) = &self.ha
            && faults
            && self.lost_leadership.lock().unwrap().is_none()
            && self.leadership_rng.one_in(1500)
        {
            // Its lease lapsed (frozen, cut off): another JobManager leads now.
            let revision = ha.lose_leadership();
            *self.lost_leadership.lock().unwrap() =
                Some((self.job.deployments.attempts.lock().unwrap().len(), revision));
            self.trace.push("this JobManager loses its leadership".into());
            self.settle_all();
            return Ok(());
        }
        if faults && !self.cancelled && self.rng.one_in(1500) {
            self.cancelled = true;
            let answer = self.job.master.cancel();
            self.trace.push(format!("user cancels: {answer:?}"));
            self.settle_all();
            return Ok(());
        }
        if self.checkpoints && self.rng.one_in(150) {
            let target = format!("file://{}/savepoints", self.dir.path().display());
            // Stops, as cancels, end while failures do: a job must end by itself after that.
            let stop = faults && self.rng.one_in(4);
            self.stopped |= stop;
            let answer = self.job.master.trigger_savepoint(Some(target), stop);
            self.trace.push(format!("user asks for a savepoint (stop: {stop}): {answer:?}"));
            self.settle_all();
            return Ok(());
        }
        let alive: Vec<usize> = (0..self.subtasks.len()).filter(|i| self.subtasks[*i].stage != Stage::Ended).collect();
        if alive.is_empty() {
            self.settle_all();
            return Ok(());
        }
        let chosen = alive[self.rng.below(alive.len() as u64) as usize];
        self.read_controls(chosen)?;
        let next = self.next_move(chosen, faults);
        let subtask = &self.subtasks[chosen];
        let attempts = self.job.deployments.attempts.lock().unwrap();
        let spec = &attempts[subtask.attempt];
        let (vertex, index) = (subtask.vertex, subtask.index);
        // An ended attempt's channels may be closed: the master reads the newest one only.
        match next {
            Move::Report(kind) => {
                self.trace.push(format!("attempt {} subtask {vertex}/{index}: {kind:?}", subtask.attempt));
                let _ = spec.task_events.send(TaskEvent { vertex, subtask: index, kind });
            }
            Move::Acknowledge { id: checkpoint_id, finished } => {
                self.trace
                    .push(format!("attempt {} subtask {vertex}/{index} acknowledges {checkpoint_id}", subtask.attempt));
                let ack = SubtaskAck {
                    checkpoint_id,
                    vertex,
                    subtask: index,
                    operators: Vec::new(),
                    finished,
                    timings: Default::default(),
                };
                let _ = spec.snapshot_events.send(MasterEvent::Snapshot(WriteOutcome::Acknowledged(ack)));
            }
            Move::Decline(checkpoint_id) => {
                self.trace
                    .push(format!("attempt {} subtask {vertex}/{index} declines {checkpoint_id}", subtask.attempt));
                let reason = "played snapshot failure".to_string();
                let _ =
                    spec.snapshot_events.send(MasterEvent::Snapshot(WriteOutcome::Declined { checkpoint_id, reason }));
            }
            Move::Nothing => {}
        }
        drop(attempts);
        self.settle_all();
        Ok(())
    }

    /// TaskManager `taskmanager` (it runs subtask `taskmanager` of every vertex) loses its
    /// connection to the JobManager: what was in flight to its subtasks is lost, it cancels
    /// them, and the JobManager's resources report each one failed to its master.
    fn drop_connection(&mut self, taskmanager: u32) {
        self.trace.push(format!("TaskManager tm-{taskmanager}'s connection drops"));
        let attempts = self.job.deployments.attempts.lock().unwrap();
        for subtask in self.subtasks.iter_mut().filter(|s| s.index == taskmanager && s.stage != Stage::Ended) {
            let spec = &attempts[subtask.attempt];
            let lost = spec.controls[subtask.vertex][subtask.index as usize].try_iter().count();
            subtask.stage = Stage::Ended;
            let error =
                TaskError::Internal(format!("played: TaskManager tm-{taskmanager} lost ({lost} messages lost)"));
            let event =
                TaskEvent { vertex: subtask.vertex, subtask: subtask.index, kind: TaskEventKind::Failed(error) };
            // An attempt nobody leads any more has no master to hear it.
            let _ = spec.task_events.send(event);
        }
        drop(attempts);
        self.settle_all();
    }

    /// Every job master handles what came to it: the current one and the earlier leaders'.
    fn settle_all(&mut self) {
        if self.takeovers > 0 && self.job.status() == JobStatus::Reconciling {
            // The TaskManagers report what runs now (a subtask that ended since is gone).
            self.report_running();
        }
        // A killed JobManager's master does nothing more (the next leader takes over).
        for job in self.old_jobs.iter_mut().chain([&mut self.job]).filter(|job| !job.watch.lock().unwrap().dead) {
            job.settle();
        }
    }

    /// Subtask `chosen` reads what the master sent it: a source takes barriers, a sink
    /// commits completions, anyone may be told to finish.
    fn read_controls(&mut self, chosen: usize) -> Result<(), String> {
        let messages: Vec<TaskControl> = {
            let attempts = self.job.deployments.attempts.lock().unwrap();
            let subtask = &self.subtasks[chosen];
            let spec = &attempts[subtask.attempt];
            spec.controls[subtask.vertex][subtask.index as usize].try_iter().collect()
        };
        let (attempt, source, sink) = {
            let subtask = &self.subtasks[chosen];
            (subtask.attempt, subtask.source, subtask.sink)
        };
        let region = region_of(&self.job.deployments.attempts.lock().unwrap()[attempt]);
        let sources_ended = self.sources_ended(attempt);
        let lineage = self.lineages.entry(region).or_default();
        for message in messages {
            match message {
                TaskControl::TriggerCheckpoint(barrier) if source => {
                    // An id is handed out only once the HA store's counter is past it (a new
                    // leader goes on from the counter: it must never reuse one).
                    if let Some(ha) = &self.ha
                        && !self.job.status().is_terminal()
                    {
                        let next = ha.next_checkpoint_id();
                        if next.is_none_or(|next| next <= barrier.checkpoint_id) {
                            return Err(format!(
                                "barrier {} taken while the HA store's next checkpoint id is {next:?}",
                                barrier.checkpoint_id
                            ));
                        }
                    }
                    let savepoint = matches!(barrier.kind, BarrierKind::Savepoint { .. });
                    // Once a stop-with-savepoint completed its subtasks are ending: a new
                    // trigger could only be dropped by the stopped sources and aborted as
                    // failed (the job's log showed a WARN after every `stop --drain`).
                    if self.subtasks[chosen].stop_completed {
                        return Err(format!(
                            "attempt {attempt}: barrier {} triggered after its stop-with-savepoint completed",
                            barrier.checkpoint_id
                        ));
                    }
                    let taken = TakenBarrier { id: barrier.checkpoint_id, after_end: sources_ended, savepoint };
                    lineage.barrier(attempt, taken, barrier.terminates());
                    let stop = if barrier.terminates() { " (a stop)" } else { "" };
                    self.trace.push(format!("attempt {attempt} takes barrier {}{stop}", barrier.checkpoint_id));
                }
                TaskControl::CheckpointComplete(id) => {
                    if lineage.stopping(attempt) == Some(id) {
                        self.subtasks[chosen].stop_completed = true;
                    }
                    if sink {
                        self.trace.push(format!("attempt {attempt} commits up to {id}"));
                        lineage.complete(attempt, id)?;
                    }
                }
                TaskControl::CheckpointAborted(id) => lineage.abort(attempt, id),
                TaskControl::Finish => self.subtasks[chosen].may_finish = true,
                _ => {}
            }
        }
        Ok(())
    }

    /// What subtask `chosen` does next: it stops once told to, may fail while faults run,
    /// acknowledges a barrier its sources took, and otherwise moves on: a source emits its
    /// records, then ends its input; the others end theirs after every source.
    fn next_move(&mut self, chosen: usize, faults: bool) -> Move {
        let (told_to_stop, region) = {
            let attempts = self.job.deployments.attempts.lock().unwrap();
            let spec = &attempts[self.subtasks[chosen].attempt];
            (spec.cancel.load(Ordering::SeqCst) || spec.job_cancelled.load(Ordering::SeqCst), region_of(spec))
        };
        let attempt = self.subtasks[chosen].attempt;
        let sources_ended = self.sources_ended(attempt);
        let lineage = self.lineages.entry(region).or_default();
        // Barriers travel with the records: a subtask's input ends after every barrier its
        // sources took before they ended.
        let before_end = lineage.barriers(attempt).iter().filter(|barrier| !barrier.after_end).count();
        let subtask = &mut self.subtasks[chosen];
        if told_to_stop {
            // A subtask whose input ended may finish before it sees the cancel (with
            // checkpoints, only once `Finish` reached it).
            let may_finish = subtask.may_finish || !self.checkpoints;
            let finished = subtask.stage == Stage::InputEnded && may_finish && self.rng.one_in(3);
            subtask.stage = Stage::Ended;
            return Move::Report(if finished { TaskEventKind::Finished } else { TaskEventKind::Canceled });
        }
        if faults && self.rng.one_in(120) {
            subtask.stage = Stage::Ended;
            let error = TaskError::Internal(format!("played failure of attempt {attempt}"));
            return Move::Report(TaskEventKind::Failed(error));
        }
        let running = matches!(subtask.stage, Stage::Running | Stage::InputEnded);
        if let Some(barrier) = lineage.barriers(attempt).get(subtask.acked).copied().filter(|_| running)
            && self.rng.one_in(2)
        {
            subtask.acked += 1;
            // A savepoint may fail in a subtask (a stop too: the job then runs on).
            if faults && barrier.savepoint && self.rng.one_in(6) {
                return Move::Decline(barrier.id);
            }
            return Move::Acknowledge { id: barrier.id, finished: barrier.after_end };
        }
        if let Some(stop) = lineage.stopping(attempt) {
            // Stopped at a stop's barrier: ends once it took part and the savepoint completed.
            let took_part =
                lineage.barriers(attempt).iter().position(|barrier| barrier.id == stop) < Some(subtask.acked);
            if subtask.stop_completed && took_part {
                subtask.stage = Stage::Ended;
                return Move::Report(TaskEventKind::Finished);
            }
            return Move::Nothing;
        }
        let (next, kind) = match subtask.stage {
            Stage::Deployed => (Stage::Initializing, TaskEventKind::Initializing),
            Stage::Initializing => (Stage::Running, TaskEventKind::Running),
            Stage::Running if subtask.source && lineage.position(attempt) < RECORDS => {
                lineage.emit(attempt);
                return Move::Nothing;
            }
            Stage::Running if subtask.source || (sources_ended && subtask.acked >= before_end) => {
                (Stage::InputEnded, TaskEventKind::EndOfData)
            }
            // With checkpoints a subtask finishes once the final checkpoint completed.
            Stage::Running | Stage::InputEnded if self.checkpoints && !subtask.may_finish => return Move::Nothing,
            Stage::Running => return Move::Nothing,
            Stage::InputEnded | Stage::Ended => (Stage::Ended, TaskEventKind::Finished),
        };
        subtask.stage = next;
        Move::Report(kind)
    }

    /// True when every source subtask of `attempt` ended its input (or ended).
    fn sources_ended(&self, attempt: usize) -> bool {
        self.subtasks.iter().filter(|s| s.attempt == attempt && s.source).all(|s| s.stage >= Stage::InputEnded)
    }

    /// The invariants after a settled step.
    fn check(&self) -> Result<(), String> {
        let status = self.job.status();
        let record = self.job.master.record();
        let deployed = self.job.deployments.attempts.lock().unwrap().len();
        let redeployed = deployed - self.first_attempts;
        // A restart is counted at the failure and deployed once its subtasks ended.
        let restarts_pending = self.job.run.as_ref().is_some_and(|run| !run.sup.region_restarts.is_empty())
            || status != JobStatus::Running;
        let restarts = record.restarts as usize;
        // A deploy the HA store or the executor failed is a restart that deployed nothing.
        let failed_deploys = self.ha.as_ref().map_or(0, PlayedHa::failed_deploys)
            + self.job.deployments.refused.load(Ordering::SeqCst) * self.first_attempts;
        // A region restart deploys one attempt, a whole-job restart one per region (counted
        // for the first leader only: a new one counts its own restarts from its takeover).
        let miscounted = redeployed > restarts * self.first_attempts
            || (!restarts_pending && redeployed + failed_deploys < restarts);
        if self.takeovers == 0 && miscounted {
            return Err(format!("{deployed} attempts deployed but {restarts} restarts counted (job {status})"));
        }
        for (region, lineage) in &self.lineages {
            lineage.check().map_err(|broken| format!("region {region:?}: {broken}"))?;
        }
        for (master, job) in self.old_jobs.iter().chain([&self.job]).enumerate() {
            if let Some(touched) = job.watch.lock().unwrap().without_leadership.first() {
                return Err(format!("JobManager {master} still carried out {touched} after it lost its leadership"));
            }
        }
        let lost_leadership = *self.lost_leadership.lock().unwrap();
        if let (Some((attempts, revision)), Some(ha)) = (lost_leadership, &self.ha) {
            // A JobManager that no longer leads deploys nothing and writes nothing: the new
            // leader does (two leaders acting at once write records twice).
            if deployed != attempts {
                return Err(format!("{} attempts deployed after the leadership was lost", deployed - attempts));
            }
            if ha.revision() != revision {
                return Err("the HA store was written after the leadership was lost".into());
            }
            if status.is_terminal() && status != JobStatus::Suspended && !ha.records_result() {
                return Err(format!("job {status} after the leadership was lost, without its result recorded"));
            }
            // Its subtasks keep running for the new leader; nothing more to check here.
            return Ok(());
        }
        if !status.is_terminal() {
            return Ok(());
        }
        self.check_end(status, &record)
    }

    /// The invariants of a job that ended (the current leader's master shows it ended).
    fn check_end(&self, status: JobStatus, record: &crate::job_master::JobRecord) -> Result<(), String> {
        if status == JobStatus::Finished && self.checkpoints && !self.stopped {
            for (region, lineage) in &self.lineages {
                if lineage.committed() as u64 != RECORDS {
                    return Err(format!(
                        "FINISHED with {} of {RECORDS} records committed in region {region:?}",
                        lineage.committed()
                    ));
                }
            }
        }
        if self.ha.as_ref().is_some_and(|ha| !ha.records_result()) {
            return Err(format!(
                "job {status}, but its result is not in the HA store (a new leader would run it again)"
            ));
        }
        let attempts = self.job.deployments.attempts.lock().unwrap();
        // An earlier leader's subtask the current one told to stop may still be going.
        let zombie = |s: &&PlayedSubtask| {
            self.master_of[s.attempt] != self.takeovers && attempts[s.attempt].cancel.load(Ordering::SeqCst)
        };
        if let Some(alive) = self.subtasks.iter().filter(|s| !zombie(s)).find(|s| s.stage != Stage::Ended) {
            return Err(format!(
                "job {status} while subtask {}/{} of attempt {} is {:?}",
                alive.vertex, alive.index, alive.attempt, alive.stage
            ));
        }
        let all_finished = record.subtasks.iter().flatten().all(|s| s.history.current() == ExecutionState::Finished);
        match status {
            JobStatus::Finished if !all_finished => Err("FINISHED with subtasks that did not finish".into()),
            JobStatus::Canceled if !self.cancelled => Err("CANCELED without a cancel".into()),
            JobStatus::Failed if self.restart_budget.is_some_and(|budget| record.restarts < budget) => Err(format!(
                "FAILED after {} restarts of a budget of {:?}: {:?}",
                record.restarts, self.restart_budget, record.failure_cause
            )),
            JobStatus::Finished | JobStatus::Canceled | JobStatus::Failed => Ok(()),
            other => Err(format!("ended {other} with no leadership to lose")),
        }
    }
}

/// Plays seed `seed` to the job's end; the error names the broken invariant.
fn play(seed: u64) -> Result<Vec<String>, (String, Vec<String>)> {
    let mut play = Play::new(seed);
    for step in 0..MAX_STEPS {
        if let Some(ha) = &play.ha {
            ha.faults(step < FAULT_STEPS);
        }
        let acted = play.act(step < FAULT_STEPS);
        for (master, job) in play.old_jobs.iter().chain([&play.job]).enumerate() {
            let effects = std::mem::take(&mut job.watch.lock().unwrap().log);
            let name = |line: String| if play.takeovers == 0 { line } else { format!("JM{master} {line}") };
            play.trace.extend(effects.into_iter().map(name));
        }
        if let Some(ha) = &play.ha {
            play.trace.extend(ha.drain_log());
        }
        let checked = match (acted, play.see_new_attempts()) {
            (Err(broken), _) | (Ok(()), Some(broken)) => Err(broken),
            (Ok(()), None) => play.check(),
        };
        if let Err(broken) = checked {
            return Err((broken, play.trace));
        }
        let status = play.job.status();
        if play.ended_unseen {
            play.trace.push("job ended before its leader lost the leadership".into());
            return Ok(play.trace);
        }
        // A job SUSPENDED here is taken over by the next leader.
        if status.is_terminal() && status != JobStatus::Suspended {
            play.trace.push(format!("job {}", play.job.status()));
            if play.job.status() == JobStatus::Failed {
                let cause = play.job.master.failure_cause().unwrap_or_default();
                let cause: String = cause.split(':').next().unwrap_or_default().chars().take(60).collect();
                play.trace.push(format!("cause {cause}"));
            }
            return Ok(play.trace);
        }
    }
    if let Some(run) = play.job.run.as_ref() {
        let record = play.job.master.record();
        play.trace.push(format!(
            "final {:?} finishing {} any_finished {} regions {:?} subtasks {:?} next id {} pending {:?} slot free {}",
            run.sup.final_checkpoint,
            run.sup.finishing,
            run.sup.any_finished,
            run.sup.region_restarts.len(),
            record.subtasks.iter().flatten().map(|s| (s.history.current(), s.data_ended)).collect::<Vec<_>>(),
            run.sup.coordinator.next_checkpoint_id(),
            run.sup.coordinator.pending_ids(),
            run.sup.coordinator.periodic_slot_free()
        ));
        for s in &play.subtasks {
            if s.stage != Stage::Ended {
                play.trace.push(format!(
                    "played {}/{} of {}: {:?} acked {} may_finish {} stop_completed {} stopping at {:?}",
                    s.vertex,
                    s.index,
                    s.attempt,
                    s.stage,
                    s.acked,
                    s.may_finish,
                    s.stop_completed,
                    play.lineages.values().map(|l| l.stopping(s.attempt)).collect::<Vec<_>>()
                ));
            }
        }
    }
    Err((
        format!(
            "the job is still {} after {MAX_STEPS} steps and no failure since step {FAULT_STEPS}",
            play.job.status()
        ),
        play.trace,
    ))
}

#[test]
fn random_subtasks_commit_every_record_once_never_meet_two_attempts_of_a_region_and_every_job_ends() {
    let seeds: Vec<u64> = match std::env::var("JOB_MASTER_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => {
            let count = std::env::var("JOB_MASTER_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(SEEDS);
            (0..count).chain(REGRESSION_SEEDS.iter().copied().filter(|seed| *seed >= count)).collect()
        }
    };
    let mut ends = std::collections::BTreeMap::new();
    for seed in seeds {
        match play(seed) {
            Ok(trace) => {
                if std::env::var("JOB_MASTER_SEED").is_ok() {
                    // A replay shows the whole story, passing or not.
                    eprintln!("seed {seed} passes:\n  {}", trace.join("\n  "));
                }
                *ends
                    .entry(trace.iter().rev().find(|l| l.starts_with("job ")).cloned().unwrap_or_default())
                    .or_insert(0) += 1;
                if let Some(cause) = trace.last().filter(|l| l.starts_with("cause")) {
                    *ends.entry(cause.clone()).or_insert(0) += 1;
                }
                for (what, needle) in [
                    ("commits", "commits up to"),
                    ("restores", "restoring Some"),
                    ("savepoints", "(stop: false): Ok"),
                    ("stops", "(stop: true): Ok"),
                    ("barriers", "takes barrier"),
                    ("HA", "HA: true"),
                    ("HA flakes", "HA write"),
                    ("refused starts", "will refuse"),
                    ("lost leaderships", "loses its leadership"),
                    ("lost leaderships after an effect", "leadership after that effect"),
                    ("JobManagers killed after an effect", "process is killed"),
                    ("connections dropped", "connection drops"),
                    ("new leaders", "leads and recovers the job"),
                    ("attempts taken over", ") taken over"),
                    ("ends recorded before a loss", "ended before its leader lost"),
                ] {
                    if trace.iter().any(|line| line.contains(needle)) {
                        *ends.entry(format!("seeds with {what}")).or_insert(0) += 1;
                    }
                }
            }
            Err((broken, trace)) => {
                // A replay prints the whole trace.
                let shown = if std::env::var("JOB_MASTER_SEED").is_ok() { trace.len() } else { 40 };
                let tail = trace.iter().rev().take(shown).rev().cloned().collect::<Vec<_>>().join("\n  ");
                panic!(
                    "seed {seed}: {broken}\n  ...\n  {tail}\nreplay: JOB_MASTER_SEED={seed} cargo test -p weir-runtime --lib random_subtasks"
                );
            }
        }
    }
    eprintln!("ends: {ends:?}");
    // Every end is reached by some seed, or the test would not look at it.
    if std::env::var("JOB_MASTER_SEED").is_err() {
        for end in ["job FINISHED", "job CANCELED", "job FAILED"] {
            assert!(ends.contains_key(end), "no seed ended '{end}': {ends:?}");
        }
    }
}
