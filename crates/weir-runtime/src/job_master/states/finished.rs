//! FINISHED: every subtask finished (after the final checkpoint, or a stop-with-savepoint).
//! With high availability the job's result goes to the job result store and its HA data is
//! deleted, so no later leader resumes it; only then does the job show FINISHED. FAILED and
//! CANCELED jobs end through [`end_globally`], which records the result first.

use std::time::Duration;

use weir_types::JobStatus;

use super::State;
use crate::job_master::effects::HaWrite;
use crate::job_master::run::JobRun;
use crate::job_master::{JobRecord, SavepointStatus};

pub(super) fn run(run: &mut JobRun) -> State {
    let status = run.master.status();
    if status.is_globally_terminal() {
        record_result(run, status);
        return State::Ended;
    }
    // Every subtask of the RUNNING job finished: FINISHED shows once the result is recorded,
    // and a stop-with-savepoint completes with it. Until then a new leader would restore the
    // job (from the stop's savepoint), and a second job started from that savepoint would
    // write the same records again.
    let stop = run.sup.completed_stop.take();
    end_recorded(run, JobStatus::Finished, |run, record, recorded| {
        let Some((request_id, location)) = stop else { return };
        match recorded {
            Recorded::Yes => {
                record.savepoints.insert(request_id, (SavepointStatus::Completed(location), false));
            }
            Recorded::No => {
                let job_id = run.master.job_id;
                let cause = format!(
                    "the savepoint {location} completed and job {job_id} finished, but its end could not be recorded in the HA store, so a new leader may restore the job from that savepoint; start a job from it only once `weir list` shows job {job_id} ended under the current leader"
                );
                run.savepoint_failed(record, &request_id, cause);
            }
        }
    })
}

/// Ends a job going down (FAILING, CANCELLING) in its terminal status
/// (`transitions::ending`) once its result is in the HA store: a client that sees the job
/// FAILED or CANCELED (and, say, resubmits it from its last checkpoint) can rely on no later
/// leader running it again. A JobManager that loses its leadership before the result is
/// written suspends the job instead: the next leader decides.
pub(super) fn end_globally(run: &mut JobRun) -> State {
    let Some(terminal) = crate::job_master::transitions::ending(run.master.status()) else {
        return State::Ended;
    };
    end_recorded(run, terminal, |_, _, _| {})
}

/// Ends a job whose deploy did not go through (`created::first_deploy`) in `terminal` once
/// its result is in the HA store, as [`end_globally`] does.
pub(super) fn end_before_start(run: &mut JobRun, terminal: JobStatus) -> State {
    end_recorded(run, terminal, |_, _, _| {})
}

/// Records the job's result as `terminal`, then shows the job so and runs `then` in the same
/// update; a JobManager that lost its leadership before the write suspends the job instead.
fn end_recorded(
    run: &mut JobRun,
    terminal: JobStatus,
    then: impl FnOnce(&mut JobRun, &mut JobRecord, Recorded),
) -> State {
    let recorded = record_result(run, terminal);
    if matches!(recorded, Recorded::No) && !run.leading() {
        return State::Suspended;
    }
    let master = std::sync::Arc::clone(&run.master);
    master.update(|record| {
        master.transition_job(record, terminal);
        then(run, record, recorded);
    });
    State::Ended
}

/// Whether a job's result is in the HA store (or needs not be: no high availability).
enum Recorded {
    Yes,
    No,
}

/// How long a JobManager that leads keeps asking the HA store to record a job's result.
const RESULT_WRITE_WAIT_MAX: Duration = Duration::from_secs(30);
/// The pause between those attempts.
const RESULT_WRITE_RETRY: Duration = Duration::from_millis(200);

/// Records the job's result, `state`, in the HA store (nothing without HA), asking again
/// while this JobManager leads: an unrecorded result lets the next leader recover the job.
fn record_result(run: &mut JobRun, state: JobStatus) -> Recorded {
    let failure = run.master.record().failure_cause.clone();
    let result = weir_ha::JobResult {
        job_id: run.master.job_id.to_string(),
        state: state.to_string(),
        end_time_ms: weir_types::lifecycle::now_ms(),
        failure,
        job_name: Some(run.master.job_name().to_string()),
    };
    let deadline = run.clock.now() + RESULT_WRITE_WAIT_MAX;
    loop {
        match run.record(HaWrite::Result(result.clone())) {
            Ok(()) => return Recorded::Yes,
            Err(error) if run.clock.now() < deadline && run.leading() => {
                tracing::warn!(job_id = %run.master.job_id, %error, "cannot record the job's result in the HA store yet; retrying");
                run.clock.sleep(RESULT_WRITE_RETRY);
            }
            Err(error) => {
                tracing::error!(job_id = %run.master.job_id, %error, "cannot record the job's result in the HA store; a new leader may recover it");
                return Recorded::No;
            }
        }
    }
}
