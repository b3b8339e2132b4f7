//! Deleting a snapshot directory safely (`weir savepoint --dispose PATH`, retained-checkpoint cleanup).

use crate::paths::METADATA_FILE;
use crate::storage::{SnapshotStorage, StorageError};

/// Deletes the snapshot at `storage` and returns the bytes removed.
///
/// Refuses a directory without `_metadata` (it is not a snapshot, or not a complete one, and
/// may be something else entirely). Deletes `_metadata` first, so an interrupted disposal
/// leaves an incomplete snapshot that is never read again, then the data files, then the
/// directory itself (Flink's order).
pub async fn dispose(storage: &SnapshotStorage) -> Result<u64, StorageError> {
    if !storage.exists(METADATA_FILE).await? {
        return Err(StorageError::NotASnapshot { location: storage.display().to_string() });
    }
    let objects = storage.list_all().await?;
    let metadata_bytes = objects.iter().find(|(name, _)| name == METADATA_FILE).map_or(0, |(_, size)| *size);
    storage.delete(METADATA_FILE).await?;
    let rest = storage.delete_all().await?;
    tracing::info!(snapshot = %storage.display(), bytes = metadata_bytes + rest, "snapshot disposed");
    Ok(metadata_bytes + rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn refuses_a_directory_without_metadata() {
        let temp = tempfile::tempdir().unwrap();
        let storage = SnapshotStorage::from_url(temp.path().to_str().unwrap()).unwrap();
        storage.put("precious.txt", Bytes::from_static(b"keep me")).await.unwrap();
        let error = dispose(&storage).await.unwrap_err();
        assert!(matches!(error, StorageError::NotASnapshot { .. }), "{error}");
        let message = error.to_string();
        assert!(message.starts_with("not a weir snapshot directory: no _metadata in "), "{message}");
        assert!(message.contains(temp.path().to_str().unwrap()), "{message}");
        assert!(temp.path().join("precious.txt").exists());
    }

    #[tokio::test]
    async fn deletes_metadata_data_and_directory() {
        let temp = tempfile::tempdir().unwrap();
        let base = SnapshotStorage::from_url(temp.path().to_str().unwrap()).unwrap();
        let snapshot = base.child("savepoint-012345-abcdefabcdef");
        snapshot.put(METADATA_FILE, Bytes::from_static(b"{}")).await.unwrap();
        snapshot.put("task-0-0.state", Bytes::from_static(b"WEIRDATA0000")).await.unwrap();
        base.put("other/_metadata", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(dispose(&snapshot).await.unwrap(), 14);
        assert!(!temp.path().join("savepoint-012345-abcdefabcdef").exists());
        assert!(temp.path().join("other/_metadata").exists());

        let memory = SnapshotStorage::from_url("memory://dispose-tests/chk-1").unwrap();
        memory.put(METADATA_FILE, Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(dispose(&memory).await.unwrap(), 2);
        assert!(matches!(dispose(&memory).await, Err(StorageError::NotASnapshot { .. })));
    }
}
