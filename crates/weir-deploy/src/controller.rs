//! The deployment controller: every tick, for every deployment, compare the applied spec with
//! what runs and move it there, as the Flink Kubernetes Operator's reconciler does.
//!
//! A change that takes several steps (an upgrade: pre-flight, stop the old job as the mode
//! says, stop the old cluster, start the new cluster, submit the new job) is an
//! [`Operation`]. Each step is written to the status *before* it acts, and every step can be
//! taken again from what it finds: a controller killed at any point resumes the operation
//! where it was. The old cluster's processes are all gone before a new cluster starts, so
//! two jobs of one deployment never run at once, and a savepoint is in the status (and its
//! history) as soon as it completed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use weir_config::Configuration;
use weir_config::options::{
    CHECKPOINTING_INTERVAL, CHECKPOINTING_TIMEOUT, OPERATOR_JM_DEPLOYMENT_RECOVERY, OPERATOR_LAST_STATE_FALLBACK,
    OPERATOR_PERIODIC_SAVEPOINT_INTERVAL, OPERATOR_READINESS_TIMEOUT, OPERATOR_ROLLBACK_ENABLED,
    OPERATOR_SAVEPOINT_HISTORY_MAX_AGE, OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT, RESTORE_NEWEST_RETAINED,
};

use crate::backend::{ClusterBackend, ProcessClusters};
use crate::cluster_api::{JobView, SavepointState};
use crate::effects::{ControllerEffect, EffectAnswer};
use crate::events::DeploymentEvent;
use crate::fence::Fence;
use crate::history::{HistoryLimits, trim};
use crate::processes::DeploymentDirs;
use crate::spec::{DeploymentSpec, DesiredState, UpgradeMode, upgrade_diff};
use crate::status::{
    ClusterInfo, DeploymentStatus, MANUAL_RESTORE_REQUIRED, Operation, OperationKind, PendingSavepoint,
    ReconciliationState, SavepointRecord, Step, TriggerType, lifecycle_state,
};
use crate::store::{DeploymentStore, StoredDeployment};
use crate::wake::Wake;
use crate::world::{JobsApi, RealWorld, World};

/// How often the controller looks at every deployment.
pub const TICK: Duration = Duration::from_millis(100);
/// How often it polls a savepoint or a job's state while it waits for one.
const POLL: Duration = Duration::from_millis(10);
/// Longest wait for a cancelled or stopped job to reach a terminal state.
const TERMINAL_WAIT_MAX: Duration = Duration::from_secs(120);
/// Attempts at starting a cluster and submitting its job before the spec counts as
/// deployed-and-failing (then readiness and rollback take over).
const START_ATTEMPTS: u32 = 3;
/// Savepoints and stops are retried this long while the job cannot take one yet (its
/// subtasks still starting, a restart under way).
const TRIGGER_RETRY_MAX: Duration = Duration::from_secs(30);

/// The controller of one store's deployments.
pub struct Controller {
    store: Arc<dyn DeploymentStore>,
    /// The operator's own configuration (defaults of the `kubernetes.operator.*` keys).
    config: Configuration,
    /// `<data dir>/deployments`: each deployment's processes and default state directories.
    root: PathBuf,
    /// Failed start attempts of the operation under way, per deployment.
    start_failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// The leadership every status write and process action is conditioned on.
    fence: Fence,
    /// Where the clusters run.
    backend: Arc<dyn ClusterBackend>,
    /// The clock, the clusters' REST APIs, storage.
    world: Arc<dyn World>,
}

/// What a reconcile pass did, for the loop's logging.
type Outcome = Result<(), String>;

/// What one pass over every deployment found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pass {
    /// No deployment was mid-operation or being deleted, and no step failed: nothing will
    /// move until something changes.
    pub at_rest: bool,
}

impl Controller {
    /// A controller of `store`'s deployments, with their processes under `root`, acting
    /// while `fence`'s leadership holds.
    pub fn new(store: Arc<dyn DeploymentStore>, config: Configuration, root: PathBuf, fence: Fence) -> Controller {
        let backend = Arc::new(ProcessClusters::new(root.clone()));
        Controller::with_backend(store, config, root, fence, backend)
    }

    /// A controller whose clusters run on `backend` (`root` keeps the deployments' default
    /// state directories).
    pub fn with_backend(
        store: Arc<dyn DeploymentStore>,
        config: Configuration,
        root: PathBuf,
        fence: Fence,
        backend: Arc<dyn ClusterBackend>,
    ) -> Controller {
        Controller::in_world(store, config, root, fence, backend, Arc::new(RealWorld))
    }

    /// A controller in `world` (the simulation's; [`RealWorld`] otherwise).
    pub fn in_world(
        store: Arc<dyn DeploymentStore>,
        config: Configuration,
        root: PathBuf,
        fence: Fence,
        backend: Arc<dyn ClusterBackend>,
        world: Arc<dyn World>,
    ) -> Controller {
        Controller { store, config, root, start_failures: Default::default(), fence, backend, world }
    }

    fn now_ms(&self) -> u64 {
        self.world.now_ms()
    }

    /// The REST API of deployment `name`'s cluster.
    fn api(&self, name: &str, cluster: &crate::status::ClusterInfo) -> Box<dyn JobsApi> {
        self.world.jobs_api(&self.backend.rest_address(name, cluster))
    }

    /// The cluster an operation starts: the one after the newest it knew of.
    fn next_cluster(&self, name: &str, operation: &Operation) -> Result<u64, String> {
        let clusters = if operation.newest_cluster.is_some() { Vec::new() } else { self.clusters(name)? };
        Ok(next_cluster_after(operation, &clusters))
    }

    /// The sequence numbers of `name`'s clusters (none when the backend cannot tell: the
    /// next step that needs them fails and is retried).
    fn clusters(&self, name: &str) -> Result<Vec<u64>, String> {
        self.backend.clusters(name)
    }

    /// Reconciles every deployment each [`TICK`] until `stop` is set or the leadership is
    /// lost.
    pub fn run(&self, stop: &AtomicBool) {
        self.run_woken(stop, &Wake::new(), TICK);
    }

    /// Reconciles every deployment until `stop` is set or the leadership is lost: the next
    /// pass starts when `wake` is notified (a watched change), after [`TICK`] while some
    /// deployment is mid-operation (its steps poll clusters that emit no watch events), and
    /// after `idle` when every deployment was at rest (a resync, as a kube-rs controller
    /// requeues).
    pub fn run_woken(&self, stop: &AtomicBool, wake: &Wake, idle: Duration) {
        while !stop.load(Ordering::Relaxed) {
            if !self.fence.is_held() {
                tracing::warn!("the operator's leadership is lost: the controller stops acting");
                return;
            }
            let pass = self.reconcile_all();
            wake.wait(if pass.at_rest { idle.max(TICK) } else { TICK });
        }
    }

    /// Ok while this controller may act: [`Self::carry_out`] asks right before every
    /// effect on a cluster or storage; a step asks before it begins.
    fn acting(&self) -> Outcome {
        self.fence.check().map_err(|lost| lost.to_string())?;
        self.world.acting_next();
        Ok(())
    }

    /// Carries out `effect` on deployment `name`'s world: the one place the controller acts.
    /// An effect on a cluster or storage waits for the leadership check, and nothing comes
    /// between the two; each is logged at `info` (a status write at `debug`).
    fn carry_out(&self, name: &str, effect: ControllerEffect<'_>) -> Result<EffectAnswer, String> {
        // The cluster's API is made before the check, which the next call into the world
        // must follow at once.
        let api = match &effect {
            ControllerEffect::CancelJob { cluster, .. }
            | ControllerEffect::StopWithSavepoint { cluster, .. }
            | ControllerEffect::TriggerSavepoint { cluster, .. } => Some(self.api(name, cluster)),
            _ => None,
        };
        match &effect {
            ControllerEffect::Report { warning: true, message, .. } => tracing::warn!(deployment = %name, "{message}"),
            ControllerEffect::Report { message, .. } => tracing::info!(deployment = %name, "{message}"),
            ControllerEffect::WriteStatus { .. } => tracing::debug!(deployment = %name, "{effect}"),
            _ => tracing::info!(deployment = %name, "{effect}"),
        }
        if effect.acts() {
            self.acting()?;
        }
        match (&effect, api) {
            (ControllerEffect::StopCluster { seq }, _) => self.backend.stop(name, *seq).map(|()| EffectAnswer::Done),
            (ControllerEffect::StartCluster { seq, target }, _) => {
                self.backend.start(name, *seq, target).map(EffectAnswer::Cluster)
            }
            (ControllerEffect::SubmitJob { cluster, target, restore_from, job_id }, _) => {
                self.backend.submit(name, cluster, target, *restore_from, *job_id).map(EffectAnswer::Job)
            }
            (ControllerEffect::CancelJob { job_id, .. }, Some(api)) => {
                api.cancel(job_id).map(|()| EffectAnswer::Done).map_err(|e| format!("cannot cancel job {job_id}: {e}"))
            }
            (ControllerEffect::StopWithSavepoint { job_id, directory, .. }, Some(api)) => {
                api.stop_with_savepoint(job_id, directory).map(EffectAnswer::Request)
            }
            (ControllerEffect::TriggerSavepoint { job_id, directory, .. }, Some(api)) => {
                api.trigger_savepoint(job_id, directory).map(EffectAnswer::Request)
            }
            (ControllerEffect::DisposeSnapshot { location }, _) => {
                self.world.dispose(location).map(|()| EffectAnswer::Done)
            }
            (ControllerEffect::WriteStatus { status }, _) => {
                self.store.put_status(name, status, &self.fence).map(|()| EffectAnswer::Done).map_err(|e| e.to_string())
            }
            (ControllerEffect::RemoveDeployment, _) => {
                self.store.remove(name, &self.fence).map(|()| EffectAnswer::Done).map_err(|e| e.to_string())
            }
            (ControllerEffect::Report { warning, reason, message }, _) => {
                self.backend.event(name, *warning, reason, message);
                let event = DeploymentEvent::now(*warning, reason, message);
                if let Err(error) = self.store.record_event(name, &event) {
                    tracing::debug!(deployment = %name, "the event was not recorded: {error}");
                }
                Ok(EffectAnswer::Done)
            }
            (_, None) => Err(format!("no cluster API for {effect}")),
        }
    }

