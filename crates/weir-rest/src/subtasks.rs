//! A vertex's subtasks in Flink's shapes: one subtask (current attempt), the subtasks' state
//! times, the subtasks per TaskManager, accumulators (weir has none: empty lists), the
//! task metrics of a vertex and of a subtask, and the job's resource requirements (each
//! vertex's parallelism).

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use weir_runtime::status::{SubtaskDetails, VertexDetails, VertexMetrics};
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, Lifecycle};

use crate::error::ApiError;
use crate::metric_queries::{AggregatedMetric, MetricValue, aggregate, query};
use crate::responses::{AggregatedTaskDetails, ErrorResponse};
use crate::routes::{AppState, Params, find_vertex};

fn subtask_of(vertex: &VertexDetails, raw: &str) -> Result<SubtaskDetails, ApiError> {
    let index: u32 = raw
        .parse()
        .map_err(|_| ApiError::bad_request(format!("subtask index '{raw}' is not a non-negative integer")))?;
    vertex.subtasks.iter().find(|s| s.subtask == index).cloned().ok_or_else(|| {
        ApiError::not_found(format!(
            "Vertex {} has no subtask {index}: its parallelism is {}",
            vertex.id, vertex.parallelism
        ))
    })
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}", tag = "jobs", summary = "One subtask's current attempt", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("subtaskindex" = u32, Path, description = "Subtask index")), responses((status = 200, body = SubtaskDetails), (status = 400, description = "Not a job id or subtask index", body = ErrorResponse), (status = 404, description = "No such job, vertex or subtask", body = ErrorResponse)))]
pub(crate) async fn subtask(
    State(state): State<AppState>,
    ids: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Json<SubtaskDetails>, ApiError> {
    let Path((jobid, vertexid, index)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(subtask_of(&vertex, &index)?))
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}", tag = "jobs", summary = "One attempt of a subtask (weir keeps the current one)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("subtaskindex" = u32, Path, description = "Subtask index"), ("attempt" = u32, Path, description = "Attempt number")), responses((status = 200, body = SubtaskDetails), (status = 400, description = "Not a job id, index or attempt", body = ErrorResponse), (status = 404, description = "No such job, vertex, subtask or attempt", body = ErrorResponse)))]
pub(crate) async fn subtask_attempt(
    State(state): State<AppState>,
    ids: Result<Path<(String, String, String, String)>, PathRejection>,
) -> Result<Json<SubtaskDetails>, ApiError> {
    let Path((jobid, vertexid, index, attempt)) = ids?;
    Ok(Json(attempt_of(&state, &jobid, &vertexid, &index, &attempt)?))
}

/// Attempt `attempt` of subtask `index` of the vertex: 404 unless it is the current one.
fn attempt_of(
    state: &AppState,
    jobid: &str,
    vertexid: &str,
    index: &str,
    attempt: &str,
) -> Result<SubtaskDetails, ApiError> {
    let vertex = find_vertex(&state.dispatcher, jobid, vertexid)?;
    let subtask = subtask_of(&vertex, index)?;
    let attempt: u32 = attempt
        .parse()
        .map_err(|_| ApiError::bad_request(format!("attempt '{attempt}' is not a non-negative integer")))?;
    if attempt != subtask.attempt {
        return Err(ApiError::not_found(format!(
            "Subtask {index} of vertex {vertexid} is at attempt {}; weir keeps only the current attempt",
            subtask.attempt
        )));
    }
    Ok(subtask)
}

/// `GET .../subtasktimes`, as Flink's `SubtasksTimesInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtasksTimes {
    /// Vertex id.
    pub id: String,
    /// Chained operator names.
    pub name: String,
    /// Server time, epoch ms.
    pub now: u64,
    /// Each subtask.
    pub subtasks: Vec<SubtaskTimes>,
}

/// One subtask of [`SubtasksTimes`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskTimes {
    /// Subtask index.
    pub subtask: u32,
    /// Where it runs.
    pub endpoint: String,
    /// Milliseconds in its lifetime so far.
    pub duration: u64,
    /// For each state entered, when it was last entered, epoch ms.
    pub timestamps: BTreeMap<String, u64>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasktimes", tag = "jobs", summary = "When each subtask entered each state", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = SubtasksTimes), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn subtask_times(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<SubtasksTimes>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(SubtasksTimes {
        now: now_ms(),
        subtasks: vertex
            .subtasks
            .iter()
            .map(|s| SubtaskTimes {
                subtask: s.subtask,
                endpoint: s.endpoint.clone(),
                duration: s.duration,
                timestamps: s.timestamps.clone(),
            })
            .collect(),
        id: vertex.id,
        name: vertex.name,
    }))
}

