//! Checkpoint, savepoint and stop endpoints (Flink's shapes): statistics, configuration,
//! asynchronous savepoint/stop triggers with request ids, and their status.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use weir_runtime::checkpointing::stats::{CheckpointEntry, CheckpointStatus, SubtaskCheckpoint};
use weir_runtime::job_master::{CheckpointRequestStatus, SavepointStatus};

use crate::error::ApiError;
use crate::responses::ErrorResponse;
use crate::routes::{AppState, PathJob, find_job};

/// `POST /jobs/{id}/savepoints` body.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct SavepointTriggerRequest {
    /// Where the savepoint goes (else `state.savepoints.dir`).
    #[serde(rename = "target-directory", default)]
    pub target_directory: Option<String>,
    /// Cancel the job after the savepoint (deprecated in Flink; weir stops it as `stop` does).
    #[serde(rename = "cancel-job", default)]
    pub cancel_job: bool,
    /// `CANONICAL` (default: any state backend restores it) or `NATIVE` (the backend's own
    /// layout, faster; only the same backend restores it).
    #[serde(rename = "formatType", default)]
    #[schema(pattern = "^(CANONICAL|NATIVE|canonical|native)$")]
    pub format_type: Option<String>,
}

/// `POST /jobs/{id}/stop` body.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct StopRequest {
    /// Where the savepoint goes (else `state.savepoints.dir`).
    #[serde(rename = "targetDirectory", default)]
    pub target_directory: Option<String>,
    /// Flink's drain: the sources emit the final watermark before the savepoint's barrier,
    /// so every event-time window and timer fires and its output is committed with the
    /// savepoint. For ending a job for good (resuming from it can repeat window results).
    #[serde(default)]
    pub drain: bool,
    /// `CANONICAL` (default) or `NATIVE`, as for a savepoint.
    #[serde(rename = "formatType", default)]
    #[schema(pattern = "^(CANONICAL|NATIVE|canonical|native)$")]
    pub format_type: Option<String>,
}

/// `{"request-id": "..."}`.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
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
    drain: bool,
    format_type: Option<String>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let format = match format_type.as_deref() {
        None => weir_runtime::SnapshotFormat::Canonical,
        Some(text) => text
            .parse()
            .map_err(|_| ApiError::bad_request(format!("formatType '{text}' is not CANONICAL or NATIVE")))?,
    };
    let job = find_job(&state.dispatcher, jobid)?;
    let triggered = if terminate {
        job.trigger_stop(target, format, drain)
    } else {
        job.trigger_savepoint_as(target, false, format)
    };
    match triggered {
        Ok(request_id) => Ok((StatusCode::ACCEPTED, Json(TriggerResponse { request_id }))),
        Err(message) => Err(ApiError::new(StatusCode::CONFLICT, message)),
    }
}

/// `POST /jobs/{jobid}/savepoints`.
#[utoipa::path(post, path = "/jobs/{jobid}/savepoints", tag = "checkpoints", summary = "Trigger a savepoint", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), request_body = SavepointTriggerRequest, responses((status = 202, body = TriggerResponse), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse), (status = 409, description = "The job cannot take a savepoint now", body = ErrorResponse)))]
pub(crate) async fn trigger_savepoint(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    body: Result<Json<SavepointTriggerRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let Path(jobid) = jobid?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("bad savepoint request body: {e}")))?;
    trigger(&state, &jobid, body.target_directory, body.cancel_job, false, body.format_type)
}

/// `POST /jobs/{jobid}/stop`.
#[utoipa::path(post, path = "/jobs/{jobid}/stop", tag = "checkpoints", summary = "Stop the job with a savepoint", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), request_body = StopRequest, responses((status = 202, body = TriggerResponse), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse), (status = 409, description = "The job cannot stop now", body = ErrorResponse)))]
pub(crate) async fn stop_with_savepoint(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    body: Result<Json<StopRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let Path(jobid) = jobid?;
    let Json(body) = body.map_err(|e| ApiError::bad_request(format!("bad stop request body: {e}")))?;
    trigger(&state, &jobid, body.target_directory, true, body.drain, body.format_type)
}

/// `GET /jobs/{jobid}/savepoints/{requestid}` (and the stop trigger's status): Flink's
/// asynchronous operation result.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointStatusResponse {
    /// `IN_PROGRESS` or `COMPLETED`.
    pub status: QueueStatus,
    /// Null while in progress; then either `location` or `failure-cause`.
    pub operation: Option<SavepointOperation>,
    /// While in progress: how far the savepoint got (weir's addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<SavepointProgress>,
}

/// How far an in-progress savepoint got: subtasks that finished writing, and their bytes.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointProgress {
    /// The savepoint's checkpoint id.
    pub checkpoint_id: u64,
    /// Subtasks that wrote their state.
    pub num_acknowledged_subtasks: u32,
    /// Subtasks that write state.
    pub num_subtasks: u32,
    /// Bytes written by the subtasks that finished.
    pub state_size: u64,
}