    /// Reports a step (or, `warning`, a failure) of deployment `name`: the log, and on
    /// Kubernetes an Event on the resource with `reason`.
    fn report(&self, name: &str, warning: bool, reason: &str, message: &str) {
        // A report cannot fail: a backend that cannot record an event logs why.
        let _ = self.carry_out(name, ControllerEffect::Report { warning, reason, message });
    }

    /// One pass over every deployment.
    pub fn reconcile_all(&self) -> Pass {
        let deployments = match self.store.list() {
            Ok(deployments) => deployments,
            Err(error) => {
                tracing::warn!("cannot read the deployments from {}: {error}", self.store.describe());
                return Pass { at_rest: false };
            }
        };
        let mut pass = Pass { at_rest: true };
        for stored in deployments {
            if !self.fence.is_held() {
                return Pass { at_rest: false };
            }
            let name = stored.deployment.metadata.name.clone();
            // A step started by this pass is written to the status, and that write is
            // itself a watched change; so the state read here is enough to judge.
            pass.at_rest &= stored.status.operation.is_none() && !stored.delete_requested;
            if let Err(error) = self.reconcile(stored) {
                pass.at_rest = false;
                tracing::warn!(deployment = %name, "{error}");
            }
        }
        pass
    }

    fn dirs(&self, name: &str) -> DeploymentDirs {
        DeploymentDirs::new(self.root.join(name))
    }

    /// The operator's settings for a deployment: its own configuration, overridden by the
    /// `kubernetes.operator.*` keys of the deployment's spec.
    fn settings(&self, spec: &DeploymentSpec) -> Configuration {
        let mut config = self.config.clone();
        for (key, value) in &spec.configuration {
            if key.starts_with("kubernetes.operator.") {
                config.set_from(key.clone(), value.clone(), "spec.configuration");
            }
        }
        config
    }

    fn save(&self, name: &str, status: &mut DeploymentStatus) -> Outcome {
        status.lifecycle_state = lifecycle_state(status);
        self.carry_out(name, ControllerEffect::WriteStatus { status }).map(drop)
    }

    /// Looks at one deployment and takes its next step, if any.
    pub fn reconcile(&self, stored: StoredDeployment) -> Outcome {
        let name = stored.deployment.metadata.name.clone();
        let generation = stored.deployment.metadata.generation;
        let spec = stored.deployment.spec.clone();
        let mut status = stored.status.clone();
        let before = status.clone();

        if stored.delete_requested && status.operation.as_ref().is_none_or(|op| op.kind != OperationKind::Delete) {
            status.deleting = true;
            let mode = UpgradeMode::Stateless;
            status.operation = Some(self.operation(
                &name,
                OperationKind::Delete,
                generation,
                None,
                mode,
                Step::StopJob { request_id: None },
            ));
            self.save(&name, &mut status)?;
        }
        if let Some(operation) = status.operation.clone() {
            return self.advance(&name, &mut status, operation);
        }

        self.observe(&name, &spec, &mut status);
        let decided = self.decide(&name, generation, &spec, &mut status);
        if let Some(operation) = decided {
            self.report(
                &name,
                false,
                "OperationStarted",
                &format!("{:?} to generation {generation}: {}", operation.kind, operation.step.describe()),
            );
            match operation.kind {
                OperationKind::Rollback => status.reconciliation_status.state = ReconciliationState::RollingBack,
                OperationKind::Deploy | OperationKind::Recover => {}
                _ => status.reconciliation_status.state = ReconciliationState::Upgrading,
            }
            status.reconciliation_status.reconciliation_timestamp = self.now_ms();
            status.operation = Some(operation.clone());
            self.save(&name, &mut status)?;
            return self.advance(&name, &mut status, operation);
        }
        self.savepoints(&name, &spec, &mut status);
        if status != before {
            self.save(&name, &mut status)?;
        }
        Ok(())
    }

    fn operation(
        &self,
        name: &str,
        kind: OperationKind,
        generation: u64,
        target: Option<DeploymentSpec>,
        mode: UpgradeMode,
        step: Step,
    ) -> Operation {
        Operation {
            kind,
            generation,
            target,
            mode,
            step,
            restore_from: None,
            allow_non_restored_state: false,
            started_ms: self.now_ms(),
            newest_cluster: self.clusters(name).ok().map(|seqs| seqs.last().copied().unwrap_or(0)),
        }
    }

    /// The spec whose job runs now: the last stable one after a rollback, else the last
    /// reconciled one.
    fn running_spec(status: &DeploymentStatus) -> Option<&DeploymentSpec> {
        let reconciliation = &status.reconciliation_status;
        match reconciliation.state {
            ReconciliationState::RolledBack => reconciliation.last_stable_spec.as_ref(),
            _ => reconciliation.last_reconciled_spec.as_ref(),
        }
    }

    /// What change the spec asks for, if any.
    fn decide(
        &self,
        name: &str,
        generation: u64,
        spec: &DeploymentSpec,
        status: &mut DeploymentStatus,
    ) -> Option<Operation> {
        let Some(last) = status.reconciliation_status.last_reconciled_spec.clone() else {
            status.observed_generation = generation;
            if spec.job.state == DesiredState::Suspended {
                // Applied suspended: nothing runs until it is resumed.
                status.reconciliation_status.last_reconciled_spec = Some(spec.clone());
                return None;
            }
            let mut operation = self.operation(
                name,
                OperationKind::Deploy,
                generation,
                Some(spec.clone()),
                spec.job.upgrade_mode,
                Step::PreFlight,
            );
            operation.restore_from = spec.job.initial_savepoint_path.clone();
            return Some(operation);
        };
        let refused = status.refused_generation == Some(generation);
        match (last.job.state, spec.job.state) {
            (DesiredState::Running, DesiredState::Running) => {
                self.decide_running(name, generation, spec, &last, refused, status)
            }
            (DesiredState::Running, DesiredState::Suspended) => {
                status.observed_generation = generation;
                Some(self.operation(
                    name,
                    OperationKind::Suspend,
                    generation,
                    None,
                    spec.job.upgrade_mode,
                    Step::StopJob { request_id: None },
                ))
            }
            (DesiredState::Suspended, DesiredState::Running) => {
                status.observed_generation = generation;
                Some(self.resume(name, generation, spec, &last, status))
            }
            (DesiredState::Suspended, DesiredState::Suspended) => {
                status.observed_generation = generation;
                // The mode the suspend stopped the job in says where the resume starts (a
                // savepoint suspend of a job that was not running fell back to last-state);
                // the new spec's mode must not overwrite it (found by the simulation: the
                // resume started empty).
                let mut reconciled = spec.clone();
                reconciled.job.upgrade_mode = last.job.upgrade_mode;
                status.reconciliation_status.last_reconciled_spec = Some(reconciled);
                None
            }
        }
    }

    /// A running deployment applied running again: an upgrade when the spec changed in a
    /// field that needs one (and the generation was not refused), else its health.
    fn decide_running(
        &self,
        name: &str,
        generation: u64,
        spec: &DeploymentSpec,
        last: &DeploymentSpec,
        refused: bool,
        status: &mut DeploymentStatus,
    ) -> Option<Operation> {
        let diff = upgrade_diff(last, spec);
        if !diff.is_empty() && !refused {
            status.observed_generation = generation;
            self.report(
                name,
                false,
                "SpecChanged",
                &format!("spec changed ({}): upgrade in {} mode", diff.join(", "), spec.job.upgrade_mode.as_str()),
            );
            let mut operation = self.operation(
                name,
                OperationKind::Upgrade,
                generation,
                Some(spec.clone()),
                spec.job.upgrade_mode,
                Step::PreFlight,
            );
            if diff.contains(&"spec.job.initialSavepointPath") {
                operation.restore_from = spec.job.initial_savepoint_path.clone();
            }
            return Some(operation);
        }
        if diff.is_empty() && status.reconciliation_status.state != ReconciliationState::RolledBack {
            // Fields only decisions read changed (the mode, the nonce, -n).
            status.reconciliation_status.last_reconciled_spec = Some(spec.clone());
            if status.reconciliation_status.last_stable_spec.as_ref() == Some(last) && status.job_status.ready {
                status.reconciliation_status.last_stable_spec = Some(spec.clone());
            }
        }
        if !refused {
            status.observed_generation = generation;
        }
        self.health(name, status)
    }

