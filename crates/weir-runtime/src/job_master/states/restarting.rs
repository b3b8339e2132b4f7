//! RESTARTING (the whole job): waits for the failed attempt's subtasks to end, then for the
//! restart strategy's delay (a cancel ends the job CANCELED; a savepoint request fails with a
//! message), restores the newest completed checkpoint (or the snapshot the job started from)
//! and deploys the next attempt: RUNNING again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_types::JobStatus;

use super::created::first_deploy;
use super::{State, drain_until_ended, state_of};
use crate::job_master::MasterEvent;
use crate::job_master::run::{Incoming, JobRun};

pub(super) fn run(run: &mut JobRun, delay: Duration) -> State {
    drain_until_ended(run);
    let status = run.master.status();
    if status != JobStatus::Restarting {
        return state_of(status, run);
    }
    if !run.leading() {
        return State::Suspended;
    }
    run.join_handles();
    if !wait_before_restart(run, delay) {
        return State::Cancelling;
    }
    match run.restore_for_restart() {
        Ok(Some(latest)) => run.restore = Some(latest),
        Ok(None) => {}
        // Its leadership ended while it asked the HA store: the next leader restarts it.
        Err(_) if !run.leading() => return State::Suspended,
        Err(cause) => {
            run.fail_before_start(cause);
            return State::Ended;
        }
    }
    tracing::info!(job_id = %run.master.job_id, attempt = run.sup.next_attempt, "restarting the job");
    let master = Arc::clone(&run.master);
    master.update(|record| master.transition_job(record, JobStatus::Running));
    match first_deploy(run) {
        Ok(()) => State::Running,
        Err(()) => State::Ended,
    }
}

/// Waits the restart strategy's delay in RESTARTING, answering cancel and savepoint
/// requests meanwhile. False when the job was cancelled instead (it is CANCELLING; its
/// subtasks already ended).
fn wait_before_restart(run: &mut JobRun, delay: Duration) -> bool {
    let master = Arc::clone(&run.master);
    let deadline = Instant::now() + delay;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        match run.events.recv_timeout(deadline - now) {
            Ok(MasterEvent::Cancel) => {
                master.update(|record| master.transition_job(record, JobStatus::Cancelling));
                return false;
            }
            Ok(MasterEvent::TriggerSavepoint { request_id, .. }) => master.update(|record| {
                let cause = format!("job {} is RESTARTING; take the savepoint once it runs again", master.job_id);
                run.savepoint_failed(record, &request_id, cause);
            }),
            Ok(MasterEvent::TriggerCheckpoint { request_id, .. }) => master.update(|record| {
                let cause = format!("job {} is RESTARTING; ask for the checkpoint once it runs again", master.job_id);
                record
                    .checkpoint_requests
                    .insert(request_id, crate::job_master::CheckpointRequestStatus::Failed(cause));
            }),
            Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return true,
        }
        // Snapshot outcomes of the ended attempt are of aborted checkpoints: drop them.
        while let Incoming::Event(_) = drain_snapshot(run) {}
    }
}

fn drain_snapshot(run: &JobRun) -> Incoming {
    match run.snapshots.try_recv() {
        Ok(event) => Incoming::Event(event),
        Err(_) => Incoming::Nothing,
    }
}
