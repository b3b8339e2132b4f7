//! Flink 2's applications: every weir job is its own application, with the job's id.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use weir_runtime::JobMaster;
use weir_runtime::status::JobOverview;

use crate::error::ApiError;
use crate::responses::ErrorResponse;
use crate::routes::{AppState, find_job};

/// `GET /applications/overview`, as Flink's `MultipleApplicationsDetails`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationsOverview {
    /// Every application, newest first.
    pub applications: Vec<ApplicationOverview>,
}

/// One entry of [`ApplicationsOverview`].
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationOverview {
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
    /// Its jobs per state: its one job.
    pub jobs: BTreeMap<String, u32>,
}

/// `GET /applications/{applicationid}`, as Flink's `ApplicationDetailsInfo`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApplicationDetails {
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
    /// For each state the job entered, when it last entered it.
    pub timestamps: BTreeMap<String, u64>,
    /// Its job, as `/jobs/overview` shows it.
    pub jobs: Vec<JobOverview>,
}

fn overview_of(job: &JobMaster) -> ApplicationOverview {
    let o = job.overview();
    ApplicationOverview {
        id: o.jid.clone(),
        name: o.name.clone(),
        status: o.state.name().to_string(),
        start_time: o.start_time,
        end_time: o.end_time,
        duration: o.duration,
        jobs: BTreeMap::from([(o.state.name().to_string(), 1)]),
    }
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
        id: overview.jid.clone(),
        name: overview.name.clone(),
        status: overview.state.name().to_string(),
        start_time: overview.start_time,
        end_time: overview.end_time,
        duration: overview.duration,
        timestamps: details.timestamps,
        jobs: vec![overview],
    }))
}
