//! RESTARTING (the whole job): waits for the failed attempt's subtasks to end, then for the
//! restart strategy's delay (a cancel ends the job CANCELED; a savepoint request fails with a
//! message), restores the newest completed checkpoint (or the snapshot the job started from)
//! and deploys the next attempt: RUNNING again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_types::JobStatus;

use super::created::{cancelled_by_user, deploy_failed};
use super::{Poll, State, drained, on_draining_event, state_of};
use crate::job_master::MasterEvent;
use crate::job_master::run::{Incoming, JobRun, SUPERVISOR_TICK};

/// A whole-job restart under way.
pub(in crate::job_master) struct Restarting {
    /// The restart strategy's delay.
    delay: Duration,
    /// When the next attempt deploys; `None` while the failed attempt's subtasks end.
    deploy_at: Option<Instant>,
}

impl Restarting {
    /// A restart after `delay`, once the failed attempt ended.
    pub(in crate::job_master) fn after(delay: Duration) -> Restarting {
        Restarting { delay, deploy_at: None }
    }

    pub(super) fn poll(&mut self, run: &mut JobRun) -> Poll {
        let deploy_at = match self.deploy_at {
            Some(at) => at,
            None => {
                if !drained(run) {
                    return Poll::Wait(SUPERVISOR_TICK);
                }
                let status = run.master.status();
                if status != JobStatus::Restarting {
                    return Poll::Go(state_of(status, run));
                }
                if !run.leading() {
                    return Poll::Go(State::Suspended);
                }
                run.join_handles();
                // The attempt ended: what it still reports is of no use (the next deploy
                // opens new channels).
                run.tasks = None;
                *self.deploy_at.insert(run.clock.now() + self.delay)
            }
        };
        let now = run.clock.now();
        if now < deploy_at {
            return Poll::Wait(deploy_at - now);
        }
        Poll::Go(restart(run))
    }

    pub(super) fn on_event(&mut self, run: &mut JobRun, incoming: Incoming) -> Option<State> {
        if self.deploy_at.is_none() {
            on_draining_event(run, incoming);
            return None;
        }
        on_event_while_waiting(run, incoming)
    }
}

/// Events during the restart delay: a cancel ends the job (its subtasks already ended);
/// savepoint and checkpoint requests fail with a message; snapshot outcomes of the ended
/// attempt are of aborted checkpoints and are dropped.
fn on_event_while_waiting(run: &mut JobRun, incoming: Incoming) -> Option<State> {
    let master = Arc::clone(&run.master);
    match incoming {
        Incoming::Event(MasterEvent::Cancel) => {
            master.update(|record| master.transition_job(record, JobStatus::Cancelling));
            return Some(State::Cancelling);
        }
        Incoming::Event(MasterEvent::TriggerSavepoint { request_id, .. }) => master.update(|record| {
            let cause = format!("job {} is RESTARTING; take the savepoint once it runs again", master.job_id);
            run.savepoint_failed(record, &request_id, cause);
        }),
        Incoming::Event(MasterEvent::TriggerCheckpoint { request_id, .. }) => master.update(|record| {
            let cause = format!("job {} is RESTARTING; ask for the checkpoint once it runs again", master.job_id);
            record.checkpoint_requests.insert(request_id, crate::job_master::CheckpointRequestStatus::Failed(cause));
        }),
        Incoming::Event(_) | Incoming::Nothing | Incoming::TasksClosed => {}
    }
    None
}

/// Restores the newest completed checkpoint and deploys the next attempt. Not reading the
/// restart point (the HA store did not answer) or not deploying (the executor, or the HA
/// store recording the attempt number) is a failure the restart strategy decides on, as a
/// subtask's is: the job restarts again after its delay, or goes FAILING and records its
/// result. (It ended FAILED at once, with restarts left and its result unrecorded, so a new
/// leader would have run it again.)
fn restart(run: &mut JobRun) -> State {
    match run.restore_for_restart() {
        Ok(Some(latest)) => run.restore = Some(latest),
        Ok(None) => {}
        // Its leadership ended while it asked the HA store: the next leader restarts it.
        Err(_) if !run.leading() => return State::Suspended,
        Err(cause) => return restart_failed(run, "reading the restart point", &cause),
    }
    tracing::info!(job_id = %run.master.job_id, attempt = run.sup.next_attempt, "restarting the job");
    let master = Arc::clone(&run.master);
    master.update(|record| master.transition_job(record, JobStatus::Running));
    let Err(error) = run.deploy_round() else { return State::Running };
    if cancelled_by_user(run, &error) || !run.leading() {
        // A cancel stopped the wait for slots (CANCELED), or another leader decides.
        return deploy_failed(run, error);
    }
    run.stop_tasks();
    run.join_handles();
    restart_failed(run, "deploying the restarted job", &error.to_string())
}

/// The restart strategy decides on a restart that failed (`what` failed with `error`).
fn restart_failed(run: &mut JobRun, what: &str, error: &str) -> State {
    let master = Arc::clone(&run.master);
    master.update(|record| run.on_failure(record, None, what, error));
    state_of(master.status(), run)
}
