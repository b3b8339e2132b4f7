//! What the controller reaches besides its store and its cluster backend: the clock, waiting,
//! the clusters' REST APIs, the snapshots in storage and the crash points of the kill tests.
//! An operator process has [`RealWorld`]; the deterministic simulation (issue 28) gives the
//! real controller a simulated one, with two operators acting on it at once.

use std::time::Duration;

use crate::cluster_api::{ClusterApi, JobView, SavepointState};

/// A cluster's REST API, as the controller uses it (Flink's paths in [`ClusterApi`]).
pub trait JobsApi: Send {
    /// Every job of the cluster: (id, state).
    fn jobs(&self) -> Result<Vec<(String, String)>, String>;
    /// One job; `None` when the cluster does not know it.
    fn job(&self, job_id: &str) -> Result<Option<JobView>, String>;
    /// The job's newest failure.
    fn root_exception(&self, job_id: &str) -> Option<String>;
    /// Stop-with-savepoint into `directory`: the request id.
    fn stop_with_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String>;
    /// A savepoint into `directory`, the job going on: the request id.
    fn trigger_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String>;
    /// Where a savepoint request is.
    fn savepoint(&self, job_id: &str, request_id: &str) -> Result<SavepointState, String>;
    /// Cancels the job.
    fn cancel(&self, job_id: &str) -> Result<(), String>;
}

impl JobsApi for ClusterApi {
    fn jobs(&self) -> Result<Vec<(String, String)>, String> {
        ClusterApi::jobs(self)
    }
    fn job(&self, job_id: &str) -> Result<Option<JobView>, String> {
        ClusterApi::job(self, job_id)
    }
    fn root_exception(&self, job_id: &str) -> Option<String> {
        ClusterApi::root_exception(self, job_id)
    }
    fn stop_with_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        ClusterApi::stop_with_savepoint(self, job_id, directory)
    }
    fn trigger_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        ClusterApi::trigger_savepoint(self, job_id, directory)
    }
    fn savepoint(&self, job_id: &str, request_id: &str) -> Result<SavepointState, String> {
        ClusterApi::savepoint(self, job_id, request_id)
    }
    fn cancel(&self, job_id: &str) -> Result<(), String> {
        ClusterApi::cancel(self, job_id)
    }
}

/// The controller's world.
pub trait World: Send + Sync {
    /// Wall-clock milliseconds since the epoch.
    fn now_ms(&self) -> u64;
    /// Waits (between polls and retries).
    fn sleep(&self, duration: Duration);
    /// The REST API of the cluster at `rest_address`.
    fn jobs_api(&self, rest_address: &str) -> Box<dyn JobsApi>;
    /// Whether the snapshot at `location` is still there (its `_metadata` reads).
    fn snapshot_exists(&self, location: &str) -> bool;
    /// The newest `chk-<n>` of job `job_id` under the checkpoints root `root` whose
    /// `_metadata` reads, if any.
    fn newest_complete_checkpoint(&self, root: &str, job_id: &str) -> Option<String>;
    /// The checkpoint to restore for a last observed `chk-<n>` at `location`: itself while
    /// it is there, else the newest complete `chk-<m>` beside it (`m > n`); other locations
    /// as they are.
    fn newest_retained(&self, location: &str) -> String;
    /// The newest savepoint of job `job_id` in the savepoint directory `dir`, by checkpoint
    /// id (savepoints take ids from the job's checkpoint sequence): (id, location).
    fn newest_savepoint_of(&self, dir: &str, job_id: &str) -> Option<(u64, String)>;
    /// Deletes the snapshot at `location`.
    fn dispose(&self, location: &str) -> Result<(), String>;
    /// A named point where the kill tests may end the process.
    fn crash_point(&self, name: &str);
    /// A fresh job id (32 hexadecimal characters) for a job about to be submitted.
    fn new_job_id(&self) -> String;
    /// The controller's leadership check just passed and it acts next: the two are one step
    /// (the simulation does not freeze an operator between them; the window is the
    /// microseconds between a check and a system call, see `fence`).
    fn acting_next(&self) {}
}

