//! Flink's savepoint disposal: `POST /savepoint-disposal {"savepoint-path": ...}` answers a
//! trigger id at once and deletes the savepoint in the background (only the files its
//! metadata names, as `weir savepoint --dispose`); `GET /savepoint-disposal/{triggerid}`
//! answers `IN_PROGRESS`, then `COMPLETED` with a null or a `failure-cause`. `flink
//! savepoint -d PATH` drives exactly these two calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use crate::checkpoints::{FailureCause, QueueStatus, TriggerResponse};
use crate::error::ApiError;
use crate::responses::ErrorResponse;
use crate::routes::AppState;

/// Disposals by trigger id: `None` while running, then the outcome.
#[derive(Default)]
pub(crate) struct Disposals {
    outcomes: Mutex<HashMap<String, Option<Result<(), String>>>>,
}

impl Disposals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Result<(), String>>>> {
        self.outcomes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `POST /savepoint-disposal` body.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct SavepointDisposalRequest {
    /// The savepoint's directory (or its `_metadata` file), as `weir savepoint --dispose`
    /// takes it.
    #[serde(rename = "savepoint-path")]
    #[schema(min_length = 1)]
    pub savepoint_path: String,
}

/// `GET /savepoint-disposal/{triggerid}`: Flink's `AsynchronousOperationResult`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DisposalStatus {
    /// `IN_PROGRESS` or `COMPLETED`.
    pub status: QueueStatus,
    /// Null while in progress; then `{"failure-cause": null}` or the failure.
    pub operation: Option<DisposalOperation>,
}

/// The outcome of a disposal.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DisposalOperation {
    /// Null when the savepoint was deleted.
    #[serde(rename = "failure-cause")]
    pub failure_cause: Option<FailureCause>,
}

/// The directory of a savepoint path given as a directory or its `_metadata`.
fn snapshot_directory(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed.strip_suffix("/_metadata").unwrap_or(trimmed)
}

#[utoipa::path(post, path = "/savepoint-disposal", tag = "checkpoints", summary = "Delete a savepoint (asynchronous)", request_body = SavepointDisposalRequest, responses((status = 200, body = TriggerResponse), (status = 400, description = "No savepoint-path, or not a storage URL or path", body = ErrorResponse)))]
pub(crate) async fn trigger_disposal(
    State(state): State<AppState>,
    body: Result<Json<SavepointDisposalRequest>, JsonRejection>,
) -> Result<Json<TriggerResponse>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("bad savepoint disposal body: {e}")))?;
    let directory = snapshot_directory(&body.savepoint_path).to_string();
    let storage = weir_checkpoint::SnapshotStorage::from_url(&directory)
        .map_err(|e| ApiError::bad_request(format!("savepoint-path '{}': {e}", body.savepoint_path)))?;
    let request_id = weir_types::JobId::generate().to_string();
    state.disposals.lock().insert(request_id.clone(), None);
    let disposals: Arc<Disposals> = Arc::clone(&state.disposals);
    let id = request_id.clone();
    tokio::spawn(async move {
        let outcome = match weir_checkpoint::dispose(&storage).await {
            Ok(disposed) => {
                tracing::info!(path = %directory, bytes = disposed.bytes, "savepoint disposed over REST");
                Ok(())
            }
            Err(weir_checkpoint::LoadError::Format(e)) => Err(format!("{e}; nothing was deleted")),
            Err(e) => Err(e.to_string()),
        };
        disposals.lock().insert(id, Some(outcome));
    });
    Ok(Json(TriggerResponse { request_id }))
}

#[utoipa::path(get, path = "/savepoint-disposal/{triggerid}", tag = "checkpoints", summary = "A savepoint disposal's status", params(("triggerid" = String, Path, description = "The disposal's `request-id`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = DisposalStatus), (status = 404, description = "No such disposal", body = ErrorResponse)))]
pub(crate) async fn disposal_status(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DisposalStatus>, ApiError> {
    let Path(id) = id?;
    let outcome = state.disposals.lock().get(&id).cloned().ok_or_else(|| {
        ApiError::not_found(format!("No savepoint disposal {id}; POST /savepoint-disposal starts one"))
    })?;
    Ok(Json(match outcome {
        None => DisposalStatus { status: QueueStatus { id: "IN_PROGRESS".into() }, operation: None },
        Some(result) => DisposalStatus {
            status: QueueStatus { id: "COMPLETED".into() },
            operation: Some(DisposalOperation {
                failure_cause: result
                    .err()
                    .map(|cause| FailureCause { class: "SavepointDisposalFailure".into(), stack_trace: cause }),
            }),
        },
    }))
}
