//! The JobManager as Flink's REST API shows it: its environment (weir has no JVM: the
//! process's architecture and command line), a thread dump of this process's threads, its
//! metrics and each job's metrics under Flink's names, and a job's view of the cluster
//! configuration.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use weir_runtime::JobMaster;
use weir_runtime::checkpointing::stats::CheckpointStatus;
use weir_types::JobStatus;
use weir_types::lifecycle::now_ms;

use crate::error::ApiError;
use crate::metric_queries::{AggregatedMetric, MetricValue, aggregate, query};
use crate::responses::{ConfigEntry, ErrorResponse};
use crate::routes::{AppState, Params, PathJob};

/// `GET /jobmanager/environment`, as Flink's `EnvironmentInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EnvironmentInfo {
    /// The runtime: weir's version where Flink names the JVM's.
    pub jvm: RuntimeInfo,
    /// Always empty: a weir binary has its jobs compiled in.
    pub classpath: Vec<String>,
}

/// The `jvm` of [`EnvironmentInfo`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuntimeInfo {
    /// `weir <version> (native)`.
    pub version: String,
    /// The machine architecture, e.g. `x86_64`.
    pub arch: String,
    /// The process's command line, one argument each.
    pub options: Vec<String>,
}

fn environment(state: &AppState) -> EnvironmentInfo {
    EnvironmentInfo {
        jvm: RuntimeInfo {
            version: format!("weir {} (native, no JVM)", state.cluster.version),
            arch: std::env::consts::ARCH.to_string(),
            options: std::env::args().collect(),
        },
        classpath: Vec::new(),
    }
}

#[utoipa::path(get, path = "/jobmanager/environment", tag = "cluster", summary = "The JobManager's runtime, architecture and command line", responses((status = 200, body = EnvironmentInfo)))]
pub(crate) async fn jobmanager_environment(State(state): State<AppState>) -> Json<EnvironmentInfo> {
    Json(environment(&state))
}

#[utoipa::path(get, path = "/jobs/{jobid}/jobmanager/environment", tag = "jobs", summary = "The environment of the JobManager running the job", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = EnvironmentInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn job_jobmanager_environment(
    State(state): State<AppState>,
    PathJob(_job): PathJob,
) -> Result<Json<EnvironmentInfo>, ApiError> {
    Ok(Json(environment(&state)))
}

#[utoipa::path(get, path = "/jobs/{jobid}/jobmanager/config", tag = "jobs", summary = "The configuration of the JobManager running the job (secrets masked)", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = Vec<ConfigEntry>), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn job_jobmanager_config(
    State(state): State<AppState>,
    PathJob(_job): PathJob,
) -> Result<Json<Vec<ConfigEntry>>, ApiError> {
    Ok(Json(crate::routes::config_entries(&state)))
}

/// `GET /jobmanager/thread-dump`, as Flink's `ThreadDumpInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadDumpInfo {
    /// Every thread of the process.
    #[serde(rename = "threadInfos")]
    pub thread_infos: Vec<ThreadInfo>,
}

/// One thread of [`ThreadDumpInfo`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadInfo {
    /// Its name.
    #[serde(rename = "threadName")]
    pub thread_name: String,
    /// `"name" Id=<tid> <state>`, as Java's `ThreadInfo.toString` begins (no stacks: weir
    /// does not walk native stacks).
    #[serde(rename = "stringifiedThreadInfo")]
    pub stringified_thread_info: String,
}

/// This process's threads from `/proc/self/task` (empty where there is no procfs).
pub(crate) fn threads() -> Vec<ThreadInfo> {
    let Ok(entries) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut threads: Vec<(u64, ThreadInfo)> = entries
        .flatten()
        .filter_map(|entry| {
            let tid: u64 = entry.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?.trim().to_string();
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name: `tid (name) S ...`.
            let state = match stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) {
                Some('R') => "RUNNABLE",
                Some('S') | Some('D') => "WAITING",
                Some('T') | Some('t') => "BLOCKED",
                _ => "UNKNOWN",
            };
            let info = format!("\"{name}\" Id={tid} {state}\n");
            Some((tid, ThreadInfo { thread_name: name, stringified_thread_info: info }))
        })
        .collect();
    threads.sort_by_key(|(tid, _)| *tid);
    threads.into_iter().map(|(_, t)| t).collect()
}

#[utoipa::path(get, path = "/jobmanager/thread-dump", tag = "cluster", summary = "The JobManager process's threads and their states", responses((status = 200, body = ThreadDumpInfo)))]
pub(crate) async fn jobmanager_thread_dump() -> Json<ThreadDumpInfo> {
    Json(ThreadDumpInfo { thread_infos: threads() })
}

/// The JobManager's metrics under Flink's names.
fn jobmanager_metrics_of(state: &AppState) -> Vec<(String, String)> {
    let counts = state.dispatcher.job_counts();
    let (taskmanagers, slots, free) = match &state.cluster.taskmanager_list {
        Some(list) => {
            let tms = list();
            (tms.len() as u32, tms.iter().map(|t| t.slots_number).sum(), tms.iter().map(|t| t.free_slots).sum())
        }
        None => (
            state.cluster.taskmanagers,
            state.cluster.slots_total,
            state.cluster.slots_total.saturating_sub(state.dispatcher.busy_subtasks()),
        ),
    };
    vec![
        ("numRegisteredTaskManagers".into(), taskmanagers.to_string()),
        ("numRunningJobs".into(), counts.running.to_string()),
        ("taskSlotsAvailable".into(), free.to_string()),
        ("taskSlotsTotal".into(), slots.to_string()),
    ]
}

