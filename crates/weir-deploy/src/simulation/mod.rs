//! A deterministic simulation of the deployment controller (issue 28): the real
//! [`Controller`], unchanged, run by two operators that elect a leader through a lease, over
//! a simulated world ([`world`]): deployment clusters whose jobs checkpoint and commit their
//! output, take, fail and complete savepoints, stop and get cancelled; snapshots in storage;
//! the deployment store, fenced on the writer's epoch. Each operator's controller runs on a
//! thread of its own, and a baton ([`baton`]) lets exactly one of them (or the driver) run
//! at a time, in an order drawn from the seed, switching at every call into the world.
//!
//! Faults: a leader frozen (SIGSTOP) past its lease, so the other takes over and the frozen
//! one wakes in the middle of what it was doing ("two operators acting at once"); an
//! operator killed at any call; a cluster's JobManager lost; a stop-with-savepoint failing.
//! A user applies new specs (upgrades in savepoint or last-state mode) meanwhile.
//!
//! Checked after every step: the deployment's output is committed exactly once across
//! every job it ran (a new job starts where the committed output ends); at most one of its
//! jobs runs at a time; only the leader of the current epoch stops, starts, submits,
//! cancels or disposes anything; and once faults stop, the newest spec runs STABLE. A
//! failure prints the seed, the trace and the command that replays it:
//!
//! ```text
//! WEIR_SIM_SEED=<seed> cargo test -p weir-deploy --lib simulation::tests::replay -- --ignored --nocapture
//! ```

mod baton;
mod tests;
mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_config::Configuration;

use crate::controller::{Controller, TICK};
use crate::fence::Fence;
use crate::spec::{UpgradeMode, WeirDeployment};
use crate::status::{LifecycleState, TriggerType, lifecycle_state};
use crate::store::{StoredDeployment, next_generation};
use world::{Actor, Handle, Killed, Operator, Sim, SimRng, State};

/// The operators' lease, in simulated milliseconds.
const LEASE_MS: u64 = 2_000;
/// A leadership guard holds for two thirds of the lease after the last renewal.
const GUARD_MS: u64 = LEASE_MS * 2 / 3;
/// The deployment's name.
const NAME: &str = "orders";

/// What one seed's run came to.
pub struct Report {
    pub seed: u64,
    pub steps: usize,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub generations: u64,
    pub elections: u64,
}

/// The shape of one run, drawn from its seed.
#[derive(Debug)]
struct Shape {
    mode: UpgradeMode,
    /// `kubernetes.operator.periodic.savepoint.interval` of 400 ms, and a history of at most
    /// 2 savepoints (older ones are disposed).
    periodic_savepoints: bool,
    /// `kubernetes.operator.deployment.rollback.enabled`, with a readiness timeout of 2 s.
    rollback: bool,
    fault_steps: usize,
    fault_one_in: u64,
    upgrades: u64,
    /// The step at which the user deletes the deployment, if they do (one seed in five).
    delete_at: Option<usize>,
    max_steps: usize,
}

struct Driver {
    sim: Arc<Sim>,
    shape: Shape,
    step: usize,
    threads: Vec<std::thread::JoinHandle<()>>,
    generation: u64,
    /// The job's version in the newest spec, and whether that spec is suspended.
    version: u64,
    suspended: bool,
    /// Specs applied while faults last.
    applied: u64,
    elections: u64,
    /// The newest `savepointTriggerNonce` the user set (a manual savepoint).
    nonce: Option<i64>,
    /// The user deleted the deployment: nothing is applied any more.
    deleted: bool,
    /// The user's choices added after the first seeds were recorded (manual savepoints,
    /// deletes) draw from a stream of their own, so that the other choices of a seed, and
    /// the regression seeds, stay as they were.
    user_rng: SimRng,
}

