//! The canonical snapshot format, shared by checkpoints and savepoints: a `_metadata` file plus data files.
//!
//! # Snapshot format, version 2
//!
//! A snapshot (a checkpoint `chk-<n>` or a savepoint `savepoint-<job6>-<hex12>`) is one
//! directory holding:
//!
//! - `_metadata`: a JSON document describing every operator's state and where its bytes are;
//! - data files (`task-<vertex>-<subtask>.state`): the state bytes, one file per subtask that
//!   has state.
//!
//! Every reference inside the snapshot is a file name relative to the snapshot directory, so
//! the directory is self-contained and relocatable: it can be copied or moved as a whole,
//! between local disks and object stores alike. Checkpoints and savepoints have the same
//! format; `kind` only records which one it was. The format does not depend on the state
//! backend (it is Flink's "canonical" format): keyed state is written per key group as
//! canonical bytes, so it can be restored at any parallelism up to the max parallelism.
//!
//! The `_metadata` file is written last: a directory without it is an incomplete snapshot
//! and is never read; disposal deletes it first.
//!
//! ## `_metadata`
//!
//! One JSON object (UTF-8):
//!
//! ```json
//! {"magic":"weir-snapshot","format_version":2,"crc32":3735928559,"metadata":{...}}
//! ```
//!
//! - `magic`: always `"weir-snapshot"`.
//! - `format_version`: `2` (this weir also reads `1`, which is `2` without `finished`). A
//!   reader refuses versions it does not know ("written by a newer weir").
//! - `crc32`: CRC-32 (IEEE, as `crc32fast`) of the compact JSON serialization of `metadata`
//!   with its fields in the order listed below (serde_json's `to_vec` of
//!   [`SnapshotMetadata`]). A reader re-serializes the parsed `metadata` and compares.
//! - `metadata`:
//!   - `format_version` (u32): equals the outer `format_version`;
//!   - `kind`: `"checkpoint"` or `"savepoint"`;
//!   - `job_id`, `job_name` (strings): the job that took the snapshot;
//!   - `checkpoint_id` (u64), `timestamp_ms` (u64, epoch milliseconds when it was triggered);
//!   - `max_parallelism` (u32, 1..=32768): the number of key groups; fixed for the life of
//!     the job's state;
//!   - `operators`: one entry per operator (matched on restore by `uid`):
//!     - `uid` (unique within the snapshot), `name`, `parallelism` (u32, 1..=max parallelism);
//!     - `key_type`: the Rust type name of the key for keyed operators, `null` otherwise;
//!     - `subtasks`: exactly `parallelism` entries in subtask order, each:
//!       - `subtask` (u32): its index, equal to its position;
//!       - `key_group_range`: `{"start":s,"end":e}` (inclusive) for keyed operators, which
//!         must equal Flink's range for the subtask
//!         (`start = ceil(i * maxP / p)`, `end = ((i + 1) * maxP - 1) / p`); `null` otherwise;
//!       - `file`: the data file of this subtask, relative to the snapshot directory
//!         (`/`-separated, no `.`/`..`/empty segments), or `null` when it has no state bytes;
//!       - `keyed_states`: per keyed state `{"name","kind","value_type","key_groups":[block...]}`
//!         with `kind` the state kind (`value`, `list`, `map`, `reducing`, ... as the state
//!         backend names them), `value_type` the Rust type name of the value, and one block
//!         per non-empty key group of the subtask's range, in ascending key-group order;
//!       - `operator_states`: per non-keyed state `{"name","mode","elements":[block...]}`
//!         with `mode` one of `"split"` (list state, split evenly on rescale), `"union"`
//!         (every subtask gets every element) or `"broadcast"` (every subtask holds the same
//!         copy); each block is one redistributable element;
//!       - `finished` (version 2, written only when `true`): the subtask's input had ended
//!         and it had emitted its end-of-input results before the barrier (Flink's finished
//!         tasks, FLIP-147). An operator whose subtasks are all finished is *fully
//!         finished*: a restore runs it without input and without end-of-input output, so
//!         nothing it emitted before is emitted again.
//!
//! A block (`BlockRef`) is `{"key_group":g|null,"offset":o,"length":l,"crc32":c,"entries":n}`:
//! bytes `[o, o + l)` of the subtask's data file, CRC-32 `c` over exactly those bytes, holding
//! `n` entries (keys of a key group; list items of an element). `key_group` is set for keyed
//! state and `null` for operator state.
//!
//! State names are unique within a subtask; a state name has the same kind and value type
//! (keyed) or mode (operator state) in every subtask of an operator.
//!
//! ## Data files
//!
//! ```text
//! offset 0   8 bytes  magic "WEIRDATA"
//! offset 8   4 bytes  format version, u32 little-endian: FORMAT_VERSION when written
//!                     (every version from 1 up is read, a newer one refused)
//! offset 12  blocks, concatenated, no padding
//! ```
//!
//! Blocks are opaque to this format: their content is the canonical serialization of the
//! state backend (for keyed state, one key group of one state; for operator state, one
//! element). A reader fetches a block by range and verifies its length and CRC-32 before
//! using it. The data file carries no index of its own: `_metadata` is the index.
//!
//! Unknown fields inside `metadata` are refused (the checksum covers only known fields);
//! unknown fields of the envelope are ignored.
//!
//! ## Compatibility
//!
//! Any change to the layout above bumps [`FORMAT_VERSION`]; readers refuse newer versions
//! with an error rather than guessing.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
pub use weir_types::SnapshotFormat;
use weir_types::{KeyGroupRange, MAX_PARALLELISM_UPPER_BOUND, compute_key_group_range_for_operator_index};

/// The version of the snapshot format this weir writes.
pub const FORMAT_VERSION: u32 = 5;

/// The oldest version this weir reads (every version up to [`FORMAT_VERSION`] is read).
pub const FORMAT_VERSION_OLDEST: u32 = 1;

/// The `magic` field of every `_metadata` file.
pub const METADATA_MAGIC: &str = "weir-snapshot";

/// The first 8 bytes of every data file.
pub const DATA_MAGIC: &[u8; 8] = b"WEIRDATA";

/// Length of a data file's header (magic and version); the first block starts here.
pub const DATA_HEADER_LEN: u64 = 12;

/// Whether a snapshot is a checkpoint or a savepoint (the format is the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Taken periodically by the checkpoint coordinator.
    Checkpoint,
    /// Taken on request (`weir savepoint`, `weir stop`).
    Savepoint,
}

impl std::fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotKind::Checkpoint => "checkpoint",
            SnapshotKind::Savepoint => "savepoint",
        })
    }
}