/// The `status` of [`SavepointStatusResponse`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueStatus {
    /// `IN_PROGRESS` or `COMPLETED` (also when it failed).
    pub id: String,
}

/// The outcome of a savepoint operation.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SavepointOperation {
    /// Where the savepoint was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Why it failed.
    #[serde(rename = "failure-cause", default, skip_serializing_if = "Option::is_none")]
    pub failure_cause: Option<FailureCause>,
}

/// Why a savepoint failed.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FailureCause {
    /// Always `SavepointFailure`.
    pub class: String,
    /// The message.
    #[serde(rename = "stack-trace")]
    pub stack_trace: String,
}

/// `GET /jobs/{jobid}/savepoints/{requestid}`.
#[utoipa::path(get, path = "/jobs/{jobid}/savepoints/{triggerid}", tag = "checkpoints", summary = "A savepoint or stop request's status", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("triggerid" = String, Path, description = "The trigger's `request-id`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = SavepointStatusResponse), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or request", body = ErrorResponse)))]
pub(crate) async fn savepoint_status(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<SavepointStatusResponse>, ApiError> {
    let Path((jobid, request_id)) = path?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let Some(status) = job.savepoint_status(&request_id) else {
        return Err(ApiError::not_found(format!("No savepoint request {request_id} for job {jobid}")));
    };
    let progress = match status {
        SavepointStatus::InProgress => savepoint_progress(&job, &request_id),
        _ => None,
    };
    let (id, operation) = match status {
        SavepointStatus::InProgress => ("IN_PROGRESS", None),
        SavepointStatus::Completed(location) => {
            ("COMPLETED", Some(SavepointOperation { location: Some(location), failure_cause: None }))
        }
        SavepointStatus::Failed(cause) => (
            "COMPLETED",
            Some(SavepointOperation {
                location: None,
                failure_cause: Some(FailureCause { class: "SavepointFailure".into(), stack_trace: cause }),
            }),
        ),
    };
    Ok(Json(SavepointStatusResponse { status: QueueStatus { id: id.into() }, operation, progress }))
}

fn savepoint_progress(job: &weir_runtime::JobMaster, request_id: &str) -> Option<SavepointProgress> {
    let checkpoint_id = *job.record().savepoint_checkpoints.get(request_id)?;
    let stats = job.checkpoint_stats();
    let entry = stats.history.iter().find(|e| e.id == checkpoint_id)?;
    Some(SavepointProgress {
        checkpoint_id,
        num_acknowledged_subtasks: entry.num_acknowledged_subtasks,
        num_subtasks: entry.num_subtasks,
        state_size: entry.state_size,
    })
}

/// `GET /jobs/{jobid}/checkpoints`: counts, the latest of each kind, and recent history.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointingStatistics {
    /// How many checkpoints of each outcome.
    pub counts: CheckpointCounts,
    /// Minimum, maximum, average and percentiles of the completed checkpoints in the history.
    pub summary: CheckpointSummary,
    /// The newest of each kind.
    pub latest: LatestCheckpoints,
    /// Recent checkpoints and savepoints, newest first (at most 10, Flink's
    /// `web.checkpoints.history`).
    pub history: Vec<CheckpointStatisticsEntry>,
}

/// The `counts` of [`CheckpointingStatistics`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointCounts {
    /// Completed checkpoints and savepoints.
    pub completed: u64,
    /// Failed ones.
    pub failed: u64,
    /// Waiting for acknowledgements.
    pub in_progress: u64,
    /// All triggered.
    pub total: u64,
    /// 1 when the job started from a snapshot.
    pub restored: u64,
}

/// The `summary` of [`CheckpointingStatistics`], as Flink's.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointSummary {
    /// Bytes written per checkpoint.
    pub checkpointed_size: StatsSummary,
    /// Bytes of state per checkpoint.
    pub state_size: StatsSummary,
    /// Milliseconds from trigger to completion.
    pub end_to_end_duration: StatsSummary,
    /// Always zeros: aligned checkpoints buffer nothing.
    pub alignment_buffered: StatsSummary,
    /// Always zeros: in-flight data is not measured.
    pub processed_data: StatsSummary,
    /// Always zeros: the in-flight records an unaligned checkpoint persists are counted in
    /// its state size, not apart.
    pub persisted_data: StatsSummary,
}

/// Flink's `StatsSummaryDto`: min, max, average and percentiles (0 for all when empty).
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatsSummary {
    /// Smallest.
    pub min: u64,
    /// Largest.
    pub max: u64,
    /// Average, rounded down.
    pub avg: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl StatsSummary {
    /// The summary of `values` (nearest-rank percentiles).
    pub fn of(mut values: Vec<u64>) -> StatsSummary {
        if values.is_empty() {
            return StatsSummary::default();
        }
        values.sort_unstable();
        let rank = |q: f64| {
            let index = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[index] as f64
        };
        StatsSummary {
            min: values[0],
            max: values[values.len() - 1],
            avg: values.iter().sum::<u64>() / values.len() as u64,
            p50: rank(0.5),
            p90: rank(0.9),
            p95: rank(0.95),
            p99: rank(0.99),
            p999: rank(0.999),
        }
    }
}

/// The `latest` of [`CheckpointingStatistics`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LatestCheckpoints {
    /// Newest completed checkpoint.
    pub completed: Option<CheckpointStatisticsEntry>,
    /// Newest completed savepoint.
    pub savepoint: Option<CheckpointStatisticsEntry>,
    /// Newest failed checkpoint.
    pub failed: Option<CheckpointStatisticsEntry>,
    /// The snapshot the job started from.
    pub restored: Option<RestoredCheckpoint>,
}

