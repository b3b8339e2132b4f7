//! The job-level moves of the job master, decided without I/O or clock: what a failure, a
//! cancel and the end of every subtask do to the job's status. The states carry the plans out
//! (`run.rs`: stopping tasks, marking subtasks, scheduling restarts). A test checks that every
//! move these rules make is one the job lifecycle's table allows.

use std::time::Duration;

use weir_types::JobStatus;

use crate::restart::{RestartDecision, RestartStrategy};

/// What a failure does to the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailurePlan {
    /// Only the failed subtask's pipelined region restarts, after `delay`; the job stays
    /// RUNNING.
    RestartRegion {
        /// The region.
        region: usize,
        /// The restart strategy's delay.
        delay: Duration,
    },
    /// The whole job restarts after `delay`: RESTARTING.
    RestartJob {
        /// The restart strategy's delay.
        delay: Duration,
    },
    /// The restart strategy gives up: FAILING, then FAILED.
    Fail {
        /// The job's failure cause.
        cause: String,
    },
}

impl FailurePlan {
    /// The status the job moves to at once, if it moves.
    pub fn next_status(&self) -> Option<JobStatus> {
        match self {
            FailurePlan::RestartRegion { .. } => None,
            FailurePlan::RestartJob { .. } => Some(JobStatus::Restarting),
            FailurePlan::Fail { .. } => Some(JobStatus::Failing),
        }
    }
}

/// True when a subtask's failure is a new failure the restart strategy decides on: the job
/// runs and the subtask's region is not already restarting. Otherwise it is a consequence of
/// a failover under way, only logged.
pub fn failure_counts(status: JobStatus, region_restarting: bool) -> bool {
    status == JobStatus::Running && !region_restarting
}

/// What a counted failure does: `region` is the failed subtask's pipelined region in region
/// failover (`None`: the whole job), `what` failed with `error`, `elapsed_ms` after the job
/// started (the strategy's clock).
pub fn failure_plan(
    strategy: &mut RestartStrategy,
    elapsed_ms: u64,
    region: Option<usize>,
    what: &str,
    error: &str,
) -> FailurePlan {
    match strategy.on_failure(elapsed_ms) {
        RestartDecision::RestartAfter(delay) => match region {
            Some(region) => FailurePlan::RestartRegion { region, delay },
            None => FailurePlan::RestartJob { delay },
        },
        RestartDecision::GiveUp(reason) => {
            FailurePlan::Fail { cause: format!("{what} failed: {error} (not restarted: {reason})") }
        }
    }
}

/// True when a cancel moves a job in `status` to CANCELLING (a job already going down, or
/// ended, keeps its course).
pub fn cancellable(status: JobStatus) -> bool {
    matches!(status, JobStatus::Running | JobStatus::Created | JobStatus::Restarting | JobStatus::Reconciling)
}

/// The status a job in `status` settles in once every subtask ended, if any: a RUNNING job
/// finished (unless regions wait to restart).
///
/// A FAILING or CANCELLING job is not moved here: its state ends it in [`ending`]'s status
/// once the result is in the HA store, so a client that sees a job FAILED or CANCELED can
/// rely on no later leader running it again.
pub fn settled(status: JobStatus, all_ended: bool, regions_pending: bool) -> Option<JobStatus> {
    match status {
        JobStatus::Running if all_ended && !regions_pending => Some(JobStatus::Finished),
        _ => None,
    }
}

/// The globally terminal status a job going down in `status` ends in: FAILING ends FAILED,
/// CANCELLING ends CANCELED.
pub fn ending(status: JobStatus) -> Option<JobStatus> {
    match status {
        JobStatus::Failing => Some(JobStatus::Failed),
        JobStatus::Cancelling => Some(JobStatus::Canceled),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restart::RestartStrategyConfig;
    use weir_types::Lifecycle;

    fn fixed(attempts: u32) -> RestartStrategy {
        RestartStrategy::new(RestartStrategyConfig::FixedDelay { attempts, delay: Duration::from_millis(10) }, 0)
    }

    #[test]
    fn a_failure_restarts_its_region_or_the_job_until_the_strategy_gives_up() {
        let mut strategy = fixed(2);
        let plan = failure_plan(&mut strategy, 0, Some(1), "map (1/2)", "boom");
        assert_eq!(plan, FailurePlan::RestartRegion { region: 1, delay: Duration::from_millis(10) });
        assert_eq!(plan.next_status(), None);
        let plan = failure_plan(&mut strategy, 5, None, "map (1/2)", "boom");
        assert_eq!(plan, FailurePlan::RestartJob { delay: Duration::from_millis(10) });
        assert_eq!(plan.next_status(), Some(JobStatus::Restarting));
        let plan = failure_plan(&mut strategy, 9, None, "map (1/2)", "boom");
        let FailurePlan::Fail { cause } = &plan else { panic!("{plan:?}") };
        assert!(cause.starts_with("map (1/2) failed: boom (not restarted: the fixed-delay"), "{cause}");
        assert_eq!(plan.next_status(), Some(JobStatus::Failing));
    }

    #[test]
    fn only_a_failure_of_a_running_job_outside_a_restarting_region_counts() {
        assert!(failure_counts(JobStatus::Running, false));
        assert!(!failure_counts(JobStatus::Running, true));
        for status in JobStatus::all().iter().filter(|s| **s != JobStatus::Running) {
            assert!(!failure_counts(*status, false), "{status}");
        }
    }

    #[test]
    fn a_job_settles_only_once_every_subtask_ended() {
        assert_eq!(settled(JobStatus::Running, false, false), None);
        assert_eq!(settled(JobStatus::Running, true, false), Some(JobStatus::Finished));
        assert_eq!(settled(JobStatus::Running, true, true), None);
        // Going down, a job ends in its state, once its result is recorded.
        assert_eq!(settled(JobStatus::Failing, true, false), None);
        assert_eq!(settled(JobStatus::Cancelling, true, true), None);
        assert_eq!(settled(JobStatus::Restarting, true, false), None);
        assert_eq!(ending(JobStatus::Failing), Some(JobStatus::Failed));
        assert_eq!(ending(JobStatus::Cancelling), Some(JobStatus::Canceled));
        assert_eq!(ending(JobStatus::Running), None);
    }

    #[test]
    fn every_move_these_rules_make_is_a_legal_job_transition() {
        // The statuses the rules move to are moves the job's lifecycle allows from where they
        // are made: the rules and the lifecycle table cannot drift apart.
        for status in JobStatus::all().iter().copied() {
            for (all_ended, pending) in [(true, false), (true, true)] {
                if let Some(next) = settled(status, all_ended, pending) {
                    assert!(status.can_transition_to(next), "{status} -> {next}");
                }
            }
            if let Some(next) = ending(status) {
                assert!(status.can_transition_to(next) && next.is_globally_terminal(), "{status} -> {next}");
            }
            if cancellable(status) {
                assert!(status.can_transition_to(JobStatus::Cancelling), "{status} -> CANCELLING");
            }
            if failure_counts(status, false) {
                let mut strategy = fixed(1);
                for plan in
                    [failure_plan(&mut strategy, 0, None, "x", "y"), failure_plan(&mut strategy, 0, None, "x", "y")]
                {
                    if let Some(next) = plan.next_status() {
                        assert!(status.can_transition_to(next), "{status} -> {next}");
                    }
                }
            }
        }
    }
}
