//! The routes of the REST API and their handlers, reading the dispatcher's jobs.
//!
//! Handlers only take the dispatcher's and job masters' short locks, so they never block the
//! async runtime for long.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{MethodRouter, get, post};
use axum::{Json, Router};
use weir_runtime::{Dispatcher, JobDetails, JobMaster};
use weir_types::JobId;
use weir_types::lifecycle::now_ms;

use crate::checkpoints;
use crate::error::ApiError;
use crate::responses::{
    ClusterOverview, DashboardConfiguration, DashboardFeatures, ExceptionHistory, JobExceptionsInfo, JobIdWithStatus,
    JobIdsWithStatus, JobStatusInfo, JobVertexDetails, LegacyException, MultipleJobsDetails,
};

/// The TaskManagers of a standalone cluster, as `GET /taskmanagers` lists them.
pub type TaskManagerList = Arc<dyn Fn() -> Vec<weir_runtime::cluster::TaskManagerInfo> + Send + Sync>;
/// Submits a job to a standalone cluster: the job id, or an HTTP status and message.
pub type JobSubmitter =
    Arc<dyn Fn(weir_runtime::cluster::JobSubmission) -> Result<String, (u16, String)> + Send + Sync>;

/// What `/overview` and `/config` report about the cluster itself.
#[derive(Clone, Default)]
pub struct ClusterInfo {
    /// Task managers (1 on an embedded cluster).
    pub taskmanagers: u32,
    /// Slots of all task managers.
    pub slots_total: u32,
    /// weir's version, e.g. `0.1.0`.
    pub version: String,
    /// A standalone cluster's TaskManagers (overrides the two counts above).
    pub taskmanager_list: Option<TaskManagerList>,
    /// A standalone cluster accepts jobs (`POST /jobs`).
    pub submitter: Option<JobSubmitter>,
}

/// Failures reported by `/jobs/{jobid}/exceptions` without `maxExceptions`, as Flink.
const DEFAULT_MAX_EXCEPTIONS: usize = 20;

/// How often the Web UI refreshes, ms (Flink's `web.refresh-interval` default).
const REFRESH_INTERVAL_MS: u64 = 3000;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) cluster: Arc<ClusterInfo>,
}

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The REST API over `dispatcher`: every route at its Flink path and under `/v1`.
pub fn router(dispatcher: Arc<Dispatcher>, cluster: ClusterInfo) -> Router {
    let state = AppState { dispatcher, cluster: Arc::new(cluster) };
    let routes: [(&str, MethodRouter<AppState>); 14] = [
        ("/overview", get(overview)),
        ("/config", get(config)),
        ("/jobs", get(jobs).post(submit_job)),
        ("/taskmanagers", get(taskmanagers)),
        ("/jobs/overview", get(jobs_overview)),
        ("/jobs/{jobid}", get(job_details).patch(job_patch)),
        ("/jobs/{jobid}/status", get(job_status)),
        ("/jobs/{jobid}/vertices/{vertexid}", get(job_vertex)),
        ("/jobs/{jobid}/exceptions", get(job_exceptions)),
        ("/jobs/{jobid}/checkpoints", get(checkpoints::checkpoints)),
        ("/jobs/{jobid}/checkpoints/config", get(checkpoints::checkpoint_config)),
        ("/jobs/{jobid}/savepoints", post(checkpoints::trigger_savepoint)),
        ("/jobs/{jobid}/savepoints/{requestid}", get(checkpoints::savepoint_status)),
        ("/jobs/{jobid}/stop", post(checkpoints::stop_with_savepoint)),
    ];
    // Prometheus scrapes `/metrics` (no `/v1` twin: it is not part of Flink's REST API).
    let mut app = Router::new().route("/metrics", get(crate::metrics::metrics));
    for (path, method_router) in routes {
        app = app.route(&format!("/v1{path}"), method_router.clone()).route(path, method_router);
    }
    app.fallback(not_found).method_not_allowed_fallback(method_not_allowed).with_state(state)
}

