//! Simulated subtasks: each reads its own input (records `0..n`) and writes it through a
//! transactional sink, staging a transaction at every barrier and committing the staged ones
//! when it hears a checkpoint completed (Flink's two-phase commit). With incremental
//! checkpoints its state names the shared files of the newest completion it heard of, as the
//! real backends do, and is written whole again every few checkpoints.

use std::collections::{BTreeMap, BTreeSet};

use weir_api::snapshot::{Barrier, BarrierKind};
use weir_checkpoint::format::SubtaskSnapshot;

use super::io::shared_dir_of;
use super::world::{External, Object, SimRng, SimStorage, TaskState, Txn};
use crate::checkpointing::writer::{AckedOperator, SubtaskAck};

pub struct Task {
    pub job: u32,
    pub subtask: u32,
    pub attempt: u64,
    /// The leader (epoch, JobManager) this attempt follows.
    pub epoch: u64,
    pub leader: usize,
    pub offset: u64,
    pub txn_start: u64,
    pub pending: Vec<Txn>,
    /// The shared files of the newest completion it heard of (its incremental base).
    pub base: Vec<String>,
    /// The shared files each checkpoint it acknowledged names.
    pub staged: BTreeMap<u64, Vec<String>>,
    /// Its input ended.
    pub ended: bool,
    /// It committed the final checkpoint and ended.
    pub finished: bool,
    /// It snapshotted the stop-with-savepoint of this id and reads nothing more unless that
    /// savepoint fails.
    pub stopping: Option<u64>,
    /// Checkpoints it heard completed or aborted: a late barrier of one is not snapshotted
    /// (the runtime's `EndedCheckpoints`).
    pub ended_checkpoints: BTreeSet<u64>,
}

impl Task {
    /// A new attempt from `state` (nothing: a fresh start).
    pub fn restored(
        job: u32,
        subtask: u32,
        attempt: u64,
        leader: (u64, usize),
        state: Option<TaskState>,
        n: u64,
    ) -> Task {
        let offset = state.map_or(0, |s| s.offset);
        let (epoch, leader) = leader;
        Task {
            job,
            subtask,
            attempt,
            epoch,
            leader,
            offset,
            txn_start: offset,
            pending: Vec::new(),
            base: Vec::new(),
            staged: BTreeMap::new(),
            ended: offset >= n,
            finished: false,
            stopping: None,
            ended_checkpoints: BTreeSet::new(),
        }
    }

    /// Reads and writes up to five records.
    pub fn work(&mut self, rng: &mut SimRng, n: u64) {
        if self.ended || self.stopping.is_some() {
            return;
        }
        self.offset = (self.offset + 1 + rng.below(5)).min(n);
        self.ended = self.offset >= n;
    }

    /// Snapshots at `barrier`: stages the open transaction, writes its state into `location`
    /// (a savepoint, or a checkpoint without incremental state) or a new shared file, and
    /// returns the acknowledgement.
    pub fn snapshot(
        &mut self,
        barrier: &Barrier,
        location: &str,
        incremental: bool,
        rng: &mut SimRng,
        storage: &mut SimStorage,
    ) -> SubtaskAck {
        let id = barrier.checkpoint_id;
        self.pending.push(Txn { job: self.job, checkpoint: id, from: self.txn_start, to: self.offset });
        self.txn_start = self.offset;
        let state = TaskState { offset: self.offset, pending: self.pending.clone() };
        let mut snapshot = SubtaskSnapshot::empty(self.subtask);
        if incremental && matches!(barrier.kind, BarrierKind::Checkpoint { .. }) {
            // Written whole again every few checkpoints, so old files are released.
            let mut names = if self.base.len() >= 3 || rng.one_in(3) { Vec::new() } else { self.base.clone() };
            let own = format!("chk-{id}-task-{}-{}", self.subtask, self.attempt);
            storage.put(format!("{}/{own}", shared_dir_of(location)), Object::State(state));
            names.push(own);
            self.staged.insert(id, names.clone());
            snapshot.shared_files = names;
        } else {
            let file = format!("task-{}", self.subtask);
            storage.put(format!("{location}/{file}"), Object::State(state));
            snapshot.file = Some(file);
        }
        if matches!(barrier.kind, BarrierKind::Savepoint { terminate: true, .. }) {
            self.stopping = Some(id);
        }
        let operator = AckedOperator { uid: "sink".into(), key_type: None, snapshot, bytes: 1, full_bytes: 1 };
        SubtaskAck {
            checkpoint_id: id,
            vertex: 0,
            subtask: self.subtask,
            operators: vec![operator],
            finished: self.ended,
            timings: Default::default(),
        }
    }

    /// Checkpoint `id` was aborted: a stop at it is off, reading goes on.
    pub fn aborted(&mut self, id: u64) {
        self.ended_checkpoints.insert(id);
        if self.stopping == Some(id) {
            self.stopping = None;
        }
    }

    /// Checkpoint `id` completed: commits every transaction staged up to it.
    /// A stop-with-savepoint at `id` ends the subtask once committed.
    pub fn complete(&mut self, id: u64, external: &mut External) -> Result<(), String> {
        self.ended_checkpoints.insert(id);
        let (commit, keep): (Vec<Txn>, Vec<Txn>) = self.pending.drain(..).partition(|txn| txn.checkpoint <= id);
        self.pending = keep;
        for txn in commit {
            external.commit(self.subtask, txn)?;
        }
        if let Some(names) = self.staged.remove(&id) {
            self.base = names;
        }
        self.staged.retain(|staged, _| *staged > id);
        if self.stopping == Some(id) {
            self.finished = true;
        }
        Ok(())
    }

    /// The job's final checkpoint committed: a subtask whose input ended ends.
    pub fn finish(&mut self) {
        if self.ended {
            self.finished = true;
        }
    }
}
