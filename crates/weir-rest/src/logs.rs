//! Flink's log paths: `/jobmanager/log`, `/jobmanager/logs` (and `/{name}`),
//! `/jobmanager/stdout`, and a TaskManager's. The log served is the newest part of this
//! process's, kept in memory by the logger (`weir_runtime::log_tail`); an embedded
//! cluster's TaskManager is this process, so its log is the same. A standalone
//! TaskManager's log stays in its own process (its file, `journalctl`, the pod's log).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::routes::AppState;

/// The one log file this process offers, by Flink's name for the JobManager's.
const LOG_NAME: &str = "jobmanager.log";

/// Flink's `LogListInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogList {
    /// The logs.
    pub logs: Vec<LogInfo>,
}

/// Flink's `LogInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogInfo {
    /// Its name.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Last change, epoch ms.
    pub mtime: u64,
}

fn log_text() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], weir_runtime::log_tail::snapshot())
}

fn list() -> LogList {
    let size = weir_runtime::log_tail::snapshot().len() as u64;
    LogList { logs: vec![LogInfo { name: LOG_NAME.into(), size, mtime: weir_types::lifecycle::now_ms() }] }
}

/// `GET /jobmanager/log`.
#[utoipa::path(get, path = "/jobmanager/log", tag = "cluster", summary = "The newest part (up to 1 MiB) of the JobManager's log", responses((status = 200, description = "The log, as text", content_type = "text/plain", body = String)))]
pub(crate) async fn jobmanager_log() -> impl IntoResponse {
    log_text()
}

/// `GET /jobmanager/stdout`: weir writes nothing but its log and its own status lines.
#[utoipa::path(get, path = "/jobmanager/stdout", tag = "cluster", summary = "The JobManager's stdout: empty (weir writes its log to stderr, served at /jobmanager/log)", responses((status = 200, description = "Empty text", content_type = "text/plain", body = String)))]
pub(crate) async fn jobmanager_stdout() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], String::new())
}

/// `GET /jobmanager/logs`.
#[utoipa::path(get, path = "/jobmanager/logs", tag = "cluster", summary = "The JobManager's log files: one, jobmanager.log", responses((status = 200, body = LogList)))]
pub(crate) async fn jobmanager_logs() -> Json<LogList> {
    Json(list())
}

/// `GET /jobmanager/logs/{filename}`.
#[utoipa::path(get, path = "/jobmanager/logs/{filename}", tag = "cluster", summary = "One of the JobManager's log files", params(("filename" = String, Path, description = "jobmanager.log")), responses((status = 200, description = "The log, as text", content_type = "text/plain", body = String), (status = 404, description = "No such log", body = crate::responses::ErrorResponse)))]
pub(crate) async fn jobmanager_log_file(Path(name): Path<String>) -> Result<impl IntoResponse, ApiError> {
    if name != LOG_NAME {
        return Err(ApiError::not_found(format!("No log '{name}': the JobManager has {LOG_NAME}")));
    }
    Ok(log_text())
}

/// The embedded cluster's TaskManager is this process; a standalone one's log is its own.
fn taskmanager_of_this_process(state: &AppState, id: &str) -> Result<(), ApiError> {
    if state.cluster.taskmanager_list.is_none() && id == crate::routes::EMBEDDED_TASKMANAGER {
        return Ok(());
    }
    Err(ApiError::not_found(format!(
        "the log of TaskManager {id} stays in its own process: read its log file (`weir cluster start` writes <data dir>/cluster/taskmanager-<n>.log), journalctl, or `kubectl logs` of its pod"
    )))
}

/// `GET /taskmanagers/{taskmanagerid}/log`.
#[utoipa::path(get, path = "/taskmanagers/{taskmanagerid}/log", tag = "cluster", summary = "The embedded cluster's TaskManager's log (this process's)", params(("taskmanagerid" = String, Path, description = "TaskManager id (`embedded`)")), responses((status = 200, description = "The log, as text", content_type = "text/plain", body = String), (status = 404, description = "A standalone TaskManager: its log stays in its process", body = crate::responses::ErrorResponse)))]
pub(crate) async fn taskmanager_log(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    taskmanager_of_this_process(&state, &id)?;
    Ok(log_text())
}

/// `GET /taskmanagers/{taskmanagerid}/logs`.
#[utoipa::path(get, path = "/taskmanagers/{taskmanagerid}/logs", tag = "cluster", summary = "The embedded cluster's TaskManager's log files (a standalone TaskManager's: none here)", params(("taskmanagerid" = String, Path, description = "TaskManager id (`embedded`)")), responses((status = 200, body = LogList)))]
pub(crate) async fn taskmanager_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<LogList>, ApiError> {
    // A standalone TaskManager offers none here (Flink's list of its files: empty).
    Ok(Json(if taskmanager_of_this_process(&state, &id).is_ok() { list() } else { LogList { logs: Vec::new() } }))
}
