//! The asynchronous part of a checkpoint: serializing a subtask's copied state into one data
//! file and writing it to storage while the subtask keeps processing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use weir_api::snapshot::{BarrierKind, OperatorSnapshotData, OperatorStateData, Redistribution, TaskSnapshot};
use weir_checkpoint::format::{
    BlockRef, DataFileWriter, KeyedStateHandle, OperatorStateHandle, RedistributionMode, SubtaskSnapshot,
};
use weir_checkpoint::paths::{data_file_name, shared_data_file_name};

use super::incremental::{IncrementalTracker, KeyGroupBlocks, WrittenCheckpoint};
use weir_checkpoint::storage::{BlockingStorage, StreamingWrite};
use weir_state::TableSnapshot;
use weir_types::KeyGroupRange;

/// Threads serializing and writing snapshots per job.
const WRITER_THREADS: usize = 2;

/// One operator's part of an acknowledged subtask snapshot.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AckedOperator {
    /// The operator's uid.
    pub uid: String,
    /// Its key type, when keyed.
    pub key_type: Option<String>,
    /// What the metadata records for this subtask.
    pub snapshot: SubtaskSnapshot,
    /// Bytes of this operator's blocks written by this checkpoint.
    pub bytes: u64,
    /// Bytes of all its blocks, those an incremental checkpoint reuses included (equal to
    /// `bytes` otherwise; 0 from a weir before incremental checkpoints).
    #[serde(default)]
    pub full_bytes: u64,
}

/// A subtask's snapshot, written.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SubtaskAck {
    /// The checkpoint.
    pub checkpoint_id: u64,
    /// The subtask's vertex.
    pub vertex: usize,
    /// The subtask.
    pub subtask: u32,
    /// One entry per stateful operator of the chain.
    pub operators: Vec<AckedOperator>,
    /// The subtask's end of input had run before the barrier.
    #[serde(default)]
    pub finished: bool,
    /// How long its parts took, the writer's (`async_ms`) included.
    #[serde(default)]
    pub timings: weir_api::snapshot::SnapshotTimings,
}

/// What the writer reports.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum WriteOutcome {
    /// Written and durable.
    Acknowledged(SubtaskAck),
    /// Could not be written.
    Declined {
        /// The checkpoint.
        checkpoint_id: u64,
        /// Why.
        reason: String,
    },
}

/// One write job. Where it writes is the location its barrier carries.
pub struct WriteJob {
    /// The job's (or attempt's) ended checkpoints: a write that lands after its checkpoint
    /// was aborted removes what it wrote.
    pub ended: Arc<super::ended::EndedCheckpoints>,
    /// The subtask's vertex.
    pub vertex: usize,
    /// The subtask.
    pub subtask: u32,
    /// The copied state.
    pub snapshot: TaskSnapshot,
    /// Set for a checkpoint of an incremental job: what it may reuse, and where it records
    /// what it wrote.
    pub incremental: Option<Arc<IncrementalTracker>>,
}

/// A pool of writer threads of one job.
pub struct SnapshotWriter {
    jobs: Sender<WriteJob>,
    threads: Vec<JoinHandle<()>>,
}

