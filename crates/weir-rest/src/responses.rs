//! The JSON bodies of the REST API, with Flink's field names, for the server and for clients.
//!
//! Job views ([`JobOverview`], [`JobDetails`], [`ExceptionView`]) come from the runtime's
//! [`status`](weir_runtime::status) module; this module adds the cluster-level and wrapper
//! bodies.

use std::collections::BTreeMap;

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
    /// TaskManagers blocked for new slots: always 0 (weir blocks none).
    #[serde(rename = "taskmanagers-blocked", default)]
    pub taskmanagers_blocked: u32,
    /// Free slots on blocked TaskManagers: always 0.
    #[serde(rename = "slots-free-and-blocked", default)]
    pub slots_free_and_blocked: u32,
    /// `weir <version>`, where Flink reports its own version.
    #[serde(rename = "flink-version")]
    pub flink_version: String,
    /// weir's build, where Flink reports its commit.
    #[serde(rename = "flink-commit", default)]
    pub flink_commit: String,
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
    /// Statistics over the subtasks' counters and state durations.
    pub aggregated: AggregatedTaskDetails,
}

/// Flink's `AggregatedTaskDetailsInfo`: per counter and per state, statistics over subtasks.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AggregatedTaskDetails {
    /// Per counter (`read-records`, ...): `min`, `max`, `avg`, `sum`, `median`, `p25`, `p75`,
    /// `p95`.
    pub metrics: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per state: the same statistics of the milliseconds subtasks spent in it.
    #[serde(rename = "status-duration")]
    pub status_duration: BTreeMap<String, BTreeMap<String, u64>>,
}

impl AggregatedTaskDetails {
    /// The statistics of `subtasks`.
    pub fn of(subtasks: &[SubtaskDetails]) -> AggregatedTaskDetails {
        let mut metrics = BTreeMap::new();
        type Counter = fn(&VertexMetrics) -> u64;
        let counters: [(&str, Counter); 7] = [
            ("read-bytes", |m| m.read_bytes),
            ("write-bytes", |m| m.write_bytes),
            ("read-records", |m| m.read_records),
            ("write-records", |m| m.write_records),
            ("accumulated-backpressured-time", |m| m.accumulated_backpressured_time),
            ("accumulated-idle-time", |m| m.accumulated_idle_time),
            ("accumulated-busy-time", |m| m.accumulated_busy_time as u64),
        ];
        for (name, value) in counters {
            metrics.insert(name.to_string(), statistics(subtasks.iter().map(|s| value(&s.metrics)).collect()));
        }
        let mut status_duration = BTreeMap::new();
        for state in ["CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING"] {
            let values = subtasks.iter().map(|s| s.status_duration.get(state).copied().unwrap_or(0)).collect();
            status_duration.insert(state.to_string(), statistics(values));
        }
        AggregatedTaskDetails { metrics, status_duration }
    }
}

