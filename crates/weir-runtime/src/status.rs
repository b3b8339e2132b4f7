//! Views of jobs shaped like Flink's REST responses, built from a job master's record.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobStatus, Lifecycle};

use crate::job_master::{JobMaster, JobRecord, SubtaskRecord};
use crate::jobgraph::JobGraph;

/// `GET /jobs/overview` entry.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobOverview {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// Job state.
    pub state: JobStatus,
    /// When the job was submitted, epoch ms.
    #[serde(rename = "start-time")]
    pub start_time: u64,
    /// When it reached a terminal state, epoch ms; -1 while it runs.
    #[serde(rename = "end-time")]
    pub end_time: i64,
    /// Milliseconds from start to end (or to now).
    pub duration: u64,
    /// Last state change, epoch ms.
    #[serde(rename = "last-modification")]
    pub last_modification: u64,
    /// Subtask counts per state (lowercase state names) and `total`.
    pub tasks: BTreeMap<String, u32>,
    /// Flink 2's operators not yet known to the adaptive batch scheduler: always 0 (a
    /// streaming job's graph is complete at submission).
    #[serde(rename = "pending-operators", default)]
    pub pending_operators: u32,
}

/// One subtask in [`VertexDetails`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskDetails {
    /// Subtask index.
    pub subtask: u32,
    /// State.
    pub status: ExecutionState,
    /// Where it runs.
    pub host: String,
    /// Its execution attempt: the job's restarts so far (Flink counts per subtask; weir's
    /// restarts are per job or per region, and this is the job's count).
    #[serde(default)]
    pub attempt: u32,
    /// Where it runs, as Flink's `endpoint`.
    #[serde(default)]
    pub endpoint: String,
    /// The TaskManager running it.
    #[serde(rename = "taskmanager-id", default)]
    pub taskmanager_id: String,
    /// When it was created, epoch ms.
    #[serde(rename = "start-time")]
    pub start_time: u64,
    /// The same, under the older name Flink still sends.
    #[serde(rename = "start_time", default)]
    pub start_time_legacy: u64,
    /// When it reached a terminal state, epoch ms; -1 while it runs.
    #[serde(rename = "end-time", default)]
    pub end_time: i64,
    /// Milliseconds in its lifetime so far.
    pub duration: u64,
    /// Milliseconds spent in each state it went through (upper-case state names).
    #[serde(rename = "status-duration", default)]
    pub status_duration: BTreeMap<String, u64>,
    /// For each state entered, the epoch ms when it was last entered.
    pub timestamps: BTreeMap<String, u64>,
    /// Counters.
    pub metrics: VertexMetrics,
    /// Each chained operator's records, head first (weir's addition; Flink reports these as
    /// operator metrics).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<OperatorRecords>,
    /// A source's read position per split (weir's addition; Flink reports these as the
    /// KafkaSourceReader's `currentOffset` and `records-lag` metrics).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<SplitView>,
    /// Records a source skipped as undeserialisable (weir's addition; absent when none).
    #[serde(rename = "skipped-records", default, skip_serializing_if = "is_zero")]
    pub skipped_records: u64,
    /// Records a sink could not write (weir's addition; Flink's `numRecordsSendErrors`;
    /// absent when none).
    #[serde(rename = "send-errors", default, skip_serializing_if = "is_zero")]
    pub send_errors: u64,
    /// Records that came too late for their windows (weir's addition; Flink's
    /// `numLateRecordsDropped`; absent when none).
    #[serde(rename = "late-records", default, skip_serializing_if = "is_zero")]
    pub late_records: u64,
    /// The subtask's input watermark, epoch ms (absent before the first; Flink's
    /// `currentInputWatermark`).
    #[serde(rename = "input-watermark", default, skip_serializing_if = "Option::is_none")]
    pub input_watermark: Option<i64>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Where a source subtask reads one split.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SplitView {
    /// The split (`<topic>-<partition>` for Kafka).
    pub split: String,
    /// The next offset to read.
    #[serde(rename = "current-offset")]
    pub current_offset: i64,
    /// Records between the position and the split's end, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
}

