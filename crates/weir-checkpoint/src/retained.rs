//! The newest complete checkpoint beside one that may already be gone: a running job
//! completes a checkpoint every interval and retention deletes the one it subsumed, so a
//! `chk-<n>` observed a moment ago can vanish before a process reads it. Its successors in
//! the same job directory hold at least as much.

use crate::paths::CHECKPOINT_DIR_PREFIX;
use crate::{SnapshotStorage, load_metadata};

/// The id `n` when `location` names a checkpoint directory `.../chk-<n>`.
pub fn checkpoint_id_of_location(location: &str) -> Option<u64> {
    let (_, name) = location.trim_end_matches('/').rsplit_once('/')?;
    name.strip_prefix(CHECKPOINT_DIR_PREFIX)?.parse().ok()
}

/// The newest `chk-<m>` with `m >= n` beside `location` (`.../chk-<n>`) whose `_metadata`
/// reads, as a URL; `None` when `location` is no checkpoint directory or no such checkpoint
/// is left. Any store `state.checkpoints.dir` accepts.
pub async fn newest_complete_checkpoint_from(location: &str) -> Option<String> {
    let observed = checkpoint_id_of_location(location)?;
    let job_dir = SnapshotStorage::from_url(location).ok()?.parent();
    let mut ids: Vec<u64> = job_dir
        .list_dirs()
        .await
        .ok()?
        .iter()
        .filter_map(|name| name.strip_prefix(CHECKPOINT_DIR_PREFIX)?.parse().ok())
        .filter(|id| *id >= observed)
        .collect();
    ids.sort_unstable();
    for id in ids.into_iter().rev() {
        let dir = job_dir.child(&crate::paths::checkpoint_dir_name(id));
        if load_metadata(&dir).await.is_ok() {
            return Some(dir.url().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{FORMAT_VERSION, SnapshotKind, SnapshotMetadata, encode_metadata};

    fn metadata(id: u64) -> Vec<u8> {
        encode_metadata(&SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind: SnapshotKind::Checkpoint,
            job_id: "0123456789abcdef0123456789abcdef".into(),
            job_name: "job".into(),
            checkpoint_id: id,
            timestamp_ms: 1,
            max_parallelism: 128,
            operators: Vec::new(),
            format: crate::SnapshotFormat::Native,
            state_backend: Some("hashmap".into()),
        })
        .to_vec()
    }

    #[test]
    fn a_subsumed_checkpoint_gives_way_to_its_newest_complete_successor() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("0123456789abcdef0123456789abcdef");
        for id in [3, 5, 7, 8] {
            std::fs::create_dir_all(job.join(format!("chk-{id}"))).unwrap();
        }
        for id in [3, 5, 7] {
            std::fs::write(job.join(format!("chk-{id}/_metadata")), metadata(id)).unwrap();
        }
        let url = |id: u64| format!("file://{}/chk-{id}", job.display());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // chk-8 was begun, never completed; chk-4 is gone: chk-7 is the newest complete one.
        assert_eq!(runtime.block_on(newest_complete_checkpoint_from(&url(4))), Some(url(7)));
        assert_eq!(runtime.block_on(newest_complete_checkpoint_from(&url(7))), Some(url(7)));
        assert_eq!(runtime.block_on(newest_complete_checkpoint_from(&url(9))), None);
        let savepoint = format!("file://{}/savepoint-012345-abcdefabcdef", dir.path().display());
        assert_eq!(runtime.block_on(newest_complete_checkpoint_from(&savepoint)), None);
        assert_eq!(checkpoint_id_of_location("s3://b/c/job/chk-12/"), Some(12));
    }
}
