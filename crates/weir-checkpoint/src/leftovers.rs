//! What a job that died leaves in its checkpoint directory, and who may remove it.
//!
//! A job that crashes mid-checkpoint leaves a `chk-<n>` without `_metadata` and, with
//! incremental checkpoints, `shared/` files no complete checkpoint names. Nothing reads them
//! again, but only a process that knows the job is gone may delete them: a running job's
//! checkpoint in flight looks the same.
//!
//! On a local file system a running job therefore holds an exclusive lock on
//! [`JOB_LOCK_FILE`] in its directory ([`JobDirLock`]) and deletes that file when it ends. A
//! lock file nobody holds marks a job that did not end: the next job that starts with the
//! same `state.checkpoints.dir` removes that job's leftovers ([`sweep_dead_jobs`]), keeping
//! every complete checkpoint and every file one names, and then the lock file. Object stores
//! have no locks: their leftovers stay for the user (or a CLAIM restore) to remove, as in
//! Flink.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;

use crate::paths::METADATA_FILE;
use crate::storage::{SnapshotStorage, StorageError};
use crate::{LoadError, sweep_shared};

/// The lock file a running job holds in its checkpoint directory.
pub const JOB_LOCK_FILE: &str = ".weir-job.lock";

/// A running job's hold on its local checkpoint directory; [`Self::release`] at its end.
#[derive(Debug)]
pub struct JobDirLock {
    path: PathBuf,
    file: File,
}

impl JobDirLock {
    /// Creates the job directory and locks its [`JOB_LOCK_FILE`]; `None` for an object store
    /// (no locks there) or when another process holds the lock (the job runs elsewhere, say
    /// after a JobManager failover whose old process still lives).
    pub fn acquire(job_dir: &SnapshotStorage) -> Result<Option<JobDirLock>, StorageError> {
        let Some(directory) = job_dir.local_directory() else { return Ok(None) };
        let io_error = |source| StorageError::LocalDir { location: directory.to_string_lossy().into_owned(), source };
        std::fs::create_dir_all(&directory).map_err(io_error)?;
        let path = directory.join(JOB_LOCK_FILE);
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io_error)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(JobDirLock { path, file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(io_error(source)),
        }
    }

    /// The job ended: its directory holds nothing a sweep should remove.
    pub fn release(self) {
        // Removed while still locked, so no sweep takes a finished job for a dead one.
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(file = %self.path.display(), %error, "cannot remove the job's lock file");
        }
        drop(self.file);
    }
}

/// What [`sweep_dead_jobs`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweptJobs {
    /// Job directories whose leftovers went.
    pub jobs: Vec<String>,
    /// Incomplete `chk-<n>` directories removed.
    pub incomplete_checkpoints: u64,
    /// `shared/` files removed.
    pub shared_files: u64,
}