/// Records into and out of one chained operator of a subtask.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OperatorRecords {
    /// The operator's uid.
    pub uid: String,
    /// Records it received.
    #[serde(rename = "read-records")]
    pub read_records: u64,
    /// Records it emitted.
    #[serde(rename = "write-records")]
    pub write_records: u64,
    /// The newest watermark it emitted, epoch ms (absent before the first; Flink's operator
    /// `currentOutputWatermark`).
    #[serde(rename = "output-watermark", default, skip_serializing_if = "Option::is_none")]
    pub output_watermark: Option<i64>,
}

/// Record counters, as Flink's `IOMetricsInfo`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexMetrics {
    /// Records received.
    #[serde(rename = "read-records")]
    pub read_records: u64,
    /// Always true: every record received is counted.
    #[serde(rename = "read-records-complete", default)]
    pub read_records_complete: bool,
    /// Records sent or written.
    #[serde(rename = "write-records")]
    pub write_records: u64,
    /// Always true: every record sent is counted.
    #[serde(rename = "write-records-complete", default)]
    pub write_records_complete: bool,
    /// Bytes received over TCP from other processes (Flink's `numBytesIn`); channels
    /// within a process pass records without serializing them and count none.
    #[serde(rename = "read-bytes", default)]
    pub read_bytes: u64,
    /// Always false: channels within a process are not counted in `read-bytes`.
    #[serde(rename = "read-bytes-complete", default)]
    pub read_bytes_complete: bool,
    /// Bytes sent over TCP to other processes, as `read-bytes`.
    #[serde(rename = "write-bytes", default)]
    pub write_bytes: u64,
    /// Always false, as `read-bytes-complete`.
    #[serde(rename = "write-bytes-complete", default)]
    pub write_bytes_complete: bool,
    /// Milliseconds blocked on full output channels.
    #[serde(rename = "backpressured-time-ms")]
    pub backpressured_ms: u64,
    /// The same milliseconds under Flink's name.
    #[serde(rename = "accumulated-backpressured-time", default)]
    pub accumulated_backpressured_time: u64,
    /// Milliseconds waiting for input.
    #[serde(rename = "accumulated-idle-time", default)]
    pub accumulated_idle_time: u64,
    /// Milliseconds running and neither waiting for input nor blocked on output.
    #[serde(rename = "accumulated-busy-time", default)]
    pub accumulated_busy_time: f64,
}

impl VertexMetrics {
    /// Counters of `read_records` in, `write_records` out and `backpressured_ms` blocked.
    pub fn of(read_records: u64, write_records: u64, backpressured_ms: u64) -> VertexMetrics {
        VertexMetrics {
            read_records,
            read_records_complete: true,
            write_records,
            write_records_complete: true,
            backpressured_ms,
            accumulated_backpressured_time: backpressured_ms,
            ..VertexMetrics::default()
        }
    }

    /// The same counters with the time split: `idle_ms` waiting for input and `busy_ms`
    /// working (the rest of the time running, backpressure being the third part).
    pub fn with_time(self, idle_ms: u64, busy_ms: u64) -> VertexMetrics {
        VertexMetrics { accumulated_idle_time: idle_ms, accumulated_busy_time: busy_ms as f64, ..self }
    }

    /// The same counters with `read_bytes` and `write_bytes` that crossed TCP.
    pub fn with_bytes(self, read_bytes: u64, write_bytes: u64) -> VertexMetrics {
        VertexMetrics { read_bytes, write_bytes, ..self }
    }

    /// The sum of `self` and `other`.
    pub fn plus(&self, other: &VertexMetrics) -> VertexMetrics {
        VertexMetrics::of(
            self.read_records + other.read_records,
            self.write_records + other.write_records,
            self.backpressured_ms + other.backpressured_ms,
        )
        .with_time(
            self.accumulated_idle_time + other.accumulated_idle_time,
            (self.accumulated_busy_time + other.accumulated_busy_time) as u64,
        )
        .with_bytes(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)
    }
}