/// `GET .../taskmanagers`, as Flink's `JobVertexTaskManagersInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexTaskManagers {
    /// Vertex id.
    pub id: String,
    /// Chained operator names.
    pub name: String,
    /// Server time, epoch ms.
    pub now: u64,
    /// The vertex's subtasks grouped by the TaskManager they run on.
    pub taskmanagers: Vec<VertexTaskManager>,
}

/// One TaskManager of [`VertexTaskManagers`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexTaskManager {
    /// Where its subtasks run.
    pub endpoint: String,
    /// The least advanced state of its subtasks.
    pub status: ExecutionState,
    /// When its first subtask was created, epoch ms.
    #[serde(rename = "start-time")]
    pub start_time: u64,
    /// When its last subtask ended, epoch ms; -1 while any runs.
    #[serde(rename = "end-time")]
    pub end_time: i64,
    /// Milliseconds from start to end (or now).
    pub duration: u64,
    /// Summed counters of its subtasks.
    pub metrics: VertexMetrics,
    /// Its subtasks per state (upper-case names).
    #[serde(rename = "status-counts")]
    pub status_counts: BTreeMap<String, u32>,
    /// The TaskManager's id.
    #[serde(rename = "taskmanager-id")]
    pub taskmanager_id: String,
    /// Statistics over its subtasks.
    pub aggregated: AggregatedTaskDetails,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/taskmanagers", tag = "jobs", summary = "A vertex's subtasks per TaskManager", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = VertexTaskManagers), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn vertex_taskmanagers(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<VertexTaskManagers>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    let mut by_host: BTreeMap<String, Vec<SubtaskDetails>> = BTreeMap::new();
    for subtask in &vertex.subtasks {
        by_host.entry(subtask.taskmanager_id.clone()).or_default().push(subtask.clone());
    }
    let now = now_ms();
    let taskmanagers = by_host
        .into_iter()
        .map(|(host, subtasks)| {
            let start = subtasks.iter().map(|s| s.start_time).min().unwrap_or(now);
            let end =
                if subtasks.iter().all(|s| s.end_time >= 0) { subtasks.iter().map(|s| s.end_time).max() } else { None };
            let mut status_counts: BTreeMap<String, u32> =
                ExecutionState::all().iter().map(|s| (s.name().to_string(), 0)).collect();
            for s in &subtasks {
                *status_counts.entry(s.status.name().to_string()).or_default() += 1;
            }
            let states: Vec<ExecutionState> = subtasks.iter().map(|s| s.status).collect();
            VertexTaskManager {
                endpoint: subtasks.first().map(|s| s.endpoint.clone()).unwrap_or_default(),
                status: weir_runtime::status::aggregate_state(&states),
                start_time: start,
                end_time: end.unwrap_or(-1),
                duration: end.map(|e| (e as u64).saturating_sub(start)).unwrap_or_else(|| now.saturating_sub(start)),
                metrics: subtasks.iter().fold(VertexMetrics::of(0, 0, 0), |sum, s| sum.plus(&s.metrics)),
                status_counts,
                aggregated: AggregatedTaskDetails::of(&subtasks),
                taskmanager_id: host,
            }
        })
        .collect();
    Ok(Json(VertexTaskManagers { id: vertex.id, name: vertex.name, now, taskmanagers }))
}

/// `GET /jobs/{jobid}/accumulators`, as Flink's `JobAccumulatorsInfo`: weir jobs have no
/// accumulators, so every list is empty.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobAccumulators {
    /// Always empty.
    #[serde(rename = "job-accumulators")]
    pub job_accumulators: Vec<serde_json::Value>,
    /// Always empty.
    #[serde(rename = "user-task-accumulators")]
    pub user_task_accumulators: Vec<serde_json::Value>,
    /// Always empty.
    #[serde(rename = "serialized-user-task-accumulators")]
    pub serialized_user_task_accumulators: BTreeMap<String, String>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/accumulators", tag = "jobs", summary = "The job's accumulators (weir has none)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = JobAccumulators), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn job_accumulators(
    crate::routes::PathJob(_job): crate::routes::PathJob,
) -> Result<Json<JobAccumulators>, ApiError> {
    Ok(Json(JobAccumulators::default()))
}

/// `GET .../vertices/{vertexid}/accumulators`, as Flink's `JobVertexAccumulatorsInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexAccumulators {
    /// Vertex id.
    pub id: String,
    /// Always empty.
    #[serde(rename = "user-accumulators")]
    pub user_accumulators: Vec<serde_json::Value>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/accumulators", tag = "jobs", summary = "A vertex's accumulators (weir has none)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = VertexAccumulators), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn vertex_accumulators(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<VertexAccumulators>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(VertexAccumulators { id: vertex.id, user_accumulators: Vec::new() }))
}

