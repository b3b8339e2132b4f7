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
pub mod leftovers;
pub mod paths;
pub mod restore;
pub mod retained;
pub mod rewrite;
pub mod storage;

#[cfg(test)]
mod testutil;

/// Decoders under test may not allocate a claimed size: see [`weir_types::fuzzing`].
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: weir_types::fuzzing::CappedAlloc = weir_types::fuzzing::CappedAlloc;

use bytes::Bytes;

pub use dispose::{Disposed, dispose, live_shared_files, shared_files_of, sweep_shared};
pub use format::SnapshotFormat;
pub use format::{
    BlockRef, DataFileWriter, FORMAT_VERSION, FormatError, KeyedStateHandle, OperatorSnapshot, OperatorStateHandle,
    RedistributionMode, SnapshotKind, SnapshotMetadata, SubtaskSnapshot, check_data_header, decode_metadata,
    encode_metadata, read_block, validate_metadata, verify_block,
};
pub use inspect::{inspect_json, inspect_text};
pub use leftovers::{JOB_LOCK_FILE, JobDirLock, SweptJobs, sweep_dead_jobs};
pub use paths::METADATA_FILE;
pub use restore::{NewOperator, RestoreError, RestorePlan, RestoreRequest, SubtaskRestore, plan_restore};
pub use retained::newest_complete_checkpoint_from;
pub use rewrite::{RewriteError, rewrite_max_parallelism};
pub use storage::{BlockingStorage, SnapshotStorage, StorageError, StreamingWrite, io_runtime};

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

/// The largest `_metadata` read, in bytes (a job at max parallelism 32768 with a dozen keyed
/// states writes a few tens of MB): a larger file is refused before it is read.
pub const METADATA_BYTES_MAX: u64 = 512 << 20;