/// The snapshot a job started from.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RestoredCheckpoint {
    /// Its checkpoint id.
    pub id: u64,
    /// Whether it was a savepoint (a restore with `-s` of a `savepoint-*` directory).
    pub is_savepoint: bool,
    /// Where it is.
    pub external_path: String,
    /// When the job restored it, epoch ms.
    pub restore_timestamp: u64,
}

/// One checkpoint or savepoint.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointStatisticsEntry {
    /// Flink's type tag: `completed`, `failed` or `in_progress`.
    #[serde(rename = "className")]
    pub class_name: String,
    /// Checkpoint id.
    pub id: u64,
    /// `IN_PROGRESS`, `COMPLETED` or `FAILED`.
    pub status: CheckpointStatus,
    /// True for savepoints.
    pub is_savepoint: bool,
    /// `CHECKPOINT`, `UNALIGNED_CHECKPOINT`, `SAVEPOINT`, or `SYNC_SAVEPOINT` (the savepoint
    /// of a stop).
    pub checkpoint_type: String,
    /// `CANONICAL` for savepoints.
    #[serde(rename = "savepointFormat")]
    pub savepoint_format: Option<String>,
    /// When it was triggered, epoch ms.
    pub trigger_timestamp: u64,
    /// When the last acknowledgement arrived, epoch ms (0 while in progress).
    pub latest_ack_timestamp: u64,
    /// Milliseconds from trigger to completion or failure.
    pub end_to_end_duration: u64,
    /// Bytes of the whole state the checkpoint holds.
    pub state_size: u64,
    /// Bytes written by this checkpoint (less than `state_size` for an incremental one,
    /// which reuses unchanged key groups).
    pub checkpointed_size: u64,
    /// Subtasks expected.
    pub num_subtasks: u32,
    /// Subtasks that acknowledged.
    pub num_acknowledged_subtasks: u32,
    /// Always 0: aligned checkpoints buffer nothing.
    pub alignment_buffered: u64,
    /// Always 0: in-flight data is not measured.
    pub processed_data: u64,
    /// Always 0: weir's checkpoints are aligned and persist no in-flight data.
    pub persisted_data: u64,
    /// Where it is (completed only).
    pub external_path: Option<String>,
    /// Whether retention has deleted it (completed only).
    #[serde(default)]
    pub discarded: bool,
    /// When it failed, epoch ms (failed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_timestamp: Option<u64>,
    /// Why it failed.
    pub failure_message: Option<String>,
    /// Per vertex id: its subtasks' part of the checkpoint.
    pub tasks: BTreeMap<String, TaskCheckpointStatistics>,
    /// Bytes per operator uid.
    pub operator_sizes: BTreeMap<String, u64>,
}

/// One vertex's part of a checkpoint, as Flink's `TaskCheckpointStatistics`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskCheckpointStatistics {
    /// Checkpoint id.
    pub id: u64,
    /// The checkpoint's status.
    pub status: CheckpointStatus,
    /// When the checkpoint's last acknowledgement arrived, epoch ms.
    pub latest_ack_timestamp: u64,
    /// Bytes the vertex's operators wrote.
    pub checkpointed_size: u64,
    /// Bytes of the vertex's operators' state.
    pub state_size: u64,
    /// The checkpoint's end-to-end milliseconds.
    pub end_to_end_duration: u64,
    /// Always 0, as for the checkpoint.
    pub alignment_buffered: u64,
    /// Always 0, as for the checkpoint.
    pub processed_data: u64,
    /// Always 0, as for the checkpoint.
    pub persisted_data: u64,
    /// The vertex's subtasks.
    pub num_subtasks: u32,
    /// Its subtasks that acknowledged (all of them once the checkpoint completed).
    pub num_acknowledged_subtasks: u32,
}

/// A vertex of the job: its id, operator uids and parallelism.
type VertexShape = (String, Vec<String>, u32);

fn vertex_shapes(job: &weir_runtime::JobMaster) -> Vec<VertexShape> {
    job.details().vertices.into_iter().map(|v| (v.id, v.uids, v.parallelism)).collect()
}

