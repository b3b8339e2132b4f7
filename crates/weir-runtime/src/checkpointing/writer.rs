//! The asynchronous part of a checkpoint: serializing a subtask's copied state into one data
//! file and writing it to storage while the subtask keeps processing.

use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use weir_api::snapshot::{Redistribution, TaskSnapshot};
use weir_checkpoint::format::{
    DataFileWriter, KeyedStateHandle, OperatorStateHandle, RedistributionMode, SubtaskSnapshot,
};
use weir_checkpoint::paths::data_file_name;
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
    /// Bytes of this operator's blocks.
    pub bytes: u64,
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

/// One write job.
pub struct WriteJob {
    /// Where the checkpoint's files go.
    pub dir: Arc<BlockingStorage>,
    /// The registry `dir` came from: a write that lands after its checkpoint was aborted
    /// removes what it wrote.
    pub registry: super::dirs::SnapshotDirs,
    /// The subtask's vertex.
    pub vertex: usize,
    /// The subtask.
    pub subtask: u32,
    /// The copied state.
    pub snapshot: TaskSnapshot,
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
                    for job in queue {
                        let checkpoint_id = job.snapshot.barrier.checkpoint_id;
                        let outcome = match write_subtask(job) {
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

fn mode_of(mode: Redistribution) -> RedistributionMode {
    match mode {
        Redistribution::Split => RedistributionMode::Split,
        Redistribution::Union => RedistributionMode::Union,
        Redistribution::Broadcast => RedistributionMode::Broadcast,
    }
}

/// Bytes of a data file collected before they are handed to the stream.
const STREAM_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Serializes every operator's state of one subtask into one data file and writes it.
fn write_subtask(job: WriteJob) -> Result<SubtaskAck, String> {
    let WriteJob { dir, registry, vertex, subtask, mut snapshot } = job;
    let file = data_file_name(vertex, subtask);
    let mut data = DataFileWriter::new();
    // The file goes out in parts while it is built: memory holds a part or two of it, not
    // the whole serialized state.
    let mut out = dir.stream(&file).map_err(|e| e.to_string())?;
    let mut operators = Vec::with_capacity(snapshot.operators.len());
    let finished = snapshot.finished;
    for operator in &mut snapshot.operators {
        let before = data.len();
        let mut keyed_states = Vec::new();
        let mut key_group_range = None;
        let mut key_type = None;
        if let Some(keyed) = &mut operator.keyed {
            key_group_range = Some(keyed.range);
            key_type = Some(keyed.key_type.clone());
            for table in &mut keyed.tables {
                let mut blocks = Vec::new();
                for key_group in keyed.range.iter() {
                    let entries = table.key_group_entries(key_group);
                    if entries == 0 {
                        table.release_key_group(key_group);
                        continue;
                    }
                    // In the snapshot's format (native or canonical), chosen when the task took it.
                    let block =
                        data.add_block_with(Some(key_group), entries, |out| table.write_key_group(key_group, out));
                    let block = block.map_err(|e| format!("operator '{}': {e}", operator.uid))?;
                    // The task's next write to this key group needs no copy.
                    table.release_key_group(key_group);
                    blocks.push(block);
                    if let Some(chunk) = data.take_chunk(STREAM_CHUNK_BYTES) {
                        out.put(Bytes::from(chunk)).map_err(|e| e.to_string())?;
                    }
                }
                keyed_states.push(KeyedStateHandle {
                    name: table.name().to_string(),
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
                elements.push(data.add_block(element, None, 1));
            }
            operator_states.push(OperatorStateHandle { name: state.name.clone(), mode: mode_of(state.mode), elements });
        }
        operators.push(AckedOperator {
            uid: operator.uid.clone(),
            key_type,
            snapshot: SubtaskSnapshot {
                subtask,
                key_group_range,
                file: Some(file.clone()),
                keyed_states,
                operator_states,
                finished,
            },
            bytes: data.len() - before,
        });
    }
    let rest: Bytes = data.finish();
    let checkpoint_id = snapshot.barrier.checkpoint_id;
    if registry.is_retired(checkpoint_id) {
        // Dropping the stream aborts it: nothing of the file stays.
        return Err(format!("checkpoint {checkpoint_id} was aborted before subtask {subtask} wrote its state"));
    }
    out.put(rest).map_err(|e| e.to_string())?;
    out.finish().map_err(|e| e.to_string())?;
    if registry.is_retired(checkpoint_id) {
        // Aborted while this file was written (the coordinator retires before it deletes):
        // no file of an aborted checkpoint stays behind.
        let _ = dir.delete_all();
        return Err(format!("checkpoint {checkpoint_id} was aborted while subtask {subtask} wrote its state"));
    }
    Ok(SubtaskAck {
        checkpoint_id: snapshot.barrier.checkpoint_id,
        vertex,
        subtask,
        operators,
        finished: snapshot.finished,
    })
}
