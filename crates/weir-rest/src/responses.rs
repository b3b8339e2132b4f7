//! The JSON bodies of the REST API, with Flink's field names, for the server and for clients.
//!
//! Job views ([`JobOverview`], [`JobDetails`], [`ExceptionView`]) come from the runtime's
//! [`status`](weir_runtime::status) module; this module adds the cluster-level and wrapper
//! bodies.

use serde::{Deserialize, Serialize};
use weir_runtime::cluster::TaskManagerInfo;
use weir_runtime::status::{ExceptionView, SubtaskDetails, VertexMetrics};
use weir_types::{ExecutionState, JobStatus};

pub use weir_runtime::status::{JobDetails, JobOverview, JobPlan};

/// Every error answer: `{"errors":["..."]}`, as Flink's `ErrorResponseBody`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// What went wrong, one message per problem.
    pub errors: Vec<String>,
}

/// `GET /overview`: the cluster at a glance.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterOverview {
    /// Task managers connected (1 on an embedded cluster).
    pub taskmanagers: u32,
    /// Slots of all task managers.
    #[serde(rename = "slots-total")]
    pub slots_total: u32,
    /// Slots not used by a running job.
    #[serde(rename = "slots-available")]
    pub slots_available: u32,
    /// Jobs not yet in a terminal state.
    #[serde(rename = "jobs-running")]
    pub jobs_running: u32,
    /// Jobs FINISHED.
    #[serde(rename = "jobs-finished")]
    pub jobs_finished: u32,
    /// Jobs CANCELED.
    #[serde(rename = "jobs-cancelled")]
    pub jobs_cancelled: u32,
    /// Jobs FAILED.
    #[serde(rename = "jobs-failed")]
    pub jobs_failed: u32,
    /// `weir <version>`, where Flink reports its own version.
    #[serde(rename = "flink-version")]
    pub flink_version: String,
    /// weir's version.
    #[serde(rename = "weir-version")]
    pub weir_version: String,
    /// High availability: the leader JobManager answering, its epoch and since when.
    #[serde(rename = "high-availability", default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HaOverview>,
}

/// The leadership of an HA cluster, as `/overview` reports it (weir's own field).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HaOverview {
    /// `etcd`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The leader JobManager's id.
    #[serde(rename = "leader-id")]
    pub leader_id: String,
    /// Its leadership epoch: it grows with every change of leader.
    pub epoch: i64,
    /// When it became the leader, epoch ms.
    #[serde(rename = "leader-since")]
    pub leader_since: u64,
    /// The leader's REST API, `http://host:port`.
    #[serde(rename = "leader-address")]
    pub leader_address: String,
    /// The leader's process id on its host.
    #[serde(rename = "leader-pid")]
    pub leader_pid: u32,
}

/// `GET /jobs`: every job's id and state.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobIdsWithStatus {
    /// Jobs, newest first.
    pub jobs: Vec<JobIdWithStatus>,
}

/// One entry of [`JobIdsWithStatus`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobIdWithStatus {
    /// Job id, 32 lowercase hex characters.
    pub id: String,
    /// Job state.
    pub status: JobStatus,
}

/// `GET /jobs/overview`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MultipleJobsDetails {
    /// Jobs, newest first.
    pub jobs: Vec<JobOverview>,
}

/// `GET /jobs/{jobid}/status`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobStatusInfo {
    /// Job state.
    pub status: JobStatus,
}

/// `GET /jobs/{jobid}/vertices/{vertexid}`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobVertexDetails {
    /// Vertex id.
    pub id: String,
    /// Chained operator names.
    pub name: String,
    /// Parallelism.
    pub parallelism: u32,
    /// The job's max parallelism.
    #[serde(rename = "maxParallelism")]
    pub max_parallelism: u32,
    /// Server time, epoch ms.
    pub now: u64,
    /// Every subtask.
    pub subtasks: Vec<SubtaskDetails>,
}