    /// A suspended deployment applied running: resumed from what the suspend left, as the
    /// mode it used says, unless the new spec is stateless or names its own start point (the
    /// operator's rule).
    fn resume(
        &self,
        name: &str,
        generation: u64,
        spec: &DeploymentSpec,
        last: &DeploymentSpec,
        status: &DeploymentStatus,
    ) -> Operation {
        let mut operation = self.operation(
            name,
            OperationKind::Resume,
            generation,
            Some(spec.clone()),
            spec.job.upgrade_mode,
            Step::PreFlight,
        );
        operation.restore_from = if upgrade_diff(last, spec).contains(&"spec.job.initialSavepointPath") {
            spec.job.initial_savepoint_path.clone()
        } else if spec.job.upgrade_mode == UpgradeMode::Stateless {
            None
        } else {
            match last.job.upgrade_mode {
                UpgradeMode::Savepoint => status.job_status.upgrade_savepoint_path.clone(),
                UpgradeMode::LastState => status.job_status.last_checkpoint_path.clone(),
                UpgradeMode::Stateless => None,
            }
        };
        operation
    }

    /// Readiness, rollback and recovery of a deployment whose spec is deployed.
    fn health(&self, name: &str, status: &mut DeploymentStatus) -> Option<Operation> {
        let running = Self::running_spec(status)?.clone();
        let settings = self.settings(&running);
        let reconciliation = &status.reconciliation_status;
        if status.job_status.ready
            && reconciliation.state == ReconciliationState::Deployed
            && reconciliation.last_stable_spec != reconciliation.last_reconciled_spec
        {
            status.reconciliation_status.last_stable_spec = status.reconciliation_status.last_reconciled_spec.clone();
            self.report(name, false, "Stable", "the deployed spec is running: STABLE");
            return None;
        }
        let cluster_gone = match &status.cluster_info {
            Some(cluster) => !self.backend.jobmanager_alive(name, cluster),
            None => true,
        };
        if let Some(operation) = self.rollback(name, status, &settings, cluster_gone) {
            return Some(operation);
        }
        let reconciliation = &status.reconciliation_status;
        if cluster_gone
            && status.cluster_info.is_some()
            && reconciliation.state != ReconciliationState::Upgrading
            && settings.get(&OPERATOR_JM_DEPLOYMENT_RECOVERY).unwrap_or(true)
        {
            return self.recover(name, status, running);
        }
        None
    }

    /// A rollback to the last stable spec, when the Flink operator's conditions hold: enabled,
    /// the new generation not ready, and past the readiness timeout, FAILED, or its cluster gone.
    fn rollback(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        settings: &weir_config::Configuration,
        cluster_gone: bool,
    ) -> Option<Operation> {
        let job_failed = status.job_status.state.as_deref() == Some("FAILED");
        let reconciliation = &status.reconciliation_status;
        let rollback_enabled = settings.get(&OPERATOR_ROLLBACK_ENABLED).unwrap_or(false);
        let readiness = settings.get(&OPERATOR_READINESS_TIMEOUT).unwrap_or(Duration::from_secs(300));
        let waited = Duration::from_millis(self.now_ms().saturating_sub(reconciliation.reconciliation_timestamp));
        if !(rollback_enabled
            && !status.job_status.ready
            && reconciliation.state == ReconciliationState::Deployed
            && reconciliation.last_stable_spec.is_some()
            && reconciliation.last_stable_spec != reconciliation.last_reconciled_spec
            && reconciliation.last_stable_spec.as_ref().is_some_and(|s| s.job.state == DesiredState::Running)
            && (waited > readiness || job_failed || (cluster_gone && waited > Duration::from_secs(2))))
        {
            return None;
        }
        let target = reconciliation.last_stable_spec.clone();
        let reason = if job_failed {
            // The failure's cause, as observed (`job <id> FAILED: <cause>`).
            match status.error.as_deref().and_then(|e| e.split_once(" FAILED: ")) {
                Some((_, cause)) => format!("its job FAILED: {cause}"),
                None => "its job FAILED".to_string(),
            }
        } else if waited > readiness {
            format!("it did not get ready within the readiness timeout ({readiness:?})")
        } else {
            "its cluster is gone".to_string()
        };
        let message = format!(
            "generation {} is not running, {reason}: rolling back to the last stable spec",
            status.observed_generation
        );
        self.report(name, true, "RollingBack", &message);
        // Kept while the deployment is ROLLED_BACK: why the release was given up.
        status.error = Some(message);
        let mut operation = self.operation(
            name,
            OperationKind::Rollback,
            status.observed_generation,
            target,
            UpgradeMode::LastState,
            Step::StopJob { request_id: None },
        );
        // The new job's own newest checkpoint wins (found when it is stopped);
        // otherwise back to where the upgrade started.
        operation.restore_from = status.job_status.restored_from.clone();
        Some(operation)
    }

    /// Its JobManager is gone outside an upgrade: its cluster starts again from the job's own
    /// newest checkpoint (with HA, the one its cluster's HA store recorded, as Flink's
    /// operator recovers from the HA metadata), else where it started: never an earlier job's
    /// checkpoint (a job resumed from a savepoint that has not checkpointed yet would
    /// otherwise go back before that savepoint and write its output again).
    fn recover(&self, name: &str, status: &mut DeploymentStatus, running: DeploymentSpec) -> Option<Operation> {
        let restore = match running.job.upgrade_mode {
            UpgradeMode::Stateless => None,
            _ => self.current_job_checkpoint(name, status, None).or_else(|| status.job_status.restored_from.clone()),
        };
        if restore.is_none() && running.job.upgrade_mode != UpgradeMode::Stateless {
            let error = format!(
                "the JobManager of the deployment is gone and no checkpoint of its job is known. {MANUAL_RESTORE_REQUIRED} Set spec.job.initialSavepointPath to a savepoint or retained checkpoint and apply again"
            );
            if status.error.as_deref() != Some(&error) {
                tracing::warn!(deployment = %name, "{error}");
            }
            status.error = Some(error);
            return None;
        }
        self.report(name, true, "JobManagerLost", "its JobManager is gone: starting its cluster again");
        let mut operation = self.operation(
            name,
            OperationKind::Recover,
            status.observed_generation,
            Some(running),
            UpgradeMode::LastState,
            Step::StopCluster,
        );
        operation.restore_from = restore;
        Some(operation)
    }

    /// Updates the job's state from its cluster.
    fn observe(&self, name: &str, spec: &DeploymentSpec, status: &mut DeploymentStatus) {
        let (Some(cluster), Some(job_id)) = (status.cluster_info.clone(), status.job_status.job_id.clone()) else {
            return;
        };
        let api = self.api(name, &cluster);
        let Ok(Some(job)) = api.job(&job_id) else { return };
        let changed = status.job_status.state.as_deref() != Some(&job.state);
        if changed {
            self.report(name, false, "JobStatusChanged", &format!("job {}", job.state));
            status.job_status.state = Some(job.state.clone());
            status.job_status.update_time = Some(self.now_ms());
        }
        if let Some(path) = &job.latest_checkpoint {
            status.job_status.last_checkpoint_path = Some(path.clone());
        }
        // Once, as it fails: a later error (an upgrade that needs a manual restore) stays.
        if job.state == "FAILED" && (changed || status.error.is_none()) {
            let cause = api.root_exception(&job_id).unwrap_or_else(|| "no cause recorded".into());
            status.error = Some(format!("job {job_id} FAILED: {cause}"));
        }
        let running = Self::running_spec(status).unwrap_or(spec);
        let checkpointing = processes_config_checkpointing(running);
        let ready = job.state == "RUNNING" && job.all_running && (!checkpointing || job.completed_checkpoints > 0);
        if ready && !status.job_status.ready {
            status.job_status.ready = true;
            // ROLLED_BACK shows why until the next spec is applied.
            if status.reconciliation_status.state != ReconciliationState::RolledBack {
                status.error = None;
            }
        }
    }

