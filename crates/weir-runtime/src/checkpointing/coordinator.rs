//! The checkpoint coordinator: decides when to trigger, collects acknowledgements, completes,
//! retains and aborts checkpoints and savepoints. It owns no thread: the job master calls it
//! and carries out what it returns (send barriers, notify subtasks, fail the job).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_api::snapshot::{Barrier, BarrierKind};
use weir_checkpoint::format::{
    FORMAT_VERSION, OperatorSnapshot, SnapshotKind, SnapshotMetadata, SubtaskSnapshot, encode_metadata,
};
use weir_checkpoint::paths::{
    METADATA_FILE, SHARED_DIR, checkpoint_dir, job_checkpoints_dir, new_savepoint_dir_name, shared_file_checkpoint,
};
use weir_checkpoint::storage::{BlockingStorage, SnapshotStorage};
use weir_types::lifecycle::now_ms;

use super::retention::Retention;
use super::settings::CheckpointSettings;
use super::stats::{CheckpointEntry, CheckpointStats, CheckpointStatus, HISTORY_MAX};
use super::writer::SubtaskAck;

/// One operator of the job as the metadata lists it.
#[derive(Clone, Debug)]
pub struct OperatorInfo {
    /// Uid (given or generated).
    pub uid: String,
    /// Display name.
    pub name: String,
    /// Parallelism.
    pub parallelism: u32,
    /// The job vertex (task) it is chained into.
    pub vertex: usize,
}

/// Why a snapshot is taken.
#[derive(Clone, Debug)]
pub enum SnapshotRequest {
    /// Periodic checkpoint.
    Periodic,
    /// A user's savepoint.
    Savepoint {
        /// REST request id to report to.
        request_id: String,
        /// Stop the job once it completes.
        terminate: bool,
        /// Canonical or native.
        format: weir_api::snapshot::SnapshotFormat,
        /// Fire every event-time window first (`stop --drain`).
        drain: bool,
    },
}

pub use super::dirs::{SnapshotDirectories, SnapshotDirs};

/// The default state backend (`state.backend.type`), recorded in each snapshot: a native
/// snapshot restores only into a backend of the same layout.
pub const STATE_BACKEND: &str = "hashmap";

/// True when a native snapshot of backend `written_by` restores into `backend`: the same
/// backend, or `hashmap` and `spillable`, whose native key groups are the same bytes (a
/// spilled key group is stored in exactly that encoding).
pub fn native_compatible(written_by: &str, backend: &str) -> bool {
    fn family(name: &str) -> &str {
        if name == "spillable" { "hashmap" } else { name }
    }
    family(written_by) == family(backend)
}

struct PendingCheckpoint {
    barrier: Barrier,
    request: SnapshotRequest,
    dir: Arc<BlockingStorage>,
    location: String,
    started: Instant,
    acks: HashMap<(usize, u32), SubtaskAck>,
}

/// A checkpoint or savepoint that completed.
#[derive(Clone, Debug)]
pub struct Completion {
    /// Its id.
    pub checkpoint_id: u64,
    /// Why it was taken.
    pub request: SnapshotRequest,
    /// Where it is.
    pub location: String,
}

/// A checkpoint or savepoint that failed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Its id.
    pub checkpoint_id: u64,
    /// Why it was taken.
    pub request: SnapshotRequest,
    /// Why it failed.
    pub reason: String,
    /// True when the failure exceeds the tolerable failed checkpoints: the job must fail.
    pub fail_job: bool,
}

/// Checkpoints of one job.
pub struct CheckpointCoordinator {
    settings: CheckpointSettings,
    job_id: String,
    job_name: String,
    max_parallelism: u32,
    operators: Vec<OperatorInfo>,
    expected_acks: usize,
    checkpoints_root: SnapshotStorage,
    next_id: u64,
    pending: BTreeMap<u64, PendingCheckpoint>,
    /// The retained checkpoints and the shared files they name: what a completion deletes.
    retention: Retention<Arc<BlockingStorage>>,
    next_periodic_at: Instant,
    consecutive_failures: u32,
    dirs: SnapshotDirs,
    stats: Arc<Mutex<CheckpointStats>>,
    /// Checkpoints subsumed by the last completion, for the job master to abort.
    subsumed: Vec<Failure>,
    /// With high availability: where checkpoint ids and completed-checkpoint pointers go.
    ha: Option<weir_ha::JobStore>,
    /// The job's `shared/` directory.
    shared_dir: Arc<BlockingStorage>,
    /// The lock on the job's local checkpoint directory while the job runs (without high
    /// availability): see [`weir_checkpoint::leftovers`].
    job_dir_lock: Option<weir_checkpoint::JobDirLock>,
}