/// The content of a `_metadata` file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMetadata {
    /// Always [`FORMAT_VERSION`] when written by this weir.
    pub format_version: u32,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// The job that took the snapshot (32 hex).
    pub job_id: String,
    /// The job's name.
    pub job_name: String,
    /// The checkpoint id (savepoints use the checkpoint id sequence too).
    pub checkpoint_id: u64,
    /// When the snapshot was triggered, epoch milliseconds.
    pub timestamp_ms: u64,
    /// The number of key groups.
    pub max_parallelism: u32,
    /// Every operator of the job, with or without state.
    pub operators: Vec<OperatorSnapshot>,
    /// `CANONICAL` (every key group's entries sorted by key bytes: any state backend reads
    /// it) or `NATIVE` (the writing backend's own layout: only it reads it). Version 3;
    /// absent means canonical, and canonical is not written.
    #[serde(default, skip_serializing_if = "SnapshotFormat::is_canonical")]
    pub format: SnapshotFormat,
    /// The state backend that wrote it (`state.backend.type`). Version 3; absent means
    /// `hashmap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_backend: Option<String>,
}

impl SnapshotMetadata {
    /// The state backend that wrote the snapshot.
    pub fn backend(&self) -> &str {
        self.state_backend.as_deref().unwrap_or("hashmap")
    }
}

/// One operator's state in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorSnapshot {
    /// The operator's uid: how restore matches it to an operator of the new job.
    pub uid: String,
    /// The operator's name, for people.
    pub name: String,
    /// The operator's parallelism when the snapshot was taken.
    pub parallelism: u32,
    /// Rust type name of the key, for keyed operators.
    pub key_type: Option<String>,
    /// Exactly `parallelism` entries, in subtask index order.
    pub subtasks: Vec<SubtaskSnapshot>,
}

impl OperatorSnapshot {
    /// True when some subtask holds a keyed or operator state handle.
    pub fn has_state(&self) -> bool {
        self.subtasks.iter().any(|subtask| !subtask.keyed_states.is_empty() || !subtask.operator_states.is_empty())
    }

    /// True when some subtask holds a keyed state handle.
    pub fn has_keyed_state(&self) -> bool {
        self.subtasks.iter().any(|subtask| !subtask.keyed_states.is_empty())
    }
}

/// One subtask's state in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubtaskSnapshot {
    /// The subtask index.
    pub subtask: u32,
    /// The key groups the subtask owned (keyed operators only).
    pub key_group_range: Option<KeyGroupRange>,
    /// The data file, relative to the snapshot directory; `None` when no state bytes.
    pub file: Option<String>,
    /// The keyed states, each with one block per non-empty key group.
    pub keyed_states: Vec<KeyedStateHandle>,
    /// The non-keyed (operator) states.
    pub operator_states: Vec<OperatorStateHandle>,
    /// The subtask's input had ended and its end-of-input results were out before the
    /// barrier (version 2; absent means `false`, and `false` is not written, so a version 1
    /// file re-serializes to the same bytes for its checksum).
    #[serde(default, skip_serializing_if = "is_false")]
    pub finished: bool,
    /// Version 4, incremental checkpoints: the data files in the job's `shared/` directory
    /// (the sibling of the checkpoint directory) that blocks of this subtask name by index
    /// ([`BlockRef::shared_file`]); plain file names. Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_files: Vec<String>,
}

impl SubtaskSnapshot {
    /// Subtask `subtask` with no state (a stateless operator's entry, or one still to fill).
    pub fn empty(subtask: u32) -> SubtaskSnapshot {
        SubtaskSnapshot {
            subtask,
            key_group_range: None,
            file: None,
            keyed_states: Vec::new(),
            operator_states: Vec::new(),
            finished: false,
            shared_files: Vec::new(),
        }
    }

    /// The file holding `block`, as the storage functions take it: relative to the snapshot
    /// directory (`task-1-0.state`), or [`SHARED_FILE_PREFIX`] and the name of a file in the
    /// job's `shared/` directory. `None` when the subtask records no such file.
    pub fn block_file(&self, block: &BlockRef) -> Option<String> {
        match block.shared_file {
            Some(index) => self.shared_files.get(index as usize).map(|name| format!("{SHARED_FILE_PREFIX}{name}")),
            None => self.file.clone(),
        }
    }

    /// Every block of the subtask (keyed, then operator state) with its file.
    pub fn blocks_with_files(&self) -> Vec<(String, BlockRef)> {
        self.keyed_states
            .iter()
            .flat_map(|state| state.key_groups.iter())
            .chain(self.operator_states.iter().flat_map(|state| state.elements.iter()))
            .filter_map(|block| self.block_file(block).map(|file| (file, *block)))
            .collect()
    }

    /// The shared files this subtask's blocks use.
    pub fn used_shared_files(&self) -> impl Iterator<Item = &str> {
        self.shared_files.iter().map(String::as_str)
    }
}

/// How a block's file names a file in the job's `shared/` directory, as
/// [`SubtaskSnapshot::block_file`] returns it (never written to a snapshot: `_metadata`
/// records shared files by index).
pub const SHARED_FILE_PREFIX: &str = "../shared/";

fn is_false(value: &bool) -> bool {
    !*value
}

impl OperatorSnapshot {
    /// True when every subtask's input had ended before the barrier (Flink's fully finished
    /// operator): a restore must not feed it records or run its end of input again.
    pub fn is_fully_finished(&self) -> bool {
        !self.subtasks.is_empty() && self.subtasks.iter().all(|subtask| subtask.finished)
    }
}

/// One keyed state of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyedStateHandle {
    /// The state's declared name.
    pub name: String,
    /// The state's kind (`value`, `list`, `map`, ...), as the state backend names it.
    pub kind: String,
    /// Rust type name of the value.
    pub value_type: String,
    /// One block per non-empty key group, ascending; each has `key_group` set.
    pub key_groups: Vec<BlockRef>,
}

/// How an operator (non-keyed) state is redistributed on restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedistributionMode {
    /// Flink's even split (list state): the elements are divided among the new subtasks.
    Split,
    /// Flink's union list state: every new subtask receives every element.
    Union,
    /// Broadcast state: every subtask holds the same copy.
    Broadcast,
}

impl std::fmt::Display for RedistributionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedistributionMode::Split => "split",
            RedistributionMode::Union => "union",
            RedistributionMode::Broadcast => "broadcast",
        })
    }
}

/// One operator (non-keyed) state of one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorStateHandle {
    /// The state's name.
    pub name: String,
    /// How it is redistributed on restore.
    pub mode: RedistributionMode,
    /// The elements, one block each, in order; `key_group` is `None`.
    pub elements: Vec<BlockRef>,
}

