//! The records of a played job and what its sink committed, as the random-subtask test
//! models them. A region's sources number their records 1, 2, 3, ... from where their
//! attempt restored; its sink is two-phase: what came since the last barrier is the open
//! transaction, pre-committed when the barrier passes, and committed (with every older one)
//! when that checkpoint's completion reaches it. A restore commits what its snapshot had
//! pre-committed (commits are idempotent), as weir's and Flink's sinks do. Exactly once means
//! the committed records are 1..=n, each once.

use std::collections::{BTreeMap, BTreeSet};

/// A barrier an attempt's sources took.
#[derive(Clone, Copy, Debug)]
pub(super) struct TakenBarrier {
    pub(super) id: u64,
    /// Every source's input had ended before it.
    pub(super) after_end: bool,
    /// A savepoint's (a stop's too), not a checkpoint's.
    pub(super) savepoint: bool,
}

/// What one attempt of the region holds.
#[derive(Default)]
struct AttemptRecords {
    /// The last record its sources emitted.
    position: u64,
    /// Emitted since the last barrier: the sink's open transaction.
    staged: Vec<u64>,
    /// Transactions pre-committed at a barrier and not committed yet, by checkpoint id.
    pre_committed: BTreeMap<u64, Vec<u64>>,
    /// The barriers its sources took, in order.
    barriers: Vec<TakenBarrier>,
    /// The stop-with-savepoint barrier its sources took and stopped at, until aborted.
    stop: Option<u64>,
}

/// What a barrier's snapshot holds of the attempt that took it.
struct Snapshot {
    attempt: usize,
    position: u64,
    pre_committed: BTreeMap<u64, Vec<u64>>,
}

/// One pipelined region's records across its attempts, and its sink's commits.
#[derive(Default)]
pub(super) struct Lineage {
    attempts: BTreeMap<usize, AttemptRecords>,
    snapshots: BTreeMap<u64, Snapshot>,
    /// (attempt, checkpoint) of every committed transaction.
    committed_transactions: BTreeSet<(usize, u64)>,
    committed: BTreeSet<u64>,
}

impl Lineage {
    /// Attempt `attempt` starts from checkpoint `restored` (`None`: from the first record);
    /// the restore commits what that snapshot pre-committed.
    pub(super) fn start(&mut self, attempt: usize, restored: Option<u64>) -> Result<(), String> {
        let mut records = AttemptRecords::default();
        if let Some(id) = restored {
            let Some(snapshot) = self.snapshots.get(&id) else {
                return Err(format!("attempt {attempt} restores checkpoint {id}, which no attempt of its region took"));
            };
            records.position = snapshot.position;
            let (taker, pending) = (snapshot.attempt, snapshot.pre_committed.clone());
            for (checkpoint, transaction) in pending {
                self.commit_transaction(taker, checkpoint, transaction)?;
            }
        }
        self.attempts.insert(attempt, records);
        Ok(())
    }

    /// The last record `attempt` emitted.
    pub(super) fn position(&self, attempt: usize) -> u64 {
        self.attempts.get(&attempt).map_or(0, |a| a.position)
    }

    /// The barriers `attempt`'s sources took, in order.
    pub(super) fn barriers(&self, attempt: usize) -> &[TakenBarrier] {
        self.attempts.get(&attempt).map_or(&[], |a| &a.barriers)
    }

    /// `attempt`'s sources emit the next record.
    pub(super) fn emit(&mut self, attempt: usize) {
        if let Some(records) = self.attempts.get_mut(&attempt) {
            records.position += 1;
            let position = records.position;
            records.staged.push(position);
        }
    }

    /// `barrier` passes `attempt`'s sources (once; both source subtasks receive it); a
    /// stop's barrier stops them.
    pub(super) fn barrier(&mut self, attempt: usize, barrier: TakenBarrier, stop: bool) {
        let Some(records) = self.attempts.get_mut(&attempt) else { return };
        let id = barrier.id;
        // Sources stopping at a stop's barrier take no further checkpoints (they drop them).
        if records.stop.is_some() || records.barriers.iter().any(|taken| taken.id == id) {
            return;
        }
        records.barriers.push(barrier);
        if stop {
            records.stop = Some(id);
        }
        let transaction = std::mem::take(&mut records.staged);
        records.pre_committed.insert(id, transaction);
        let snapshot = Snapshot { attempt, position: records.position, pre_committed: records.pre_committed.clone() };
        self.snapshots.insert(id, snapshot);
    }