impl SnapshotWriter {
    /// Starts the pool; outcomes go to `outcomes`.
    pub fn start<E: From<WriteOutcome> + Send + 'static>(outcomes: Sender<E>) -> std::io::Result<SnapshotWriter> {
        let (jobs, queue) = crossbeam_channel::unbounded::<WriteJob>();
        let mut threads = Vec::with_capacity(WRITER_THREADS);
        for index in 0..WRITER_THREADS {
            let queue: Receiver<WriteJob> = queue.clone();
            let outcomes = outcomes.clone();
            threads.push(std::thread::Builder::new().name(format!("weir-snapshot-writer-{index}")).spawn(
                move || {
                    let mut open = OpenDir::default();
                    for job in queue {
                        // Armed with `sleep(ms)`, it plays slow storage (tests of expiring checkpoints).
                        crate::crash::point("snapshot-before-write");
                        let checkpoint_id = job.snapshot.barrier.checkpoint_id;
                        let written = open.of(&job.snapshot.barrier.location).and_then(|dir| write_subtask(job, dir));
                        let outcome = match written {
                            Ok(ack) => WriteOutcome::Acknowledged(ack),
                            Err(reason) => WriteOutcome::Declined { checkpoint_id, reason },
                        };
                        if outcomes.send(E::from(outcome)).is_err() {
                            return;
                        }
                    }
                },
            )?);
        }
        Ok(SnapshotWriter { jobs, threads })
    }

    /// Queues a write.
    pub fn submit(&self, job: WriteJob) {
        // The pool lives as long as the job master; a closed queue means the job ended.
        let _ = self.jobs.send(job);
    }

    /// A handle subtasks use to queue writes.
    pub fn queue(&self) -> Sender<WriteJob> {
        self.jobs.clone()
    }

    /// Waits for queued writes to finish and stops the threads.
    pub fn shutdown(self) {
        drop(self.jobs);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// The directory a writer thread wrote its last snapshot into: the next snapshot of the same
/// checkpoint (the usual case) reuses it instead of opening the storage again.
#[derive(Default)]
struct OpenDir {
    last: Option<(Arc<str>, Arc<BlockingStorage>)>,
}

impl OpenDir {
    fn of(&mut self, location: &Arc<str>) -> Result<Arc<BlockingStorage>, String> {
        if let Some((open, dir)) = &self.last
            && open == location
        {
            return Ok(Arc::clone(dir));
        }
        let storage = weir_checkpoint::SnapshotStorage::from_url(location)
            .map_err(|e| format!("cannot open the checkpoint directory {location} its barrier names: {e}"))?;
        let dir = Arc::new(storage.blocking());
        self.last = Some((Arc::clone(location), Arc::clone(&dir)));
        Ok(dir)
    }
}

fn mode_of(mode: Redistribution) -> RedistributionMode {
    match mode {
        Redistribution::Split => RedistributionMode::Split,
        Redistribution::Union => RedistributionMode::Union,
        Redistribution::Broadcast => RedistributionMode::Broadcast,
    }
}

/// Bytes of a data file collected before they are handed to the stream.
const STREAM_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// The index of shared file `name` among `files`, added if it is not there yet.
fn shared_index(name: &Arc<str>, files: &mut Vec<Arc<str>>) -> u32 {
    match files.iter().position(|f| f == name) {
        Some(index) => index as u32,
        None => {
            files.push(Arc::clone(name));
            (files.len() - 1) as u32
        }
    }
}

/// Names the blocks of a base's key-group chain (its full block and entry deltas) in this
/// checkpoint, each with its shared file; returns their bytes.
fn name_chain(chain: &[(Arc<str>, BlockRef)], files: &mut Vec<Arc<str>>, blocks: &mut Vec<BlockRef>) -> u64 {
    let mut bytes = 0;
    for (in_file, block) in chain {
        blocks.push(BlockRef { shared_file: Some(shared_index(in_file, files)), ..*block });
        bytes += block.length;
    }
    bytes
}

/// What an incremental checkpoint did with each key group it holds, logged at debug: why
/// groups were written whole is what makes a checkpoint large.
#[derive(Debug, Default)]
struct GroupOutcomes {
    /// Unchanged since the base: its blocks named.
    reused: u32,
    /// Changed: an entry delta over the base's blocks.
    deltas: u32,
    /// Written whole: due for materialization (or a full checkpoint).
    materialized: u32,
    /// Written whole: the base holds no block of it (the attempt's first checkpoint, a new group).
    no_base_block: u32,
    /// Written whole: changed since a checkpoint newer than the base (whose completion the
    /// subtask had not heard of when it wrote).
    changed_after_base: u32,
    /// Written whole: the table counts no changes for it (no change log kept, or not worth a delta).
    no_change_log: u32,
    /// Written whole: the table declined the delta (not known, or more than half the group changed).
    delta_declined: u32,
}

impl GroupOutcomes {
    fn count_written(&mut self, had_chain: bool, due: bool, changed_after_base: bool, tried: bool, delta: bool) {
        let counter = if delta {
            &mut self.deltas
        } else if due {
            &mut self.materialized
        } else if !had_chain {
            &mut self.no_base_block
        } else if changed_after_base {
            &mut self.changed_after_base
        } else if !tried {
            &mut self.no_change_log
        } else {
            &mut self.delta_declined
        };
        *counter += 1;
    }
}

/// What every part of one subtask's write reads: the checkpoint, where the file goes, and
/// what an incremental checkpoint may reuse.
struct WriteScope {
    ended: Arc<super::ended::EndedCheckpoints>,
    checkpoint_id: u64,
    vertex: usize,
    subtask: u32,
    /// The subtask's end of input had run before the barrier.
    finished: bool,
    /// The checkpoint's directory.
    dir: Arc<BlockingStorage>,
    /// Where the file goes: the checkpoint's directory, or for an incremental job its
    /// `shared/` directory.
    out_dir: Arc<BlockingStorage>,
    /// The file's name in `out_dir`.
    file: String,
    /// The same name, as the blocks of an incremental checkpoint record it.
    own_file: Arc<str>,
    incremental: Option<Arc<IncrementalTracker>>,
    base: Option<Arc<WrittenCheckpoint>>,
    /// A full checkpoint (asked for with `checkpointType: FULL`).
    full: bool,
}

impl WriteScope {
    /// The scope of `job`'s write into checkpoint directory `dir`, and the state to write.
    fn of(job: WriteJob, dir: Arc<BlockingStorage>) -> (WriteScope, TaskSnapshot) {
        let WriteJob { ended, vertex, subtask, snapshot, incremental } = job;
        let checkpoint_id = snapshot.barrier.checkpoint_id;
        let (out_dir, file) = match &incremental {
            Some(_) => {
                (Arc::new(dir.storage.shared_dir().blocking()), shared_data_file_name(checkpoint_id, vertex, subtask))
            }
            None => (Arc::clone(&dir), data_file_name(vertex, subtask)),
        };
        let base = incremental.as_ref().and_then(|tracker| tracker.base());
        let full = matches!(snapshot.barrier.kind, BarrierKind::Checkpoint { full: true, .. });
        let own_file: Arc<str> = Arc::from(file.as_str());
        let scope = WriteScope {
            ended,
            checkpoint_id,
            vertex,
            subtask,
            finished: snapshot.finished,
            dir,
            out_dir,
            file,
            own_file,
            incremental,
            base,
            full,
        };
        (scope, snapshot)
    }

    /// Whether key group `key_group` is written whole. A key group due for materialization
    /// is written whole; the rest may reuse the base. A full checkpoint materializes every
    /// group.
    fn materializes(&self, key_group: u32) -> bool {
        self.full
            || self.incremental.as_ref().is_none_or(|tracker| tracker.materializes(self.base.as_deref(), key_group))
    }

    /// The id of the base checkpoint (0 without one).
    fn base_id(&self) -> u64 {
        self.base.as_ref().map_or(0, |b| b.checkpoint_id)
    }
}

/// One subtask's data file while it is built and streamed out, and what writing it recorded.
struct SubtaskFile {
    data: DataFileWriter,
    out: StreamingWrite,
    /// Blocks written into this file (not named from a base's).
    own_blocks: usize,
    groups: GroupOutcomes,
    /// Where this checkpoint's blocks are, for the next incremental one.
    written: WrittenCheckpoint,
}

impl SubtaskFile {
    fn open(scope: &WriteScope) -> Result<SubtaskFile, String> {
        let written = WrittenCheckpoint {
            checkpoint_id: scope.checkpoint_id,
            sequence: scope.base.as_ref().map_or(0, |b| b.sequence + 1),
            keyed: Default::default(),
        };
        let data = DataFileWriter::new();
        // The file goes out in parts while it is built: memory holds a part or two of it, not
        // the whole serialized state.
        let out = scope.out_dir.stream(&scope.file).map_err(|e| e.to_string())?;
        Ok(SubtaskFile { data, out, own_blocks: 0, groups: GroupOutcomes::default(), written })
    }

    /// Appends key group `key_group` of `table` (`entries` entries) as one block: an entry
    /// delta when `try_delta` and the table writes one, else the whole group. Returns the
    /// block and whether it is a delta.
    fn add_key_group(
        &mut self,
        table: &dyn TableSnapshot,
        key_group: u32,
        entries: u64,
        try_delta: bool,
    ) -> Result<(BlockRef, bool), weir_state::StateError> {
        let mut delta_written = false;
        let block = self.data.add_block_with(Some(key_group), entries, |out| {
            if try_delta {
                delta_written = table.write_key_group_delta(key_group, out)?;
                if delta_written { Ok(()) } else { table.write_key_group(key_group, out) }
            } else {
                // In the snapshot's format (native or canonical), chosen when the task took it.
                table.write_key_group(key_group, out)
            }
        })?;
        Ok((block, delta_written))
    }

    /// Hands what the file has buffered to the stream, once it is a chunk's worth.
    fn stream_chunk(&mut self) -> Result<(), String> {
        if let Some(chunk) = self.data.take_chunk(STREAM_CHUNK_BYTES) {
            self.out.put(Bytes::from(chunk)).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Completes the file, unless its checkpoint ended before or while it was written: then
    /// nothing of it stays. Returns where its blocks are and what became of its key groups.
    fn complete(self, scope: &WriteScope) -> Result<(WrittenCheckpoint, GroupOutcomes), String> {
        let SubtaskFile { data, mut out, own_blocks, groups, written } = self;
        let (checkpoint_id, subtask) = (scope.checkpoint_id, scope.subtask);
        let rest: Bytes = data.finish();
        if scope.ended.has_ended(checkpoint_id) {
            // Dropping the stream aborts it: nothing of the file stays. A local directory the
            // stream created stays, though: remove it (the coordinator may have deleted the
            // checkpoint's directory before the stream made it again).
            drop(out);
            let _ = scope.dir.delete_all();
            return Err(format!("checkpoint {checkpoint_id} was aborted before subtask {subtask} wrote its state"));
        }
        if scope.incremental.is_some() && own_blocks == 0 {
            // Everything was reused (or there is no state): no file of this checkpoint, which
            // nothing would name. Dropping the stream aborts it.
            drop(out);
        } else {
            out.put(rest).map_err(|e| e.to_string())?;
            out.finish().map_err(|e| e.to_string())?;
        }
        if scope.ended.has_ended(checkpoint_id) {
            // Aborted while this file was written (the coordinator retires before it deletes):
            // no file of an aborted checkpoint stays behind.
            let _ = scope.dir.delete_all();
            if scope.incremental.is_some() {
                let _ = scope.out_dir.delete(&scope.file);
            }
            return Err(format!("checkpoint {checkpoint_id} was aborted while subtask {subtask} wrote its state"));
        }
        Ok((written, groups))
    }
}

/// Serializes every operator's state of one subtask into one data file and writes it.
///
/// For a checkpoint of an incremental job the file goes to the job's `shared/` directory,
/// and a key group unchanged since the subtask's base checkpoint is not written again: the
/// metadata names the base's block.
fn write_subtask(job: WriteJob, dir: Arc<BlockingStorage>) -> Result<SubtaskAck, String> {
    let started = std::time::Instant::now();
    let (scope, mut snapshot) = WriteScope::of(job, dir);
    let (checkpoint_id, vertex, subtask) = (scope.checkpoint_id, scope.vertex, scope.subtask);
    let mut file = SubtaskFile::open(&scope)?;
    let mut operators = Vec::with_capacity(snapshot.operators.len());
    for operator in &mut snapshot.operators {
        operators.push(OperatorWrite::new(&scope, &mut file).write(operator)?);
    }
    let (written, groups) = file.complete(&scope)?;
    if let Some(tracker) = &scope.incremental {
        tracker.written(written);
        tracing::debug!(checkpoint = checkpoint_id, vertex, subtask, ?groups, "incremental checkpoint written");
    }
    let timings =
        weir_api::snapshot::SnapshotTimings { async_ms: started.elapsed().as_millis() as u64, ..snapshot.timings };
    Ok(SubtaskAck { checkpoint_id, vertex, subtask, operators, finished: snapshot.finished, timings })
}

/// One operator's part of a subtask's file, while it is written.
struct OperatorWrite<'a> {
    scope: &'a WriteScope,
    file: &'a mut SubtaskFile,
    /// Incremental: the files this operator's blocks are in (its own first).
    shared_files: Vec<Arc<str>>,
    /// Bytes of the base's blocks this operator's snapshot names.
    reused_bytes: u64,
}

/// One keyed state's blocks, while its key groups are written.
struct TableBlocks<'b> {
    /// Where the base has this state's key groups.
    reusable: Option<&'b KeyGroupBlocks>,
    base_id: u64,
    blocks: Vec<BlockRef>,
    /// Incremental: where this checkpoint has each key group.
    recorded: KeyGroupBlocks,
}

impl<'a> OperatorWrite<'a> {
    fn new(scope: &'a WriteScope, file: &'a mut SubtaskFile) -> OperatorWrite<'a> {
        OperatorWrite { scope, file, shared_files: Vec::new(), reused_bytes: 0 }
    }

    /// Writes the operator's keyed and operator states; returns what the ack records of it.
    fn write(mut self, operator: &mut OperatorSnapshotData) -> Result<AckedOperator, String> {
        let before = self.file.data.len();
        let mut keyed_states = Vec::new();
        let mut key_group_range = None;
        let mut key_type = None;
        if let Some(keyed) = &mut operator.keyed {
            key_group_range = Some(keyed.range);
            key_type = Some(keyed.key_type.clone());
            for table in &mut keyed.tables {
                keyed_states.push(self.write_table(&operator.uid, keyed.range, &mut **table)?);
            }
        }
        let operator_states = self.write_operator_states(&operator.operator_states);
        let bytes = self.file.data.len() - before;
        let scope = self.scope;
        Ok(AckedOperator {
            uid: operator.uid.clone(),
            key_type,
            snapshot: SubtaskSnapshot {
                subtask: scope.subtask,
                key_group_range,
                // Incremental: every block names its shared file; the checkpoint directory
                // holds only `_metadata`.
                file: scope.incremental.is_none().then(|| scope.file.clone()),
                keyed_states,
                operator_states,
                finished: scope.finished,
                shared_files: self.shared_files.iter().map(|f| f.to_string()).collect(),
            },
            bytes,
            full_bytes: bytes + self.reused_bytes,
        })
    }

    /// Writes (or names from the base) every key group of one keyed state.
    fn write_table(
        &mut self,
        uid: &str,
        range: KeyGroupRange,
        table: &mut dyn TableSnapshot,
    ) -> Result<KeyedStateHandle, String> {
        let name = table.name().to_string();
        let base = self.scope.base.as_deref();
        let mut state = TableBlocks {
            reusable: base.and_then(|b| b.state(uid, &name)),
            base_id: self.scope.base_id(),
            blocks: Vec::new(),
            recorded: BTreeMap::new(),
        };
        for key_group in range.iter() {
            self.write_key_group(uid, table, key_group, &mut state)?;
        }
        if self.scope.incremental.is_some() {
            self.file.written.keyed.insert((uid.to_string(), name.clone()), state.recorded);
        }
        Ok(KeyedStateHandle {
            name,
            kind: table.kind().to_string(),
            value_type: table.cell_type().to_string(),
            key_groups: state.blocks,
        })
    }

    /// Names key group `key_group`'s blocks in the base when it was not accessed since, or
    /// writes it (whole, or as an entry delta over the base's blocks).
    fn write_key_group(
        &mut self,
        uid: &str,
        table: &mut dyn TableSnapshot,
        key_group: u32,
        state: &mut TableBlocks<'_>,
    ) -> Result<(), String> {
        let chain =
            state.reusable.filter(|_| !self.scope.materializes(key_group)).and_then(|groups| groups.get(&key_group));
        let written_after = table.written_after(key_group);
        if let Some(chain) = chain
            && written_after < state.base_id
        {
            // Not accessed since the base: name its blocks (nothing of the group is read).
            table.release_key_group(key_group);
            self.reused_bytes += name_chain(chain, &mut self.shared_files, &mut state.blocks);
            state.recorded.insert(key_group, chain.clone());
            self.file.groups.reused += 1;
            return Ok(());
        }
        let entries = table.key_group_entries(key_group);
        if entries == 0 {
            table.release_key_group(key_group);
            return Ok(());
        }
        // Changed since the base, and only since it: an entry delta over the base's blocks
        // when few entries changed (the hashmap and fjall backends track them).
        let delta_over = chain.filter(|_| written_after == state.base_id && table.changed_entries(key_group).is_some());
        let block = self.file.add_key_group(table, key_group, entries, delta_over.is_some());
        let (mut block, delta_written) = block.map_err(|e| format!("operator '{uid}': {e}"))?;
        self.file.own_blocks += 1;
        // The task's next write to this key group needs no copy.
        table.release_key_group(key_group);
        let mut links = Vec::new();
        if let Some(chain) = delta_over.filter(|_| delta_written) {
            block.delta = true;
            self.reused_bytes += name_chain(chain, &mut self.shared_files, &mut state.blocks);
            links.clone_from(chain);
        }
        if self.scope.incremental.is_some() {
            self.file.groups.count_written(
                chain.is_some(),
                self.scope.materializes(key_group),
                written_after > state.base_id,
                delta_over.is_some(),
                delta_written,
            );
            links.push((Arc::clone(&self.scope.own_file), block));
            state.recorded.insert(key_group, links);
            block.shared_file = Some(shared_index(&self.scope.own_file, &mut self.shared_files));
        }
        state.blocks.push(block);
        self.file.stream_chunk()
    }

    /// Writes the operator's non-keyed states, one block per element.
    fn write_operator_states(&mut self, states: &[OperatorStateData]) -> Vec<OperatorStateHandle> {
        let mut operator_states = Vec::with_capacity(states.len());
        for state in states {
            let mut elements = Vec::with_capacity(state.elements.len());
            for element in &state.elements {
                let mut block = self.file.data.add_block(element, None, 1);
                self.file.own_blocks += 1;
                if self.scope.incremental.is_some() {
                    block.shared_file = Some(shared_index(&self.scope.own_file, &mut self.shared_files));
                }
                elements.push(block);
            }
            operator_states.push(OperatorStateHandle { name: state.name.clone(), mode: mode_of(state.mode), elements });
        }
        operator_states
    }
}
