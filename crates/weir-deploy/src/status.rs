//! A deployment's status, in the Flink Kubernetes Operator's shape (`lifecycleState`,
//! `jobStatus`, `reconciliationStatus`, the savepoint history, `error`), plus what weir's
//! controller records before each step it takes (`operation`), so a controller that died
//! mid-upgrade resumes it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::{DeploymentSpec, DesiredState, UpgradeMode};

/// Everything the controller knows and did about one deployment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DeploymentStatus {
    /// Derived by [`lifecycle_state`] whenever the status is written.
    pub lifecycle_state: LifecycleState,
    /// The deployment's current job.
    pub job_status: JobStatusInfo,
    /// What was deployed, what was last stable, and whether an upgrade is under way.
    pub reconciliation_status: ReconciliationStatus,
    /// Savepoints taken for the deployment, oldest first.
    pub savepoint_history: Vec<SavepointRecord>,
    /// The last thing that went wrong, with what to do; cleared by the next success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The spec generation the controller has acted on.
    pub observed_generation: u64,
    /// The deployment's cluster, while one runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_info: Option<ClusterInfo>,
    /// The step in progress, recorded before the controller takes it (weir's own; its
    /// shape is the controller's business, so the CRD keeps it as given).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_object")]
    pub operation: Option<Operation>,
    /// A generation whose upgrade was refused (pre-flight): not tried again until the spec
    /// changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_generation: Option<u64>,
    /// A manual or periodic savepoint in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_savepoint: Option<PendingSavepoint>,
    /// The `savepointTriggerNonce` the last manual savepoint was taken for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_savepoint_nonce: Option<i64>,
    /// When the last periodic savepoint was triggered, epoch ms.
    pub last_periodic_savepoint_ms: u64,
    /// The deployment is being deleted: its job and cluster go, then its record.
    pub deleting: bool,
}

/// The Flink operator's `ResourceLifecycleState`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LifecycleState {
    /// Applied, never deployed.
    #[default]
    Created,
    /// Deployed, not (yet) stable.
    Deployed,
    /// The deployed spec ran: it is the last stable spec.
    Stable,
    /// An upgrade (or suspend, or resume) is under way.
    Upgrading,
    /// Suspended as the spec says.
    Suspended,
    /// The job failed, or needs a manual restore.
    Failed,
    /// Going back to the last stable spec.
    RollingBack,
    /// Back on the last stable spec after a failed upgrade.
    RolledBack,
    /// Its job and cluster are going away.
    Deleting,
}

impl LifecycleState {
    /// The operator's spelling (`ROLLED_BACK`), as the status's JSON and every listing
    /// show it.
    pub fn as_str(self) -> &'static str {
        match self {
            LifecycleState::Created => "CREATED",
            LifecycleState::Deployed => "DEPLOYED",
            LifecycleState::Stable => "STABLE",
            LifecycleState::Upgrading => "UPGRADING",
            LifecycleState::Suspended => "SUSPENDED",
            LifecycleState::Failed => "FAILED",
            LifecycleState::RollingBack => "ROLLING_BACK",
            LifecycleState::RolledBack => "ROLLED_BACK",
            LifecycleState::Deleting => "DELETING",
        }
    }

    /// Whether nothing more happens without a change (the operator's terminal flag).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            LifecycleState::Stable | LifecycleState::Suspended | LifecycleState::RolledBack | LifecycleState::Failed
        )
    }
}

/// The deployment's current job, as the Flink operator's `jobStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct JobStatusInfo {
    /// The catalog job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Its id on the deployment's cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Its state (Flink's job states), as last observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When it was submitted, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// When the controller last observed it, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_time: Option<u64>,
    /// The savepoint of the last upgrade or suspend in savepoint mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_savepoint_path: Option<String>,
    /// The newest completed checkpoint seen (weir's own: last-state upgrades and fallbacks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_path: Option<String>,
    /// The snapshot the job started from (weir's own: a rollback without a newer
    /// checkpoint goes back there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// Whether the job was seen ready (every subtask RUNNING, and a checkpoint completed
    /// when checkpointing is on) since it was submitted.
    pub ready: bool,
}

/// The Flink operator's `reconciliationStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ReconciliationStatus {
    /// When the last spec was deployed (or the last upgrade began), epoch ms.
    pub reconciliation_timestamp: u64,
    /// The spec last acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reconciled_spec: Option<DeploymentSpec>,
    /// The last spec whose job ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_stable_spec: Option<DeploymentSpec>,
    /// Whether an upgrade or rollback is under way.
    pub state: ReconciliationState,
}

/// The Flink operator's `ReconciliationState`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReconciliationState {
    /// The last reconciled spec is deployed.
    #[default]
    Deployed,
    /// Moving to a new spec.
    Upgrading,
    /// Moving back to the last stable spec.
    RollingBack,
    /// Back on the last stable spec.
    RolledBack,
}

