//! RUNNING: supervises the subtasks. Task events move their subtasks (a failure goes to the
//! restart strategy: its pipelined region restarts while the job stays RUNNING, or the whole
//! job goes RESTARTING, or FAILING when the strategy gives up); snapshot outcomes complete or
//! fail checkpoints; savepoint requests trigger savepoints; every tick triggers periodic and
//! final checkpoints and expires late ones; a cancel goes CANCELLING. When every subtask
//! finished the job goes FINISHED (states/finished.rs). A JobManager that lost its leadership goes SUSPENDED at once.

use std::sync::Arc;

use weir_types::JobStatus;

use super::{Poll, State, state_of};
use crate::execution::TaskEventKind;
use crate::job_master::MasterEvent;
use crate::job_master::run::{Incoming, JobRun, SUPERVISOR_TICK};

pub(super) fn poll(run: &mut JobRun) -> Poll {
    if !run.leading() {
        return Poll::Go(State::Suspended);
    }
    let now = run.clock.now();
    Poll::Wait(match run.sup.coordinator.next_wakeup() {
        Some(at) => at.saturating_duration_since(now).min(SUPERVISOR_TICK),
        None => SUPERVISOR_TICK,
    })
}

pub(super) fn on_event(run: &mut JobRun, incoming: Incoming) -> Option<State> {
    let master = Arc::clone(&run.master);
    if let Incoming::TasksClosed = incoming {
        // Every subtask thread ended: nothing more will be reported.
        run.tasks = None;
        return Some(State::Ended);
    }
    let status = {
        let mut record = master.record();
        match incoming {
            Incoming::Event(MasterEvent::Cancel) => run.on_cancel(&mut record),
            Incoming::Event(MasterEvent::Task(task)) => {
                if matches!(task.kind, TaskEventKind::Finished) && !run.sup.any_finished {
                    // Finished subtasks cannot take part in checkpoints any more.
                    run.sup.any_finished = true;
                    // After a completed stop-with-savepoint that is the job ending as asked.
                    let stopping = run.sup.completed_stop.is_some();
                    let reason = if stopping {
                        "superseded by the stop-with-savepoint that completed: the job ends"
                    } else {
                        "a subtask finished before the checkpoint completed"
                    };
                    let failures = run.sup.coordinator.abort_all(reason);
                    run.end_checkpoints(&mut record, failures, stopping);
                }
                run.on_task_event(&mut record, task);
            }
            Incoming::Event(MasterEvent::TriggerSavepoint { request_id, target, terminate, format, drain }) => {
                run.on_trigger_savepoint(&mut record, request_id, target, terminate, format, drain)
            }
            Incoming::Event(MasterEvent::TriggerCheckpoint { request_id, full }) => {
                run.on_trigger_checkpoint(&mut record, request_id, full)
            }
            Incoming::Event(MasterEvent::Snapshot(outcome)) => run.on_snapshot(&mut record, outcome),
            Incoming::Nothing | Incoming::TasksClosed => {}
        }
        run.on_tick(&mut record);
        let status = record.history.current();
        if status != JobStatus::Running || run.sup.all_finished {
            // Leaving RUNNING: nothing in flight can complete any more (after a completed
            // stop-with-savepoint, as asked).
            let stopped = run.sup.completed_stop.is_some() && (status == JobStatus::Finished || run.sup.all_finished);
            let failures = run.sup.coordinator.abort_all("the job is no longer running");
            run.end_checkpoints(&mut record, failures, stopped);
            run.fail_waiting_savepoints(&mut record, status);
            if status != JobStatus::Running {
                run.fail_completed_stop(&mut record, status);
            }
            run.fail_waiting_checkpoints(&mut record, status);
        }
        status
    };
    master.changed.notify_all();
    if status != JobStatus::Running {
        return Some(state_of(status, run));
    }
    if run.sup.all_finished {
        return Some(State::Finished);
    }
    if !run.sup.region_restarts.is_empty() {
        run.redeploy_regions();
    }
    None
}
