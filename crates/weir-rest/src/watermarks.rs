//! `GET /jobs/{jobid}/vertices/{vertexid}/watermarks`: each subtask's current input
//! watermark, in Flink's shape (a metric list: `<subtask>.currentInputWatermark`, the value a
//! string of epoch ms, `-9223372036854775808` before the first watermark, as Flink's
//! `Long.MIN_VALUE`).

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::responses::ErrorResponse;
use crate::routes::{AppState, find_vertex};

/// One metric of Flink's `MetricCollectionResponseBody`.
#[derive(Debug, Serialize, ToSchema)]
pub struct WatermarkMetric {
    /// `<subtask index>.currentInputWatermark`.
    pub id: String,
    /// The watermark, epoch ms, as a string (Flink's metric values are strings).
    pub value: String,
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/watermarks", tag = "jobs", summary = "Each subtask's current input watermark", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id, from the job's `vertices` or `plan`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = [WatermarkMetric]), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn watermarks(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Vec<WatermarkMetric>>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let vertex = find_vertex(&state.dispatcher, &jobid, &vertexid)?;
    Ok(Json(
        vertex
            .subtasks
            .iter()
            .map(|s| WatermarkMetric {
                id: format!("{}.currentInputWatermark", s.subtask),
                value: s.input_watermark.unwrap_or(i64::MIN).to_string(),
            })
            .collect(),
    ))
}