    /// Manual (nonce) and periodic savepoints, the one in flight, and the history's limits.
    fn savepoints(&self, name: &str, spec: &DeploymentSpec, status: &mut DeploymentStatus) {
        let (Some(cluster), Some(job_id)) = (status.cluster_info.clone(), status.job_status.job_id.clone()) else {
            return;
        };
        let api = self.api(name, &cluster);
        let settings = self.settings(spec);
        if let Some(pending) = status.pending_savepoint.clone() {
            match api.savepoint(&pending.job_id, &pending.request_id) {
                Ok(SavepointState::InProgress) => return,
                Ok(SavepointState::Completed(location)) => {
                    self.report(
                        name,
                        false,
                        "SavepointCompleted",
                        &format!("{} savepoint {location}", pending.trigger_type.as_str()),
                    );
                    status.savepoint_history.push(SavepointRecord {
                        time_stamp: self.now_ms(),
                        location,
                        trigger_type: pending.trigger_type,
                        format_type: "CANONICAL".into(),
                        trigger_nonce: pending.nonce,
                    });
                }
                Ok(SavepointState::Failed(cause)) => {
                    status.error = Some(format!(
                        "the {} savepoint failed: {cause}; change spec.job.savepointTriggerNonce to try again",
                        pending.trigger_type.as_str()
                    ));
                }
                Err(error) => {
                    status.error = Some(format!("cannot follow the savepoint request {}: {error}", pending.request_id))
                }
            }
            status.pending_savepoint = None;
        }
        let ready = status.job_status.ready && status.job_status.state.as_deref() == Some("RUNNING");
        if ready {
            let target = savepoint_dir(spec, &self.dirs(name));
            let manual = spec.job.savepoint_trigger_nonce.filter(|n| status.last_savepoint_nonce != Some(*n));
            let periodic = settings.get(&OPERATOR_PERIODIC_SAVEPOINT_INTERVAL).ok().flatten().filter(|interval| {
                self.now_ms().saturating_sub(status.last_periodic_savepoint_ms) >= interval.as_millis() as u64
            });
            let trigger = match (manual, periodic) {
                (Some(nonce), _) => Some((TriggerType::Manual, Some(nonce))),
                (None, Some(_)) => Some((TriggerType::Periodic, None)),
                _ => None,
            };
            if let Some((trigger_type, nonce)) = trigger
                && self.acting().is_ok()
            {
                let effect =
                    ControllerEffect::TriggerSavepoint { cluster: &cluster, job_id: &job_id, directory: &target };
                match self.carry_out(name, effect).and_then(EffectAnswer::id) {
                    Ok(request_id) => {
                        status.pending_savepoint =
                            Some(PendingSavepoint { job_id: job_id.clone(), request_id, trigger_type, nonce });
                    }
                    Err(error) => {
                        status.error = Some(format!("cannot trigger a {} savepoint: {error}", trigger_type.as_str()))
                    }
                }
                match trigger_type {
                    TriggerType::Manual => status.last_savepoint_nonce = nonce,
                    _ => status.last_periodic_savepoint_ms = self.now_ms(),
                }
            }
        }
        self.trim_history(name, spec, status);
    }

    fn trim_history(&self, name: &str, spec: &DeploymentSpec, status: &mut DeploymentStatus) {
        let settings = self.settings(spec);
        let limits = HistoryLimits {
            max_count: settings.get(&OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT).unwrap_or(10),
            max_age: settings.get(&OPERATOR_SAVEPOINT_HISTORY_MAX_AGE).unwrap_or(Duration::from_secs(86_400)),
        };
        let mut protected: Vec<&str> = Vec::new();
        if let Some(path) = &status.job_status.upgrade_savepoint_path {
            protected.push(path);
        }
        if let Some(path) = &status.job_status.restored_from {
            protected.push(path);
        }
        let (kept, disposed) = trim(&status.savepoint_history, limits, self.now_ms(), &protected);
        if disposed.is_empty() {
            return;
        }
        for record in &disposed {
            if self.acting().is_err() {
                return;
            }
            match self.carry_out(name, ControllerEffect::DisposeSnapshot { location: &record.location }) {
                Ok(_) => tracing::info!(deployment = %name, "savepoint {} disposed (history limits)", record.location),
                Err(error) => {
                    tracing::warn!(deployment = %name, "savepoint {} left in place: {error}", record.location)
                }
            }
        }
        status.savepoint_history = kept;
    }

    /// Takes the operation's next step, recording each before it acts.
    fn advance(&self, name: &str, status: &mut DeploymentStatus, mut operation: Operation) -> Outcome {
        let dirs = self.dirs(name);
        loop {
            self.acting()?;
            let next = match operation.step.clone() {
                Step::PreFlight => self.pre_flight(name, status, &mut operation)?,
                Step::StopJob { request_id } => self.stop_job(name, &dirs, status, &mut operation, request_id)?,
                Step::StopCluster => {
                    self.stop_clusters(name, status, &mut operation)?;
                    match operation.kind {
                        OperationKind::Suspend => return self.finish(name, status, operation),
                        OperationKind::Delete => {
                            self.carry_out(name, ControllerEffect::RemoveDeployment)?;
                            tracing::info!(deployment = %name, "deleted");
                            return Ok(());
                        }
                        _ => Some(Step::StartCluster { seq: self.next_cluster(name, &operation)? }),
                    }
                }
                Step::StartCluster { seq } => match self.start_cluster(name, status, &operation, seq) {
                    Ok(()) => {
                        self.world.crash_point("operator-after-cluster-started");
                        // The new job's id is chosen and recorded before it is submitted (as
                        // Flink's operator fixes it): a job submitted by a controller that
                        // died before hearing back is still known, and so are its checkpoints
                        // when its cluster is gone too.
                        status.job_status.job_id = Some(self.world.new_job_id());
                        Some(Step::SubmitJob { seq })
                    }
                    Err(error) => return self.start_failed(name, status, operation, error),
                },
                Step::SubmitJob { .. } => match self.submit(name, status, &operation) {
                    Ok(()) => {
                        self.world.crash_point("operator-after-submit");
                        return self.finish(name, status, operation);
                    }
                    Err(error) => return self.start_failed(name, status, operation, error),
                },
            };
            match next {
                Some(step) => {
                    operation.step = step;
                    status.operation = Some(operation.clone());
                    self.save(name, status)?;
                }
                // The operation was given up (a refusal): the status says why.
                None => return Ok(()),
            }
        }
    }

    /// Stops the deployment's clusters this operation may stop; the cluster is gone after.
    fn stop_clusters(&self, name: &str, status: &mut DeploymentStatus, operation: &mut Operation) -> Outcome {
        for seq in self.clusters(name)? {
            if operation.newest_cluster.is_some_and(|newest| seq > newest) {
                // Started after this operation began, so by another controller:
                // not this operation's to stop.
                tracing::warn!(deployment = %name, "cluster {seq} is newer than this operation; left alone");
                continue;
            }
            self.carry_out(name, ControllerEffect::StopCluster { seq })?;
        }
        self.world.crash_point("operator-after-cluster-stopped");
        self.restart_from_the_final_checkpoint(name, status, operation);
        status.cluster_info = None;
        Ok(())
    }

    /// Only once none of its processes runs is the job's newest checkpoint final: a
    /// JobManager that was going away (a pod being deleted), or that came back (with high
    /// availability its pod restarts and recovers the job, from a stop's savepoint too, and
    /// the job runs on), can complete, and commit, a checkpoint after the controller chose
    /// where the next job starts. An operation that starts from one of the job's own
    /// checkpoints (a last-state upgrade, suspend or rollback, a recovery) takes the newest
    /// now; one that starts from the job's own savepoint takes a checkpoint newer than it.
    fn restart_from_the_final_checkpoint(&self, name: &str, status: &mut DeploymentStatus, operation: &mut Operation) {
        let job_id = status.job_status.job_id.clone().unwrap_or_default();
        let chosen = operation.restore_from.clone();
        let own_checkpoint = chosen.as_deref().is_some_and(|path| checkpoint_id_of(&job_id, path).is_some());
        // (A stateful recovery: one of a stateless deployment starts empty.)
        let recovery = operation.kind == OperationKind::Recover && chosen.is_some();
        // A savepoint of this job: at most the id of its newest savepoint in that directory.
        let savepoint_id_bound = chosen.as_deref().filter(|_| !own_checkpoint).and_then(|path| {
            let dir = path.trim_end_matches('/').rsplit_once('/')?.0;
            self.world.newest_savepoint_of(dir, &job_id).map(|(id, _)| id)
        });
        if !own_checkpoint && !recovery && savepoint_id_bound.is_none() {
            return;
        }
        let newest_own =
            newest_checkpoint_of(&job_id, [self.current_job_checkpoint(name, status, None), chosen.clone()]);
        // (A recovery's start is its own checkpoint or the snapshot the job started from:
        // when the job has no checkpoint, what was chosen stays.)
        let newest = match savepoint_id_bound {
            Some(bound) => newest_own.filter(|path| checkpoint_id_of(&job_id, path).is_some_and(|id| id > bound)),
            None => newest_own,
        };
        let Some(newest) = newest.filter(|newest| Some(newest) != chosen.as_ref()) else { return };
        tracing::info!(deployment = %name, "job {job_id} completed {newest} after {chosen:?} was chosen: the next job starts from it");
        // A suspend recorded where its resume starts: the same place.
        if operation.kind == OperationKind::Suspend {
            let job_status = &mut status.job_status;
            for recorded in [&mut job_status.last_checkpoint_path, &mut job_status.upgrade_savepoint_path] {
                if *recorded == chosen {
                    *recorded = Some(newest.clone());
                }
            }
        }
        operation.restore_from = Some(newest);
    }

