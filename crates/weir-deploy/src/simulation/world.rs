//! The simulated world of the deployment controller: a clock, deployment clusters whose
//! jobs read records, checkpoint and commit their output (a two-phase-commit sink), take and
//! fail savepoints and stop; snapshots in storage; the deployment store; and what each
//! operator may do. The real controller reaches it through handles that implement its
//! interfaces ([`World`], [`JobsApi`], [`ClusterBackend`], [`DeploymentStore`]); every call
//! through one is a point where the driver may run someone else first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::baton::Baton;
use crate::backend::ClusterBackend;
use crate::cluster_api::{JobView, SavepointState};
use crate::fence::{Fence, LeadershipLost};
use crate::spec::{DeploymentSpec, WeirDeployment};
use crate::status::{ClusterInfo, DeploymentStatus};
use crate::store::{ApplyOutcome, DeploymentStore, StoreError, StoredDeployment, next_generation};
use crate::world::{JobsApi, World};

/// How often a running job completes a checkpoint.
pub const CHECKPOINT_INTERVAL_MS: u64 = 200;
/// Completed checkpoints a job keeps; older ones are deleted.
const RETAINED_CHECKPOINTS: usize = 2;

/// The simulation's random source: every choice of a run follows from its seed.
pub use weir_types::seeded::SeededRng as SimRng;

/// A savepoint request of a job.
pub struct Request {
    pub terminate: bool,
    pub directory: String,
    pub due: u64,
    pub fails: bool,
    pub outcome: Option<SavepointState>,
}

/// A job on a simulated cluster: it reads one record per millisecond while RUNNING.
pub struct SimJob {
    pub id: String,
    pub cluster: u64,
    pub state: &'static str,
    /// When it runs (CREATED until then).
    pub running_at: u64,
    /// Where its input stood when it started (its snapshot's position).
    pub start_progress: u64,
    /// Where its input stopped, once it left RUNNING.
    pub stopped_at: Option<u64>,
    /// Its sink committed the records up to here.
    pub committed: u64,
    pub next_checkpoint_at: u64,
    pub checkpoint_ids: u64,
    pub retained: Vec<String>,
    pub latest_checkpoint: Option<String>,
    pub latest_savepoint: Option<String>,
    /// The savepoint of a stop that completed (with HA, recorded as the job's restart point
    /// before its sink committed).
    pub stop_savepoint: Option<String>,
    pub requests: BTreeMap<String, Request>,
    pub cancel_at: Option<u64>,
    pub finish_at: Option<u64>,
    pub submitted_at: u64,
}

impl SimJob {
    pub fn progress(&self, now: u64) -> u64 {
        match self.stopped_at {
            Some(at) => at,
            None if self.state == "RUNNING" => self.start_progress + now.saturating_sub(self.running_at),
            None => self.start_progress,
        }
    }

    pub fn terminal(&self) -> bool {
        matches!(self.state, "FINISHED" | "CANCELED" | "FAILED" | "GONE")
    }

    fn leave_running(&mut self, now: u64, state: &'static str) {
        let progress = self.progress(now);
        self.stopped_at = Some(progress);
        self.state = state;
    }
}

/// A deployment cluster; its JobManager may have died. A stopped cluster stays listed, as
/// a process cluster's directory does.
pub struct SimCluster {
    pub alive: bool,
    /// The jobs this cluster's JobManager was given.
    pub jobs: Vec<String>,
    /// With high availability, a JobManager that died comes back then (Kubernetes restarts
    /// its pod) unless the cluster is stopped first, and recovers its jobs from their newest
    /// checkpoint recorded in the cluster's HA store.
    pub revive_at: Option<u64>,
}

/// An actor: one operator's controller, on a thread of its own.
pub struct Actor {
    pub operator: usize,
    pub epoch: u64,
    /// Asleep until then.
    pub wake_at: u64,
    pub killed: bool,
    pub done: bool,
    /// It passed its leadership check and acts next: its next call runs without a turn.
    pub atomic_next: bool,
}

/// One operator process.
#[derive(Default)]
pub struct Operator {
    /// Its controller while it leads.
    pub actor: Option<usize>,
    pub guard: Option<weir_ha::LeadershipGuard>,
    pub epoch: u64,
    /// SIGSTOPped until then.
    pub frozen_until: u64,
    /// Killed; back (standing by) at this time.
    pub dead_until: Option<u64>,
    /// Its leadership last renewed (its guard holds for two thirds of the lease after it).
    pub renewed_at: u64,
}