impl CheckpointStatisticsEntry {
    fn of(entry: &CheckpointEntry, vertices: &[VertexShape], retained: &[u64]) -> Self {
        let class_name = match entry.status {
            CheckpointStatus::Completed => "completed",
            CheckpointStatus::Failed => "failed",
            CheckpointStatus::InProgress => "in_progress",
        };
        // Flink's RestAPICheckpointType.
        let checkpoint_type = match (entry.is_savepoint, entry.is_stop) {
            (false, _) if entry.unaligned => "UNALIGNED_CHECKPOINT",
            (false, _) => "CHECKPOINT",
            (true, false) => "SAVEPOINT",
            (true, true) => "SYNC_SAVEPOINT",
        };
        let total = vertices.iter().map(|v| v.2).sum::<u32>().max(1);
        let tasks = vertices
            .iter()
            .map(|(id, uids, parallelism)| {
                let size: u64 = uids.iter().filter_map(|uid| entry.operator_sizes.get(uid)).sum();
                // Acknowledgements are counted per checkpoint; a vertex's share follows its
                // parallelism (exact once the checkpoint completed).
                let acknowledged = if entry.status == CheckpointStatus::Completed {
                    *parallelism
                } else {
                    (u64::from(entry.num_acknowledged_subtasks) * u64::from(*parallelism) / u64::from(total)) as u32
                };
                let task = TaskCheckpointStatistics {
                    id: entry.id,
                    status: entry.status,
                    latest_ack_timestamp: entry.latest_ack_timestamp,
                    checkpointed_size: size.min(entry.checkpointed_size),
                    state_size: size,
                    end_to_end_duration: entry.end_to_end_duration,
                    alignment_buffered: 0,
                    processed_data: 0,
                    persisted_data: 0,
                    num_subtasks: *parallelism,
                    num_acknowledged_subtasks: acknowledged,
                };
                (id.clone(), task)
            })
            .collect();
        CheckpointStatisticsEntry {
            class_name: class_name.into(),
            id: entry.id,
            status: entry.status,
            is_savepoint: entry.is_savepoint,
            checkpoint_type: checkpoint_type.into(),
            savepoint_format: entry.savepoint_format.clone(),
            trigger_timestamp: entry.trigger_timestamp,
            latest_ack_timestamp: entry.latest_ack_timestamp,
            end_to_end_duration: entry.end_to_end_duration,
            state_size: entry.state_size,
            checkpointed_size: entry.checkpointed_size,
            num_subtasks: entry.num_subtasks,
            num_acknowledged_subtasks: entry.num_acknowledged_subtasks,
            alignment_buffered: 0,
            processed_data: 0,
            persisted_data: 0,
            external_path: entry.external_path.clone(),
            discarded: entry.status == CheckpointStatus::Completed
                && !entry.is_savepoint
                && !retained.is_empty()
                && !retained.contains(&entry.id),
            failure_timestamp: (entry.status == CheckpointStatus::Failed)
                .then(|| entry.trigger_timestamp + entry.end_to_end_duration),
            failure_message: entry.failure_message.clone(),
            tasks,
            operator_sizes: entry.operator_sizes.clone(),
        }
    }
}

/// `GET /jobs/{jobid}/checkpoints`.
#[utoipa::path(get, path = "/jobs/{jobid}/checkpoints", tag = "checkpoints", summary = "Checkpoint counts, latest and history", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = CheckpointingStatistics), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn checkpoints(PathJob(job): PathJob) -> Result<Json<CheckpointingStatistics>, ApiError> {
    let stats = job.checkpoint_stats();
    let vertices = vertex_shapes(&job);
    let retained = retained_ids(&stats, job.checkpoint_settings().num_retained);
    let entry = |e: &CheckpointEntry| CheckpointStatisticsEntry::of(e, &vertices, &retained);
    let latest = |savepoint: bool| {
        stats
            .history
            .iter()
            .rev()
            .find(|e| e.status == CheckpointStatus::Completed && e.is_savepoint == savepoint)
            .map(entry)
    };
    let failed = stats.history.iter().rev().find(|e| e.status == CheckpointStatus::Failed).map(entry);
    let restored = stats.restored.as_ref().map(|(id, path, at)| RestoredCheckpoint {
        id: *id,
        is_savepoint: path.contains("savepoint-"),
        external_path: path.clone(),
        restore_timestamp: *at,
    });
    let completed: Vec<&CheckpointEntry> =
        stats.history.iter().filter(|e| e.status == CheckpointStatus::Completed).collect();
    let summary_of = |f: fn(&CheckpointEntry) -> u64| StatsSummary::of(completed.iter().map(|e| f(e)).collect());
    Ok(Json(CheckpointingStatistics {
        counts: CheckpointCounts {
            completed: stats.completed,
            failed: stats.failed,
            in_progress: stats.in_progress,
            total: stats.completed + stats.failed + stats.in_progress,
            restored: u64::from(stats.restored.is_some()),
        },
        summary: CheckpointSummary {
            checkpointed_size: summary_of(|e| e.checkpointed_size),
            state_size: summary_of(|e| e.state_size),
            end_to_end_duration: summary_of(|e| e.end_to_end_duration),
            alignment_buffered: StatsSummary::default(),
            processed_data: StatsSummary::default(),
            persisted_data: StatsSummary::default(),
        },
        latest: LatestCheckpoints { completed: latest(false), savepoint: latest(true), failed, restored },
        history: stats.history.iter().rev().map(entry).collect(),
    }))
}

