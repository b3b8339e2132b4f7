//! What survives a JobManager: submitted jobs, checkpoint id and attempt counters, the
//! completed-checkpoint store, savepoint requests in flight and the results of ended jobs
//! (Flink's JobGraphStore, CheckpointIDCounter, CompletedCheckpointStore and
//! JobResultStore). etcd holds pointers only; the submission blobs live in
//! `high-availability.storageDir`, the checkpoints where the job writes them.
//!
//! Every write is one etcd transaction conditioned on the writer's leadership (the leader
//! key's create revision is its epoch): a JobManager that lost its leadership writes nothing,
//! whatever it still believes.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use weir_checkpoint::storage::BlockingStorage;

use crate::HaError;
use crate::election::LeadershipGuard;
use crate::kv::{Compare, KeyValue, KeyValueStore, Op};
use crate::layout::Layout;

#[derive(Serialize, Deserialize)]
struct SubmissionPointer {
    submission: String,
    submitted_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct CheckpointPointer {
    location: String,
    timestamp_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct SavepointRequest {
    terminate: bool,
    requested_ms: u64,
}

/// An ended job, as the job result store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobResult {
    /// The job.
    pub job_id: String,
    /// FINISHED, CANCELED or FAILED.
    pub state: String,
    /// When it ended, epoch ms.
    pub end_time_ms: u64,
    /// Why it failed, for FAILED.
    #[serde(default)]
    pub failure: Option<String>,
    /// The job's name (absent in results recorded before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
}

/// The longest failure text a job result keeps (the cause's first lines; the whole trace
/// stays in the JobManager's log), so that many results fit a size-bounded store.
const FAILURE_BYTES_MAX: usize = 4096;

fn truncate_at_char_boundary(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" [...]");
    }
}

/// The keys of the results in `results` beyond the `keep` newest by end time (ties by key, so
/// every leader prunes the same ones). A result that cannot be read is kept: it is not this
/// code's to judge, and `results()` reports it.
fn results_beyond(results: impl Iterator<Item = KeyValue>, keep: usize) -> Vec<String> {
    let mut ended: Vec<(u64, String)> = results
        .filter_map(|kv| {
            let result: JobResult = serde_json::from_slice(&kv.value).ok()?;
            Some((result.end_time_ms, kv.key))
        })
        .collect();
    ended.sort_by(|a, b| b.cmp(a));
    ended.into_iter().skip(keep).map(|(_, key)| key).collect()
}

/// The newest completed checkpoint recorded for job `job_id` of HA cluster `cluster_id`: what
/// a new leader would restore it from. Read by the deployment controller for a last-state
/// upgrade of a highly available cluster (as the Flink Kubernetes Operator reads the HA
/// ConfigMaps), without any leadership: it writes nothing.
pub fn newest_recorded_checkpoint(
    client: &dyn KeyValueStore,
    cluster_id: &str,
    job_id: &str,
) -> Result<Option<String>, HaError> {
    Ok(newest_pointer(client, &Layout::new(cluster_id), job_id)?.map(|(_, location)| location))
}