/// A snapshot in storage: whose, its id, where its input stood, and the records its sink
/// staged and had not committed when it was taken (`pending_from..progress`), which a
/// restore from it commits (recover and commit).
#[derive(Clone, Debug)]
pub struct Snap {
    pub job: String,
    pub id: u64,
    pub progress: u64,
    pub pending_from: u64,
}

pub struct State {
    pub rng: SimRng,
    pub now: u64,
    pub trace: Vec<String>,
    pub violations: Vec<String>,
    pub store: BTreeMap<String, StoredDeployment>,
    pub clusters: BTreeMap<u64, SimCluster>,
    pub jobs: BTreeMap<String, SimJob>,
    /// Snapshots in storage, by location.
    pub snapshots: BTreeMap<String, Snap>,
    /// The deployment's output: every record below this is committed, once.
    pub committed_end: u64,
    pub epoch: u64,
    pub leader: Option<usize>,
    pub lease_until: u64,
    pub operators: Vec<Operator>,
    pub actors: Vec<Actor>,
    pub next_job: u64,
    pub next_request: u64,
    /// The next stop-with-savepoint fails.
    pub fail_next_stop: bool,
    /// The clusters run with high availability (`high-availability.type`): their HA store
    /// records each job's newest checkpoint, and a JobManager that dies comes back.
    pub ha_clusters: bool,
}

impl State {
    pub fn violation(&mut self, message: String) {
        self.trace.push(format!("VIOLATION: {message}"));
        self.violations.push(message);
    }