/// One vertex in [`JobDetails`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexDetails {
    /// Vertex id.
    pub id: String,
    /// Chained operator names.
    pub name: String,
    /// Uids of the chained operators.
    pub uids: Vec<String>,
    /// The slot sharing group: one per job (every vertex shares the job's slots).
    #[serde(rename = "slotSharingGroupId", default)]
    pub slot_sharing_group_id: String,
    /// Parallelism.
    pub parallelism: u32,
    /// The job's max parallelism.
    #[serde(rename = "maxParallelism")]
    pub max_parallelism: u32,
    /// Aggregate state (the "least advanced" subtask state, as Flink shows it).
    pub status: ExecutionState,
    /// When its first subtask was created, epoch ms.
    #[serde(rename = "start-time", default)]
    pub start_time: u64,
    /// When its last subtask ended, epoch ms; -1 while any runs.
    #[serde(rename = "end-time", default)]
    pub end_time: i64,
    /// Milliseconds from start to end (or now).
    #[serde(default)]
    pub duration: u64,
    /// Subtask counts per state (upper-case state names, as Flink's).
    pub tasks: BTreeMap<String, u32>,
    /// Summed counters.
    pub metrics: VertexMetrics,
    /// Every subtask.
    pub subtasks: Vec<SubtaskDetails>,
}

/// `GET /jobs/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobDetails {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// Whether stop-with-savepoint applies (all sources can stop).
    #[serde(rename = "isStoppable")]
    pub is_stoppable: bool,
    /// Job state.
    pub state: JobStatus,
    /// Always `STREAMING`.
    #[serde(rename = "job-type", default)]
    pub job_type: String,
    /// Submit time, epoch ms.
    #[serde(rename = "start-time")]
    pub start_time: u64,
    /// End time, epoch ms, or -1.
    #[serde(rename = "end-time")]
    pub end_time: i64,
    /// Milliseconds from start to end (or now).
    pub duration: u64,
    /// The job's max parallelism (0 until the job graph is built).
    #[serde(rename = "maxParallelism")]
    pub max_parallelism: u32,
    /// Server time, epoch ms.
    pub now: u64,
    /// For each job state, when the job last entered it.
    pub timestamps: BTreeMap<String, u64>,
    /// Tasks.
    pub vertices: Vec<VertexDetails>,
    /// Vertex counts per state (upper-case state names).
    #[serde(rename = "status-counts")]
    pub status_counts: BTreeMap<String, u32>,
    /// Always 0, as in [`JobOverview`].
    #[serde(rename = "pending-operators", default)]
    pub pending_operators: u32,
    /// Why the job failed, if it did.
    #[serde(rename = "failure-cause", skip_serializing_if = "Option::is_none", default)]
    pub failure_cause: Option<String>,
    /// Restarts after failures so far (Flink's `numRestarts` metric).
    #[serde(rename = "numRestarts", default)]
    pub num_restarts: u32,
    /// The operator graph: vertices and the exchanges between them.
    #[serde(default)]
    pub plan: JobPlan,
    /// The snapshot the job (or its latest restart) restored, with read progress (weir's
    /// addition; `weir run -s` draws its progress bar from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreProgress>,
}

/// The `restore` of [`JobDetails`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RestoreProgress {
    /// The snapshot's location.
    pub external_path: String,
    /// Its checkpoint id.
    pub checkpoint_id: u64,
    /// Bytes the subtasks read from it so far.
    #[serde(rename = "bytes-read")]
    pub bytes_read: u64,
    /// Bytes all subtasks read when the restore is complete.
    #[serde(rename = "bytes-total")]
    pub bytes_total: u64,
}

/// The `plan` of [`JobDetails`], as Flink's: one node per vertex with its inputs.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobPlan {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// Always `STREAMING`.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Vertices in topological order.
    pub nodes: Vec<PlanNode>,
}

/// One vertex of a [`JobPlan`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanNode {
    /// Vertex id.
    pub id: String,
    /// Parallelism.
    pub parallelism: u32,
    /// Empty, as Flink's streaming plans leave it.
    #[serde(default)]
    pub operator: String,
    /// Empty, as Flink's streaming plans leave it.
    #[serde(default)]
    pub operator_strategy: String,
    /// Chained operator names.
    pub description: String,
    /// Exchanges feeding this vertex.
    pub inputs: Vec<PlanInput>,
    /// Always `{}` (Flink's batch optimizer's properties).
    #[serde(default)]
    pub optimizer_properties: serde_json::Map<String, serde_json::Value>,
}