/// A byte range of a data file with its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockRef {
    /// The key group, for keyed state.
    pub key_group: Option<u32>,
    /// Offset of the first byte in the data file.
    pub offset: u64,
    /// Number of bytes.
    pub length: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub crc32: u32,
    /// Number of entries in the block (keys, or list items).
    pub entries: u64,
    /// Version 4: the block is in the subtask's shared file of this index (an incremental
    /// checkpoint), not in its `file`. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_file: Option<u32>,
    /// Version 5: the block is an entry delta of its key group (the keys removed and the
    /// entries written since the block before it in the list, which holds the same key
    /// group), applied over that one at restore; `entries` then counts the group's entries
    /// after it. Written only when `true`, in incremental checkpoints only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub delta: bool,
}

impl BlockRef {
    /// The byte range of the block in its data file.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.length)
    }

    /// "key group N" or "an operator-state element", for messages.
    fn describe(&self) -> String {
        match self.key_group {
            Some(group) => format!("key group {group}"),
            None => "an operator-state element".to_string(),
        }
    }
}

/// A snapshot file that cannot be used: corrupt, truncated, or from a newer weir.
///
/// Every message names the file and says the snapshot cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not parseable as a metadata document (truncated, invalid JSON, missing fields).
    #[error("{location} cannot be read ({reason}): the file is corrupt or truncated and the snapshot cannot be used")]
    Unreadable {
        /// The file.
        location: String,
        /// What the parser reported.
        reason: String,
    },
    /// The magic field is missing or wrong.
    #[error(
        "{location} is not a weir snapshot metadata file (magic {found}, expected \"weir-snapshot\"): the file is corrupt or not a weir snapshot, and the snapshot cannot be used"
    )]
    WrongMagic {
        /// The file.
        location: String,
        /// The magic found (JSON text).
        found: String,
    },
    /// Written by a newer weir.
    #[error(
        "{location} was written by a newer weir (format {version}); this weir reads format {FORMAT_VERSION}, so the snapshot cannot be used here: restore it with the newer weir"
    )]
    NewerVersion {
        /// The file.
        location: String,
        /// The version found.
        version: u64,
    },
    /// A version that was never written (0, or not a number).
    #[error(
        "{location} has invalid format version {version}: the file is corrupt or truncated and the snapshot cannot be used"
    )]
    InvalidVersion {
        /// The file.
        location: String,
        /// The version found (JSON text or number).
        version: String,
    },
    /// The metadata does not match its checksum.
    #[error(
        "{location} fails its checksum (recorded crc32 {expected:#010x}, computed {actual:#010x}): the file is corrupt or truncated and the snapshot cannot be used"
    )]
    ChecksumMismatch {
        /// The file.
        location: String,
        /// The recorded checksum.
        expected: u32,
        /// The checksum of the content.
        actual: u32,
    },
    /// The metadata parses but breaks the format's invariants.
    #[error("{location} is inconsistent: {reason}; the file is corrupt and the snapshot cannot be used")]
    Inconsistent {
        /// The file.
        location: String,
        /// The broken invariant.
        reason: String,
    },
    /// A data file's header is wrong.
    #[error(
        "{location} is not a weir snapshot data file ({reason}): the file is corrupt or truncated and the snapshot cannot be used"
    )]
    BadDataFile {
        /// The file.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// A block is out of the file's bounds, short, or fails its checksum.
    #[error(
        "{location}: the block of {what} at offset {offset} (length {length}) {problem}: the data file is corrupt or truncated and the snapshot cannot be used"
    )]
    BadBlock {
        /// The data file.
        location: String,
        /// "key group N" or "an operator-state element".
        what: String,
        /// The block's offset.
        offset: u64,
        /// The block's length.
        length: u64,
        /// What is wrong.
        problem: String,
    },
}

/// The `_metadata` envelope as written.
#[derive(Serialize)]
struct EnvelopeOut<'a> {
    magic: &'a str,
    format_version: u32,
    crc32: u32,
    metadata: &'a SnapshotMetadata,
}

/// The CRC-32 of the canonical serialization of `metadata`.
fn metadata_crc(metadata: &SnapshotMetadata) -> u32 {
    // Serializing plain structs (string keys, integers, strings) into a Vec cannot fail.
    let body = serde_json::to_vec(metadata).expect("snapshot metadata always serializes");
    crc32fast::hash(&body)
}

/// Encodes `metadata` as the bytes of a `_metadata` file (envelope with magic, version and checksum).
pub fn encode_metadata(metadata: &SnapshotMetadata) -> Bytes {
    let envelope = EnvelopeOut {
        magic: METADATA_MAGIC,
        format_version: metadata.format_version,
        crc32: metadata_crc(metadata),
        metadata,
    };
    // As above: plain structs always serialize.
    Bytes::from(serde_json::to_vec(&envelope).expect("snapshot metadata always serializes"))
}

/// Decodes and validates the bytes of a `_metadata` file; `location` names the file in errors.
///
/// Checks, in order: JSON syntax, magic, version (newer versions are refused), structure,
/// checksum, then the invariants of [`validate_metadata`].
pub fn decode_metadata(bytes: &[u8], location: &str) -> Result<SnapshotMetadata, FormatError> {
    let unreadable = |reason: String| FormatError::Unreadable { location: location.to_string(), reason };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|error| unreadable(format!("invalid JSON: {error}")))?;
    let serde_json::Value::Object(mut envelope) = value else {
        return Err(unreadable("the document is not a JSON object".into()));
    };
    match envelope.get("magic") {
        Some(serde_json::Value::String(magic)) if magic == METADATA_MAGIC => {}
        Some(other) => {
            return Err(FormatError::WrongMagic { location: location.to_string(), found: other.to_string() });
        }
        None => return Err(FormatError::WrongMagic { location: location.to_string(), found: "missing".into() }),
    }
    let version = match envelope.get("format_version") {
        Some(serde_json::Value::Number(number)) => number.as_u64(),
        _ => None,
    };
    match version {
        Some(version) if (u64::from(FORMAT_VERSION_OLDEST)..=u64::from(FORMAT_VERSION)).contains(&version) => {}
        Some(version) if version > u64::from(FORMAT_VERSION) => {
            return Err(FormatError::NewerVersion { location: location.to_string(), version });
        }
        _ => {
            let found = envelope.get("format_version").map_or_else(|| "missing".to_string(), ToString::to_string);
            return Err(FormatError::InvalidVersion { location: location.to_string(), version: found });
        }
    }
    let recorded = envelope
        .get("crc32")
        .and_then(serde_json::Value::as_u64)
        .and_then(|crc| u32::try_from(crc).ok())
        .ok_or_else(|| unreadable("the crc32 field is missing or not a 32-bit number".into()))?;
    let body = envelope.remove("metadata").ok_or_else(|| unreadable("the metadata field is missing".into()))?;
    let metadata: SnapshotMetadata =
        serde_json::from_value(body).map_err(|error| unreadable(format!("invalid metadata: {error}")))?;
    let actual = metadata_crc(&metadata);
    if actual != recorded {
        return Err(FormatError::ChecksumMismatch { location: location.to_string(), expected: recorded, actual });
    }
    if Some(u64::from(metadata.format_version)) != version {
        return Err(FormatError::Inconsistent {
            location: location.to_string(),
            reason: format!(
                "the metadata says format version {} but the envelope says {}",
                metadata.format_version,
                version.unwrap_or_default()
            ),
        });
    }
    validate_metadata(&metadata, location)?;
    Ok(metadata)
}