impl CheckpointCoordinator {
    /// A coordinator for a job of `operators` whose snapshots need `expected_acks` subtask
    /// acknowledgements; checkpoint ids continue after `first_id - 1`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: CheckpointSettings,
        job_id: &str,
        job_name: &str,
        max_parallelism: u32,
        operators: Vec<OperatorInfo>,
        expected_acks: usize,
        first_id: u64,
        stats: Arc<Mutex<CheckpointStats>>,
    ) -> Result<CheckpointCoordinator, String> {
        let checkpoints_root = SnapshotStorage::from_url(&settings.checkpoints_url)
            .map_err(|e| format!("state.checkpoints.dir '{}' cannot be used: {e}", settings.checkpoints_url))?;
        let first_trigger = Instant::now() + settings.interval.unwrap_or(Duration::MAX / 4);
        let shared_dir = Arc::new(checkpoints_root.child(&job_checkpoints_dir(job_id)).child(SHARED_DIR).blocking());
        let retention = Retention::new(settings.num_retained);
        Ok(CheckpointCoordinator {
            settings,
            job_id: job_id.to_string(),
            job_name: job_name.to_string(),
            max_parallelism,
            operators,
            expected_acks,
            checkpoints_root,
            next_id: first_id.max(1),
            pending: BTreeMap::new(),
            retention,
            next_periodic_at: first_trigger,
            consecutive_failures: 0,
            dirs: SnapshotDirectories::new(),
            stats,
            subsumed: Vec::new(),
            ha: None,
            shared_dir,
            job_dir_lock: None,
        })
    }

    /// Locks the job's checkpoint directory for as long as the job runs, and removes what
    /// jobs that died left under `state.checkpoints.dir` (incomplete checkpoints, shared files
    /// no complete checkpoint names): "clean up on the next start". For jobs without high
    /// availability, on local file systems; a failure to do either is a warning, never the
    /// job's failure.
    pub fn guard_job_dir(&mut self) {
        let job_dir = self.checkpoints_root.child(&job_checkpoints_dir(&self.job_id));
        match weir_checkpoint::JobDirLock::acquire(&job_dir) {
            Ok(lock) => self.job_dir_lock = lock,
            Err(error) => tracing::warn!(%error, "cannot lock the job's checkpoint directory"),
        }
        let root = self.checkpoints_root.clone();
        let own = job_checkpoints_dir(&self.job_id);
        match self.shared_dir.block_on(weir_checkpoint::sweep_dead_jobs(&root, &own)) {
            Ok(swept) if !swept.jobs.is_empty() => tracing::info!(
                jobs = ?swept.jobs,
                incomplete_checkpoints = swept.incomplete_checkpoints,
                shared_files = swept.shared_files,
                "removed what jobs that died left in state.checkpoints.dir"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "cannot remove what jobs that died left in state.checkpoints.dir"),
        }
    }

    /// The job's run ended here: its directory holds nothing a later start should remove.
    pub fn release_job_dir(&mut self) {
        if let Some(lock) = self.job_dir_lock.take() {
            lock.release();
        }
    }

    /// Takes over the snapshot the job was restored from (claim mode CLAIM): it is retained
    /// as the oldest completed checkpoint, a restart may restore it, and it is disposed once
    /// `num-retained` checkpoints of the job subsume it.
    pub fn claim(&mut self, checkpoint_id: u64, location: &str) -> Result<(), String> {
        let storage = SnapshotStorage::from_url(location)
            .map_err(|e| format!("the claimed snapshot '{location}' cannot be used: {e}"))?;
        self.retention.adopt(checkpoint_id, Arc::new(storage.blocking()), None, true);
        Ok(())
    }

    /// Records checkpoint ids and completed checkpoints in `store` (high availability): an id
    /// is taken only once the HA counter is past it, and a checkpoint is complete only once
    /// its pointer is in the store.
    pub fn with_ha(mut self, store: weir_ha::JobStore) -> CheckpointCoordinator {
        self.ha = Some(store);
        self
    }

    /// Takes over completed checkpoints a previous leader recorded, oldest first.
    ///
    /// Then the files of the job's `shared/` directory that none of them uses, written by
    /// checkpoints the previous leader started, are deleted: a leader that died between
    /// writing and completing, or between completing and deleting, left them.
    pub fn adopt_retained(&mut self, checkpoints: &[(u64, String)]) -> Result<(), String> {
        let mut sweep = true;
        for (id, location) in checkpoints {
            let storage = SnapshotStorage::from_url(location)
                .map_err(|e| format!("checkpoint {id} at '{location}' cannot be used: {e}"))?;
            let storage = Arc::new(storage.blocking());
            let uses = match storage.block_on(weir_checkpoint::load_metadata(&storage.storage)) {
                Ok(metadata) => Some(weir_checkpoint::shared_files_of(&metadata)),
                Err(error) => {
                    // What it uses is unknown: delete nothing shared.
                    tracing::warn!(checkpoint = id, %error, "cannot read a recovered checkpoint's metadata");
                    sweep = false;
                    None
                }
            };
            self.retention.adopt(*id, storage, uses, false);
        }
        if sweep {
            self.sweep_shared();
        }
        Ok(())
    }

    /// Deletes the shared files that no retained checkpoint uses and that a checkpoint
    /// before the next id wrote.
    fn sweep_shared(&mut self) {
        let live = self.retention.live_files();
        let next_id = self.next_id;
        let deleted = self.delete_shared_where(|name| {
            shared_file_checkpoint(name).is_some_and(|id| id < next_id) && !live.contains(name)
        });
        if deleted > 0 {
            tracing::info!(files = deleted, "deleted shared checkpoint files no checkpoint uses");
        }
    }

    /// Deletes the files of the shared directory whose names `doomed` picks; how many went.
    fn delete_shared_where(&self, doomed: impl Fn(&str) -> bool) -> usize {
        let listed = match self.shared_dir.block_on(self.shared_dir.storage.list_all()) {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "cannot list the shared checkpoint files");
                return 0;
            }
        };
        let mut deleted = 0;
        for (name, _) in listed.iter().filter(|(name, _)| doomed(name)) {
            match self.shared_dir.delete(name) {
                Ok(()) => deleted += 1,
                Err(error) => tracing::warn!(file = %name, %error, "cannot delete a shared checkpoint file"),
            }
        }
        deleted
    }

    /// The directories subtasks write into, by checkpoint id.
    pub fn dirs(&self) -> SnapshotDirs {
        Arc::clone(&self.dirs)
    }

    /// The settings.
    pub fn settings(&self) -> &CheckpointSettings {
        &self.settings
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, CheckpointStats> {
        match self.stats.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// True when a periodic checkpoint should be triggered now.
    pub fn periodic_due(&self, now: Instant) -> bool {
        if self.settings.interval.is_none() || now < self.next_periodic_at {
            return false;
        }
        self.periodic_slot_free()
    }

    /// True when fewer periodic checkpoints are in flight than `max-concurrent-checkpoints`
    /// allows (the final checkpoint is bound by it too; savepoints are not, as in Flink).
    pub fn periodic_slot_free(&self) -> bool {
        let periodic_in_flight =
            self.pending.values().filter(|p| matches!(p.request, SnapshotRequest::Periodic)).count() as u32;
        periodic_in_flight < self.settings.max_concurrent
    }

    /// When the coordinator next needs the master's attention (a trigger or a timeout).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let mut wakeup = self.settings.interval.map(|_| self.next_periodic_at);
        for pending in self.pending.values() {
            let expiry = pending.started + self.settings.timeout;
            wakeup = Some(wakeup.map_or(expiry, |w| w.min(expiry)));
        }
        wakeup
    }

    /// Starts a checkpoint a user asked for; `full` (Flink's `checkpointType: FULL`) has
    /// every subtask write each key group whole, whatever an earlier checkpoint holds.
    pub fn trigger_requested(&mut self, full: bool) -> Result<Barrier, String> {
        let mut barrier = self.trigger(SnapshotRequest::Periodic, None)?;
        barrier.kind = BarrierKind::Checkpoint { full };
        if let Some(pending) = self.pending.get_mut(&barrier.checkpoint_id) {
            pending.barrier.kind = barrier.kind;
        }
        Ok(barrier)
    }

    /// Starts a checkpoint or savepoint; returns the barrier the sources must emit.
    ///
    /// `savepoint_root` is the savepoint target directory for savepoints.
    pub fn trigger(&mut self, request: SnapshotRequest, savepoint_root: Option<&str>) -> Result<Barrier, String> {
        let id = self.next_id;
        let (dir, kind) = match &request {
            SnapshotRequest::Periodic => (
                self.checkpoints_root.child(&checkpoint_dir(&self.job_id, id)),
                BarrierKind::Checkpoint { full: false },
            ),
            SnapshotRequest::Savepoint { terminate, format, drain, .. } => {
                let root = savepoint_root.ok_or_else(|| {
                    "no savepoint directory: give one (weir savepoint JOBID DIR, --savepoint-path) or set state.savepoints.dir"
                        .to_string()
                })?;
                let root = SnapshotStorage::from_url(root).map_err(|e| format!("savepoint directory '{root}': {e}"))?;
                (
                    root.child(&new_savepoint_dir_name(&self.job_id)),
                    BarrierKind::Savepoint { terminate: *terminate, format: *format, drain: *drain },
                )
            }
        };
        if let Some(ha) = &self.ha {
            // The id is used only once no later leader can hand it out again.
            ha.set_next_checkpoint_id(id + 1).map_err(|e| format!("cannot take checkpoint id {id}: {e}"))?;
        }
        self.next_id += 1;
        let barrier = Barrier { checkpoint_id: id, timestamp_ms: now_ms(), kind };
        let location = dir.url().to_string();
        let dir = Arc::new(dir.blocking());
        self.dirs.open(id, Arc::clone(&dir));
        if matches!(request, SnapshotRequest::Periodic) {
            // The next interval counts from this trigger (Flink), min-pause from a completion.
            self.next_periodic_at = Instant::now() + self.settings.interval.unwrap_or(Duration::MAX / 4);
        }
        let entry = CheckpointEntry {
            id,
            status: CheckpointStatus::InProgress,
            is_savepoint: !matches!(request, SnapshotRequest::Periodic),
            is_stop: matches!(request, SnapshotRequest::Savepoint { terminate: true, .. }),
            savepoint_format: match request {
                SnapshotRequest::Periodic => None,
                SnapshotRequest::Savepoint { format, .. } => Some(format.as_str().to_string()),
            },
            trigger_timestamp: barrier.timestamp_ms,
            latest_ack_timestamp: 0,
            end_to_end_duration: 0,
            state_size: 0,
            checkpointed_size: 0,
            num_acknowledged_subtasks: 0,
            num_subtasks: self.expected_acks as u32,
            external_path: None,
            failure_message: None,
            operator_sizes: BTreeMap::new(),
            subtasks: Vec::new(),
        };
        {
            let mut stats = self.stats();
            stats.in_progress += 1;
            stats.history.push_back(entry);
            while stats.history.len() > HISTORY_MAX {
                stats.history.pop_front();
            }
        }
        self.pending.insert(
            id,
            PendingCheckpoint { barrier, request, dir, location, started: Instant::now(), acks: HashMap::new() },
        );
        Ok(barrier)
    }

    fn update_entry(&self, id: u64, f: impl FnOnce(&mut CheckpointEntry)) {
        let mut stats = self.stats();
        if let Some(entry) = stats.history.iter_mut().find(|e| e.id == id) {
            f(entry);
        }
    }

    /// Records a subtask's acknowledgement; completes the checkpoint when it was the last.
    ///
    /// A periodic checkpoint that completes subsumes the periodic checkpoints older than it
    /// still in flight (Flink's `CHECKPOINT_SUBSUMED`): they are aborted, not counted as
    /// failures, and returned by [`CheckpointCoordinator::take_subsumed`].
    pub fn acknowledge(&mut self, ack: SubtaskAck) -> Option<Result<Completion, Failure>> {
        let id = ack.checkpoint_id;
        let pending = self.pending.get_mut(&id)?;
        let subtask = super::stats::SubtaskCheckpoint {
            vertex: ack.vertex,
            subtask: ack.subtask,
            ack_timestamp: now_ms(),
            checkpointed_size: ack.operators.iter().map(|o| o.bytes).sum(),
            state_size: ack.operators.iter().map(|o| o.full_bytes.max(o.bytes)).sum(),
            timings: ack.timings,
        };
        pending.acks.insert((ack.vertex, ack.subtask), ack);
        let acked = pending.acks.len();
        let bytes: u64 = pending.acks.values().flat_map(|a| a.operators.iter()).map(|o| o.bytes).sum();
        let full_bytes: u64 =
            pending.acks.values().flat_map(|a| a.operators.iter()).map(|o| o.full_bytes.max(o.bytes)).sum();
        self.update_entry(id, |entry| {
            entry.num_acknowledged_subtasks = acked as u32;
            entry.latest_ack_timestamp = subtask.ack_timestamp;
            entry.state_size = full_bytes;
            entry.checkpointed_size = bytes;
            entry.subtasks.retain(|s| (s.vertex, s.subtask) != (subtask.vertex, subtask.subtask));
            entry.subtasks.push(subtask);
        });
        if acked < self.expected_acks {
            return None;
        }
        let pending = self.pending.remove(&id)?;
        Some(self.complete(pending))
    }

    fn complete(&mut self, pending: PendingCheckpoint) -> Result<Completion, Failure> {
        let id = pending.barrier.checkpoint_id;
        let metadata = self.metadata(&pending);
        let uses = weir_checkpoint::shared_files_of(&metadata);
        // A subtask builds on the newest completion it heard of, which may be older than the
        // newest one: every file it names must still be there (retained, or released and not
        // yet deleted), or the checkpoint fails and the next one writes what it needs.
        if let Some(gone) = uses.iter().find(|name| !self.retention.may_name(id, name, shared_file_checkpoint)) {
            let reason = format!(
                "checkpoint {id} builds on shared file {gone}, which an older checkpoint released; the next checkpoint writes that state again"
            );
            let mut failure = self.fail(pending, reason);
            failure.fail_job = false;
            self.consecutive_failures = self.consecutive_failures.saturating_sub(1);
            return Err(failure);
        }
        crate::crash::point("checkpoint-before-metadata");
        if let Err(e) = pending.dir.put(METADATA_FILE, encode_metadata(&metadata)) {
            let reason = format!("writing {}/_metadata: {e}", pending.location);
            return Err(self.fail(pending, reason));
        }
        crate::crash::point("checkpoint-after-metadata");
        if let (Some(ha), SnapshotRequest::Periodic) = (&self.ha, &pending.request) {
            // Complete once its pointer is in the HA store, and only then committed.
            let subsumed = self.retention.drops_if_completed(id);
            if let Err(e) = ha.add_checkpoint(id, &pending.location, &subsumed) {
                let reason =
                    format!("cannot record checkpoint {id} as complete in the HA store: {e}; it is not committed");
                let keep_files = !matches!(e, weir_ha::HaError::LostLeadership);
                let mut failure = self.fail_keeping(pending, reason, keep_files);
                failure.fail_job = false;
                return Err(failure);
            }
            crate::crash::point("checkpoint-after-pointer");
        }
        let mut operator_sizes = BTreeMap::new();
        for ack in pending.acks.values() {
            for operator in &ack.operators {
                *operator_sizes.entry(operator.uid.clone()).or_insert(0) += operator.bytes;
            }
        }
        let duration = pending.started.elapsed().as_millis() as u64;
        let location = pending.location.clone();
        self.update_entry(id, |entry| {
            entry.status = CheckpointStatus::Completed;
            entry.end_to_end_duration = duration;
            entry.external_path = Some(location.clone());
            entry.operator_sizes = operator_sizes;
        });
        {
            let mut stats = self.stats();
            stats.in_progress = stats.in_progress.saturating_sub(1);
            stats.completed += 1;
        }
        self.consecutive_failures = 0;
        self.dirs.retire(id);
        if matches!(pending.request, SnapshotRequest::Periodic) {
            self.next_periodic_at = self.next_periodic_at.max(Instant::now() + self.settings.min_pause);
            self.retain(id, Arc::clone(&pending.dir), uses);
            let older: Vec<u64> = self
                .pending
                .iter()
                .filter(|(older, p)| **older < id && matches!(p.request, SnapshotRequest::Periodic))
                .map(|(older, _)| *older)
                .collect();
            for older in older {
                if let Some(subsumed) = self.pending.remove(&older) {
                    let mut failure =
                        self.fail(subsumed, format!("subsumed by checkpoint {id}, which completed first"));
                    // Not a failure of the job's checkpointing: a newer one completed.
                    failure.fail_job = false;
                    self.consecutive_failures = 0;
                    self.subsumed.push(failure);
                }
            }
        }
        Ok(Completion { checkpoint_id: id, request: pending.request, location })
    }

    /// The checkpoints the last completion subsumed (see [`CheckpointCoordinator::acknowledge`]).
    pub fn take_subsumed(&mut self) -> Vec<Failure> {
        std::mem::take(&mut self.subsumed)
    }

    /// Retains checkpoint `id` (it names `uses` of the shared files) and carries out what
    /// its completion pushes out: the newest `num_retained` completed checkpoints are kept
    /// (by id, whatever order they completed in), older ones deleted, the claimed snapshot
    /// disposed; shared files released by an earlier completion and not named again go
    /// ([`Retention`]: the whole plan is decided before the first deletion).
    fn retain(&mut self, id: u64, dir: Arc<BlockingStorage>, uses: BTreeSet<String>) {
        let plan = self.retention.complete(id, dir, uses);
        if let Some((claimed, dir)) = plan.claimed {
            self.dispose_claimed(claimed, &dir);
        }
        for (old_id, old_dir) in plan.checkpoints {
            crate::crash::point("checkpoint-before-subsumed-delete");
            if let Err(e) = old_dir.delete_all() {
                tracing::warn!(checkpoint = old_id, error = %e, "cannot delete an old checkpoint; delete it by hand");
            }
        }
        for name in plan.shared_files {
            crate::crash::point("checkpoint-before-shared-delete");
            if let Err(e) = self.shared_dir.delete(&name) {
                tracing::warn!(file = %name, error = %e, "cannot delete a shared checkpoint file");
                self.retention.delete_failed(name, id);
            }
        }
    }

    /// Disposes a claimed snapshot the job's checkpoints subsumed, and what of its own job's
    /// shared files nothing else uses.
    fn dispose_claimed(&self, id: u64, dir: &BlockingStorage) {
        match dir.block_on(weir_checkpoint::dispose(&dir.storage)) {
            Ok(disposed) => {
                tracing::info!(checkpoint = id, location = %dir.storage.display(), bytes = disposed.bytes, "claimed snapshot disposed");
                // Its job is over (the claim says so): the files of its shared directory that
                // no complete checkpoint there names are garbage (a checkpoint it was writing
                // when it died, say).
                let is_checkpoint = dir.storage.url().rsplit('/').next().is_some_and(|name| name.starts_with("chk-"));
                if is_checkpoint
                    && let Err(error) = dir.block_on(weir_checkpoint::sweep_shared(&dir.storage.parent(), u64::MAX))
                {
                    tracing::warn!(checkpoint = id, %error, "cannot clean the claimed checkpoint's shared directory");
                }
            }
            Err(error) => {
                tracing::warn!(checkpoint = id, %error, "cannot dispose the claimed snapshot; dispose it by hand")
            }
        }
    }

    fn metadata(&self, pending: &PendingCheckpoint) -> SnapshotMetadata {
        let mut by_uid: HashMap<&str, (Option<String>, BTreeMap<u32, SubtaskSnapshot>)> = HashMap::new();
        for ack in pending.acks.values() {
            for operator in &ack.operators {
                let slot = by_uid.entry(operator.uid.as_str()).or_default();
                if operator.key_type.is_some() {
                    slot.0 = operator.key_type.clone();
                }
                slot.1.insert(operator.snapshot.subtask, operator.snapshot.clone());
            }
        }
        let mut operators = Vec::with_capacity(self.operators.len());
        for info in &self.operators {
            let acked = by_uid.remove(info.uid.as_str());
            let mut subtasks = Vec::with_capacity(info.parallelism as usize);
            let key_type = acked.as_ref().and_then(|a| a.0.clone());
            for index in 0..info.parallelism {
                // Stateless operators send nothing of their own: their task's ack says whether
                // the subtask had finished.
                let finished = pending.acks.get(&(info.vertex, index)).is_some_and(|ack| ack.finished);
                let mut snapshot = acked.as_ref().and_then(|a| a.1.get(&index).cloned()).unwrap_or(SubtaskSnapshot {
                    subtask: index,
                    key_group_range: None,
                    file: None,
                    keyed_states: Vec::new(),
                    operator_states: Vec::new(),
                    finished: false,
                    shared_files: Vec::new(),
                });
                snapshot.finished = finished;
                subtasks.push(snapshot);
            }
            operators.push(OperatorSnapshot {
                uid: info.uid.clone(),
                name: info.name.clone(),
                parallelism: info.parallelism,
                key_type,
                subtasks,
            });
        }
        SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind: match pending.request {
                SnapshotRequest::Periodic => SnapshotKind::Checkpoint,
                SnapshotRequest::Savepoint { .. } => SnapshotKind::Savepoint,
            },
            job_id: self.job_id.clone(),
            job_name: self.job_name.clone(),
            checkpoint_id: pending.barrier.checkpoint_id,
            timestamp_ms: pending.barrier.timestamp_ms,
            max_parallelism: self.max_parallelism,
            operators,
            format: pending.barrier.kind.format(),
            state_backend: Some(self.settings.state_backend().to_string()),
        }
    }

    fn fail(&mut self, pending: PendingCheckpoint, reason: String) -> Failure {
        self.fail_keeping(pending, reason, false)
    }

    /// Fails a checkpoint; its files are kept when `keep_files` (its HA pointer may have
    /// been written after all: an etcd answer that never came).
    fn fail_keeping(&mut self, pending: PendingCheckpoint, reason: String, keep_files: bool) -> Failure {
        let id = pending.barrier.checkpoint_id;
        // Retired first: a write that lands after the deletion below sees it and removes its
        // own file (`writer::write_subtask`).
        self.dirs.retire(id);
        // A failed checkpoint's files are useless; completed ones are never touched here.
        if !keep_files && let Err(e) = pending.dir.delete_all() {
            tracing::warn!(checkpoint = id, error = %e, "cannot delete the files of a failed checkpoint");
        }
        if !keep_files && self.settings.incremental.is_some() {
            self.delete_shared_files_of(id);
        }
        let duration = pending.started.elapsed().as_millis() as u64;
        let message = reason.clone();
        self.update_entry(id, |entry| {
            entry.status = CheckpointStatus::Failed;
            entry.end_to_end_duration = duration;
            entry.failure_message = Some(message);
        });
        {
            let mut stats = self.stats();
            stats.in_progress = stats.in_progress.saturating_sub(1);
            stats.failed += 1;
        }
        let mut fail_job = false;
        if matches!(pending.request, SnapshotRequest::Periodic) {
            self.consecutive_failures += 1;
            fail_job = self.consecutive_failures > self.settings.tolerable_failures;
            self.next_periodic_at = self.next_periodic_at.max(Instant::now() + self.settings.min_pause);
        }
        Failure { checkpoint_id: id, request: pending.request, reason, fail_job }
    }

    /// Deletes the shared files checkpoint `id` wrote (it failed: nothing uses them).
    fn delete_shared_files_of(&self, id: u64) {
        self.delete_shared_where(|name| shared_file_checkpoint(name) == Some(id));
    }

    /// A subtask could not snapshot or write: the checkpoint fails.
    pub fn decline(&mut self, checkpoint_id: u64, reason: String) -> Option<Failure> {
        let pending = self.pending.remove(&checkpoint_id)?;
        Some(self.fail(pending, reason))
    }

    /// Fails every checkpoint older than the timeout.
    pub fn expire(&mut self, now: Instant) -> Vec<Failure> {
        let timeout = self.settings.timeout;
        let expired: Vec<u64> =
            self.pending.iter().filter(|(_, p)| now.duration_since(p.started) >= timeout).map(|(id, _)| *id).collect();
        let mut failures = Vec::new();
        for id in expired {
            if let Some(pending) = self.pending.remove(&id) {
                let reason =
                    format!("checkpoint {id} expired before completing (execution.checkpointing.timeout {timeout:?})");
                failures.push(self.fail(pending, reason));
            }
        }
        failures
    }

    /// Fails every pending checkpoint (the job is ending or a subtask finished).
    pub fn abort_all(&mut self, reason: &str) -> Vec<Failure> {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        let mut failures = Vec::new();
        for id in ids {
            if let Some(pending) = self.pending.remove(&id) {
                let mut failure = self.fail(pending, reason.to_string());
                // Aborts because the job ends are not checkpoint failures of the job.
                failure.fail_job = false;
                failures.push(failure);
            }
        }
        failures
    }

    /// The id the next checkpoint or savepoint takes.
    pub fn next_checkpoint_id(&self) -> u64 {
        self.next_id
    }

    /// The location of the newest retained checkpoint (retained ones are kept in id order).
    pub fn latest_retained(&self) -> Option<(u64, String)> {
        self.retention.newest().map(|(id, dir)| (*id, dir.storage.url().to_string()))
    }
}