/// Removes the leftovers of the jobs under `root` (`state.checkpoints.dir`) that hold a
/// [`JOB_LOCK_FILE`] no process has locked, other than `own_job`: their incomplete
/// `chk-<n>` directories and the `shared/` files no complete checkpoint names. A directory
/// without a lock file (a job that ended, or one with high availability, whose new leader
/// sweeps its own) is left alone. Only local directories are swept.
pub async fn sweep_dead_jobs(root: &SnapshotStorage, own_job: &str) -> Result<SweptJobs, LoadError> {
    let mut swept = SweptJobs::default();
    let Some(root_dir) = root.local_directory() else { return Ok(swept) };
    for name in root.list_dirs().await? {
        if name == own_job {
            continue;
        }
        let lock_path = root_dir.join(&name).join(JOB_LOCK_FILE);
        let Ok(lock) = OpenOptions::new().write(true).open(&lock_path) else { continue };
        if lock.try_lock().is_err() {
            // Running (or being swept by another starting job).
            continue;
        }
        let job_dir = root.child(&name);
        for checkpoint in job_dir.list_dirs().await? {
            if !checkpoint.starts_with("chk-") {
                continue;
            }
            let dir = job_dir.child(&checkpoint);
            if !dir.exists(METADATA_FILE).await? {
                dir.delete_all().await?;
                dir.remove_empty_local_dirs()?;
                swept.incomplete_checkpoints += 1;
            }
        }
        swept.shared_files += sweep_shared(&job_dir, u64::MAX).await?;
        if let Err(error) = std::fs::remove_file(&lock_path) {
            tracing::warn!(file = %lock_path.display(), %error, "cannot remove a dead job's lock file");
        }
        swept.jobs.push(name);
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn storage(dir: &std::path::Path) -> SnapshotStorage {
        SnapshotStorage::from_url(&format!("file://{}", dir.display())).unwrap()
    }

    #[test]
    fn a_dead_job_s_leftovers_go_and_a_running_or_ended_job_s_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = storage(dir.path());
        let runtime = crate::io_runtime();
        let job = |name: &str| root.child(name);
        // A dead job: a complete chk-1 naming one shared file, an incomplete chk-2, and a
        // shared file only chk-2 wrote.
        let dead = job("dead");
        let lock = JobDirLock::acquire(&dead).unwrap().unwrap();
        drop(lock.file); // the process died: the lock file stays, unlocked
        runtime.block_on(async {
            let metadata = crate::testutil::metadata_naming_shared(&["chk-1-task-0-0.state"]);
            dead.child("chk-1").put(METADATA_FILE, Bytes::from(metadata)).await.unwrap();
            dead.child("chk-2").put("task-0-0.state", Bytes::from_static(b"x")).await.unwrap();
            dead.child("shared").put("chk-1-task-0-0.state", Bytes::from_static(b"a")).await.unwrap();
            dead.child("shared").put("chk-2-task-0-0.state", Bytes::from_static(b"b")).await.unwrap();
        });
        // A running job with the same kind of files, and a job that ended cleanly.
        let running = job("running");
        let held = JobDirLock::acquire(&running).unwrap().unwrap();
        let ended = job("ended");
        JobDirLock::acquire(&ended).unwrap().unwrap().release();
        runtime.block_on(async {
            for other in [&running, &ended] {
                other.child("chk-2").put("task-0-0.state", Bytes::from_static(b"x")).await.unwrap();
                other.child("shared").put("chk-2-task-0-0.state", Bytes::from_static(b"b")).await.unwrap();
            }
        });

        let swept = runtime.block_on(sweep_dead_jobs(&root, "mine")).unwrap();
        assert_eq!(swept, SweptJobs { jobs: vec!["dead".into()], incomplete_checkpoints: 1, shared_files: 1 });
        assert!(dir.path().join("dead/chk-1/_metadata").exists());
        assert!(dir.path().join("dead/shared/chk-1-task-0-0.state").exists());
        assert!(!dir.path().join("dead/chk-2").exists());
        assert!(!dir.path().join("dead/shared/chk-2-task-0-0.state").exists());
        assert!(!dir.path().join("dead").join(JOB_LOCK_FILE).exists());
        for other in ["running", "ended"] {
            assert!(dir.path().join(other).join("chk-2/task-0-0.state").exists(), "{other}");
            assert!(dir.path().join(other).join("shared/chk-2-task-0-0.state").exists(), "{other}");
        }
        // A second start finds nothing more to do; the running job's lock still works.
        assert_eq!(runtime.block_on(sweep_dead_jobs(&root, "mine")).unwrap(), SweptJobs::default());
        assert!(JobDirLock::acquire(&running).unwrap().is_none());
        held.release();
        assert!(!dir.path().join("running").join(JOB_LOCK_FILE).exists());
    }

    #[test]
    fn object_stores_are_not_locked_or_swept() {
        let root = SnapshotStorage::from_url("memory://weir/checkpoints").unwrap();
        assert!(JobDirLock::acquire(&root.child("job")).unwrap().is_none());
        assert_eq!(crate::io_runtime().block_on(sweep_dead_jobs(&root, "job")).unwrap(), SweptJobs::default());
    }
}