    /// Job `id`'s sink commits its records up to `to`: exactly once means it goes on where
    /// the deployment's output ends.
    pub fn commit(&mut self, id: &str, to: u64) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        let from = job.committed;
        job.committed = to;
        let end = self.committed_end;
        if from < end {
            self.violation(format!("job {id} committed records {from}..{end} again (up to {to})"));
        } else if from > end {
            self.violation(format!(
                "records {end}..{from} were never committed before job {id} committed {from}..{to}"
            ));
        }
        self.committed_end = self.committed_end.max(to);
    }

    /// Checkpoints, savepoints, stops, cancels and starts that are due.
    pub fn advance_jobs(&mut self) {
        let now = self.now;
        self.revive_jobmanagers(now);
        let ids: Vec<String> = self.jobs.keys().cloned().collect();
        for id in ids {
            self.advance_job(&id, now);
        }
    }

    /// HA clusters whose JobManager is due back: it recovers each job it ran from its restart
    /// point in the HA store, the newest of its checkpoints and a stop's savepoint (the same
    /// job, its sink recovering and committing what that snapshot staged; a stop that had
    /// not finished is lost, and the job runs on, as in Flink), and fails the savepoints
    /// asked of the one that died.
    fn revive_jobmanagers(&mut self, now: u64) {
        let due: Vec<u64> = self
            .clusters
            .iter()
            .filter(|(_, cluster)| !cluster.alive && cluster.revive_at.is_some_and(|at| at <= now))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            let Some(cluster) = self.clusters.get_mut(&seq) else { continue };
            cluster.alive = true;
            cluster.revive_at = None;
            let jobs = cluster.jobs.clone();
            self.trace.push(format!("  the JobManager of cluster {seq} is back (HA)"));
            for id in jobs {
                let Some(job) = self.jobs.get_mut(&id).filter(|job| job.state == "GONE") else { continue };
                let snaps = [&job.latest_checkpoint, &job.stop_savepoint];
                let restart_point =
                    snaps.into_iter().flatten().filter_map(|l| self.snapshots.get(l)).max_by_key(|s| s.id);
                let Some(snap) = restart_point.cloned() else { continue };
                job.finish_at = None;
                // A cancel the JobManager had not finished is lost with it, as in Flink: the
                // job's result was not recorded, so the next JobManager runs it again.
                if job.cancel_at.take().is_some() {
                    self.trace.push(format!("  job {id}: its cancel was lost with the JobManager"));
                }
                job.stop_savepoint = None;
                for request in job.requests.values_mut().filter(|r| r.outcome.is_none()) {
                    request.outcome = Some(SavepointState::Failed("the JobManager failed over".into()));
                }
                job.state = "CREATED";
                job.running_at = now + 20;
                job.start_progress = snap.progress;
                job.stopped_at = None;
                job.committed = snap.progress;
                job.next_checkpoint_at = u64::MAX;
                self.trace.push(format!("  job {id} recovered from snapshot {} at {}", snap.id, snap.progress));
                self.recover_commit(&id, &snap);
            }
        }
    }

    /// A job starting from `snap` commits what the snapshot staged (recover and commit;
    /// committing a transaction again is a no-op).
    fn recover_commit(&mut self, id: &str, snap: &Snap) {
        if snap.progress > snap.pending_from && self.committed_end == snap.pending_from {
            if let Some(job) = self.jobs.get_mut(id) {
                job.committed = snap.pending_from;
            }
            self.commit(id, snap.progress);
        }
    }

    fn advance_job(&mut self, id: &str, now: u64) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        if job.terminal() {
            // A job that ended fails the savepoints still asked of it.
            let cause = format!("the job is {}", job.state);
            for request in job.requests.values_mut().filter(|r| r.outcome.is_none()) {
                request.outcome = Some(SavepointState::Failed(cause.clone()));
            }
            return;
        }
        if job.state == "CREATED" && job.running_at <= now {
            job.state = "RUNNING";
            job.next_checkpoint_at = now + CHECKPOINT_INTERVAL_MS;
        }
        if job.state == "RUNNING" && job.next_checkpoint_at <= now {
            job.next_checkpoint_at = now + CHECKPOINT_INTERVAL_MS;
            self.complete_checkpoint(id, now);
        }
        self.settle_requests(id, now);
        let Some(job) = self.jobs.get_mut(id) else { return };
        if job.cancel_at.is_some_and(|at| at <= now) {
            job.leave_running(now, "CANCELED");
            self.trace.push(format!("  job {id} CANCELED"));
        } else if job.finish_at.is_some_and(|at| at <= now) {
            job.state = "FINISHED";
            self.trace.push(format!("  job {id} FINISHED"));
        }
    }

    fn complete_checkpoint(&mut self, id: &str, now: u64) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        job.checkpoint_ids += 1;
        let location = format!("sim://chk/{id}/chk-{}", job.checkpoint_ids);
        let progress = job.progress(now);
        let snap = Snap { job: id.to_string(), id: job.checkpoint_ids, progress, pending_from: job.committed };
        job.retained.push(location.clone());
        job.latest_checkpoint = Some(location.clone());
        let dropped: Vec<String> = if job.retained.len() > RETAINED_CHECKPOINTS {
            job.retained.drain(..job.retained.len() - RETAINED_CHECKPOINTS).collect()
        } else {
            Vec::new()
        };
        self.snapshots.insert(location, snap);
        for old in dropped {
            self.snapshots.remove(&old);
        }
        self.commit(id, progress);
    }

    fn settle_requests(&mut self, id: &str, now: u64) {
        let Some(job) = self.jobs.get_mut(id) else { return };
        let due: Vec<String> = job
            .requests
            .iter()
            .filter(|(_, request)| request.outcome.is_none() && request.due <= now)
            .map(|(request_id, _)| request_id.clone())
            .collect();
        for request_id in due {
            let Some(job) = self.jobs.get_mut(id) else { return };
            let running = job.state == "RUNNING";
            let Some(request) = job.requests.get_mut(&request_id) else { continue };
            if request.fails || !running {
                request.outcome = Some(SavepointState::Failed("the simulated savepoint failed".into()));
                self.trace.push(format!("  job {id}: savepoint {request_id} failed"));
                continue;
            }
            job.checkpoint_ids += 1;
            let snapshot_id = job.checkpoint_ids;
            // Unique, as the real names' random part makes them.
            let location = format!("{}/savepoint-{id}-{snapshot_id}", request.directory.trim_end_matches('/'));
            request.outcome = Some(SavepointState::Completed(location.clone()));
            let terminate = request.terminate;
            let progress = job.progress(now);
            job.latest_savepoint = Some(location.clone());
            let snap = Snap { job: id.to_string(), id: snapshot_id, progress, pending_from: job.committed };
            self.snapshots.insert(location.clone(), snap);
            self.trace.push(format!("  job {id}: savepoint {location} at {progress} (stop: {terminate})"));
            if terminate {
                // The stop's savepoint commits, and the job ends.
                self.commit(id, progress);
                if let Some(job) = self.jobs.get_mut(id) {
                    job.leave_running(now, "RUNNING");
                    job.next_checkpoint_at = u64::MAX;
                    job.finish_at = Some(now + 5);
                    job.stop_savepoint = Some(location.clone());
                }
            }
        }
    }

    /// Jobs running now: not ended, on a cluster whose JobManager lives.
    pub fn live_jobs(&self) -> Vec<&SimJob> {
        self.jobs
            .values()
            .filter(|job| !job.terminal() && self.clusters.get(&job.cluster).is_some_and(|c| c.alive))
            .collect()
    }
}