impl Drop for CheckpointCoordinator {
    fn drop(&mut self) {
        self.release_shared();
    }
}

impl CheckpointCoordinator {
    /// The job takes no more checkpoints (its final checkpoint or stop-with-savepoint
    /// completed, it ended, or this JobManager lost its leadership): no checkpoint can build
    /// on a released shared file any more, so they go now rather than at a completion that
    /// will not come. (A new leader's checkpoints name only files its adopted checkpoints
    /// use.)
    pub fn release_shared(&mut self) {
        for name in self.retention.release_all() {
            if let Err(e) = self.shared_dir.delete(&name) {
                tracing::warn!(file = %name, error = %e, "cannot delete a shared checkpoint file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpointing::writer::AckedOperator;

    fn settings(url: &str) -> CheckpointSettings {
        CheckpointSettings {
            interval: Some(Duration::from_millis(1)),
            checkpoints_url: url.to_string(),
            ..CheckpointSettings::default()
        }
    }

    fn coordinator(settings: CheckpointSettings) -> CheckpointCoordinator {
        let operators = vec![OperatorInfo { uid: "source".into(), name: "source".into(), parallelism: 2, vertex: 0 }];
        let stats = Arc::new(Mutex::new(CheckpointStats::default()));
        CheckpointCoordinator::new(settings, "0123456789abcdef0123456789abcdef", "test", 128, operators, 2, 1, stats)
            .unwrap()
    }

    fn ack(checkpoint_id: u64, subtask: u32) -> SubtaskAck {
        SubtaskAck {
            checkpoint_id,
            vertex: 0,
            subtask,
            operators: vec![AckedOperator {
                uid: "source".into(),
                key_type: None,
                snapshot: SubtaskSnapshot {
                    subtask,
                    key_group_range: None,
                    file: None,
                    keyed_states: Vec::new(),
                    operator_states: Vec::new(),
                    finished: false,
                    shared_files: Vec::new(),
                },
                bytes: 10,
                full_bytes: 10,
            }],
            finished: false,
            timings: Default::default(),
        }
    }

    fn metadata_exists(url: &str, id: u64) -> bool {
        let root = SnapshotStorage::from_url(url).unwrap().blocking();
        root.exists(&format!("{}/{METADATA_FILE}", checkpoint_dir("0123456789abcdef0123456789abcdef", id))).unwrap()
    }

    #[test]
    fn a_checkpoint_completes_when_every_subtask_acknowledged_and_old_ones_are_deleted() {
        let url = "memory://coordinator-complete";
        let mut coordinator = coordinator(settings(url));
        std::thread::sleep(Duration::from_millis(2));
        assert!(coordinator.periodic_due(Instant::now()));
        let barrier = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        assert_eq!(barrier.checkpoint_id, 1);
        // One in flight and max concurrent 1: no second trigger.
        assert!(!coordinator.periodic_due(Instant::now() + Duration::from_secs(1)));
        assert!(coordinator.acknowledge(ack(1, 0)).is_none());
        let completion = coordinator.acknowledge(ack(1, 1)).unwrap().unwrap();
        assert_eq!(completion.checkpoint_id, 1);
        assert!(metadata_exists(url, 1));

        let second = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        coordinator.acknowledge(ack(second.checkpoint_id, 0));
        coordinator.acknowledge(ack(second.checkpoint_id, 1)).unwrap().unwrap();
        // num-retained 1: the first checkpoint is gone, the second kept.
        assert!(!metadata_exists(url, 1));
        assert!(metadata_exists(url, 2));
        let stats = coordinator.stats();
        assert_eq!(stats.completed, 2);
        assert_eq!(stats.history.back().unwrap().operator_sizes.get("source"), Some(&20));
    }

    #[test]
    fn expired_checkpoints_fail_and_fail_the_job_past_the_tolerable_number() {
        let mut settings = settings("memory://coordinator-expire");
        settings.timeout = Duration::from_millis(5);
        settings.tolerable_failures = 1;
        let mut coordinator = coordinator(settings);
        coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        coordinator.acknowledge(ack(1, 0));
        std::thread::sleep(Duration::from_millis(10));
        let failures = coordinator.expire(Instant::now());
        assert_eq!(failures.len(), 1);
        assert!(!failures[0].fail_job, "one failure is tolerated");
        assert!(failures[0].reason.contains("expired"));
        // A late acknowledgement of the expired checkpoint changes nothing.
        assert!(coordinator.acknowledge(ack(1, 1)).is_none());
        coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        let failure = coordinator.decline(2, "disk full".into()).unwrap();
        assert!(failure.fail_job, "the second consecutive failure exceeds the tolerable one");
        assert_eq!(coordinator.stats().failed, 2);
    }

    #[test]
    fn a_completion_resets_the_failure_count_and_min_pause_delays_the_next_trigger() {
        let mut settings = settings("memory://coordinator-pause");
        settings.min_pause = Duration::from_secs(60);
        let mut coordinator = coordinator(settings);
        coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        coordinator.decline(1, "one".into());
        coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        coordinator.acknowledge(ack(2, 0));
        coordinator.acknowledge(ack(2, 1)).unwrap().unwrap();
        assert!(!coordinator.periodic_due(Instant::now() + Duration::from_secs(30)), "min pause of 60 s");
        assert!(coordinator.periodic_due(Instant::now() + Duration::from_secs(61)));
        coordinator.trigger(SnapshotRequest::Periodic, None).unwrap();
        let failure = coordinator.decline(3, "two".into()).unwrap();
        assert!(failure.fail_job, "tolerable 0, but the count restarted after the completion");
    }

    #[test]
    fn a_newer_checkpoint_completing_first_subsumes_older_ones_and_is_the_one_retained() {
        let url = "memory://coordinator-out-of-order";
        let mut settings = settings(url);
        settings.max_concurrent = 2;
        let mut coordinator = coordinator(settings);
        let first = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
        let second = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
        coordinator.acknowledge(ack(first, 0));
        coordinator.acknowledge(ack(second, 0));
        coordinator.acknowledge(ack(second, 1)).unwrap().unwrap();
        let subsumed = coordinator.take_subsumed();
        assert_eq!(subsumed.len(), 1);
        assert_eq!(subsumed[0].checkpoint_id, first);
        assert!(!subsumed[0].fail_job && subsumed[0].reason.contains("subsumed"));
        // The older one's late acknowledgement changes nothing; the newer one stays retained.
        assert!(coordinator.acknowledge(ack(first, 1)).is_none());
        assert!(metadata_exists(url, second));
        assert!(!metadata_exists(url, first));
        assert_eq!(coordinator.latest_retained().unwrap().0, second);
        // Retention keeps the newest by id whatever order completions come in.
        let mut coordinator = coordinator_for_retention("memory://coordinator-retention");
        let dir = |id: u64| Arc::new(SnapshotStorage::from_url(&format!("memory://r/{id}")).unwrap().blocking());
        coordinator.retain(5, dir(5), BTreeSet::new());
        coordinator.retain(3, dir(3), BTreeSet::new());
        assert_eq!(coordinator.latest_retained().unwrap().0, 5);
    }

    fn coordinator_for_retention(url: &str) -> CheckpointCoordinator {
        let mut settings = settings(url);
        settings.num_retained = 1;
        coordinator(settings)
    }

    /// An ack of subtask `subtask` whose blocks are in `files` of the shared directory.
    fn incremental_ack(checkpoint_id: u64, subtask: u32, files: &[&str]) -> SubtaskAck {
        let mut ack = ack(checkpoint_id, subtask);
        let snapshot = &mut ack.operators[0].snapshot;
        snapshot.shared_files = files.iter().map(|f| f.to_string()).collect();
        let block = weir_checkpoint::BlockRef {
            key_group: None,
            offset: 12,
            length: 1,
            crc32: 0,
            entries: 1,
            shared_file: Some(0),
            delta: false,
        };
        let elements = (0..files.len() as u32).map(|i| weir_checkpoint::BlockRef { shared_file: Some(i), ..block });
        snapshot.operator_states = vec![weir_checkpoint::OperatorStateHandle {
            name: "s".into(),
            mode: weir_checkpoint::RedistributionMode::Split,
            elements: elements.collect(),
        }];
        ack
    }

    #[test]
    fn shared_files_go_once_nothing_uses_them_and_a_checkpoint_naming_a_deleted_one_fails() {
        let url = "memory://coordinator-incremental";
        let mut settings = settings(url);
        settings.incremental = Some(10);
        let mut coordinator = coordinator(settings);
        let shared =
            SnapshotStorage::from_url(&format!("{url}/0123456789abcdef0123456789abcdef/shared")).unwrap().blocking();
        for name in ["chk-1-a", "chk-2-b", "chk-3-c", "chk-4-d"] {
            shared.put(name, bytes::Bytes::from_static(b"x")).unwrap();
        }
        let complete = |coordinator: &mut CheckpointCoordinator, files: &[&str]| {
            let id = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
            coordinator.acknowledge(incremental_ack(id, 0, files));
            coordinator.acknowledge(incremental_ack(id, 1, &[])).unwrap()
        };
        complete(&mut coordinator, &["chk-1-a"]).unwrap();
        complete(&mut coordinator, &["chk-1-a", "chk-2-b"]).unwrap();
        // 3 is full: 2 (and with it a and b) is no longer retained, but a subtask that had not
        // heard of 3 may still build on 2, so a and b stay until the next completion.
        complete(&mut coordinator, &["chk-3-c"]).unwrap();
        assert!(shared.exists("chk-1-a").unwrap() && shared.exists("chk-2-b").unwrap());
        // Such a checkpoint, built on 2: b is used again and stays; a goes.
        complete(&mut coordinator, &["chk-2-b", "chk-4-d"]).unwrap();
        assert!(!shared.exists("chk-1-a").unwrap());
        // 3 is released in turn, and waits for the next completion.
        assert!(shared.exists("chk-2-b").unwrap() && shared.exists("chk-3-c").unwrap());
        // One naming a file that is gone fails, without failing the job, and is not retained.
        let failure = complete(&mut coordinator, &["chk-1-a"]).unwrap_err();
        assert!(!failure.fail_job && failure.reason.contains("chk-1-a"), "{}", failure.reason);
        assert_eq!(coordinator.latest_retained().unwrap().0, 4);
        // The job ends: nothing can build on released files any more.
        complete(&mut coordinator, &["chk-6-f"]).unwrap();
        assert!(!shared.exists("chk-3-c").unwrap());
        coordinator.release_shared();
        assert!(!shared.exists("chk-2-b").unwrap() && !shared.exists("chk-4-d").unwrap());
    }

    #[test]
    fn a_new_leader_deletes_the_shared_files_no_adopted_checkpoint_names() {
        let url = "memory://coordinator-adopt-sweep";
        let job = "0123456789abcdef0123456789abcdef";
        let root = SnapshotStorage::from_url(url).unwrap().blocking();
        let ack = incremental_ack(3, 0, &["chk-2-task-0-0.state", "chk-3-task-0-0.state"]);
        let mut subtask = ack.operators[0].snapshot.clone();
        subtask.subtask = 0;
        let metadata = SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind: SnapshotKind::Checkpoint,
            job_id: job.into(),
            job_name: "test".into(),
            checkpoint_id: 3,
            timestamp_ms: 0,
            max_parallelism: 128,
            operators: vec![OperatorSnapshot {
                uid: "source".into(),
                name: "source".into(),
                parallelism: 1,
                key_type: None,
                subtasks: vec![subtask],
            }],
            format: weir_checkpoint::SnapshotFormat::Native,
            state_backend: Some("hashmap".into()),
        };
        root.put(&format!("{job}/chk-3/_metadata"), encode_metadata(&metadata)).unwrap();
        // Named by chk-3: kept. Written by 1 and 4, named by nothing: a dead leader's. Written
        // by 9, past the next id: maybe in flight under the new leader, kept.
        for name in [
            "chk-1-task-0-0.state",
            "chk-2-task-0-0.state",
            "chk-3-task-0-0.state",
            "chk-4-task-0-1.state",
            "chk-9-task-0-0.state",
        ] {
            root.put(&format!("{job}/shared/{name}"), bytes::Bytes::from_static(b"x")).unwrap();
        }
        let mut settings = settings(url);
        settings.incremental = Some(10);
        let operators = vec![OperatorInfo { uid: "source".into(), name: "source".into(), parallelism: 1, vertex: 0 }];
        let stats = Arc::new(Mutex::new(CheckpointStats::default()));
        let mut coordinator = CheckpointCoordinator::new(settings, job, "test", 128, operators, 1, 5, stats).unwrap();
        coordinator.adopt_retained(&[(3, format!("{url}/{job}/chk-3"))]).unwrap();
        let exists = |name: &str| root.exists(&format!("{job}/shared/{name}")).unwrap();
        assert!(exists("chk-2-task-0-0.state") && exists("chk-3-task-0-0.state") && exists("chk-9-task-0-0.state"));
        assert!(!exists("chk-1-task-0-0.state") && !exists("chk-4-task-0-1.state"));
        // Retention after the takeover releases what the adopted checkpoint named.
        let complete = |coordinator: &mut CheckpointCoordinator, files: &[&str]| {
            let id = coordinator.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
            coordinator.acknowledge(incremental_ack(id, 0, files)).unwrap()
        };
        complete(&mut coordinator, &["chk-5-task-0-0.state"]).unwrap();
        complete(&mut coordinator, &["chk-6-task-0-0.state"]).unwrap();
        assert!(!exists("chk-2-task-0-0.state") && !exists("chk-3-task-0-0.state"));
    }

    #[test]
    fn savepoints_need_a_directory_and_are_not_retained() {
        let mut coordinator = coordinator(settings("memory://coordinator-savepoint"));
        let request = SnapshotRequest::Savepoint {
            request_id: "r".into(),
            terminate: false,
            format: weir_api::snapshot::SnapshotFormat::Canonical,
            drain: false,
        };
        let error = coordinator.trigger(request.clone(), None).unwrap_err();
        assert!(error.contains("state.savepoints.dir"), "{error}");
        let barrier = coordinator.trigger(request, Some("memory://coordinator-savepoint-target")).unwrap();
        assert_eq!(
            barrier.kind,
            BarrierKind::Savepoint {
                terminate: false,
                format: weir_api::snapshot::SnapshotFormat::Canonical,
                drain: false,
            }
        );
        coordinator.acknowledge(ack(barrier.checkpoint_id, 0));
        let completion = coordinator.acknowledge(ack(barrier.checkpoint_id, 1)).unwrap().unwrap();
        assert!(completion.location.contains("savepoint-012345-"), "{}", completion.location);
        assert!(coordinator.latest_retained().is_none());
    }

    /// The slot the job master asks for before the final checkpoint (and every periodic one):
    /// taken while `max-concurrent-checkpoints` periodic checkpoints are in flight, not by
    /// savepoints, and free again once one completes or is declined.
    #[test]
    fn the_final_checkpoint_s_slot_follows_max_concurrent_checkpoints() {
        let mut one = coordinator(settings("memory://coordinator-final-slot"));
        assert_eq!(one.settings().max_concurrent, 1, "the default");
        assert!(one.periodic_slot_free());
        let first = one.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
        assert!(!one.periodic_slot_free(), "one periodic checkpoint in flight of at most 1");
        assert!(!one.periodic_due(Instant::now() + Duration::from_secs(60)));
        let savepoint = SnapshotRequest::Savepoint {
            request_id: "r".into(),
            terminate: false,
            format: weir_api::snapshot::SnapshotFormat::Canonical,
            drain: false,
        };
        let savepoint = one.trigger(savepoint, Some("memory://coordinator-final-slot-sp")).unwrap();
        one.acknowledge(ack(first, 0));
        one.acknowledge(ack(first, 1)).unwrap().unwrap();
        assert!(one.periodic_slot_free(), "a savepoint in flight takes no periodic slot");
        one.acknowledge(ack(savepoint.checkpoint_id, 0));
        one.acknowledge(ack(savepoint.checkpoint_id, 1)).unwrap().unwrap();

        let mut settings = settings("memory://coordinator-final-slot-2");
        settings.max_concurrent = 2;
        settings.tolerable_failures = 5;
        let mut two = coordinator(settings);
        let first = two.trigger(SnapshotRequest::Periodic, None).unwrap().checkpoint_id;
        assert!(two.periodic_slot_free(), "one of two");
        two.trigger(SnapshotRequest::Periodic, None).unwrap();
        assert!(!two.periodic_slot_free(), "two of two");
        two.decline(first, "declined".into()).unwrap();
        assert!(two.periodic_slot_free(), "a declined one frees its slot");
    }
}
