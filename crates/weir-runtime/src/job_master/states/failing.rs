//! FAILING: the restart strategy gave up (or checkpoints failed beyond the tolerable
//! number). The subtasks were told to stop; once every one ended the job is FAILED.

use weir_types::JobStatus;

use super::{State, drain_until_ended, state_of};
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    drain_until_ended(run);
    match run.master.status() {
        JobStatus::Failed => {
            super::finished::record_result(run);
            State::Ended
        }
        JobStatus::Failing if !run.leading() => State::Suspended,
        JobStatus::Failing => {
            // Every subtask thread went away without a last word.
            let master = &run.master;
            master.update(|record| master.transition_job(record, JobStatus::Failed));
            super::finished::record_result(run);
            State::Ended
        }
        status => state_of(status, run),
    }
}