/// The simulation shared by the driver and the actors.
pub struct Sim {
    pub state: Mutex<State>,
    pub baton: Baton,
}

/// An actor that was killed unwinds with this.
pub struct Killed;

impl Sim {
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A call of actor `actor` into the world: the driver's turn first (unless the actor
    /// just passed its leadership check), then the call runs on the state.
    pub fn enter(&self, actor: usize) -> MutexGuard<'_, State> {
        let atomic = {
            let mut state = self.state();
            std::mem::take(&mut state.actors[actor].atomic_next)
        };
        if !atomic {
            self.baton.yield_to_driver(actor);
        }
        let state = self.state();
        if state.actors[actor].killed {
            drop(state);
            std::panic::resume_unwind(Box::new(Killed));
        }
        state
    }
}

/// What actor `actor` (one operator's controller) reaches the world through.
#[derive(Clone)]
pub struct Handle {
    pub sim: Arc<Sim>,
    pub actor: usize,
}

impl Handle {
    /// Checks that a process action comes from the leader of the current epoch.
    fn act(&self, state: &mut State, what: &str) {
        let actor = &state.actors[self.actor];
        let (epoch, operator) = (actor.epoch, actor.operator);
        state.trace.push(format!("  operator {operator} (epoch {epoch}): {what}"));
        if epoch != state.epoch {
            let current = state.epoch;
            state.violation(format!("operator {operator} of epoch {epoch} {what} while epoch {current} leads"));
        }
    }

    fn cluster_of(address: &str) -> Option<u64> {
        address.strip_prefix("sim://cluster-")?.parse().ok()
    }
}

impl World for Handle {
    fn now_ms(&self) -> u64 {
        self.sim.enter(self.actor).now
    }

    fn sleep(&self, duration: Duration) {
        {
            let mut state = self.sim.state();
            let wake = state.now + duration.as_millis() as u64;
            state.actors[self.actor].wake_at = wake;
            state.actors[self.actor].atomic_next = false;
        }
        drop(self.sim.enter(self.actor));
    }

    fn jobs_api(&self, rest_address: &str) -> Box<dyn JobsApi> {
        Box::new(ClusterRest { handle: self.clone(), cluster: Handle::cluster_of(rest_address) })
    }

    fn snapshot_exists(&self, location: &str) -> bool {
        self.sim.enter(self.actor).snapshots.contains_key(location.trim_end_matches('/'))
    }

    fn newest_complete_checkpoint(&self, root: &str, job_id: &str) -> Option<String> {
        let state = self.sim.enter(self.actor);
        let prefix = format!("{}/{job_id}/chk-", root.trim_end_matches('/'));
        newest_with_prefix(&state, &prefix, 0)
    }

    fn newest_retained(&self, location: &str) -> String {
        let state = self.sim.enter(self.actor);
        let location = location.trim_end_matches('/');
        if state.snapshots.contains_key(location) {
            return location.to_string();
        }
        let Some((parent, observed)) = location.rsplit_once("/chk-") else { return location.to_string() };
        let Ok(observed) = observed.parse::<u64>() else { return location.to_string() };
        newest_with_prefix(&state, &format!("{parent}/chk-"), observed + 1).unwrap_or_else(|| location.to_string())
    }

    fn newest_savepoint_of(&self, dir: &str, job_id: &str) -> Option<(u64, String)> {
        let state = self.sim.enter(self.actor);
        let prefix = format!("{}/savepoint-", dir.trim_end_matches('/'));
        state
            .snapshots
            .iter()
            .filter(|(location, snap)| location.starts_with(&prefix) && snap.job == job_id)
            .map(|(location, snap)| (snap.id, location.clone()))
            .max_by_key(|(id, _)| *id)
    }

