//! Reading a subtask's share of a snapshot when a job starts from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use weir_api::graph::{StreamGraph, StreamNode};
use weir_api::snapshot::RestoredOperator;
use weir_checkpoint::format::{BlockRef, SnapshotMetadata};
use weir_checkpoint::restore::RestorePlan;
use weir_checkpoint::storage::BlockingStorage;
use weir_checkpoint::{NewOperator, RestoreRequest};
use weir_state::{RestoredTable, StateKind};

/// What `graph` looks like to restore planning: every operator's uid, parallelism
/// (`parallelism_of`), keyedness and inputs.
pub fn restore_request(
    graph: &StreamGraph,
    parallelism_of: impl Fn(&StreamNode) -> u32,
    max_parallelism: Option<u32>,
    allow_non_restored_state: bool,
) -> RestoreRequest {
    let nodes = graph.nodes();
    let mut operators = Vec::with_capacity(nodes.len());
    for node in nodes {
        let inputs = node.inputs.iter().filter_map(|edge| nodes.get(edge.source)).map(StreamNode::uid_or_generated);
        operators.push(NewOperator {
            uid: node.uid_or_generated(),
            parallelism: parallelism_of(node),
            keyed: node.keyed,
            inputs: inputs.collect(),
        });
    }
    RestoreRequest { operators, max_parallelism, allow_non_restored_state }
}

/// A snapshot a job starts from, with the plan of who reads what.
pub struct RestoreSource {
    /// The snapshot directory.
    pub storage: BlockingStorage,
    /// Where it is, for messages and REST.
    pub location: String,
    /// Its metadata.
    pub metadata: SnapshotMetadata,
    /// Which new subtask reads which blocks.
    pub plan: RestorePlan,
}

/// Why a snapshot cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreOpenError {
    /// The location is no storage location weir reads.
    #[error("{0}")]
    Location(weir_checkpoint::StorageError),
    /// Its `_metadata` cannot be read.
    #[error("{0}")]
    Metadata(weir_checkpoint::LoadError),
    /// It does not fit the job (uids, parallelism, max parallelism).
    #[error("{0}")]
    Plan(weir_checkpoint::RestoreError),
}

impl RestoreSource {
    /// Opens the snapshot at `location` for a job shaped as `request`: the one way a start, a
    /// restart and a TaskManager's share of a restore read a snapshot and plan who reads what
    /// (a pure function of the two, so every process plans the same).
    pub fn open(location: &str, request: &RestoreRequest) -> Result<RestoreSource, RestoreOpenError> {
        let storage = weir_checkpoint::SnapshotStorage::from_url(location).map_err(RestoreOpenError::Location)?;
        RestoreSource::read(storage, request)
    }

    /// As [`RestoreSource::open`], for storage already opened.
    pub fn read(
        storage: weir_checkpoint::SnapshotStorage,
        request: &RestoreRequest,
    ) -> Result<RestoreSource, RestoreOpenError> {
        let blocking = storage.blocking();
        let metadata =
            blocking.block_on(weir_checkpoint::load_metadata(&storage)).map_err(RestoreOpenError::Metadata)?;
        let plan = weir_checkpoint::plan_restore(&metadata, request).map_err(RestoreOpenError::Plan)?;
        Ok(RestoreSource { storage: blocking, location: storage.url().to_string(), metadata, plan })
    }

    /// Bytes every subtask of the new job reads in all (the progress bar's end).
    pub fn total_bytes(&self) -> u64 {
        let blocks = |list: &[(String, BlockRef)]| list.iter().map(|(_, b)| b.length).sum::<u64>();
        self.plan
            .operators
            .values()
            .flatten()
            .map(|share| {
                share.keyed.iter().map(|(_, _, _, b)| blocks(b)).sum::<u64>()
                    + share.operator_states.iter().map(|(_, _, b)| blocks(b)).sum::<u64>()
            })
            .sum()
    }