/// One input of a [`PlanNode`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanInput {
    /// Input index.
    pub num: u32,
    /// The producing vertex's id.
    pub id: String,
    /// `FORWARD`, `REBALANCE` or `HASH`.
    pub ship_strategy: String,
    /// Always `pipelined_bounded` (bounded in-memory or TCP channels).
    pub exchange: String,
    /// Always empty (a batch notion).
    #[serde(default)]
    pub local_strategy: String,
    /// Always empty (a batch notion).
    #[serde(default)]
    pub caching: String,
}

/// `GET /jobs/{id}/config`: what the job runs with beyond its code, as Flink's job
/// configuration.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobConfigInfo {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// The execution settings Flink's `ExecutionConfigInfo` has (Flink's clients refuse
    /// any other field inside it).
    #[serde(rename = "execution-config")]
    pub execution_config: ExecutionConfigInfo,
    /// weir's further execution settings.
    #[serde(rename = "weir-execution-config", default)]
    pub weir_execution_config: WeirExecutionConfig,
}

/// The `execution-config` of [`JobConfigInfo`], Flink's fields only.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecutionConfigInfo {
    /// The restart strategy and its settings, in words.
    #[serde(rename = "restart-strategy")]
    pub restart_strategy: String,
    /// `parallelism.default` or `-p`.
    #[serde(rename = "job-parallelism")]
    pub job_parallelism: u32,
    /// Always false: records are moved between operators, never reused.
    #[serde(rename = "object-reuse-mode")]
    pub object_reuse_mode: bool,
    /// Flink's global job parameters: always empty (a weir job's parameters are its
    /// arguments).
    #[serde(rename = "user-config", default)]
    pub user_config: BTreeMap<String, String>,
}

/// The `weir-execution-config` of [`JobConfigInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WeirExecutionConfig {
    /// Always `PIPELINED` (streaming).
    #[serde(rename = "execution-mode")]
    pub execution_mode: String,
    /// The job's max parallelism (key groups), once its graph is built.
    #[serde(rename = "max-parallelism")]
    pub max_parallelism: u32,
    /// `region` or `full`.
    #[serde(rename = "failover-strategy")]
    pub failover_strategy: String,
}

/// `GET /jobs/{id}/exceptions` entry.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExceptionView {
    /// Error class.
    #[serde(rename = "exceptionName")]
    pub exception_name: String,
    /// Full message.
    pub stacktrace: String,
    /// When, epoch ms.
    pub timestamp: u64,
    /// The failed subtask.
    #[serde(rename = "taskName")]
    pub task_name: String,
    /// Where it ran.
    pub location: String,
    /// Where it ran, as Flink's `endpoint`.
    #[serde(default)]
    pub endpoint: String,
    /// The TaskManager it ran on, as far as weir knows it (its location).
    #[serde(rename = "taskManagerId", default)]
    pub task_manager_id: String,
    /// Flink's failure enricher labels: always empty.
    #[serde(rename = "failureLabels", default)]
    pub failure_labels: BTreeMap<String, String>,
    /// Failures of other subtasks in the same restart: weir records each as its own entry,
    /// so always empty.
    #[serde(rename = "concurrentExceptions", default)]
    pub concurrent_exceptions: Vec<serde_json::Value>,
}

/// Each chained operator's records: out as counted, in derived (an operator receives what
/// the one feeding it emitted, the head what the task received).
fn chain_records(metrics: &weir_api::operator::TaskMetrics, is_source: bool) -> Vec<OperatorRecords> {
    let received = if is_source { 0 } else { metrics.records_in.load(Ordering::Relaxed) };
    metrics
        .operators
        .iter()
        .map(|operator| {
            let read_records = match operator.fed_by.and_then(|position| metrics.operators.get(position)) {
                Some(feeder) => feeder.records_out.load(Ordering::Relaxed),
                None => received,
            };
            OperatorRecords {
                uid: operator.uid.clone(),
                read_records,
                write_records: operator.records_out.load(Ordering::Relaxed),
                output_watermark: operator.output_watermark(),
            }
        })
        .collect()
}