    fn dispose(&self, location: &str) -> Result<(), String> {
        let mut state = self.sim.enter(self.actor);
        self.act(&mut state, &format!("disposes {location}"));
        state.snapshots.remove(location.trim_end_matches('/'));
        Ok(())
    }

    fn crash_point(&self, _name: &str) {
        drop(self.sim.enter(self.actor));
    }

    fn new_job_id(&self) -> String {
        let mut state = self.sim.enter(self.actor);
        state.next_job += 1;
        format!("{:032x}", state.next_job)
    }

    fn acting_next(&self) {
        self.sim.state().actors[self.actor].atomic_next = true;
    }
}

/// The newest `<prefix><n>` with `n >= at_least` in storage.
fn newest_with_prefix(state: &State, prefix: &str, at_least: u64) -> Option<String> {
    state
        .snapshots
        .keys()
        .filter_map(|location| Some((location.strip_prefix(prefix)?.parse::<u64>().ok()?, location)))
        .filter(|(id, _)| *id >= at_least)
        .max_by_key(|(id, _)| *id)
        .map(|(_, location)| location.clone())
}

/// A cluster's REST API in the simulation.
struct ClusterRest {
    handle: Handle,
    cluster: Option<u64>,
}

impl ClusterRest {
    /// The state, if the cluster's JobManager answers.
    fn answering(&self) -> Result<MutexGuard<'_, State>, String> {
        let state = self.handle.sim.enter(self.handle.actor);
        match self.cluster.and_then(|seq| state.clusters.get(&seq)) {
            Some(cluster) if cluster.alive => Ok(state),
            _ => Err(format!("cluster {:?} does not answer", self.cluster)),
        }
    }

    /// Job `job_id`, if this cluster's JobManager knows it.
    fn own<'a>(&self, state: &'a mut State, job_id: &str) -> Option<&'a mut SimJob> {
        let known =
            self.cluster.and_then(|seq| state.clusters.get(&seq)).is_some_and(|c| c.jobs.iter().any(|j| j == job_id));
        state.jobs.get_mut(job_id).filter(|job| known && job.state != "GONE")
    }

    fn trigger(&self, job_id: &str, directory: &str, terminate: bool) -> Result<String, String> {
        let mut state = self.answering()?;
        let what = if terminate { "stops" } else { "takes a savepoint of" };
        self.handle.act(&mut state, &format!("{what} job {job_id}"));
        state.next_request += 1;
        let request_id = format!("r{}", state.next_request);
        let due = state.now + 20 + state.rng.below(400);
        let fails = terminate && std::mem::take(&mut state.fail_next_stop);
        let Some(job) = self.own(&mut state, job_id) else { return Err(format!("no job {job_id}")) };
        if job.state != "RUNNING" || job.finish_at.is_some() {
            return Err(format!("job {job_id} is {}: it takes no savepoint", job.state));
        }
        let request = Request { terminate, directory: directory.to_string(), due, fails, outcome: None };
        job.requests.insert(request_id.clone(), request);
        Ok(request_id)
    }
}

impl JobsApi for ClusterRest {
    fn jobs(&self) -> Result<Vec<(String, String)>, String> {
        let state = self.answering()?;
        let known = self.cluster.and_then(|seq| state.clusters.get(&seq)).map(|c| c.jobs.clone()).unwrap_or_default();
        Ok(known
            .iter()
            .filter_map(|id| state.jobs.get(id))
            .filter(|job| job.state != "GONE")
            .map(|job| (job.id.clone(), job.state.to_string()))
            .collect())
    }

    fn job(&self, job_id: &str) -> Result<Option<JobView>, String> {
        let mut state = self.answering()?;
        let Some(job) = self.own(&mut state, job_id) else { return Ok(None) };
        Ok(Some(JobView {
            state: job.state.to_string(),
            all_running: job.state == "RUNNING",
            starting: job.state == "CREATED",
            completed_checkpoints: job.checkpoint_ids,
            latest_checkpoint: job.latest_checkpoint.clone(),
            latest_savepoint: job.latest_savepoint.clone(),
            start_time: Some(job.submitted_at),
        }))
    }

    fn root_exception(&self, _job_id: &str) -> Option<String> {
        Some("the simulated job failed".into())
    }