/// The ids of the completed checkpoints retention keeps: the newest `num_retained`.
fn retained_ids(stats: &weir_runtime::checkpointing::stats::CheckpointStats, num_retained: u32) -> Vec<u64> {
    stats
        .history
        .iter()
        .rev()
        .filter(|e| e.status == CheckpointStatus::Completed && !e.is_savepoint)
        .take(num_retained as usize)
        .map(|e| e.id)
        .collect()
}

/// `GET /jobs/{jobid}/checkpoints/details/{checkpointid}`: one checkpoint of the history.
#[utoipa::path(get, path = "/jobs/{jobid}/checkpoints/details/{checkpointid}", tag = "checkpoints", summary = "One checkpoint or savepoint, with its part per vertex", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("checkpointid" = u64, Path, description = "Checkpoint id")), responses((status = 200, body = CheckpointStatisticsEntry), (status = 400, description = "Not a job id or checkpoint id", body = ErrorResponse), (status = 404, description = "No such job, or the checkpoint is not in the history (the newest 10)", body = ErrorResponse)))]
pub(crate) async fn checkpoint_details(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<CheckpointStatisticsEntry>, ApiError> {
    let Path((jobid, checkpointid)) = path?;
    let id: u64 = checkpointid
        .parse()
        .map_err(|_| ApiError::bad_request(format!("checkpoint id '{checkpointid}' is not a non-negative integer")))?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let stats = job.checkpoint_stats();
    let retained = retained_ids(&stats, job.checkpoint_settings().num_retained);
    let entry = stats.history.iter().find(|e| e.id == id).ok_or_else(|| {
        ApiError::not_found(format!(
            "Checkpoint {id} of job {jobid} is not in the checkpoint history; GET /jobs/{jobid}/checkpoints lists it"
        ))
    })?;
    Ok(Json(CheckpointStatisticsEntry::of(entry, &vertex_shapes(&job), &retained)))
}

/// `GET /jobs/{jobid}/checkpoints/config`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointConfigInfo {
    /// `exactly_once` or `at_least_once`.
    pub mode: String,
    /// Milliseconds between checkpoints (`i64::MAX` when off, as Flink).
    pub interval: u64,
    /// Whether periodic checkpoints are on.
    pub checkpointing_enabled: bool,
    /// Milliseconds before a checkpoint is aborted.
    pub timeout: u64,
    /// Minimum milliseconds between the end of one checkpoint and the next trigger.
    pub min_pause: u64,
    /// Checkpoints in flight at once.
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the job fails.
    pub tolerable_failed_checkpoints: u32,
    /// Completed checkpoints kept.
    pub num_retained: u32,
    /// Where checkpoints go.
    pub checkpoint_storage: String,
    /// Where savepoints go by default.
    pub savepoint_storage: Option<String>,
    /// Always `hashmap` (in-memory keyed state).
    pub state_backend: String,
    /// Retained checkpoints survive a cancel.
    pub externalization: Externalization,
    /// `execution.checkpointing.unaligned.enabled` (periodic checkpoints; savepoints stay
    /// aligned).
    pub unaligned_checkpoints: bool,
    /// Always 0: a checkpoint does not switch from aligned to unaligned on a timeout.
    pub aligned_checkpoint_timeout: u64,
    /// Always true: checkpoints go on after some tasks finished (FLIP-147).
    pub checkpoints_after_tasks_finish: bool,
    /// Always false: no changelog state backend.
    pub state_changelog_enabled: bool,
    /// Always 0, as `state_changelog_enabled`.
    pub changelog_periodic_materialization_interval: u64,
    /// Always empty, as `state_changelog_enabled`.
    pub changelog_storage: String,
}

/// The `externalization` of [`CheckpointConfigInfo`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Externalization {
    /// Always true: completed checkpoints are kept on storage.
    pub enabled: bool,
    /// Always false: a cancel keeps them.
    pub delete_on_cancellation: bool,
}

/// `GET /jobs/{jobid}/checkpoints/config`.
#[utoipa::path(get, path = "/jobs/{jobid}/checkpoints/config", tag = "checkpoints", summary = "Checkpointing configuration", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = CheckpointConfigInfo), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse)))]
pub(crate) async fn checkpoint_config(PathJob(job): PathJob) -> Result<Json<CheckpointConfigInfo>, ApiError> {
    let settings = job.checkpoint_settings();
    let interval = settings.interval.map(|d| d.as_millis() as u64);
    Ok(Json(CheckpointConfigInfo {
        mode: if settings.exactly_once { "exactly_once" } else { "at_least_once" }.into(),
        interval: interval.unwrap_or(i64::MAX as u64),
        checkpointing_enabled: interval.is_some(),
        timeout: settings.timeout.as_millis() as u64,
        min_pause: settings.min_pause.as_millis() as u64,
        max_concurrent: settings.max_concurrent,
        tolerable_failed_checkpoints: settings.tolerable_failures,
        num_retained: settings.num_retained,
        checkpoint_storage: settings.checkpoints_url.clone(),
        savepoint_storage: settings.savepoints_url.clone(),
        state_backend: "hashmap".into(),
        externalization: Externalization { enabled: true, delete_on_cancellation: false },
        unaligned_checkpoints: settings.unaligned,
        aligned_checkpoint_timeout: 0,
        checkpoints_after_tasks_finish: true,
        state_changelog_enabled: false,
        changelog_periodic_materialization_interval: 0,
        changelog_storage: String::new(),
    }))
}

