//! FAILING and CANCELLING: the restart strategy gave up (or checkpoints failed beyond the
//! tolerable number), or a user cancelled the job. The subtasks were told to stop; once
//! every one ended and the result is recorded the job is FAILED or CANCELED.

use weir_types::JobStatus;

use super::{Poll, State, drained, state_of};
use crate::job_master::run::{JobRun, SUPERVISOR_TICK};

/// Waits while the subtasks end, then ends the job from `going` (FAILING or CANCELLING).
pub(super) fn poll(run: &mut JobRun, going: JobStatus) -> Poll {
    if !drained(run) {
        return Poll::Wait(SUPERVISOR_TICK);
    }
    Poll::Go(match run.master.status() {
        status if status == going && !run.leading() => State::Suspended,
        status if status == going => super::finished::end_globally(run),
        status => state_of(status, run),
    })
}
