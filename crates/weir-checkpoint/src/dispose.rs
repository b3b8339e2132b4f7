//! Deleting a snapshot directory safely (`weir savepoint --dispose PATH`).

use std::collections::BTreeSet;

use crate::paths::METADATA_FILE;
use crate::storage::SnapshotStorage;
use crate::{LoadError, load_metadata};

/// What a disposal removed and what it left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disposed {
    /// Bytes removed (`_metadata` and the data files it names).
    pub bytes: u64,
    /// Objects under the directory that the snapshot does not name: left in place.
    pub left: Vec<String>,
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
    tracing::info!(snapshot = %storage.display(), bytes, left = left.len(), "snapshot disposed");
    Ok(Disposed { bytes, left })
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
        assert_eq!(disposed, Disposed { bytes: expected, left: vec!["notes/mine.txt".to_string()] });
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