/// `min`, `max`, `avg`, `sum`, `median`, `p25`, `p75`, `p95` of `values` (nearest rank; all
/// 0 when empty).
fn statistics(mut values: Vec<u64>) -> BTreeMap<String, u64> {
    values.sort_unstable();
    let n = values.len();
    let rank = |q: f64| if n == 0 { 0 } else { values[((q * n as f64).ceil() as usize).clamp(1, n) - 1] };
    let sum: u64 = values.iter().sum();
    [
        ("min", values.first().copied().unwrap_or(0)),
        ("max", values.last().copied().unwrap_or(0)),
        ("avg", if n == 0 { 0 } else { sum / n as u64 }),
        ("sum", sum),
        ("median", rank(0.5)),
        ("p25", rank(0.25)),
        ("p75", rank(0.75)),
        ("p95", rank(0.95)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
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
    /// weir's build, where Flink reports its commit.
    #[serde(rename = "flink-revision", default)]
    pub flink_revision: String,
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
    /// Rescaling from the Web UI (never: rescale by stop and restore).
    #[serde(rename = "web-rescale", default)]
    pub web_rescale: bool,
    /// The history server (never: weir has none).
    #[serde(rename = "web-history", default)]
    pub web_history: bool,
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
    pub taskmanagers: Vec<TaskManagerEntry>,
}

/// One TaskManager in Flink's `TaskManagerInfo` shape: weir's fields plus Flink's resource
/// fields, which describe a JVM's memory pools weir does not have (zeros, said so in
/// docs/rest-api.md).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagerEntry {
    /// Id, address, slots and heartbeat.
    #[serde(flatten)]
    pub info: TaskManagerInfo,
    /// The port of its data address (-1 when the address has none).
    #[serde(rename = "dataPort")]
    pub data_port: i32,
    /// Always -1: no JMX.
    #[serde(rename = "jmxPort")]
    pub jmx_port: i32,
    /// Slots in use (each runs one subtask of each vertex of a job).
    #[serde(rename = "assignedTasks")]
    pub assigned_tasks: u32,
    /// Its slots as resources: one CPU core per slot, no memory pools.
    #[serde(rename = "totalResource")]
    pub total_resource: ResourceProfile,
    /// The free slots as resources.
    #[serde(rename = "freeResource")]
    pub free_resource: ResourceProfile,
    /// Zeros: weir does not report a TaskManager's hardware.
    pub hardware: HardwareDescription,
    /// Nulls: weir has no JVM memory configuration.
    #[serde(rename = "memoryConfiguration")]
    pub memory_configuration: MemoryConfiguration,
    /// Always false: weir blocks no TaskManager.
    pub blocked: bool,
}

impl TaskManagerEntry {
    /// `info` with Flink's resource fields.
    pub fn of(info: TaskManagerInfo) -> TaskManagerEntry {
        let data_port = info.path.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).unwrap_or(-1);
        let used = info.slots_number.saturating_sub(info.free_slots);
        TaskManagerEntry {
            data_port,
            jmx_port: -1,
            assigned_tasks: used,
            total_resource: ResourceProfile::cores(info.slots_number),
            free_resource: ResourceProfile::cores(info.free_slots),
            hardware: HardwareDescription {
                cpu_cores: info.hardware.cpu_cores,
                physical_memory: info.hardware.physical_memory,
                ..HardwareDescription::default()
            },
            memory_configuration: MemoryConfiguration::default(),
            blocked: false,
            info,
        }
    }
}

/// Flink's `ResourceProfileInfo`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResourceProfile {
    /// CPU cores (one per slot).
    #[serde(rename = "cpuCores")]
    pub cpu_cores: f64,
    /// MB of task heap: 0, no JVM.
    #[serde(rename = "taskHeapMemory")]
    pub task_heap_memory: u32,
    /// MB of task off-heap memory: 0.
    #[serde(rename = "taskOffHeapMemory")]
    pub task_off_heap_memory: u32,
    /// MB of managed memory: 0.
    #[serde(rename = "managedMemory")]
    pub managed_memory: u32,
    /// MB of network buffers: 0.
    #[serde(rename = "networkMemory")]
    pub network_memory: u32,
    /// Always empty.
    #[serde(rename = "extendedResources")]
    pub extended_resources: std::collections::BTreeMap<String, f64>,
}

impl ResourceProfile {
    fn cores(slots: u32) -> ResourceProfile {
        ResourceProfile { cpu_cores: f64::from(slots), ..ResourceProfile::default() }
    }
}

/// Flink's `HardwareDescription`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HardwareDescription {
    /// CPU cores the TaskManager's process may use.
    #[serde(rename = "cpuCores")]
    pub cpu_cores: u32,
    /// Bytes of physical memory of its machine (0 where the system does not say).
    #[serde(rename = "physicalMemory")]
    pub physical_memory: u64,
    /// 0: Flink's is the JVM's free heap; weir has no JVM.
    #[serde(rename = "freeMemory")]
    pub free_memory: u64,
    /// 0: not reported.
    #[serde(rename = "managedMemory")]
    pub managed_memory: u64,
}