/// True for a `/`-separated relative name without empty, `.` or `..` segments.
fn is_relative_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\\')
        && name.split('/').all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

/// True for one path segment that names a file: not empty, no `/` or `\\`, not `.` or `..`.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.contains('\\') && name != "." && name != ".."
}

/// Checks the invariants a reader relies on (see the module documentation); `location`
/// names the metadata file in errors.
pub fn validate_metadata(metadata: &SnapshotMetadata, location: &str) -> Result<(), FormatError> {
    let fail = |reason: String| FormatError::Inconsistent { location: location.to_string(), reason };
    validate_versions(metadata).map_err(fail)?;
    let max_p = metadata.max_parallelism;
    if max_p == 0 || max_p > MAX_PARALLELISM_UPPER_BOUND {
        return Err(fail(format!("max parallelism {max_p} is outside 1..={MAX_PARALLELISM_UPPER_BOUND}")));
    }
    let mut uids = std::collections::BTreeSet::new();
    for operator in &metadata.operators {
        if !uids.insert(operator.uid.as_str()) {
            return Err(fail(format!("operator uid '{}' appears twice", operator.uid)));
        }
        validate_operator(operator, max_p).map_err(fail)?;
    }
    Ok(())
}

/// What each format version may hold: finished subtasks (2), native snapshots and a state
/// backend's name (3), shared files (4, checkpoints only), entry deltas (5, incremental).
fn validate_versions(metadata: &SnapshotMetadata) -> Result<(), String> {
    let version = metadata.format_version;
    if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "the metadata says format version {version}, not one of {FORMAT_VERSION_OLDEST}..={FORMAT_VERSION}"
        ));
    }
    let subtasks = || metadata.operators.iter().flat_map(|o| &o.subtasks);
    if version < 2 && subtasks().any(|s| s.finished) {
        return Err(format!("format version {version} has no finished subtasks"));
    }
    if version < 3 && (!metadata.format.is_canonical() || metadata.state_backend.is_some()) {
        return Err(format!("format version {version} has no native snapshots and no state backend name"));
    }
    let incremental = subtasks().any(|s| !s.shared_files.is_empty());
    if incremental && (version < 4 || metadata.kind != SnapshotKind::Checkpoint) {
        return Err(format!(
            "a {} of format version {version} names shared files; only checkpoints of version 4 and later do",
            metadata.kind
        ));
    }
    let deltas = subtasks().flat_map(|s| &s.keyed_states).flat_map(|state| &state.key_groups).any(|block| block.delta);
    if deltas && (version < 5 || !incremental) {
        return Err(format!(
            "a {} of format version {version} holds entry deltas; only incremental checkpoints of version 5 and later do",
            metadata.kind
        ));
    }
    Ok(())
}

/// One operator: its parallelism and subtask entries, and each subtask's files and state,
/// with every state of one name of the same kind (keyed) or mode (operator state) in all
/// subtasks.
fn validate_operator(operator: &OperatorSnapshot, max_p: u32) -> Result<(), String> {
    let (uid, p) = (&operator.uid, operator.parallelism);
    if p == 0 || p > max_p {
        return Err(format!("operator '{uid}' has parallelism {p}, outside 1..={max_p} (the max parallelism)"));
    }
    if operator.subtasks.len() != p as usize {
        return Err(format!("operator '{uid}' has parallelism {p} but {} subtask entries", operator.subtasks.len()));
    }
    let mut keyed_kinds: std::collections::BTreeMap<&str, (&str, &str)> = std::collections::BTreeMap::new();
    let mut modes: std::collections::BTreeMap<&str, RedistributionMode> = std::collections::BTreeMap::new();
    for (index, subtask) in operator.subtasks.iter().enumerate() {
        let at = SubtaskAt { uid, text: format!("operator '{uid}' subtask {index}"), subtask };
        if subtask.subtask as usize != index {
            return Err(format!("{} is recorded as subtask {}", at.text, subtask.subtask));
        }
        let range = subtask_key_groups(&at, operator.key_type.is_some(), max_p, p)?;
        validate_files(&at)?;
        validate_keyed_states(&at, range, &mut keyed_kinds)?;
        validate_operator_states(&at, &mut modes)?;
    }
    Ok(())
}

/// A subtask entry being checked, and how errors name it.
struct SubtaskAt<'a> {
    uid: &'a str,
    text: String,
    subtask: &'a SubtaskSnapshot,
}

/// The key groups the subtask owns: those its index owns at this parallelism (keyed), or
/// none (it must then hold no keyed state).
fn subtask_key_groups(at: &SubtaskAt, keyed: bool, max_p: u32, p: u32) -> Result<KeyGroupRange, String> {
    let subtask = at.subtask;
    if !keyed {
        if subtask.key_group_range.is_some() || !subtask.keyed_states.is_empty() {
            return Err(format!("{} has keyed state or key groups but the operator has no key type", at.text));
        }
        return Ok(KeyGroupRange::EMPTY);
    }
    let expected = compute_key_group_range_for_operator_index(max_p, p, subtask.subtask);
    if subtask.key_group_range != Some(expected) {
        let found = subtask.key_group_range.map_or_else(|| "none".to_string(), |range| range.to_string());
        return Err(format!(
            "{} has key groups {found}, but with max parallelism {max_p} and parallelism {p} it owns {expected}",
            at.text
        ));
    }
    Ok(expected)
}

/// Its data file and shared files are names inside the snapshot (and its `shared/`).
fn validate_files(at: &SubtaskAt) -> Result<(), String> {
    if let Some(file) = &at.subtask.file
        && !is_relative_name(file)
    {
        return Err(format!("{} names data file '{file}', which is not a name relative to the snapshot", at.text));
    }
    for name in &at.subtask.shared_files {
        if !is_plain_file_name(name) {
            return Err(format!("{} names shared file '{name}', which is not a plain file name", at.text));
        }
    }
    Ok(())
}

