//! The simulated JobManager's checkpoint I/O: the real [`CheckpointIo`] interface over the
//! simulated storage and HA store, dying at a random effect boundary when crashes are armed.

use std::collections::BTreeSet;

use weir_checkpoint::format::SnapshotMetadata;
use weir_checkpoint::paths::shared_file_checkpoint;

use super::world::{HaWriteError, Object, SimHa, SimRng, SimStorage};
use crate::checkpointing::book::{Effect, PointerError};
use crate::checkpointing::driver::CheckpointIo;

/// The shared directory next to a checkpoint directory `chk-<n>` (`<job dir>/shared`).
pub fn shared_dir_of(location: &str) -> String {
    let job_dir = location.rsplit_once('/').map_or(location, |(parent, _)| parent);
    format!("{job_dir}/shared")
}

pub struct SimIo<'a> {
    pub storage: &'a mut SimStorage,
    pub ha: &'a mut SimHa,
    pub rng: &'a mut SimRng,
    /// The directory registry the subtasks look their checkpoint's location up in.
    pub trace: &'a mut Vec<String>,
    /// The job's `shared/` directory.
    pub shared: String,
    pub epoch: u64,
    /// Dies at an effect boundary with probability `1/crash_one_in` (0: never).
    pub crash_one_in: u64,
    pub dead: bool,
    /// An HA write answered that another JobManager leads.
    pub lost_leadership: bool,
}

impl SimIo<'_> {
    /// Whether the process dies before the next piece of I/O.
    fn dies(&mut self) -> bool {
        if !self.dead && self.crash_one_in > 0 && self.rng.one_in(self.crash_one_in) {
            self.dead = true;
        }
        self.dead
    }

    fn ha_write(&mut self, what: &str, apply: impl FnOnce(&mut SimHa)) -> Result<(), HaWriteError> {
        let result = self.ha.write(self.epoch, apply);
        self.trace.push(format!("  HA {what} by epoch {}: {result:?}", self.epoch));
        if result == Err(HaWriteError::LostLeadership) {
            self.lost_leadership = true;
        }
        result
    }
}

impl CheckpointIo for SimIo<'_> {
    fn proceed(&mut self, effect: &Effect) -> bool {
        if self.dies() {
            self.trace.push(format!("  crash before {}", effect_name(effect)));
            return false;
        }
        true
    }

    fn reserve_id(&mut self, next: u64) -> Result<(), String> {
        self.ha_write(&format!("next checkpoint id {next}"), |ha| ha.next_checkpoint_id = next)
            .map_err(|e| format!("{e:?}"))
    }

    // Simulated object storage has no directories to open, and its subtasks learn of ended
    // checkpoints from the completion and abort messages, as TaskManagers do.
    fn open_dir(&mut self, _id: u64, _location: &str) {}

    fn retire_dir(&mut self, _id: u64) {}

    fn write_metadata(&mut self, id: u64, location: &str, metadata: &SnapshotMetadata) -> Result<(), String> {
        self.trace.push(format!("  _metadata of {id} written"));
        self.storage.put(format!("{location}/_metadata"), Object::Metadata(Box::new(metadata.clone())));
        Ok(())
    }

    fn record_pointer(&mut self, id: u64, location: &str, subsumed: &[u64]) -> Result<(), PointerError> {
        let location = location.to_string();
        let what = format!("pointer {id} dropping {subsumed:?}");
        self.ha_write(&what, |ha| {
            ha.pointers.insert(id, location);
            for old in subsumed {
                ha.pointers.remove(old);
            }
        })
        .map_err(|e| match e {
            HaWriteError::LostLeadership => PointerError::LostLeadership("lost leadership".into()),
            HaWriteError::Unknown => PointerError::Unknown("no answer".into()),
        })
    }

    fn delete_failed(&mut self, id: u64, location: &str, shared: bool) {
        if self.dies() {
            return;
        }
        self.trace.push(format!("  delete failed {id} (shared files too: {shared})"));
        self.storage.delete_prefix(location);
        if shared {
            for name in self.storage.list(&self.shared) {
                if shared_file_checkpoint(&name) == Some(id) {
                    self.storage.delete(&format!("{}/{name}", self.shared));
                }
            }
        }
    }

    fn delete_checkpoint(&mut self, id: u64, location: &str) {
        if self.dies() {
            return;
        }
        self.trace.push(format!("  delete retired {id}"));
        self.storage.delete_prefix(location);
    }

    fn dispose_claimed(&mut self, id: u64, location: &str) {
        self.delete_checkpoint(id, location);
    }

    fn delete_shared(&mut self, name: &str) -> Result<(), String> {
        if self.dies() {
            return Err("the process died".into());
        }
        self.trace.push(format!("  delete shared {name}"));
        self.storage.delete(&format!("{}/{name}", self.shared));
        Ok(())
    }

    fn sweep_shared(&mut self, keep: &BTreeSet<String>, below: u64) {
        for name in self.storage.list(&self.shared) {
            if self.dies() {
                return;
            }
            if shared_file_checkpoint(&name).is_some_and(|id| id < below) && !keep.contains(&name) {
                self.trace.push(format!("  sweep shared {name}"));
                self.storage.delete(&format!("{}/{name}", self.shared));
            }
        }
    }
}

fn effect_name(effect: &Effect) -> String {
    match effect {
        Effect::ReserveId { id, .. } => format!("reserving id {id}"),
        Effect::OpenDir { id, .. } => format!("opening {id}"),
        Effect::RetireDir { id } => format!("retiring {id}"),
        Effect::Triggered(barrier) => format!("sending barrier {}", barrier.checkpoint_id),
        Effect::TriggerFailed(_) => "reporting a failed trigger".into(),
        Effect::WriteMetadata { id, .. } => format!("writing _metadata of {id}"),
        Effect::RecordPointer { id, .. } => format!("recording pointer {id}"),
        Effect::DeleteFailed { id, .. } => format!("deleting failed {id}"),
        Effect::Delete(plan) => format!("deleting {plan:?}"),
        Effect::SweepShared { .. } => "sweeping shared files".into(),
        Effect::Completed(completion) => format!("reporting {} complete", completion.checkpoint_id),
        Effect::Failed(failure) => format!("reporting {} failed", failure.checkpoint_id),
    }
}