fn flink_version(cluster: &ClusterInfo) -> String {
    format!("weir {}", cluster.version)
}

/// The job named by a path segment: 400 if it is not a job id, 404 if there is no such job.
pub(crate) fn find_job(dispatcher: &Dispatcher, raw: &str) -> Result<Arc<JobMaster>, ApiError> {
    let job_id: JobId = raw.parse().map_err(|e: weir_types::ids::BadJobId| ApiError::bad_request(e.to_string()))?;
    dispatcher.job(job_id).ok_or_else(|| ApiError::not_found(format!("Job {job_id} not found")))
}

async fn overview(State(state): State<AppState>) -> Json<ClusterOverview> {
    let counts = state.dispatcher.job_counts();
    let busy = state.dispatcher.busy_subtasks();
    if let Some(list) = &state.cluster.taskmanager_list {
        let taskmanagers = list();
        return Json(ClusterOverview {
            taskmanagers: taskmanagers.len() as u32,
            slots_total: taskmanagers.iter().map(|t| t.slots_number).sum(),
            slots_available: taskmanagers.iter().map(|t| t.free_slots).sum(),
            jobs_running: counts.running,
            jobs_finished: counts.finished,
            jobs_cancelled: counts.cancelled,
            jobs_failed: counts.failed,
            flink_version: flink_version(&state.cluster),
            weir_version: state.cluster.version.clone(),
        });
    }
    Json(ClusterOverview {
        taskmanagers: state.cluster.taskmanagers,
        slots_total: state.cluster.slots_total,
        slots_available: state.cluster.slots_total.saturating_sub(busy),
        jobs_running: counts.running,
        jobs_finished: counts.finished,
        jobs_cancelled: counts.cancelled,
        jobs_failed: counts.failed,
        flink_version: flink_version(&state.cluster),
        weir_version: state.cluster.version.clone(),
    })
}

async fn config(State(state): State<AppState>) -> Json<DashboardConfiguration> {
    Json(DashboardConfiguration {
        refresh_interval: REFRESH_INTERVAL_MS,
        timezone_name: "UTC".to_string(),
        timezone_offset: 0,
        flink_version: flink_version(&state.cluster),
        features: DashboardFeatures { web_submit: false, web_cancel: true },
    })
}

async fn jobs(State(state): State<AppState>) -> Json<JobIdsWithStatus> {
    let jobs = state
        .dispatcher
        .jobs()
        .iter()
        .rev()
        .map(|job| JobIdWithStatus { id: job.job_id().to_string(), status: job.status() })
        .collect();
    Json(JobIdsWithStatus { jobs })
}

async fn jobs_overview(State(state): State<AppState>) -> Json<MultipleJobsDetails> {
    let jobs = state.dispatcher.jobs().iter().rev().map(|job| job.overview()).collect();
    Json(MultipleJobsDetails { jobs })
}

async fn job_details(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
) -> Result<Json<JobDetails>, ApiError> {
    let Path(jobid) = jobid?;
    let job = find_job(&state.dispatcher, &jobid)?;
    Ok(Json(job.details()))
}

async fn job_status(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
) -> Result<Json<JobStatusInfo>, ApiError> {
    let Path(jobid) = jobid?;
    let job = find_job(&state.dispatcher, &jobid)?;
    Ok(Json(JobStatusInfo { status: job.status() }))
}

async fn job_vertex(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<JobVertexDetails>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let details = job.details();
    let vertex = details
        .vertices
        .into_iter()
        .find(|v| v.id == vertexid)
        .ok_or_else(|| ApiError::not_found(format!("Vertex {vertexid} not found in job {}", job.job_id())))?;
    Ok(Json(JobVertexDetails {
        id: vertex.id,
        name: vertex.name,
        parallelism: vertex.parallelism,
        max_parallelism: vertex.max_parallelism,
        now: now_ms(),
        subtasks: vertex.subtasks,
    }))
}

