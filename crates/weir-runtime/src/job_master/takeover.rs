//! The rules of a takeover, decided without I/O or clock: which reported attempts a new
//! leader keeps (the newest per pipelined region), whether the reports cover the job, what it
//! does then (wait, take the attempts over, or give up and restart), and what it tells the
//! subtasks it took over. `states/reconciling.rs` carries them out in a JobManager; the
//! deterministic simulation runs the same rules.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use weir_types::ExecutionState;

use crate::executor::ReportedAttempt;

/// Old checkpoint ids aborted after a takeover, at most (the newest ones).
const ABORTED_AFTER_TAKEOVER_MAX: u64 = 1000;

/// What the reports cover of the job graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// Every subtask of the job graph is reported.
    pub complete: bool,
    /// A reported subtask failed or was cancelled while no leader watched it.
    pub failed: bool,
    /// Subtasks reported.
    pub reported: usize,
    /// Subtasks of the job graph.
    pub expected: usize,
}

/// The reports kept: the newest attempt of each region (with `by_region`; else of the job),
/// and the attempt numbers of older ones, which are cancelled.
pub fn newest_per_region(reported: Vec<ReportedAttempt>, by_region: bool) -> (Vec<ReportedAttempt>, Vec<u32>) {
    let mut newest: BTreeMap<Option<usize>, ReportedAttempt> = BTreeMap::new();
    let mut stale = Vec::new();
    for attempt in reported {
        let region = if by_region { attempt.region } else { None };
        match newest.get(&region) {
            Some(existing) if existing.attempt >= attempt.attempt => stale.push(attempt.attempt),
            Some(existing) => {
                stale.push(existing.attempt);
                newest.insert(region, attempt);
            }
            None => {
                newest.insert(region, attempt);
            }
        }
    }
    (newest.into_values().collect(), stale)
}

/// What `reported` covers of a job graph of `expected` subtasks; `in_scope(vertex, region)`
/// says whether a subtask of `vertex` belongs to an attempt of `region`.
pub fn coverage(
    reported: &[ReportedAttempt],
    expected: usize,
    in_scope: impl Fn(usize, Option<usize>) -> bool,
) -> Coverage {
    let mut covered: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut failed = false;
    for attempt in reported {
        for subtask in &attempt.subtasks {
            if !in_scope(subtask.vertex, attempt.region) {
                continue;
            }
            match subtask.state {
                ExecutionState::Failed | ExecutionState::Canceled | ExecutionState::Canceling => failed = true,
                _ => {
                    covered.insert((subtask.vertex, subtask.subtask));
                }
            }
        }
    }
    Coverage { complete: covered.len() == expected, failed, reported: covered.len(), expected }
}

/// What a reconciling master does with what is reported so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReconcileDecision {
    /// Wait for more reports.
    Wait,
    /// Take the reported attempts over: RUNNING without restarting a task.
    TakeOver,
    /// The user cancelled the job meanwhile.
    Cancel,
    /// Restart the job from its newest completed checkpoint, for this reason (a failure the
    /// restart strategy decides on).
    GiveUp(String),
}

/// The decision: a full report without failures is taken over (unless a cancel came); a
/// failure, a cancel or the reconcile timeout ends the wait.
pub fn decide(coverage: &Coverage, cancel: bool, timed_out: bool, timeout_text: &str) -> ReconcileDecision {
    if cancel {
        return ReconcileDecision::Cancel;
    }
    if coverage.failed {
        return ReconcileDecision::GiveUp("a subtask failed while no JobManager led".into());
    }
    if coverage.complete {
        return ReconcileDecision::TakeOver;
    }
    if timed_out {
        return ReconcileDecision::GiveUp(format!(
            "the TaskManagers reported {} of {} subtasks within {timeout_text} (high-availability.reconcile-timeout)",
            coverage.reported, coverage.expected
        ));
    }
    ReconcileDecision::Wait
}

/// What the subtasks taken over hear: the newest completed checkpoint again (a sink whose
/// commit the old leader never sent commits now; commits are idempotent), and an abort of
/// every checkpoint the old leader may have left in flight after it (a stop-with-savepoint
/// that never completed resumes the job).
pub fn after_takeover(latest_retained: Option<u64>, next_id: u64) -> (Option<u64>, Range<u64>) {
    let first_abandoned =
        latest_retained.map_or(1, |id| id + 1).max(next_id.saturating_sub(ABORTED_AFTER_TAKEOVER_MAX));
    (latest_retained, first_abandoned..next_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ReportedSubtask;

    fn attempt(number: u32, region: Option<usize>, subtasks: &[(u32, ExecutionState)]) -> ReportedAttempt {
        let subtasks = subtasks
            .iter()
            .map(|(subtask, state)| ReportedSubtask {
                vertex: 0,
                subtask: *subtask,
                state: *state,
                data_ended: false,
                taskmanager: "tm".into(),
            })
            .collect();
        ReportedAttempt { attempt: number, region, slot_addresses: Vec::new(), subtasks }
    }

    #[test]
    fn the_newest_attempt_of_each_region_is_kept_and_older_ones_cancelled() {
        let reports = vec![attempt(1, Some(0), &[]), attempt(3, Some(0), &[]), attempt(2, Some(1), &[])];
        let (kept, stale) = newest_per_region(reports.clone(), true);
        assert_eq!(kept.iter().map(|a| a.attempt).collect::<Vec<_>>(), vec![3, 2]);
        assert_eq!(stale, vec![1]);
        let (kept, stale) = newest_per_region(reports, false);
        assert_eq!(kept.iter().map(|a| a.attempt).collect::<Vec<_>>(), vec![3]);
        assert_eq!(stale, vec![1, 2]);
    }

    #[test]
    fn a_full_report_is_taken_over_and_a_failed_or_late_one_restarts() {
        use ExecutionState::{Failed, Running};
        let all = |_: usize, _: Option<usize>| true;
        let full = coverage(&[attempt(1, None, &[(0, Running), (1, Running)])], 2, all);
        assert_eq!(decide(&full, false, false, "1s"), ReconcileDecision::TakeOver);
        assert_eq!(decide(&full, true, false, "1s"), ReconcileDecision::Cancel);
        let half = coverage(&[attempt(1, None, &[(0, Running)])], 2, all);
        assert_eq!(decide(&half, false, false, "1s"), ReconcileDecision::Wait);
        assert!(matches!(decide(&half, false, true, "1s"), ReconcileDecision::GiveUp(r) if r.contains("1 of 2")));
        let failed = coverage(&[attempt(1, None, &[(0, Running), (1, Failed)])], 2, all);
        assert!(matches!(decide(&failed, false, false, "1s"), ReconcileDecision::GiveUp(_)));
    }

    #[test]
    fn a_takeover_recommits_the_newest_and_aborts_what_followed() {
        assert_eq!(after_takeover(Some(4), 7), (Some(4), 5..7));
        assert_eq!(after_takeover(None, 3), (None, 1..3));
        assert_eq!(after_takeover(Some(1), 5000), (Some(1), 4000..5000));
    }
}
