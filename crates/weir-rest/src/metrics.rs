//! `GET /metrics`: Prometheus text for every job the dispatcher knows, built from the job
//! records at scrape time into a fresh registry (nothing global, nothing on the hot path:
//! subtasks only bump their atomic counters).

use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_runtime::checkpointing::stats::CheckpointStatus;
use weir_types::Lifecycle;
use weir_types::lifecycle::now_ms;

use crate::error::ApiError;
use crate::routes::AppState;

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter<u64, AtomicU64>>;
type Gauges = Family<Labels, Gauge<i64>>;

/// The metric families of one scrape.
#[derive(Default)]
struct Families {
    records_in: Counters,
    records_out: Counters,
    backpressured_ms: Counters,
    operator_records_in: Counters,
    operator_records_out: Counters,
    restarts: Counters,
    uptime_ms: Gauges,
    job_state: Gauges,
    checkpoints_completed: Counters,
    checkpoints_failed: Counters,
    checkpoints_in_progress: Gauges,
    last_checkpoint_duration_ms: Gauges,
    last_checkpoint_size_bytes: Gauges,
    leader_epoch: Gauges,
    leader_since_ms: Gauges,
    split_offset: Gauges,
    split_lag: Gauges,
    records_skipped: Counters,
    input_watermark: Gauges,
    records_late: Counters,
}

