//! The checkpoint book: the state machine of one job's checkpoints and savepoints. It takes
//! events (a trigger that carries its target location, acknowledgements, declines, the
//! answers of the I/O it asked for, clock ticks) and returns [`Effect`]s; it does no I/O and
//! reads no clock. [`super::driver`] carries the effects out, behind [`super::driver::CheckpointIo`]
//! a test replaces (the deterministic simulation in `crate::simulation`).
//!
//! A checkpoint moves `Collecting` -> `WritingMetadata` -> (with HA, periodic only)
//! `RecordingPointer` -> completed, or to failed from any of them. It is complete, and may be
//! committed, only once its `_metadata` is written and, with high availability, its pointer
//! is in the HA store. Whatever a completion removes is one [`DeletePlan`], decided before
//! the first deletion.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use weir_api::snapshot::{Barrier, BarrierKind};
use weir_checkpoint::format::{FORMAT_VERSION, OperatorSnapshot, SnapshotKind, SnapshotMetadata, SubtaskSnapshot};
use weir_checkpoint::paths::shared_file_checkpoint;

use super::retention::Retention;
use super::settings::CheckpointSettings;
use super::stats::{CheckpointEntry, CheckpointStats, CheckpointStatus, HISTORY_MAX, SubtaskCheckpoint};
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
#[derive(Clone, Debug, PartialEq)]
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

impl SnapshotRequest {
    fn is_periodic(&self) -> bool {
        matches!(self, SnapshotRequest::Periodic)
    }

    /// A stop-with-savepoint: the job ends with it.
    pub fn is_stop(&self) -> bool {
        matches!(self, SnapshotRequest::Savepoint { terminate: true, .. })
    }

