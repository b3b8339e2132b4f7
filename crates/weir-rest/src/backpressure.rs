//! `GET /jobs/{jobid}/vertices/{vertexid}/backpressure`: the share of wall time each subtask
//! spent blocked on full output channels, measured over a recent window, with Flink's levels
//! (`ok` up to 10 %, `low` up to 50 %, `high` above).
//!
//! Subtasks only add to a counter of blocked milliseconds; the ratio is the counter's growth
//! between two readings. A reading is kept per vertex, so a client polling every few seconds
//! (the Web UI) gets the ratio since its previous poll; without a recent reading the handler
//! takes two, [`SAMPLE_WINDOW`] apart.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use weir_types::lifecycle::now_ms;

use crate::error::ApiError;
use crate::responses::ErrorResponse;
use crate::routes::{AppState, find_vertex};

/// How long the handler measures when it has no recent reading.
const SAMPLE_WINDOW: Duration = Duration::from_millis(500);
/// Readings younger than this are too short a window; older ones too stale.
const MIN_WINDOW: Duration = Duration::from_millis(200);
const MAX_WINDOW: Duration = Duration::from_secs(60);

/// One reading of a vertex: when, and each subtask's blocked milliseconds.
type Reading = (Instant, Vec<u64>);

/// The last reading of each (job, vertex).
#[derive(Default)]
pub(crate) struct BackpressureReadings {
    readings: Mutex<HashMap<(String, String), Reading>>,
}

/// The backpressure of one vertex.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VertexBackPressure {
    /// Always `ok` (the measurement is never deferred).
    pub status: String,
    /// The worst subtask's level: `ok`, `low` or `high`.
    #[serde(rename = "backpressure-level")]
    pub backpressure_level: String,
    /// The same level under Flink 1.13+'s name.
    #[serde(rename = "backpressureLevel")]
    pub backpressure_level_camel: String,
    /// When the window ended, epoch ms.
    #[serde(rename = "end-timestamp")]
    pub end_timestamp: u64,
    /// Each subtask.
    pub subtasks: Vec<SubtaskBackPressure>,
}

/// One subtask of [`VertexBackPressure`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubtaskBackPressure {
    /// Subtask index.
    pub subtask: u32,
    /// The subtask's attempt (the job's restarts so far).
    #[serde(rename = "attempt-number")]
    pub attempt_number: u32,
    /// `ok`, `low` or `high`.
    #[serde(rename = "backpressure-level")]
    pub backpressure_level: String,
    /// The same level under Flink 1.13+'s name.
    #[serde(rename = "backpressureLevel")]
    pub backpressure_level_camel: String,
    /// Share of the window spent blocked, 0.0 to 1.0.
    pub ratio: f64,
    /// Always 0.0: weir does not measure idle time.
    #[serde(rename = "idleRatio")]
    pub idle_ratio: f64,
    /// Always 0.0: weir does not measure busy time.
    #[serde(rename = "busyRatio")]
    pub busy_ratio: f64,
    /// Always empty: weir runs no speculative attempts.
    #[serde(rename = "other-concurrent-attempts")]
    pub other_concurrent_attempts: Vec<serde_json::Value>,
}

/// Flink's levels.
fn level(ratio: f64) -> &'static str {
    if ratio <= 0.10 {
        "ok"
    } else if ratio <= 0.5 {
        "low"
    } else {
        "high"
    }
}

fn read(state: &AppState, jobid: &str, vertexid: &str) -> Result<(Vec<u64>, u32), ApiError> {
    let vertex = find_vertex(&state.dispatcher, jobid, vertexid)?;
    let attempt = vertex.subtasks.first().map(|s| s.attempt).unwrap_or(0);
    Ok((vertex.subtasks.iter().map(|s| s.metrics.backpressured_ms).collect(), attempt))
}

/// The ratio of each subtask between two readings.
fn ratios(before: &[u64], after: &[u64], elapsed: Duration) -> Vec<f64> {
    let window_ms = (elapsed.as_secs_f64() * 1000.0).max(1.0);
    after
        .iter()
        .enumerate()
        .map(|(i, now)| {
            let then = before.get(i).copied().unwrap_or(0);
            (now.saturating_sub(then) as f64 / window_ms).clamp(0.0, 1.0)
        })
        .collect()
}

#[utoipa::path(get, path = "/jobs/{jobid}/vertices/{vertexid}/backpressure", tag = "jobs", summary = "Share of time each subtask was blocked on full output channels", params(("jobid" = String, Path, description = "Job id: 32 hex characters", pattern = "^[0-9a-f]{32}$"), ("vertexid" = String, Path, description = "Vertex id, from the job's `vertices` or `plan`: 32 hex characters", pattern = "^[0-9a-f]{32}$")), responses((status = 200, body = VertexBackPressure), (status = 400, description = "Not a job id", body = ErrorResponse), (status = 404, description = "No such job or vertex", body = ErrorResponse)))]
pub(crate) async fn backpressure(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<VertexBackPressure>, ApiError> {
    let Path((jobid, vertexid)) = ids?;
    let key = (jobid.clone(), vertexid.clone());
    let previous = {
        let readings = state.backpressure.readings.lock().unwrap_or_else(|p| p.into_inner());
        readings.get(&key).cloned()
    };
    let (mut current, mut attempt) = read(&state, &jobid, &vertexid)?;
    let mut at = Instant::now();
    let (before, since) = match previous {
        Some((then, before))
            if before.len() == current.len() && (MIN_WINDOW..=MAX_WINDOW).contains(&at.duration_since(then)) =>
        {
            (before, then)
        }
        _ => {
            let (before, since) = (current, at);
            tokio::time::sleep(SAMPLE_WINDOW).await;
            (current, attempt) = read(&state, &jobid, &vertexid)?;
            at = Instant::now();
            (before, since)
        }
    };
    let ratios = ratios(&before, &current, at.duration_since(since));
    state.backpressure.readings.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (at, current));
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    Ok(Json(VertexBackPressure {
        status: "ok".into(),
        backpressure_level: level(worst).into(),
        backpressure_level_camel: level(worst).into(),
        end_timestamp: now_ms(),
        subtasks: ratios
            .into_iter()
            .enumerate()
            .map(|(i, ratio)| SubtaskBackPressure {
                subtask: i as u32,
                attempt_number: attempt,
                backpressure_level: level(ratio).into(),
                backpressure_level_camel: level(ratio).into(),
                ratio: (ratio * 100.0).round() / 100.0,
                idle_ratio: 0.0,
                busy_ratio: 0.0,
                other_concurrent_attempts: Vec::new(),
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_flink_thresholds() {
        assert_eq!(level(0.0), "ok");
        assert_eq!(level(0.10), "ok");
        assert_eq!(level(0.11), "low");
        assert_eq!(level(0.5), "low");
        assert_eq!(level(0.51), "high");
    }

    #[test]
    fn ratio_is_growth_over_window_clamped() {
        let r = ratios(&[0, 100, 50], &[250, 100, 5000], Duration::from_millis(500));
        assert_eq!(r, vec![0.5, 0.0, 1.0]);
        // A subtask that appeared since the last reading counts from zero.
        assert_eq!(ratios(&[], &[100], Duration::from_millis(1000)), vec![0.1]);
    }
}
