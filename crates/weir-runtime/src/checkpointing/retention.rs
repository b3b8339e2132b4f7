//! Which completed checkpoints a job keeps, and what goes when one completes: a pure
//! decision over ids and shared-file names, returned as a [`RetentionPlan`] that is complete
//! before anything is deleted. The coordinator records the plan's dropped ids in the HA store
//! with the new pointer (one decision for both), then carries the deletions out.
//!
//! Incremental checkpoints name files of the job's `shared/` directory. A file no retained
//! checkpoint names any more is *released* by the completion that dropped its last user, and
//! deleted only at a later completion: a subtask that had not yet heard of the newest
//! completion may build its next checkpoint on the one before, and a completion that names a
//! released file takes it back.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The retained checkpoints of one job, with the shared files each names. `D` is the handle
/// of a checkpoint's directory (storage in the coordinator, nothing in tests).
#[derive(Debug)]
pub(crate) struct Retention<D> {
    num_retained: usize,
    /// Retained checkpoints, in id order.
    retained: VecDeque<(u64, D)>,
    /// The shared files each retained checkpoint names.
    shared_refs: BTreeMap<u64, BTreeSet<String>>,
    /// Shared files no retained checkpoint names, with the completion that released them.
    released: BTreeMap<String, u64>,
    /// A snapshot the job claimed (claim mode CLAIM): disposed, not deleted, once subsumed.
    claimed: Option<u64>,
    /// Checkpoints whose HA pointer write got no answer: maybe recorded, so a later leader
    /// may restore them. Protected like retained ones, never a restore point here (a restore
    /// commits), and dropped by the next completion after them.
    uncertain: BTreeMap<u64, D>,
    /// Snapshots the user owns (a stop-with-savepoint's savepoint): retained and restorable
    /// like the others while they are the newest, never deleted once pushed out.
    users: BTreeSet<u64>,
}

/// What completing a checkpoint removes, decided before any of it runs.
#[derive(Debug, PartialEq)]
pub(crate) struct RetentionPlan<D> {
    /// Checkpoints pushed out of retention, to delete (the claimed snapshot is not among them).
    pub(crate) checkpoints: Vec<(u64, D)>,
    /// The claimed snapshot, pushed out of retention: to dispose as a snapshot of its own.
    pub(crate) claimed: Option<(u64, D)>,
    /// Shared files released by an earlier completion and not named again: to delete.
    pub(crate) shared_files: Vec<String>,
}

impl<D> RetentionPlan<D> {
    fn empty() -> RetentionPlan<D> {
        RetentionPlan { checkpoints: Vec::new(), claimed: None, shared_files: Vec::new() }
    }
}

impl<D> Retention<D> {
    /// Keeps the newest `num_retained` (at least one) completed checkpoints.
    pub(crate) fn new(num_retained: u32) -> Retention<D> {
        Retention {
            num_retained: num_retained.max(1) as usize,
            retained: VecDeque::new(),
            shared_refs: BTreeMap::new(),
            released: BTreeMap::new(),
            claimed: None,
            uncertain: BTreeMap::new(),
            users: BTreeSet::new(),
        }
    }

    /// The ids completing checkpoint `id` pushes out of retention (the oldest beyond
    /// `num_retained`, `id` itself when it is older than all of those kept, and the user's
    /// snapshots older than it, which are no restart point any more). A user's snapshot
    /// completing pushes nothing out: it does not count towards `num_retained`, so the job's
    /// checkpoints stay beside a stop's savepoint.
    pub(crate) fn drops_if_completed(&self, id: u64) -> Vec<u64> {
        if self.users.contains(&id) {
            return Vec::new();
        }
        let mut ids: Vec<u64> =
            self.retained.iter().map(|(retained, _)| *retained).filter(|r| !self.users.contains(r)).collect();
        let at = ids.partition_point(|retained| *retained < id);
        ids.insert(at, id);
        let drop = ids.len().saturating_sub(self.num_retained);
        ids.truncate(drop);
        ids.extend(self.users.range(..id).filter(|user| self.retained.iter().any(|(r, _)| r == *user)));
        ids.extend(self.uncertain.range(..id).map(|(uncertain, _)| *uncertain));
        ids
    }