    /// Waits for the job to end after a cancel or a stop, while this controller leads.
    fn wait_terminal(&self, api: &dyn JobsApi, job_id: &str) -> Result<JobView, String> {
        let started = self.now_ms();
        loop {
            self.fence.check().map_err(|lost| lost.to_string())?;
            match api.job(job_id) {
                Ok(Some(view)) if matches!(view.state.as_str(), "FINISHED" | "CANCELED" | "FAILED") => return Ok(view),
                Ok(None) => return Err(format!("job {job_id} disappeared from its cluster while stopping")),
                _ if self.now_ms().saturating_sub(started) > TERMINAL_WAIT_MAX.as_millis() as u64 => {
                    return Err(format!("job {job_id} did not end within {TERMINAL_WAIT_MAX:?} of being stopped"));
                }
                _ => self.world.sleep(POLL),
            }
        }
    }

    /// Gives an operation up before anything stopped: the job runs on as it was.
    fn refuse(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &Operation,
        error: String,
    ) -> Result<Option<Step>, String> {
        self.report(name, true, "Refused", &error);
        status.error = Some(error);
        status.refused_generation = Some(operation.generation);
        status.operation = None;
        status.reconciliation_status.state = match status.reconciliation_status.state {
            ReconciliationState::RollingBack => ReconciliationState::Deployed,
            ReconciliationState::Upgrading => ReconciliationState::Deployed,
            other => other,
        };
        self.save(name, status)?;
        Ok(None)
    }

    fn pre_flight(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
    ) -> Result<Option<Step>, String> {
        let Some(target) = operation.target.clone() else { return Ok(Some(Step::StopJob { request_id: None })) };
        // What the new job would start from: the start point the operation names, or (an
        // upgrade that keeps state) the old job's newest checkpoint.
        let snapshot = match (&operation.restore_from, operation.kind, operation.mode) {
            (Some(path), _, _) => Some(path.clone()),
            (None, OperationKind::Upgrade, UpgradeMode::Savepoint | UpgradeMode::LastState) => {
                self.newest_checkpoint(name, status)
            }
            _ => None,
        };
        self.world.crash_point("operator-in-pre-flight");
        let (snapshot, verdict) = self.pre_flight_dry_run(name, status, operation, target, snapshot);
        match verdict {
            Ok(lines) => {
                // The snapshot the dry run read (a newer checkpoint than the one named, when
                // that one was subsumed): its report starts "Restoring from <location> (".
                let read = lines.iter().find_map(|l| l.strip_prefix("Restoring from ")?.split(" (").next());
                self.report(
                    name,
                    false,
                    "PreFlightPassed",
                    &format!("pre-flight passed against {}", read.or(snapshot.as_deref()).unwrap_or("no snapshot")),
                );
                if status.refused_generation.is_some() {
                    status.refused_generation = None;
                }
                Ok(Some(match operation.kind {
                    OperationKind::Upgrade => Step::StopJob { request_id: None },
                    _ => Step::StartCluster { seq: self.next_cluster(name, operation)? },
                }))
            }
            Err(reason) => {
                let against = snapshot.map(|s| format!(" against {s}")).unwrap_or_default();
                let error = match operation.kind {
                    OperationKind::Upgrade => format!(
                        "the upgrade to generation {} was refused before anything stopped: the pre-flight of the new spec{against} failed: {reason}. The running job is untouched; fix the spec and apply it again",
                        operation.generation
                    ),
                    _ => format!(
                        "the {:?} of generation {} was refused: the pre-flight{against} failed: {reason}; fix the spec and apply it again",
                        operation.kind, operation.generation
                    ),
                };
                self.refuse(name, status, operation, error)
            }
        }
    }

    /// The pre-flight's dry run of `target` against `snapshot`: the snapshot checked and the
    /// verdict. Against the running job's newest checkpoint (no start point named), the dry
    /// run reads the newest one when it reads (the job subsumes them every interval, often
    /// before the dry run's process has started), and a checkpoint removed meanwhile is no
    /// verdict on the new spec: the next newest is checked.
    fn pre_flight_dry_run(
        &self,
        name: &str,
        status: &DeploymentStatus,
        operation: &Operation,
        mut target: DeploymentSpec,
        mut snapshot: Option<String>,
    ) -> (Option<String>, Result<Vec<String>, String>) {
        let running_job = operation.restore_from.is_none() && snapshot.is_some();
        if running_job {
            target.configuration.insert(RESTORE_NEWEST_RETAINED.key.to_string(), "true".to_string());
        }
        let mut verdict = self.backend.dry_run(name, &target, snapshot.as_deref());
        let mut attempts = 0;
        while verdict.is_err()
            && running_job
            && snapshot.as_deref().is_some_and(|s| !self.world.snapshot_exists(s))
            && attempts < 5
        {
            attempts += 1;
            snapshot = self.newest_checkpoint(name, status);
            verdict = self.backend.dry_run(name, &target, snapshot.as_deref());
        }
        (snapshot, verdict)
    }

    /// The newest completed checkpoint of the current job, if it completed one: the newer of
    /// the one last observed (only when it is this job's: an earlier job's is older than
    /// what this one started from, and restoring it would write again what was committed
    /// since) and the newest complete one in the job's directory under its
    /// state.checkpoints.dir (one may have completed after the last observation, or before
    /// the controller saw any).
    fn own_checkpoint(&self, name: &str, status: &DeploymentStatus) -> Option<String> {
        let job_id = status.job_status.job_id.as_deref()?;
        let observed = status.job_status.last_checkpoint_path.clone().filter(|o| o.contains(&format!("/{job_id}/")));
        // Whatever was observed, a newer checkpoint may have completed (and committed its
        // output) since: the newest complete one in storage counts too.
        let stored = status.reconciliation_status.last_reconciled_spec.as_ref().and_then(|spec| {
            let root = spec
                .configuration
                .get("state.checkpoints.dir")
                .cloned()
                .unwrap_or_else(|| format!("file://{}", self.dirs(name).checkpoints().display()));
            self.world.newest_complete_checkpoint(&root, job_id)
        });
        let present = observed.as_deref().filter(|o| self.world.snapshot_exists(o)).map(str::to_string);
        newest_checkpoint_of(job_id, [present, stored])
            .or_else(|| observed.as_deref().map(|o| self.world.newest_retained(o)))
    }

    /// The newest completed checkpoint of the current job, the newest (by checkpoint id) of
    /// what its cluster reports (`view`), what the cluster's HA store recorded (what its
    /// next leader would restore) and what was observed or is found in storage
    /// ([`Self::own_checkpoint`]). No one source is trusted alone: a JobManager on its way
    /// out (or one that just took over) may report an older checkpoint than the HA store
    /// holds, and restoring that one would write again what the newer one committed.
    fn current_job_checkpoint(&self, name: &str, status: &DeploymentStatus, view: Option<&JobView>) -> Option<String> {
        let job_id = status.job_status.job_id.as_deref()?;
        let reported = view.and_then(|v| v.latest_checkpoint.clone());
        let recorded =
            status.cluster_info.as_ref().and_then(|cluster| self.backend.recorded_checkpoint(name, cluster, job_id));
        if let Some(path) = &recorded {
            tracing::info!(deployment = %name, "the newest checkpoint of job {job_id} recorded in its cluster's HA store: {path}");
        }
        newest_checkpoint_of(job_id, [reported, recorded, self.own_checkpoint(name, status)])
    }

    /// The newest completed checkpoint of the current job ([`Self::current_job_checkpoint`],
    /// asking its cluster), else the snapshot it started from.
    fn newest_checkpoint(&self, name: &str, status: &DeploymentStatus) -> Option<String> {
        let view = match (&status.cluster_info, &status.job_status.job_id) {
            (Some(cluster), Some(job_id)) => self.api(name, cluster).job(job_id).ok().flatten(),
            _ => None,
        };
        self.current_job_checkpoint(name, status, view.as_ref()).or_else(|| status.job_status.restored_from.clone())
    }

    fn stop_job(
        &self,
        name: &str,
        dirs: &DeploymentDirs,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        request_id: Option<String>,
    ) -> Result<Option<Step>, String> {
        let running = Self::running_spec(status).cloned();
        let fallback = running
            .as_ref()
            .map(|s| self.settings(s))
            .and_then(|s| s.get(&OPERATOR_LAST_STATE_FALLBACK).ok())
            .unwrap_or(true);
        let job = match (&status.cluster_info, &status.job_status.job_id) {
            (Some(cluster), Some(job_id)) => {
                let api = self.api(name, cluster);
                api.job(job_id).ok().flatten().map(|view| (api, cluster.clone(), job_id.clone(), view))
            }
            _ => None,
        };
        let mode = operation.mode;
        let Some((api, cluster, job_id, view)) = job else {
            // No job to stop (the cluster is gone): start from what is known.
            return self.after_stop(name, status, operation, None);
        };
        let terminal = matches!(view.state.as_str(), "FINISHED" | "CANCELED" | "FAILED");
        if terminal {
            return self.after_stop(name, status, operation, Some(view));
        }
        let job = StoppingJob { api, cluster, job_id, view, fallback };
        match (operation.kind, mode) {
            (OperationKind::Delete | OperationKind::Rollback | OperationKind::Recover, _)
            | (_, UpgradeMode::Stateless | UpgradeMode::LastState) => self.cancel_to_stop(name, status, operation, job),
            (_, UpgradeMode::Savepoint)
                if request_id.is_none()
                    && (matches!(job.view.state.as_str(), "RESTARTING" | "FAILING" | "CREATED" | "INITIALIZING")
                        || (job.view.state == "RUNNING" && job.view.starting)) =>
            {
                self.fall_back_to_last_state(name, status, operation, job)
            }
            (_, UpgradeMode::Savepoint) => {
                let target = match running.as_ref().or(operation.target.as_ref()) {
                    Some(spec) => savepoint_dir(spec, dirs),
                    None => format!("file://{}", dirs.savepoints().display()),
                };
                let request_id = match request_id {
                    Some(id) => id,
                    None => match self.trigger_stop(name, status, operation, &job, &target)? {
                        Ok(id) => id,
                        Err(step) => return Ok(step),
                    },
                };
                let timeout = running
                    .as_ref()
                    .and_then(|s| crate::spec::configuration(s).get(&CHECKPOINTING_TIMEOUT).ok())
                    .unwrap_or(Duration::from_secs(600));
                self.await_stop(name, status, operation, &job, &request_id, timeout)
            }
        }
    }