/// A state block lies in a file the subtask names, past the data file's header.
fn validate_block(at: &SubtaskAt, block: &BlockRef, what: &str) -> Result<(), String> {
    let shared = at.subtask.shared_files.len();
    match block.shared_file {
        Some(index) if index as usize >= shared => {
            return Err(format!("{} state '{what}': a block names shared file {index} of {shared}", at.text));
        }
        None if at.subtask.file.is_none() => return Err(format!("{} has state blocks but no data file", at.text)),
        _ => {}
    }
    if block.offset < DATA_HEADER_LEN || block.offset.checked_add(block.length).is_none() {
        return Err(format!(
            "{} state '{what}': block at offset {} length {} lies outside a data file",
            at.text, block.offset, block.length
        ));
    }
    Ok(())
}

/// Keyed states: each name once, of one kind across subtasks; blocks in key-group order
/// within `range`, an entry delta only after a block of its key group.
fn validate_keyed_states<'a>(
    at: &SubtaskAt<'a>,
    range: KeyGroupRange,
    kinds: &mut std::collections::BTreeMap<&'a str, (&'a str, &'a str)>,
) -> Result<(), String> {
    let (uid, text) = (at.uid, &at.text);
    let mut names = std::collections::BTreeSet::new();
    for state in &at.subtask.keyed_states {
        let name = &state.name;
        if !names.insert(name.as_str()) {
            return Err(format!("{text} has keyed state '{name}' twice"));
        }
        let found = (state.kind.as_str(), state.value_type.as_str());
        if *kinds.entry(name).or_insert(found) != found {
            return Err(format!(
                "keyed state '{name}' of operator '{uid}' has different kinds or value types in different subtasks"
            ));
        }
        let mut previous: Option<u32> = None;
        for block in &state.key_groups {
            validate_block(at, block, name)?;
            let Some(group) = block.key_group else {
                return Err(format!("{text} keyed state '{name}' has a block without a key group"));
            };
            if !range.contains(group) {
                return Err(format!("{text} keyed state '{name}' has key group {group}, outside its range {range}"));
            }
            if block.delta {
                if previous != Some(group) {
                    return Err(format!(
                        "{text} keyed state '{name}' has an entry delta of key group {group} that follows no block of that key group"
                    ));
                }
            } else if previous.is_some_and(|previous| previous >= group) {
                return Err(format!(
                    "{text} keyed state '{name}' lists key groups out of order or twice (key group {group})"
                ));
            }
            previous = Some(group);
        }
    }
    Ok(())
}

/// Operator states: each name once, of one redistribution mode across subtasks, with no
/// key groups.
fn validate_operator_states<'a>(
    at: &SubtaskAt<'a>,
    modes: &mut std::collections::BTreeMap<&'a str, RedistributionMode>,
) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    for state in &at.subtask.operator_states {
        let name = &state.name;
        if !names.insert(name.as_str()) {
            return Err(format!("{} has operator state '{name}' twice", at.text));
        }
        if *modes.entry(name).or_insert(state.mode) != state.mode {
            return Err(format!(
                "operator state '{name}' of operator '{}' has different modes in different subtasks",
                at.uid
            ));
        }
        for block in &state.elements {
            validate_block(at, block, name)?;
            if block.key_group.is_some() {
                return Err(format!("{} operator state '{name}' has a block with a key group", at.text));
            }
        }
    }
    Ok(())
}

/// Builds a data file in memory: header, then blocks appended one after another.
#[derive(Debug)]
pub struct DataFileWriter {
    buffer: Vec<u8>,
    /// Bytes already handed out by [`DataFileWriter::take_chunk`].
    flushed: u64,
    blocks: usize,
}

impl Default for DataFileWriter {
    fn default() -> Self {
        DataFileWriter::new()
    }
}

impl DataFileWriter {
    /// An empty data file (just the header).
    pub fn new() -> DataFileWriter {
        let mut buffer = Vec::with_capacity(4096);
        buffer.extend_from_slice(DATA_MAGIC);
        buffer.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        DataFileWriter { buffer, flushed: 0, blocks: 0 }
    }

    /// Appends a block and returns its reference (offset, length, CRC-32).
    pub fn add_block(&mut self, bytes: &[u8], key_group: Option<u32>, entries: u64) -> BlockRef {
        let offset = self.len();
        self.buffer.extend_from_slice(bytes);
        self.blocks += 1;
        BlockRef {
            key_group,
            offset,
            length: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
            entries,
            shared_file: None,
            delta: false,
        }
    }

