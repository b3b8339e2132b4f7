//! The checkpoint coordinator of a JobManager: the [`CheckpointBook`] (the state machine of
//! the job's checkpoints) driven over object storage and the HA store. It owns no thread: the
//! job master calls it and carries out what it returns (send barriers, notify subtasks, fail
//! the job). All decisions are the book's; this module is I/O only ([`StorageIo`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir_api::snapshot::Barrier;
use weir_checkpoint::format::{SnapshotMetadata, encode_metadata};
use weir_checkpoint::paths::{
    METADATA_FILE, SHARED_DIR, checkpoint_dir, job_checkpoints_dir, new_savepoint_dir_name, shared_file_checkpoint,
};
use weir_checkpoint::storage::{BlockingStorage, SnapshotStorage};

pub use super::book::{
    AdoptedCheckpoint, BookEvent, BookJob, CheckpointBook, Completion, Failure, Now, OperatorInfo, PointerError,
    SnapshotRequest,
};
use super::driver::{CheckpointIo, Outcomes, drive};
use super::ended::EndedCheckpoints;
use super::settings::CheckpointSettings;
use super::stats::CheckpointStats;
use super::writer::SubtaskAck;
use crate::control_clock::ControlClock;

pub use super::settings::STATE_BACKEND;

/// True when a native snapshot of backend `written_by` restores into `backend`: the same
/// backend, or `hashmap` and `spillable`, whose native key groups are the same bytes (a
/// spilled key group is stored in exactly that encoding).
pub fn native_compatible(written_by: &str, backend: &str) -> bool {
    fn family(name: &str) -> &str {
        if name == "spillable" { "hashmap" } else { name }
    }
    family(written_by) == family(backend)
}

