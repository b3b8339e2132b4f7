//! Checkpoint, savepoint and stop endpoints (Flink's shapes): statistics, configuration,
//! asynchronous savepoint/stop triggers with request ids, and their status.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weir_runtime::checkpointing::stats::{CheckpointEntry, CheckpointStatus};
use weir_runtime::job_master::SavepointStatus;

use crate::error::ApiError;
use crate::routes::{AppState, find_job};

/// `POST /jobs/{id}/savepoints` body.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct SavepointTriggerRequest {
    /// Where the savepoint goes (else `state.savepoints.dir`).
    #[serde(rename = "target-directory", default)]
    pub target_directory: Option<String>,
    /// Cancel the job after the savepoint (deprecated in Flink; weir stops it as `stop` does).
    #[serde(rename = "cancel-job", default)]
    pub cancel_job: bool,
}

/// `POST /jobs/{id}/stop` body.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct StopRequest {
    /// Where the savepoint goes (else `state.savepoints.dir`).
    #[serde(rename = "targetDirectory", default)]
    pub target_directory: Option<String>,
    /// Flink's drain (emit end-of-time watermarks first); weir has no event time yet.
    #[serde(default)]
    pub drain: bool,
}

/// `{"request-id": "..."}`.
#[derive(Debug, Deserialize, Serialize)]
pub struct TriggerResponse {
    /// The id to poll.
    #[serde(rename = "request-id")]
    pub request_id: String,
}

fn trigger(
    state: &AppState,
    jobid: &str,
    target: Option<String>,
    terminate: bool,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let job = find_job(&state.dispatcher, jobid)?;
    match job.trigger_savepoint(target, terminate) {
        Ok(request_id) => Ok((StatusCode::ACCEPTED, Json(TriggerResponse { request_id }))),
        Err(message) => Err(ApiError::new(StatusCode::CONFLICT, message)),
    }
}

/// `POST /jobs/{jobid}/savepoints`.
pub(crate) async fn trigger_savepoint(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    body: Result<Json<SavepointTriggerRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let Path(jobid) = jobid?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("bad savepoint request body: {e}")))?;
    trigger(&state, &jobid, body.target_directory, body.cancel_job)
}

/// `POST /jobs/{jobid}/stop`.
pub(crate) async fn stop_with_savepoint(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    body: Result<Json<StopRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let Path(jobid) = jobid?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("bad stop request body: {e}")))?;
    trigger(&state, &jobid, body.target_directory, true)
}

/// `GET /jobs/{jobid}/savepoints/{requestid}`.
pub(crate) async fn savepoint_status(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((jobid, request_id)) = path?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let Some(status) = job.savepoint_status(&request_id) else {
        return Err(ApiError::not_found(format!("No savepoint request {request_id} for job {jobid}")));
    };
    let body = match status {
        SavepointStatus::InProgress => json!({"status": {"id": "IN_PROGRESS"}, "operation": null}),
        SavepointStatus::Completed(location) => {
            json!({"status": {"id": "COMPLETED"}, "operation": {"location": location}})
        }
        SavepointStatus::Failed(cause) => {
            json!({"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {"class": "SavepointFailure", "stack-trace": cause}}})
        }
    };
    Ok(Json(body))
}

fn entry_json(entry: &CheckpointEntry) -> Value {
    json!({
        "id": entry.id,
        "status": entry.status,
        "is_savepoint": entry.is_savepoint,
        "savepointFormat": if entry.is_savepoint { Some("CANONICAL") } else { None },
        "trigger_timestamp": entry.trigger_timestamp,
        "latest_ack_timestamp": entry.latest_ack_timestamp,
        "end_to_end_duration": entry.end_to_end_duration,
        "state_size": entry.state_size,
        "checkpointed_size": entry.state_size,
        "num_subtasks": entry.num_subtasks,
        "num_acknowledged_subtasks": entry.num_acknowledged_subtasks,
        "external_path": entry.external_path,
        "failure_message": entry.failure_message,
        "operator_sizes": entry.operator_sizes,
    })
}

/// `GET /jobs/{jobid}/checkpoints`.
pub(crate) async fn checkpoints(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(jobid) = jobid?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let stats = job.checkpoint_stats();
    let latest = |savepoint: bool| {
        stats
            .history
            .iter()
            .rev()
            .find(|e| e.status == CheckpointStatus::Completed && e.is_savepoint == savepoint)
            .map(entry_json)
    };
    let latest_failed = stats.history.iter().rev().find(|e| e.status == CheckpointStatus::Failed).map(entry_json);
    let history: Vec<Value> = stats.history.iter().rev().map(entry_json).collect();
    let restored =
        stats.restored.as_ref().map(|(id, path, at)| json!({"id": id, "external_path": path, "restore_timestamp": at}));
    Ok(Json(json!({
        "counts": {
            "completed": stats.completed,
            "failed": stats.failed,
            "in_progress": stats.in_progress,
            "total": stats.completed + stats.failed + stats.in_progress,
            "restored": u64::from(stats.restored.is_some()),
        },
        "latest": {
            "completed": latest(false),
            "savepoint": latest(true),
            "failed": latest_failed,
            "restored": restored,
        },
        "history": history,
    })))
}

/// `GET /jobs/{jobid}/checkpoints/config`.
pub(crate) async fn checkpoint_config(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(jobid) = jobid?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let settings = job.checkpoint_settings();
    let interval = settings.interval.map(|d| d.as_millis() as u64);
    Ok(Json(json!({
        "mode": if settings.exactly_once { "exactly_once" } else { "at_least_once" },
        "interval": interval.unwrap_or(i64::MAX as u64),
        "checkpointing_enabled": interval.is_some(),
        "timeout": settings.timeout.as_millis() as u64,
        "min_pause": settings.min_pause.as_millis() as u64,
        "max_concurrent": settings.max_concurrent,
        "tolerable_failed_checkpoints": settings.tolerable_failures,
        "num_retained": settings.num_retained,
        "checkpoint_storage": settings.checkpoints_url,
        "savepoint_storage": settings.savepoints_url,
        "state_backend": "hashmap",
        "externalization": {"enabled": true, "delete_on_cancellation": false},
    })))
}
