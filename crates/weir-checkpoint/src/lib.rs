//! weir's snapshots: where they live, their canonical on-disk format, and restore planning.
//!
//! Checkpoints and savepoints share one format ([`format`](mod@format)): a directory with a checksummed
//! `_metadata` file and data files, every reference relative to the directory, so a snapshot
//! can be moved or copied as a whole. [`storage`] reaches any location (local directory,
//! in-memory, S3) through `object_store`; [`paths`] is the only place snapshot paths are
//! built; [`restore`] decides, without I/O, which new subtask reads which bytes; [`inspect`]
//! renders a snapshot for people; [`dispose()`] deletes one safely.
#![warn(missing_docs)]

pub mod dispose;
pub mod format;
pub mod inspect;
pub mod paths;
pub mod restore;
pub mod rewrite;
pub mod storage;

#[cfg(test)]
mod testutil;

use bytes::Bytes;

pub use dispose::dispose;
pub use format::{
    BlockRef, DataFileWriter, FORMAT_VERSION, FormatError, KeyedStateHandle, OperatorSnapshot, OperatorStateHandle,
    RedistributionMode, SnapshotKind, SnapshotMetadata, SubtaskSnapshot, check_data_header, decode_metadata,
    encode_metadata, read_block, validate_metadata, verify_block,
};
pub use inspect::{inspect_json, inspect_text};
pub use paths::METADATA_FILE;
pub use restore::{NewOperator, RestoreError, RestorePlan, RestoreRequest, SubtaskRestore, plan_restore};
pub use rewrite::{RewriteError, rewrite_max_parallelism};
pub use storage::{BlockingStorage, SnapshotStorage, StorageError, io_runtime};

/// Reading a snapshot failed: the storage could not be read, or what was read is not valid.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The storage failed (missing object, unreachable store).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The bytes are corrupt, truncated or from a newer weir.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Reads and validates the `_metadata` of the snapshot directory `storage`.
///
/// A missing `_metadata` is [`StorageError::NotASnapshot`].
pub async fn load_metadata(storage: &SnapshotStorage) -> Result<SnapshotMetadata, LoadError> {
    let bytes = match storage.get(METADATA_FILE).await {
        Ok(bytes) => bytes,
        Err(StorageError::NotFound { .. }) => {
            return Err(StorageError::NotASnapshot { location: storage.display().to_string() }.into());
        }
        Err(error) => return Err(error.into()),
    };
    Ok(decode_metadata(&bytes, &storage.location(METADATA_FILE))?)
}

/// Writes `metadata` as the `_metadata` of the snapshot directory `storage`.
///
/// Write it after every data file: a directory without `_metadata` is an incomplete snapshot.
pub async fn write_metadata(storage: &SnapshotStorage, metadata: &SnapshotMetadata) -> Result<(), StorageError> {
    storage.put(METADATA_FILE, encode_metadata(metadata)).await
}

