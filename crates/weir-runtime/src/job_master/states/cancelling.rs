//! CANCELLING: a user cancelled the job. The subtasks were told to stop; once every one
//! ended and the result is recorded the job is CANCELED.

use weir_types::JobStatus;

use super::{State, drain_until_ended, state_of};
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    drain_until_ended(run);
    match run.master.status() {
        JobStatus::Cancelling if !run.leading() => State::Suspended,
        JobStatus::Cancelling => super::finished::end_globally(run),
        status => state_of(status, run),
    }
}
