//! Carries out what the [`CheckpointBook`] asks for, feeding each answer back as the next
//! event, behind [`CheckpointIo`]: object storage and the HA store in a JobManager
//! ([`super::coordinator`]), simulated ones in the deterministic simulation.

use std::collections::{BTreeSet, VecDeque};

use weir_api::snapshot::Barrier;
use weir_checkpoint::format::SnapshotMetadata;

use super::book::{BookEvent, CheckpointBook, Completion, DeletePlan, Effect, Failure, Now, PointerError};

/// The I/O of checkpointing. Every method is one effect; `proceed` is called before each, so
/// a test can stop the driver there (a crash at that effect boundary).
pub trait CheckpointIo {
    /// Whether to carry out `effect` (false: the process died before it; nothing more runs).
    fn proceed(&mut self, _effect: &Effect) -> bool {
        true
    }
    /// Records `next` as the next free checkpoint id in the HA store.
    fn reserve_id(&mut self, next: u64) -> Result<(), String>;
    /// Subtasks of checkpoint `id` write into `location`.
    fn open_dir(&mut self, id: u64, location: &str);
    /// Checkpoint `id` ended.
    fn retire_dir(&mut self, id: u64);
    /// Writes `_metadata` into `location`.
    fn write_metadata(&mut self, id: u64, location: &str, metadata: &SnapshotMetadata) -> Result<(), String>;
    /// Records checkpoint `id` as complete in the HA store, dropping `subsumed`.
    fn record_pointer(&mut self, id: u64, location: &str, subsumed: &[u64]) -> Result<(), PointerError>;
    /// Deletes a failed checkpoint's directory, and with `shared` the shared files it wrote.
    fn delete_failed(&mut self, id: u64, location: &str, shared: bool);
    /// Deletes a retired checkpoint's directory.
    fn delete_checkpoint(&mut self, id: u64, location: &str);
    /// Disposes the claimed snapshot (a snapshot of its own, maybe of another job).
    fn dispose_claimed(&mut self, id: u64, location: &str);
    /// Deletes one file of the job's `shared/` directory.
    fn delete_shared(&mut self, name: &str) -> Result<(), String>;
    /// Deletes the shared files a checkpoint before `below` wrote that none of `keep` is.
    fn sweep_shared(&mut self, keep: &BTreeSet<String>, below: u64);
}

/// What one event came to, for the job master.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Barriers the sources must emit.
    pub triggered: Vec<Barrier>,
    /// Triggers that started nothing, with why.
    pub trigger_failures: Vec<String>,
    /// Completed checkpoints and savepoints.
    pub completed: Vec<Completion>,
    /// Failed and aborted ones.
    pub failed: Vec<Failure>,
    /// False when [`CheckpointIo::proceed`] stopped the driver.
    pub crashed: bool,
}

/// Hands `event` to `book` and carries out every effect that follows, in order.
pub fn drive(book: &mut CheckpointBook, io: &mut dyn CheckpointIo, event: BookEvent, now: Now) -> Outcomes {
    let mut outcomes = Outcomes::default();
    let mut queue: VecDeque<Effect> = book.on(event, now).into();
    while let Some(effect) = queue.pop_front() {
        if !io.proceed(&effect) {
            outcomes.crashed = true;
            break;
        }
        let answer = carry_out(io, effect, &mut outcomes);
        // The answer's effects come before the rest: they continue the same step.
        for event in answer {
            for (at, effect) in book.on(event, now).into_iter().enumerate() {
                queue.insert(at, effect);
            }
        }
    }
    outcomes
}

/// One effect; the events it answers with.
fn carry_out(io: &mut dyn CheckpointIo, effect: Effect, outcomes: &mut Outcomes) -> Vec<BookEvent> {
    match effect {
        Effect::ReserveId { id, next } => vec![BookEvent::IdReserved { id, result: io.reserve_id(next) }],
        Effect::OpenDir { id, location } => {
            io.open_dir(id, &location);
            Vec::new()
        }
        Effect::RetireDir { id } => {
            io.retire_dir(id);
            Vec::new()
        }
        Effect::Triggered(barrier) => {
            outcomes.triggered.push(barrier);
            Vec::new()
        }
        Effect::TriggerFailed(reason) => {
            outcomes.trigger_failures.push(reason);
            Vec::new()
        }
        Effect::WriteMetadata { id, location, metadata } => {
            vec![BookEvent::MetadataWritten { id, result: io.write_metadata(id, &location, &metadata) }]
        }
        Effect::RecordPointer { id, location, subsumed } => {
            vec![BookEvent::PointerRecorded { id, result: io.record_pointer(id, &location, &subsumed) }]
        }
        Effect::DeleteFailed { id, location, shared } => {
            io.delete_failed(id, &location, shared);
            Vec::new()
        }
        Effect::Delete(plan) => carry_out_plan(io, plan),
        Effect::SweepShared { keep, below } => {
            io.sweep_shared(&keep, below);
            Vec::new()
        }
        Effect::Completed(completion) => {
            outcomes.completed.push(completion);
            Vec::new()
        }
        Effect::Failed(failure) => {
            outcomes.failed.push(failure);
            Vec::new()
        }
    }
}

/// A whole plan: the claimed snapshot, the subsumed checkpoints, the shared files.
fn carry_out_plan(io: &mut dyn CheckpointIo, plan: DeletePlan) -> Vec<BookEvent> {
    if let Some((id, location)) = &plan.claimed {
        io.dispose_claimed(*id, location);
    }
    for (id, location) in &plan.checkpoints {
        io.delete_checkpoint(*id, location);
    }
    let mut answers = Vec::new();
    for name in plan.shared_files {
        if let Err(error) = io.delete_shared(&name) {
            tracing::warn!(file = %name, %error, "cannot delete a shared checkpoint file");
            if let Some(released_at) = plan.released_at {
                answers.push(BookEvent::SharedDeleteFailed { name, released_at });
            }
        }
    }
    answers
}