    /// Reads, checks and decodes the state of `subtask` for the operators `uids` of a chain,
    /// adding the bytes read to `progress` as each file is read.
    pub fn load_subtask(
        &self,
        uids: &[String],
        subtask: u32,
        progress: &AtomicU64,
    ) -> Result<HashMap<String, RestoredOperator>, String> {
        let mut restored = HashMap::new();
        for uid in uids {
            let Some(subtasks) = self.plan.operators.get(uid) else {
                continue;
            };
            let Some(share) = subtasks.get(subtask as usize) else {
                continue;
            };
            let mut operator = RestoredOperator {
                key_type: share.key_type.clone(),
                finished: share.finished,
                snapshot_job_id: self.metadata.job_id.clone(),
                ..RestoredOperator::default()
            };
            for (name, kind, value_type, blocks) in &share.keyed {
                let kind: StateKind = kind.parse().map_err(|e| format!("operator '{uid}' state '{name}': {e}"))?;
                let mut key_groups = BTreeMap::new();
                // A key group of an incremental checkpoint may be a chain: a full block and
                // the entry deltas after it (validation put them in order), applied here.
                let mut deltas: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
                for ((_, block), bytes) in blocks.iter().zip(self.read_blocks(blocks, progress)?) {
                    let key_group = block.key_group.unwrap_or_default();
                    if block.delta {
                        deltas.entry(key_group).or_default().push(bytes);
                        if let Some((_, entries)) = key_groups.get_mut(&key_group) {
                            *entries = block.entries;
                        }
                    } else {
                        key_groups.insert(key_group, (bytes, block.entries));
                    }
                }
                for (key_group, chain) in deltas {
                    let Some((full, _)) = key_groups.get_mut(&key_group) else { continue };
                    let chain: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
                    *full = weir_state::apply_deltas(full, &chain, name, key_group)
                        .map_err(|e| format!("operator '{uid}': {e}"))?;
                }
                operator.keyed.push(RestoredTable {
                    name: name.clone(),
                    kind,
                    cell_type: value_type.clone(),
                    key_groups,
                });
            }
            for (name, _mode, blocks) in &share.operator_states {
                operator.operator_states.insert(name.clone(), self.read_blocks(blocks, progress)?);
            }
            restored.insert(uid.clone(), operator);
        }
        Ok(restored)
    }

    /// Every element of operator state `name` of snapshot operator `uid`, from every old
    /// subtask in subtask order (for pre-flight checks); empty when there is none.
    pub fn operator_state_elements(&self, uid: &str, name: &str) -> Result<Vec<Vec<u8>>, String> {
        let Some(operator) = self.metadata.operators.iter().find(|o| o.uid == uid) else {
            return Ok(Vec::new());
        };
        let mut blocks = Vec::new();
        for subtask in &operator.subtasks {
            for state in subtask.operator_states.iter().filter(|state| state.name == name) {
                blocks.extend(state.elements.iter().filter_map(|block| subtask.block_file(block).map(|f| (f, *block))));
            }
        }
        self.read_blocks(&blocks, &AtomicU64::new(0))
    }

    /// Reads blocks (grouped into one ranged read per file) and checks each checksum.
    fn read_blocks(&self, blocks: &[(String, BlockRef)], progress: &AtomicU64) -> Result<Vec<Vec<u8>>, String> {
        let mut by_file: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (index, (file, _)) in blocks.iter().enumerate() {
            by_file.entry(file.as_str()).or_default().push(index);
        }
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); blocks.len()];
        for (file, indices) in by_file {
            let refs: Vec<BlockRef> = indices.iter().map(|&i| blocks[i].1).collect();
            // One ranged read per file; the header and every block's length and checksum
            // are checked, so corrupt bytes never become state.
            let fetched = self
                .storage
                .block_on(weir_checkpoint::read_blocks(&self.storage.storage, file, &refs))
                .map_err(|e| e.to_string())?;
            progress.fetch_add(refs.iter().map(|r| r.length).sum(), Ordering::Relaxed);
            for (&index, bytes) in indices.iter().zip(fetched) {
                out[index] = bytes.to_vec();
            }
        }
        Ok(out)
    }
}
