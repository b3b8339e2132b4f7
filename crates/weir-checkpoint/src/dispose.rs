//! Deleting a snapshot directory safely (`weir savepoint --dispose PATH`).

use std::collections::BTreeSet;

use crate::format::SnapshotMetadata;
use crate::paths::{CHECKPOINT_DIR_PREFIX, METADATA_FILE, shared_file_checkpoint};
use crate::storage::{SnapshotStorage, StorageError};
use crate::{LoadError, load_metadata};

/// What a disposal removed and what it left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disposed {
    /// Bytes removed (`_metadata` and the data files it names).
    pub bytes: u64,
    /// Objects under the directory that the snapshot does not name: left in place.
    pub left: Vec<String>,
    /// Files of the job's `shared/` directory deleted with it (an incremental checkpoint's
    /// files that no other complete checkpoint of the job uses).
    pub shared_deleted: u64,
}

/// The files of the job's `shared/` directory that a snapshot's blocks use.
pub fn shared_files_of(metadata: &SnapshotMetadata) -> BTreeSet<String> {
    metadata
        .operators
        .iter()
        .flat_map(|operator| &operator.subtasks)
        .flat_map(|subtask| subtask.used_shared_files())
        .map(str::to_string)
        .collect()
}

/// The shared files that the complete checkpoints (`chk-<n>` with a `_metadata`) in the
/// job directory `job_dir` use. A checkpoint whose `_metadata` cannot be read is an error:
/// what it uses is unknown, so nothing may be deleted.
pub async fn live_shared_files(job_dir: &SnapshotStorage) -> Result<BTreeSet<String>, LoadError> {
    let mut live = BTreeSet::new();
    for name in job_dir.list_dirs().await? {
        if !name.starts_with(CHECKPOINT_DIR_PREFIX) {
            continue;
        }
        match load_metadata(&job_dir.child(&name)).await {
            Ok(metadata) => live.extend(shared_files_of(&metadata)),
            Err(LoadError::Storage(StorageError::NotASnapshot { .. })) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(live)
}

/// Deletes the files of the job directory's `shared/` that no complete checkpoint uses and
/// that a checkpoint older than `below` wrote (younger ones may still be in flight): what a
/// crash between writing a file and completing, or between completing and deleting, left.
/// Returns how many files went.
pub async fn sweep_shared(job_dir: &SnapshotStorage, below: u64) -> Result<u64, LoadError> {
    let shared = job_dir.child(crate::paths::SHARED_DIR);
    if below == u64::MAX {
        // No write of this job is in flight: unfinished local writes go too.
        shared.remove_local_staging_files()?;
    }
    let files = shared.list_all().await?;
    if files.is_empty() {
        return Ok(0);
    }
    let live = live_shared_files(job_dir).await?;
    let mut deleted = 0;
    for (name, _) in files {
        let old_enough = shared_file_checkpoint(&name).is_some_and(|id| id < below);
        if old_enough && !name.contains('/') && !live.contains(&name) {
            shared.delete(&name).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes the snapshot at `storage`: its `_metadata` and exactly the data files it names.
///
/// The metadata is read and checked first: a directory without `_metadata`, or with one that
/// is not a valid weir snapshot, is refused and nothing is deleted. `_metadata` goes first, so
/// an interrupted disposal leaves an incomplete snapshot that is never read again, then the
/// data files, then the directory itself when nothing else is left in it (Flink's order).
/// Files the snapshot does not name are left and listed.
pub async fn dispose(storage: &SnapshotStorage) -> Result<Disposed, LoadError> {
    let metadata = load_metadata(storage).await?;
    let mut named: BTreeSet<&str> = BTreeSet::new();
    for subtask in metadata.operators.iter().flat_map(|operator| &operator.subtasks) {
        if let Some(file) = &subtask.file {
            named.insert(file.as_str());
        }
    }
    let objects = storage.list_all().await?;
    let metadata_bytes = objects.iter().find(|(name, _)| name == METADATA_FILE).map_or(0, |(_, size)| *size);
    storage.delete(METADATA_FILE).await?;
    let mut bytes = metadata_bytes;
    let mut left = Vec::new();
    for (name, size) in &objects {
        if name == METADATA_FILE {
            continue;
        }
        if named.contains(name.as_str()) {
            storage.delete(name).await?;
            bytes += size;
        } else {
            left.push(name.clone());
        }
    }
    storage.remove_empty_local_dirs()?;
    // An incremental checkpoint: its shared files that no other complete checkpoint of the
    // job uses go too (its own `_metadata` is gone, so it no longer counts).
    let mine = shared_files_of(&metadata);
    let mut shared_deleted = 0;
    if !mine.is_empty() {
        let job_dir = storage.parent();
        let live = live_shared_files(&job_dir).await?;
        let shared = storage.shared_dir();
        for name in mine.difference(&live) {
            match shared.delete(name).await {
                Ok(()) | Err(StorageError::NotFound { .. }) => shared_deleted += 1,
                Err(error) => return Err(error.into()),
            }
        }
    }
    tracing::info!(snapshot = %storage.display(), bytes, left = left.len(), shared_deleted, "snapshot disposed");
    Ok(Disposed { bytes, left, shared_deleted })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::encode_metadata;
    use crate::storage::StorageError;
    use crate::testutil::{SnapshotSpec, build_snapshot};
    use bytes::Bytes;

    #[tokio::test]
    async fn refuses_a_directory_without_metadata_or_with_junk_metadata() {
        let temp = tempfile::tempdir().unwrap();
        let storage = SnapshotStorage::from_url(temp.path().to_str().unwrap()).unwrap();
        storage.put("precious.txt", Bytes::from_static(b"keep me")).await.unwrap();
        let error = dispose(&storage).await.unwrap_err();
        assert!(matches!(error, LoadError::Storage(StorageError::NotASnapshot { .. })), "{error}");
        let message = error.to_string();
        assert!(message.starts_with("not a weir snapshot directory: no _metadata in "), "{message}");
        storage.put(METADATA_FILE, Bytes::from_static(b"not json")).await.unwrap();
        let error = dispose(&storage).await.unwrap_err();
        assert!(matches!(error, LoadError::Format(_)), "{error}");
        assert!(temp.path().join("precious.txt").exists());
        assert!(temp.path().join(METADATA_FILE).exists());
    }

    #[tokio::test]
    async fn deletes_metadata_and_the_files_it_names_and_leaves_the_rest() {
        let temp = tempfile::tempdir().unwrap();
        let base = SnapshotStorage::from_url(temp.path().to_str().unwrap()).unwrap();
        let snapshot = base.child("savepoint-012345-abcdefabcdef");
        let (metadata, files) = build_snapshot(&SnapshotSpec::sample());
        let mut expected = 0;
        for (name, bytes) in &files {
            snapshot.put(name, bytes.clone()).await.unwrap();
            expected += bytes.len() as u64;
        }
        let encoded = encode_metadata(&metadata);
        expected += encoded.len() as u64;
        snapshot.put(METADATA_FILE, encoded).await.unwrap();
        snapshot.put("notes/mine.txt", Bytes::from_static(b"not the snapshot's")).await.unwrap();
        base.put("other/_metadata", Bytes::from_static(b"x")).await.unwrap();
        let disposed = dispose(&snapshot).await.unwrap();
        assert_eq!(disposed, Disposed { bytes: expected, left: vec!["notes/mine.txt".to_string()], shared_deleted: 0 });
        let dir = temp.path().join("savepoint-012345-abcdefabcdef");
        assert!(dir.join("notes/mine.txt").exists());
        assert!(!dir.join(METADATA_FILE).exists());
        assert!(temp.path().join("other/_metadata").exists());

        // With nothing else in it, the directory goes too.
        let memory = SnapshotStorage::from_url("memory://dispose-tests/chk-1").unwrap();
        for (name, bytes) in &files {
            memory.put(name, bytes.clone()).await.unwrap();
        }
        memory.put(METADATA_FILE, encode_metadata(&metadata)).await.unwrap();
        assert!(dispose(&memory).await.unwrap().left.is_empty());
        assert!(matches!(dispose(&memory).await, Err(LoadError::Storage(StorageError::NotASnapshot { .. }))));
        let plain = temp.path().join("plain");
        let local = SnapshotStorage::from_url(plain.to_str().unwrap()).unwrap();
        for (name, bytes) in &files {
            local.put(name, bytes.clone()).await.unwrap();
        }
        local.put(METADATA_FILE, encode_metadata(&metadata)).await.unwrap();
        dispose(&local).await.unwrap();
        assert!(!plain.exists());
    }
}