impl Families {
    fn register(&self, registry: &mut Registry) {
        let subtask = "per subtask (labels job_id, job_name, task, subtask)";
        registry.register(
            "weir_task_records_in",
            format!("records a subtask received {subtask}"),
            self.records_in.clone(),
        );
        registry.register(
            "weir_task_records_out",
            format!("records a subtask emitted {subtask}"),
            self.records_out.clone(),
        );
        registry.register(
            "weir_task_backpressured_time_ms",
            format!("milliseconds a subtask waited for downstream capacity {subtask}"),
            self.backpressured_ms.clone(),
        );
        let operator = "per chained operator (labels job_id, job_name, task, operator: its uid, subtask)";
        registry.register(
            "weir_operator_records_in",
            format!("records an operator received {operator}"),
            self.operator_records_in.clone(),
        );
        registry.register(
            "weir_operator_records_out",
            format!("records an operator emitted {operator}"),
            self.operator_records_out.clone(),
        );
        let split = "per source split (labels job_id, job_name, task, subtask, split: <topic>-<partition> for Kafka)";
        registry.register(
            "weir_source_split_current_offset",
            format!("the next offset a source reads {split}"),
            self.split_offset.clone(),
        );
        registry.register(
            "weir_source_split_lag",
            format!("records between a source's position and the split's end (Kafka: the partition's high watermark) {split}"),
            self.split_lag.clone(),
        );
        registry.register(
            "weir_source_records_skipped",
            format!("records a source skipped because they could not be deserialised {subtask}"),
            self.records_skipped.clone(),
        );
        registry.register(
            "weir_task_current_input_watermark",
            format!("the subtask's input watermark, epoch ms (Flink's currentInputWatermark; absent before the first) {subtask}"),
            self.input_watermark.clone(),
        );
        registry.register(
            "weir_task_late_records",
            format!("records that came after the watermark passed their windows (dropped or sent to a late-data side output) {subtask}"),
            self.records_late.clone(),
        );
        registry.register("weir_job_restarts", "restarts after failures (Flink's numRestarts)", self.restarts.clone());
        registry.register("weir_job_uptime_ms", "milliseconds since the job started running", self.uptime_ms.clone());
        registry.register("weir_job_state", "1 for the job's current state (label state)", self.job_state.clone());
        registry.register(
            "weir_job_checkpoints_completed",
            "completed checkpoints",
            self.checkpoints_completed.clone(),
        );
        registry.register("weir_job_checkpoints_failed", "failed checkpoints", self.checkpoints_failed.clone());
        registry.register(
            "weir_job_checkpoints_in_progress",
            "checkpoints in progress",
            self.checkpoints_in_progress.clone(),
        );
        registry.register(
            "weir_job_last_checkpoint_duration_ms",
            "end-to-end duration of the latest completed checkpoint",
            self.last_checkpoint_duration_ms.clone(),
        );
        registry.register(
            "weir_job_last_checkpoint_size_bytes",
            "state size of the latest completed checkpoint",
            self.last_checkpoint_size_bytes.clone(),
        );
        registry.register(
            "weir_jobmanager_leader_epoch",
            "high availability: the leadership epoch of the leader JobManager (label leader: its id); it grows with every change of leader",
            self.leader_epoch.clone(),
        );
        registry.register(
            "weir_jobmanager_leader_since_ms",
            "high availability: when the leader JobManager was elected, epoch milliseconds",
            self.leader_since_ms.clone(),
        );
    }
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The Prometheus text of every job's metrics.
pub(crate) fn render(state: &AppState) -> Result<String, std::fmt::Error> {
    let families = Families::default();
    for job in state.dispatcher.jobs() {
        let details = job.details();
        let job_labels: Labels =
            vec![("job_id".into(), details.jid.clone()), ("job_name".into(), details.name.clone())];
        families.restarts.get_or_create(&job_labels).inc_by(u64::from(details.num_restarts));
        let mut with_state = job_labels.clone();
        with_state.push(("state".into(), details.state.to_string()));
        families.job_state.get_or_create(&with_state).set(1);
        if !details.state.is_terminal() {
            families.uptime_ms.get_or_create(&job_labels).set(gauge_value(now_ms().saturating_sub(details.start_time)));
        }
        for vertex in &details.vertices {
            for subtask in &vertex.subtasks {
                let mut labels = job_labels.clone();
                labels.push(("task".into(), vertex.name.clone()));
                labels.push(("subtask".into(), subtask.subtask.to_string()));
                families.records_in.get_or_create(&labels).inc_by(subtask.metrics.read_records);
                families.records_out.get_or_create(&labels).inc_by(subtask.metrics.write_records);
                families.backpressured_ms.get_or_create(&labels).inc_by(subtask.metrics.backpressured_ms);
                if subtask.skipped_records > 0 {
                    families.records_skipped.get_or_create(&labels).inc_by(subtask.skipped_records);
                }
                if let Some(watermark) = subtask.input_watermark {
                    families.input_watermark.get_or_create(&labels).set(watermark);
                }
                if subtask.late_records > 0 {
                    families.records_late.get_or_create(&labels).inc_by(subtask.late_records);
                }
                for split in &subtask.splits {
                    let mut labels = labels.clone();
                    labels.push(("split".into(), split.split.clone()));
                    families.split_offset.get_or_create(&labels).set(split.current_offset);
                    if let Some(lag) = split.lag {
                        families.split_lag.get_or_create(&labels).set(lag);
                    }
                }
                for operator in &subtask.operators {
                    let mut labels = job_labels.clone();
                    labels.push(("task".into(), vertex.name.clone()));
                    labels.push(("operator".into(), operator.uid.clone()));
                    labels.push(("subtask".into(), subtask.subtask.to_string()));
                    families.operator_records_in.get_or_create(&labels).inc_by(operator.read_records);
                    families.operator_records_out.get_or_create(&labels).inc_by(operator.write_records);
                }
            }
        }
        let stats = job.checkpoint_stats();
        families.checkpoints_completed.get_or_create(&job_labels).inc_by(stats.completed);
        families.checkpoints_failed.get_or_create(&job_labels).inc_by(stats.failed);
        families.checkpoints_in_progress.get_or_create(&job_labels).set(gauge_value(stats.in_progress));
        let latest = stats.history.iter().filter(|c| c.status == CheckpointStatus::Completed).max_by_key(|c| c.id);
        if let Some(latest) = latest {
            families
                .last_checkpoint_duration_ms
                .get_or_create(&job_labels)
                .set(gauge_value(latest.end_to_end_duration));
            families.last_checkpoint_size_bytes.get_or_create(&job_labels).set(gauge_value(latest.state_size));
        }
    }
    if let Some(ha) = state.cluster.ha_overview.as_ref().and_then(|ha| ha()) {
        let labels: Labels = vec![("leader".into(), ha.leader_id.clone())];
        families.leader_epoch.get_or_create(&labels).set(ha.epoch);
        families.leader_since_ms.get_or_create(&labels).set(gauge_value(ha.leader_since));
    }
    let mut registry = Registry::default();
    families.register(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "monitoring", summary = "Prometheus metrics of every job and subtask", responses((status = 200, description = "OpenMetrics text (documented in docs/rest-api.md)", content_type = "application/openmetrics-text", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = render(&state).map_err(|e| {
        ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics failed: {e}"))
    })?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text))
}