/// `GET .../subtasks/accumulators`, as Flink's `SubtasksAllAccumulatorsInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtasksAccumulators {
    /// Vertex id.
    pub id: String,
    /// The vertex's parallelism.
    pub parallelism: u32,
    /// Each subtask, with no accumulators.
    pub subtasks: Vec<SubtaskAccumulators>,
}

/// One subtask of [`SubtasksAccumulators`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskAccumulators {
    /// Subtask index.
    pub subtask: u32,
    /// Attempt number.
    pub attempt: u32,
    /// Where it runs.
    pub endpoint: String,
    /// Always empty.
    #[serde(rename = "user-accumulators")]
    pub user_accumulators: Vec<serde_json::Value>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/accumulators", tag = "jobs", summary = "Each subtask's accumulators (weir has none)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = SubtasksAccumulators), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn subtasks_accumulators(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<SubtasksAccumulators>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(SubtasksAccumulators {
        id: vertex.id,
        parallelism: vertex.parallelism,
        subtasks: vertex
            .subtasks
            .iter()
            .map(|s| SubtaskAccumulators {
                subtask: s.subtask,
                attempt: s.attempt,
                endpoint: s.endpoint.clone(),
                user_accumulators: Vec::new(),
            })
            .collect(),
    }))
}

/// `GET .../subtasks/{subtaskindex}/attempts/{attempt}/accumulators`, as Flink's
/// `SubtaskExecutionAttemptAccumulatorsInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskAttemptAccumulators {
    /// Subtask index.
    pub subtask: u32,
    /// Attempt number.
    pub attempt: u32,
    /// The attempt's id: `<vertex id>_<subtask>_<attempt>` (the `task_attempt_id` of
    /// `/metrics`).
    pub id: String,
    /// Always empty.
    #[serde(rename = "user-accumulators")]
    pub user_accumulators: Vec<serde_json::Value>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}/accumulators", tag = "jobs", summary = "One attempt's accumulators (weir has none; it keeps the current attempt)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("subtaskindex" = u32, Path, description = "Subtask index"), ("attempt" = u32, Path, description = "Attempt number")), responses((status = 200, body = SubtaskAttemptAccumulators), (status = 400, description = "Not a job id, index or attempt", body = ErrorResponse), (status = 404, description = "No such job, vertex, subtask or attempt", body = ErrorResponse)))]
pub(crate) async fn subtask_attempt_accumulators(
    State(state): State<AppState>,
    ids: Result<Path<(String, String, String, String)>, PathRejection>,
) -> Result<Json<SubtaskAttemptAccumulators>, ApiError> {
    let Path((jobid, vertexid, index, attempt)) = ids?;
    let subtask = attempt_of(&state, &jobid, &vertexid, &index, &attempt)?;
    Ok(Json(SubtaskAttemptAccumulators {
        id: format!("{vertexid}_{}_{}", subtask.subtask, subtask.attempt),
        subtask: subtask.subtask,
        attempt: subtask.attempt,
        user_accumulators: Vec::new(),
    }))
}

/// One vertex of `GET /jobs/{jobid}/resource-requirements` (Flink's
/// `JobVertexResourceRequirements`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexResourceRequirements {
    /// How many slots the vertex can run with.
    pub parallelism: ParallelismBounds,
}

/// The `parallelism` of [`VertexResourceRequirements`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ParallelismBounds {
    /// Always 1.
    #[serde(rename = "lowerBound")]
    pub lower_bound: u32,
    /// The vertex's parallelism (weir runs a vertex at exactly it).
    #[serde(rename = "upperBound")]
    pub upper_bound: u32,
}

#[utoipa::path(get, path = "/jobs/{jobid}/resource-requirements", tag = "jobs", summary = "Each vertex's parallelism bounds, by vertex id (Flink's `JobResourceRequirementsBody`)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = BTreeMap<String, VertexResourceRequirements>), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn resource_requirements(
    crate::routes::PathJob(job): crate::routes::PathJob,
) -> Result<Json<BTreeMap<String, VertexResourceRequirements>>, ApiError> {
    Ok(Json(
        job.details()
            .vertices
            .into_iter()
            .map(|v| {
                let bounds = ParallelismBounds { lower_bound: 1, upper_bound: v.parallelism };
                (v.id, VertexResourceRequirements { parallelism: bounds })
            })
            .collect(),
    ))
}