    /// Whether its completion is a restart point: a checkpoint, or a stop-with-savepoint,
    /// whose completion commits (so a failure after it must restore it, not an older one;
    /// Flink adds that savepoint to the completed-checkpoint store too).
    fn restores(&self) -> bool {
        self.is_periodic() || self.is_stop()
    }
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

impl Completion {
    /// Whether the subtasks commit what they staged: an intermediate savepoint is no restore
    /// point for failover (a restart restores the newest checkpoint), so it commits nothing;
    /// what its sinks staged is committed by the next checkpoint (Flink since 1.15,
    /// FLINK-25191). A checkpoint commits, and so does a stop-with-savepoint, which ends the job.
    pub fn commits(&self) -> bool {
        match self.request {
            SnapshotRequest::Periodic => true,
            SnapshotRequest::Savepoint { terminate, .. } => terminate,
        }
    }
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

/// The time an event happens at: the monotonic clock for timeouts and pauses, the wall
/// clock for what users see. Given by the driver (a simulated clock in tests).
#[derive(Clone, Copy, Debug)]
pub struct Now {
    /// Monotonic.
    pub at: Instant,
    /// Milliseconds since the epoch.
    pub wall_ms: u64,
}

impl Now {
    /// The real clocks.
    pub fn real() -> Now {
        Now { at: Instant::now(), wall_ms: weir_types::lifecycle::now_ms() }
    }
}

/// Why recording a completed checkpoint's pointer in the HA store failed.
#[derive(Clone, Debug, PartialEq)]
pub enum PointerError {
    /// Another JobManager leads: the write certainly did not happen.
    LostLeadership(String),
    /// No answer, or an error after which the write may have happened after all.
    Unknown(String),
}

/// A checkpoint a previous leader recorded, taken over.
#[derive(Clone, Debug)]
pub struct AdoptedCheckpoint {
    /// Its id.
    pub id: u64,
    /// Its directory.
    pub location: String,
    /// The shared files it names (`None`: its metadata could not be read).
    pub uses: Option<BTreeSet<String>>,
    /// A stop-with-savepoint's savepoint: the user's, never deleted by the job.
    pub savepoint: bool,
}

/// What happens to the book.
#[derive(Clone, Debug)]
pub enum BookEvent {
    /// Start a checkpoint or savepoint with the next id, writing into `location`.
    Trigger {
        /// Why.
        request: SnapshotRequest,
        /// Its directory (computed by the caller for [`CheckpointBook::next_id`]).
        location: String,
        /// Every subtask writes each key group whole (`checkpointType: FULL`).
        full: bool,
    },
    /// The answer to [`Effect::ReserveId`].
    IdReserved {
        /// The checkpoint.
        id: u64,
        /// What the I/O answered.
        result: Result<(), String>,
    },
    /// A subtask's snapshot is written and durable.
    Ack(SubtaskAck),
    /// A subtask could not snapshot or write.
    Decline {
        /// The checkpoint.
        checkpoint_id: u64,
        /// Why.
        reason: String,
    },
    /// The answer to [`Effect::WriteMetadata`].
    MetadataWritten {
        /// The checkpoint.
        id: u64,
        /// What the I/O answered.
        result: Result<(), String>,
    },
    /// The answer to [`Effect::RecordPointer`].
    PointerRecorded {
        /// The checkpoint.
        id: u64,
        /// What the I/O answered.
        result: Result<(), PointerError>,
    },
    /// Time passed: checkpoints past the timeout fail.
    Tick,
    /// Every pending checkpoint fails (the job ends or restarts).
    AbortAll {
        /// Why.
        reason: String,
    },
    /// Checkpoints a previous leader completed, oldest first.
    Adopt {
        /// Their ids, locations and shared files.
        checkpoints: Vec<AdoptedCheckpoint>,
    },
    /// The snapshot the job restored from is its own now (claim mode CLAIM).
    Claim {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        location: String,
    },
    /// The job takes no more checkpoints: released shared files go now.
    ReleaseShared,
    /// A planned shared-file deletion failed: try again at a later completion.
    SharedDeleteFailed {
        /// The file.
        name: String,
        /// The completion that released it.
        released_at: u64,
    },
}

/// What a completion, a release or a takeover removes, classified before any of it runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeletePlan {
    /// Completed checkpoints pushed out of retention: their directories go.
    pub checkpoints: Vec<(u64, String)>,
    /// The claimed snapshot, pushed out of retention: disposed as a snapshot of its own.
    pub claimed: Option<(u64, String)>,
    /// Files of the job's `shared/` directory nothing may name any more.
    pub shared_files: Vec<String>,
    /// The completion that released them (to retry a failed deletion at); `None` when the
    /// job takes no more checkpoints.
    pub released_at: Option<u64>,
}

impl DeletePlan {
    fn is_empty(&self) -> bool {
        self.checkpoints.is_empty() && self.claimed.is_none() && self.shared_files.is_empty()
    }
}

/// What the book asks for. Those marked "answer" need their answer as the next event.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Record `next` as the next free checkpoint id in the HA store (answer: `IdReserved`).
    ReserveId {
        /// The checkpoint.
        id: u64,
        /// The next free id.
        next: u64,
    },
    /// Subtasks of checkpoint `id` write into `location`.
    OpenDir {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        location: String,
    },
    /// Checkpoint `id` ended: a late write of it removes its own file.
    RetireDir {
        /// The checkpoint.
        id: u64,
    },
    /// The sources must emit this barrier.
    Triggered(Barrier),
    /// No checkpoint started.
    TriggerFailed(String),
    /// Write `_metadata` into `location` (answer: `MetadataWritten`).
    WriteMetadata {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        location: String,
        /// The metadata.
        metadata: Box<SnapshotMetadata>,
    },
    /// Record checkpoint `id` as complete in the HA store, dropping `subsumed` in the same
    /// write (answer: `PointerRecorded`).
    RecordPointer {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        location: String,
        /// Checkpoints its completion drops.
        subsumed: Vec<u64>,
    },
    /// Delete a failed checkpoint's directory and the shared files it wrote (`shared`).
    DeleteFailed {
        /// The checkpoint.
        id: u64,
        /// Its directory.
        location: String,
        /// Whether it wrote shared files.
        shared: bool,
    },
    /// Carry out a plan of deletions (answer for each shared file that stays: `SharedDeleteFailed`).
    Delete(DeletePlan),
    /// Delete the shared files a checkpoint before `below` wrote that none of `keep` is.
    SweepShared {
        /// Names no retained checkpoint may lose.
        keep: BTreeSet<String>,
        /// The next checkpoint id.
        below: u64,
    },
    /// Checkpoint or savepoint completed: commit (the job master decides who).
    Completed(Completion),
    /// Checkpoint or savepoint failed or was aborted.
    Failed(Failure),
}

/// Where a pending checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Collecting,
    WritingMetadata,
    RecordingPointer,
}

struct PendingCheckpoint {
    barrier: Barrier,
    request: SnapshotRequest,
    location: String,
    started: Instant,
    acks: HashMap<(usize, u32), SubtaskAck>,
    phase: Phase,
    /// The shared files its acknowledgements name (set once all are in).
    uses: BTreeSet<String>,
}

/// A trigger waiting for its id to be reserved.
struct Reserving {
    id: u64,
    request: SnapshotRequest,
    location: String,
    full: bool,
}

/// The checkpoints of one job: the state machine.
pub struct CheckpointBook {
    settings: CheckpointSettings,
    job_id: String,
    job_name: String,
    max_parallelism: u32,
    operators: Vec<OperatorInfo>,
    expected_acks: usize,
    /// With high availability: ids are reserved and completions recorded in the HA store.
    ha: bool,
    next_id: u64,
    reserving: Option<Reserving>,
    pending: BTreeMap<u64, PendingCheckpoint>,
    retention: Retention<String>,
    next_periodic_at: Instant,
    consecutive_failures: u32,
    stats: Arc<Mutex<CheckpointStats>>,
}

