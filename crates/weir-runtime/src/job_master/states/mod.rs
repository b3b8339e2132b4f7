//! The job master's states, one module each, and the one driver that runs them.
//!
//! A state is a value that owns what only it needs (RESTARTING its delay and deadline,
//! RECONCILING when it began). The driver ([`drive`], one [`step`] at a time) is the only
//! place that waits: it asks the state what it does next ([`State::poll`]): move on at once,
//! or wait at most so long for an event, which it hands to the state ([`State::on_event`]).
//! A test can therefore step a job master by hand, event by event.

mod created;
mod finished;
mod going_down;
mod reconciling;
mod restarting;
mod running;
mod suspended;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use weir_api::graph::StreamGraph;
use weir_types::{JobStatus, Lifecycle};

use super::run::{Incoming, JobRun};
use super::{JobMaster, MasterEvent};
use crate::job_settings::JobSettings;

pub(super) use reconciling::Reconciling;
pub(super) use restarting::Restarting;

/// Where a job's run is.
pub(super) enum State {
    /// Supervising running subtasks.
    Running,
    /// Restarting the whole job: the failed attempt ends, then the delay passes.
    Restarting(Restarting),
    /// Failed: waiting for the subtasks to stop.
    Failing,
    /// Cancelled: waiting for the subtasks to stop.
    Cancelling,
    /// Taking over the attempt running on the TaskManagers (a new leader).
    Reconciling(Reconciling),
    /// This JobManager lost its leadership.
    Suspended,
    /// Every subtask finished.
    Finished,
    /// The run is over (the job is terminal, here).
    Ended,
}

/// What a state does next.
pub(super) enum Poll {
    /// Wait at most this long for the next event.
    Wait(Duration),
    /// Move on to this state now.
    Go(State),
}

impl State {
    /// Does what the state does without an event, and says whether it waits for one.
    pub(super) fn poll(&mut self, run: &mut JobRun) -> Poll {
        match self {
            State::Running => running::poll(run),
            State::Restarting(restarting) => restarting.poll(run),
            State::Failing => going_down::poll(run, JobStatus::Failing),
            State::Cancelling => going_down::poll(run, JobStatus::Cancelling),
            State::Reconciling(reconciling) => reconciling.poll(run),
            State::Suspended => Poll::Go(suspended::run(run)),
            State::Finished => Poll::Go(finished::run(run)),
            State::Ended => Poll::Go(State::Ended),
        }
    }

    /// Handles what the wait brought; `Some` when the state moves.
    pub(super) fn on_event(&mut self, run: &mut JobRun, incoming: Incoming) -> Option<State> {
        match self {
            State::Running => running::on_event(run, incoming),
            State::Restarting(restarting) => restarting.on_event(run, incoming),
            State::Failing | State::Cancelling => {
                on_draining_event(run, incoming);
                None
            }
            State::Reconciling(reconciling) => reconciling.on_event(run, incoming),
            State::Suspended | State::Finished | State::Ended => None,
        }
    }
}

/// Runs job `master` from CREATED until its run here is over.
pub(super) fn drive(master: Arc<JobMaster>, graph: StreamGraph, settings: JobSettings, events: Receiver<MasterEvent>) {
    let Some((mut run, mut state)) = created::run(master, graph, settings, events) else {
        return;
    };
    while !matches!(state, State::Ended) {
        state = step(&mut run, state);
    }
    run.shutdown();
}

/// One move of the job master: the state moves on at once, or waits for its next event and
/// handles it.
pub(super) fn step(run: &mut JobRun, mut state: State) -> State {
    match state.poll(run) {
        Poll::Go(next) => next,
        Poll::Wait(wait) => {
            let incoming = run.next_event(wait);
            state.on_event(run, incoming).unwrap_or(state)
        }
    }
}

/// The state a job in `status` belongs to, seen from outside RUNNING.
fn state_of(status: JobStatus, run: &JobRun) -> State {
    match status {
        JobStatus::Running => State::Running,
        JobStatus::Restarting => State::Restarting(Restarting::after(run.sup.pending_restart.unwrap_or_default())),
        JobStatus::Failing => State::Failing,
        JobStatus::Cancelling => State::Cancelling,
        JobStatus::Reconciling => State::Reconciling(Reconciling::default()),
        JobStatus::Finished => State::Finished,
        JobStatus::Suspended => State::Suspended,
        _ => State::Ended,
    }
}

/// True when the attempt of a job going down (FAILING, CANCELLING, RESTARTING) is over for
/// this master: every subtask ended, the job reached a terminal status, or this JobManager
/// no longer leads.
fn drained(run: &JobRun) -> bool {
    let (status, all_ended) = {
        let record = run.master.record();
        let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
        (record.history.current(), all_ended)
    };
    all_ended || status.is_terminal() || !run.leading()
}

/// Applies an event while the subtasks of a job going down end (no restart decisions),
/// answering cancel and savepoint requests as the job's status allows.
fn on_draining_event(run: &mut JobRun, incoming: Incoming) {
    let master = Arc::clone(&run.master);
    master.update(|record| match incoming {
        Incoming::Event(MasterEvent::Task(event)) => run.on_task_event(record, event),
        Incoming::Event(MasterEvent::Cancel) => run.on_cancel(record),
        Incoming::Event(MasterEvent::TriggerSavepoint { request_id, .. }) => {
            let cause = format!(
                "job {} is {}; savepoints are taken of RUNNING jobs only",
                master.job_id,
                record.history.current()
            );
            run.savepoint_failed(record, &request_id, cause);
        }
        Incoming::Event(MasterEvent::TriggerCheckpoint { request_id, .. }) => {
            let cause = format!(
                "job {} is {}; checkpoints are taken of RUNNING jobs only",
                master.job_id,
                record.history.current()
            );
            record.checkpoint_requests.insert(request_id, super::CheckpointRequestStatus::Failed(cause));
        }
        Incoming::Event(MasterEvent::Snapshot(outcome)) => run.on_snapshot(record, outcome),
        Incoming::TasksClosed => {
            // Every subtask thread is gone: whatever was not reported ended with them.
            super::run::mark_canceling(record, |_| true);
            for subtask in record.subtasks.iter_mut().flatten() {
                let _ =
                    subtask.history.transition(weir_types::ExecutionState::Canceled, weir_types::lifecycle::now_ms());
            }
            run.tasks = None;
        }
        Incoming::Nothing => {
            let failures = run.sup.coordinator.expire(run.clock.now());
            run.on_checkpoint_failures(record, failures);
        }
    });
}