/// The operator process's world: the system clock, real sleeps, HTTP, object storage.
pub struct RealWorld;

impl World for RealWorld {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn jobs_api(&self, rest_address: &str) -> Box<dyn JobsApi> {
        Box::new(ClusterApi::new(rest_address))
    }

    fn snapshot_exists(&self, location: &str) -> bool {
        snapshot_exists(location)
    }

    fn newest_complete_checkpoint(&self, root: &str, job_id: &str) -> Option<String> {
        newest_complete_checkpoint(root, job_id)
    }

    fn newest_retained(&self, location: &str) -> String {
        newest_retained(location)
    }

    fn newest_savepoint_of(&self, dir: &str, job_id: &str) -> Option<(u64, String)> {
        newest_savepoint_of(dir, job_id)
    }

    fn dispose(&self, location: &str) -> Result<(), String> {
        let storage = weir_checkpoint::SnapshotStorage::from_url(location).map_err(|e| e.to_string())?;
        let blocking = storage.blocking();
        blocking.block_on(weir_checkpoint::dispose(&storage)).map(|_| ()).map_err(|e| e.to_string())
    }

    fn crash_point(&self, name: &str) {
        weir_runtime::crash::point(name);
    }

    fn new_job_id(&self) -> String {
        weir_types::JobId::generate().to_string()
    }
}

/// Between two observations a newer checkpoint may complete and retention delete the
/// observed one, just before the cluster dies; its successor holds at least as much.
fn newest_retained(location: &str) -> String {
    if snapshot_exists(location) {
        return location.to_string();
    }
    weir_checkpoint::io_runtime()
        .block_on(weir_checkpoint::newest_complete_checkpoint_from(location))
        .unwrap_or_else(|| location.to_string())
}

/// Any store `state.checkpoints.dir` accepts.
fn newest_complete_checkpoint(root: &str, job_id: &str) -> Option<String> {
    let job_dir = weir_checkpoint::SnapshotStorage::from_url(root).ok()?.child(job_id);
    let blocking = job_dir.blocking();
    let mut ids: Vec<u64> =
        blocking.list_dirs().ok()?.iter().filter_map(|name| name.strip_prefix("chk-")?.parse().ok()).collect();
    ids.sort_unstable();
    ids.into_iter()
        .rev()
        .map(|id| job_dir.child(&format!("chk-{id}")))
        .find_map(|dir| blocking.block_on(weir_checkpoint::load_metadata(&dir)).ok().map(|_| dir.url().to_string()))
}

/// Savepoints are named `savepoint-<first 6 of the job id>-<random>`; their `_metadata`
/// says whose they are and their id.
fn newest_savepoint_of(dir: &str, job_id: &str) -> Option<(u64, String)> {
    let storage = weir_checkpoint::SnapshotStorage::from_url(dir).ok()?;
    let blocking = storage.blocking();
    let prefix = weir_checkpoint::paths::savepoint_dir_name(job_id, "");
    blocking
        .list_dirs()
        .ok()?
        .into_iter()
        .filter(|name| name.starts_with(&prefix))
        .filter_map(|name| {
            let savepoint = storage.child(&name);
            let metadata = blocking.block_on(weir_checkpoint::load_metadata(&savepoint)).ok()?;
            (metadata.job_id == job_id).then(|| (metadata.checkpoint_id, savepoint.url().to_string()))
        })
        .max_by_key(|(id, _)| *id)
}