/// The newest checkpoint pointer of `job_id`: (id, location).
fn newest_pointer(client: &dyn KeyValueStore, layout: &Layout, job_id: &str) -> Result<Option<(u64, String)>, HaError> {
    let prefix = layout.checkpoints(job_id);
    let mut newest: Option<(u64, String)> = None;
    for kv in client.get_prefix(&prefix)? {
        let Some(id) = kv.key.strip_prefix(&prefix).and_then(|id| id.parse::<u64>().ok()) else { continue };
        let pointer: CheckpointPointer = serde_json::from_slice(&kv.value)
            .map_err(|e| HaError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
        if newest.as_ref().is_none_or(|(newest_id, _)| id > *newest_id) {
            newest = Some((id, pointer.location));
        }
    }
    Ok(newest)
}

/// A job a new leader recovers.
#[derive(Clone, Debug, Default)]
pub struct RecoverableJob {
    /// The job id.
    pub job_id: String,
    /// The submission as recorded (the blob's bytes).
    pub submission: Vec<u8>,
    /// The next checkpoint id (1 when none was taken).
    pub next_checkpoint_id: u64,
    /// The next attempt number.
    pub next_attempt: u32,
    /// Completed checkpoints, oldest first: (id, location).
    pub checkpoints: Vec<(u64, String)>,
    /// Savepoint requests the old leader had in flight.
    pub savepoints: Vec<String>,
}

struct Inner {
    client: Arc<dyn KeyValueStore>,
    layout: Layout,
    blobs: BlockingStorage,
    guard: LeadershipGuard,
}

/// The HA store of one leadership term.
#[derive(Clone)]
pub struct HaStore {
    inner: Arc<Inner>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl HaStore {
    pub(crate) fn new(
        client: Arc<dyn KeyValueStore>,
        layout: Layout,
        blobs: BlockingStorage,
        guard: LeadershipGuard,
    ) -> HaStore {
        HaStore { inner: Arc::new(Inner { client, layout, blobs, guard }) }
    }

    /// The leadership this store writes under.
    pub fn guard(&self) -> &LeadershipGuard {
        &self.inner.guard
    }

    /// Runs `ops` if this process still holds its leadership (checked locally, then by etcd).
    fn write(&self, ops: Vec<Op>) -> Result<(), HaError> {
        let inner = &self.inner;
        if !inner.guard.is_held() {
            return Err(HaError::LostLeadership);
        }
        let condition = Compare::CreateRevision(inner.layout.leader(), inner.guard.epoch());
        let result = inner.client.txn(&[condition], &ops, &[])?;
        if !result.succeeded {
            inner.guard.mark_lost();
            return Err(HaError::LostLeadership);
        }
        Ok(())
    }

    /// Records a submitted job (its blob first, then the pointer): call before the submit is
    /// acknowledged.
    pub fn record_submission(&self, job_id: &str, submission: &[u8]) -> Result<(), HaError> {
        let blob = Layout::submission_blob(job_id);
        self.inner.blobs.put(&blob, Bytes::copy_from_slice(submission)).map_err(|e| HaError::Storage(e.to_string()))?;
        let pointer = SubmissionPointer { submission: blob, submitted_ms: now_ms() };
        let value = serde_json::to_vec(&pointer).unwrap_or_default();
        self.write(vec![Op::Put { key: self.inner.layout.job(job_id), value, lease: 0 }])
    }

    /// Every job recorded and not ended, with what its recovery needs.
    pub fn recoverable_jobs(&self) -> Result<Vec<RecoverableJob>, HaError> {
        let inner = &self.inner;
        let jobs_prefix = inner.layout.jobs();
        let mut jobs: BTreeMap<String, RecoverableJob> = BTreeMap::new();
        for kv in inner.client.get_prefix(&jobs_prefix)? {
            let rest = kv.key.strip_prefix(&jobs_prefix).unwrap_or_default();
            let (job_id, sub) = match rest.split_once('/') {
                Some((job_id, sub)) => (job_id.to_string(), Some(sub.to_string())),
                None => (rest.to_string(), None),
            };
            let job = jobs.entry(job_id.clone()).or_insert_with(|| RecoverableJob {
                job_id: job_id.clone(),
                next_checkpoint_id: 1,
                ..RecoverableJob::default()
            });
            let text = String::from_utf8_lossy(&kv.value).to_string();
            match sub.as_deref() {
                None => {
                    let pointer: SubmissionPointer = serde_json::from_slice(&kv.value)
                        .map_err(|e| HaError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
                    job.submission =
                        inner.blobs.get(&pointer.submission).map_err(|e| HaError::Storage(e.to_string()))?.to_vec();
                }
                Some("checkpoint-counter") => job.next_checkpoint_id = text.trim().parse().unwrap_or(1),
                Some("attempt-counter") => job.next_attempt = text.trim().parse().unwrap_or(0),
                Some(other) if other.starts_with("checkpoints/") => {
                    let id: u64 = other.trim_start_matches("checkpoints/").parse().unwrap_or(0);
                    let pointer: CheckpointPointer = serde_json::from_slice(&kv.value)
                        .map_err(|e| HaError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
                    job.checkpoints.push((id, pointer.location));
                }
                Some(other) if other.starts_with("savepoints/") => {
                    job.savepoints.push(other.trim_start_matches("savepoints/").to_string());
                }
                Some(_) => {}
            }
        }
        let mut out: Vec<RecoverableJob> = jobs.into_values().filter(|job| !job.submission.is_empty()).collect();
        for job in &mut out {
            job.checkpoints.sort();
            // The counters never go below what the pointers show.
            if let Some((newest, _)) = job.checkpoints.last() {
                job.next_checkpoint_id = job.next_checkpoint_id.max(newest + 1);
            }
        }
        Ok(out)
    }

    /// Every ended job's result.
    pub fn results(&self) -> Result<Vec<JobResult>, HaError> {
        let mut results = Vec::new();
        for kv in self.inner.client.get_prefix(&self.inner.layout.results())? {
            let result: JobResult = serde_json::from_slice(&kv.value)
                .map_err(|e| HaError::Corrupt { key: kv.key.clone(), reason: e.to_string() })?;
            results.push(result);
        }
        Ok(results)
    }

    /// The store of one job.
    pub fn job(&self, job_id: &str) -> JobStore {
        JobStore { store: self.clone(), job_id: job_id.to_string() }
    }
}

/// The HA state of one job, written by its job master.
#[derive(Clone)]
pub struct JobStore {
    store: HaStore,
    job_id: String,
}

impl JobStore {
    fn layout(&self) -> &Layout {
        &self.store.inner.layout
    }

    /// The leadership the job master acts under.
    pub fn guard(&self) -> &LeadershipGuard {
        self.store.guard()
    }

    /// The newest completed checkpoint recorded for the job: (id, location). What a restart
    /// restores while a pointer write of this leader got no answer (the store, not the
    /// leader's own view, says which is newest).
    pub fn newest_checkpoint(&self) -> Result<Option<(u64, String)>, HaError> {
        newest_pointer(self.store.inner.client.as_ref(), self.layout(), &self.job_id)
    }

    /// Checkpoint ids from `next` on are free: call before triggering checkpoint `next - 1`.
    pub fn set_next_checkpoint_id(&self, next: u64) -> Result<(), HaError> {
        let key = self.layout().checkpoint_counter(&self.job_id);
        self.store.write(vec![Op::Put { key, value: next.to_string().into_bytes(), lease: 0 }])
    }

    /// Attempt numbers from `next` on are free: call before deploying attempt `next - 1`.
    pub fn set_next_attempt(&self, next: u32) -> Result<(), HaError> {
        let key = self.layout().attempt_counter(&self.job_id);
        self.store.write(vec![Op::Put { key, value: next.to_string().into_bytes(), lease: 0 }])
    }

    /// Records completed checkpoint `checkpoint_id` at `location`, dropping the pointers of
    /// `subsumed` (retention): after this returns, the checkpoint is complete.
    pub fn add_checkpoint(&self, checkpoint_id: u64, location: &str, subsumed: &[u64]) -> Result<(), HaError> {
        let pointer = CheckpointPointer { location: location.to_string(), timestamp_ms: now_ms() };
        let mut ops = vec![Op::Put {
            key: self.layout().checkpoint(&self.job_id, checkpoint_id),
            value: serde_json::to_vec(&pointer).unwrap_or_default(),
            lease: 0,
        }];
        for old in subsumed {
            ops.push(Op::Delete { key: self.layout().checkpoint(&self.job_id, *old), prefix: false });
        }
        self.store.write(ops)
    }

    /// Records a savepoint or stop request in flight.
    pub fn add_savepoint_request(&self, request_id: &str, terminate: bool) -> Result<(), HaError> {
        let request = SavepointRequest { terminate, requested_ms: now_ms() };
        let key = self.layout().savepoint(&self.job_id, request_id);
        self.store.write(vec![Op::Put { key, value: serde_json::to_vec(&request).unwrap_or_default(), lease: 0 }])
    }

    /// A savepoint request completed or failed.
    pub fn remove_savepoint_request(&self, request_id: &str) -> Result<(), HaError> {
        let key = self.layout().savepoint(&self.job_id, request_id);
        self.store.write(vec![Op::Delete { key, prefix: false }])
    }

    /// The job ended for good: records its result and deletes its HA data (as Flink does for
    /// globally terminal jobs), in one transaction.
    /// The results beyond the store's retention (the oldest) go in the same transaction.
    pub fn finish(&self, result: &JobResult) -> Result<(), HaError> {
        let mut result = result.clone();
        if let Some(failure) = &mut result.failure {
            truncate_at_char_boundary(failure, FAILURE_BYTES_MAX);
        }
        let key = self.layout().result(&self.job_id);
        let mut ops = vec![
            Op::Put { key: key.clone(), value: serde_json::to_vec(&result).unwrap_or_default(), lease: 0 },
            Op::Delete { key: self.layout().job(&self.job_id), prefix: true },
        ];
        let client = &self.store.inner.client;
        let others = client.get_prefix(&self.layout().results())?.into_iter().filter(|kv| kv.key != key);
        let retained = client.job_results_retained().max(1);
        for old in results_beyond(others, retained - 1) {
            ops.push(Op::Delete { key: old, prefix: false });
        }
        self.store.write(ops)?;
        if let Err(error) = self.store.inner.blobs.delete(&Layout::submission_blob(&self.job_id)) {
            tracing::warn!(job_id = %self.job_id, %error, "cannot delete the job's submission blob");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EtcdError;

    fn result_kv(job: &str, end_time_ms: u64) -> KeyValue {
        let result =
            JobResult { job_id: job.to_string(), state: "FINISHED".into(), end_time_ms, failure: None, job_name: None };
        KeyValue {
            key: format!("results/{job}"),
            value: serde_json::to_vec(&result).unwrap(),
            create_revision: 1,
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn the_oldest_results_beyond_the_retention_are_pruned_and_unreadable_ones_kept() {
        let mut results = vec![result_kv("a", 30), result_kv("b", 10), result_kv("c", 20), result_kv("d", 20)];
        results.push(KeyValue { value: b"not json".to_vec(), ..result_kv("corrupt", 0) });
        // Keep 2: a (30) and d (20, the larger key of the tie) stay; c and b go, oldest last.
        assert_eq!(results_beyond(results.clone().into_iter(), 2), vec!["results/c", "results/b"]);
        assert!(results_beyond(results.clone().into_iter(), 4).is_empty());
        assert_eq!(results_beyond(results.into_iter(), 0).len(), 4);
    }

    /// Keys in memory, for the reads.
    struct Keys(Vec<KeyValue>);

    impl KeyValueStore for Keys {
        fn describe(&self) -> String {
            "memory".into()
        }
        fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
            Ok(self.0.iter().find(|kv| kv.key == key).cloned())
        }
        fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
            Ok(self.0.iter().filter(|kv| kv.key.starts_with(prefix)).cloned().collect())
        }
        fn txn(&self, _: &[Compare], _: &[Op], _: &[Op]) -> Result<crate::kv::TxnResult, EtcdError> {
            unreachable!("the reads write nothing")
        }
        fn grant(&self, _: std::time::Duration) -> Result<(i64, std::time::Duration), EtcdError> {
            unreachable!("the reads take no lease")
        }
        fn keep_alive(&self, _: i64) -> Result<Option<std::time::Duration>, EtcdError> {
            unreachable!("the reads take no lease")
        }
        fn revoke(&self, _: i64) -> Result<(), EtcdError> {
            unreachable!("the reads take no lease")
        }
    }

    fn pointer(layout: &Layout, job: &str, id: u64, location: &str) -> KeyValue {
        let pointer = CheckpointPointer { location: location.into(), timestamp_ms: id };
        KeyValue {
            key: layout.checkpoint(job, id),
            value: serde_json::to_vec(&pointer).unwrap(),
            create_revision: 1,
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn the_newest_recorded_checkpoint_is_the_highest_id_of_that_job_only() {
        let layout = Layout::new("deployment-orders-3");
        let other = Layout::new("deployment-orders-2");
        let keys = Keys(vec![
            pointer(&layout, "j1", 9, "file:///c/j1/chk-9"),
            pointer(&layout, "j1", 10, "file:///c/j1/chk-10"),
            pointer(&layout, "j1", 8, "file:///c/j1/chk-8"),
            pointer(&layout, "j2", 40, "file:///c/j2/chk-40"),
            pointer(&other, "j1", 99, "file:///old/j1/chk-99"),
        ]);
        let newest = newest_recorded_checkpoint(&keys, "deployment-orders-3", "j1").unwrap();
        assert_eq!(newest.as_deref(), Some("file:///c/j1/chk-10"));
        assert_eq!(newest_recorded_checkpoint(&keys, "deployment-orders-3", "j3").unwrap(), None);

        let corrupt = Keys(vec![KeyValue { value: b"{".to_vec(), ..pointer(&layout, "j1", 11, "") }]);
        let error = newest_recorded_checkpoint(&corrupt, "deployment-orders-3", "j1").unwrap_err().to_string();
        assert!(error.contains(&layout.checkpoint("j1", 11)), "{error}");
    }

    #[test]
    fn a_long_failure_is_cut_on_a_character_boundary() {
        let mut text = "é".repeat(3000);
        truncate_at_char_boundary(&mut text, FAILURE_BYTES_MAX);
        assert!(text.len() <= FAILURE_BYTES_MAX + " [...]".len() && text.ends_with(" [...]"), "{}", text.len());
        let mut short = "short".to_string();
        truncate_at_char_boundary(&mut short, FAILURE_BYTES_MAX);
        assert_eq!(short, "short");
    }
}
