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
use crate::jobmanager::ThreadDumpInfo;
use crate::metric_queries::{AggregatedMetric, MetricValue};
use crate::responses::{
    AggregatedTaskDetails, ClusterOverview, ConfigEntry, DashboardConfiguration, DashboardFeatures, ErrorResponse,
    ExceptionHistory, JobExceptionsInfo, JobIdWithStatus, JobIdsWithStatus, JobPlanInfo, JobStatusInfo,
    JobVertexDetails, LegacyException, MultipleJobsDetails, ResourceProfile, SlotInfo, TaskManagerDetails,
    TaskManagerEntry, TaskManagerMetrics, TaskManagerTask, TaskManagersInfo,
};
use weir_runtime::cluster::TaskManagerInfo;
use weir_types::Lifecycle;

/// The TaskManagers of a standalone cluster, as `GET /taskmanagers` lists them.
pub type TaskManagerList = Arc<dyn Fn() -> Vec<weir_runtime::cluster::TaskManagerInfo> + Send + Sync>;
/// Submits a job to a standalone cluster: the job, or an HTTP status and message.
pub type JobSubmitter =
    Arc<dyn Fn(weir_runtime::cluster::JobSubmission) -> Result<SubmittedJob, (u16, String)> + Send + Sync>;

/// A job a standalone cluster accepted.
#[derive(Clone, Debug, Default)]
pub struct SubmittedJob {
    /// Its id.
    pub job_id: String,
    /// What the submitter should tell the user (the snapshot restored, state left behind).
    pub notes: Vec<String>,
}

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
    /// The explicitly set configuration options, secrets already masked (`GET
    /// /jobmanager/config`).
    pub configuration: Vec<(String, String)>,
    /// With high availability: where the leader is; requests go there unless this process
    /// leads.
    pub leader: Option<LeaderLookup>,
    /// With high availability: this leader's leadership, for `/overview` and `/metrics`.
    pub ha_overview: Option<Arc<dyn Fn() -> Option<crate::responses::HaOverview> + Send + Sync>>,
    /// The deployment controller's deployments (`GET /deployments`).
    pub deployments: Option<crate::deployments::DeploymentSource>,
}

/// Where the cluster's leader JobManager is right now.
pub type LeaderLookup = Arc<dyn Fn() -> crate::leader::LeaderRoute + Send + Sync>;

/// Failures reported by `/jobs/{jobid}/exceptions` without `maxExceptions`, as Flink.
const DEFAULT_MAX_EXCEPTIONS: usize = 20;

/// How often the Web UI refreshes, ms (Flink's `web.refresh-interval` default).
const REFRESH_INTERVAL_MS: u64 = 3000;

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) dispatcher: Arc<Dispatcher>,
    pub(crate) cluster: Arc<ClusterInfo>,
    pub(crate) backpressure: Arc<crate::backpressure::BackpressureReadings>,
    pub(crate) disposals: Arc<crate::disposal::Disposals>,
}

pub(crate) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// The REST API over `dispatcher`: every route at its Flink path and under `/v1`.
pub fn router(dispatcher: Arc<Dispatcher>, cluster: ClusterInfo) -> Router {
    let state =
        AppState { dispatcher, cluster: Arc::new(cluster), backpressure: Arc::default(), disposals: Arc::default() };
    let routes = [
        cluster_routes(),
        jobmanager_routes(),
        taskmanager_routes(),
        job_routes(state.cluster.submitter.is_some()),
        vertex_routes(),
        checkpoint_routes(),
        application_routes(),
    ];
    // Prometheus scrapes `/metrics` and the Web UI is at `/` (no `/v1` twins: neither is
    // part of the versioned REST API).
    let mut app = Router::new().route("/metrics", get(crate::metrics::metrics)).merge(crate::ui::routes());
    for (path, method_router) in routes.into_iter().flatten() {
        app = app.route(&format!("/v1{path}"), method_router.clone()).route(path, method_router);
    }
    let app = app.fallback(not_found).method_not_allowed_fallback(method_not_allowed);
    if state.cluster.leader.is_some() {
        let layer = axum::middleware::from_fn_with_state(state.clone(), crate::leader::route_to_leader);
        return app.layer(layer).with_state(state);
    }
    app.with_state(state)
}

