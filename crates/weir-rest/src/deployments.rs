//! `GET /deployments` and `GET /deployments/{name}`: the declared deployments with their
//! status, in the Flink Kubernetes Operator's shape, served by `weir operator` (the
//! deployment controller). Other servers answer 404 saying where to look.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::Value;

use crate::error::ApiError;
use crate::routes::AppState;

/// Every deployment as `{"apiVersion", "kind", "metadata", "spec", "status"}`.
pub type DeploymentSource = std::sync::Arc<dyn Fn() -> Result<Vec<Value>, String> + Send + Sync>;

fn source(state: &AppState) -> Result<&DeploymentSource, ApiError> {
    state.cluster.deployments.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "this server keeps no deployments: ask the deployment controller (`weir operator`, at operator.rest.port, 8085 by default), or run `weir deployment get`".to_string(),
        )
    })
}

/// Reads the deployments on a blocking thread: the source waits on its store (files, etcd,
/// the Kubernetes API server through a client with its own runtime), which must not hold up
/// or nest inside the server's runtime.
async fn read(state: &AppState) -> Result<Vec<Value>, ApiError> {
    let source = std::sync::Arc::clone(source(state)?);
    let internal = |e: String| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e);
    tokio::task::spawn_blocking(move || source())
        .await
        .map_err(|e| internal(format!("reading the deployments failed: {e}")))?
        .map_err(internal)
}

/// `GET /deployments`.
#[utoipa::path(get, path = "/deployments", tag = "deployments", summary = "Every declared deployment with its spec and status", responses((status = 200, description = "`{\"deployments\": [{apiVersion, kind, metadata, spec, status}]}`", body = Object), (status = 404, description = "Not the deployment controller", body = crate::responses::ErrorResponse)))]
pub(crate) async fn deployments(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(serde_json::json!({ "deployments": read(&state).await? })))
}

/// `GET /deployments/{name}`.
#[utoipa::path(get, path = "/deployments/{name}", tag = "deployments", summary = "One deployment's spec and status (lifecycleState, jobStatus, reconciliationStatus, savepoint history, error)", params(("name" = String, Path, description = "The deployment's metadata.name")), responses((status = 200, body = Object), (status = 404, description = "No such deployment", body = crate::responses::ErrorResponse)))]
pub(crate) async fn deployment(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    read(&state)
        .await?
        .into_iter()
        .find(|d| d["metadata"]["name"].as_str() == Some(name.as_str()))
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("No deployment '{name}'; `weir deployment get` lists them")))
}