    /// Stateless and last-state operations, deletes, rollbacks and recoveries: the job is
    /// cancelled (a last-state upgrade or suspend only once a checkpoint of it completed).
    fn cancel_to_stop(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        job: StoppingJob,
    ) -> Result<Option<Step>, String> {
        let StoppingJob { api, cluster, job_id, .. } = job;
        if matches!(operation.mode, UpgradeMode::LastState)
            && operation.kind != OperationKind::Rollback
            && operation.kind != OperationKind::Delete
            && operation.kind != OperationKind::Recover
            && self.newest_checkpoint(name, status).is_none()
        {
            let error = format!(
                "a last-state {} needs a completed checkpoint of job {job_id} and there is none yet (is execution.checkpointing.interval set?). {MANUAL_RESTORE_REQUIRED} The job was not touched",
                if operation.kind == OperationKind::Suspend { "suspend" } else { "upgrade" }
            );
            return self.refuse(name, status, operation, error);
        }
        self.carry_out(name, ControllerEffect::CancelJob { cluster: &cluster, job_id: &job_id })?;
        let view = self.wait_terminal(api.as_ref(), &job_id)?;
        self.world.crash_point("operator-after-job-cancelled");
        self.after_stop(name, status, operation, Some(view))
    }

    /// A savepoint operation on a job that is not running.
    ///
    /// The Flink operator's rule: a job that is not running takes no savepoint; with
    /// last-state-fallback it is upgraded from its newest state (its own newest checkpoint,
    /// else what it started from), which is what its restart would restore anyway. Without
    /// either, nothing is touched. A RUNNING job whose subtasks are not all running yet (a
    /// restart waiting for slots, a crash loop) is not running either: a stop-with-savepoint
    /// of it could only fail.
    fn fall_back_to_last_state(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        job: StoppingJob,
    ) -> Result<Option<Step>, String> {
        let StoppingJob { api, cluster, job_id, view, fallback } = job;
        let newest = view.latest_checkpoint.clone().or_else(|| status.job_status.restored_from.clone());
        let error = match (fallback, &newest) {
            (true, Some(_)) => None,
            (true, None) => Some(format!(
                "job {job_id} is {} and no checkpoint or savepoint of it is known. {MANUAL_RESTORE_REQUIRED} The job was not touched; set spec.job.initialSavepointPath and apply again",
                view.state
            )),
            (false, _) => Some(format!(
                "job {job_id} is {}, so it takes no savepoint, and kubernetes.operator.job.upgrade.last-state-fallback.enabled is false. The job was not touched; apply the spec again once it runs",
                view.state
            )),
        };
        if let Some(error) = error {
            return self.refuse(name, status, operation, error);
        }
        self.report(
            name,
            true,
            "LastStateFallback",
            &format!(
                "job {job_id} is {}: last-state fallback, cancelling it to upgrade from its newest state",
                view.state
            ),
        );
        self.carry_out(name, ControllerEffect::CancelJob { cluster: &cluster, job_id: &job_id })?;
        let mut ended = self.wait_terminal(api.as_ref(), &job_id)?;
        ended.latest_checkpoint = ended.latest_checkpoint.or(view.latest_checkpoint);
        self.world.crash_point("operator-after-job-cancelled");
        operation.mode = UpgradeMode::LastState;
        self.after_stop(name, status, operation, Some(ended))
    }

    /// Asks the job to stop with a savepoint into `target` (retried while the JobManager does
    /// not take it yet) and records the request before waiting, so a controller that dies
    /// follows it. `Err(step)`: the trigger failed and the operation goes on at `step`.
    fn trigger_stop(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        job: &StoppingJob,
        target: &str,
    ) -> Result<Result<String, Option<Step>>, String> {
        let started = self.now_ms();
        let id = loop {
            let effect =
                ControllerEffect::StopWithSavepoint { cluster: &job.cluster, job_id: &job.job_id, directory: target };
            match self.carry_out(name, effect).and_then(EffectAnswer::id) {
                Ok(id) => break id,
                Err(error) if self.now_ms().saturating_sub(started) < TRIGGER_RETRY_MAX.as_millis() as u64 => {
                    tracing::debug!(deployment = %name, "stop-with-savepoint not taken yet: {error}");
                    self.world.sleep(Duration::from_millis(100));
                }
                Err(error) => {
                    let next = self.savepoint_failed(
                        name,
                        status,
                        operation,
                        job.api.as_ref(),
                        &job.job_id,
                        job.fallback,
                        error,
                    )?;
                    return Ok(Err(next));
                }
            }
        };
        operation.step = Step::StopJob { request_id: Some(id.clone()) };
        status.operation = Some(operation.clone());
        self.save(name, status)?;
        self.world.crash_point("operator-after-stop-triggered");
        Ok(Ok(id))
    }

    /// Follows stop request `request_id` until its savepoint completes (recorded, then the
    /// job's end awaited), fails, or outlasts `timeout`.
    fn await_stop(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        job: &StoppingJob,
        request_id: &str,
        timeout: Duration,
    ) -> Result<Option<Step>, String> {
        let StoppingJob { api, job_id, fallback, .. } = job;
        let started = self.now_ms();
        loop {
            self.acting()?;
            match api.savepoint(job_id, request_id) {
                Ok(SavepointState::InProgress)
                    if self.now_ms().saturating_sub(started) < timeout.as_millis() as u64 =>
                {
                    self.world.sleep(POLL)
                }
                Ok(SavepointState::InProgress) => {
                    let cause = "it did not complete within execution.checkpointing.timeout".to_string();
                    return self.savepoint_failed(name, status, operation, api.as_ref(), job_id, *fallback, cause);
                }
                Ok(SavepointState::Completed(location)) => {
                    self.record_upgrade_savepoint(name, status, operation, &location)?;
                    self.world.crash_point("operator-after-savepoint-recorded");
                    let view = self.wait_terminal(api.as_ref(), job_id)?;
                    return self.after_stop(name, status, operation, Some(view));
                }
                Ok(SavepointState::Failed(cause)) => {
                    return self.savepoint_failed(name, status, operation, api.as_ref(), job_id, *fallback, cause);
                }
                Err(error) => {
                    // The JobManager lost the request (it restarted): look at the job.
                    tracing::warn!(deployment = %name, "the stop request {request_id} is gone ({error}); looking at the job");
                    operation.step = Step::StopJob { request_id: None };
                    status.operation = Some(operation.clone());
                    self.save(name, status)?;
                    return Ok(Some(Step::StopJob { request_id: None }));
                }
            }
        }
    }

    /// Records the savepoint of an upgrade's (or suspend's) stop: in the history and
    /// `upgradeSavepointPath`, and as the new job's start point unless the spec named one.
    fn record_upgrade_savepoint(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        location: &str,
    ) -> Outcome {
        if status.savepoint_history.iter().any(|r| r.location == location) && operation.restore_from.is_some() {
            return Ok(());
        }
        self.report(name, false, "UpgradeSavepoint", &format!("upgrade savepoint {location}"));
        if operation.restore_from.is_none() {
            operation.restore_from = Some(location.to_string());
        }
        status.job_status.upgrade_savepoint_path = Some(location.to_string());
        if !status.savepoint_history.iter().any(|r| r.location == location) {
            status.savepoint_history.push(SavepointRecord {
                time_stamp: self.now_ms(),
                location: location.to_string(),
                trigger_type: TriggerType::Upgrade,
                format_type: "CANONICAL".into(),
                trigger_nonce: None,
            });
        }
        status.operation = Some(operation.clone());
        self.save(name, status)
    }

