//! The job master's states, one module each; [`drive`] runs a job from its creation to the
//! end of its run here, one state at a time. Each state's `run` handles the events that
//! matter in it and returns the next state.

mod cancelling;
mod created;
mod failing;
mod finished;
mod reconciling;
mod restarting;
mod running;
mod suspended;

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use weir_api::graph::StreamGraph;
use weir_types::{JobStatus, Lifecycle};

use super::run::{Incoming, JobRun, SUPERVISOR_TICK};
use super::{JobMaster, MasterEvent};
use crate::job_settings::JobSettings;

/// Where a job's run goes next.
pub(super) enum State {
    /// Supervising running subtasks.
    Running,
    /// Restarting the whole job after this delay.
    Restarting(Duration),
    /// Failed: waiting for the subtasks to stop.
    Failing,
    /// Cancelled: waiting for the subtasks to stop.
    Cancelling,
    /// Taking over the attempt running on the TaskManagers (a new leader).
    Reconciling,
    /// This JobManager lost its leadership.
    Suspended,
    /// Every subtask finished.
    Finished,
    /// The run is over (the job is terminal, here).
    Ended,
}

/// Runs job `master` from CREATED until its run here is over.
pub(super) fn drive(master: Arc<JobMaster>, graph: StreamGraph, settings: JobSettings, events: Receiver<MasterEvent>) {
    let Some((mut run, mut state)) = created::run(master, graph, settings, events) else {
        return;
    };
    loop {
        state = match state {
            State::Running => running::run(&mut run),
            State::Restarting(delay) => restarting::run(&mut run, delay),
            State::Failing => failing::run(&mut run),
            State::Cancelling => cancelling::run(&mut run),
            State::Reconciling => reconciling::run(&mut run),
            State::Suspended => suspended::run(&mut run),
            State::Finished => finished::run(&mut run),
            State::Ended => break,
        };
    }
    run.shutdown();
}

/// The state a job in `status` belongs to, seen from outside RUNNING.
fn state_of(status: JobStatus, run: &JobRun) -> State {
    match status {
        JobStatus::Running => State::Running,
        JobStatus::Restarting => State::Restarting(run.sup.pending_restart.unwrap_or_default()),
        JobStatus::Failing => State::Failing,
        JobStatus::Cancelling => State::Cancelling,
        JobStatus::Reconciling => State::Reconciling,
        JobStatus::Finished => State::Finished,
        JobStatus::Suspended => State::Suspended,
        _ => State::Ended,
    }
}

/// Waits for every subtask of the current attempt to end, applying their events (no restart
/// decisions: the job is going down), answering cancel and savepoint requests as `status`
/// allows; returns once they all ended or the job's state changed.
fn drain_until_ended(run: &mut JobRun) {
    let master = Arc::clone(&run.master);
    loop {
        let (status, all_ended) = {
            let record = master.record();
            let all_ended = record.subtasks.iter().flatten().all(|s| s.history.current().is_terminal());
            (record.history.current(), all_ended)
        };
        if all_ended || status.is_terminal() {
            return;
        }
        if !run.leading() {
            return;
        }
        let incoming = run.next_event(SUPERVISOR_TICK);
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
                    let _ = subtask
                        .history
                        .transition(weir_types::ExecutionState::Canceled, weir_types::lifecycle::now_ms());
                }
                run.tasks = None;
            }
            Incoming::Nothing => {
                let failures = run.sup.coordinator.expire(std::time::Instant::now());
                run.on_checkpoint_failures(record, failures);
            }
        });
    }
}