/// `GET /jobs/{jobid}/exceptions`: the exception history plus Flink's legacy fields.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobExceptionsInfo {
    /// Failures, newest first.
    #[serde(rename = "exceptionHistory")]
    pub exception_history: ExceptionHistory,
    /// Legacy: the newest failure's message, or null.
    #[serde(rename = "root-exception", default)]
    pub root_exception: Option<String>,
    /// Legacy: when the newest failure happened, epoch ms, or null.
    #[serde(default)]
    pub timestamp: Option<u64>,
    /// Legacy: the failures, newest first.
    #[serde(rename = "all-exceptions", default)]
    pub all_exceptions: Vec<LegacyException>,
    /// Legacy: whether failures were left out.
    #[serde(default)]
    pub truncated: bool,
}

/// The `exceptionHistory` of [`JobExceptionsInfo`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExceptionHistory {
    /// Failures, newest first, at most `maxExceptions`.
    pub entries: Vec<ExceptionView>,
    /// Whether failures were left out because of `maxExceptions`.
    pub truncated: bool,
}

/// One entry of Flink's legacy `all-exceptions` list.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LegacyException {
    /// The failure's message.
    pub exception: String,
    /// The failed subtask.
    pub task: String,
    /// Where it ran.
    pub location: String,
    /// When, epoch ms.
    pub timestamp: u64,
}

/// `GET /config`: what the Web UI needs to know about the server.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DashboardConfiguration {
    /// How often the Web UI refreshes, ms.
    #[serde(rename = "refresh-interval")]
    pub refresh_interval: u64,
    /// The server's time zone.
    #[serde(rename = "timezone-name")]
    pub timezone_name: String,
    /// The time zone's offset from UTC, ms.
    #[serde(rename = "timezone-offset")]
    pub timezone_offset: i64,
    /// `weir <version>`.
    #[serde(rename = "flink-version")]
    pub flink_version: String,
    /// Which Web UI actions are enabled.
    pub features: DashboardFeatures,
}

/// The `features` of [`DashboardConfiguration`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DashboardFeatures {
    /// Job submission from the Web UI (never: jobs are built into the binary).
    #[serde(rename = "web-submit")]
    pub web_submit: bool,
    /// Cancelling jobs from the Web UI.
    #[serde(rename = "web-cancel")]
    pub web_cancel: bool,
    /// weir's own: this server is the deployment controller (`/deployments`).
    #[serde(default)]
    pub deployments: bool,
}

/// `GET /jobs/{jobid}/plan`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobPlanInfo {
    /// The operator graph.
    pub plan: JobPlan,
}

/// `GET /taskmanagers`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagersInfo {
    /// Registered TaskManagers, by id.
    pub taskmanagers: Vec<TaskManagerInfo>,
}

/// `GET /taskmanagers/{taskmanagerid}`: the TaskManager and what runs on it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagerDetails {
    /// The fields `GET /taskmanagers` shows.
    #[serde(flatten)]
    pub info: TaskManagerInfo,
    /// Subtasks deployed on it and not yet ended (weir's addition).
    pub tasks: Vec<TaskManagerTask>,
}

/// One subtask in [`TaskManagerDetails`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagerTask {
    /// Job id.
    pub jid: String,
    /// Job name.
    #[serde(rename = "jobName")]
    pub job_name: String,
    /// Vertex id.
    #[serde(rename = "vertexId")]
    pub vertex_id: String,
    /// Chained operator names.
    #[serde(rename = "vertexName")]
    pub vertex_name: String,
    /// Subtask index.
    pub subtask: u32,
    /// State.
    pub status: ExecutionState,
    /// Counters.
    pub metrics: VertexMetrics,
}

/// One entry of `GET /jobmanager/config`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConfigEntry {
    /// The option's name (Flink's).
    pub key: String,
    /// Its value as set (secrets masked).
    pub value: String,
}