fn empty_counts() -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for state in ExecutionState::all() {
        counts.insert(state.name().to_lowercase(), 0);
    }
    counts
}

/// Counts per state under the upper-case names, as Flink's `Map<ExecutionState, Integer>`.
fn empty_state_counts() -> BTreeMap<String, u32> {
    ExecutionState::all().iter().map(|state| (state.name().to_string(), 0)).collect()
}

/// Milliseconds spent in each state of `history`, the current one up to now.
fn status_durations(history: &weir_types::lifecycle::StateHistory<ExecutionState>) -> BTreeMap<String, u64> {
    let mut durations = BTreeMap::new();
    let transitions = history.transitions();
    for (index, transition) in transitions.iter().enumerate() {
        if transition.state.is_terminal() {
            continue;
        }
        let until = transitions.get(index + 1).map(|t| t.at_ms).unwrap_or_else(now_ms);
        *durations.entry(transition.state.name().to_string()).or_default() += until.saturating_sub(transition.at_ms);
    }
    durations
}

fn end_and_duration(start: u64, terminal_at: Option<u64>) -> (i64, u64) {
    match terminal_at {
        Some(end) => (end as i64, end.saturating_sub(start)),
        None => (-1, now_ms().saturating_sub(start)),
    }
}

/// Flink's aggregate vertex state: any failure wins, then the least advanced state.
pub fn aggregate_state(states: &[ExecutionState]) -> ExecutionState {
    use ExecutionState::*;
    let order =
        [Failed, Canceling, Canceled, Created, Scheduled, Deploying, Initializing, Reconciling, Running, Finished];
    for candidate in order {
        if states.contains(&candidate) {
            return candidate;
        }
    }
    Created
}

/// When `history` last entered each state it entered, under the state's `name`.
fn entered_timestamps<S: Lifecycle + 'static>(
    history: &weir_types::lifecycle::StateHistory<S>,
    name: impl Fn(S) -> String,
) -> BTreeMap<String, u64> {
    let mut timestamps = BTreeMap::new();
    for state in S::all() {
        if let Some(at) = history.last_entered(*state) {
            timestamps.insert(name(*state), at);
        }
    }
    timestamps
}

/// Subtask `index` of a vertex, in attempt `attempt`.
fn subtask_details(index: usize, subtask: &SubtaskRecord, attempt: u32, is_source: bool) -> SubtaskDetails {
    let state = subtask.history.current();
    let backpressured_ms = subtask.metrics.backpressured_ms_now();
    let idle_ms = subtask.metrics.idle_ms_now();
    // Busy: the time RUNNING that was neither waiting for input nor blocked on output.
    let running_ms = subtask.history.last_entered(ExecutionState::Running).map_or(0, |since| {
        let until = if state.is_terminal() { subtask.history.current_since() } else { weir_types::lifecycle::now_ms() };
        until.saturating_sub(since)
    });
    let subtask_metrics = VertexMetrics::of(
        subtask.metrics.records_in.load(Ordering::Relaxed),
        subtask.metrics.records_out.load(Ordering::Relaxed),
        backpressured_ms,
    )
    .with_time(idle_ms, running_ms.saturating_sub(idle_ms + backpressured_ms))
    .with_bytes(subtask.metrics.bytes_in.load(Ordering::Relaxed), subtask.metrics.bytes_out.load(Ordering::Relaxed));
    let created = subtask.history.transitions().first().map(|t| t.at_ms).unwrap_or_default();
    let terminal_at = if state.is_terminal() { Some(subtask.history.current_since()) } else { None };
    let (subtask_end, subtask_duration) = end_and_duration(created, terminal_at);
    SubtaskDetails {
        subtask: index as u32,
        status: state,
        host: subtask.host.clone(),
        attempt,
        endpoint: subtask.host.clone(),
        taskmanager_id: subtask.host.clone(),
        start_time: created,
        start_time_legacy: created,
        end_time: subtask_end,
        duration: subtask_duration,
        status_duration: status_durations(&subtask.history),
        timestamps: entered_timestamps(&subtask.history, |s: ExecutionState| s.name().to_string()),
        metrics: subtask_metrics,
        operators: chain_records(&subtask.metrics, is_source),
        splits: subtask
            .metrics
            .splits()
            .into_iter()
            .map(|s| SplitView { split: s.split, current_offset: s.current_offset, lag: s.lag })
            .collect(),
        skipped_records: subtask.metrics.records_skipped.load(Ordering::Relaxed),
        send_errors: subtask.metrics.records_send_errors.load(Ordering::Relaxed),
        late_records: subtask.metrics.records_late.load(Ordering::Relaxed),
        input_watermark: subtask.metrics.input_watermark(),
    }
}