    /// The stop barrier `attempt`'s sources stopped at, if any.
    pub(super) fn stopping(&self, attempt: usize) -> Option<u64> {
        self.attempts.get(&attempt).and_then(|a| a.stop)
    }

    /// Checkpoint `id` was aborted: a stop at it resumes.
    pub(super) fn abort(&mut self, attempt: usize, id: u64) {
        if let Some(records) = self.attempts.get_mut(&attempt).filter(|a| a.stop == Some(id)) {
            records.stop = None;
        }
    }

    /// Checkpoint `id`'s completion reaches `attempt`'s sink: it commits every transaction
    /// pre-committed up to it.
    pub(super) fn complete(&mut self, attempt: usize, id: u64) -> Result<(), String> {
        let Some(records) = self.attempts.get_mut(&attempt) else { return Ok(()) };
        let later = records.pre_committed.split_off(&(id + 1));
        let due = std::mem::replace(&mut records.pre_committed, later);
        for (checkpoint, transaction) in due {
            self.commit_transaction(attempt, checkpoint, transaction)?;
        }
        Ok(())
    }

    fn commit_transaction(&mut self, attempt: usize, checkpoint: u64, transaction: Vec<u64>) -> Result<(), String> {
        if !self.committed_transactions.insert((attempt, checkpoint)) {
            return Ok(());
        }
        for record in transaction {
            if !self.committed.insert(record) {
                return Err(format!(
                    "record {record} committed twice (again by attempt {attempt}'s transaction of checkpoint {checkpoint})"
                ));
            }
        }
        Ok(())
    }

    /// The committed records are 1..=n: none lost before the newest.
    pub(super) fn check(&self) -> Result<(), String> {
        match self.committed.iter().enumerate().find(|(i, record)| **record != *i as u64 + 1) {
            Some((i, _)) => Err(format!("record {} is missing from the committed output", i + 1)),
            None => Ok(()),
        }
    }

    /// How many records are committed.
    pub(super) fn committed(&self) -> usize {
        self.committed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{Lineage, TakenBarrier};

    fn checkpoint(id: u64) -> TakenBarrier {
        TakenBarrier { id, after_end: false, savepoint: false }
    }

    #[test]
    fn a_restore_commits_its_snapshot_and_replays_what_came_after_it() {
        let mut lineage = Lineage::default();
        lineage.start(0, None).unwrap();
        lineage.emit(0);
        lineage.emit(0);
        lineage.barrier(0, checkpoint(1), false);
        lineage.emit(0);
        // Attempt 0 fails before checkpoint 1's completion reached its sink.
        lineage.start(1, Some(1)).unwrap();
        assert_eq!(lineage.committed(), 2);
        assert_eq!(lineage.position(1), 2);
        lineage.emit(1);
        lineage.barrier(1, checkpoint(2), false);
        lineage.complete(1, 2).unwrap();
        lineage.check().unwrap();
        assert_eq!(lineage.committed(), 3);
    }

    #[test]
    fn restoring_an_older_checkpoint_than_one_committed_is_a_duplicate() {
        let mut lineage = Lineage::default();
        lineage.start(0, None).unwrap();
        lineage.emit(0);
        lineage.barrier(0, checkpoint(1), false);
        lineage.emit(0);
        lineage.barrier(0, checkpoint(2), false);
        lineage.complete(0, 2).unwrap();
        lineage.start(1, Some(1)).unwrap();
        lineage.emit(1);
        lineage.barrier(1, checkpoint(3), false);
        let duplicate = lineage.complete(1, 3).unwrap_err();
        assert!(duplicate.contains("record 2 committed twice"), "{duplicate}");
    }
}
