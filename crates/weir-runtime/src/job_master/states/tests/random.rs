//! The real job master with its subtasks played at random, one seed at a time: subtasks
//! start, run, end their input and finish, or fail; a user may cancel; failures stop after a
//! while. The job runs under the whole-job or the region failover, with a random restart
//! budget. After every settled step:
//!
//! - no pipelined region (the whole job, under full failover) has two attempts alive: a
//!   restart deploys only once every subtask of the failed attempt ended;
//! - every restart the record counts deploys one attempt (a region's or the job's) once the
//!   failed one ended, and no attempt deploys without one;
//! - a terminal job has no subtask alive, and its end is the one its story allows: FINISHED
//!   when every subtask finished, CANCELED only after a cancel, FAILED only once the restart
//!   budget is spent;
//!
//! and once failures stop, the job ends (liveness). A failure names its seed and prints the
//! trace; `JOB_MASTER_SEED=n cargo test -p weir-runtime --lib random_subtasks` replays it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_api::error::TaskError;
use weir_api::prelude::*;
use weir_types::seeded::SeededRng;
use weir_types::{ExecutionState, JobStatus, Lifecycle};

use super::{SteppedJob, pipeline};
use crate::execution::{TaskEvent, TaskEventKind};
use crate::executor::AttemptSpec;
use crate::job_settings::JobSettings;
use crate::restart::RestartStrategyConfig;

/// Seeds per test run.
const SEEDS: u64 = 2000;
/// Steps of a seed after which subtasks stop failing and users stop cancelling.
const FAULT_STEPS: usize = 300;
/// Steps a seed may take in all.
const MAX_STEPS: usize = 3000;

#[derive(Clone, Copy, Debug, PartialEq)]
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
}