    /// Checkpoint `id` completed, naming `uses` of the shared files: it is retained, and the
    /// plan says what goes ([`Retention::drops_if_completed`] and the shared files released
    /// before this completion that it does not name again).
    pub(crate) fn complete(&mut self, id: u64, dir: D, uses: BTreeSet<String>) -> RetentionPlan<D> {
        let dropped = self.drops_if_completed(id);
        let at = self.retained.partition_point(|(retained, _)| *retained < id);
        self.retained.insert(at, (id, dir));
        self.shared_refs.insert(id, uses);
        let mut plan = RetentionPlan::empty();
        if self.users.contains(&id) {
            // A user's snapshot moves nothing: what was released waits for a checkpoint.
            return plan;
        }
        for old in dropped {
            let entry = match self.uncertain.remove(&old) {
                Some(dir) => (old, dir),
                None => {
                    let Some(at) = self.retained.iter().position(|(retained, _)| *retained == old) else { continue };
                    let Some(entry) = self.retained.remove(at) else { continue };
                    entry
                }
            };
            if self.claimed == Some(old) {
                self.claimed = None;
                plan.claimed = Some(entry);
            } else if !self.users.remove(&old) {
                plan.checkpoints.push(entry);
            }
            for name in self.shared_refs.remove(&old).unwrap_or_default() {
                self.released.entry(name).or_insert(id);
            }
        }
        let live = self.live_files();
        self.released.retain(|name, _| !live.contains(name));
        plan.shared_files =
            self.released.iter().filter(|(_, released_at)| **released_at < id).map(|(name, _)| name.clone()).collect();
        for name in &plan.shared_files {
            self.released.remove(name);
        }
        plan
    }

    /// A planned shared-file deletion failed: the file stays released, tried again later.
    pub(crate) fn delete_failed(&mut self, name: String, released_at: u64) {
        self.released.entry(name).or_insert(released_at);
    }

    /// Takes over a checkpoint completed before (a previous leader's, or a claimed snapshot
    /// when `claimed`), naming `uses` (`None`: unknown, so it protects nothing it may name
    /// and the caller must not sweep).
    pub(crate) fn adopt(&mut self, id: u64, dir: D, uses: Option<BTreeSet<String>>, claimed: bool) {
        let at = self.retained.partition_point(|(retained, _)| *retained < id);
        self.retained.insert(at, (id, dir));
        if let Some(uses) = uses {
            self.shared_refs.insert(id, uses);
        }
        if claimed {
            self.claimed = Some(id);
        }
    }

    /// Checkpoint `id` may or may not be recorded as complete (its HA pointer write got no
    /// answer): it protects the files it names until a later completion drops it.
    pub(crate) fn keep_uncertain(&mut self, id: u64, dir: D, uses: BTreeSet<String>) {
        self.uncertain.insert(id, dir);
        self.shared_refs.insert(id, uses);
    }

    /// Snapshot `id` is the user's: pushed out of retention, it is forgotten, not deleted.
    pub(crate) fn leave_to_user(&mut self, id: u64) {
        self.users.insert(id);
    }

    /// Snapshot `id` failed before it was retained: nothing of it is the user's to keep.
    pub(crate) fn forget_user(&mut self, id: u64) {
        self.users.remove(&id);
    }

    /// Whether snapshot `id` is the user's.
    pub(crate) fn is_users(&self, id: u64) -> bool {
        self.users.contains(&id)
    }

    /// Whether a pointer write of a checkpoint got no answer and no completion settled it.
    pub(crate) fn has_uncertain(&self) -> bool {
        !self.uncertain.is_empty()
    }