    /// A stop-with-savepoint did not happen. A job still running keeps running (the
    /// operation is given up); one that is not running is upgraded from its newest
    /// checkpoint when `last-state-fallback` allows.
    #[allow(clippy::too_many_arguments)]
    fn savepoint_failed(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        api: &dyn JobsApi,
        job_id: &str,
        fallback: bool,
        cause: String,
    ) -> Result<Option<Step>, String> {
        let view = api.job(job_id).ok().flatten();
        if view.as_ref().is_some_and(|v| v.state == "RUNNING") {
            let error = format!(
                "the stop-with-savepoint of job {job_id} failed: {cause}. The job keeps running; apply the spec again to retry"
            );
            return self.refuse(name, status, operation, error);
        }
        if fallback {
            operation.mode = UpgradeMode::LastState;
            return self.after_stop(name, status, operation, view);
        }
        let error = format!(
            "the stop-with-savepoint of job {job_id} failed ({cause}) and the job is not running; kubernetes.operator.job.upgrade.last-state-fallback.enabled is false. {MANUAL_RESTORE_REQUIRED}"
        );
        self.refuse(name, status, operation, error)
    }

    /// The old job has ended: decide what the new one starts from, then stop the cluster.
    fn after_stop(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        view: Option<JobView>,
    ) -> Result<Option<Step>, String> {
        if let Some(view) = &view {
            status.job_status.state = Some(view.state.clone());
            if let Some(path) = &view.latest_checkpoint {
                status.job_status.last_checkpoint_path = Some(path.clone());
            }
        }
        // The job's newest state: its own newest checkpoint (the one last observed only if it
        // is of this job: an earlier job's is older than what this one started from), else
        // what it started from.
        let own_checkpoint = self.current_job_checkpoint(name, status, view.as_ref());
        let newest_checkpoint = own_checkpoint.clone().or_else(|| status.job_status.restored_from.clone());
        match operation.kind {
            OperationKind::Delete => {}
            OperationKind::Recover => {
                // The job's own newest checkpoint, from every source, including the one the
                // recovery was decided on; else where it started.
                let job_id = status.job_status.job_id.clone().unwrap_or_default();
                operation.restore_from =
                    newest_checkpoint_of(&job_id, [own_checkpoint, operation.restore_from.clone()])
                        .or_else(|| operation.restore_from.clone())
                        .or(newest_checkpoint);
            }
            OperationKind::Rollback => {
                // The failed job's own newest checkpoint, if it completed one and the last
                // stable spec can start from it; else where the upgrade started.
                if let Some(checkpoint) = own_checkpoint
                    && Some(&checkpoint) != status.job_status.restored_from.as_ref()
                {
                    self.rollback_start_point(name, operation, &checkpoint);
                }
            }
            _ => {
                if let Some(error) =
                    self.upgrade_start_point(name, status, operation, view.as_ref(), newest_checkpoint)?
                {
                    return self.stalled(name, status, operation, error);
                }
            }
        }
        if operation.kind == OperationKind::Suspend {
            match operation.mode {
                UpgradeMode::LastState => status.job_status.last_checkpoint_path = operation.restore_from.clone(),
                UpgradeMode::Savepoint => status.job_status.upgrade_savepoint_path = operation.restore_from.clone(),
                UpgradeMode::Stateless => {}
            }
        }
        Ok(Some(Step::StopCluster))
    }