/// Runs the deployment of `seed` until it settles after its faults, or a violation.
pub fn run(seed: u64) -> Report {
    let mut rng = SimRng::new(seed);
    let shape = Shape {
        mode: if rng.one_in(2) { UpgradeMode::Savepoint } else { UpgradeMode::LastState },
        periodic_savepoints: rng.one_in(3),
        rollback: rng.one_in(3),
        fault_steps: 400 + rng.below(1600) as usize,
        fault_one_in: 15 + rng.below(60),
        upgrades: 1 + rng.below(4),
        delete_at: None,
        max_steps: 30_000,
    };
    let mut user_rng = SimRng::new(seed ^ 0x5eed_de1e_7e5a_0001);
    let shape =
        Shape { delete_at: user_rng.one_in(5).then(|| user_rng.below(shape.fault_steps as u64) as usize), ..shape };
    let mut state = State {
        rng,
        now: 0,
        trace: vec![format!("seed {seed}: {shape:?}")],
        violations: Vec::new(),
        store: BTreeMap::new(),
        clusters: BTreeMap::new(),
        jobs: BTreeMap::new(),
        snapshots: BTreeMap::new(),
        committed_end: 0,
        epoch: 0,
        leader: None,
        lease_until: 0,
        operators: (0..2).map(|_| Operator::default()).collect(),
        actors: Vec::new(),
        next_job: 0,
        next_request: 0,
        fail_next_stop: false,
        // A stream of its own, as the user's later choices: other seeds run as they did.
        ha_clusters: SimRng::new(seed ^ 0x4841_636c_7573_7465).one_in(3),
    };
    let ha = state.ha_clusters;
    state.trace.push(format!("clusters with high availability: {ha}"));
    let sim = Arc::new(Sim { state: Mutex::new(state), baton: baton::Baton::new() });
    let mut driver = Driver {
        sim,
        shape,
        step: 0,
        threads: Vec::new(),
        generation: 0,
        version: 1,
        suspended: false,
        applied: 0,
        elections: 0,
        nonce: None,
        deleted: false,
        user_rng,
    };
    driver.apply(Apply::Again);
    driver.elect(0);
    let mut settled_for = 0;
    while driver.step < driver.shape.max_steps && driver.sim.state().violations.is_empty() {
        driver.step += 1;
        driver.housekeeping();
        driver.next();
        driver.check();
        settled_for = if driver.settled() { settled_for + 1 } else { 0 };
        if !driver.faulting() && settled_for >= 50 {
            break;
        }
    }
    if settled_for == 0 && driver.sim.state().violations.is_empty() {
        let status = driver.sim.state().store.get(NAME).map(|s| format!("{:?}", lifecycle_state(&s.status)));
        driver.violation(format!(
            "the deployment did not settle on generation {} within {} steps ({status:?})",
            driver.generation, driver.step
        ));
    }
    driver.shutdown();
    let state = driver.sim.state();
    Report {
        seed,
        steps: driver.step,
        violations: state.violations.clone(),
        trace: state.trace.clone(),
        generations: driver.generation,
        elections: driver.elections,
    }
}

impl Driver {
    fn faulting(&self) -> bool {
        self.step < self.shape.fault_steps
    }

    fn violation(&self, message: String) {
        self.sim.state().violation(message);
    }

    /// The user applies a spec, as `weir deployment apply` does.
    fn apply(&mut self, what: Apply) {
        match what {
            Apply::Upgrade => self.version += 1,
            Apply::Suspend => self.suspended = true,
            Apply::Resume => self.suspended = false,
            Apply::Savepoint => self.nonce = Some(self.nonce.unwrap_or(0) + 1),
            Apply::Again => {}
        }
        let mut deployment = deployment(self.version, self.suspended, self.nonce, &self.shape);
        let mut state = self.sim.state();
        let existing = state.store.get(NAME).cloned();
        next_generation(existing.as_ref(), &mut deployment, what == Apply::Again);
        self.generation = deployment.metadata.generation;
        let (version, suspended) = (self.version, self.suspended);
        let nonce = self.nonce;
        state.trace.push(format!(
            "user: applies generation {} (version {version}, suspended: {suspended}, savepoint nonce: {nonce:?})",
            self.generation
        ));
        let status = existing.map(|e| e.status).unwrap_or_default();
        state.store.insert(NAME.into(), StoredDeployment { deployment, status, delete_requested: false });
    }

    /// Operator `operator` wins the election: a new epoch, and its controller starts.
    fn elect(&mut self, operator: usize) {
        self.elections += 1;
        let mut state = self.sim.state();
        state.epoch += 1;
        let epoch = state.epoch;
        // The one it replaces counts itself out by its own clock before the lease ends.
        if let Some(old) = state.leader
            && let Some(guard) = &state.operators[old].guard
        {
            guard.mark_lost();
        }
        let now = state.now;
        state.leader = Some(operator);
        state.lease_until = now + LEASE_MS;
        let guard = weir_ha::LeadershipGuard::external(epoch as i64);
        guard.renewed(Duration::from_secs(1 << 30));
        let actor = state.actors.len();
        state.actors.push(Actor { operator, epoch, wake_at: now, killed: false, done: false, atomic_next: false });
        let slot = &mut state.operators[operator];
        slot.actor = Some(actor);
        slot.guard = Some(guard.clone());
        slot.epoch = epoch;
        slot.renewed_at = now;
        state.trace.push(format!("operator {operator} leads epoch {epoch}"));
        drop(state);
        let fence = Fence::from_guard(guard, Some("/weir/sim/operator/leader".into()));
        let handle = Handle { sim: Arc::clone(&self.sim), actor };
        self.threads.push(std::thread::spawn(move || run_controller(handle, fence)));
    }