/// Checkpoints of one job.
pub struct CheckpointCoordinator {
    book: CheckpointBook,
    io: StorageIo,
    job_id: String,
    /// Checkpoints subsumed by the last completion, for the job master to abort.
    subsumed: Vec<Failure>,
    /// The lock on the job's local checkpoint directory while the job runs (without high
    /// availability): see [`weir_checkpoint::leftovers`].
    job_dir_lock: Option<weir_checkpoint::JobDirLock>,
    /// The job master's clock: checkpoint schedules and timeouts follow it.
    clock: ControlClock,
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
        clock: ControlClock,
    ) -> Result<CheckpointCoordinator, String> {
        let checkpoints_root = SnapshotStorage::from_url(&settings.checkpoints_url)
            .map_err(|e| format!("state.checkpoints.dir '{}' cannot be used: {e}", settings.checkpoints_url))?;
        let shared_dir = Arc::new(checkpoints_root.child(&job_checkpoints_dir(job_id)).child(SHARED_DIR).blocking());
        let job = BookJob {
            job_id: job_id.to_string(),
            job_name: job_name.to_string(),
            max_parallelism,
            operators,
            expected_acks,
        };
        let book = CheckpointBook::new(settings, job, first_id, false, stats, clock.now());
        let io = StorageIo {
            checkpoints_root,
            shared_dir,
            ended: EndedCheckpoints::new(),
            open: HashMap::new(),
            retired: None,
            prepared: None,
            ha: None,
        };
        Ok(CheckpointCoordinator {
            book,
            io,
            job_id: job_id.to_string(),
            subsumed: Vec::new(),
            job_dir_lock: None,
            clock,
        })
    }

    /// Locks the job's checkpoint directory for as long as the job runs, and removes what
    /// jobs that died left under `state.checkpoints.dir` (incomplete checkpoints, shared files
    /// no complete checkpoint names): "clean up on the next start". For jobs without high
    /// availability, on local file systems; a failure to do either is a warning, never the
    /// job's failure.
    pub fn guard_job_dir(&mut self) {
        let job_dir = self.io.checkpoints_root.child(&job_checkpoints_dir(&self.job_id));
        match weir_checkpoint::JobDirLock::acquire(&job_dir) {
            Ok(lock) => self.job_dir_lock = lock,
            Err(error) => tracing::warn!(%error, "cannot lock the job's checkpoint directory"),
        }
        let root = self.io.checkpoints_root.clone();
        let own = job_checkpoints_dir(&self.job_id);
        match self.io.shared_dir.block_on(weir_checkpoint::sweep_dead_jobs(&root, &own)) {
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
        SnapshotStorage::from_url(location)
            .map_err(|e| format!("the claimed snapshot '{location}' cannot be used: {e}"))?;
        self.handle(BookEvent::Claim { id: checkpoint_id, location: location.to_string() });
        Ok(())
    }

    /// Records checkpoint ids and completed checkpoints in `store` (high availability): an id
    /// is taken only once the HA counter is past it, and a checkpoint is complete only once
    /// its pointer is in the store.
    pub fn with_ha(mut self, store: weir_ha::JobStore) -> CheckpointCoordinator {
        self.io.ha = Some(store);
        self.book.set_ha(true);
        self
    }

    /// Takes over completed checkpoints a previous leader recorded, oldest first.
    ///
    /// Then the files of the job's `shared/` directory that none of them uses, written by
    /// checkpoints the previous leader started, are deleted: a leader that died between
    /// writing and completing, or between completing and deleting, left them.
    pub fn adopt_retained(&mut self, checkpoints: &[(u64, String)]) -> Result<(), String> {
        let mut adopted = Vec::with_capacity(checkpoints.len());
        for (id, location) in checkpoints {
            let storage = SnapshotStorage::from_url(location)
                .map_err(|e| format!("checkpoint {id} at '{location}' cannot be used: {e}"))?;
            let storage = storage.blocking();
            let (uses, savepoint) = match storage.block_on(weir_checkpoint::load_metadata(&storage.storage)) {
                Ok(metadata) => {
                    let savepoint = metadata.kind == weir_checkpoint::format::SnapshotKind::Savepoint;
                    (Some(weir_checkpoint::shared_files_of(&metadata)), savepoint)
                }
                Err(error) => {
                    tracing::warn!(checkpoint = id, %error, "cannot read a recovered checkpoint's metadata");
                    // Only what lies in the job's own checkpoint directory may be deleted.
                    (
                        None,
                        !location.starts_with(self.io.checkpoints_root.child(&job_checkpoints_dir(&self.job_id)).url()),
                    )
                }
            };
            // A stop-with-savepoint's savepoint is recorded like a checkpoint (it is the
            // job's restart point until the job ends), and stays the user's.
            adopted.push(AdoptedCheckpoint { id: *id, location: location.clone(), uses, savepoint });
        }
        self.handle(BookEvent::Adopt { checkpoints: adopted });
        Ok(())
    }

    /// The checkpoints that ended, which this job's subtasks no longer write snapshots of.
    pub fn ended(&self) -> Arc<EndedCheckpoints> {
        Arc::clone(&self.io.ended)
    }

    /// The settings.
    pub fn settings(&self) -> &CheckpointSettings {
        self.book.settings()
    }

    /// True when a periodic checkpoint should be triggered now.
    pub fn periodic_due(&self, now: Instant) -> bool {
        self.book.periodic_due(now)
    }

    /// True when fewer periodic checkpoints are in flight than `max-concurrent-checkpoints`
    /// allows (the final checkpoint is bound by it too; savepoints are not, as in Flink).
    pub fn periodic_slot_free(&self) -> bool {
        self.book.periodic_slot_free()
    }

    /// When the coordinator next needs the master's attention (a trigger or a timeout).
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.book.next_wakeup()
    }

    /// Starts a checkpoint a user asked for; `full` (Flink's `checkpointType: FULL`) has
    /// every subtask write each key group whole, whatever an earlier checkpoint holds.
    pub fn trigger_requested(&mut self, full: bool) -> Result<Barrier, String> {
        self.start(SnapshotRequest::Periodic, None, full)
    }

    /// Starts a checkpoint or savepoint; returns the barrier the sources must emit.
    ///
    /// `savepoint_root` is the savepoint target directory for savepoints.
    pub fn trigger(&mut self, request: SnapshotRequest, savepoint_root: Option<&str>) -> Result<Barrier, String> {
        self.start(request, savepoint_root, false)
    }

    fn start(&mut self, request: SnapshotRequest, savepoint_root: Option<&str>, full: bool) -> Result<Barrier, String> {
        let dir = self.target_dir(&request, savepoint_root)?;
        let location = dir.url().to_string();
        self.io.prepared = Some((location.clone(), dir));
        let mut outcomes = self.handle(BookEvent::Trigger { request, location, full });
        self.io.prepared = None;
        match outcomes.triggered.pop() {
            Some(barrier) => Ok(barrier),
            None => Err(outcomes.trigger_failures.pop().unwrap_or_else(|| "no checkpoint was started".into())),
        }
    }

    /// Where the next snapshot of `request` goes: the trigger carries it to the book.
    fn target_dir(&self, request: &SnapshotRequest, savepoint_root: Option<&str>) -> Result<SnapshotStorage, String> {
        match request {
            SnapshotRequest::Periodic => {
                Ok(self.io.checkpoints_root.child(&checkpoint_dir(&self.job_id, self.book.next_id())))
            }
            SnapshotRequest::Savepoint { .. } => {
                let root = savepoint_root.ok_or_else(|| {
                    "no savepoint directory: give one (weir savepoint JOBID DIR, --savepoint-path) or set state.savepoints.dir"
                        .to_string()
                })?;
                let root = SnapshotStorage::from_url(root).map_err(|e| format!("savepoint directory '{root}': {e}"))?;
                Ok(root.child(&new_savepoint_dir_name(&self.job_id)))
            }
        }
    }

    /// Records a subtask's acknowledgement; completes the checkpoint when it was the last.
    ///
    /// A periodic checkpoint that completes subsumes the periodic checkpoints older than it
    /// still in flight (Flink's `CHECKPOINT_SUBSUMED`): they are aborted, not counted as
    /// failures, and returned by [`CheckpointCoordinator::take_subsumed`].
    pub fn acknowledge(&mut self, ack: SubtaskAck) -> Option<Result<Completion, Failure>> {
        let id = ack.checkpoint_id;
        let mut outcomes = self.handle(BookEvent::Ack(ack));
        self.result_of(id, &mut outcomes)
    }

    /// The result for checkpoint `id` among `outcomes`; the checkpoints its completion
    /// subsumed are kept for [`CheckpointCoordinator::take_subsumed`].
    fn result_of(&mut self, id: u64, outcomes: &mut Outcomes) -> Option<Result<Completion, Failure>> {
        let (own, subsumed): (Vec<Failure>, Vec<Failure>) =
            outcomes.failed.drain(..).partition(|failure| failure.checkpoint_id == id);
        self.subsumed.extend(subsumed);
        if let Some(completion) = outcomes.completed.pop() {
            return Some(Ok(completion));
        }
        own.into_iter().next().map(Err)
    }

    /// The checkpoints the last completion subsumed (see [`CheckpointCoordinator::acknowledge`]).
    pub fn take_subsumed(&mut self) -> Vec<Failure> {
        std::mem::take(&mut self.subsumed)
    }

    /// A subtask could not snapshot or write: the checkpoint fails.
    pub fn decline(&mut self, checkpoint_id: u64, reason: String) -> Option<Failure> {
        let mut outcomes = self.handle(BookEvent::Decline { checkpoint_id, reason });
        outcomes.failed.pop()
    }

    /// Fails every checkpoint older than the timeout.
    pub fn expire(&mut self, now: Instant) -> Vec<Failure> {
        let now = Now { at: now, wall_ms: weir_types::lifecycle::now_ms() };
        drive(&mut self.book, &mut self.io, BookEvent::Tick, now).failed
    }

    /// Fails every pending checkpoint (the job is ending or a subtask finished).
    pub fn abort_all(&mut self, reason: &str) -> Vec<Failure> {
        self.handle(BookEvent::AbortAll { reason: reason.to_string() }).failed
    }

    /// The id the next checkpoint or savepoint takes.
    pub fn next_checkpoint_id(&self) -> u64 {
        self.book.next_id()
    }

    /// The location of the newest retained checkpoint (retained ones are kept in id order).
    pub fn latest_retained(&self) -> Option<(u64, String)> {
        self.book.latest_retained()
    }

    /// What a restart restores ([`CheckpointBook::restart_point`]): with HA, the store is
    /// asked while a pointer write of this leader is unsettled.
    pub fn restart_point(&self) -> Result<Option<(u64, String)>, String> {
        self.book.restart_point(|| match &self.io.ha {
            Some(ha) => ha.newest_checkpoint().map_err(|e| {
                format!("a checkpoint's HA pointer write got no answer, and the HA store cannot say which checkpoint is the newest: {e}")
            }),
            None => Ok(self.book.latest_retained()),
        })
    }

    /// The job takes no more checkpoints (its final checkpoint or stop-with-savepoint
    /// completed, it ended, or this JobManager lost its leadership): no checkpoint can build
    /// on a released shared file any more, so they go now rather than at a completion that
    /// will not come. (A new leader's checkpoints name only files its adopted checkpoints
    /// use.)
    pub fn release_shared(&mut self) {
        self.handle(BookEvent::ReleaseShared);
    }

    fn handle(&mut self, event: BookEvent) -> Outcomes {
        let now = Now { at: self.clock.now(), wall_ms: weir_types::lifecycle::now_ms() };
        drive(&mut self.book, &mut self.io, event, now)
    }

    /// Ids of the checkpoints in flight (the job master's tests print them).
    #[cfg(test)]
    pub(crate) fn pending_ids(&self) -> Vec<u64> {
        self.book.pending_ids()
    }

    #[cfg(test)]
    fn stats(&self) -> std::sync::MutexGuard<'_, CheckpointStats> {
        self.book.stats()
    }
}