struct Play {
    rng: SeededRng,
    job: SteppedJob,
    subtasks: Vec<PlayedSubtask>,
    /// Attempts whose subtasks are in `subtasks`.
    known_attempts: usize,
    /// Attempts the first deploy made (one per region under region failover).
    first_attempts: usize,
    restart_budget: Option<u32>,
    cancelled: bool,
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
        let settings = JobSettings { restart, failover_full: !regions, ..JobSettings::with_parallelism(2) };
        let job = SteppedJob::of(&env, settings);
        let first_attempts = job.attempts.lock().unwrap().len();
        let mut play = Play {
            rng,
            job,
            subtasks: Vec::new(),
            known_attempts: 0,
            first_attempts,
            restart_budget,
            cancelled: false,
            trace: vec![format!("regions: {regions}, restart budget: {restart_budget:?}")],
        };
        play.see_new_attempts();
        play
    }

    /// Plays the subtasks of attempts deployed since the last look; a new attempt of a
    /// region whose older attempt still has a subtask alive breaks the first invariant.
    fn see_new_attempts(&mut self) -> Option<String> {
        let attempts = self.job.attempts.lock().unwrap();
        for (number, spec) in attempts.iter().enumerate().skip(self.known_attempts) {
            let alive_before = self.subtasks.iter().find(|s| {
                s.stage != Stage::Ended && region_of(&attempts[s.attempt]) == region_of(spec) && s.attempt != number
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
            self.trace.push(format!("attempt {number} deployed (region {:?})", region_of(spec)));
            for (vertex, v) in spec.job_graph.vertices.iter().enumerate().filter(|(vertex, _)| deploys(spec, *vertex)) {
                for index in 0..v.parallelism {
                    self.subtasks.push(PlayedSubtask { attempt: number, vertex, index, stage: Stage::Deployed });
                }
            }
        }
        self.known_attempts = attempts.len();
        None
    }

    /// One move of the test: a subtask acts, or the user cancels; then the master settles.
    fn act(&mut self, faults: bool) {
        if faults && !self.cancelled && self.rng.one_in(300) {
            self.cancelled = true;
            let answer = self.job.master.cancel();
            self.trace.push(format!("user cancels: {answer:?}"));
            self.job.settle();
            return;
        }
        let alive: Vec<usize> = (0..self.subtasks.len()).filter(|i| self.subtasks[*i].stage != Stage::Ended).collect();
        if alive.is_empty() {
            self.job.settle();
            return;
        }
        let chosen = alive[self.rng.below(alive.len() as u64) as usize];
        let kind = self.next_report(chosen, faults);
        let subtask = &self.subtasks[chosen];
        self.trace.push(format!("attempt {} subtask {}/{}: {kind:?}", subtask.attempt, subtask.vertex, subtask.index));
        let attempts = self.job.attempts.lock().unwrap();
        // An ended attempt's channel may be closed: the master reads the newest one only.
        let _ = attempts[subtask.attempt].task_events.send(TaskEvent {
            vertex: subtask.vertex,
            subtask: subtask.index,
            kind,
        });
        drop(attempts);
        self.job.settle();
    }

    /// What subtask `chosen` reports next: it stops once told to, may fail while faults
    /// run, and otherwise moves one stage on.
    fn next_report(&mut self, chosen: usize, faults: bool) -> TaskEventKind {
        let told_to_stop = {
            let attempts = self.job.attempts.lock().unwrap();
            let spec = &attempts[self.subtasks[chosen].attempt];
            spec.cancel.load(Ordering::SeqCst) || spec.job_cancelled.load(Ordering::SeqCst)
        };
        let subtask = &mut self.subtasks[chosen];
        if told_to_stop {
            // A subtask whose input ended may finish before it sees the cancel.
            let finished = subtask.stage == Stage::InputEnded && self.rng.one_in(3);
            subtask.stage = Stage::Ended;
            return if finished { TaskEventKind::Finished } else { TaskEventKind::Canceled };
        }
        if faults && self.rng.one_in(25) {
            subtask.stage = Stage::Ended;
            return TaskEventKind::Failed(TaskError::Internal(format!(
                "played failure of attempt {}",
                subtask.attempt
            )));
        }
        let (next, kind) = match subtask.stage {
            Stage::Deployed => (Stage::Initializing, TaskEventKind::Initializing),
            Stage::Initializing => (Stage::Running, TaskEventKind::Running),
            Stage::Running => (Stage::InputEnded, TaskEventKind::EndOfData),
            Stage::InputEnded | Stage::Ended => (Stage::Ended, TaskEventKind::Finished),
        };
        subtask.stage = next;
        kind
    }

    /// The invariants after a settled step.
    fn check(&self) -> Result<(), String> {
        let status = self.job.status();
        let record = self.job.master.record();
        let deployed = self.job.attempts.lock().unwrap().len();
        let redeployed = deployed - self.first_attempts;
        // A restart is counted at the failure and deployed once its subtasks ended.
        let restarts_pending = self.job.run.as_ref().is_some_and(|run| !run.sup.region_restarts.is_empty())
            || status != JobStatus::Running;
        let restarts = record.restarts as usize;
        if redeployed > restarts || (!restarts_pending && redeployed != restarts) {
            return Err(format!("{deployed} attempts deployed but {restarts} restarts counted (job {status})"));
        }
        if !status.is_terminal() {
            return Ok(());
        }
        if let Some(alive) = self.subtasks.iter().find(|s| s.stage != Stage::Ended) {
            return Err(format!(
                "job {status} while subtask {}/{} of attempt {} is {:?}",
                alive.vertex, alive.index, alive.attempt, alive.stage
            ));
        }
        let all_finished = record.subtasks.iter().flatten().all(|s| s.history.current() == ExecutionState::Finished);
        match status {
            JobStatus::Finished if !all_finished => Err("FINISHED with subtasks that did not finish".into()),
            JobStatus::Canceled if !self.cancelled => Err("CANCELED without a cancel".into()),
            JobStatus::Failed if self.restart_budget.is_some_and(|budget| record.restarts < budget) => {
                Err(format!("FAILED after {} restarts of a budget of {:?}", record.restarts, self.restart_budget))
            }
            JobStatus::Finished | JobStatus::Canceled | JobStatus::Failed => Ok(()),
            other => Err(format!("ended {other} with no leadership to lose")),
        }
    }
}

/// Plays seed `seed` to the job's end; the error names the broken invariant.
fn play(seed: u64) -> Result<Vec<String>, (String, Vec<String>)> {
    let mut play = Play::new(seed);
    for step in 0..MAX_STEPS {
        play.act(step < FAULT_STEPS);
        let checked = match play.see_new_attempts() {
            Some(broken) => Err(broken),
            None => play.check(),
        };
        if let Err(broken) = checked {
            return Err((broken, play.trace));
        }
        if play.job.status().is_terminal() {
            play.trace.push(format!("job {}", play.job.status()));
            return Ok(play.trace);
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
fn random_subtasks_never_meet_two_attempts_of_a_region_and_every_job_ends() {
    let seeds: Vec<u64> = match std::env::var("JOB_MASTER_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (0..SEEDS).collect(),
    };
    let mut ends = std::collections::BTreeMap::new();
    for seed in seeds {
        match play(seed) {
            Ok(trace) => *ends.entry(trace.last().cloned().unwrap_or_default()).or_insert(0) += 1,
            Err((broken, trace)) => {
                let tail = trace.iter().rev().take(40).rev().cloned().collect::<Vec<_>>().join("\n  ");
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