    /// Operators that wake or come back, the leader's lease, an election once it ran out.
    fn housekeeping(&mut self) {
        let mut state = self.sim.state();
        let now = state.now;
        for operator in 0..state.operators.len() {
            let slot = &mut state.operators[operator];
            if slot.dead_until.is_some_and(|until| until <= now) {
                slot.dead_until = None;
                state.trace.push(format!("operator {operator} restarted, standing by"));
                continue;
            }
            if slot.frozen_until != 0 && slot.frozen_until <= now {
                slot.frozen_until = 0;
                // Its guard expired by its own clock while it was stopped.
                if now > slot.renewed_at + GUARD_MS
                    && let Some(guard) = &slot.guard
                {
                    guard.mark_lost();
                }
                state.trace.push(format!("operator {operator} wakes"));
            }
        }
        let Some(leader) = state.leader else { return };
        let slot = &state.operators[leader];
        let running = slot.dead_until.is_none() && slot.frozen_until == 0;
        if running && slot.actor.is_some_and(|actor| !state.actors[actor].done) {
            state.lease_until = now + LEASE_MS;
            state.operators[leader].renewed_at = now;
            return;
        }
        if state.lease_until >= now {
            return;
        }
        let candidate = (0..state.operators.len()).find(|op| {
            *op != leader && state.operators[*op].dead_until.is_none() && state.operators[*op].frozen_until == 0
        });
        drop(state);
        if let Some(candidate) = candidate {
            self.elect(candidate);
        }
    }

    /// Actors that may run now.
    fn runnable(&self) -> Vec<usize> {
        let state = self.sim.state();
        (0..state.actors.len())
            .filter(|actor| {
                let a = &state.actors[*actor];
                let operator = &state.operators[a.operator];
                !a.done
                    && !a.killed
                    && a.wake_at <= state.now
                    && operator.frozen_until == 0
                    && operator.dead_until.is_none()
            })
            .collect()
    }

    /// One step the scheduler picks.
    fn next(&mut self) {
        let runnable = self.runnable();
        let pick = self.sim.state().rng.below(100);
        match pick {
            0..60 if !runnable.is_empty() => {
                let actor = runnable[self.sim.state().rng.below(runnable.len() as u64) as usize];
                self.sim.baton.run(actor);
            }
            60..62 if self.faulting() && self.applied < self.shape.upgrades && !self.deleted => {
                self.applied += 1;
                let what = match self.sim.state().rng.below(4) {
                    0 if !self.suspended => Apply::Suspend,
                    _ if self.suspended => Apply::Resume,
                    _ => Apply::Upgrade,
                };
                // One change in three is a manual savepoint instead (a new nonce).
                let what = if self.user_rng.one_in(3) { Apply::Savepoint } else { what };
                self.apply(what);
            }
            _ => self.advance_time(runnable.is_empty()),
        }
        if self.shape.delete_at == Some(self.step) {
            self.delete();
        }
        if !self.faulting() && !self.deleted {
            self.user_retries_a_refusal();
        }
        let fault = self.faulting() && {
            let one_in = self.shape.fault_one_in;
            self.sim.state().rng.one_in(one_in)
        };
        if fault {
            self.fault();
        }
    }

    /// Time goes on (to the next sleeper's wake-up when nobody can run), and the jobs with it.
    fn advance_time(&mut self, idle: bool) {
        let mut state = self.sim.state();
        let step = 1 + state.rng.below(30);
        let next_wake = state.actors.iter().filter(|a| !a.done && !a.killed).map(|a| a.wake_at).min();
        state.now = match next_wake {
            Some(wake) if idle && wake > state.now => wake.min(state.now + 200),
            _ => state.now + step,
        };
        state.advance_jobs();
    }

    /// The user deletes the deployment, as `weir deployment delete` (or `kubectl delete`)
    /// does: the operator is to stop its job and clusters and then forget it.
    fn delete(&mut self) {
        self.deleted = true;
        let mut state = self.sim.state();
        if let Some(stored) = state.store.get_mut(NAME) {
            stored.delete_requested = true;
        }
        state.trace.push("user: deletes the deployment".into());
    }

