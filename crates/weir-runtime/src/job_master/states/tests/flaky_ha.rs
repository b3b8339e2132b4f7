//! The HA store of a stepped job master: the real `JobStore` on a memory store whose calls,
//! while faults run, fail at random (not applied: etcd unreachable) or lose their answer
//! (applied, then the connection dropped), as the cluster simulation's HA store does. The
//! test reads the memory store behind the flakes to check what the job master recorded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_ha::kv::{Compare, KeyValue, Op, TxnResult};
use weir_ha::memory::MemoryStore;
use weir_ha::{EtcdError, HaServices, HaSettings, KeyValueStore, Layout, LeadershipGuard};
use weir_types::JobId;
use weir_types::seeded::SeededRng;

use crate::job_settings::JobHa;

const CLUSTER_ID: &str = "random-subtasks";
/// How long a new leader waits for the reports of the running attempts.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether calls flake now, and what they did (for the trace).
struct Flakes {
    rng: SeededRng,
    on: bool,
    log: Vec<String>,
    /// Writes of the attempt counter that flaked: each fails a deploy.
    attempt_writes_failed: usize,
}

/// A memory store whose calls flake while [`PlayedHa::faults`] says so.
struct FlakyStore {
    inner: Arc<MemoryStore>,
    flakes: Arc<Mutex<Flakes>>,
}

fn outage(what: &str) -> EtcdError {
    EtcdError::Unreachable { endpoints: "the played HA store".into(), reason: format!("played outage ({what})") }
}

impl FlakyStore {
    /// `None`: the call goes through; otherwise it fails, after being applied when `true`.
    fn flake(&self, what: &str, may_apply: bool) -> Option<bool> {
        let mut flakes = self.flakes.lock().unwrap();
        if !flakes.on || !flakes.rng.one_in(6) {
            return None;
        }
        let applied = may_apply && flakes.rng.one_in(2);
        let how = if applied { "applied, its answer lost" } else { "refused" };
        flakes.log.push(format!("HA {what}: {how}"));
        if what.contains("attempt-counter") {
            flakes.attempt_writes_failed += 1;
        }
        Some(applied)
    }
}

impl KeyValueStore for FlakyStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        match self.flake("read", false) {
            Some(_) => Err(outage("read")),
            None => self.inner.get(key),
        }
    }

    fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        match self.flake("read", false) {
            Some(_) => Err(outage("read")),
            None => self.inner.get_prefix(prefix),
        }
    }

    fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError> {
        let what = match success.first() {
            Some(Op::Put { key, .. }) | Some(Op::Delete { key, .. }) => {
                format!("write {}", key.rsplit('/').take(2).collect::<Vec<_>>().join(" of "))
            }
            None => "write".into(),
        };
        match self.flake(&what, true) {
            Some(true) => {
                self.inner.txn(compares, success, failure)?;
                Err(outage("answer lost"))
            }
            Some(false) => Err(outage("refused")),
            None => self.inner.txn(compares, success, failure),
        }
    }

    fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        self.inner.grant(ttl)
    }

    fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        self.inner.keep_alive(lease)
    }

    fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.inner.revoke(lease)
    }
}

/// The HA side of a played job: the store the job master writes through, and the keys
/// behind it. A clone shares them (and the leadership).
#[derive(Clone)]
pub(super) struct PlayedHa {
    store: Arc<MemoryStore>,
    flakes: Arc<Mutex<Flakes>>,
    layout: Layout,
    job_id: String,
    guard: LeadershipGuard,
    services: Arc<HaServices>,
}