#[utoipa::path(get, path = "/jobmanager/metrics", tag = "metrics", summary = "The JobManager's metrics: ids, or values with `get`", params(("get" = Option<String>, Query, description = "Comma-separated metric ids whose values to answer")), responses((status = 200, body = [MetricValue]), (status = 400, description = "Bad query", body = ErrorResponse)))]
pub(crate) async fn jobmanager_metrics(
    State(state): State<AppState>,
    params: Params,
) -> Result<Json<Vec<MetricValue>>, ApiError> {
    let Query(params) = params?;
    Ok(Json(query(jobmanager_metrics_of(&state), &params)))
}

/// A job's metrics under Flink's job-scope names.
pub(crate) fn job_metrics_of(job: &JobMaster) -> Vec<(String, String)> {
    let details = job.details();
    let stats = job.checkpoint_stats();
    let now = now_ms();
    let uptime = match details.state {
        JobStatus::Running => details.timestamps.get("RUNNING").map(|at| now.saturating_sub(*at) as i64).unwrap_or(0),
        state if state.is_globally_terminal() => -1,
        _ => 0,
    };
    let last = stats.history.iter().rev().find(|e| e.status == CheckpointStatus::Completed);
    let mut metrics = vec![
        ("uptime".to_string(), uptime.to_string()),
        ("numRestarts".to_string(), details.num_restarts.to_string()),
        ("numberOfCompletedCheckpoints".to_string(), stats.completed.to_string()),
        ("numberOfFailedCheckpoints".to_string(), stats.failed.to_string()),
        ("numberOfInProgressCheckpoints".to_string(), stats.in_progress.to_string()),
        ("totalNumberOfCheckpoints".to_string(), (stats.completed + stats.failed + stats.in_progress).to_string()),
        ("lastCheckpointDuration".to_string(), last.map(|e| e.end_to_end_duration as i64).unwrap_or(-1).to_string()),
        ("lastCheckpointSize".to_string(), last.map(|e| e.checkpointed_size as i64).unwrap_or(-1).to_string()),
        ("lastCheckpointFullSize".to_string(), last.map(|e| e.state_size as i64).unwrap_or(-1).to_string()),
        (
            "lastCheckpointRestoreTimestamp".to_string(),
            stats.restored.as_ref().map(|(_, _, at)| *at as i64).unwrap_or(-1).to_string(),
        ),
    ];
    if let Some(path) = last.and_then(|e| e.external_path.clone()) {
        metrics.push(("lastCheckpointExternalPath".to_string(), path));
    }
    metrics.sort();
    metrics
}

#[utoipa::path(get, path = "/jobs/{jobid}/metrics", tag = "metrics", summary = "A job's metrics (uptime, restarts, checkpoints): ids, or values with `get`", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("get" = Option<String>, Query, description = "Comma-separated metric ids whose values to answer")), responses((status = 200, body = [MetricValue]), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn job_metrics(PathJob(job): PathJob, params: Params) -> Result<Json<Vec<MetricValue>>, ApiError> {
    let Query(params) = params?;
    Ok(Json(query(job_metrics_of(&job), &params)))
}

#[utoipa::path(get, path = "/jobs/metrics", tag = "metrics", summary = "Job metrics aggregated over jobs: ids, or `agg` of those in `get`", params(("get" = Option<String>, Query, description = "Comma-separated metric ids"), ("agg" = Option<String>, Query, description = "Comma-separated aggregations: min, max, avg, sum, skew (default all)", pattern = "^(min|max|avg|sum|skew)(,(min|max|avg|sum|skew))*$"), ("jobs" = Option<String>, Query, description = "Comma-separated job ids (default all)", pattern = "^[0-9a-f]{32}(,[0-9a-f]{32})*$")), responses((status = 200, body = [AggregatedMetric]), (status = 400, description = "A bad job id or aggregation", body = ErrorResponse)))]
pub(crate) async fn aggregated_job_metrics(
    State(state): State<AppState>,
    params: Params,
) -> Result<Json<Vec<AggregatedMetric>>, ApiError> {
    let Query(params) = params?;
    let chosen = job_selection(&params)?;
    let entities = state
        .dispatcher
        .jobs()
        .iter()
        .filter(|job| chosen.as_ref().is_none_or(|c| c.contains(&job.job_id().to_string())))
        .map(|job| job_metrics_of(job))
        .collect();
    Ok(Json(aggregate(entities, &params)?))
}

fn job_selection(params: &HashMap<String, String>) -> Result<Option<Vec<String>>, ApiError> {
    let Some(raw) = params.get("jobs") else { return Ok(None) };
    if raw.trim().is_empty() {
        return Err(ApiError::bad_request("jobs must name at least one job id; leave it out for all jobs"));
    }
    let mut ids = Vec::new();
    for id in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parsed: weir_types::JobId =
            id.parse().map_err(|e: weir_types::ids::BadJobId| ApiError::bad_request(e.to_string()))?;
        ids.push(parsed.to_string());
    }
    Ok(Some(ids))
}