impl Drop for CheckpointCoordinator {
    fn drop(&mut self) {
        self.release_shared();
    }
}

/// A JobManager's checkpoint I/O: object storage for snapshots, the HA store for ids and
/// pointers, the ended checkpoints subtasks no longer write. Crash points for the
/// kill tests sit at its effect boundaries.
struct StorageIo {
    checkpoints_root: SnapshotStorage,
    /// The job's `shared/` directory.
    shared_dir: Arc<BlockingStorage>,
    ended: Arc<EndedCheckpoints>,
    /// Directories of the checkpoints in flight.
    open: HashMap<u64, Arc<BlockingStorage>>,
    /// The last one retired (a failed checkpoint's deletion follows its retirement).
    retired: Option<(u64, Arc<BlockingStorage>)>,
    /// The storage of the location a trigger carries, opened by the caller.
    prepared: Option<(String, SnapshotStorage)>,
    /// With high availability: where checkpoint ids and completed-checkpoint pointers go.
    ha: Option<weir_ha::JobStore>,
}

impl StorageIo {
    fn storage_of(&mut self, id: u64, location: &str) -> Option<Arc<BlockingStorage>> {
        if let Some(dir) = self.open.get(&id) {
            return Some(Arc::clone(dir));
        }
        if let Some((retired, dir)) = &self.retired
            && *retired == id
        {
            return Some(Arc::clone(dir));
        }
        match SnapshotStorage::from_url(location) {
            Ok(storage) => Some(Arc::new(storage.blocking())),
            Err(error) => {
                tracing::warn!(checkpoint = id, %location, %error, "cannot open a checkpoint's directory");
                None
            }
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
}

impl CheckpointIo for StorageIo {
    fn reserve_id(&mut self, next: u64) -> Result<(), String> {
        match &self.ha {
            Some(ha) => ha.set_next_checkpoint_id(next).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn open_dir(&mut self, id: u64, location: &str) {
        let storage = match self.prepared.take() {
            Some((prepared, storage)) if prepared == location => Arc::new(storage.blocking()),
            _ => match self.storage_of(id, location) {
                Some(storage) => storage,
                None => return,
            },
        };
        self.open.insert(id, storage);
    }

    fn retire_dir(&mut self, id: u64) {
        self.ended.end(id);
        if let Some(dir) = self.open.remove(&id) {
            self.retired = Some((id, dir));
        }
    }

    fn write_metadata(&mut self, id: u64, location: &str, metadata: &SnapshotMetadata) -> Result<(), String> {
        let dir = self.storage_of(id, location).ok_or_else(|| format!("cannot open '{location}'"))?;
        crate::crash::point("checkpoint-before-metadata");
        dir.put(METADATA_FILE, encode_metadata(metadata)).map_err(|e| e.to_string())?;
        crate::crash::point("checkpoint-after-metadata");
        Ok(())
    }

    fn record_pointer(&mut self, id: u64, location: &str, subsumed: &[u64]) -> Result<(), PointerError> {
        let Some(ha) = &self.ha else { return Ok(()) };
        match ha.add_checkpoint(id, location, subsumed) {
            Ok(()) => {
                crate::crash::point("checkpoint-after-pointer");
                Ok(())
            }
            Err(error @ weir_ha::HaError::LostLeadership) => Err(PointerError::LostLeadership(error.to_string())),
            Err(error) => Err(PointerError::Unknown(error.to_string())),
        }
    }

    fn delete_failed(&mut self, id: u64, location: &str, shared: bool) {
        if let Some(dir) = self.storage_of(id, location)
            && let Err(e) = dir.delete_all()
        {
            tracing::warn!(checkpoint = id, error = %e, "cannot delete the files of a failed checkpoint");
        }
        if shared {
            self.delete_shared_where(|name| shared_file_checkpoint(name) == Some(id));
        }
    }

    fn delete_checkpoint(&mut self, id: u64, location: &str) {
        crate::crash::point("checkpoint-before-subsumed-delete");
        if let Some(dir) = self.storage_of(id, location)
            && let Err(e) = dir.delete_all()
        {
            tracing::warn!(checkpoint = id, error = %e, "cannot delete an old checkpoint; delete it by hand");
        }
    }

    fn dispose_claimed(&mut self, id: u64, location: &str) {
        let Some(dir) = self.storage_of(id, location) else { return };
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

    fn delete_shared(&mut self, name: &str) -> Result<(), String> {
        crate::crash::point("checkpoint-before-shared-delete");
        self.shared_dir.delete(name).map_err(|e| e.to_string())
    }

    fn sweep_shared(&mut self, keep: &BTreeSet<String>, below: u64) {
        let deleted = self.delete_shared_where(|name| {
            shared_file_checkpoint(name).is_some_and(|id| id < below) && !keep.contains(name)
        });
        if deleted > 0 {
            tracing::info!(files = deleted, "deleted shared checkpoint files no checkpoint uses");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpointing::writer::AckedOperator;
    use std::time::Duration;
    use weir_api::snapshot::BarrierKind;
    use weir_checkpoint::format::{FORMAT_VERSION, OperatorSnapshot, SnapshotKind, SubtaskSnapshot};

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
        CheckpointCoordinator::new(
            settings,
            "0123456789abcdef0123456789abcdef",
            "test",
            128,
            operators,
            2,
            1,
            stats,
            ControlClock::system(),
        )
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
                snapshot: SubtaskSnapshot::empty(subtask),
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
        // (That retention keeps the newest by id whatever order completions come in is
        // retention.rs's test.)
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
        let mut coordinator =
            CheckpointCoordinator::new(settings, job, "test", 128, operators, 1, 5, stats, ControlClock::system())
                .unwrap();
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