/// A vertex's start, end (-1 until every subtask ended) and duration, from its subtasks'
/// (the job's start when it has none).
fn vertex_span(views: &[SubtaskDetails], job_start: u64) -> (u64, i64, u64) {
    let vertex_start = views.iter().map(|v| v.start_time).min().unwrap_or(job_start);
    let vertex_end = if views.iter().all(|v| v.end_time >= 0) && !views.is_empty() {
        views.iter().map(|v| v.end_time).max().unwrap_or(-1)
    } else {
        -1
    };
    let vertex_duration = if vertex_end >= 0 {
        (vertex_end as u64).saturating_sub(vertex_start)
    } else {
        now_ms().saturating_sub(vertex_start)
    };
    (vertex_start, vertex_end, vertex_duration)
}

/// How far the current attempt's restore has read, when it restored a snapshot.
fn restore_progress(record: &JobRecord) -> Option<RestoreProgress> {
    record.restore.as_ref().map(|(path, checkpoint_id, total)| RestoreProgress {
        external_path: path.clone(),
        checkpoint_id: *checkpoint_id,
        bytes_read: record.subtasks.iter().flatten().map(|s| s.metrics.restored_bytes.load(Ordering::Relaxed)).sum(),
        bytes_total: *total,
    })
}

impl JobMaster {
    fn times(&self) -> (u64, i64, u64, u64) {
        let record = self.record();
        let start = record.history.transitions().first().map(|t| t.at_ms).unwrap_or_default();
        let current = record.history.current();
        let terminal_at = if current.is_terminal() { Some(record.history.current_since()) } else { None };
        let (end, duration) = end_and_duration(start, terminal_at);
        (start, end, duration, record.history.current_since())
    }

    /// The job's overview entry.
    pub fn overview(&self) -> JobOverview {
        let (start, end, duration, last_modification) = self.times();
        let record = self.record();
        let mut tasks = empty_counts();
        let mut total = 0;
        for subtask in record.subtasks.iter().flatten() {
            *tasks.entry(subtask.history.current().name().to_lowercase()).or_default() += 1;
            total += 1;
        }
        tasks.insert("total".into(), total);
        JobOverview {
            jid: self.job_id().to_string(),
            name: self.job_name().to_string(),
            state: record.history.current(),
            start_time: start,
            end_time: end,
            duration,
            last_modification,
            tasks,
            pending_operators: 0,
        }
    }

    /// The job's details.
    pub fn details(&self) -> JobDetails {
        let (start, end, duration, _) = self.times();
        let record = self.record();
        let timestamps = entered_timestamps(&record.history, |state: JobStatus| state.name().to_string());
        let mut vertices = Vec::new();
        let mut status_counts = empty_state_counts();
        let plan = self.plan(record.job_graph.as_deref());
        if let Some(job_graph) = &record.job_graph {
            for (vertex_index, subtasks) in (0..job_graph.vertices.len()).zip(&record.subtasks) {
                let vertex = self.vertex_details(job_graph, vertex_index, subtasks, record.restarts, start);
                *status_counts.entry(vertex.status.name().to_string()).or_default() += 1;
                vertices.push(vertex);
            }
        }
        JobDetails {
            jid: self.job_id().to_string(),
            name: self.job_name().to_string(),
            is_stoppable: false,
            state: record.history.current(),
            job_type: "STREAMING".into(),
            start_time: start,
            end_time: end,
            duration,
            max_parallelism: record.job_graph.as_ref().map(|g| g.max_parallelism).unwrap_or(0),
            now: now_ms(),
            timestamps,
            vertices,
            status_counts,
            pending_operators: 0,
            failure_cause: record.failure_cause.clone(),
            num_restarts: record.restarts,
            plan,
            restore: restore_progress(&record),
        }
    }

