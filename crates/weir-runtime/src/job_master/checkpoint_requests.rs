//! Checkpoints a user asks for (Flink's `POST /jobs/{id}/checkpoints`, `flink checkpoint`):
//! a checkpoint like a periodic one (a restore point, its completion commits the sinks),
//! taken now instead of at the next interval, whose outcome the user polls by request id.
//!
//! A request waits while every checkpoint slot (`max-concurrent-checkpoints`) is taken or
//! subtasks are still starting, and fails once the job leaves RUNNING or its input ended.

use super::run::JobRun;
use super::{CheckpointRequestStatus, JobRecord};
use crate::checkpointing::coordinator::Failure;
use weir_api::snapshot::TaskControl;

impl JobRun {
    /// A user's checkpoint request: triggered now when a slot is free and every subtask
    /// runs, else waiting for that.
    ///
    /// `full` (Flink's `checkpointType: FULL`) writes every key group whole, so it reuses
    /// no file of an earlier checkpoint.
    pub(super) fn on_trigger_checkpoint(&mut self, record: &mut JobRecord, request_id: String, full: bool) {
        self.sup.waiting_checkpoints.push((request_id, full));
        self.on_waiting_checkpoints(record);
    }

    /// Triggers the waiting checkpoint requests that can start (one checkpoint serves all
    /// the requests waiting when it starts), or fails them when the job is finishing.
    pub(super) fn on_waiting_checkpoints(&mut self, record: &mut JobRecord) {
        if self.sup.waiting_checkpoints.is_empty() {
            return;
        }
        if self.sup.any_finished || self.sup.finishing || self.sup.final_checkpoint.is_some() {
            let cause = format!(
                "job {} is finishing: its input ended and it takes its final checkpoint; no other checkpoint starts",
                self.master.job_id
            );
            for (request_id, _) in std::mem::take(&mut self.sup.waiting_checkpoints) {
                record.checkpoint_requests.insert(request_id, CheckpointRequestStatus::Failed(cause.clone()));
            }
            return;
        }
        if !Self::all_running(record) || !self.leading() || !self.sup.coordinator.periodic_slot_free() {
            return;
        }
        // One checkpoint serves every waiting request: full if any of them asked for it.
        let full = self.sup.waiting_checkpoints.iter().any(|(_, full)| *full);
        match self.sup.coordinator.trigger_requested(full) {
            Ok(barrier) => {
                tracing::info!(job_id = %self.master.job_id, checkpoint = barrier.checkpoint_id, full, "checkpoint triggered by a user");
                for (request_id, _) in std::mem::take(&mut self.sup.waiting_checkpoints) {
                    self.sup.manual_checkpoints.push((barrier.checkpoint_id, request_id));
                }
                self.send_to_sources(TaskControl::TriggerCheckpoint(barrier));
            }
            Err(cause) => {
                for (request_id, _) in std::mem::take(&mut self.sup.waiting_checkpoints) {
                    record.checkpoint_requests.insert(request_id, CheckpointRequestStatus::Failed(cause.clone()));
                }
            }
        }
    }

    /// Checkpoint `checkpoint_id` completed: the requests it served completed with it.
    pub(super) fn checkpoint_requests_completed(&mut self, record: &mut JobRecord, checkpoint_id: u64) {
        self.sup.manual_checkpoints.retain(|(id, request_id)| {
            if *id != checkpoint_id {
                return true;
            }
            record.checkpoint_requests.insert(request_id.clone(), CheckpointRequestStatus::Completed(checkpoint_id));
            false
        });
    }

    /// Checkpoints that failed: the requests they served failed with them.
    pub(super) fn checkpoint_requests_failed(&mut self, record: &mut JobRecord, failures: &[Failure]) {
        for failure in failures {
            self.sup.manual_checkpoints.retain(|(id, request_id)| {
                if *id != failure.checkpoint_id {
                    return true;
                }
                record
                    .checkpoint_requests
                    .insert(request_id.clone(), CheckpointRequestStatus::Failed(failure.reason.clone()));
                false
            });
        }
    }

    /// The job left RUNNING: no waiting request can start any more.
    pub(super) fn fail_waiting_checkpoints(&mut self, record: &mut JobRecord, state: weir_types::JobStatus) {
        for (request_id, _) in std::mem::take(&mut self.sup.waiting_checkpoints) {
            let cause = format!("job {} went {state} before the checkpoint started", self.master.job_id);
            record.checkpoint_requests.insert(request_id, CheckpointRequestStatus::Failed(cause));
        }
    }
}