    fn stop_with_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        self.trigger(job_id, directory, true)
    }

    fn trigger_savepoint(&self, job_id: &str, directory: &str) -> Result<String, String> {
        self.trigger(job_id, directory, false)
    }

    fn savepoint(&self, job_id: &str, request_id: &str) -> Result<SavepointState, String> {
        let mut state = self.answering()?;
        let job = self.own(&mut state, job_id).ok_or_else(|| format!("no job {job_id}"))?;
        let request = job.requests.get(request_id).ok_or_else(|| format!("no request {request_id}"))?;
        Ok(request.outcome.clone().unwrap_or(SavepointState::InProgress))
    }

    fn cancel(&self, job_id: &str) -> Result<(), String> {
        let mut state = self.answering()?;
        self.handle.act(&mut state, &format!("cancels job {job_id}"));
        let at = state.now + 10 + state.rng.below(200);
        let job = self.own(&mut state, job_id).ok_or_else(|| format!("no job {job_id}"))?;
        if !job.terminal() && job.cancel_at.is_none() {
            job.cancel_at = Some(at);
        }
        Ok(())
    }
}

impl ClusterBackend for Handle {
    fn describe(&self) -> String {
        "the simulation".into()
    }

    fn clusters(&self, _name: &str) -> Result<Vec<u64>, String> {
        Ok(self.sim.enter(self.actor).clusters.keys().copied().collect())
    }

    fn stop(&self, _name: &str, seq: u64) -> Result<(), String> {
        let mut state = self.sim.enter(self.actor);
        self.act(&mut state, &format!("stops cluster {seq}"));
        let now = state.now;
        let jobs = match state.clusters.get_mut(&seq) {
            Some(cluster) => {
                cluster.alive = false;
                cluster.revive_at = None;
                cluster.jobs.clone()
            }
            None => Vec::new(),
        };
        for id in jobs {
            if let Some(job) = state.jobs.get_mut(&id).filter(|job| !job.terminal()) {
                job.leave_running(now, "GONE");
            }
        }
        Ok(())
    }

    fn start(&self, _name: &str, seq: u64, target: &DeploymentSpec) -> Result<ClusterInfo, String> {
        let mut state = self.sim.enter(self.actor);
        self.act(&mut state, &format!("starts cluster {seq}"));
        if let Some(old) = state.clusters.remove(&seq) {
            let now = state.now;
            for id in old.jobs {
                if let Some(job) = state.jobs.get_mut(&id).filter(|job| !job.terminal()) {
                    job.leave_running(now, "GONE");
                }
            }
        }
        state.clusters.insert(seq, SimCluster { alive: true, jobs: Vec::new(), revive_at: None });
        Ok(ClusterInfo {
            rest_address: format!("sim://cluster-{seq}"),
            dir: format!("/sim/clusters/{seq}"),
            binary: target.binary.clone(),
            seq,
        })
    }

    /// With HA, the cluster's HA store holds each job's newest checkpoint, readable while
    /// its JobManager is down.
    fn recorded_checkpoint(&self, _name: &str, _cluster: &ClusterInfo, job_id: &str) -> Option<String> {
        let state = self.sim.enter(self.actor);
        if !state.ha_clusters {
            return None;
        }
        state.jobs.get(job_id).and_then(|job| job.latest_checkpoint.clone())
    }

    fn jobmanager_alive(&self, _name: &str, cluster: &ClusterInfo) -> bool {
        self.sim.enter(self.actor).clusters.get(&cluster.seq).is_some_and(|c| c.alive)
    }

    fn dry_run(&self, _name: &str, _target: &DeploymentSpec, snapshot: Option<&str>) -> Result<Vec<String>, String> {
        let state = self.sim.enter(self.actor);
        match snapshot {
            Some(location) if !state.snapshots.contains_key(location.trim_end_matches('/')) => {
                Err(format!("{location} does not exist"))
            }
            _ => Ok(Vec::new()),
        }
    }

    fn event(&self, _name: &str, warning: bool, reason: &str, message: &str) {
        let mut state = self.sim.state();
        let operator = state.actors[self.actor].operator;
        let kind = if warning { "warning" } else { "event" };
        state.trace.push(format!("  operator {operator} {kind} {reason}: {message}"));
    }