/// Reads `blocks` of the data file `file` (relative to the snapshot directory `storage`) by
/// range, checking the file's header and each block's length and CRC-32.
pub async fn read_blocks(storage: &SnapshotStorage, file: &str, blocks: &[BlockRef]) -> Result<Vec<Bytes>, LoadError> {
    let location = storage.location(file);
    let mut ranges = Vec::with_capacity(blocks.len() + 1);
    ranges.push(0..format::DATA_HEADER_LEN);
    ranges.extend(blocks.iter().map(BlockRef::range));
    let fetched = match storage.get_ranges(file, &ranges).await {
        Ok(fetched) => fetched,
        Err(StorageError::Io { .. }) => {
            // A range past the end of the file is a truncated (corrupt) file: say so precisely.
            let size = storage.size(file).await?;
            let header = storage.get_range(file, 0..size.min(format::DATA_HEADER_LEN)).await?;
            check_data_header(&header, &location)?;
            if let Some(block) = blocks.iter().find(|block| block.range().end > size) {
                return Err(format::block_past_end(block, size, &location).into());
            }
            // Not a truncation: report the storage failure itself.
            storage.get_ranges(file, &ranges).await?
        }
        Err(error) => return Err(error.into()),
    };
    let mut fetched = fetched.into_iter();
    let header = fetched.next().unwrap_or_default();
    check_data_header(&header, &location)?;
    let mut out = Vec::with_capacity(blocks.len());
    for (block, bytes) in blocks.iter().zip(fetched) {
        verify_block(&bytes, block, &location)?;
        out.push(bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{SnapshotSpec, build_snapshot};

    #[tokio::test]
    async fn write_then_load_and_read_every_block() {
        let temp = tempfile::tempdir().unwrap();
        let (metadata, files) = build_snapshot(&SnapshotSpec::sample());
        let dir = paths::new_savepoint_dir_name(&metadata.job_id);
        let snapshot = SnapshotStorage::from_url(temp.path().to_str().unwrap()).unwrap().child(&dir);
        for (name, bytes) in &files {
            snapshot.put(name, bytes.clone()).await.unwrap();
        }
        write_metadata(&snapshot, &metadata).await.unwrap();

        // Relocatable: move the directory and read it from its new place.
        let moved = temp.path().join("moved");
        std::fs::rename(temp.path().join(&dir), &moved).unwrap();
        let snapshot = SnapshotStorage::from_url(moved.to_str().unwrap()).unwrap();
        let loaded = load_metadata(&snapshot).await.unwrap();
        assert_eq!(loaded, metadata);
        for subtask in loaded.operators.iter().flat_map(|operator| &operator.subtasks) {
            let Some(file) = &subtask.file else { continue };
            let blocks: Vec<BlockRef> = subtask
                .keyed_states
                .iter()
                .flat_map(|state| state.key_groups.iter().copied())
                .chain(subtask.operator_states.iter().flat_map(|state| state.elements.iter().copied()))
                .collect();
            let read = read_blocks(&snapshot, file, &blocks).await.unwrap();
            for (block, bytes) in blocks.iter().zip(read) {
                assert_eq!(bytes, read_block(&files[file], block, file).unwrap());
            }
        }

        // A corrupted data file is reported with its full location.
        let (name, bytes) = files.iter().next().unwrap();
        let mut corrupt = bytes.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        snapshot.put(name, Bytes::from(corrupt)).await.unwrap();
        let subtask =
            loaded.operators.iter().flat_map(|o| &o.subtasks).find(|s| s.file.as_ref() == Some(name)).unwrap();
        let blocks: Vec<BlockRef> = subtask
            .keyed_states
            .iter()
            .flat_map(|state| state.key_groups.iter().copied())
            .chain(subtask.operator_states.iter().flat_map(|state| state.elements.iter().copied()))
            .collect();
        let error = read_blocks(&snapshot, name, &blocks).await.unwrap_err().to_string();
        assert!(error.contains(&snapshot.location(name)) && error.contains("corrupt"), "{error}");

        // A truncated data file is reported as such, naming the file and the block.
        snapshot.put(name, bytes.slice(..bytes.len() - 1)).await.unwrap();
        let error = read_blocks(&snapshot, name, &blocks).await.unwrap_err();
        assert!(matches!(error, LoadError::Format(FormatError::BadBlock { .. })), "{error}");
        let message = error.to_string();
        assert!(message.contains(&snapshot.location(name)) && message.contains("beyond the end"), "{message}");
        snapshot.put(name, bytes.slice(..5)).await.unwrap();
        let error = read_blocks(&snapshot, name, &blocks).await.unwrap_err();
        assert!(matches!(error, LoadError::Format(FormatError::BadDataFile { .. })), "{error}");

        // A directory without _metadata is not a snapshot.
        let error = load_metadata(&snapshot.child("nope")).await.unwrap_err();
        assert!(error.to_string().starts_with("not a weir snapshot directory"), "{error}");
    }
}