/// `POST /jobs/{jobid}/checkpoints` body (optional), as Flink's `CheckpointTriggerRequestBody`.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
pub struct CheckpointTriggerRequest {
    /// `CONFIGURED` (default: as the job is configured), `FULL`, or `INCREMENTAL`. `FULL`
    /// writes every key group whole (of a job with incremental checkpoints too: it names no
    /// file of an earlier checkpoint); `INCREMENTAL` is as configured.
    #[serde(rename = "checkpointType", default)]
    #[schema(pattern = "^(CONFIGURED|FULL|INCREMENTAL)$")]
    pub checkpoint_type: Option<String>,
    /// The client's own trigger id (32 hex characters), to poll and to retry without a
    /// second checkpoint; weir makes one up without it.
    #[serde(rename = "triggerId", default)]
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trigger_id: Option<String>,
}

/// `POST /jobs/{jobid}/checkpoints`: a checkpoint now, as Flink's (`flink checkpoint JOBID`).
#[utoipa::path(post, path = "/jobs/{jobid}/checkpoints", tag = "checkpoints", summary = "Trigger a checkpoint now", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), request_body = CheckpointTriggerRequest, responses((status = 202, body = TriggerResponse), (status = 400, description = "Not a job id, or a bad checkpoint type or trigger id", body = ErrorResponse), (status = 404, description = "No such job", body = ErrorResponse), (status = 409, description = "The job cannot take a checkpoint now, or the trigger id was used", body = ErrorResponse)))]
pub(crate) async fn trigger_checkpoint(
    State(state): State<AppState>,
    jobid: Result<Path<String>, PathRejection>,
    body: Result<Json<CheckpointTriggerRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TriggerResponse>), ApiError> {
    let Path(jobid) = jobid?;
    // Flink's client sends a body; curl users may not.
    let body = match body {
        Ok(Json(body)) => body,
        Err(JsonRejection::MissingJsonContentType(_)) => CheckpointTriggerRequest::default(),
        Err(e) => return Err(ApiError::bad_request(format!("bad checkpoint request body: {e}"))),
    };
    let job = find_job(&state.dispatcher, &jobid)?;
    let full = match body.checkpoint_type.as_deref().map(str::to_ascii_uppercase).as_deref() {
        None | Some("CONFIGURED") | Some("INCREMENTAL") => false,
        Some("FULL") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "checkpointType '{other}' is not one of CONFIGURED, FULL, INCREMENTAL"
            )));
        }
    };
    if let Some(id) = &body.trigger_id
        && !(id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    {
        return Err(ApiError::bad_request(format!("triggerId '{id}' is not 32 lower-case hex characters")));
    }
    match job.trigger_checkpoint(body.trigger_id, full) {
        Ok(request_id) => Ok((StatusCode::ACCEPTED, Json(TriggerResponse { request_id }))),
        Err(message) => Err(ApiError::new(StatusCode::CONFLICT, message)),
    }
}

/// `GET /jobs/{jobid}/checkpoints/{triggerid}`: Flink's asynchronous operation result of a
/// checkpoint request.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointRequestResult {
    /// `IN_PROGRESS` or `COMPLETED` (also when it failed).
    pub status: QueueStatus,
    /// Null while in progress; then `checkpointId` or `failureCause`.
    pub operation: Option<CheckpointRequestOperation>,
}

/// The outcome of a checkpoint request, as Flink's `CheckpointInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointRequestOperation {
    /// The completed checkpoint's id.
    #[serde(rename = "checkpointId", default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<u64>,
    /// Why no checkpoint completed.
    #[serde(rename = "failureCause", default, skip_serializing_if = "Option::is_none")]
    pub failure_cause: Option<FailureCause>,
}