/// The job a book keeps the checkpoints of.
pub struct BookJob {
    /// Job id.
    pub job_id: String,
    /// Job name.
    pub job_name: String,
    /// Max parallelism (key groups).
    pub max_parallelism: u32,
    /// Its operators.
    pub operators: Vec<OperatorInfo>,
    /// Subtask acknowledgements a snapshot needs.
    pub expected_acks: usize,
}

impl CheckpointBook {
    /// A book whose checkpoint ids continue after `first_id - 1`; the first periodic
    /// checkpoint is due one interval after `now`.
    pub fn new(
        settings: CheckpointSettings,
        job: BookJob,
        first_id: u64,
        ha: bool,
        stats: Arc<Mutex<CheckpointStats>>,
        now: Instant,
    ) -> CheckpointBook {
        let retention = Retention::new(settings.num_retained);
        let next_periodic_at = now + settings.interval.unwrap_or(Duration::MAX / 4);
        CheckpointBook {
            settings,
            job_id: job.job_id,
            job_name: job.job_name,
            max_parallelism: job.max_parallelism,
            operators: job.operators,
            expected_acks: job.expected_acks,
            ha,
            next_id: first_id.max(1),
            reserving: None,
            pending: BTreeMap::new(),
            retention,
            next_periodic_at,
            consecutive_failures: 0,
            stats,
        }
    }

    /// Ids are reserved and completions recorded in an HA store (`ha`), or not.
    pub fn set_ha(&mut self, ha: bool) {
        self.ha = ha;
    }

    /// The settings.
    pub fn settings(&self) -> &CheckpointSettings {
        &self.settings
    }

    /// The id the next checkpoint or savepoint takes.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The newest retained checkpoint (retained ones are kept in id order).
    pub fn latest_retained(&self) -> Option<(u64, String)> {
        self.retention.newest().cloned()
    }

    /// What a restart restores: the newest retained checkpoint, or, while a pointer write got
    /// no answer, the newest one the HA store holds (`store_newest`): the store may hold a
    /// newer checkpoint than this book retains, and a restart from an older one would start a
    /// second lineage next to it (the simulation's seed 2720: both lineages committed).
    pub fn restart_point<E>(
        &self,
        store_newest: impl FnOnce() -> Result<Option<(u64, String)>, E>,
    ) -> Result<Option<(u64, String)>, E> {
        if self.retention.has_uncertain() { store_newest() } else { Ok(self.latest_retained()) }
    }

    /// The stop-with-savepoint the job restarts from, if its newest restart point is one (it
    /// completed, and the job has not taken a checkpoint since).
    pub fn stopped_with(&self) -> Option<(u64, String)> {
        self.latest_retained().filter(|(id, _)| self.retention.is_users(*id))
    }

    /// Every retained checkpoint, oldest first: what a user or a restart may restore.
    pub fn retained(&self) -> Vec<(u64, String)> {
        self.retention.retained().cloned().collect()
    }

    /// True when a periodic checkpoint should be triggered at `now`.
    pub fn periodic_due(&self, now: Instant) -> bool {
        self.settings.interval.is_some() && now >= self.next_periodic_at && self.periodic_slot_free()
    }

    /// True when fewer periodic checkpoints are in flight than `max-concurrent-checkpoints`
    /// allows (the final checkpoint is bound by it too; savepoints are not, as in Flink) and
    /// no stop-with-savepoint is.
    pub fn periodic_slot_free(&self) -> bool {
        // None while a stop-with-savepoint is in flight, as Flink stops its checkpoint
        // scheduler for one: sources stopped at its barrier drop every later trigger, so a
        // checkpoint triggered meanwhile could only expire, a counted failure, if the stop
        // fails and the job runs on.
        if self.pending.values().any(|p| p.request.is_stop()) {
            return false;
        }
        let in_flight = self.pending.values().filter(|p| p.request.is_periodic()).count() as u32;
        in_flight < self.settings.max_concurrent
    }