    /// Whether a new checkpoint `id` may name shared file `name`: its own, one a retained
    /// checkpoint names, or one released and not yet deleted.
    pub(crate) fn may_name(&self, id: u64, name: &str, own: impl Fn(&str) -> Option<u64>) -> bool {
        own(name) == Some(id)
            || self.released.contains_key(name)
            || self.shared_refs.values().any(|refs| refs.contains(name))
    }

    /// Every shared file a retained checkpoint names.
    pub(crate) fn live_files(&self) -> BTreeSet<String> {
        self.shared_refs.values().flatten().cloned().collect()
    }

    /// No checkpoint will complete any more: every released file not named again goes.
    pub(crate) fn release_all(&mut self) -> Vec<String> {
        let live = self.live_files();
        std::mem::take(&mut self.released).into_keys().filter(|name| !live.contains(name)).collect()
    }

    /// The retained checkpoints, oldest first.
    pub(crate) fn retained(&self) -> impl Iterator<Item = &(u64, D)> {
        self.retained.iter()
    }

    /// The newest retained checkpoint.
    pub(crate) fn newest(&self) -> Option<&(u64, D)> {
        self.retained.back()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn files(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_oldest_beyond_num_retained_go_and_a_late_older_completion_goes_at_once() {
        let mut retention = Retention::<()>::new(2);
        assert_eq!(retention.complete(1, (), files(&[])), RetentionPlan::empty());
        assert!(retention.complete(2, (), files(&[])).checkpoints.is_empty());
        assert_eq!(retention.drops_if_completed(3), vec![1]);
        assert_eq!(retention.complete(3, (), files(&[])).checkpoints, vec![(1, ())]);
        // Checkpoint 2 already retained, 3 newer: a late completion of an id older than
        // both (a savepoint's id, say) is pushed out at once.
        assert_eq!(retention.drops_if_completed(0), vec![0]);
        assert_eq!(retention.newest(), Some(&(3, ())));
    }

    #[test]
    fn a_released_file_waits_one_completion_and_is_taken_back_when_named_again() {
        let mut retention = Retention::<()>::new(1);
        retention.complete(1, (), files(&["1-a", "1-b"]));
        // 2 drops 1: its files are released by 2, not deleted yet.
        let plan = retention.complete(2, (), files(&["1-a", "2-c"]));
        assert_eq!(plan.checkpoints, vec![(1, ())]);
        assert!(plan.shared_files.is_empty());
        assert!(retention.may_name(3, "1-b", |_| None), "released, not yet deleted");
        // 3 names 1-b again (built on 1): taken back; 2-c released by 3.
        let plan = retention.complete(3, (), files(&["1-a", "1-b"]));
        assert!(plan.shared_files.is_empty(), "{plan:?}");
        // 4 names nothing: 1-a and 1-b released by 4; 2-c (released by 3) goes.
        let plan = retention.complete(4, (), files(&[]));
        assert_eq!(plan.shared_files, vec!["2-c".to_string()]);
        assert_eq!(retention.release_all(), vec!["1-a".to_string(), "1-b".to_string()]);
    }

    #[test]
    fn a_claimed_snapshot_is_disposed_not_deleted_and_a_failed_delete_is_retried() {
        let mut retention = Retention::<&str>::new(1);
        retention.adopt(7, "claimed", Some(files(&["7-x"])), true);
        let plan = retention.complete(8, "chk-8", files(&[]));
        assert_eq!(plan.claimed, Some((7, "claimed")));
        assert!(plan.checkpoints.is_empty());
        let plan = retention.complete(9, "chk-9", files(&[]));
        assert_eq!(plan.shared_files, vec!["7-x".to_string()]);
        retention.delete_failed("7-x".into(), 8);
        assert_eq!(retention.complete(10, "chk-10", files(&[])).shared_files, vec!["7-x".to_string()]);
    }

    #[test]
    fn a_users_savepoint_is_the_newest_while_it_is_and_never_deleted() {
        let mut retention = Retention::<&str>::new(1);
        retention.complete(4, "chk-4", files(&[]));
        retention.leave_to_user(5);
        // A stop's savepoint pushes no checkpoint out: the job's newest stays beside it.
        assert!(retention.drops_if_completed(5).is_empty());
        let plan = retention.complete(5, "stop-5", files(&[]));
        assert!(plan.checkpoints.is_empty());
        assert_eq!(retention.newest(), Some(&(5, "stop-5")));
        // The job failed while stopping, restarted from it, and checkpoints again: the
        // savepoint is forgotten, not deleted, and the older checkpoint goes as usual.
        assert_eq!(retention.drops_if_completed(6), vec![4, 5]);
        let plan = retention.complete(6, "chk-6", files(&[]));
        assert_eq!(plan.checkpoints, vec![(4, "chk-4")]);
        assert!(plan.claimed.is_none());
        assert!(!retention.is_users(5));
        assert_eq!(retention.newest(), Some(&(6, "chk-6")));
    }

    /// One completion: its id and what it names (`(true, n)`: a new file of its own, else
    /// the n-th file it may name).
    type Completion = (u64, Vec<(bool, u8)>);

    /// `num_retained` and a run of completions, in any order.
    fn completions() -> impl Strategy<Value = (u32, Vec<Completion>)> {
        (
            1u32..4,
            proptest::collection::vec((1u64..40, proptest::collection::vec((any::<bool>(), 0u8..6), 0..5)), 1..30),
        )
    }

    proptest! {
        #[test]
        fn a_plan_never_deletes_what_a_retained_checkpoint_or_the_previous_completion_names(
            (num_retained, steps) in completions()
        ) {
            let mut retention = Retention::<()>::new(num_retained);
            let mut completed = BTreeSet::new();
            let mut deleted_checkpoints = BTreeSet::new();
            let mut deleted_files = BTreeSet::new();
            let mut previous_live = BTreeSet::new();
            for (id, picks) in steps {
                if !completed.insert(id) {
                    continue;
                }
                // A checkpoint names its own new files and, built on what it heard of, files
                // it may name (a retained one's or a released one's).
                let available: Vec<String> = retention
                    .live_files()
                    .into_iter()
                    .chain(retention.released.keys().cloned())
                    .collect();
                let uses: BTreeSet<String> = picks
                    .iter()
                    .filter_map(|(own, pick)| {
                        if *own {
                            Some(format!("{id}-{pick}"))
                        } else {
                            available.get(*pick as usize % available.len().max(1)).cloned()
                        }
                    })
                    .collect();
                for name in &uses {
                    prop_assert!(retention.may_name(id, name, |n| n.split('-').next()?.parse().ok()));
                    prop_assert!(!deleted_files.contains(name), "{name} named after its deletion");
                }
                let expected_drops = retention.drops_if_completed(id);
                let plan = retention.complete(id, (), uses);
                let dropped: Vec<u64> = plan.checkpoints.iter().map(|(id, _)| *id).collect();
                prop_assert_eq!(&dropped, &expected_drops, "the plan drops what the HA pointer write was told");
                let live = retention.live_files();
                for name in &plan.shared_files {
                    prop_assert!(!live.contains(name), "{name} deleted while a retained checkpoint names it");
                    prop_assert!(!previous_live.contains(name), "{name} deleted one completion after its release");
                    deleted_files.insert(name.clone());
                }
                deleted_checkpoints.extend(dropped);
                let retained: Vec<u64> = retention.retained.iter().map(|(id, _)| *id).collect();
                prop_assert!(retained.len() <= num_retained as usize);
                prop_assert!(retained.windows(2).all(|w| w[0] < w[1]));
                let kept: Vec<u64> = completed.iter().rev().take(num_retained as usize).rev().copied().collect();
                prop_assert_eq!(&retained, &kept, "the newest completed ids are the ones kept");
                prop_assert!(retained.iter().all(|id| !deleted_checkpoints.contains(id)));
                previous_live = live;
            }
        }
    }
}
