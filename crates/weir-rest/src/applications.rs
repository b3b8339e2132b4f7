//! Flink 2's applications: every weir job is its own application, with the job's id;
//! cancelling an application cancels its job.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use weir_runtime::JobMaster;
use weir_runtime::status::JobOverview;

use crate::error::ApiError;
use crate::responses::{ConfigEntry, ErrorResponse};
use crate::routes::{AppState, find_job};

/// `GET /applications/overview`, as Flink's `MultipleApplicationsDetails`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationsOverview {
    /// Every application, newest first.
    pub applications: Vec<ApplicationOverview>,
}

/// What every view of an application has: its id, name, state and times.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationSummary {
    /// The application's id: its job's.
    pub id: String,
    /// Its job's name.
    pub name: String,
    /// Its job's state.
    pub status: String,
    /// When it was submitted, epoch ms.
    #[serde(rename = "start-time")]
    pub start_time: u64,
    /// When it ended, epoch ms; -1 while it runs.
    #[serde(rename = "end-time")]
    pub end_time: i64,
    /// Milliseconds from start to end (or now).
    pub duration: u64,
}

impl ApplicationSummary {
    fn of(overview: &JobOverview) -> ApplicationSummary {
        ApplicationSummary {
            id: overview.jid.clone(),
            name: overview.name.clone(),
            status: overview.state.name().to_string(),
            start_time: overview.start_time,
            end_time: overview.end_time,
            duration: overview.duration,
        }
    }
}

/// One entry of [`ApplicationsOverview`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationOverview {
    /// Id, name, state and times.
    #[serde(flatten)]
    pub summary: ApplicationSummary,
    /// Its jobs per state: its one job.
    pub jobs: BTreeMap<String, u32>,
}

/// `GET /applications/{applicationid}`, as Flink's `ApplicationDetailsInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationDetails {
    /// Id, name, state and times.
    #[serde(flatten)]
    pub summary: ApplicationSummary,
    /// For each state the job entered, when it last entered it.
    pub timestamps: BTreeMap<String, u64>,
    /// Its job, as `/jobs/overview` shows it.
    pub jobs: Vec<JobOverview>,
}

fn overview_of(job: &JobMaster) -> ApplicationOverview {
    let o = job.overview();
    ApplicationOverview { summary: ApplicationSummary::of(&o), jobs: BTreeMap::from([(o.state.name().to_string(), 1)]) }
}

#[utoipa::path(get, path = "/applications/overview", tag = "jobs", summary = "Every application (one per job)", responses((status = 200, body = ApplicationsOverview)))]
pub(crate) async fn applications_overview(State(state): State<AppState>) -> Json<ApplicationsOverview> {
    Json(ApplicationsOverview { applications: state.dispatcher.jobs().iter().rev().map(|j| overview_of(j)).collect() })
}

#[utoipa::path(get, path = "/applications/{applicationid}", tag = "jobs", summary = "One application and its job", params(("applicationid" = String, Path, description = "Application id: its job's id, 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = ApplicationDetails), (status = 400, description = "Not an application id", body = ErrorResponse), (status = 404, description = "No such application", body = ErrorResponse)))]
pub(crate) async fn application(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ApplicationDetails>, ApiError> {
    let Path(id) = id?;
    let job = find_job(&state.dispatcher, &id)?;
    let details = job.details();
    let overview = job.overview();
    Ok(Json(ApplicationDetails {
        summary: ApplicationSummary::of(&overview),
        timestamps: details.timestamps,
        jobs: vec![overview],
    }))
}

/// `GET /applications/{applicationid}/exceptions`, as Flink's
/// `ApplicationExceptionsInfoWithHistory`: its job's failures, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationExceptions {
    /// The failures.
    #[serde(rename = "exceptionHistory")]
    pub exception_history: ApplicationExceptionHistory,
}

/// The `exceptionHistory` of [`ApplicationExceptions`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationExceptionHistory {
    /// One per failure of its job, newest first.
    pub entries: Vec<ApplicationException>,
}

/// One failure of an application's job.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationException {
    /// Error class.
    #[serde(rename = "exceptionName")]
    pub exception_name: String,
    /// Full message.
    pub stacktrace: String,
    /// When, epoch ms.
    pub timestamp: u64,
    /// The job that failed.
    #[serde(rename = "jobId")]
    pub job_id: String,
}

#[utoipa::path(get, path = "/applications/{applicationid}/exceptions", tag = "jobs", summary = "An application's failures: its job's, newest first", params(("applicationid" = String, Path, description = "Application id: its job's id, 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = ApplicationExceptions), (status = 400, description = "Not an application id", body = ErrorResponse), (status = 404, description = "No such application", body = ErrorResponse)))]
pub(crate) async fn application_exceptions(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ApplicationExceptions>, ApiError> {
    let Path(id) = id?;
    let job = find_job(&state.dispatcher, &id)?;
    let job_id = job.job_id().to_string();
    let entries = job
        .exceptions()
        .into_iter()
        .map(|e| ApplicationException {
            exception_name: e.exception_name,
            stacktrace: e.stacktrace,
            timestamp: e.timestamp,
            job_id: job_id.clone(),
        })
        .collect();
    Ok(Json(ApplicationExceptions { exception_history: ApplicationExceptionHistory { entries } }))
}

#[utoipa::path(get, path = "/applications/{applicationid}/jobmanager/config", tag = "jobs", summary = "The configuration of the JobManager running the application (secrets masked)", params(("applicationid" = String, Path, description = "Application id: its job's id, 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = Vec<ConfigEntry>), (status = 400, description = "Not an application id", body = ErrorResponse), (status = 404, description = "No such application", body = ErrorResponse)))]
pub(crate) async fn application_jobmanager_config(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<ConfigEntry>>, ApiError> {
    let Path(id) = id?;
    find_job(&state.dispatcher, &id)?;
    Ok(Json(crate::routes::config_entries(&state)))
}

#[utoipa::path(post, path = "/applications/{applicationid}/cancel", tag = "jobs", summary = "Cancel an application: its job", params(("applicationid" = String, Path, description = "Application id: its job's id, 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 202, description = "Cancel requested: `{}`"), (status = 400, description = "Not an application id", body = ErrorResponse), (status = 404, description = "No such application", body = ErrorResponse), (status = 409, description = "The application's job already ended", body = ErrorResponse)))]
pub(crate) async fn cancel_application(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<serde_json::Map<String, serde_json::Value>>), ApiError> {
    let Path(id) = id?;
    let job = find_job(&state.dispatcher, &id)?;
    match job.cancel() {
        Ok(()) => {
            tracing::info!(job_id = %job.job_id(), "application cancel requested over REST");
            Ok((StatusCode::ACCEPTED, Json(serde_json::Map::new())))
        }
        Err(status) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Application {} is already {status}; only running applications can be cancelled", job.job_id()),
        )),
    }
}