/// A subtask's task metrics under Flink's names.
/// The task metrics of subtask `subtask` of vertex `vertex` of job `job`, by Flink's ids.
fn subtask_metrics(job: &str, vertex: &str, subtask: &SubtaskDetails) -> Vec<(String, String)> {
    let io = &subtask.metrics;
    let mut metrics = vec![
        ("numRecordsIn".to_string(), io.read_records.to_string()),
        ("numRecordsOut".to_string(), io.write_records.to_string()),
        ("numBytesIn".to_string(), io.read_bytes.to_string()),
        ("numBytesOut".to_string(), io.write_bytes.to_string()),
        ("accumulatedBackPressuredTimeMs".to_string(), io.backpressured_ms.to_string()),
        ("accumulatedIdleTimeMs".to_string(), io.accumulated_idle_time.to_string()),
        ("accumulatedBusyTimeMs".to_string(), (io.accumulated_busy_time as u64).to_string()),
        ("currentInputWatermark".to_string(), subtask.input_watermark.unwrap_or(i64::MIN).to_string()),
        ("numLateRecordsDropped".to_string(), subtask.late_records.to_string()),
    ];
    // The time split the dashboard colours its graph by (Busy (max), Backpressured (max)).
    let key = (job.to_string(), vertex.to_string(), subtask.subtask, subtask.start_time);
    if let Some(time) = crate::rates::time_per_second(&key, std::time::Instant::now(), io) {
        metrics.push(("busyTimeMsPerSecond".to_string(), time.busy.to_string()));
        metrics.push(("idleTimeMsPerSecond".to_string(), time.idle.to_string()));
        metrics.push(("backPressuredTimeMsPerSecond".to_string(), time.backpressured.to_string()));
    }
    metrics.sort();
    metrics
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/metrics", tag = "metrics", summary = "A vertex's task metrics, `<subtask>.<metric>`: ids, or values with `get`", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("get" = Option<String>, Query, description = "Comma-separated metric ids whose values to answer")), responses((status = 200, body = [MetricValue]), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn vertex_metrics(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    params: Params,
) -> Result<Json<Vec<MetricValue>>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let Query(params) = params?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    let all = vertex
        .subtasks
        .iter()
        .flat_map(|s| {
            subtask_metrics(&jobid, &vertex.id, s).into_iter().map(move |(id, v)| (format!("{}.{id}", s.subtask), v))
        })
        .collect();
    Ok(Json(query(all, &params)))
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/metrics", tag = "metrics", summary = "A subtask's task metrics: ids, or values with `get`", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("subtaskindex" = u32, Path, description = "Subtask index"), ("get" = Option<String>, Query, description = "Comma-separated metric ids whose values to answer")), responses((status = 200, body = [MetricValue]), (status = 400, description = "Not a job id or subtask index", body = ErrorResponse), (status = 404, description = "No such job, vertex or subtask", body = ErrorResponse)))]
pub(crate) async fn one_subtask_metrics(
    State(state): State<AppState>,
    ids: Result<Path<(String, String, String)>, PathRejection>,
    params: Params,
) -> Result<Json<Vec<MetricValue>>, ApiError> {
    let Path((jobid, vertexid, index)) = ids?;
    let Query(params) = params?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(query(subtask_metrics(&jobid, &vertex.id, &subtask_of(&vertex, &index)?), &params)))
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/subtasks/metrics", tag = "metrics", summary = "Task metrics aggregated over a vertex's subtasks: ids, or `agg` of those in `get`", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("get" = Option<String>, Query, description = "Comma-separated metric ids"), ("agg" = Option<String>, Query, description = "Comma-separated aggregations: min, max, avg, sum, skew (default all)", pattern = "^(min|max|avg|sum|skew)(,(min|max|avg|sum|skew))*$"), ("subtasks" = Option<String>, Query, description = "Comma-separated subtask indexes (default all)", pattern = "^[0-9]+(,[0-9]+)*$")), responses((status = 200, body = [AggregatedMetric]), (status = 400, description = "Not a job id, or an unknown aggregation", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn aggregated_subtask_metrics(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    params: Params,
) -> Result<Json<Vec<AggregatedMetric>>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let Query(params) = params?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    let chosen = subtask_selection(&params)?;
    let entities = vertex
        .subtasks
        .iter()
        .filter(|s| chosen.as_ref().is_none_or(|c| c.contains(&s.subtask)))
        .map(|s| subtask_metrics(&jobid, &vertex.id, s))
        .collect();
    Ok(Json(aggregate(entities, &params)?))
}

fn subtask_selection(params: &HashMap<String, String>) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(raw) = params.get("subtasks") else { return Ok(None) };
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| ApiError::bad_request(format!("subtask index '{s}' is not an integer"))))
        .collect::<Result<Vec<u32>, ApiError>>()
        .map(Some)
}
