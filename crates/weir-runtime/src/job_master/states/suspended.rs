//! SUSPENDED: this JobManager lost its leadership (another took over, or its etcd lease
//! expired). It stops acting at once: no checkpoint is triggered or completed, no message
//! goes to the TaskManagers, and the tasks are *not* cancelled: they keep running for the
//! new leader, which reconciles with them. The job is SUSPENDED here (locally terminal).

use std::sync::Arc;

use weir_types::{JobStatus, Lifecycle};

use super::State;
use crate::job_master::run::JobRun;

pub(super) fn run(run: &mut JobRun) -> State {
    tracing::warn!(job_id = %run.master.job_id, "leadership lost: the job is suspended here; the new leader takes it over");
    let master = Arc::clone(&run.master);
    master.update(|record| {
        if !record.history.current().is_terminal() {
            master.transition_job(record, JobStatus::Suspended);
        }
    });
    // The attempt handles release this process's bookkeeping only (no cancel is sent).
    run.join_handles();
    State::Ended
}