    /// The job's plan: one node per vertex of its graph (none before the graph is built).
    fn plan(&self, job_graph: Option<&JobGraph>) -> JobPlan {
        let mut plan = JobPlan {
            jid: self.job_id().to_string(),
            name: self.job_name().to_string(),
            job_type: "STREAMING".into(),
            nodes: Vec::new(),
        };
        let Some(job_graph) = job_graph else { return plan };
        for (index, vertex) in job_graph.vertices.iter().enumerate() {
            let inputs = job_graph
                .inputs_of(index)
                .enumerate()
                .map(|(num, (_, edge))| PlanInput {
                    num: num as u32,
                    id: job_graph.vertices[edge.source_vertex].id.clone(),
                    ship_strategy: edge.ship_strategy.to_string(),
                    exchange: "pipelined_bounded".into(),
                    local_strategy: String::new(),
                    caching: String::new(),
                })
                .collect();
            plan.nodes.push(PlanNode {
                id: vertex.id.clone(),
                parallelism: vertex.parallelism,
                operator: String::new(),
                operator_strategy: String::new(),
                description: vertex.name.clone(),
                inputs,
                optimizer_properties: serde_json::Map::new(),
            });
        }
        plan
    }

    /// Vertex `vertex_index` of `job_graph` with its `subtasks`, in attempt `attempt` of a
    /// job started at `job_start`.
    fn vertex_details(
        &self,
        job_graph: &JobGraph,
        vertex_index: usize,
        subtasks: &[SubtaskRecord],
        attempt: u32,
        job_start: u64,
    ) -> VertexDetails {
        let vertex = &job_graph.vertices[vertex_index];
        // A source task's head operator receives nothing; any other head receives what
        // the task does.
        let is_source = job_graph.inputs_of(vertex_index).next().is_none();
        let mut tasks = empty_state_counts();
        let mut metrics = VertexMetrics::default();
        let mut views = Vec::new();
        let mut states = Vec::new();
        for (index, subtask) in subtasks.iter().enumerate() {
            let view = subtask_details(index, subtask, attempt, is_source);
            states.push(view.status);
            *tasks.entry(view.status.name().to_string()).or_default() += 1;
            metrics = metrics.plus(&view.metrics);
            views.push(view);
        }
        let status = aggregate_state(&states);
        let (start_time, end_time, duration) = vertex_span(&views, job_start);
        VertexDetails {
            id: vertex.id.clone(),
            name: vertex.name.clone(),
            uids: vertex.uids.clone(),
            slot_sharing_group_id: self.job_id().to_string(),
            parallelism: vertex.parallelism,
            max_parallelism: job_graph.max_parallelism,
            status,
            start_time,
            end_time,
            duration,
            tasks,
            metrics,
            subtasks: views,
        }
    }

    /// The job's configuration.
    pub fn config(&self) -> JobConfigInfo {
        let (execution_config, mut weir_execution_config) = self.execution_config().clone();
        weir_execution_config.max_parallelism =
            self.record().job_graph.as_ref().map(|g| g.max_parallelism).unwrap_or(0);
        JobConfigInfo {
            jid: self.job_id().to_string(),
            name: self.job_name().to_string(),
            execution_config,
            weir_execution_config,
        }
    }

    /// Failures, newest first.
    pub fn exceptions(&self) -> Vec<ExceptionView> {
        let record = self.record();
        record
            .exceptions
            .iter()
            .rev()
            .map(|e| ExceptionView {
                exception_name: e.name.clone(),
                stacktrace: e.message.clone(),
                timestamp: e.timestamp_ms,
                task_name: e.task_name.clone(),
                location: e.location.clone(),
                endpoint: e.location.clone(),
                task_manager_id: e.location.clone(),
                failure_labels: BTreeMap::new(),
                concurrent_exceptions: Vec::new(),
            })
            .collect()
    }
}
