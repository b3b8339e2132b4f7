//! What the job master does when a checkpoint or savepoint completes or fails: a pure
//! decision (completion or failure in, [`OutcomeAction`]s out) that the job master carries out
//! and the deterministic simulation runs as it is (issue 28: events in, effects out).

use crate::checkpointing::book::{Completion, Failure, SnapshotRequest};

/// One thing the job master does about a checkpoint's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum OutcomeAction {
    /// Every subtask commits what it staged up to this checkpoint.
    Commit(u64),
    /// Every subtask hears the checkpoint was aborted (a stop at it is off).
    Abort(u64),
    /// The job takes no more checkpoints: released shared files go now.
    ReleaseShared,
    /// Every input ended and is committed: the subtasks finish.
    Finish,
    /// A user's savepoint completed.
    SavepointCompleted {
        /// The request the user polls.
        request_id: String,
        /// Where it is.
        location: String,
        /// A stop-with-savepoint: reported once the job ended.
        stop: bool,
    },
    /// A user's savepoint failed.
    SavepointFailed {
        /// The request the user polls.
        request_id: String,
        /// Why.
        cause: String,
    },
    /// The job fails over under its restart strategy (a drain that failed after the final
    /// watermark went out).
    FailOver {
        /// The exception's name.
        name: &'static str,
        /// Its message.
        message: String,
    },
    /// The job fails: more checkpoints failed in a row than tolerated.
    FailJob {
        /// Its message.
        message: String,
    },
}

/// A checkpoint or savepoint completed. `final_checkpoint` is the job's final checkpoint, if
/// one was triggered (its completion finishes the job).
pub fn on_completion(completion: &Completion, final_checkpoint: Option<u64>) -> Vec<OutcomeAction> {
    let id = completion.checkpoint_id;
    let mut actions = Vec::new();
    if let SnapshotRequest::Savepoint { request_id, terminate, .. } = &completion.request {
        actions.push(OutcomeAction::SavepointCompleted {
            request_id: request_id.clone(),
            location: completion.location.clone(),
            stop: *terminate,
        });
    }
    if completion.commits() {
        actions.push(OutcomeAction::Commit(id));
    }
    let ends_job = matches!(completion.request, SnapshotRequest::Savepoint { terminate: true, .. });
    let last = final_checkpoint == Some(id);
    if ends_job || last {
        actions.push(OutcomeAction::ReleaseShared);
    }
    if last {
        actions.push(OutcomeAction::Finish);
    }
    actions
}

/// A checkpoint or savepoint failed, while the job is `running` or not. The final checkpoint
/// that failed is no longer the final one (`final_checkpoint` is cleared: the next is).
pub fn on_failure(
    failure: &Failure,
    final_checkpoint: &mut Option<u64>,
    running: bool,
    tolerable_failures: u32,
) -> Vec<OutcomeAction> {
    if *final_checkpoint == Some(failure.checkpoint_id) {
        *final_checkpoint = None;
    }
    let mut actions = vec![OutcomeAction::Abort(failure.checkpoint_id)];
    if let SnapshotRequest::Savepoint { request_id, .. } = &failure.request {
        actions.push(OutcomeAction::SavepointFailed { request_id: request_id.clone(), cause: failure.reason.clone() });
    }
    if matches!(failure.request, SnapshotRequest::Savepoint { drain: true, .. }) && running {
        // The final watermark already went out: every window fired and event time is over, so
        // the job cannot simply go on (Flink fails over too). What the drain emitted is
        // uncommitted and is discarded; the job restarts from its newest checkpoint.
        let message = format!("stop --drain failed after the final watermark: {}", failure.reason);
        actions.push(OutcomeAction::FailOver { name: "StopWithSavepointFailure", message });
    } else if failure.fail_job && running {
        let message = format!(
            "exceeded execution.checkpointing.tolerable-failed-checkpoints ({tolerable_failures}): {}",
            failure.reason
        );
        actions.push(OutcomeAction::FailJob { message });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_api::snapshot::SnapshotFormat;

    fn savepoint(terminate: bool, drain: bool) -> SnapshotRequest {
        SnapshotRequest::Savepoint { request_id: "r".into(), terminate, format: SnapshotFormat::Canonical, drain }
    }

    fn completion(id: u64, request: SnapshotRequest) -> Completion {
        Completion { checkpoint_id: id, request, location: format!("mem://{id}") }
    }

    #[test]
    fn checkpoints_commit_intermediate_savepoints_do_not_and_the_final_one_finishes() {
        assert_eq!(on_completion(&completion(3, SnapshotRequest::Periodic), None), vec![OutcomeAction::Commit(3)]);
        let actions = on_completion(&completion(4, savepoint(false, false)), None);
        assert!(!actions.iter().any(|a| matches!(a, OutcomeAction::Commit(_))), "{actions:?}");
        let actions = on_completion(&completion(5, savepoint(true, false)), None);
        assert!(actions.contains(&OutcomeAction::Commit(5)) && actions.contains(&OutcomeAction::ReleaseShared));
        assert!(!actions.contains(&OutcomeAction::Finish), "a stop ends the job through its sources");
        let actions = on_completion(&completion(6, SnapshotRequest::Periodic), Some(6));
        assert_eq!(actions, vec![OutcomeAction::Commit(6), OutcomeAction::ReleaseShared, OutcomeAction::Finish]);
    }

    #[test]
    fn a_failure_aborts_clears_the_final_checkpoint_and_fails_the_job_only_while_running() {
        let mut last = Some(7);
        let failure =
            Failure { checkpoint_id: 7, request: SnapshotRequest::Periodic, reason: "x".into(), fail_job: true };
        let actions = on_failure(&failure, &mut last, true, 0);
        assert_eq!(last, None);
        assert!(matches!(actions[..], [OutcomeAction::Abort(7), OutcomeAction::FailJob { .. }]), "{actions:?}");
        let actions = on_failure(&failure, &mut None, false, 0);
        assert_eq!(actions, vec![OutcomeAction::Abort(7)]);
        let drain = Failure { checkpoint_id: 8, request: savepoint(true, true), reason: "y".into(), fail_job: false };
        let actions = on_failure(&drain, &mut None, true, 0);
        assert!(matches!(actions[..], [_, OutcomeAction::SavepointFailed { .. }, OutcomeAction::FailOver { .. }]));
    }
}