#[utoipa::path(get, path = "/jobs/{jobid}/checkpoints/{triggerid}", tag = "checkpoints", summary = "A checkpoint request's status", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("triggerid" = String, Path, description = "The trigger's `request-id`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = CheckpointRequestResult), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or request", body = ErrorResponse)))]
pub(crate) async fn checkpoint_request_status(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<CheckpointRequestResult>, ApiError> {
    let Path((jobid, request_id)) = path?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let status = job.checkpoint_request_status(&request_id).ok_or_else(|| {
        ApiError::not_found(format!(
            "No checkpoint request {request_id} for job {jobid}; POST /jobs/{jobid}/checkpoints starts one"
        ))
    })?;
    Ok(Json(match status {
        CheckpointRequestStatus::InProgress => {
            CheckpointRequestResult { status: QueueStatus { id: "IN_PROGRESS".into() }, operation: None }
        }
        CheckpointRequestStatus::Completed(id) => CheckpointRequestResult {
            status: QueueStatus { id: "COMPLETED".into() },
            operation: Some(CheckpointRequestOperation { checkpoint_id: Some(id), failure_cause: None }),
        },
        CheckpointRequestStatus::Failed(cause) => CheckpointRequestResult {
            status: QueueStatus { id: "COMPLETED".into() },
            operation: Some(CheckpointRequestOperation {
                checkpoint_id: None,
                failure_cause: Some(FailureCause { class: "CheckpointFailure".into(), stack_trace: cause }),
            }),
        },
    }))
}

/// `GET /jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}`: one vertex's
/// part of a checkpoint with each subtask's acknowledgement, as Flink's
/// `TaskCheckpointStatisticsWithSubtaskDetails`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskCheckpointDetails {
    /// The vertex's part, as in the checkpoint's `tasks`.
    #[serde(flatten)]
    pub task: TaskCheckpointStatistics,
    /// Statistics over its subtasks that acknowledged.
    pub summary: TaskCheckpointSummary,
    /// Each subtask: `completed` with its numbers, or `pending_or_failed`.
    pub subtasks: Vec<SubtaskCheckpointStatistics>,
}

/// The `summary` of [`TaskCheckpointDetails`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskCheckpointSummary {
    /// Bytes each subtask wrote.
    pub checkpointed_size: StatsSummary,
    /// Bytes of each subtask's state.
    pub state_size: StatsSummary,
    /// Milliseconds from the trigger to each subtask's acknowledgement.
    pub end_to_end_duration: StatsSummary,
    /// Milliseconds of each subtask's synchronous part (its chain's snapshot at the barrier)
    /// and asynchronous part (serializing and writing its state).
    pub checkpoint_duration: SyncAsyncSummary,
    /// Milliseconds from each subtask's first barrier to its last (`duration`); aligned
    /// checkpoints buffer and persist nothing, so the byte counts are zeros.
    pub alignment: AlignmentSummary,
    /// Milliseconds from the trigger to each subtask's first barrier.
    pub start_delay: StatsSummary,
}

/// `checkpoint_duration` of [`TaskCheckpointSummary`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SyncAsyncSummary {
    /// The synchronous parts.
    pub sync: StatsSummary,
    /// The asynchronous parts.
    #[serde(rename = "async")]
    pub async_part: StatsSummary,
}

/// `alignment` of [`TaskCheckpointSummary`].
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AlignmentSummary {
    /// Zeros (aligned checkpoints buffer nothing).
    pub buffered: StatsSummary,
    /// Zeros.
    pub processed: StatsSummary,
    /// Zeros.
    pub persisted: StatsSummary,
    /// Milliseconds from the first barrier to the last.
    pub duration: StatsSummary,
}

/// One subtask of [`TaskCheckpointDetails`], as Flink's `SubtaskCheckpointStatistics`.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskCheckpointStatistics {
    /// Flink's type tag: `completed` or `pending_or_failed`.
    #[serde(rename = "className")]
    pub class_name: String,
    /// Subtask index.
    pub index: u32,
    /// `completed`, or `pending_or_failed` (then only `index` is set).
    pub status: String,
    /// When its acknowledgement arrived, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timestamp: Option<u64>,
    /// Milliseconds from the trigger to its acknowledgement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_to_end_duration: Option<u64>,
    /// Bytes it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_size: Option<u64>,
    /// Bytes of its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_size: Option<u64>,
    /// Milliseconds of its synchronous and asynchronous parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<SyncAsync>,
    /// Its alignment: milliseconds from its first barrier to its last (bytes: zeros).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<Alignment>,
    /// Milliseconds from the trigger to its first barrier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_delay: Option<u64>,
    /// The checkpoint was unaligned (its alignment is then the time its in-flight records
    /// took to arrive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unaligned_checkpoint: Option<bool>,
    /// Whether the checkpoint was aborted (failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<bool>,
}

/// `checkpoint` of [`SubtaskCheckpointStatistics`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SyncAsync {
    /// 0.
    pub sync: u64,
    /// The end-to-end duration.
    #[serde(rename = "async")]
    pub async_part: u64,
}

/// `alignment` of [`SubtaskCheckpointStatistics`].
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Alignment {
    /// 0 (aligned checkpoints buffer nothing).
    pub buffered: u64,
    /// 0.
    pub processed: u64,
    /// 0.
    pub persisted: u64,
    /// Milliseconds from the first barrier to the last.
    pub duration: u64,
}

/// Milliseconds from the trigger of `entry` to the acknowledgement of `subtask`.
fn end_to_end(entry: &CheckpointEntry, subtask: &SubtaskCheckpoint) -> u64 {
    subtask.ack_timestamp.saturating_sub(entry.trigger_timestamp)
}