/// Paths and their handlers.
type Routes = Vec<(&'static str, MethodRouter<AppState>)>;

/// The cluster as a whole: overview, configuration, the API's own description, and the
/// deployment controller's deployments.
fn cluster_routes() -> Routes {
    vec![
        ("/overview", get(overview)),
        ("/config", get(config)),
        ("/openapi.json", get(crate::openapi::openapi_json)),
        ("/deployments", get(crate::deployments::deployments)),
        ("/deployments/{name}", get(crate::deployments::deployment)),
    ]
}

/// `/jobmanager/*`.
fn jobmanager_routes() -> Routes {
    use crate::jobmanager;
    vec![
        ("/jobmanager/config", get(jobmanager_config)),
        ("/jobmanager/environment", get(jobmanager::jobmanager_environment)),
        ("/jobmanager/thread-dump", get(jobmanager::jobmanager_thread_dump)),
        ("/jobmanager/config/effective", get(jobmanager_effective_config)),
        ("/jobmanager/log", get(crate::logs::jobmanager_log)),
        ("/jobmanager/stdout", get(crate::logs::jobmanager_stdout)),
        ("/jobmanager/logs", get(crate::logs::jobmanager_logs)),
        ("/jobmanager/logs/{filename}", get(crate::logs::jobmanager_log_file)),
        ("/jobmanager/metrics", get(jobmanager::jobmanager_metrics)),
    ]
}

/// `/taskmanagers/*`.
fn taskmanager_routes() -> Routes {
    vec![
        ("/taskmanagers", get(taskmanagers)),
        ("/taskmanagers/{taskmanagerid}", get(taskmanager_details)),
        ("/taskmanagers/metrics", get(taskmanagers_metrics)),
        ("/taskmanagers/{taskmanagerid}/metrics", get(taskmanager_metrics)),
        ("/taskmanagers/{taskmanagerid}/thread-dump", get(taskmanager_thread_dump)),
        ("/taskmanagers/{taskmanagerid}/log", get(crate::logs::taskmanager_log)),
        ("/taskmanagers/{taskmanagerid}/logs", get(crate::logs::taskmanager_logs)),
    ]
}

/// `/jobs` and a job's own paths (its vertices' and checkpoints' are in [`vertex_routes`]
/// and [`checkpoint_routes`]); `submits`: the cluster accepts jobs.
fn job_routes(submits: bool) -> Routes {
    use crate::{jobmanager, subtasks};
    vec![
        // An embedded cluster runs its one job and takes no others: no POST, so a POST gets
        // 405 with `Allow: GET,HEAD`, as every method a path does not have.
        ("/jobs", if submits { get(jobs).post(submit_job) } else { get(jobs) }),
        // Flink's jar upload and run: read, then refused with what to do instead.
        ("/jars/upload", post(crate::uploads::upload_jar)),
        ("/jars/{jarid}/run", post(crate::uploads::run_jar)),
        ("/jobs/overview", get(jobs_overview)),
        ("/jobs/metrics", get(jobmanager::aggregated_job_metrics)),
        ("/jobs/{jobid}", get(job_details).patch(job_patch)),
        ("/jobs/{jobid}/status", get(job_status)),
        ("/jobs/{jobid}/plan", get(job_plan)),
        ("/jobs/{jobid}/config", get(job_config)),
        ("/jobs/{jobid}/exceptions", get(job_exceptions)),
        ("/jobs/{jobid}/metrics", get(jobmanager::job_metrics)),
        ("/jobs/{jobid}/accumulators", get(subtasks::job_accumulators)),
        ("/jobs/{jobid}/resource-requirements", get(subtasks::resource_requirements)),
        ("/jobs/{jobid}/jobmanager/config", get(jobmanager::job_jobmanager_config)),
        ("/jobs/{jobid}/jobmanager/environment", get(jobmanager::job_jobmanager_environment)),
        ("/jobs/{jobid}/clientHeartbeat", axum::routing::patch(client_heartbeat)),
    ]
}

/// `/jobs/{jobid}/vertices/*`: a vertex, its subtasks and their attempts.
fn vertex_routes() -> Routes {
    use crate::subtasks;
    vec![
        ("/jobs/{jobid}/vertices/{vertexid}", get(job_vertex)),
        ("/jobs/{jobid}/vertices/{vertexid}/backpressure", get(crate::backpressure::backpressure)),
        ("/jobs/{jobid}/vertices/{vertexid}/watermarks", get(crate::watermarks::watermarks)),
        ("/jobs/{jobid}/vertices/{vertexid}/accumulators", get(subtasks::vertex_accumulators)),
        ("/jobs/{jobid}/vertices/{vertexid}/metrics", get(subtasks::vertex_metrics)),
        ("/jobs/{jobid}/vertices/{vertexid}/taskmanagers", get(subtasks::vertex_taskmanagers)),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasktimes", get(subtasks::subtask_times)),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/accumulators", get(subtasks::subtasks_accumulators)),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/metrics", get(subtasks::aggregated_subtask_metrics)),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}", get(subtasks::subtask)),
        ("/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/metrics", get(subtasks::one_subtask_metrics)),
        (
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}",
            get(subtasks::subtask_attempt),
        ),
        (
            "/jobs/{jobid}/vertices/{vertexid}/subtasks/{subtaskindex}/attempts/{attempt}/accumulators",
            get(subtasks::subtask_attempt_accumulators),
        ),
    ]
}