    fn submit(
        &self,
        _name: &str,
        cluster: &ClusterInfo,
        _target: &DeploymentSpec,
        restore_from: Option<&str>,
        job_id: Option<&str>,
    ) -> Result<String, String> {
        let mut state = self.sim.enter(self.actor);
        self.act(&mut state, &format!("submits a job to cluster {} from {restore_from:?}", cluster.seq));
        if !state.clusters.get(&cluster.seq).is_some_and(|c| c.alive) {
            return Err(format!("cluster {} does not answer", cluster.seq));
        }
        let restored = match restore_from {
            Some(location) => match state.snapshots.get(location.trim_end_matches('/')) {
                Some(snap) => Some(snap.clone()),
                None => return Err(format!("{location} does not exist")),
            },
            None => None,
        };
        let start = restored.as_ref().map_or(0, |snap| snap.progress);
        let id = match job_id {
            Some(id) => id.to_string(),
            // The cluster picks one (the real one at random).
            None => {
                state.next_job += 1;
                format!("{:032x}", state.next_job)
            }
        };
        if state.jobs.contains_key(&id) {
            return Err(format!("job {id} was submitted already"));
        }
        let now = state.now;
        let running_at = now + 20 + state.rng.below(300);
        let job = SimJob {
            id: id.clone(),
            cluster: cluster.seq,
            state: "CREATED",
            running_at,
            start_progress: start,
            stopped_at: None,
            committed: start,
            next_checkpoint_at: u64::MAX,
            checkpoint_ids: 0,
            retained: Vec::new(),
            latest_checkpoint: None,
            latest_savepoint: None,
            stop_savepoint: None,
            requests: BTreeMap::new(),
            cancel_at: None,
            finish_at: None,
            submitted_at: now,
        };
        state.trace.push(format!("  job {id} submitted to cluster {} at input position {start}", cluster.seq));
        state.jobs.insert(id.clone(), job);
        if let Some(snap) = restored {
            state.recover_commit(&id, &snap);
        }
        if let Some(cluster) = state.clusters.get_mut(&cluster.seq) {
            cluster.jobs.push(id.clone());
        }
        Ok(id)
    }
}

/// The store, with every write fenced on the writer's epoch (as the etcd store's
/// transaction compares the leader key's create revision).
impl DeploymentStore for Handle {
    fn apply(&self, mut deployment: WeirDeployment, retry: bool) -> Result<(ApplyOutcome, u64), StoreError> {
        let mut state = self.sim.enter(self.actor);
        let name = deployment.metadata.name.clone();
        let existing = state.store.get(&name).cloned();
        let outcome = next_generation(existing.as_ref(), &mut deployment, retry);
        let generation = deployment.metadata.generation;
        let status = existing.map(|e| e.status).unwrap_or_default();
        state.store.insert(name, StoredDeployment { deployment, status, delete_requested: false });
        Ok((outcome, generation))
    }

    fn get(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        Ok(self.sim.enter(self.actor).store.get(name).cloned())
    }

    fn list(&self) -> Result<Vec<StoredDeployment>, StoreError> {
        Ok(self.sim.enter(self.actor).store.values().cloned().collect())
    }

    fn request_delete(&self, name: &str) -> Result<bool, StoreError> {
        let mut state = self.sim.enter(self.actor);
        Ok(state.store.get_mut(name).map(|stored| stored.delete_requested = true).is_some())
    }

    fn remove(&self, name: &str, fence: &Fence) -> Result<(), StoreError> {
        let mut state = self.sim.enter(self.actor);
        fenced(&mut state, fence)?;
        state.store.remove(name);
        state.trace.push(format!("  the store forgets deployment {name}"));
        Ok(())
    }

    fn put_status(&self, name: &str, status: &DeploymentStatus, fence: &Fence) -> Result<(), StoreError> {
        let mut state = self.sim.enter(self.actor);
        fenced(&mut state, fence)?;
        if let Some(stored) = state.store.get_mut(name) {
            stored.status = status.clone();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "the simulated store".into()
    }
}

/// A write by `fence`'s leadership: checked locally, then against the current epoch.
fn fenced(state: &mut State, fence: &Fence) -> Result<(), StoreError> {
    fence.check()?;
    let epoch = fence.etcd_condition().map_or(0, |(_, epoch)| epoch as u64);
    if epoch != state.epoch {
        fence.mark_lost();
        return Err(StoreError::LeadershipLost(LeadershipLost));
    }
    Ok(())
}
