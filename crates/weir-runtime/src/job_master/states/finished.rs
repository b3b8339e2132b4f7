//! FINISHED: every subtask finished (or a stop-with-savepoint completed). With high
//! availability the job's result goes to the job result store and its HA data is deleted,
//! so no later leader resumes it (FAILED and CANCELED jobs too, through [`record_result`]).

use std::time::{Duration, Instant};

use super::State;
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    record_result(run);
    State::Ended
}

/// Records a globally terminal job's result in the HA store (nothing without HA).
pub(super) fn record_result(run: &JobRun) {
    let Some(ha) = &run.ha else { return };
    let (state, end_time_ms, failure) = {
        let record = run.master.record();
        let state = record.history.current();
        (state, record.history.current_since(), record.failure_cause.clone())
    };
    if !state.is_globally_terminal() {
        return;
    }
    let result = weir_ha::JobResult {
        job_id: run.master.job_id.to_string(),
        state: state.to_string(),
        end_time_ms,
        failure,
        job_name: Some(run.master.job_name().to_string()),
    };
    // Asked again while this JobManager leads: an unrecorded result lets the next leader
    // recover the job and run it again beside whatever the user started after seeing it end
    // (a job resubmitted from its last checkpoint would then commit the same records twice).
    let deadline = Instant::now() + RESULT_WRITE_WAIT_MAX;
    loop {
        match ha.finish(&result) {
            Ok(()) => return,
            Err(error) if Instant::now() < deadline && run.leading() => {
                tracing::warn!(job_id = %run.master.job_id, %error, "cannot record the job's result in the HA store yet; retrying");
                std::thread::sleep(RESULT_WRITE_RETRY);
            }
            Err(error) => {
                tracing::error!(job_id = %run.master.job_id, %error, "cannot record the job's result in the HA store; a new leader may recover it");
                return;
            }
        }
    }
}

/// How long a JobManager that leads keeps asking the HA store to record a job's result.
const RESULT_WRITE_WAIT_MAX: Duration = Duration::from_secs(30);
/// The pause between those attempts.
const RESULT_WRITE_RETRY: Duration = Duration::from_millis(200);