/// A job's checkpoints, savepoints and stop-with-savepoint, and savepoint disposal.
fn checkpoint_routes() -> Routes {
    use crate::disposal;
    vec![
        ("/jobs/{jobid}/checkpoints", get(checkpoints::checkpoints).post(checkpoints::trigger_checkpoint)),
        ("/jobs/{jobid}/checkpoints/{triggerid}", get(checkpoints::checkpoint_request_status)),
        ("/jobs/{jobid}/checkpoints/config", get(checkpoints::checkpoint_config)),
        ("/jobs/{jobid}/checkpoints/details/{checkpointid}", get(checkpoints::checkpoint_details)),
        ("/jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}", get(checkpoints::checkpoint_subtasks)),
        ("/jobs/{jobid}/savepoints", post(checkpoints::trigger_savepoint)),
        ("/jobs/{jobid}/savepoints/{triggerid}", get(checkpoints::savepoint_status)),
        ("/jobs/{jobid}/stop", post(checkpoints::stop_with_savepoint)),
        ("/savepoint-disposal", post(disposal::trigger_disposal)),
        ("/savepoint-disposal/{triggerid}", get(disposal::disposal_status)),
    ]
}

/// Flink 2's applications.
fn application_routes() -> Routes {
    use crate::applications;
    vec![
        ("/applications/overview", get(applications::applications_overview)),
        ("/applications/{applicationid}", get(applications::application)),
        ("/applications/{applicationid}/exceptions", get(applications::application_exceptions)),
        ("/applications/{applicationid}/jobmanager/config", get(applications::application_jobmanager_config)),
        ("/applications/{applicationid}/cancel", post(applications::cancel_application)),
    ]
}

fn flink_version(cluster: &ClusterInfo) -> String {
    format!("weir {}", cluster.version)
}

/// What Flink reports as its commit: weir's release (it carries no commit id).
fn flink_commit(cluster: &ClusterInfo) -> String {
    format!("weir-{}", cluster.version)
}

/// The job named by a path segment: 400 if it is not a job id, 404 if there is no such job.
pub(crate) fn find_job(dispatcher: &Dispatcher, raw: &str) -> Result<Arc<JobMaster>, ApiError> {
    let job_id: JobId = raw.parse().map_err(|e: weir_types::ids::BadJobId| ApiError::bad_request(e.to_string()))?;
    dispatcher.job(job_id).ok_or_else(|| ApiError::not_found(format!("Job {job_id} not found")))
}

/// Vertex `vertexid` of job `jobid`: as [`find_job`] answers, then 404 if the job has no
/// such vertex.
pub(crate) fn find_vertex(
    dispatcher: &Dispatcher,
    jobid: &str,
    vertexid: &str,
) -> Result<weir_runtime::status::VertexDetails, ApiError> {
    let job = find_job(dispatcher, jobid)?;
    job.details()
        .vertices
        .into_iter()
        .find(|v| v.id == vertexid)
        .ok_or_else(|| ApiError::not_found(format!("Vertex {vertexid} not found in job {}", job.job_id())))
}

/// The job of a `/jobs/{jobid}` route whose only input is that path segment, as
/// [`find_job`] answers for it.
pub(crate) struct PathJob(pub(crate) Arc<JobMaster>);

impl axum::extract::FromRequestParts<AppState> for PathJob {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &AppState) -> Result<PathJob, ApiError> {
        let Path(jobid) = Path::<String>::from_request_parts(parts, state).await?;
        Ok(PathJob(find_job(&state.dispatcher, &jobid)?))
    }
}