/// Flink's `TaskExecutorMemoryConfiguration`: every pool null (weir has no JVM).
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemoryConfiguration {
    /// Null.
    #[serde(rename = "frameworkHeap")]
    pub framework_heap: Option<u64>,
    /// Null.
    #[serde(rename = "taskHeap")]
    pub task_heap: Option<u64>,
    /// Null.
    #[serde(rename = "frameworkOffHeap")]
    pub framework_off_heap: Option<u64>,
    /// Null.
    #[serde(rename = "taskOffHeap")]
    pub task_off_heap: Option<u64>,
    /// Null.
    #[serde(rename = "networkMemory")]
    pub network_memory: Option<u64>,
    /// Null.
    #[serde(rename = "managedMemory")]
    pub managed_memory: Option<u64>,
    /// Null.
    #[serde(rename = "jvmMetaspace")]
    pub jvm_metaspace: Option<u64>,
    /// Null.
    #[serde(rename = "jvmOverhead")]
    pub jvm_overhead: Option<u64>,
    /// Null.
    #[serde(rename = "totalFlinkMemory")]
    pub total_flink_memory: Option<u64>,
    /// Null.
    #[serde(rename = "totalProcessMemory")]
    pub total_process_memory: Option<u64>,
}

/// `GET /taskmanagers/{taskmanagerid}`: the TaskManager and what runs on it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagerDetails {
    /// The fields `GET /taskmanagers` shows.
    #[serde(flatten)]
    pub entry: TaskManagerEntry,
    /// Its used slots, per job.
    #[serde(rename = "allocatedSlots")]
    pub allocated_slots: Vec<SlotInfo>,
    /// Flink's JVM memory metrics: zeros (weir has no JVM heap, non-heap, direct or mapped
    /// pools, nor garbage collectors).
    pub metrics: TaskManagerMetrics,
    /// Subtasks deployed on it and not yet ended (weir's addition).
    pub tasks: Vec<TaskManagerTask>,
}

/// One job's slots on a TaskManager, as Flink's `SlotInfo`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SlotInfo {
    /// The job.
    #[serde(rename = "jobId")]
    pub job_id: String,
    /// The slot as a resource.
    pub resource: ResourceProfile,
    /// Subtasks of the job in the slot.
    #[serde(rename = "assignedTasks")]
    pub assigned_tasks: u32,
}

/// Flink's `TaskManagerMetricsInfo`, all zeros (see [`TaskManagerDetails::metrics`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct TaskManagerMetrics {
    pub heap_used: u64,
    pub heap_committed: u64,
    pub heap_max: u64,
    pub non_heap_used: u64,
    pub non_heap_committed: u64,
    pub non_heap_max: u64,
    pub direct_count: u64,
    pub direct_used: u64,
    pub direct_max: u64,
    pub mapped_count: u64,
    pub mapped_used: u64,
    pub mapped_max: u64,
    pub netty_shuffle_memory_segments_available: u64,
    pub netty_shuffle_memory_segments_used: u64,
    pub netty_shuffle_memory_segments_total: u64,
    pub netty_shuffle_memory_available: u64,
    pub netty_shuffle_memory_used: u64,
    pub netty_shuffle_memory_total: u64,
    pub garbage_collectors: Vec<serde_json::Value>,
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

/// One option of the effective configuration (`GET /jobmanager/config/effective`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EffectiveConfigEntry {
    /// The option's name (Flink's).
    pub key: String,
    /// Its value: as set (secrets masked), else its default.
    pub value: String,
    /// Its default, as the user would write it.
    pub default: String,
    /// Whether it is set (in the configuration file or with -D), not defaulted.
    pub set: bool,
    /// What it does.
    pub description: String,
}
