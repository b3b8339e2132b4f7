//! What a subtask's incremental checkpoints may reuse: where the blocks of its newest
//! completed checkpoint are (Flink's `previousSstFiles` of the RocksDB backend, at key-group
//! granularity).
//!
//! A checkpoint of an incremental job writes, per keyed state, only the key groups written
//! since the *base*, the newest checkpoint this subtask heard completed, into one new file of
//! the job's `shared/` directory, and names the base's blocks for the rest. The base is a
//! completed checkpoint, never one merely written, so nothing names the files of a checkpoint
//! that was aborted (and deleted). Each key group is written whole again once every n
//! checkpoints (periodic materialization, staggered: key group `g` at the checkpoints whose
//! sequence `s` has `(s + g) mod n == 0`, so each checkpoint rewrites about 1/n of the state
//! rather than every n-th rewriting all of it). No chain is longer than n blocks and no
//! block older than n checkpoints stays named, so the files of old checkpoints are released
//! as the job goes on.
//!
//! A new attempt (a restart, a restore) starts without a base: its first checkpoint is full
//! and names no file it did not write (Flink's NO_CLAIM first checkpoint).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use weir_checkpoint::format::BlockRef;

/// Per key group of one keyed state: its blocks with the shared file holding each, a full
/// block and the entry deltas after it, oldest first.
pub type KeyGroupBlocks = BTreeMap<u32, Vec<(Arc<str>, BlockRef)>>;

/// Where the blocks of one written checkpoint of one subtask are.
#[derive(Debug, Default)]
pub struct WrittenCheckpoint {
    /// Its id.
    pub checkpoint_id: u64,
    /// Its place among this attempt's checkpoints of the subtask: 0 for the first (full) one,
    /// its base's plus one otherwise.
    pub sequence: u64,
    /// Per (operator uid, keyed state name): key group -> its chain of (shared file name,
    /// block). The blocks' `shared_file` index is left unset: each checkpoint numbers its
    /// own files.
    pub keyed: HashMap<(String, String), KeyGroupBlocks>,
}

impl WrittenCheckpoint {
    /// Where this checkpoint has the key groups of state `state` of operator `uid`.
    pub fn state(&self, uid: &str, state: &str) -> Option<&KeyGroupBlocks> {
        // Few states per subtask: a scan, without allocating a key.
        self.keyed.iter().find(|((u, s), _)| u == uid && s == state).map(|(_, groups)| groups)
    }
}

#[derive(Default)]
struct Inner {
    base: Option<Arc<WrittenCheckpoint>>,
    /// Written, not yet heard completed.
    written: BTreeMap<u64, Arc<WrittenCheckpoint>>,
}

/// The incremental bookkeeping of one subtask in one attempt.
pub struct IncrementalTracker {
    /// Every key group is written whole once every n checkpoints.
    pub materialize_every: u32,
    inner: Mutex<Inner>,
}

/// Written checkpoints remembered while their completion is awaited, at most (older ones
/// were aborted or subsumed).
const WRITTEN_MAX: usize = 16;

impl IncrementalTracker {
    /// A tracker with no base yet.
    pub fn new(materialize_every: u32) -> Arc<IncrementalTracker> {
        Arc::new(IncrementalTracker { materialize_every: materialize_every.max(1), inner: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the checkpoint after `base` writes key group `key_group` whole (without a
    /// base, every group is).
    pub fn materializes(&self, base: Option<&WrittenCheckpoint>, key_group: u32) -> bool {
        match base {
            None => true,
            Some(base) => (base.sequence + 1 + u64::from(key_group)) % u64::from(self.materialize_every) == 0,
        }
    }

    /// The newest completed checkpoint this subtask wrote, if any.
    pub fn base(&self) -> Option<Arc<WrittenCheckpoint>> {
        self.lock().base.clone()
    }

    /// A checkpoint was written (not yet complete).
    pub fn written(&self, checkpoint: WrittenCheckpoint) {
        let mut inner = self.lock();
        inner.written.insert(checkpoint.checkpoint_id, Arc::new(checkpoint));
        while inner.written.len() > WRITTEN_MAX {
            inner.written.pop_first();
        }
    }

    /// Checkpoint `id` completed: it becomes the base (older written ones were subsumed). A
    /// completion of something this subtask did not write (a savepoint, a checkpoint of an
    /// older attempt, one re-sent after a JobManager takeover) changes nothing.
    pub fn completed(&self, id: u64) {
        let mut inner = self.lock();
        let Some(checkpoint) = inner.written.remove(&id) else { return };
        if inner.base.as_ref().is_none_or(|base| base.checkpoint_id < id) {
            inner.base = Some(checkpoint);
        }
        inner.written.retain(|written, _| *written > id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(id: u64) -> WrittenCheckpoint {
        WrittenCheckpoint { checkpoint_id: id, ..WrittenCheckpoint::default() }
    }

    #[test]
    fn every_key_group_is_materialized_once_in_every_n_checkpoints() {
        let tracker = IncrementalTracker::new(4);
        let mut base: Option<WrittenCheckpoint> = None;
        let mut since = [0u32; 10];
        for sequence in 0..40u64 {
            let mut count = 0;
            for (key_group, since) in since.iter_mut().enumerate() {
                if tracker.materializes(base.as_ref(), key_group as u32) {
                    *since = 0;
                    count += 1;
                } else {
                    *since += 1;
                }
                assert!(*since < 4, "key group {key_group} went 4 checkpoints without being written whole");
            }
            if sequence == 0 {
                assert_eq!(count, 10, "the first checkpoint is full");
            } else {
                assert!((2..=3).contains(&count), "a quarter of 10 groups, not {count}");
            }
            base = Some(WrittenCheckpoint { checkpoint_id: sequence + 1, sequence, ..WrittenCheckpoint::default() });
        }
        // One in every checkpoint with n = 1.
        let every = IncrementalTracker::new(1);
        assert!((0..5).all(|g| every.materializes(base.as_ref(), g)));
    }

    #[test]
    fn only_a_completed_checkpoint_this_subtask_wrote_becomes_the_base() {
        let tracker = IncrementalTracker::new(10);
        assert!(tracker.base().is_none());
        tracker.written(written(3));
        tracker.written(written(4));
        // A savepoint's completion, or one of another attempt.
        tracker.completed(2);
        assert!(tracker.base().is_none());
        tracker.completed(4);
        assert_eq!(tracker.base().unwrap().checkpoint_id, 4);
        // 3 was subsumed by 4: its late completion (there is none in weir, but a re-sent one
        // after a takeover) does not move the base back.
        tracker.completed(3);
        assert_eq!(tracker.base().unwrap().checkpoint_id, 4);
        tracker.completed(4);
        assert_eq!(tracker.base().unwrap().checkpoint_id, 4);
    }
}