    /// Appends a block that `write` encodes straight into the file's buffer (no copy), and
    /// returns its reference; on an error nothing is appended.
    pub fn add_block_with<E>(
        &mut self,
        key_group: Option<u32>,
        entries: u64,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<BlockRef, E> {
        let offset = self.len();
        let start = self.buffer.len();
        if let Err(error) = write(&mut self.buffer) {
            self.buffer.truncate(start);
            return Err(error);
        }
        let bytes = &self.buffer[start..];
        self.blocks += 1;
        Ok(BlockRef {
            key_group,
            offset,
            length: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
            entries,
            shared_file: None,
            delta: false,
        })
    }

    /// Current length of the file in bytes, header included.
    pub fn len(&self) -> u64 {
        self.flushed + self.buffer.len() as u64
    }

    /// The bytes buffered so far, once there are at least `min` of them, to be written out
    /// while the file grows (they are the file's next bytes).
    pub fn take_chunk(&mut self, min: usize) -> Option<Vec<u8>> {
        if self.buffer.len() < min {
            return None;
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(min + min / 4));
        self.flushed += chunk.len() as u64;
        Some(chunk)
    }

    /// True when no block has been added.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// The file's (remaining) bytes.
    pub fn finish(self) -> Bytes {
        Bytes::from(self.buffer)
    }
}

/// Checks a data file's header (the first [`DATA_HEADER_LEN`] bytes or more).
pub fn check_data_header(bytes: &[u8], location: &str) -> Result<(), FormatError> {
    let bad = |reason: String| Err(FormatError::BadDataFile { location: location.to_string(), reason });
    if (bytes.len() as u64) < DATA_HEADER_LEN {
        return bad(format!("{} bytes, shorter than the {DATA_HEADER_LEN}-byte header", bytes.len()));
    }
    if &bytes[..8] != DATA_MAGIC {
        return bad("the file does not start with WEIRDATA".into());
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version > FORMAT_VERSION {
        return Err(FormatError::NewerVersion { location: location.to_string(), version: u64::from(version) });
    }
    if version == 0 {
        return bad("format version 0".into());
    }
    Ok(())
}

/// Checks that `bytes` (a block fetched by range) has the block's length and CRC-32.
pub fn verify_block(bytes: &[u8], block: &BlockRef, location: &str) -> Result<(), FormatError> {
    let bad = |problem: String| {
        Err(FormatError::BadBlock {
            location: location.to_string(),
            what: block.describe(),
            offset: block.offset,
            length: block.length,
            problem,
        })
    };
    if bytes.len() as u64 != block.length {
        return bad(format!("has only {} bytes", bytes.len()));
    }
    let actual = crc32fast::hash(bytes);
    if actual != block.crc32 {
        return bad(format!("has crc32 {actual:#010x} but the metadata records {:#010x}", block.crc32));
    }
    Ok(())
}

/// The error for a block that ends past the end of its `file_len`-byte data file.
pub(crate) fn block_past_end(block: &BlockRef, file_len: u64, location: &str) -> FormatError {
    FormatError::BadBlock {
        location: location.to_string(),
        what: block.describe(),
        offset: block.offset,
        length: block.length,
        problem: format!("lies beyond the end of the {file_len}-byte file"),
    }
}

/// The error for a block that starts inside a data file's header.
pub(crate) fn block_in_header(block: &BlockRef, location: &str) -> FormatError {
    FormatError::BadBlock {
        location: location.to_string(),
        what: block.describe(),
        offset: block.offset,
        length: block.length,
        problem: format!("starts inside the {DATA_HEADER_LEN}-byte header"),
    }
}

/// The verified bytes of `block` from a whole data file's bytes.
pub fn read_block<'a>(file: &'a [u8], block: &BlockRef, location: &str) -> Result<&'a [u8], FormatError> {
    let end = block.offset.checked_add(block.length).filter(|end| *end <= file.len() as u64);
    let Some(end) = end else {
        return Err(block_past_end(block, file.len() as u64, location));
    };
    let bytes = &file[block.offset as usize..end as usize];
    verify_block(bytes, block, location)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{SnapshotSpec, arb_spec, build_snapshot};
    use proptest::prelude::*;

    const LOCATION: &str = "memory://t/job/chk-1/_metadata";

    fn sample() -> SnapshotMetadata {
        build_snapshot(&SnapshotSpec::sample()).0
    }

    /// No single allocation of a decode may be larger: far above any test document.
    const ALLOCATION_CAP: usize = 64 << 20;