    /// After faults, a user whose upgrade was refused applies it again.
    fn user_retries_a_refusal(&mut self) {
        let refused = {
            let state = self.sim.state();
            state.store.get(NAME).is_some_and(|s| {
                s.status.operation.is_none() && s.status.refused_generation == Some(s.deployment.metadata.generation)
            })
        };
        let failed = {
            let state = self.sim.state();
            state.store.get(NAME).is_some_and(|s| {
                s.status.operation.is_none()
                    && matches!(lifecycle_state(&s.status), LifecycleState::Failed | LifecycleState::RolledBack)
            })
        };
        if refused && self.sim.state().rng.one_in(20) {
            self.apply(Apply::Again);
        } else if self.suspended && self.sim.state().rng.one_in(20) {
            self.apply(Apply::Resume);
        } else if failed && self.sim.state().rng.one_in(50) {
            // A user fixes a failed or rolled-back release with a new one.
            self.apply(Apply::Upgrade);
        }
    }

    fn fault(&mut self) {
        let mut state = self.sim.state();
        let Some(leader) = state.leader else { return };
        let now = state.now;
        match state.rng.below(7) {
            0 | 1 => {
                let until = now + 300 + state.rng.below(4_000);
                if state.operators[leader].frozen_until == 0 && state.operators[leader].dead_until.is_none() {
                    state.operators[leader].frozen_until = until;
                    state.trace.push(format!("fault: operator {leader} frozen until {until} ms"));
                }
            }
            2 => {
                drop(state);
                self.kill_operator(leader);
            }
            3 => {
                // The cluster's JobManager dies (no HA): its job is gone, checkpoints stay.
                let live: Vec<(u64, String)> = state
                    .live_jobs()
                    .iter()
                    .filter(|job| job.checkpoint_ids > 0)
                    .map(|job| (job.cluster, job.id.clone()))
                    .collect();
                if let Some((seq, id)) = live.first().cloned() {
                    state.trace.push(format!("fault: the JobManager of cluster {seq} died"));
                    // With HA it comes back (a pod restarted) and recovers the job from its
                    // restart point; a cancel under way is lost (no result recorded yet).
                    let recoverable = state.ha_clusters
                        && state
                            .jobs
                            .get(&id)
                            .is_some_and(|job| job.latest_checkpoint.is_some() || job.stop_savepoint.is_some());
                    if let Some(cluster) = state.clusters.get_mut(&seq) {
                        cluster.alive = false;
                        cluster.revive_at = recoverable.then_some(now + 800);
                    }
                    if let Some(job) = state.jobs.get_mut(&id) {
                        job.state = "GONE";
                        job.stopped_at = Some(job.progress(now));
                    }
                }
            }
            4 => {
                state.trace.push("fault: the next stop-with-savepoint fails".into());
                state.fail_next_stop = true;
            }
            5 => {
                // The job FAILS (its restart strategy gave up); its cluster stays. (One that
                // never checkpointed needs a person: "Manual restore required.")
                let running: Option<String> = state
                    .live_jobs()
                    .iter()
                    .find(|job| job.state == "RUNNING" && job.finish_at.is_none() && job.checkpoint_ids > 0)
                    .map(|job| job.id.clone());
                if let Some(id) = running {
                    state.trace.push(format!("fault: job {id} FAILED"));
                    if let Some(job) = state.jobs.get_mut(&id) {
                        let progress = job.progress(now);
                        job.stopped_at = Some(progress);
                        job.state = "FAILED";
                    }
                }
            }
            _ => {
                let other = 1 - leader;
                drop(state);
                self.kill_operator(other);
            }
        }
    }

    /// kill -9 of operator `operator`: its controller dies at its next call.
    fn kill_operator(&mut self, operator: usize) {
        let actor = {
            let mut state = self.sim.state();
            if state.operators[operator].dead_until.is_some() {
                return;
            }
            let until = state.now + 200 + state.rng.below(1_500);
            state.trace.push(format!("fault: operator {operator} killed"));
            let slot = &mut state.operators[operator];
            slot.dead_until = Some(until);
            slot.frozen_until = 0;
            slot.actor.take()
        };
        if let Some(actor) = actor {
            self.kill_actor(actor);
        }
    }

    fn kill_actor(&mut self, actor: usize) {
        self.sim.state().actors[actor].killed = true;
        while !self.sim.state().actors[actor].done {
            self.sim.baton.run(actor);
        }
    }

