//! FINISHED: every subtask finished (or a stop-with-savepoint completed). With high
//! availability the job's result goes to the job result store and its HA data is deleted,
//! so no later leader resumes it (FAILED and CANCELED jobs too, through [`record_result`]).

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
    if let Err(error) = ha.finish(&result) {
        tracing::error!(job_id = %run.master.job_id, %error, "cannot record the job's result in the HA store; a new leader may recover it");
    }
}