    /// When the book next needs attention (a trigger or a timeout). A periodic checkpoint
    /// due while every periodic slot is taken waits for an event (a completion or failure
    /// frees the slot), not for the clock: a wakeup in the past would have the job master
    /// spin until the checkpoint in flight ends.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let mut wakeup = self.settings.interval.filter(|_| self.periodic_slot_free()).map(|_| self.next_periodic_at);
        for pending in self.pending.values() {
            let expiry = pending.started + self.settings.timeout;
            wakeup = Some(wakeup.map_or(expiry, |w| w.min(expiry)));
        }
        wakeup
    }

    /// Ids of the checkpoints in flight.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Every legal move, once: the effects of `event` at `now`.
    pub fn on(&mut self, event: BookEvent, now: Now) -> Vec<Effect> {
        let mut effects = Vec::new();
        match event {
            BookEvent::Trigger { request, location, full } => {
                self.on_trigger(request, location, full, now, &mut effects)
            }
            BookEvent::IdReserved { id, result } => self.on_id_reserved(id, result, now, &mut effects),
            BookEvent::Ack(ack) => self.on_ack(ack, now, &mut effects),
            BookEvent::Decline { checkpoint_id, reason } => {
                if let Some(pending) = self.take_pending(checkpoint_id, &[Phase::Collecting]) {
                    self.fail(pending, reason, FailMode::Counted, now, &mut effects);
                }
            }
            BookEvent::MetadataWritten { id, result } => self.on_metadata_written(id, result, now, &mut effects),
            BookEvent::PointerRecorded { id, result } => self.on_pointer_recorded(id, result, now, &mut effects),
            BookEvent::Tick => self.on_tick(now, &mut effects),
            BookEvent::AbortAll { reason } => {
                for id in self.pending_ids() {
                    if let Some(pending) = self.pending.remove(&id) {
                        self.fail(pending, reason.clone(), FailMode::Tolerated, now, &mut effects);
                    }
                }
            }
            BookEvent::Adopt { checkpoints } => self.on_adopt(checkpoints, &mut effects),
            BookEvent::Claim { id, location } => self.retention.adopt(id, location, None, true),
            BookEvent::ReleaseShared => {
                let shared_files = self.retention.release_all();
                if !shared_files.is_empty() {
                    effects.push(Effect::Delete(DeletePlan { shared_files, ..DeletePlan::default() }));
                }
            }
            BookEvent::SharedDeleteFailed { name, released_at } => self.retention.delete_failed(name, released_at),
        }
        effects
    }

    fn on_trigger(&mut self, request: SnapshotRequest, location: String, full: bool, now: Now, out: &mut Vec<Effect>) {
        let id = self.next_id;
        if self.reserving.is_some() {
            out.push(Effect::TriggerFailed(format!("checkpoint id {id} is being reserved; try again")));
            return;
        }
        if self.ha {
            // The id is used only once no later leader can hand it out again.
            self.reserving = Some(Reserving { id, request, location, full });
            out.push(Effect::ReserveId { id, next: id + 1 });
        } else {
            self.start(Reserving { id, request, location, full }, now, out);
        }
    }

    fn on_id_reserved(&mut self, id: u64, result: Result<(), String>, now: Now, out: &mut Vec<Effect>) {
        let Some(reserving) = self.reserving.take_if(|r| r.id == id) else { return };
        match result {
            Ok(()) => self.start(reserving, now, out),
            Err(e) => out.push(Effect::TriggerFailed(format!("cannot take checkpoint id {id}: {e}"))),
        }
    }

    fn start(&mut self, trigger: Reserving, now: Now, out: &mut Vec<Effect>) {
        let Reserving { id, request, location, full } = trigger;
        self.next_id = id + 1;
        let kind = match &request {
            SnapshotRequest::Periodic => BarrierKind::Checkpoint { full, unaligned: self.settings.unaligned },
            SnapshotRequest::Savepoint { terminate, format, drain, .. } => {
                BarrierKind::Savepoint { terminate: *terminate, format: *format, drain: *drain }
            }
        };
        // The barrier carries where its snapshots go: no subtask looks the directory up.
        let barrier =
            Barrier { checkpoint_id: id, timestamp_ms: now.wall_ms, kind, location: Arc::from(location.as_str()) };
        if request.is_periodic() {
            // The next interval counts from this trigger (Flink), min-pause from a completion.
            self.next_periodic_at = now.at + self.settings.interval.unwrap_or(Duration::MAX / 4);
        }
        self.record_trigger(&barrier, &request);
        out.push(Effect::OpenDir { id, location: location.clone() });
        out.push(Effect::Triggered(barrier.clone()));
        let pending = PendingCheckpoint {
            barrier,
            request,
            location,
            started: now.at,
            acks: HashMap::new(),
            phase: Phase::Collecting,
            uses: BTreeSet::new(),
        };
        self.pending.insert(id, pending);
    }

    fn on_ack(&mut self, ack: SubtaskAck, now: Now, out: &mut Vec<Effect>) {
        let id = ack.checkpoint_id;
        let Some(pending) = self.pending.get_mut(&id).filter(|p| p.phase == Phase::Collecting) else { return };
        let subtask = SubtaskCheckpoint {
            vertex: ack.vertex,
            subtask: ack.subtask,
            ack_timestamp: now.wall_ms,
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
        if acked >= self.expected_acks {
            self.all_acknowledged(id, now, out);
        }
    }

    /// Every subtask acknowledged: write the metadata, unless it names a shared file that
    /// may be gone.
    fn all_acknowledged(&mut self, id: u64, now: Now, out: &mut Vec<Effect>) {
        let Some(mut pending) = self.pending.remove(&id) else { return };
        let metadata = self.metadata(&pending);
        let uses = weir_checkpoint::shared_files_of(&metadata);
        // A subtask builds on the newest completion it heard of, which may be older than the
        // newest one: every file it names must still be there (retained, or released and not
        // yet deleted), or the checkpoint fails and the next one writes what it needs.
        if let Some(gone) = uses.iter().find(|name| !self.retention.may_name(id, name, shared_file_checkpoint)) {
            let reason = format!(
                "checkpoint {id} builds on shared file {gone}, which an older checkpoint released; the next checkpoint writes that state again"
            );
            // Not the job's checkpointing failing: the next one writes what it needs.
            return self.fail(pending, reason, FailMode::NotCounted, now, out);
        }
        pending.uses = uses;
        pending.phase = Phase::WritingMetadata;
        out.push(Effect::WriteMetadata { id, location: pending.location.clone(), metadata: Box::new(metadata) });
        self.pending.insert(id, pending);
    }

    fn on_metadata_written(&mut self, id: u64, result: Result<(), String>, now: Now, out: &mut Vec<Effect>) {
        let Some(mut pending) = self.take_pending(id, &[Phase::WritingMetadata]) else { return };
        if let Err(e) = result {
            let reason = format!("writing {}/_metadata: {e}", pending.location);
            return self.fail(pending, reason, FailMode::Counted, now, out);
        }
        if pending.request.is_stop() {
            // The restart point until the job ends, and the user's to keep.
            self.retention.leave_to_user(id);
        }
        if self.ha && pending.request.restores() {
            // Complete once its pointer is in the HA store, and only then committed: a stop's
            // savepoint too, so that a leader taking over after its sinks committed restores
            // it, not an older checkpoint whose replay they committed already.
            let subsumed = self.retention.drops_if_completed(id);
            out.push(Effect::RecordPointer { id, location: pending.location.clone(), subsumed });
            pending.phase = Phase::RecordingPointer;
            self.pending.insert(id, pending);
        } else {
            self.complete(pending, now, out);
        }
    }

    fn on_pointer_recorded(&mut self, id: u64, result: Result<(), PointerError>, now: Now, out: &mut Vec<Effect>) {
        let Some(pending) = self.take_pending(id, &[Phase::RecordingPointer]) else { return };
        match result {
            Ok(()) => self.complete(pending, now, out),
            Err(PointerError::LostLeadership(message)) => {
                let reason = format!(
                    "cannot record checkpoint {id} as complete in the HA store: {message}; it is not committed"
                );
                self.fail(pending, reason, FailMode::Tolerated, now, out);
            }
            Err(PointerError::Unknown(message)) => {
                // The pointer may be in the store after all, and a later leader may restore
                // it: nothing it names is deleted until a later completion drops it from the
                // store with the others it subsumes. It is no restore point here: a restore
                // commits, and the store may not have it. (Found by the deterministic
                // simulation: seed 466 deleted the shared files of such a checkpoint at the
                // next completion; seed 354 restored it while the store had the one before.)
                let (location, uses) = (pending.location.clone(), pending.uses.clone());
                let reason = format!(
                    "cannot record checkpoint {id} as complete in the HA store: {message}; it is not committed, and its files are kept in case the write happened"
                );
                self.fail(pending, reason, FailMode::KeepFiles, now, out);
                self.retention.keep_uncertain(id, location, uses);
            }
        }
    }

    /// The checkpoint is complete: retained (checkpoints, and a stop's savepoint as the
    /// user's), older periodic ones in flight subsumed, and what its completion pushes out
    /// deleted by one plan.
    fn complete(&mut self, pending: PendingCheckpoint, now: Now, out: &mut Vec<Effect>) {
        let id = pending.barrier.checkpoint_id;
        self.record_completion(&pending, now);
        self.consecutive_failures = 0;
        out.push(Effect::RetireDir { id });
        let (restores, periodic) = (pending.request.restores(), pending.request.is_periodic());
        if periodic {
            self.next_periodic_at = self.next_periodic_at.max(now.at + self.settings.min_pause);
        }
        let completion = Completion { checkpoint_id: id, request: pending.request, location: pending.location };
        if !restores {
            out.push(Effect::Completed(completion));
            return;
        }
        let plan = self.retention.complete(id, completion.location.clone(), pending.uses);
        let plan = DeletePlan {
            checkpoints: plan.checkpoints,
            claimed: plan.claimed,
            shared_files: plan.shared_files,
            released_at: Some(id),
        };
        if !plan.is_empty() {
            out.push(Effect::Delete(plan));
        }
        out.push(Effect::Completed(completion));
        if !periodic {
            return;
        }
        let older: Vec<u64> =
            self.pending.iter().filter(|(o, p)| **o < id && p.request.is_periodic()).map(|(o, _)| *o).collect();
        for older in older {
            if let Some(subsumed) = self.pending.remove(&older) {
                let reason = format!("subsumed by checkpoint {id}, which completed first");
                // Not a failure of the job's checkpointing: a newer one completed.
                self.fail(subsumed, reason, FailMode::Subsumed, now, out);
            }
        }
    }

    fn on_tick(&mut self, now: Now, out: &mut Vec<Effect>) {
        let timeout = self.settings.timeout;
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.phase == Phase::Collecting && now.at.saturating_duration_since(p.started) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(pending) = self.pending.remove(&id) {
                let reason =
                    format!("checkpoint {id} expired before completing (execution.checkpointing.timeout {timeout:?})");
                self.fail(pending, reason, FailMode::Counted, now, out);
            }
        }
    }

    fn on_adopt(&mut self, checkpoints: Vec<AdoptedCheckpoint>, out: &mut Vec<Effect>) {
        let mut sweep = true;
        for adopted in checkpoints {
            // What an unreadable one uses is unknown: delete nothing shared.
            sweep &= adopted.uses.is_some();
            if adopted.savepoint {
                self.retention.leave_to_user(adopted.id);
            }
            self.retention.adopt(adopted.id, adopted.location, adopted.uses, false);
        }
        if sweep {
            // A leader that died between writing and completing, or between completing and
            // deleting, left shared files no retained checkpoint names.
            out.push(Effect::SweepShared { keep: self.retention.live_files(), below: self.next_id });
        }
    }

    fn take_pending(&mut self, id: u64, phases: &[Phase]) -> Option<PendingCheckpoint> {
        let phase = self.pending.get(&id)?.phase;
        if phases.contains(&phase) { self.pending.remove(&id) } else { None }
    }

    fn fail(&mut self, pending: PendingCheckpoint, reason: String, mode: FailMode, now: Now, out: &mut Vec<Effect>) {
        let id = pending.barrier.checkpoint_id;
        // Retired first: a write that lands after the deletion sees it and removes its own file.
        out.push(Effect::RetireDir { id });
        if mode != FailMode::KeepFiles {
            self.retention.forget_user(id);
            // A failed checkpoint's files are useless; completed ones are never touched here.
            let shared = self.settings.incremental.is_some();
            out.push(Effect::DeleteFailed { id, location: pending.location.clone(), shared });
        }
        self.record_failure(id, &reason, now.at.saturating_duration_since(pending.started));
        let mut fail_job = false;
        if pending.request.is_periodic() {
            self.consecutive_failures += 1;
            fail_job = self.consecutive_failures > self.settings.tolerable_failures;
            self.next_periodic_at = self.next_periodic_at.max(now.at + self.settings.min_pause);
        }
        match mode {
            FailMode::Counted => {}
            FailMode::Tolerated | FailMode::KeepFiles => fail_job = false,
            FailMode::NotCounted => {
                fail_job = false;
                self.consecutive_failures = self.consecutive_failures.saturating_sub(1);
            }
            FailMode::Subsumed => {
                fail_job = false;
                self.consecutive_failures = 0;
            }
        }
        out.push(Effect::Failed(Failure { checkpoint_id: id, request: pending.request, reason, fail_job }));
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
        let operators = self.operators.iter().map(|info| {
            let acked = by_uid.remove(info.uid.as_str());
            let key_type = acked.as_ref().and_then(|a| a.0.clone());
            let subtasks = (0..info.parallelism)
                .map(|index| {
                    // Stateless operators send nothing of their own: their task's ack says
                    // whether the subtask had finished.
                    let finished = pending.acks.get(&(info.vertex, index)).is_some_and(|ack| ack.finished);
                    let mut snapshot = acked
                        .as_ref()
                        .and_then(|a| a.1.get(&index).cloned())
                        .unwrap_or_else(|| SubtaskSnapshot::empty(index));
                    snapshot.finished = finished;
                    snapshot
                })
                .collect();
            OperatorSnapshot {
                uid: info.uid.clone(),
                name: info.name.clone(),
                parallelism: info.parallelism,
                key_type,
                subtasks,
            }
        });
        let operators = operators.collect();
        SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind: if pending.request.is_periodic() { SnapshotKind::Checkpoint } else { SnapshotKind::Savepoint },
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
}

