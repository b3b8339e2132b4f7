//! Which checkpoints of a job (or of one attempt on a TaskManager) have ended, completed or
//! aborted: a subtask's snapshot of one that arrives late is not written, and a write that
//! was under way when its checkpoint was aborted removes what it wrote. On the JobManager the
//! coordinator ends them; on a TaskManager the JobManager's completion and abort messages do.
//!
//! Where a snapshot is written is not looked up here: its barrier carries the location.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// Ended checkpoint ids remembered, at most (older ones are far past any barrier).
const ENDED_MAX: usize = 4096;

/// The ended checkpoints of one job (or one attempt on a TaskManager).
#[derive(Default)]
pub struct EndedCheckpoints {
    ended: Mutex<BTreeSet<u64>>,
}

impl EndedCheckpoints {
    /// None ended yet.
    pub fn new() -> Arc<EndedCheckpoints> {
        Arc::new(EndedCheckpoints::default())
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        self.ended.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checkpoint `id` completed or was aborted: no more snapshots of it are written.
    pub fn end(&self, id: u64) {
        let mut ended = self.lock();
        ended.insert(id);
        while ended.len() > ENDED_MAX {
            ended.pop_first();
        }
    }

    /// True once checkpoint `id` completed or was aborted.
    pub fn has_ended(&self, id: u64) -> bool {
        self.lock().contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_checkpoints_are_remembered_up_to_a_bound() {
        let ended = EndedCheckpoints::new();
        assert!(!ended.has_ended(1));
        ended.end(1);
        assert!(ended.has_ended(1));
        for id in 2..=(ENDED_MAX as u64 + 1) {
            ended.end(id);
        }
        // The oldest is forgotten first; the newest are kept.
        assert!(!ended.has_ended(1));
        assert!(ended.has_ended(ENDED_MAX as u64 + 1));
    }
}