    /// The path (array index or object key) of every number in `value`.
    fn number_paths(
        value: &serde_json::Value,
        at: &mut Vec<Result<usize, String>>,
        out: &mut Vec<Vec<Result<usize, String>>>,
    ) {
        match value {
            serde_json::Value::Number(_) => out.push(at.clone()),
            serde_json::Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    at.push(Ok(index));
                    number_paths(item, at, out);
                    at.pop();
                }
            }
            serde_json::Value::Object(fields) => {
                for (key, item) in fields {
                    at.push(Err(key.clone()));
                    number_paths(item, at, out);
                    at.pop();
                }
            }
            _ => {}
        }
    }

    /// What a reader does with decoded metadata: plan a restore at the recorded parallelisms
    /// (at most 4) and at 1, inspect it, list its shared files; errors are fine.
    fn use_metadata(metadata: &SnapshotMetadata) -> Result<(), TestCaseError> {
        for cap in [4, 1] {
            let request = crate::restore::RestoreRequest {
                operators: metadata
                    .operators
                    .iter()
                    .map(|old| crate::restore::NewOperator {
                        uid: old.uid.clone(),
                        parallelism: old.parallelism.clamp(1, cap),
                        keyed: old.key_type.is_some(),
                        inputs: Vec::new(),
                    })
                    .collect(),
                max_parallelism: None,
                allow_non_restored_state: true,
            };
            let _ = crate::restore::plan_restore(metadata, &request);
        }
        let _ = crate::inspect::inspect_text(metadata, LOCATION);
        let _ = crate::inspect::inspect_json(metadata, LOCATION);
        let _ = crate::dispose::shared_files_of(metadata);
        Ok(())
    }

    #[test]
    fn round_trip_and_envelope_shape() {
        let metadata = sample();
        let bytes = encode_metadata(&metadata);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["magic"], "weir-snapshot");
        assert_eq!(value["format_version"], 5);
        assert_eq!(value["metadata"]["kind"], "savepoint");
        assert_eq!(value["metadata"]["operators"][0]["subtasks"][0]["operator_states"][0]["mode"], "split");
        assert_eq!(value["metadata"]["state_backend"], "hashmap");
        assert!(value["metadata"].get("format").is_none(), "canonical is not written");
        assert_eq!(decode_metadata(&bytes, LOCATION).unwrap(), metadata);
        // Version 3's native snapshots.
        let native = SnapshotMetadata { format: SnapshotFormat::Native, ..metadata };
        let bytes = encode_metadata(&native);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["metadata"]["format"], "NATIVE");
        assert_eq!(decode_metadata(&bytes, LOCATION).unwrap(), native);
        // An older version cannot say it.
        let old = SnapshotMetadata { format_version: 2, ..native };
        let error = decode_metadata(&encode_metadata(&old), LOCATION).unwrap_err();
        assert!(error.to_string().contains("format version 2 has no native snapshots"), "{error}");
    }

    #[test]
    fn every_single_byte_corruption_is_an_error_naming_the_file() {
        let bytes = encode_metadata(&sample()).to_vec();
        for position in 0..bytes.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut corrupt = bytes.clone();
                corrupt[position] ^= flip;
                match decode_metadata(&corrupt, LOCATION) {
                    Err(error) => {
                        let message = error.to_string();
                        assert!(message.contains(LOCATION), "{message}");
                        assert!(message.contains("cannot be used"), "{message}");
                    }
                    Ok(_) => panic!("corruption at byte {position} (xor {flip:#x}) was not detected"),
                }
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error_naming_the_file() {
        let bytes = encode_metadata(&sample());
        for length in 0..bytes.len() {
            let error = decode_metadata(&bytes[..length], LOCATION).unwrap_err();
            assert!(error.to_string().contains(LOCATION), "{error}");
            assert!(error.to_string().contains("corrupt or truncated"), "{error}");
        }
    }

    #[test]
    fn wrong_magic_newer_version_and_checksum() {
        let metadata = sample();
        let mut value: serde_json::Value = serde_json::from_slice(&encode_metadata(&metadata)).unwrap();
        let original = value.clone();

        value["magic"] = "flink".into();
        let error = decode_metadata(&serde_json::to_vec(&value).unwrap(), LOCATION).unwrap_err();
        assert!(matches!(error, FormatError::WrongMagic { .. }), "{error}");

        let mut value = original.clone();
        value["format_version"] = 7.into();
        let error = decode_metadata(&serde_json::to_vec(&value).unwrap(), LOCATION).unwrap_err();
        assert!(error.to_string().contains("written by a newer weir (format 7); this weir reads format 5"), "{error}");

        let mut value = original.clone();
        value["metadata"]["job_name"] = "renamed".into();
        let error = decode_metadata(&serde_json::to_vec(&value).unwrap(), LOCATION).unwrap_err();
        assert!(matches!(error, FormatError::ChecksumMismatch { .. }), "{error}");

        assert!(matches!(decode_metadata(b"[1,2]", LOCATION), Err(FormatError::Unreadable { .. })));
    }

    #[test]
    fn invariants_are_checked() {
        let good = sample();
        let mut cases: Vec<(SnapshotMetadata, &str)> = Vec::new();

        let mut bad = good.clone();
        bad.operators[1].subtasks.pop();
        cases.push((bad, "subtask entries"));

        let mut bad = good.clone();
        bad.operators[1].subtasks[0].key_group_range = Some(KeyGroupRange::new(0, 1));
        cases.push((bad, "it owns"));

        let mut bad = good.clone();
        bad.operators[1].subtasks.swap(0, 1);
        cases.push((bad, "recorded as subtask"));

        let mut bad = good.clone();
        bad.operators[1].subtasks[0].file = Some("../../etc/passwd".into());
        cases.push((bad, "not a name relative"));

        let mut bad = good.clone();
        bad.operators[1].subtasks[0].keyed_states[0].key_groups[0].key_group = Some(good.max_parallelism - 1);
        cases.push((bad, "outside its range"));

        // Entry deltas are in incremental checkpoints only, each after a block of its own
        // key group.
        let mut bad = good.clone();
        bad.operators[1].subtasks[0].keyed_states[0].key_groups[0].delta = true;
        cases.push((bad, "holds entry deltas"));
        let mut incremental = good.clone();
        incremental.kind = SnapshotKind::Checkpoint;
        let subtask = &mut incremental.operators[1].subtasks[0];
        subtask.shared_files = vec!["chk-1-task-1-0.state".into()];
        subtask.file = None;
        for block in subtask.keyed_states.iter_mut().flat_map(|s| s.key_groups.iter_mut()) {
            block.shared_file = Some(0);
        }
        for block in subtask.operator_states.iter_mut().flat_map(|s| s.elements.iter_mut()) {
            block.shared_file = Some(0);
        }
        validate_metadata(&incremental, LOCATION).unwrap();
        let mut chained = incremental.clone();
        let groups = &mut chained.operators[1].subtasks[0].keyed_states[0].key_groups;
        groups.insert(1, BlockRef { delta: true, ..groups[0] });
        groups.insert(2, BlockRef { delta: true, ..groups[0] });
        validate_metadata(&chained, LOCATION).unwrap();
        let mut bad = incremental.clone();
        bad.operators[1].subtasks[0].keyed_states[0].key_groups[0].delta = true;
        cases.push((bad, "follows no block of that key group"));
        let mut bad = incremental.clone();
        let groups = &mut bad.operators[1].subtasks[0].keyed_states[0].key_groups;
        let delta = BlockRef { delta: true, key_group: groups[0].key_group.map(|g| g + 1), ..groups[0] };
        groups.insert(1, delta);
        cases.push((bad, "follows no block of that key group"));

        let mut bad = good.clone();
        bad.operators[1].uid = bad.operators[0].uid.clone();
        cases.push((bad, "appears twice"));

        let mut bad = good.clone();
        bad.operators[0].parallelism = good.max_parallelism + 1;
        cases.push((bad, "outside 1..="));

        for (metadata, expected) in cases {
            let error = decode_metadata(&encode_metadata(&metadata), LOCATION).unwrap_err();
            assert!(matches!(error, FormatError::Inconsistent { .. }), "{error}");
            assert!(error.to_string().contains(expected), "{error} should mention {expected}");
            assert!(error.to_string().contains(LOCATION), "{error}");
        }
    }

    #[test]
    fn data_blocks_are_checked() {
        let mut writer = DataFileWriter::new();
        assert!(writer.is_empty());
        assert_eq!(writer.len(), DATA_HEADER_LEN);
        let first = writer.add_block(b"hello", Some(3), 1);
        let second = writer.add_block(b"", None, 0);
        let third = writer.add_block(b"world!", None, 2);
        assert_eq!(first.offset, DATA_HEADER_LEN);
        assert_eq!(second.offset, DATA_HEADER_LEN + 5);
        assert_eq!(third.range(), DATA_HEADER_LEN + 5..DATA_HEADER_LEN + 11);
        let file = writer.finish();
        let location = "/tmp/sp/task-0-0.state";
        check_data_header(&file, location).unwrap();
        assert_eq!(read_block(&file, &first, location).unwrap(), b"hello");
        assert_eq!(read_block(&file, &second, location).unwrap(), b"");
        assert_eq!(read_block(&file, &third, location).unwrap(), b"world!");
        verify_block(&file[third.offset as usize..], &third, location).unwrap();

        let mut corrupt = file.to_vec();
        corrupt[first.offset as usize + 1] ^= 0x40;
        let error = read_block(&corrupt, &first, location).unwrap_err().to_string();
        assert!(error.contains(location) && error.contains("key group 3") && error.contains("corrupt"), "{error}");

        let error = read_block(&file[..file.len() - 1], &third, location).unwrap_err().to_string();
        assert!(error.contains("operator-state element") && error.contains("beyond the end"), "{error}");
        let error = verify_block(&file[third.offset as usize..file.len() - 2], &third, location).unwrap_err();
        assert!(error.to_string().contains("has only 4 bytes"), "{error}");

        assert!(check_data_header(&file[..11], location).unwrap_err().to_string().contains(location));
        let mut wrong = file.to_vec();
        wrong[0] = b'X';
        assert!(matches!(check_data_header(&wrong, location), Err(FormatError::BadDataFile { .. })));
        wrong[0] = b'W';
        wrong[8] = 6;
        assert!(matches!(check_data_header(&wrong, location), Err(FormatError::NewerVersion { version: 6, .. })));
        wrong[8] = 1;
        check_data_header(&wrong, location).unwrap();
    }

    #[test]
    fn version_1_files_are_read_and_finished_subtasks_need_version_2() {
        let mut metadata = sample();
        metadata.format_version = 1;
        metadata.state_backend = None;
        let bytes = encode_metadata(&metadata);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["format_version"], 1);
        assert!(!String::from_utf8_lossy(&bytes).contains("finished"), "false is not written");
        assert_eq!(decode_metadata(&bytes, LOCATION).unwrap(), metadata);

        metadata.operators[0].subtasks[0].finished = true;
        let error = decode_metadata(&encode_metadata(&metadata), LOCATION).unwrap_err();
        assert!(error.to_string().contains("has no finished subtasks"), "{error}");
        metadata.format_version = 2;
        let decoded = decode_metadata(&encode_metadata(&metadata), LOCATION).unwrap();
        assert!(decoded.operators[0].subtasks[0].finished);
        assert!(!decoded.operators[0].is_fully_finished() || decoded.operators[0].subtasks.len() == 1);

        // The envelope and the body must agree on the version.
        let mut value: serde_json::Value = serde_json::from_slice(&encode_metadata(&metadata)).unwrap();
        value["format_version"] = 1.into();
        let error = decode_metadata(&serde_json::to_vec(&value).unwrap(), LOCATION).unwrap_err();
        assert!(error.to_string().contains("but the envelope says 1"), "{error}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Also version 4's incremental checkpoints, whose subtasks name shared files
        /// instead of a data file of their own.
        #[test]
        fn metadata_round_trips(spec in arb_spec(), native in any::<bool>(), shared in any::<bool>()) {
            let (mut metadata, _files) = build_snapshot(&spec);
            if native {
                metadata.format = SnapshotFormat::Native;
            }
            if shared {
                crate::testutil::move_blocks_to_shared(&mut metadata, |uid, index| {
                    vec![format!("chk-7-task-{uid}-{index}.state")]
                });
            }
            validate_metadata(&metadata, LOCATION).unwrap();
            let decoded = decode_metadata(&encode_metadata(&metadata), LOCATION).unwrap();
            prop_assert_eq!(decoded, metadata);
        }

        /// A valid `_metadata` with flipped, inserted, deleted or truncated bytes, or a huge
        /// varint-like run written in: an error naming the file, or a document that passes
        /// validation; never a panic or an allocation of a claimed size.
        #[test]
        fn mutated_metadata_bytes_decode_or_fail_cleanly(
            spec in arb_spec(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let (metadata, _files) = build_snapshot(&spec);
            let bytes = weir_types::fuzzing::mutate(&encode_metadata(&metadata), &mutations);
            let result = weir_types::fuzzing::with_allocation_cap(ALLOCATION_CAP, || decode_metadata(&bytes, LOCATION));
            match result {
                Err(refused) => prop_assert!(false, "decoding asked for {} bytes at once", refused),
                Ok(Err(error)) => prop_assert!(error.to_string().contains(LOCATION), "{}", error),
                Ok(Ok(decoded)) => use_metadata(&decoded)?,
            }
        }

        /// A valid `_metadata` whose numbers (offsets, lengths, counts, parallelisms, key
        /// groups, shared-file indexes, versions) are set to huge or odd values, with the
        /// checksum recomputed so the document gets past it: decoding, planning a restore,
        /// inspecting and listing shared files are errors or results, never a panic or an
        /// allocation of a claimed size.
        #[test]
        fn metadata_with_crafted_numbers_and_a_valid_checksum_is_checked(
            spec in arb_spec(),
            incremental in any::<bool>(),
            crafted in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u64>()), 1..5),
        ) {
            let (metadata, _files) = build_snapshot(&spec);
            let mut document: serde_json::Value = serde_json::from_slice(&encode_metadata(&metadata)).unwrap();
            if incremental {
                // An incremental subtask: a shared file and a block that names it.
                let subtasks = document["metadata"]["operators"].as_array_mut().unwrap().iter_mut()
                    .flat_map(|operator| operator["subtasks"].as_array_mut().unwrap().iter_mut());
                for subtask in subtasks {
                    let Some(group) = subtask["keyed_states"].get_mut(0).and_then(|s| s["key_groups"].get_mut(0)) else { continue };
                    group["shared_file"] = serde_json::json!(0);
                    subtask["shared_files"] = serde_json::json!(["0000000000000001-a.bin"]);
                    break;
                }
            }
            for (which, value_index, seed) in crafted {
                let mut numbers = Vec::new();
                number_paths(&document["metadata"], &mut Vec::new(), &mut numbers);
                prop_assume!(!numbers.is_empty());
                let path = &numbers[which.index(numbers.len())];
                let odd = [serde_json::json!(seed), serde_json::json!(-1), serde_json::json!(0), serde_json::json!(u32::MAX)];
                let value = match value_index.index(weir_types::fuzzing::HUGE.len() + odd.len()) {
                    i if i < weir_types::fuzzing::HUGE.len() => serde_json::json!(weir_types::fuzzing::HUGE[i]),
                    i => odd[i - weir_types::fuzzing::HUGE.len()].clone(),
                };
                let mut at = &mut document["metadata"];
                for step in path {
                    at = match step {
                        Ok(index) => &mut at[*index],
                        Err(key) => &mut at[key.as_str()],
                    };
                }
                *at = value;
            }
            if let Ok(crafted) = serde_json::from_value::<SnapshotMetadata>(document["metadata"].clone()) {
                document["crc32"] = serde_json::json!(metadata_crc(&crafted));
            }
            let bytes = serde_json::to_vec(&document).unwrap();
            let result = weir_types::fuzzing::with_allocation_cap(ALLOCATION_CAP, || {
                decode_metadata(&bytes, LOCATION).map(|decoded| use_metadata(&decoded))
            });
            match result {
                Err(refused) => prop_assert!(false, "decoding asked for {} bytes at once", refused),
                Ok(Err(error)) => prop_assert!(error.to_string().contains(LOCATION), "{}", error),
                Ok(Ok(used)) => used?,
            }
        }

        #[test]
        fn every_recorded_block_verifies(spec in arb_spec()) {
            let (metadata, files) = build_snapshot(&spec);
            for operator in &metadata.operators {
                for subtask in &operator.subtasks {
                    let Some(file) = &subtask.file else { continue };
                    let bytes = &files[file];
                    check_data_header(bytes, file).unwrap();
                    let blocks = subtask.keyed_states.iter().flat_map(|state| &state.key_groups)
                        .chain(subtask.operator_states.iter().flat_map(|state| &state.elements));
                    for block in blocks {
                        read_block(bytes, block, file).unwrap();
                    }
                }
            }
        }
    }
}