    /// The invariants that hold between steps.
    fn check(&mut self) {
        let mut state = self.sim.state();
        let live: Vec<String> =
            state.live_jobs().iter().map(|job| format!("{} on cluster {}", job.id, job.cluster)).collect();
        if live.len() > 1 {
            state.violation(format!("two jobs of the deployment run at once: {}", live.join(", ")));
        }
        // Deleted: what it ran was stopped first.
        if self.deleted && !state.store.contains_key(NAME) {
            let alive: Vec<u64> = state.clusters.iter().filter(|(_, c)| c.alive).map(|(seq, _)| *seq).collect();
            if !live.is_empty() || !alive.is_empty() {
                state.violation(format!(
                    "the deployment is deleted, yet jobs [{}] and clusters {alive:?} still run",
                    live.join(", ")
                ));
            }
        }
    }

    /// The newest spec runs: STABLE, its job RUNNING, its newest manual savepoint taken (or
    /// refused with a reason), nothing under way. A deleted deployment is gone.
    fn settled(&self) -> bool {
        let state = self.sim.state();
        let Some(stored) = state.store.get(NAME) else { return self.deleted };
        if self.deleted {
            return false;
        }
        let status = &stored.status;
        let running = state.live_jobs().iter().any(|job| job.state == "RUNNING");
        lifecycle_state(status) == LifecycleState::Stable
            && status.last_savepoint_nonce == self.nonce
            && status.pending_savepoint.as_ref().is_none_or(|pending| pending.trigger_type != TriggerType::Manual)
            && status.operation.is_none()
            && status.observed_generation == stored.deployment.metadata.generation
            && status.refused_generation != Some(stored.deployment.metadata.generation)
            && running
    }

    /// Every actor ends: killed at its next call.
    fn shutdown(&mut self) {
        let actors = self.sim.state().actors.len();
        for actor in 0..actors {
            self.kill_actor(actor);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One operator's term: the real controller reconciles every tick while its leadership
/// holds. A panic other than the kill is a violation.
fn run_controller(handle: Handle, fence: Fence) {
    let sim = Arc::clone(&handle.sim);
    sim.baton.await_turn(handle.actor);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let store = Arc::new(handle.clone());
        let backend = Arc::new(handle.clone());
        let world = Arc::new(handle.clone());
        let controller = Controller::in_world(
            store,
            Configuration::new(),
            PathBuf::from("/sim/deployments"),
            fence.clone(),
            backend,
            world.clone(),
        );
        while fence.is_held() {
            controller.reconcile_all();
            crate::world::World::sleep(world.as_ref(), TICK);
        }
    }));
    let mut state = sim.state();
    if let Err(payload) = outcome
        && payload.downcast_ref::<Killed>().is_none()
    {
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        state.violation(format!("the controller panicked: {message}"));
    }
    let operator = state.actors[handle.actor].operator;
    state.actors[handle.actor].done = true;
    state.trace.push(format!("operator {operator}'s controller (actor {}) ended", handle.actor));
    drop(state);
    sim.baton.end();
}

/// What the user applies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Apply {
    /// The next version of the job.
    Upgrade,
    Suspend,
    Resume,
    /// A new `savepointTriggerNonce`: a manual savepoint.
    Savepoint,
    /// The same spec again (`weir deployment apply` after a refusal).
    Again,
}

/// The deployment as the user applies it: version `version` of the job, upgraded in `mode`.
fn deployment(version: u64, suspended: bool, nonce: Option<i64>, shape: &Shape) -> WeirDeployment {
    let mode = shape.mode;
    let mut configuration = serde_json::json!({
        "state.checkpoints.dir": "sim://chk",
        "state.savepoints.dir": "sim://sp",
        "execution.checkpointing.interval": "200ms"
    });
    if shape.periodic_savepoints {
        configuration["kubernetes.operator.periodic.savepoint.interval"] = "400ms".into();
        configuration["kubernetes.operator.savepoint.history.max.count"] = "2".into();
    }
    if shape.rollback {
        configuration["kubernetes.operator.deployment.rollback.enabled"] = "true".into();
        configuration["kubernetes.operator.deployment.readiness.timeout"] = "2s".into();
    }
    let state = if suspended { "suspended" } else { "running" };
    let mut value = serde_json::json!({
        "apiVersion": "weir.dev/v1",
        "kind": "WeirDeployment",
        "metadata": { "name": NAME },
        "spec": {
            "binary": "/sim/weir",
            "configuration": configuration,
            "job": {
                "name": "counter",
                "args": ["--version", version.to_string()],
                "upgradeMode": mode.as_str(),
                "state": state
            }
        }
    });
    if let Some(nonce) = nonce {
        value["spec"]["job"]["savepointTriggerNonce"] = nonce.into();
    }
    match serde_json::from_value(value) {
        Ok(deployment) => deployment,
        Err(error) => unreachable!("the simulation's spec is valid: {error}"),
    }
}