impl ReconciliationState {
    /// The operator's spelling (`ROLLED_BACK`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReconciliationState::Deployed => "DEPLOYED",
            ReconciliationState::Upgrading => "UPGRADING",
            ReconciliationState::RollingBack => "ROLLING_BACK",
            ReconciliationState::RolledBack => "ROLLED_BACK",
        }
    }
}

/// One savepoint of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavepointRecord {
    /// When it completed, epoch ms.
    pub time_stamp: u64,
    /// Where it is.
    pub location: String,
    /// Why it was taken.
    pub trigger_type: TriggerType,
    /// `CANONICAL`: weir has one format for savepoints.
    pub format_type: String,
    /// The `savepointTriggerNonce` of a manual savepoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_nonce: Option<i64>,
}

/// The Flink operator's `SnapshotTriggerType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TriggerType {
    /// `savepointTriggerNonce` changed.
    Manual,
    /// `kubernetes.operator.periodic.savepoint.interval`.
    Periodic,
    /// An upgrade or suspend in savepoint mode.
    Upgrade,
}

impl TriggerType {
    /// The spelling in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerType::Manual => "MANUAL",
            TriggerType::Periodic => "PERIODIC",
            TriggerType::Upgrade => "UPGRADE",
        }
    }
}

/// A manual or periodic savepoint the controller triggered and waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingSavepoint {
    /// The job it was triggered on.
    pub job_id: String,
    /// The trigger's request id.
    pub request_id: String,
    /// Manual or periodic.
    pub trigger_type: TriggerType,
    /// The nonce of a manual one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<i64>,
}

/// A deployment's cluster: processes of its binary under one directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// The first JobManager's REST address (`http://host:port`).
    pub rest_address: String,
    /// Its processes' data directory (pid file, logs, configuration).
    pub dir: String,
    /// The program its processes run.
    pub binary: String,
    /// The cluster's sequence number within the deployment.
    pub seq: u64,
}

/// A multi-step change the controller is making, recorded before each step acts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// What the change is.
    pub kind: OperationKind,
    /// The spec generation it carries out.
    pub generation: u64,
    /// The spec that runs when it is done (`None`: nothing runs, as after a suspend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<DeploymentSpec>,
    /// How the old job stops (and what the new one starts from).
    pub mode: UpgradeMode,
    /// The step under way.
    pub step: Step,
    /// The snapshot the new job starts from, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    /// `-n` for the new job whatever its spec says: a rollback from the failed job's
    /// checkpoint drops the state of the operators only the failed spec had.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_non_restored_state: bool,
    /// When it began, epoch ms.
    pub started_ms: u64,
    /// The newest cluster of the deployment when the operation began (0: none): the
    /// operation stops the clusters up to it and starts the one after it, never a cluster
    /// it did not know of. `None` in a status written before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_cluster: Option<u64>,
}

/// Why the controller changes a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OperationKind {
    /// The first deploy.
    Deploy,
    /// A running job moves to a new spec.
    Upgrade,
    /// A running job stops as the spec says.
    Suspend,
    /// A suspended deployment runs again.
    Resume,
    /// Back to the last stable spec.
    Rollback,
    /// The cluster died: start it again from the newest checkpoint.
    Recover,
    /// The deployment goes away.
    Delete,
}

/// The steps of an operation, in order (an operation skips those it does not need).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", tag = "name")]
pub enum Step {
    /// Check the target against the old job's newest snapshot; nothing has stopped yet.
    PreFlight,
    /// Stop the old job (stop-with-savepoint or cancel, by mode).
    StopJob {
        /// The stop's savepoint request, once triggered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
    },
    /// End the old cluster's processes.
    StopCluster,
    /// Start the cluster `seq` of the target's binary.
    StartCluster {
        /// Its sequence number.
        seq: u64,
    },
    /// Submit the target's job to cluster `seq`.
    SubmitJob {
        /// The cluster.
        seq: u64,
    },
}

impl Step {
    /// How `weir deployment get` names it.
    pub fn describe(&self) -> String {
        match self {
            Step::PreFlight => "pre-flight".to_string(),
            Step::StopJob { .. } => "stopping the job".to_string(),
            Step::StopCluster => "stopping the cluster".to_string(),
            Step::StartCluster { seq } => format!("starting cluster {seq}"),
            Step::SubmitJob { seq } => format!("submitting the job to cluster {seq}"),
        }
    }
}

/// Words in an error that make a deployment FAILED until a person acts (the Flink
/// operator's rule).
pub const MANUAL_RESTORE_REQUIRED: &str = "Manual restore required.";