#[utoipa::path(get, path = "/overview", tag = "cluster", summary = "The cluster at a glance", responses((status = 200, body = ClusterOverview)))]
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
            taskmanagers_blocked: 0,
            slots_free_and_blocked: 0,
            flink_version: flink_version(&state.cluster),
            flink_commit: flink_commit(&state.cluster),
            weir_version: state.cluster.version.clone(),
            high_availability: state.cluster.ha_overview.as_ref().and_then(|ha| ha()),
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
        taskmanagers_blocked: 0,
        slots_free_and_blocked: 0,
        flink_version: flink_version(&state.cluster),
        flink_commit: flink_commit(&state.cluster),
        weir_version: state.cluster.version.clone(),
        high_availability: None,
    })
}

#[utoipa::path(get, path = "/config", tag = "cluster", summary = "Web UI settings", responses((status = 200, body = DashboardConfiguration)))]
async fn config(State(state): State<AppState>) -> Json<DashboardConfiguration> {
    Json(DashboardConfiguration {
        refresh_interval: REFRESH_INTERVAL_MS,
        timezone_name: "UTC".to_string(),
        timezone_offset: 0,
        flink_version: flink_version(&state.cluster),
        flink_revision: flink_commit(&state.cluster),
        features: DashboardFeatures {
            web_submit: false,
            web_cancel: true,
            web_rescale: false,
            web_history: false,
            deployments: state.cluster.deployments.is_some(),
        },
    })
}

#[utoipa::path(get, path = "/jobs", tag = "jobs", summary = "Every job's id and state", responses((status = 200, body = JobIdsWithStatus)))]
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

#[utoipa::path(get, path = "/jobs/overview", tag = "jobs", summary = "Every job with its times and task counts", responses((status = 200, body = MultipleJobsDetails)))]
async fn jobs_overview(State(state): State<AppState>) -> Json<MultipleJobsDetails> {
    let jobs = state.dispatcher.jobs().iter().rev().map(|job| job.overview()).collect();
    Json(MultipleJobsDetails { jobs })
}

#[utoipa::path(get, path = "/jobs/{jobid}", tag = "jobs", summary = "A job: vertices, subtasks, counters, plan", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = JobDetails), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
async fn job_details(PathJob(job): PathJob) -> Result<Json<JobDetails>, ApiError> {
    Ok(Json(job.details()))
}

#[utoipa::path(get, path = "/jobs/{jobid}/status", tag = "jobs", summary = "A job's state", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = JobStatusInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
async fn job_status(PathJob(job): PathJob) -> Result<Json<JobStatusInfo>, ApiError> {
    Ok(Json(JobStatusInfo { status: job.status() }))
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}", tag = "jobs", summary = "One vertex and its subtasks", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id, from the job's `vertices` or `plan`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = JobVertexDetails), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
async fn job_vertex(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<JobVertexDetails>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(JobVertexDetails {
        id: vertex.id,
        name: vertex.name,
        parallelism: vertex.parallelism,
        max_parallelism: vertex.max_parallelism,
        now: now_ms(),
        aggregated: AggregatedTaskDetails::of(&vertex.subtasks),
        subtasks: vertex.subtasks,
    }))
}

#[utoipa::path(get, path = "/jobs/{jobid}/exceptions", tag = "jobs", summary = "Failures, newest first, one per failure", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("maxExceptions" = Option<usize>, Query, description = "At most this many entries (default 20)")), responses((status = 200, body = JobExceptionsInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
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
#[utoipa::path(patch, path = "/jobs/{jobid}", tag = "jobs", summary = "Cancel a job (`mode=cancel`)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("mode" = String, Query, description = "`cancel`", pattern = "^cancel$")), responses((status = 202, description = "Cancel requested"), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse), (status = 409, description = "The job already ended", body = ErrorResponse)))]
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

/// The id `GET /taskmanagers` gives the embedded cluster's one TaskManager.
pub(crate) const EMBEDDED_TASKMANAGER: &str = "embedded";

fn taskmanager_list(state: &AppState) -> Vec<TaskManagerInfo> {
    match &state.cluster.taskmanager_list {
        Some(list) => list(),
        None => vec![TaskManagerInfo {
            id: EMBEDDED_TASKMANAGER.into(),
            path: "localhost".into(),
            slots_number: state.cluster.slots_total,
            free_slots: state.cluster.slots_total.saturating_sub(state.dispatcher.busy_subtasks()),
            // It is this process: alive now.
            last_heartbeat_ms: weir_types::lifecycle::now_ms(),
            hardware: weir_runtime::cluster::protocol::Hardware::of_this_machine(),
        }],
    }
}