/// Reads and validates the `_metadata` of the snapshot directory `storage`.
///
/// A missing `_metadata` is [`StorageError::NotASnapshot`].
pub async fn load_metadata(storage: &SnapshotStorage) -> Result<SnapshotMetadata, LoadError> {
    match storage.size(METADATA_FILE).await {
        Ok(size) if size > METADATA_BYTES_MAX => {
            return Err(FormatError::Unreadable {
                location: storage.location(METADATA_FILE),
                reason: format!("{size} bytes, more than the {METADATA_BYTES_MAX} a metadata file may have"),
            }
            .into());
        }
        Ok(_) | Err(StorageError::NotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
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
///
/// Every range is checked against the file's real size before anything is read, so a crafted
/// offset or length (2^36, 2^63 - 1) is an error naming the block, never an allocation of
/// that size.
pub async fn read_blocks(storage: &SnapshotStorage, file: &str, blocks: &[BlockRef]) -> Result<Vec<Bytes>, LoadError> {
    // A block of an incremental checkpoint may be in the job's shared directory.
    let (storage, file) = storage.resolve(file);
    let (storage, file) = (&storage, file.as_str());
    let location = storage.location(file);
    let size = storage.size(file).await?;
    let header = storage.get_range(file, 0..size.min(format::DATA_HEADER_LEN)).await?;
    check_data_header(&header, &location)?;
    let mut ranges = Vec::with_capacity(blocks.len());
    for block in blocks {
        match block.offset.checked_add(block.length) {
            Some(end) if block.offset >= format::DATA_HEADER_LEN && end <= size => ranges.push(block.offset..end),
            Some(end) if end <= size => return Err(format::block_in_header(block, &location).into()),
            _ => return Err(format::block_past_end(block, size, &location).into()),
        }
    }
    let fetched = storage.get_ranges(file, &ranges).await?;
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

    /// Every block reference of `metadata`, with its file.
    fn all_blocks(metadata: &SnapshotMetadata) -> Vec<(String, BlockRef)> {
        let mut blocks = Vec::new();
        for subtask in metadata.operators.iter().flat_map(|operator| &operator.subtasks) {
            let Some(file) = &subtask.file else { continue };
            let refs = subtask
                .keyed_states
                .iter()
                .flat_map(|state| state.key_groups.iter().copied())
                .chain(subtask.operator_states.iter().flat_map(|state| state.elements.iter().copied()));
            blocks.extend(refs.map(|block| (file.clone(), block)));
        }
        blocks
    }

    /// Writes `spec`'s snapshot to a fresh in-memory directory.
    fn store(
        spec: &SnapshotSpec,
        name: &str,
    ) -> (SnapshotStorage, SnapshotMetadata, std::collections::BTreeMap<String, Bytes>) {
        let (metadata, files) = build_snapshot(spec);
        let snapshot = SnapshotStorage::from_url(&format!("memory://crafted-{name}/sp")).unwrap();
        let blocking = snapshot.blocking();
        for (file, bytes) in &files {
            blocking.put(file, bytes.clone()).unwrap();
        }
        (snapshot, metadata, files)
    }

    #[test]
    fn a_crafted_huge_block_length_is_refused_before_anything_is_read() {
        let (snapshot, metadata, _) = store(&SnapshotSpec::sample(), "huge");
        let (file, block) = all_blocks(&metadata).remove(0);
        for length in [1u64 << 36, (1u64 << 63) - 1, u64::MAX] {
            let crafted = BlockRef { length, ..block };
            let error = snapshot.blocking().block_on(read_blocks(&snapshot, &file, &[crafted])).unwrap_err();
            assert!(matches!(error, LoadError::Format(FormatError::BadBlock { .. })), "{error}");
            assert!(error.to_string().contains(&format!("length {length}")), "{error}");
        }
        let inside_header = BlockRef { offset: 2, length: 3, ..block };
        let error = snapshot.blocking().block_on(read_blocks(&snapshot, &file, &[inside_header])).unwrap_err();
        assert!(error.to_string().contains("inside the 12-byte header"), "{error}");
    }

    #[test]
    fn an_oversized_metadata_file_is_refused_by_its_size() {
        let snapshot = SnapshotStorage::from_url("memory://crafted-metadata-size/sp").unwrap();
        let blocking = snapshot.blocking();
        blocking.put(METADATA_FILE, Bytes::from(vec![b' '; (METADATA_BYTES_MAX + 1) as usize])).unwrap();
        let error = blocking.block_on(load_metadata(&snapshot)).unwrap_err();
        assert!(error.to_string().contains("more than the"), "{error}");
    }

    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The mutation tests' allocator is installed: a request above the cap is refused.
    #[test]
    fn the_allocation_cap_is_installed() {
        let refused =
            weir_types::fuzzing::with_allocation_cap(1 << 20, || Vec::<u8>::new().try_reserve_exact(1 << 30).is_err());
        assert_eq!(refused, Err(1 << 30));
        assert_eq!(weir_types::fuzzing::with_allocation_cap(1 << 20, || vec![0u8; 1 << 10].len()), Ok(1 << 10));
    }

    static CASE: AtomicU64 = AtomicU64::new(0);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// A crafted snapshot: valid checksums, any offsets and lengths. Reading is an error
        /// or the real bytes, never a panic or an allocation of the claimed size.
        #[test]
        fn crafted_block_references_are_errors_or_the_real_bytes(
            spec in crate::testutil::arb_spec(),
            wild in proptest::collection::vec((any::<prop::sample::Index>(), prop_oneof![Just(0u64), Just(11), Just(1 << 36), Just(u64::MAX), any::<u64>(), 0u64..200]), 1..6),
        ) {
            let name = CASE.fetch_add(1, Ordering::Relaxed).to_string();
            let (snapshot, metadata, files) = store(&spec, &name);
            let blocks = all_blocks(&metadata);
            prop_assume!(!blocks.is_empty());
            for (index, value) in wild {
                let (file, mut block) = blocks[index.index(blocks.len())].clone();
                if value % 2 == 0 { block.offset = value } else { block.length = value }
                let result = snapshot.blocking().block_on(read_blocks(&snapshot, &file, &[block]));
                if let Ok(read) = result {
                    prop_assert_eq!(read[0].clone(), Bytes::copy_from_slice(read_block(&files[&file], &block, &file).unwrap()));
                }
            }
        }

        /// Flipped bits anywhere in a data file: every block read is an error or unchanged.
        #[test]
        fn corrupted_data_files_never_yield_wrong_bytes(
            spec in crate::testutil::arb_spec(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        ) {
            let name = CASE.fetch_add(1, Ordering::Relaxed).to_string();
            let (snapshot, metadata, files) = store(&spec, &name);
            let blocks = all_blocks(&metadata);
            prop_assume!(!blocks.is_empty());
            let (file, _) = &blocks[0];
            let mut corrupt = files[file].to_vec();
            for (index, flip) in &flips {
                let at = index.index(corrupt.len());
                corrupt[at] ^= flip;
            }
            snapshot.blocking().put(file, Bytes::from(corrupt)).unwrap();
            let mine: Vec<BlockRef> = blocks.iter().filter(|(f, _)| f == file).map(|(_, b)| *b).collect();
            if let Ok(read) = snapshot.blocking().block_on(read_blocks(&snapshot, file, &mine)) {
                for (block, bytes) in mine.iter().zip(read) {
                    prop_assert_eq!(bytes, Bytes::copy_from_slice(read_block(&files[file], block, file).unwrap()));
                }
            }
        }

        /// Arbitrary bytes as `_metadata`: an error naming the file, never a panic.
        #[test]
        fn arbitrary_metadata_bytes_are_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Err(error) = decode_metadata(&bytes, "memory://x/_metadata") {
                prop_assert!(error.to_string().contains("memory://x/_metadata"));
            }
        }
    }
}