    /// Where an upgrade's or suspend's new job starts, as its mode says, when the spec names
    /// no start point: a savepoint the stop completed, else (with last-state fallback) the
    /// newest checkpoint. `Some(error)`: nothing is known to start from.
    fn upgrade_start_point(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &mut Operation,
        view: Option<&JobView>,
        newest_checkpoint: Option<String>,
    ) -> Result<Option<String>, String> {
        match operation.mode {
            // Empty, unless the spec names a start point (set when the operation began).
            UpgradeMode::Stateless => {}
            UpgradeMode::Savepoint => {
                if let Some(view) = view
                    && view.state == "FINISHED"
                    && let Some(location) = &view.latest_savepoint
                    && !status.savepoint_history.iter().any(|r| &r.location == location)
                {
                    // The stop completed while no controller watched it.
                    let location = location.clone();
                    self.record_upgrade_savepoint(name, status, operation, &location)?;
                }
                if view.is_none()
                    && operation.restore_from.is_none()
                    && let Some(location) =
                        self.unseen_stop_savepoint(name, status, operation, newest_checkpoint.as_deref())
                {
                    // Its cluster is gone, and a stop completed (and committed) unseen:
                    // an older checkpoint would write again what the stop committed.
                    self.record_upgrade_savepoint(name, status, operation, &location)?;
                }
                if operation.restore_from.is_none() {
                    let fallback = Self::running_spec(status)
                        .map(|s| self.settings(s))
                        .and_then(|s| s.get(&OPERATOR_LAST_STATE_FALLBACK).ok())
                        .unwrap_or(true);
                    match newest_checkpoint {
                        Some(path) if fallback => operation.restore_from = Some(path),
                        _ => {
                            let error = format!(
                                "the job is not running and no savepoint or checkpoint of it is known. {MANUAL_RESTORE_REQUIRED} Set spec.job.initialSavepointPath and apply again"
                            );
                            return Ok(Some(error));
                        }
                    }
                }
            }
            UpgradeMode::LastState => {
                if operation.restore_from.is_none() {
                    match newest_checkpoint {
                        Some(path) => operation.restore_from = Some(path),
                        None => {
                            let error = format!(
                                "no completed checkpoint of the job is known. {MANUAL_RESTORE_REQUIRED} Set spec.job.initialSavepointPath and apply again"
                            );
                            return Ok(Some(error));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// A savepoint of the current job newer than its newest checkpoint, in the directory
    /// its stops write to: a stop that completed while its cluster went away, so nobody
    /// heard of it (or a savepoint taken after the newest checkpoint: the newest state either
    /// way, and its restore commits what it staged).
    fn unseen_stop_savepoint(
        &self,
        name: &str,
        status: &DeploymentStatus,
        operation: &Operation,
        newest_checkpoint: Option<&str>,
    ) -> Option<String> {
        let job_id = status.job_status.job_id.as_deref()?;
        let spec = Self::running_spec(status).or(operation.target.as_ref())?;
        let dir = savepoint_dir(spec, &self.dirs(name));
        let (id, location) = self.world.newest_savepoint_of(&dir, job_id)?;
        let checkpoint_id = newest_checkpoint.and_then(|path| checkpoint_id_of(job_id, path)).unwrap_or(0);
        (id > checkpoint_id).then(|| {
            tracing::warn!(deployment = %name, "job {job_id}'s cluster is gone; its savepoint {location} (id {id}) is newer than its newest checkpoint: the new job starts from it");
            location
        })
    }

    /// The job is not running and nothing is known to start it from: the operation is given
    /// up with the error, as a refusal (the old spec stays the reconciled one, the same
    /// generation is not tried again), and a person decides (the status says how). A job
    /// gets here after it ended by itself (FAILED): a last-state cancel is refused before it
    /// acts when no checkpoint is known.
    fn stalled(
        &self,
        name: &str,
        status: &mut DeploymentStatus,
        operation: &Operation,
        error: String,
    ) -> Result<Option<Step>, String> {
        self.refuse(name, status, operation, error)
    }

    /// A dry run of `target`'s binary against `snapshot` (with `-n` when `allow_non_restored`
    /// or the spec says so): the lines of its report, or why it cannot start from it.
    fn dry_run(
        &self,
        name: &str,
        target: &DeploymentSpec,
        snapshot: Option<&str>,
        allow_non_restored: bool,
    ) -> Result<Vec<String>, String> {
        let mut spec = target.clone();
        spec.job.allow_non_restored_state |= allow_non_restored;
        self.backend.dry_run(name, &spec, snapshot)
    }

    /// Where a rollback starts the last stable spec when the failed job completed
    /// `checkpoint`: that checkpoint when the stable spec can start from it (so nothing the
    /// failed job committed is written again), with `-n` when the only state it cannot
    /// take is that of operators the failed spec added; else (no change to
    /// `operation.restore_from`) where the upgrade started, its savepoint.
    ///
    /// The checkpoint is refused when an operator that restores its state from the upgrade's
    /// start point would find none in it (the failed spec renamed or dropped it): starting
    /// that operator empty would lose its state.
    fn rollback_start_point(&self, name: &str, operation: &mut Operation, checkpoint: &str) {
        let Some(target) = operation.target.clone() else { return };
        let restoring = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .filter_map(|l| l.trim().strip_prefix("operator '"))
                .filter_map(|l| l.split_once("' restores its state").map(|(uid, _)| uid.to_string()))
                .collect()
        };
        let start = operation.restore_from.clone();
        let baseline = match &start {
            Some(path) => self
                .dry_run(name, &target, Some(path), target.job.allow_non_restored_state)
                .map(|lines| restoring(&lines))
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let mut reason = String::new();
        let attempts: &[bool] = if target.job.allow_non_restored_state { &[true] } else { &[false, true] };
        for &allow in attempts {
            match self.dry_run(name, &target, Some(checkpoint), allow) {
                Ok(lines) => {
                    let restored = restoring(&lines);
                    if let Some(lost) = baseline.iter().find(|uid| !restored.contains(uid)) {
                        reason = format!("operator '{lost}' has no state in it");
                        break;
                    }
                    let dropped: Vec<&str> = lines
                        .iter()
                        .filter_map(|l| l.trim().strip_prefix("operator '"))
                        .filter_map(|l| l.split_once("' is only in the snapshot").map(|(uid, _)| uid))
                        .collect();
                    if dropped.is_empty() {
                        tracing::info!(deployment = %name, "rolling back from the failed job's newest checkpoint {checkpoint}");
                    } else {
                        tracing::info!(deployment = %name, "rolling back from the failed job's newest checkpoint {checkpoint}, dropping the state of the operators only the failed spec has ({}) (-n)", dropped.join(", "));
                    }
                    operation.restore_from = Some(checkpoint.to_string());
                    operation.allow_non_restored_state = allow && !target.job.allow_non_restored_state;
                    return;
                }
                Err(error) => reason = error,
            }
        }
        tracing::warn!(
            deployment = %name,
            "the last stable spec cannot start from the failed job's newest checkpoint {checkpoint} ({reason}): rolling back from {}; what the failed job committed after it is written again",
            start.as_deref().unwrap_or("empty state")
        );
    }

    fn start_cluster(&self, name: &str, status: &mut DeploymentStatus, operation: &Operation, seq: u64) -> Outcome {
        let Some(target) = &operation.target else {
            return Err("an operation without a target spec starts no cluster".into());
        };
        let started = self.now_ms();
        let cluster = self.carry_out(name, ControllerEffect::StartCluster { seq, target })?.cluster()?;
        self.report(
            name,
            false,
            "ClusterStarted",
            &format!("cluster {seq} started in {} ms", self.now_ms().saturating_sub(started)),
        );
        status.cluster_info = Some(cluster);
        status.job_status = crate::status::JobStatusInfo {
            job_name: Some(target.job.name.clone()),
            upgrade_savepoint_path: status.job_status.upgrade_savepoint_path.clone(),
            last_checkpoint_path: status.job_status.last_checkpoint_path.clone(),
            // Where the new spec starts, known before its job is: a rollback of a spec whose
            // job never started goes back there.
            restored_from: operation.restore_from.clone(),
            ..Default::default()
        };
        Ok(())
    }

    fn submit(&self, name: &str, status: &mut DeploymentStatus, operation: &Operation) -> Outcome {
        let Some(target) = &operation.target else {
            return Err("an operation without a target spec submits no job".into());
        };
        let Some(cluster) = status.cluster_info.clone() else {
            return Err("no cluster was recorded for the job".into());
        };
        let api = self.api(name, &cluster);
        // A job already there was submitted by a controller that died before hearing back.
        let existing = api.jobs()?;
        let chosen = status.job_status.job_id.clone();
        let job_id = match existing.first() {
            Some((id, _)) => id.clone(),
            None => {
                let mut target = target.clone();
                target.job.allow_non_restored_state |= operation.allow_non_restored_state;
                let restore_from = operation.restore_from.as_deref();
                let effect = ControllerEffect::SubmitJob {
                    cluster: &cluster,
                    target: &target,
                    restore_from,
                    job_id: chosen.as_deref(),
                };
                self.carry_out(name, effect)?.id()?
            }
        };
        status.job_status.job_id = Some(job_id);
        status.job_status.job_name = Some(target.job.name.clone());
        status.job_status.state = Some("CREATED".into());
        status.job_status.start_time = Some(self.now_ms());
        status.job_status.restored_from = operation.restore_from.clone();
        status.job_status.ready = false;
        Ok(())
    }

    /// Starting the cluster or its job failed: tried again up to [`START_ATTEMPTS`] times,
    /// then the spec counts as deployed and failing, for readiness and rollback to handle.
    fn start_failed(&self, name: &str, status: &mut DeploymentStatus, operation: Operation, error: String) -> Outcome {
        let attempts = {
            let mut failures = self.start_failures.lock().unwrap_or_else(|p| p.into_inner());
            let count = failures.entry(name.to_string()).or_insert(0);
            *count += 1;
            *count
        };
        self.report(
            name,
            true,
            "StartFailed",
            &format!("{} failed (attempt {attempts} of {START_ATTEMPTS}): {error}", operation.step.describe()),
        );
        status.error = Some(format!("{} failed: {error}", operation.step.describe()));
        if attempts < START_ATTEMPTS {
            self.save(name, status)?;
            self.world.sleep(Duration::from_millis(500));
            return Ok(());
        }
        self.start_failures.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        status.job_status.state = Some("FAILED".into());
        status.job_status.ready = false;
        self.finish(name, status, operation)
    }

    /// The operation is done: the status says what runs now.
    fn finish(&self, name: &str, status: &mut DeploymentStatus, operation: Operation) -> Outcome {
        self.start_failures.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        let reconciliation = &mut status.reconciliation_status;
        match operation.kind {
            OperationKind::Deploy | OperationKind::Upgrade | OperationKind::Resume => {
                reconciliation.last_reconciled_spec = operation.target.clone();
                reconciliation.state = ReconciliationState::Deployed;
                // Also when its cluster or job could not be started: a rollback goes back
                // to where it started.
                status.job_status.restored_from = operation.restore_from.clone();
            }
            OperationKind::Suspend => {
                if let Some(last) = &mut reconciliation.last_reconciled_spec {
                    last.job.state = DesiredState::Suspended;
                    last.job.upgrade_mode = operation.mode;
                }
                reconciliation.state = ReconciliationState::Deployed;
                status.job_status.ready = false;
            }
            OperationKind::Rollback => reconciliation.state = ReconciliationState::RolledBack,
            OperationKind::Recover | OperationKind::Delete => {}
        }
        reconciliation.reconciliation_timestamp = self.now_ms();
        // A rollback keeps the reason it was made for; a failed job keeps its cause.
        if operation.kind != OperationKind::Rollback && !matches!(status.job_status.state.as_deref(), Some("FAILED")) {
            status.error = None;
        }
        status.operation = None;
        self.report(
            name,
            false,
            "OperationDone",
            &format!("{:?} of generation {} done", operation.kind, operation.generation),
        );
        self.save(name, status)
    }
}

/// `state.savepoints.dir` of `spec`, else the deployment's default.
fn savepoint_dir(spec: &DeploymentSpec, dirs: &DeploymentDirs) -> String {
    spec.configuration
        .get("state.savepoints.dir")
        .or_else(|| spec.configuration.get("execution.checkpointing.savepoint-dir"))
        .cloned()
        .unwrap_or_else(|| format!("file://{}", dirs.savepoints().display()))
}

fn processes_config_checkpointing(spec: &DeploymentSpec) -> bool {
    crate::spec::configuration(spec).get(&CHECKPOINTING_INTERVAL).ok().flatten().is_some()
}

/// The cluster an operation starts: the one after the newest it knew of when it began.
fn next_cluster_after(operation: &Operation, clusters: &[u64]) -> u64 {
    let newest = operation.newest_cluster.unwrap_or_else(|| clusters.last().copied().unwrap_or(0));
    newest + 1
}

/// Waits for the job to end after a cancel or a stop, while `fence` holds.
/// The job an operation stops: its cluster's REST API, its id, how it was seen, and whether
/// a job that is not running may fall back to last-state.
struct StoppingJob {
    api: Box<dyn JobsApi>,
    /// The cluster it runs on.
    cluster: ClusterInfo,
    job_id: String,
    view: JobView,
    fallback: bool,
}

/// The newest of `candidates` that is a checkpoint of job `job_id` (`.../<job_id>/chk-<n>`),
/// by checkpoint id: ids only go up within a job, across leaders too.
fn newest_checkpoint_of(job_id: &str, candidates: impl IntoIterator<Item = Option<String>>) -> Option<String> {
    candidates
        .into_iter()
        .flatten()
        .filter_map(|path| Some((checkpoint_id_of(job_id, &path)?, path)))
        .max_by_key(|(id, _)| *id)
        .map(|(_, path)| path)
}

/// The id of `path` when it is a checkpoint of job `job_id` (`.../<job_id>/chk-<n>`).
fn checkpoint_id_of(job_id: &str, path: &str) -> Option<u64> {
    path.rsplit_once(&format!("/{job_id}/chk-"))?.1.trim_end_matches('/').parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::newest_checkpoint_of;

    #[test]
    fn the_newest_checkpoint_of_a_job_is_the_highest_id_of_its_own_from_any_source() {
        let job = "aaaa";
        let of = |paths: &[Option<&str>]| newest_checkpoint_of(job, paths.iter().map(|p| p.map(str::to_string)));
        // A JobManager on its way out reported chk-1; the HA store recorded chk-2.
        assert_eq!(
            of(&[Some("file:///c/aaaa/chk-1"), Some("file:///c/aaaa/chk-2"), None]).as_deref(),
            Some("file:///c/aaaa/chk-2")
        );
        assert_eq!(
            of(&[Some("s3://b/c/aaaa/chk-12/"), Some("s3://b/c/aaaa/chk-9")]).as_deref(),
            Some("s3://b/c/aaaa/chk-12/")
        );
        // An earlier job's checkpoint (what this one started from) and a savepoint are not
        // this job's checkpoints, whatever their ids.
        assert_eq!(of(&[Some("file:///c/bbbb/chk-50"), Some("file:///s/savepoint-aaaa-1")]), None);
        assert_eq!(of(&[None, None]), None);
    }
}