impl PlayedHa {
    /// An HA store for job `job_id` led by this test's JobManager (its leader key written,
    /// the leadership held for good), and the job's HA wiring. Flakes draw from `rng`.
    pub(super) fn new(job_id: JobId, storage_dir: String, rng: SeededRng) -> (PlayedHa, JobHa) {
        let store = Arc::new(MemoryStore::new());
        let flakes = Arc::new(Mutex::new(Flakes { rng, on: false, log: Vec::new(), attempt_writes_failed: 0 }));
        let client: Arc<dyn KeyValueStore> =
            Arc::new(FlakyStore { inner: Arc::clone(&store), flakes: Arc::clone(&flakes) });
        let layout = Layout::new(CLUSTER_ID);
        let leader = Op::Put { key: layout.leader(), value: b"test-jobmanager".to_vec(), lease: 0 };
        let epoch = store.txn(&[], &[leader], &[]).expect("the memory store writes").revision;
        let guard = LeadershipGuard::external(epoch);
        guard.renewed(Duration::from_secs(1 << 30));
        let settings = HaSettings {
            endpoints: Vec::new(),
            cluster_id: CLUSTER_ID.into(),
            storage_dir,
            lease_ttl: Duration::from_secs(10),
            kubernetes: None,
        };
        let services = Arc::new(HaServices::on(settings, client).expect("HA services on the memory store"));
        let term = services.store(guard.clone());
        // Recorded as submitted, as a JobManager does before it runs a job: a new leader
        // recovers it from the store.
        term.record_submission(&job_id.to_string(), b"played").expect("the memory store records the submission");
        let job_store = term.job(&job_id.to_string());
        let ha = JobHa { store: job_store, recovered: None, reconcile_timeout: RECONCILE_TIMEOUT };
        (PlayedHa { store, flakes, layout, job_id: job_id.to_string(), guard, services }, ha)
    }

    /// Another JobManager wins the election (the leader key created again: a new epoch) and
    /// recovers the job, if the store still holds it; `Err` when the store did not answer.
    /// Later losses of the leadership are this new leader's.
    pub(super) fn new_leader(&mut self) -> Result<Option<JobHa>, String> {
        let leader = self.layout.leader();
        self.store.txn(&[], &[Op::Delete { key: leader.clone(), prefix: false }], &[]).map_err(|e| e.to_string())?;
        let put = Op::Put { key: leader, value: b"next-jobmanager".to_vec(), lease: 0 };
        let epoch = self.store.txn(&[], &[put], &[]).map_err(|e| e.to_string())?.revision;
        let guard = LeadershipGuard::external(epoch);
        guard.renewed(Duration::from_secs(1 << 30));
        self.guard = guard.clone();
        let term = self.services.store(guard);
        let jobs = term.recoverable_jobs().map_err(|e| e.to_string())?;
        let Some(recovered) = jobs.into_iter().find(|job| job.job_id == self.job_id) else { return Ok(None) };
        let store = term.job(&self.job_id);
        Ok(Some(JobHa { store, recovered: Some(recovered), reconcile_timeout: RECONCILE_TIMEOUT }))
    }

    /// This JobManager loses its leadership (its lease lapsed: another leads now); the store's
    /// revision then, which no write of this master may move any more.
    pub(super) fn lose_leadership(&self) -> i64 {
        self.guard.mark_lost();
        self.revision()
    }

    /// The store's revision: it moves with every write applied.
    pub(super) fn revision(&self) -> i64 {
        // A transaction without operations reads the revision and moves nothing.
        self.store.txn(&[], &[], &[]).map_or(0, |result| result.revision)
    }

    /// Calls flake from now on while `on`.
    pub(super) fn faults(&self, on: bool) {
        self.flakes.lock().unwrap().on = on;
    }

    /// What flaked since the last look.
    pub(super) fn drain_log(&self) -> Vec<String> {
        std::mem::take(&mut self.flakes.lock().unwrap().log)
    }

    /// Deploys that failed because the attempt counter's write flaked (the restart strategy
    /// counted each as a restart, with nothing deployed).
    pub(super) fn failed_deploys(&self) -> usize {
        self.flakes.lock().unwrap().attempt_writes_failed
    }

    /// Checkpoint `id`'s pointer is recorded.
    pub(super) fn records_checkpoint(&self, id: u64) -> bool {
        self.store.get(&self.layout.checkpoint(&self.job_id, id)).is_ok_and(|kv| kv.is_some())
    }

    /// The recorded next checkpoint id (ids below it may be in use), if any.
    pub(super) fn next_checkpoint_id(&self) -> Option<u64> {
        let kv = self.store.get(&self.layout.checkpoint_counter(&self.job_id)).ok()??;
        std::str::from_utf8(&kv.value).ok()?.parse().ok()
    }

    /// The job's result is recorded.
    pub(super) fn records_result(&self) -> bool {
        self.store.get(&self.layout.result(&self.job_id)).is_ok_and(|kv| kv.is_some())
    }
}
