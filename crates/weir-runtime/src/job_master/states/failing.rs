//! FAILING: the restart strategy gave up (or checkpoints failed beyond the tolerable
//! number). The subtasks were told to stop; once every one ended and the result is recorded
//! the job is FAILED.

use weir_types::JobStatus;

use super::{State, drain_until_ended, state_of};
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    drain_until_ended(run);
    match run.master.status() {
        JobStatus::Failing if !run.leading() => State::Suspended,
        JobStatus::Failing => super::finished::end_globally(run),
        status => state_of(status, run),
    }
}
