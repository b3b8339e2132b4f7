//! CANCELLING: a user cancelled the job. The subtasks were told to stop; once every one
//! ended the job is CANCELED.

use weir_types::JobStatus;

use super::{State, drain_until_ended, state_of};
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    drain_until_ended(run);
    match run.master.status() {
        JobStatus::Canceled => {
            super::finished::record_result(run);
            State::Ended
        }
        JobStatus::Cancelling if !run.leading() => State::Suspended,
        JobStatus::Cancelling => {
            let master = &run.master;
            master.update(|record| master.transition_job(record, JobStatus::Canceled));
            super::finished::record_result(run);
            State::Ended
        }
        status => state_of(status, run),
    }
}
