//! The asynchronous part of a checkpoint: serializing a subtask's copied state into one data
//! file and writing it to storage while the subtask keeps processing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use weir_api::snapshot::{BarrierKind, Redistribution, TaskSnapshot};
use weir_checkpoint::format::{
    BlockRef, DataFileWriter, KeyedStateHandle, OperatorStateHandle, RedistributionMode, SubtaskSnapshot,
};
use weir_checkpoint::paths::{data_file_name, shared_data_file_name};

use super::incremental::{IncrementalTracker, WrittenCheckpoint};
use weir_checkpoint::storage::BlockingStorage;

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

/// Serializes every operator's state of one subtask into one data file and writes it.
///
/// For a checkpoint of an incremental job the file goes to the job's `shared/` directory,
/// and a key group unchanged since the subtask's base checkpoint is not written again: the
/// metadata names the base's block.
fn write_subtask(job: WriteJob, dir: Arc<BlockingStorage>) -> Result<SubtaskAck, String> {
    let started = std::time::Instant::now();
    let WriteJob { ended, vertex, subtask, mut snapshot, incremental } = job;
    let checkpoint_id = snapshot.barrier.checkpoint_id;
    let (out_dir, file) = match &incremental {
        Some(_) => {
            (Arc::new(dir.storage.shared_dir().blocking()), shared_data_file_name(checkpoint_id, vertex, subtask))
        }
        None => (Arc::clone(&dir), data_file_name(vertex, subtask)),
    };
    let base = incremental.as_ref().and_then(|tracker| tracker.base());
    // A key group due for materialization is written whole; the rest may reuse the base.
    // A full checkpoint (asked for with `checkpointType: FULL`) materializes every group.
    let full = matches!(snapshot.barrier.kind, BarrierKind::Checkpoint { full: true });
    let materializes = |key_group: u32| {
        full || incremental.as_ref().is_none_or(|tracker| tracker.materializes(base.as_deref(), key_group))
    };
    let own_file: Arc<str> = Arc::from(file.as_str());
    let mut written = WrittenCheckpoint {
        checkpoint_id,
        sequence: base.as_ref().map_or(0, |b| b.sequence + 1),
        keyed: Default::default(),
    };
    let mut data = DataFileWriter::new();
    // The file goes out in parts while it is built: memory holds a part or two of it, not
    // the whole serialized state.
    let mut out = out_dir.stream(&file).map_err(|e| e.to_string())?;
    let mut operators = Vec::with_capacity(snapshot.operators.len());
    let finished = snapshot.finished;
    let mut own_blocks = 0usize;
    let mut groups = GroupOutcomes::default();
    for operator in &mut snapshot.operators {
        let before = data.len();
        let mut reused_bytes = 0u64;
        let mut keyed_states = Vec::new();
        let mut key_group_range = None;
        let mut key_type = None;
        // Incremental: the files this operator's blocks are in (its own first).
        let mut shared_files: Vec<Arc<str>> = Vec::new();

        if let Some(keyed) = &mut operator.keyed {
            key_group_range = Some(keyed.range);
            key_type = Some(keyed.key_type.clone());
            for table in &mut keyed.tables {
                let name = table.name().to_string();
                let reusable = base.as_ref().and_then(|b| b.state(&operator.uid, &name));
                let base_id = base.as_ref().map_or(0, |b| b.checkpoint_id);
                let mut blocks = Vec::new();
                let mut recorded = BTreeMap::new();
                for key_group in keyed.range.iter() {
                    let chain = reusable.filter(|_| !materializes(key_group)).and_then(|groups| groups.get(&key_group));
                    let written_after = table.written_after(key_group);
                    if let Some(chain) = chain
                        && written_after < base_id
                    {
                        // Not accessed since the base: name its blocks (nothing of the group
                        // is read).
                        table.release_key_group(key_group);
                        reused_bytes += name_chain(chain, &mut shared_files, &mut blocks);
                        recorded.insert(key_group, chain.clone());
                        groups.reused += 1;
                        continue;
                    }
                    let entries = table.key_group_entries(key_group);
                    if entries == 0 {
                        table.release_key_group(key_group);
                        continue;
                    }
                    // Changed since the base, and only since it: an entry delta over the
                    // base's blocks when few entries changed (the hashmap and fjall backends track them).
                    let delta_over =
                        chain.filter(|_| written_after == base_id && table.changed_entries(key_group).is_some());
                    let mut delta_written = false;
                    let block = data.add_block_with(Some(key_group), entries, |out| match delta_over {
                        Some(_) => {
                            delta_written = table.write_key_group_delta(key_group, out)?;
                            if delta_written { Ok(()) } else { table.write_key_group(key_group, out) }
                        }
                        // In the snapshot's format (native or canonical), chosen when the task took it.
                        None => table.write_key_group(key_group, out),
                    });
                    let mut block = block.map_err(|e| format!("operator '{}': {e}", operator.uid))?;
                    own_blocks += 1;
                    // The task's next write to this key group needs no copy.
                    table.release_key_group(key_group);
                    let mut links = Vec::new();
                    if let Some(chain) = delta_over.filter(|_| delta_written) {
                        block.delta = true;
                        reused_bytes += name_chain(chain, &mut shared_files, &mut blocks);
                        links.clone_from(chain);
                    }
                    if incremental.is_some() {
                        groups.count_written(
                            chain.is_some(),
                            materializes(key_group),
                            written_after > base_id,
                            delta_over.is_some(),
                            delta_written,
                        );
                        links.push((Arc::clone(&own_file), block));
                        recorded.insert(key_group, links);
                        block.shared_file = Some(shared_index(&own_file, &mut shared_files));
                    }
                    blocks.push(block);
                    if let Some(chunk) = data.take_chunk(STREAM_CHUNK_BYTES) {
                        out.put(Bytes::from(chunk)).map_err(|e| e.to_string())?;
                    }
                }
                if incremental.is_some() {
                    written.keyed.insert((operator.uid.clone(), name.clone()), recorded);
                }
                keyed_states.push(KeyedStateHandle {
                    name,
                    kind: table.kind().to_string(),
                    value_type: table.cell_type().to_string(),
                    key_groups: blocks,
                });
            }
        }
        let mut operator_states = Vec::with_capacity(operator.operator_states.len());
        for state in &operator.operator_states {
            let mut elements = Vec::with_capacity(state.elements.len());
            for element in &state.elements {
                let mut block = data.add_block(element, None, 1);
                own_blocks += 1;
                if incremental.is_some() {
                    block.shared_file = Some(shared_index(&own_file, &mut shared_files));
                }
                elements.push(block);
            }
            operator_states.push(OperatorStateHandle { name: state.name.clone(), mode: mode_of(state.mode), elements });
        }
        let bytes = data.len() - before;
        operators.push(AckedOperator {
            uid: operator.uid.clone(),
            key_type,
            snapshot: SubtaskSnapshot {
                subtask,
                key_group_range,
                // Incremental: every block names its shared file; the checkpoint directory
                // holds only `_metadata`.
                file: incremental.is_none().then(|| file.clone()),
                keyed_states,
                operator_states,
                finished,
                shared_files: shared_files.iter().map(|f| f.to_string()).collect(),
            },
            bytes,
            full_bytes: bytes + reused_bytes,
        });
    }
    let rest: Bytes = data.finish();
    if ended.has_ended(checkpoint_id) {
        // Dropping the stream aborts it: nothing of the file stays. A local directory the
        // stream created stays, though: remove it (the coordinator may have deleted the
        // checkpoint's directory before the stream made it again).
        drop(out);
        let _ = dir.delete_all();
        return Err(format!("checkpoint {checkpoint_id} was aborted before subtask {subtask} wrote its state"));
    }
    if incremental.is_some() && own_blocks == 0 {
        // Everything was reused (or there is no state): no file of this checkpoint, which
        // nothing would name. Dropping the stream aborts it.
        drop(out);
    } else {
        out.put(rest).map_err(|e| e.to_string())?;
        out.finish().map_err(|e| e.to_string())?;
    }
    if ended.has_ended(checkpoint_id) {
        // Aborted while this file was written (the coordinator retires before it deletes):
        // no file of an aborted checkpoint stays behind.
        let _ = dir.delete_all();
        if incremental.is_some() {
            let _ = out_dir.delete(&file);
        }
        return Err(format!("checkpoint {checkpoint_id} was aborted while subtask {subtask} wrote its state"));
    }
    if let Some(tracker) = &incremental {
        tracker.written(written);
        tracing::debug!(checkpoint = checkpoint_id, vertex, subtask, ?groups, "incremental checkpoint written");
    }
    let timings =
        weir_api::snapshot::SnapshotTimings { async_ms: started.elapsed().as_millis() as u64, ..snapshot.timings };
    Ok(SubtaskAck { checkpoint_id, vertex, subtask, operators, finished: snapshot.finished, timings })
}