/// How a failure counts towards `tolerable-failed-checkpoints`, and whether its files go.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FailMode {
    /// Counted; may fail the job.
    Counted,
    /// Counted, but never fails the job by itself (an abort, the HA store failing).
    Tolerated,
    /// As `Tolerated`, and its files stay: its HA pointer may have been written after all.
    KeepFiles,
    /// Not counted: a released shared file named, the next checkpoint writes it again.
    NotCounted,
    /// A newer checkpoint completed first: the failure count restarts.
    Subsumed,
}

/// The statistics the REST API shows, kept as the book moves.
impl CheckpointBook {
    pub(crate) fn stats(&self) -> MutexGuard<'_, CheckpointStats> {
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update_entry(&self, id: u64, f: impl FnOnce(&mut CheckpointEntry)) {
        if let Some(entry) = self.stats().history.iter_mut().find(|e| e.id == id) {
            f(entry);
        }
    }

    fn record_trigger(&self, barrier: &Barrier, request: &SnapshotRequest) {
        let entry = CheckpointEntry {
            id: barrier.checkpoint_id,
            status: CheckpointStatus::InProgress,
            is_savepoint: !request.is_periodic(),
            is_stop: matches!(request, SnapshotRequest::Savepoint { terminate: true, .. }),
            unaligned: barrier.is_unaligned(),
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
        let mut stats = self.stats();
        stats.in_progress += 1;
        stats.history.push_back(entry);
        while stats.history.len() > HISTORY_MAX {
            stats.history.pop_front();
        }
    }

    fn record_completion(&self, pending: &PendingCheckpoint, now: Now) {
        let mut operator_sizes = BTreeMap::new();
        for operator in pending.acks.values().flat_map(|ack| ack.operators.iter()) {
            *operator_sizes.entry(operator.uid.clone()).or_insert(0) += operator.bytes;
        }
        let duration = now.at.saturating_duration_since(pending.started).as_millis() as u64;
        let location = pending.location.clone();
        self.update_entry(pending.barrier.checkpoint_id, |entry| {
            entry.status = CheckpointStatus::Completed;
            entry.end_to_end_duration = duration;
            entry.external_path = Some(location);
            entry.operator_sizes = operator_sizes;
        });
        let mut stats = self.stats();
        stats.in_progress = stats.in_progress.saturating_sub(1);
        stats.completed += 1;
    }

    fn record_failure(&self, id: u64, reason: &str, took: Duration) {
        let message = reason.to_string();
        self.update_entry(id, |entry| {
            entry.status = CheckpointStatus::Failed;
            entry.end_to_end_duration = took.as_millis() as u64;
            entry.failure_message = Some(message);
        });
        let mut stats = self.stats();
        stats.in_progress = stats.in_progress.saturating_sub(1);
        stats.failed += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> CheckpointBook {
        let settings = CheckpointSettings { num_retained: 1, ..CheckpointSettings::default() };
        let operators = vec![OperatorInfo { uid: "sink".into(), name: "sink".into(), parallelism: 1, vertex: 0 }];
        let job = BookJob {
            job_id: "job".into(),
            job_name: "test".into(),
            max_parallelism: 128,
            operators,
            expected_acks: 1,
        };
        CheckpointBook::new(settings, job, 1, true, Arc::default(), Instant::now())
    }

    fn ack(checkpoint_id: u64) -> SubtaskAck {
        SubtaskAck {
            checkpoint_id,
            vertex: 0,
            subtask: 0,
            operators: Vec::new(),
            finished: false,
            timings: Default::default(),
        }
    }

    /// Triggers the next checkpoint and brings it to its pointer write; the ids it drops.
    fn up_to_pointer(book: &mut CheckpointBook, now: Now) -> (u64, Vec<u64>) {
        let id = book.next_id();
        let location = format!("mem://chk-{id}");
        let effects = book.on(BookEvent::Trigger { request: SnapshotRequest::Periodic, location, full: false }, now);
        assert!(matches!(effects[..], [Effect::ReserveId { next, .. }] if next == id + 1), "{effects:?}");
        let effects = book.on(BookEvent::IdReserved { id, result: Ok(()) }, now);
        assert!(matches!(effects[..], [Effect::OpenDir { .. }, Effect::Triggered(_)]), "{effects:?}");
        let effects = book.on(BookEvent::Ack(ack(id)), now);
        assert!(matches!(effects[..], [Effect::WriteMetadata { .. }]), "{effects:?}");
        let effects = book.on(BookEvent::MetadataWritten { id, result: Ok(()) }, now);
        match &effects[..] {
            [Effect::RecordPointer { subsumed, .. }] => (id, subsumed.clone()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_checkpoint_in_flight_past_the_interval_wakes_the_master_at_its_timeout_not_at_once() {
        let start = Instant::now();
        let mut book = book();
        book.settings.interval = Some(Duration::from_secs(1));
        book.settings.timeout = Duration::from_secs(60);
        book.next_periodic_at = start;
        let now = Now { at: start, wall_ms: 0 };
        let location = "mem://chk-1".to_string();
        book.on(BookEvent::Trigger { request: SnapshotRequest::Periodic, location, full: false }, now);
        book.on(BookEvent::IdReserved { id: 1, result: Ok(()) }, now);
        // Ten seconds on, the next periodic checkpoint is due but the only slot is taken.
        let later = start + Duration::from_secs(10);
        assert!(!book.periodic_due(later));
        assert_eq!(book.next_wakeup(), Some(start + Duration::from_secs(60)), "the timeout, not a time long past");
    }

    #[test]
    fn no_periodic_checkpoint_is_due_while_a_stop_with_savepoint_is_in_flight() {
        let start = Instant::now();
        let mut book = book();
        book.settings.interval = Some(Duration::from_secs(1));
        book.next_periodic_at = start;
        let now = Now { at: start, wall_ms: 0 };
        let format = weir_api::snapshot::SnapshotFormat::Canonical;
        let stop = SnapshotRequest::Savepoint { request_id: "stop".into(), terminate: true, format, drain: false };
        let location = "mem://savepoint-1".to_string();
        book.on(BookEvent::Trigger { request: stop, location, full: false }, now);
        book.on(BookEvent::IdReserved { id: 1, result: Ok(()) }, now);
        let later = Now { at: start + Duration::from_secs(5), wall_ms: 0 };
        assert!(!book.periodic_due(later.at), "sources stopped at the stop's barrier would drop it");
        assert!(!book.periodic_slot_free(), "nor the final checkpoint");
        // The stop fails (a subtask could not write its snapshot): the job runs on, and so do
        // its checkpoints.
        let reason = "disk full".to_string();
        let effects = book.on(BookEvent::Decline { checkpoint_id: 1, reason }, later);
        assert!(effects.iter().any(|e| matches!(e, Effect::Failed(_))), "{effects:?}");
        assert!(book.periodic_due(later.at));
    }

    #[test]
    fn a_pointer_write_without_an_answer_keeps_the_checkpoint_until_a_later_completion_drops_it() {
        let now = Now::real();
        let mut book = book();
        let (first, subsumed) = up_to_pointer(&mut book, now);
        assert!(subsumed.is_empty());
        let effects = book.on(BookEvent::PointerRecorded { id: first, result: Ok(()) }, now);
        assert!(matches!(effects[..], [Effect::RetireDir { .. }, Effect::Completed(_)]), "{effects:?}");

        let (second, subsumed) = up_to_pointer(&mut book, now);
        assert_eq!(subsumed, vec![first]);
        let no_answer = Err(PointerError::Unknown("timeout".into()));
        let effects = book.on(BookEvent::PointerRecorded { id: second, result: no_answer }, now);
        // Failed and not committed, but nothing of it deleted; no restore point here.
        assert!(matches!(effects[..], [Effect::RetireDir { .. }, Effect::Failed(_)]), "{effects:?}");
        assert_eq!(book.latest_retained().map(|(id, _)| id), Some(first));

        let (third, subsumed) = up_to_pointer(&mut book, now);
        assert_eq!(subsumed, vec![first, second], "the next pointer write drops the uncertain one too");
        let effects = book.on(BookEvent::PointerRecorded { id: third, result: Ok(()) }, now);
        let Some(Effect::Delete(plan)) = effects.iter().find(|e| matches!(e, Effect::Delete(_))) else {
            panic!("{effects:?}")
        };
        let deleted: Vec<u64> = plan.checkpoints.iter().map(|(id, _)| *id).collect();
        assert_eq!(deleted, vec![first, second]);
    }

    #[test]
    fn while_a_pointer_write_is_unsettled_a_restart_restores_the_stores_newest() {
        let now = Now::real();
        let mut book = book();
        let (first, _) = up_to_pointer(&mut book, now);
        book.on(BookEvent::PointerRecorded { id: first, result: Ok(()) }, now);
        let store = |newest: u64| move || Ok::<_, ()>(Some((newest, format!("mem://chk-{newest}"))));
        // Settled: the book's own newest; the store is not asked.
        let not_asked = || -> Result<Option<(u64, String)>, ()> { panic!("the store was asked") };
        assert_eq!(book.restart_point(not_asked).map(|p| p.map(|(id, _)| id)), Ok(Some(first)));
        // Unsettled (the write may have applied): the store's newest, whatever the book keeps
        // (the simulation's seed 2720: a restart from the book's own started a second lineage).
        let (second, _) = up_to_pointer(&mut book, now);
        let no_answer = Err(PointerError::Unknown("timeout".into()));
        book.on(BookEvent::PointerRecorded { id: second, result: no_answer }, now);
        assert_eq!(book.restart_point(store(second)).map(|p| p.map(|(id, _)| id)), Ok(Some(second)));
        assert_eq!(book.restart_point(store(first)).map(|p| p.map(|(id, _)| id)), Ok(Some(first)));
        assert_eq!(book.restart_point(|| Err::<Option<(u64, String)>, _>("etcd down")), Err("etcd down"));
    }

    #[test]
    fn a_lost_leadership_fails_the_checkpoint_and_deletes_its_files() {
        let now = Now::real();
        let mut book = book();
        let (id, _) = up_to_pointer(&mut book, now);
        let lost = Err(PointerError::LostLeadership("another leader".into()));
        let effects = book.on(BookEvent::PointerRecorded { id, result: lost }, now);
        assert!(
            matches!(effects[..], [Effect::RetireDir { .. }, Effect::DeleteFailed { .. }, Effect::Failed(ref f)] if !f.fail_job),
            "{effects:?}"
        );
        assert!(book.latest_retained().is_none());
    }
}