async fn job_exceptions(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    params: Params,
) -> Result<Json<JobExceptionsInfo>, ApiError> {
    let Path(jobid) = jobid?;
    let Query(params) = params?;
    let max = match params.get("maxExceptions") {
        None => DEFAULT_MAX_EXCEPTIONS,
        Some(raw) => raw
            .trim()
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("maxExceptions must be a non-negative integer, got '{raw}'")))?,
    };
    let job = find_job(&state.dispatcher, &jobid)?;
    let mut entries = job.exceptions();
    let newest = entries.first().map(|e| (e.stacktrace.clone(), e.timestamp));
    let truncated = entries.len() > max;
    entries.truncate(max);
    let all_exceptions = entries
        .iter()
        .map(|e| LegacyException {
            exception: e.stacktrace.clone(),
            task: e.task_name.clone(),
            location: e.location.clone(),
            timestamp: e.timestamp,
        })
        .collect();
    let (root_exception, timestamp) = newest.unzip();
    Ok(Json(JobExceptionsInfo {
        exception_history: ExceptionHistory { entries, truncated },
        root_exception,
        timestamp,
        all_exceptions,
        truncated,
    }))
}

/// `PATCH /jobs/{jobid}?mode=cancel`.
async fn job_patch(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    params: Params,
) -> Result<(StatusCode, Json<serde_json::Map<String, serde_json::Value>>), ApiError> {
    let Path(jobid) = jobid?;
    let Query(params) = params?;
    match params.get("mode").map(String::as_str) {
        Some("cancel") => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported mode '{other}': the accepted value is mode=cancel \
                 (use POST /jobs/{jobid}/stop to stop with a savepoint)"
            )));
        }
        None => {
            return Err(ApiError::bad_request("missing query parameter 'mode': the accepted value is mode=cancel"));
        }
    }
    let job = find_job(&state.dispatcher, &jobid)?;
    match job.cancel() {
        Ok(()) => {
            tracing::info!(job_id = %job.job_id(), "cancel requested over REST");
            Ok((StatusCode::ACCEPTED, Json(serde_json::Map::new())))
        }
        Err(status) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Job {} is already {status}; only running jobs can be cancelled", job.job_id()),
        )),
    }
}

/// `GET /taskmanagers`.
async fn taskmanagers(State(state): State<AppState>) -> Json<serde_json::Value> {
    let list = match &state.cluster.taskmanager_list {
        Some(list) => list(),
        None => vec![weir_runtime::cluster::TaskManagerInfo {
            id: "embedded".into(),
            path: "localhost".into(),
            slots_number: state.cluster.slots_total,
            free_slots: state.cluster.slots_total.saturating_sub(state.dispatcher.busy_subtasks()),
            time_since_last_heartbeat: 0,
        }],
    };
    Json(serde_json::json!({ "taskmanagers": list }))
}

/// `POST /jobs`: runs a catalog job on a standalone cluster (weir's replacement for Flink's
/// jar upload: every process has the job catalog built in).
async fn submit_job(
    State(state): State<AppState>,
    body: Result<Json<weir_runtime::cluster::JobSubmission>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let Json(submission) = body.map_err(|e| ApiError::bad_request(format!("bad job submission: {e}")))?;
    let Some(submitter) = state.cluster.submitter.clone() else {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "this is an embedded cluster running one job; submit jobs to a standalone cluster (weir cluster start)",
        ));
    };
    // Building and validating the graph is short CPU work; keep it off the async workers.
    let result = tokio::task::spawn_blocking(move || submitter(submission))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match result {
        Ok(job_id) => Ok((StatusCode::ACCEPTED, Json(serde_json::json!({ "jobid": job_id })))),
        Err((status, message)) => {
            Err(ApiError::new(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST), message))
        }
    }
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("Not found: {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("Method {method} is not allowed for {}", uri.path()))
}