fn snapshot_exists(location: &str) -> bool {
    let Ok(storage) = weir_checkpoint::SnapshotStorage::from_url(location) else { return false };
    let blocking = storage.blocking();
    blocking.block_on(weir_checkpoint::load_metadata(&storage)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::{newest_complete_checkpoint, newest_retained, newest_savepoint_of};

    const JOB: &str = "0123456789abcdef0123456789abcdef";

    /// A valid `_metadata` of checkpoint `id` with no operators.
    fn metadata(id: u64) -> Vec<u8> {
        snapshot_metadata(id, JOB, weir_checkpoint::format::SnapshotKind::Checkpoint)
    }

    fn snapshot_metadata(id: u64, job_id: &str, kind: weir_checkpoint::format::SnapshotKind) -> Vec<u8> {
        use weir_checkpoint::format::{FORMAT_VERSION, SnapshotMetadata};
        let metadata = SnapshotMetadata {
            format_version: FORMAT_VERSION,
            kind,
            job_id: job_id.into(),
            job_name: "job".into(),
            checkpoint_id: id,
            timestamp_ms: 1,
            max_parallelism: 128,
            operators: Vec::new(),
            format: weir_checkpoint::SnapshotFormat::Native,
            state_backend: Some("hashmap".into()),
        };
        weir_checkpoint::format::encode_metadata(&metadata).to_vec()
    }

    #[test]
    fn the_newest_complete_checkpoint_of_a_job_is_found_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("0123456789abcdef0123456789abcdef");
        for id in [4, 9, 12] {
            std::fs::create_dir_all(job.join(format!("chk-{id}"))).unwrap();
        }
        std::fs::write(job.join("chk-4/_metadata"), metadata(4)).unwrap();
        std::fs::write(job.join("chk-9/_metadata"), metadata(9)).unwrap();
        // chk-12 was begun but never completed, and chk-10 is junk: neither is a restore point.
        std::fs::create_dir_all(job.join("chk-10")).unwrap();
        std::fs::write(job.join("chk-10/_metadata"), b"junk").unwrap();
        let root = format!("file://{}", dir.path().display());
        assert_eq!(newest_complete_checkpoint(&root, JOB), Some(format!("{root}/{JOB}/chk-9")));
        assert_eq!(newest_complete_checkpoint(&root, "ffffffffffffffffffffffffffffffff"), None);
    }

    /// A stop that completed while its cluster went away is found by its `_metadata`: the
    /// job's own savepoint with the highest id, not another job's of the same name prefix.
    #[test]
    fn the_newest_savepoint_of_a_job_is_found_by_its_metadata() {
        use weir_checkpoint::format::SnapshotKind::Savepoint;
        let dir = tempfile::tempdir().unwrap();
        let other = "012345ffffffffffffffffffffffffff";
        for (name, id, job) in [("aaaa", 7, JOB), ("bbbb", 9, JOB), ("cccc", 12, other)] {
            let savepoint = dir.path().join(format!("savepoint-012345-{name}"));
            std::fs::create_dir_all(&savepoint).unwrap();
            std::fs::write(savepoint.join("_metadata"), snapshot_metadata(id, job, Savepoint)).unwrap();
        }
        // Begun, never completed.
        std::fs::create_dir_all(dir.path().join("savepoint-012345-dddd")).unwrap();
        let root = format!("file://{}", dir.path().display());
        assert_eq!(newest_savepoint_of(&root, JOB), Some((9, format!("{root}/savepoint-012345-bbbb"))));
        assert_eq!(newest_savepoint_of(&root, other).map(|(id, _)| id), Some(12));
        assert_eq!(newest_savepoint_of(&root, "ffffffffffffffffffffffffffffffff"), None);
    }

    #[test]
    fn a_checkpoint_deleted_since_it_was_observed_gives_way_to_the_newest_one_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        for id in [3, 5] {
            std::fs::create_dir_all(dir.path().join(format!("chk-{id}"))).unwrap();
            std::fs::write(dir.path().join(format!("chk-{id}/_metadata")), metadata(id)).unwrap();
        }
        // chk-7 was begun but never completed: no _metadata.
        std::fs::create_dir_all(dir.path().join("chk-7")).unwrap();
        let parent = format!("file://{}", dir.path().display());
        assert_eq!(newest_retained(&format!("{parent}/chk-2")), format!("{parent}/chk-5"));
        // Nothing newer than what was observed: the observed one stands (and its restore says
        // what is wrong with it).
        assert_eq!(newest_retained(&format!("{parent}/chk-5")), format!("{parent}/chk-5"));
        assert_eq!(newest_retained(&format!("{parent}/savepoint-x")), format!("{parent}/savepoint-x"));
    }
}