impl SubtaskCheckpointStatistics {
    /// Each of a vertex's `parallelism` subtasks in checkpoint `entry`: completed when it is
    /// among `acked` (the vertex's acknowledgements), else pending or failed.
    fn of_vertex(entry: &CheckpointEntry, acked: &[&SubtaskCheckpoint], parallelism: u32) -> Vec<Self> {
        let aborted = entry.status == CheckpointStatus::Failed;
        (0..parallelism)
            .map(|i| match acked.iter().find(|s| s.subtask == i) {
                Some(s) => SubtaskCheckpointStatistics {
                    class_name: "completed".into(),
                    index: i,
                    status: "completed".into(),
                    ack_timestamp: Some(s.ack_timestamp),
                    end_to_end_duration: Some(end_to_end(entry, s)),
                    checkpointed_size: Some(s.checkpointed_size),
                    state_size: Some(s.state_size),
                    checkpoint: Some(SyncAsync { sync: s.timings.sync_ms, async_part: s.timings.async_ms }),
                    alignment: Some(Alignment { duration: s.timings.alignment_ms, ..Alignment::default() }),
                    start_delay: Some(s.timings.start_delay_ms),
                    unaligned_checkpoint: Some(entry.unaligned),
                    aborted: Some(aborted),
                },
                None => SubtaskCheckpointStatistics {
                    class_name: "pending_or_failed".into(),
                    index: i,
                    status: "pending_or_failed".into(),
                    ..SubtaskCheckpointStatistics::default()
                },
            })
            .collect()
    }
}

impl TaskCheckpointSummary {
    /// The summaries over a vertex's acknowledgements `acked` of checkpoint `entry`.
    fn of(entry: &CheckpointEntry, acked: &[&SubtaskCheckpoint]) -> Self {
        let durations: Vec<u64> = acked.iter().map(|s| end_to_end(entry, s)).collect();
        TaskCheckpointSummary {
            checkpointed_size: StatsSummary::of(acked.iter().map(|s| s.checkpointed_size).collect()),
            state_size: StatsSummary::of(acked.iter().map(|s| s.state_size).collect()),
            end_to_end_duration: StatsSummary::of(durations),
            checkpoint_duration: SyncAsyncSummary {
                sync: StatsSummary::of(acked.iter().map(|s| s.timings.sync_ms).collect()),
                async_part: StatsSummary::of(acked.iter().map(|s| s.timings.async_ms).collect()),
            },
            alignment: AlignmentSummary {
                duration: StatsSummary::of(acked.iter().map(|s| s.timings.alignment_ms).collect()),
                ..AlignmentSummary::default()
            },
            start_delay: StatsSummary::of(acked.iter().map(|s| s.timings.start_delay_ms).collect()),
        }
    }
}

#[utoipa::path(get, path = "/jobs/{jobid}/checkpoints/details/{checkpointid}/subtasks/{vertexid}", tag = "checkpoints", summary = "One vertex's part of a checkpoint, per subtask", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("checkpointid" = u64, Path, description = "Checkpoint id"), ("vertexid" = String, Path, description = "Vertex id: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = TaskCheckpointDetails), (status = 400, description = "Not a job id or checkpoint id", body = ErrorResponse), (status = 404, description = "No such job or vertex, or the checkpoint is not in the history", body = ErrorResponse)))]
pub(crate) async fn checkpoint_subtasks(
    State(state): State<AppState>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Json<TaskCheckpointDetails>, ApiError> {
    let Path((jobid, checkpointid, vertexid)) = path?;
    let id: u64 = checkpointid
        .parse()
        .map_err(|_| ApiError::bad_request(format!("checkpoint id '{checkpointid}' is not a non-negative integer")))?;
    let job = find_job(&state.dispatcher, &jobid)?;
    let vertices = vertex_shapes(&job);
    let Some(index) = vertices.iter().position(|v| v.0 == vertexid) else {
        return Err(ApiError::not_found(format!("Vertex {vertexid} not found in job {jobid}")));
    };
    let stats = job.checkpoint_stats();
    let retained = retained_ids(&stats, job.checkpoint_settings().num_retained);
    let entry = stats.history.iter().find(|e| e.id == id).ok_or_else(|| {
        ApiError::not_found(format!(
            "Checkpoint {id} of job {jobid} is not in the checkpoint history; GET /jobs/{jobid}/checkpoints lists it"
        ))
    })?;
    let whole = CheckpointStatisticsEntry::of(entry, &vertices, &retained);
    let Some(task) = whole.tasks.into_iter().find(|(vid, _)| *vid == vertexid).map(|(_, t)| t) else {
        return Err(ApiError::not_found(format!("Vertex {vertexid} not found in job {jobid}")));
    };
    let acked: Vec<&SubtaskCheckpoint> = entry.subtasks.iter().filter(|s| s.vertex == index).collect();
    let subtasks = SubtaskCheckpointStatistics::of_vertex(entry, &acked, vertices[index].2);
    let summary = TaskCheckpointSummary::of(entry, &acked);
    let task = TaskCheckpointStatistics {
        num_acknowledged_subtasks: acked.len() as u32,
        latest_ack_timestamp: acked.iter().map(|s| s.ack_timestamp).max().unwrap_or(task.latest_ack_timestamp),
        ..task
    };
    Ok(Json(TaskCheckpointDetails { task, summary, subtasks }))
}