/// `GET /taskmanagers`.
#[utoipa::path(get, path = "/taskmanagers", tag = "cluster", summary = "Registered TaskManagers", responses((status = 200, body = TaskManagersInfo)))]
async fn taskmanagers(State(state): State<AppState>) -> Json<TaskManagersInfo> {
    Json(TaskManagersInfo { taskmanagers: taskmanager_list(&state).into_iter().map(TaskManagerEntry::of).collect() })
}

/// `GET /taskmanagers/{taskmanagerid}`: one TaskManager and the subtasks it runs now.
#[utoipa::path(get, path = "/taskmanagers/{taskmanagerid}", tag = "cluster", summary = "One TaskManager and the subtasks it runs", params(("taskmanagerid" = String, Path, description = "TaskManager id (`embedded` on an embedded cluster)")), responses((status = 200, body = TaskManagerDetails), (status = 404, description = "No such TaskManager", body = ErrorResponse)))]
async fn taskmanager_details(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<TaskManagerDetails>, ApiError> {
    let Path(id) = id?;
    let info = find_taskmanager(&state, &id)?;
    let embedded = state.cluster.taskmanager_list.is_none();
    let mut tasks = Vec::new();
    let mut slots: Vec<SlotInfo> = Vec::new();
    for job in state.dispatcher.jobs().iter().rev() {
        let details = job.details();
        for vertex in &details.vertices {
            for subtask in &vertex.subtasks {
                if (embedded || subtask.host == id) && !subtask.status.is_terminal() {
                    tasks.push(TaskManagerTask {
                        jid: details.jid.clone(),
                        job_name: details.name.clone(),
                        vertex_id: vertex.id.clone(),
                        vertex_name: vertex.name.clone(),
                        subtask: subtask.subtask,
                        status: subtask.status,
                        metrics: subtask.metrics.clone(),
                    });
                }
            }
        }
        // A job takes one slot per subtask index, shared by all its vertices (Flink's slot
        // sharing): its slots here are its largest number of subtasks of one vertex.
        let here = details
            .vertices
            .iter()
            .map(|v| v.subtasks.iter().filter(|s| (embedded || s.host == id) && !s.status.is_terminal()).count())
            .max()
            .unwrap_or(0) as u32;
        if here > 0 {
            let assigned = tasks.iter().filter(|t| t.jid == details.jid).count() as u32;
            slots.push(SlotInfo {
                job_id: details.jid.clone(),
                resource: ResourceProfile { cpu_cores: f64::from(here), ..ResourceProfile::default() },
                assigned_tasks: assigned,
            });
        }
    }
    Ok(Json(TaskManagerDetails {
        entry: TaskManagerEntry::of(info),
        allocated_slots: slots,
        metrics: TaskManagerMetrics::default(),
        tasks,
    }))
}

/// The TaskManager `id` names: 404 if none is registered under it.
fn find_taskmanager(state: &AppState, id: &str) -> Result<TaskManagerInfo, ApiError> {
    taskmanager_list(state).into_iter().find(|tm| tm.id == id).ok_or_else(|| {
        ApiError::not_found(format!("TaskManager {id} not found; GET /taskmanagers lists the registered ones"))
    })
}

/// `GET /taskmanagers/metrics`: Flink's TaskManager metrics aggregated over TaskManagers.
/// Flink's are its JVM's, network's and managed memory's, none of which a weir TaskManager
/// has, so there are no ids and no values: `[]`, in Flink's shape.
#[utoipa::path(get, path = "/taskmanagers/metrics", tag = "metrics", summary = "TaskManager metrics aggregated over TaskManagers (weir's TaskManagers have none of Flink's JVM metrics: `[]`)", params(("get" = Option<String>, Query, description = "Comma-separated metric ids"), ("agg" = Option<String>, Query, description = "Comma-separated aggregations: min, max, avg, sum, skew (default all)", pattern = "^(min|max|avg|sum|skew)(,(min|max|avg|sum|skew))*$"), ("taskmanagers" = Option<String>, Query, description = "Comma-separated TaskManager ids (default all)")), responses((status = 200, body = [AggregatedMetric]), (status = 400, description = "An unknown aggregation", body = ErrorResponse)))]
async fn taskmanagers_metrics(params: Params) -> Result<Json<Vec<AggregatedMetric>>, ApiError> {
    let Query(params) = params?;
    Ok(Json(crate::metric_queries::aggregate(Vec::new(), &params)?))
}

/// `GET /taskmanagers/{taskmanagerid}/metrics`: none (see [`taskmanagers_metrics`]).
#[utoipa::path(get, path = "/taskmanagers/{taskmanagerid}/metrics", tag = "metrics", summary = "One TaskManager's metrics (none of Flink's JVM metrics exist in weir: `[]`)", params(("taskmanagerid" = String, Path, description = "TaskManager id (`embedded` on an embedded cluster)"), ("get" = Option<String>, Query, description = "Comma-separated metric ids whose values to answer")), responses((status = 200, body = [MetricValue]), (status = 404, description = "No such TaskManager", body = ErrorResponse)))]
async fn taskmanager_metrics(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    params: Params,
) -> Result<Json<Vec<MetricValue>>, ApiError> {
    let Path(id) = id?;
    let Query(params) = params?;
    find_taskmanager(&state, &id)?;
    Ok(Json(crate::metric_queries::query(Vec::new(), &params)))
}

/// `GET /taskmanagers/{taskmanagerid}/thread-dump`: the embedded cluster's TaskManager is
/// this process, so its threads; a standalone cluster's TaskManagers are other processes,
/// which do not report their threads to the JobManager: an empty list.
#[utoipa::path(get, path = "/taskmanagers/{taskmanagerid}/thread-dump", tag = "cluster", summary = "A TaskManager's threads (the embedded one's: this process's; a standalone cluster's: none reported)", params(("taskmanagerid" = String, Path, description = "TaskManager id (`embedded` on an embedded cluster)")), responses((status = 200, body = ThreadDumpInfo), (status = 404, description = "No such TaskManager", body = ErrorResponse)))]
async fn taskmanager_thread_dump(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ThreadDumpInfo>, ApiError> {
    let Path(id) = id?;
    find_taskmanager(&state, &id)?;
    let thread_infos = if state.cluster.taskmanager_list.is_none() { crate::jobmanager::threads() } else { Vec::new() };
    Ok(Json(ThreadDumpInfo { thread_infos }))
}

/// `GET /jobmanager/config`: `[{"key","value"}]`, as Flink.
#[utoipa::path(get, path = "/jobmanager/config", tag = "cluster", summary = "The configuration options set on this JobManager (secrets masked)", responses((status = 200, body = Vec<ConfigEntry>)))]
async fn jobmanager_config(State(state): State<AppState>) -> Json<Vec<ConfigEntry>> {
    Json(config_entries(&state))
}

/// `GET /jobmanager/config/effective`: every option weir knows with its value here, set or
/// defaulted, then the other keys set (weir's own or Flink's it does not take).
#[utoipa::path(get, path = "/jobmanager/config/effective", tag = "cluster", summary = "The effective configuration: every option with its value, set or default (weir's; Flink's /jobmanager/config lists the set ones)", responses((status = 200, body = Vec<crate::responses::EffectiveConfigEntry>)))]
pub(crate) async fn jobmanager_effective_config(
    State(state): State<AppState>,
) -> Json<Vec<crate::responses::EffectiveConfigEntry>> {
    use crate::responses::EffectiveConfigEntry;
    let set: std::collections::BTreeMap<&str, &str> =
        state.cluster.configuration.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut entries: Vec<EffectiveConfigEntry> = weir_config::options::ALL
        .iter()
        .map(|option| {
            let value = set.get(option.key).or_else(|| option.fallback_keys.iter().find_map(|k| set.get(k)));
            EffectiveConfigEntry {
                key: option.key.to_string(),
                value: value.map_or(option.default_description, |v| v).to_string(),
                default: option.default_description.to_string(),
                set: value.is_some(),
                description: option.description.to_string(),
            }
        })
        .collect();
    let known = |key: &str| weir_config::options::ALL.iter().any(|o| o.key == key || o.fallback_keys.contains(&key));
    for (key, value) in set.iter().filter(|(key, _)| !known(key)) {
        entries.push(EffectiveConfigEntry {
            key: key.to_string(),
            value: value.to_string(),
            default: String::new(),
            set: true,
            description: String::new(),
        });
    }
    Json(entries)
}

/// The configuration options set, as `GET /jobmanager/config` answers them.
pub(crate) fn config_entries(state: &AppState) -> Vec<ConfigEntry> {
    state
        .cluster
        .configuration
        .iter()
        .map(|(key, value)| ConfigEntry { key: key.clone(), value: value.clone() })
        .collect()
}

/// `PATCH /jobs/{jobid}/clientHeartbeat`: Flink's attached clients report they are alive;
/// weir jobs do not end when their client goes away, so this only checks the job exists.
#[utoipa::path(patch, path = "/jobs/{jobid}/clientHeartbeat", tag = "jobs", summary = "An attached client's heartbeat (accepted, no effect)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 202, description = "Accepted"), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
async fn client_heartbeat(PathJob(_job): PathJob) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({}))))
}