/// The lifecycle state, by the Flink operator's rules (first match wins).
pub fn lifecycle_state(status: &DeploymentStatus) -> LifecycleState {
    let reconciliation = &status.reconciliation_status;
    if status.deleting {
        return LifecycleState::Deleting;
    }
    let Some(last) = &reconciliation.last_reconciled_spec else {
        return if status.error.is_some() { LifecycleState::Failed } else { LifecycleState::Created };
    };
    match reconciliation.state {
        ReconciliationState::Upgrading => return LifecycleState::Upgrading,
        ReconciliationState::RollingBack => return LifecycleState::RollingBack,
        _ => {}
    }
    if last.job.state == DesiredState::Suspended {
        return LifecycleState::Suspended;
    }
    if status.job_status.state.as_deref() == Some("FAILED") {
        return LifecycleState::Failed;
    }
    if status.error.as_deref().is_some_and(|e| e.contains(MANUAL_RESTORE_REQUIRED)) {
        return LifecycleState::Failed;
    }
    if reconciliation.state == ReconciliationState::RolledBack {
        return LifecycleState::RolledBack;
    }
    if reconciliation.last_stable_spec.as_ref() == Some(last) {
        return LifecycleState::Stable;
    }
    LifecycleState::Deployed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{JobManagerSpec, JobSpec, TaskManagerSpec};

    /// One spelling everywhere: the listings' words are the JSON's.
    #[test]
    fn states_are_spelled_as_their_json() {
        use LifecycleState as L;
        for state in [
            L::Created,
            L::Deployed,
            L::Stable,
            L::Upgrading,
            L::Suspended,
            L::Failed,
            L::RollingBack,
            L::RolledBack,
            L::Deleting,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        use ReconciliationState as R;
        for state in [R::Deployed, R::Upgrading, R::RollingBack, R::RolledBack] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }

    fn spec(parallelism: u32, state: DesiredState) -> DeploymentSpec {
        DeploymentSpec {
            binary: "/bin/weir".into(),
            image: None,
            image_pull_policy: None,
            service_account: None,
            mode: None,
            pod_template: None,
            configuration: Default::default(),
            job_manager: JobManagerSpec::default(),
            task_manager: TaskManagerSpec::default(),
            job: JobSpec {
                name: "counter".into(),
                args: vec![],
                parallelism: Some(parallelism),
                upgrade_mode: UpgradeMode::Savepoint,
                state,
                initial_savepoint_path: None,
                allow_non_restored_state: false,
                savepoint_trigger_nonce: None,
            },
        }
    }

    #[test]
    fn lifecycle_follows_the_operators_rules_in_order() {
        let mut status = DeploymentStatus::default();
        assert_eq!(lifecycle_state(&status), LifecycleState::Created);
        status.error = Some("bad".into());
        assert_eq!(lifecycle_state(&status), LifecycleState::Failed);
        status.error = None;
        status.reconciliation_status.last_reconciled_spec = Some(spec(2, DesiredState::Running));
        assert_eq!(lifecycle_state(&status), LifecycleState::Deployed);
        status.reconciliation_status.last_stable_spec = Some(spec(2, DesiredState::Running));
        assert_eq!(lifecycle_state(&status), LifecycleState::Stable);
        status.reconciliation_status.state = ReconciliationState::Upgrading;
        assert_eq!(lifecycle_state(&status), LifecycleState::Upgrading);
        status.reconciliation_status.state = ReconciliationState::RolledBack;
        assert_eq!(lifecycle_state(&status), LifecycleState::RolledBack);
        status.job_status.state = Some("FAILED".into());
        assert_eq!(lifecycle_state(&status), LifecycleState::Failed);
        status.reconciliation_status.last_reconciled_spec = Some(spec(2, DesiredState::Suspended));
        assert_eq!(lifecycle_state(&status), LifecycleState::Suspended);
        status.reconciliation_status.state = ReconciliationState::RollingBack;
        assert_eq!(lifecycle_state(&status), LifecycleState::RollingBack);
        status.deleting = true;
        assert_eq!(lifecycle_state(&status), LifecycleState::Deleting);
    }

    #[test]
    fn a_manual_restore_error_is_failed() {
        let mut status = DeploymentStatus::default();
        status.reconciliation_status.last_reconciled_spec = Some(spec(2, DesiredState::Running));
        status.error = Some(format!("no checkpoint. {MANUAL_RESTORE_REQUIRED}"));
        assert_eq!(lifecycle_state(&status), LifecycleState::Failed);
    }

    #[test]
    fn the_status_reads_back_what_it_wrote() {
        let mut status = DeploymentStatus {
            operation: Some(Operation {
                kind: OperationKind::Upgrade,
                generation: 3,
                target: Some(spec(4, DesiredState::Running)),
                mode: UpgradeMode::LastState,
                step: Step::StopJob { request_id: Some("r1".into()) },
                restore_from: None,
                allow_non_restored_state: false,
                started_ms: 5,
                newest_cluster: None,
            }),
            ..Default::default()
        };
        status.savepoint_history.push(SavepointRecord {
            time_stamp: 1,
            location: "file:///sp".into(),
            trigger_type: TriggerType::Upgrade,
            format_type: "CANONICAL".into(),
            trigger_nonce: None,
        });
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.contains("\"step\":{\"name\":\"stopJob\",\"requestId\":\"r1\"}"), "{json}");
        assert!(json.contains("\"triggerType\":\"UPGRADE\""), "{json}");
        assert_eq!(serde_json::from_str::<DeploymentStatus>(&json).unwrap(), status);
    }
}