/// `GET /jobs/{jobid}/config`.
#[utoipa::path(get, path = "/jobs/{jobid}/config", tag = "jobs", summary = "The job's execution configuration", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = weir_runtime::status::JobConfigInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
async fn job_config(PathJob(job): PathJob) -> Result<Json<weir_runtime::status::JobConfigInfo>, ApiError> {
    Ok(Json(job.config()))
}

/// `GET /jobs/{jobid}/plan`.
#[utoipa::path(get, path = "/jobs/{jobid}/plan", tag = "jobs", summary = "The operator graph", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = JobPlanInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
async fn job_plan(PathJob(job): PathJob) -> Result<Json<JobPlanInfo>, ApiError> {
    Ok(Json(JobPlanInfo { plan: job.details().plan }))
}

/// `POST /jobs`: runs a catalog job on a standalone cluster (weir's replacement for Flink's
/// jar upload: every process has the job catalog built in).
#[utoipa::path(post, path = "/jobs", tag = "jobs", summary = "Run a catalog job on a standalone cluster", request_body = weir_runtime::cluster::JobSubmission, responses((status = 202, description = "Submitted: `{\"jobid\": \"...\", \"notes\": [\"...\"]}`; `notes` are lines for the user (the snapshot restored, state not restored with -n)"), (status = 400, description = "Bad submission (unknown job, bad arguments, refused restore, a bad `$internal.pipeline.job-id`)", body = ErrorResponse), (status = 405, description = "An embedded cluster does not accept jobs", body = ErrorResponse), (status = 409, description = "A job of the id `$internal.pipeline.job-id` names was submitted already", body = ErrorResponse)))]
async fn submit_job(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Result<axum::response::Response, ApiError> {
    use axum::extract::FromRequest as _;
    // `flink run`: a JobGraph and jars, read to the end before the refusal (see `uploads`).
    if crate::uploads::is_multipart(request.headers()) {
        return Err(crate::uploads::refuse_program_upload(request.into_body()).await);
    }
    let Some(submitter) = state.cluster.submitter.clone() else {
        // Not routed without a submitter (see `router`); kept as a guard.
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "this cluster accepts no job submissions"));
    };
    let Json(submission) = Json::<weir_runtime::cluster::JobSubmission>::from_request(request, &())
        .await
        .map_err(|e| ApiError::bad_request(format!("bad job submission: {e}")))?;
    // Building and validating the graph is short CPU work; keep it off the async workers.
    let result = tokio::task::spawn_blocking(move || submitter(submission))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match result {
        Ok(job) => Ok(axum::response::IntoResponse::into_response((
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "jobid": job.job_id, "notes": job.notes })),
        ))),
        Err((status, message)) => {
            Err(ApiError::new(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST), message))
        }
    }
}

async fn not_found(uri: Uri, body: axum::body::Body) -> ApiError {
    crate::uploads::drain(body).await;
    ApiError::not_found(format!("Not found: {}", uri.path()))
}

async fn method_not_allowed(
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> ApiError {
    let path = uri.path().trim_end_matches('/');
    // An answer to an upload the client is still sending must wait for its end.
    crate::uploads::drain(body).await;
    if method == Method::POST && (path == "/jobs" || path == "/v1/jobs") && crate::uploads::is_multipart(&headers) {
        return ApiError::bad_request(crate::uploads::RUN_CATALOG_JOBS.to_string());
    }
    if method == Method::POST && (path == "/jobs" || path == "/v1/jobs") {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "this is an embedded cluster running one job; submit jobs to a standalone cluster (weir cluster start)",
        );
    }
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("Method {method} is not allowed for {}", uri.path()))
}
