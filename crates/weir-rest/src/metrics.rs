//! `GET /metrics`: Prometheus text for every job the dispatcher knows, built from the job
//! records at scrape time into a fresh registry (nothing on the hot path: subtasks only bump
//! their atomic counters).
//!
//! Two sets of names: weir's own (`weir_*`), and Flink's PrometheusReporter names
//! (`flink_<scope>_<metric>` with Flink's labels, [`flink`]) for what weir measures with the
//! same meaning, so dashboards built for Flink work. The only state kept between scrapes is
//! the last readings of each subtask's blocked milliseconds and record counts (and its
//! operators'), for Flink's per-second gauges (`backPressuredTimeMsPerSecond`,
//! `numRecordsInPerSecond`, `numRecordsOutPerSecond`).

use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_runtime::JobDetails;
use weir_runtime::checkpointing::stats::{CheckpointStats, CheckpointStatus};
use weir_runtime::status::SubtaskDetails;
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
    operator_state_size_bytes: Gauges,
    leader_epoch: Gauges,
    leader_since_ms: Gauges,
    split_offset: Gauges,
    split_lag: Gauges,
    records_skipped: Counters,
    records_send_errors: Counters,
    input_watermark: Gauges,
    records_late: Counters,
}

/// The help suffix of the per-subtask families.
const PER_SUBTASK: &str = "per subtask (labels job_id, job_name, task, subtask)";

impl Families {
    /// Registers every family, in the order the scrape lists them.
    fn register(&self, registry: &mut Registry) {
        self.register_tasks(registry);
        self.register_sources_and_event_time(registry);
        self.register_jobs(registry);
        self.register_leader(registry);
    }

    /// Subtasks' and chained operators' record counts and backpressure.
    fn register_tasks(&self, registry: &mut Registry) {
        registry.register(
            "weir_task_records_in",
            format!("records a subtask received {PER_SUBTASK}"),
            self.records_in.clone(),
        );
        registry.register(
            "weir_task_records_out",
            format!("records a subtask emitted {PER_SUBTASK}"),
            self.records_out.clone(),
        );
        registry.register(
            "weir_task_backpressured_time_ms",
            format!("milliseconds a subtask waited for downstream capacity {PER_SUBTASK}"),
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
    }

    /// Sources' split positions and skipped records; input watermarks and late records.
    fn register_sources_and_event_time(&self, registry: &mut Registry) {
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
            format!("records a source skipped because they could not be deserialised {PER_SUBTASK}"),
            self.records_skipped.clone(),
        );
        registry.register(
            "weir_sink_records_send_errors",
            format!("records a sink could not write, refused by the external system or its client (Flink's numRecordsSendErrors) {PER_SUBTASK}"),
            self.records_send_errors.clone(),
        );
        registry.register(
            "weir_task_current_input_watermark",
            format!("the subtask's input watermark, epoch ms (Flink's currentInputWatermark; absent before the first) {PER_SUBTASK}"),
            self.input_watermark.clone(),
        );
        registry.register(
            "weir_task_late_records",
            format!("records that came after the watermark passed their windows (dropped or sent to a late-data side output) {PER_SUBTASK}"),
            self.records_late.clone(),
        );
    }

    /// Per job: restarts, uptime, state and checkpoints.
    fn register_jobs(&self, registry: &mut Registry) {
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
            "weir_operator_state_size_bytes",
            "bytes of an operator's state, over its subtasks, in the latest completed checkpoint (labels job_id, job_name, operator: its uid)",
            self.operator_state_size_bytes.clone(),
        );
    }

    /// High availability: the leader JobManager.
    fn register_leader(&self, registry: &mut Registry) {
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

    /// A job's restarts, its state, and while it has not ended its uptime; the job's labels.
    fn job(&self, details: &JobDetails) -> Labels {
        let job_labels: Labels =
            vec![("job_id".into(), details.jid.clone()), ("job_name".into(), details.name.clone())];
        self.restarts.get_or_create(&job_labels).inc_by(u64::from(details.num_restarts));
        let mut with_state = job_labels.clone();
        with_state.push(("state".into(), details.state.to_string()));
        self.job_state.get_or_create(&with_state).set(1);
        if !details.state.is_terminal() {
            self.uptime_ms.get_or_create(&job_labels).set(gauge_value(now_ms().saturating_sub(details.start_time)));
        }
        job_labels
    }

    /// One subtask's counters, its splits' and its chained operators'.
    fn subtask(&self, job_labels: &Labels, task: &str, subtask: &SubtaskDetails) {
        let mut labels = job_labels.clone();
        labels.push(("task".into(), task.to_string()));
        labels.push(("subtask".into(), subtask.subtask.to_string()));
        self.records_in.get_or_create(&labels).inc_by(subtask.metrics.read_records);
        self.records_out.get_or_create(&labels).inc_by(subtask.metrics.write_records);
        self.backpressured_ms.get_or_create(&labels).inc_by(subtask.metrics.backpressured_ms);
        if subtask.skipped_records > 0 {
            self.records_skipped.get_or_create(&labels).inc_by(subtask.skipped_records);
        }
        if subtask.send_errors > 0 {
            self.records_send_errors.get_or_create(&labels).inc_by(subtask.send_errors);
        }
        if let Some(watermark) = subtask.input_watermark {
            self.input_watermark.get_or_create(&labels).set(watermark);
        }
        if subtask.late_records > 0 {
            self.records_late.get_or_create(&labels).inc_by(subtask.late_records);
        }
        for split in &subtask.splits {
            let mut labels = labels.clone();
            labels.push(("split".into(), split.split.clone()));
            self.split_offset.get_or_create(&labels).set(split.current_offset);
            if let Some(lag) = split.lag {
                self.split_lag.get_or_create(&labels).set(lag);
            }
        }
        for operator in &subtask.operators {
            let mut labels = job_labels.clone();
            labels.push(("task".into(), task.to_string()));
            labels.push(("operator".into(), operator.uid.clone()));
            labels.push(("subtask".into(), subtask.subtask.to_string()));
            self.operator_records_in.get_or_create(&labels).inc_by(operator.read_records);
            self.operator_records_out.get_or_create(&labels).inc_by(operator.write_records);
        }
    }

    /// A job's checkpoint counts and its latest completed checkpoint's duration and size.
    fn checkpoints(&self, job_labels: &Labels, stats: &CheckpointStats) {
        self.checkpoints_completed.get_or_create(job_labels).inc_by(stats.completed);
        self.checkpoints_failed.get_or_create(job_labels).inc_by(stats.failed);
        self.checkpoints_in_progress.get_or_create(job_labels).set(gauge_value(stats.in_progress));
        let latest = stats.history.iter().filter(|c| c.status == CheckpointStatus::Completed).max_by_key(|c| c.id);
        if let Some(latest) = latest {
            self.last_checkpoint_duration_ms.get_or_create(job_labels).set(gauge_value(latest.end_to_end_duration));
            self.last_checkpoint_size_bytes.get_or_create(job_labels).set(gauge_value(latest.state_size));
            for (uid, bytes) in &latest.operator_sizes {
                let mut labels = job_labels.clone();
                labels.push(("operator".into(), uid.clone()));
                self.operator_state_size_bytes.get_or_create(&labels).set(gauge_value(*bytes));
            }
        }
    }
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The Prometheus text of every job's metrics.
pub(crate) fn render(state: &AppState) -> Result<String, std::fmt::Error> {
    let families = Families::default();
    let mut flink = flink::FlinkMetrics::new(state);
    for job in state.dispatcher.jobs() {
        let details = job.details();
        let job_labels = families.job(&details);
        for vertex in &details.vertices {
            for subtask in &vertex.subtasks {
                families.subtask(&job_labels, &vertex.name, subtask);
            }
        }
        let stats = job.checkpoint_stats();
        families.checkpoints(&job_labels, &stats);
        flink.job(&job, &details, &stats);
    }
    if let Some(ha) = state.cluster.ha_overview.as_ref().and_then(|ha| ha()) {
        let labels: Labels = vec![("leader".into(), ha.leader_id.clone())];
        families.leader_epoch.get_or_create(&labels).set(ha.epoch);
        families.leader_since_ms.get_or_create(&labels).set(gauge_value(ha.leader_since));
    }
    let mut registry = Registry::default();
    families.register(&mut registry);
    flink.register(&mut registry);
    register_process(&mut registry);
    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// Prometheus's standard process metrics (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, ...), as its client libraries export them.
fn register_process(registry: &mut Registry) {
    let Some(stats) = crate::process::ProcessStats::read() else { return };
    let cpu = Counter::<f64, AtomicU64>::default();
    cpu.inc_by(stats.cpu_ns as f64 / 1e9);
    registry.register("process_cpu_seconds", "User and system CPU time spent, seconds", cpu);
    for (name, help, value) in [
        ("process_resident_memory_bytes", "Resident memory size, bytes", stats.resident_bytes),
        ("process_virtual_memory_bytes", "Virtual memory size, bytes", stats.virtual_bytes),
        ("process_threads", "Threads of the process", stats.threads),
        ("process_open_fds", "Open file descriptors", stats.open_fds),
        (
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, seconds",
            stats.start_time_seconds,
        ),
    ] {
        let gauge = Gauge::<i64>::default();
        gauge.set(gauge_value(value));
        registry.register(name, help, gauge);
    }
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "monitoring", summary = "Prometheus metrics of every job and subtask", responses((status = 200, description = "OpenMetrics text (documented in docs/rest-api.md)", content_type = "application/openmetrics-text", body = String)))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = render(&state).map_err(|e| {
        ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics failed: {e}"))
    })?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text))
}

/// Flink's PrometheusReporter names for what weir measures with the same meaning. The
/// reporter names a metric `flink_` + its group's logical scope (`jobmanager`,
/// `jobmanager_job`, `taskmanager_job_task`, `taskmanager_job_task_operator`) + `_` + the
/// metric's name, labels it with the group's variables (`job_id`, `task_name` ...), keeps
/// only `[a-zA-Z0-9:_]` in label values (other characters become `_`, its default), and
/// exposes counters, gauges and meters all as gauges, helped `<name> (scope: <scope>)`.
///
/// As in Flink, a job's metrics exist while the job runs (Flink closes the group when the job
/// ends) and a subtask's from its deployment until it ends.
mod flink {
    use std::collections::BTreeMap;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
    use prometheus_client::registry::Registry;
    use weir_runtime::checkpointing::stats::{CheckpointStats, CheckpointStatus};
    use weir_runtime::cluster::TaskManagerInfo;
    use weir_runtime::jobgraph::operator_id;
    use weir_runtime::status::SubtaskDetails;
    use weir_runtime::{JobDetails, JobMaster};
    use weir_types::lifecycle::now_ms;
    use weir_types::{ExecutionState, JobStatus, Lifecycle};

    use std::sync::atomic::AtomicU64;

    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;

    use super::{Gauges, Labels, gauge_value};

    /// Gauges of rates (Flink's meters), which are not whole numbers.
    type RateGauges = Family<Labels, Gauge<f64, AtomicU64>>;

    /// One Flink metric family of a scrape.
    #[derive(Debug)]
    enum FlinkFamily {
        Whole(Gauges),
        Rate(RateGauges),
    }
    use crate::routes::AppState;

    const JOBMANAGER: &str = "jobmanager";
    const JOB: &str = "jobmanager_job";
    const TASK: &str = "taskmanager_job_task";
    const OPERATOR: &str = "taskmanager_job_task_operator";

    /// The embedded cluster's one TaskManager, as `GET /taskmanagers` names it.
    const EMBEDDED_TASKMANAGER: &str = "embedded";

    /// Flink cuts operator names to this many characters in its metric groups.
    const OPERATOR_NAME_MAX_LENGTH: usize = 80;

    /// The job states with a `<state>Time` gauge in Flink (the non-terminal ones but
    /// RECONCILING; `metrics.job.status.enable`'s default `CURRENT_TIME`).
    const TIMED_STATES: [(JobStatus, &str); 6] = [
        (JobStatus::Initializing, "initializingTime"),
        (JobStatus::Created, "createdTime"),
        (JobStatus::Running, "runningTime"),
        (JobStatus::Failing, "failingTime"),
        (JobStatus::Cancelling, "cancellingTime"),
        (JobStatus::Restarting, "restartingTime"),
    ];

    use crate::rates::{RATE_WINDOW_MAX, READINGS, SubtaskKey, per_second, time_per_second};

    /// Records per second a counter of `key` grew, Flink's `numRecordsInPerSecond` and
    /// `numRecordsOutPerSecond` meters (Flink's average over its last minute; here over the
    /// time since an earlier scrape at least a second before), to a thousandth.
    fn records_per_second(key: &SubtaskKey, counter: String, now: Instant, records: u64) -> Option<f64> {
        let rate = per_second((key.clone(), counter), now, records)?;
        Some((rate * 1000.0).round() / 1000.0)
    }

    /// A label value as Flink's reporter filters it: `[a-zA-Z0-9:_]` kept, the rest `_`.
    fn label_value(value: &str) -> String {
        value.chars().map(|c| if c.is_ascii_alphanumeric() || c == ':' || c == '_' { c } else { '_' }).collect()
    }

    fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
        pairs.iter().map(|(name, value)| (name.to_string(), label_value(value))).collect()
    }

    /// The host part of a TaskManager's data address (`host:port`).
    fn host_of(address: &str) -> &str {
        address.rsplit_once(':').map_or(address, |(host, _)| host)
    }

    /// Whether a subtask in `state` has Flink task metrics: from its deployment until it ends.
    fn deployed(state: ExecutionState) -> bool {
        !matches!(state, ExecutionState::Created | ExecutionState::Scheduled) && !state.is_terminal()
    }

    /// Each subtask's late records that were dropped (not sent to a late-data side output),
    /// by vertex and subtask index.
    fn late_dropped(job: &JobMaster) -> Vec<Vec<u64>> {
        job.record()
            .subtasks
            .iter()
            .map(|vertex| vertex.iter().map(|s| s.metrics.records_late_dropped.load(Ordering::Relaxed)).collect())
            .collect()
    }

    /// The operators chained in one task.
    struct Chain<'a> {
        /// Whether its head is a source.
        is_source: bool,
        /// Their names, head first, as the task's name lists them.
        names: Vec<&'a str>,
    }

    /// One deployed subtask in a scrape.
    struct SubtaskScrape<'a> {
        subtask: &'a SubtaskDetails,
        /// Its attempt, for the per-second readings.
        key: SubtaskKey,
        /// Its task's labels.
        labels: Labels,
        /// Its input watermark.
        watermark: i64,
    }

    /// The Flink gauges of one scrape.
    pub(super) struct FlinkMetrics {
        /// Gauges by (scope, metric name), in the order they are exposed.
        gauges: BTreeMap<(&'static str, &'static str), FlinkFamily>,
        /// The JobManager's host: `jobmanager.rpc.address` when set, else Flink's default
        /// for it, `localhost`.
        host: String,
        /// The registered TaskManagers; `None` on an embedded cluster.
        taskmanagers: Option<Vec<TaskManagerInfo>>,
        /// Jobs with metrics (not ended).
        running_jobs: u64,
        /// When the scrape began: epoch ms, and the monotonic clock.
        now_ms: u64,
        now: Instant,
    }

    impl FlinkMetrics {
        /// The JobManager's cluster gauges (`flink_jobmanager_*`).
        pub(super) fn new(state: &AppState) -> FlinkMetrics {
            let host = state
                .cluster
                .configuration
                .iter()
                .find(|(key, _)| key == "jobmanager.rpc.address")
                .map_or_else(|| "localhost".to_string(), |(_, value)| value.clone());
            let now = Instant::now();
            READINGS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .retain(|_, r| now.saturating_duration_since(r.newest.0) <= RATE_WINDOW_MAX);
            let mut metrics = FlinkMetrics {
                gauges: BTreeMap::new(),
                host,
                taskmanagers: state.cluster.taskmanager_list.as_ref().map(|list| list()),
                running_jobs: 0,
                now_ms: now_ms(),
                now,
            };
            // As `GET /overview` counts them.
            let (taskmanagers, slots, free) = match &metrics.taskmanagers {
                Some(list) => (
                    list.len() as u64,
                    list.iter().map(|tm| u64::from(tm.slots_number)).sum(),
                    list.iter().map(|tm| u64::from(tm.free_slots)).sum(),
                ),
                None => (
                    u64::from(state.cluster.taskmanagers),
                    u64::from(state.cluster.slots_total),
                    u64::from(state.cluster.slots_total.saturating_sub(state.dispatcher.busy_subtasks())),
                ),
            };
            let jm = labels([("host", &metrics.host)]);
            metrics.set(JOBMANAGER, "numRegisteredTaskManagers", &jm, gauge_value(taskmanagers));
            metrics.set(JOBMANAGER, "taskSlotsTotal", &jm, gauge_value(slots));
            metrics.set(JOBMANAGER, "taskSlotsAvailable", &jm, gauge_value(free));
            metrics
        }

        fn set(&mut self, scope: &'static str, name: &'static str, labels: &Labels, value: i64) {
            let family = self.gauges.entry((scope, name)).or_insert_with(|| FlinkFamily::Whole(Gauges::default()));
            if let FlinkFamily::Whole(family) = family {
                family.get_or_create(labels).set(value);
            }
        }

        /// A rate (a meter in Flink), which need not be a whole number.
        fn set_rate(&mut self, scope: &'static str, name: &'static str, labels: &Labels, value: f64) {
            let family = self.gauges.entry((scope, name)).or_insert_with(|| FlinkFamily::Rate(RateGauges::default()));
            if let FlinkFamily::Rate(family) = family {
                family.get_or_create(labels).set(value);
            }
        }

        /// The process's CPU and threads under the names of Flink's JVM status metrics:
        /// `Status_JVM_CPU_Time` (ns), `Status_JVM_CPU_Load` (the share of all cores it used
        /// since a scrape at least a second before) and `Status_JVM_Threads_Count`.
        fn process(&mut self, jm: &Labels) {
            let Some(stats) = crate::process::ProcessStats::read() else { return };
            self.set(JOBMANAGER, "Status_JVM_CPU_Time", jm, gauge_value(stats.cpu_ns));
            self.set(JOBMANAGER, "Status_JVM_Threads_Count", jm, gauge_value(stats.threads));
            let key = (("process".to_string(), "jobmanager".to_string(), 0, 0), "cpuNs".to_string());
            if let Some(ns_per_second) = per_second(key, self.now, stats.cpu_ns) {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
                let load = (ns_per_second / 1e9 / cores).clamp(0.0, 1.0);
                self.set_rate(JOBMANAGER, "Status_JVM_CPU_Load", jm, (load * 1000.0).round() / 1000.0);
            }
        }

        /// A job's gauges (`flink_jobmanager_job_*`) and its subtasks'.
        pub(super) fn job(&mut self, job: &JobMaster, details: &JobDetails, stats: &CheckpointStats) {
            if details.state.is_terminal() {
                return;
            }
            self.running_jobs += 1;
            let job_labels = labels([("job_id", &details.jid), ("job_name", &details.name), ("host", &self.host)]);
            let now = self.now_ms;
            let time_in = |state: JobStatus| -> i64 {
                match details.timestamps.get(state.name()) {
                    Some(since) if details.state == state => gauge_value(now.saturating_sub(*since)),
                    _ => 0,
                }
            };
            self.set(JOB, "uptime", &job_labels, time_in(JobStatus::Running));
            for (state, name) in TIMED_STATES {
                self.set(JOB, name, &job_labels, time_in(state));
            }
            self.set(JOB, "numRestarts", &job_labels, i64::from(details.num_restarts));
            self.set(JOB, "numberOfCompletedCheckpoints", &job_labels, gauge_value(stats.completed));
            self.set(JOB, "numberOfFailedCheckpoints", &job_labels, gauge_value(stats.failed));
            self.set(JOB, "numberOfInProgressCheckpoints", &job_labels, gauge_value(stats.in_progress));
            let total = stats.completed.saturating_add(stats.failed).saturating_add(stats.in_progress);
            self.set(JOB, "totalNumberOfCheckpoints", &job_labels, gauge_value(total));
            // Flink's gauges read -1 until there is a completed checkpoint (or a restore).
            let latest = stats.history.iter().filter(|c| c.status == CheckpointStatus::Completed).max_by_key(|c| c.id);
            let of_latest = |value: fn(&weir_runtime::checkpointing::stats::CheckpointEntry) -> u64| {
                latest.map_or(-1, |checkpoint| gauge_value(value(checkpoint)))
            };
            self.set(JOB, "lastCheckpointDuration", &job_labels, of_latest(|c| c.end_to_end_duration));
            self.set(JOB, "lastCheckpointSize", &job_labels, of_latest(|c| c.checkpointed_size));
            self.set(JOB, "lastCheckpointFullSize", &job_labels, of_latest(|c| c.state_size));
            self.set(JOB, "lastCompletedCheckpointId", &job_labels, of_latest(|c| c.id));
            let restored = stats.restored.as_ref().map_or(-1, |(_, _, at)| gauge_value(*at));
            self.set(JOB, "lastCheckpointRestoreTimestamp", &job_labels, restored);
            self.subtasks(job, details);
        }

        /// The TaskManager id and host of a subtask that runs at `location` (a TaskManager
        /// id; the dispatcher's location on an embedded cluster); `None` when that
        /// TaskManager is gone (its metrics went with it, as a Flink TaskManager's do).
        fn taskmanager_of(&self, location: &str) -> Option<(String, String)> {
            match &self.taskmanagers {
                None => Some((EMBEDDED_TASKMANAGER.to_string(), location.to_string())),
                Some(list) => {
                    list.iter().find(|tm| tm.id == location).map(|tm| (tm.id.clone(), host_of(&tm.path).to_string()))
                }
            }
        }

        /// Each deployed subtask's gauges (`flink_taskmanager_job_task_*`) and its chained
        /// operators' (`flink_taskmanager_job_task_operator_*`).
        fn subtasks(&mut self, job: &JobMaster, details: &JobDetails) {
            let dropped = late_dropped(job);
            // weir counts restarts per job (or pipelined region), not per subtask.
            let attempt = details.num_restarts.to_string();
            for (vertex_index, vertex) in details.vertices.iter().enumerate() {
                let chain = Chain {
                    is_source: details.plan.nodes.iter().any(|node| node.id == vertex.id && node.inputs.is_empty()),
                    names: vertex.name.split(" -> ").collect(),
                };
                for subtask in &vertex.subtasks {
                    if !deployed(subtask.status) {
                        continue;
                    }
                    let Some((tm_id, host)) = self.taskmanager_of(&subtask.host) else {
                        continue;
                    };
                    let index = subtask.subtask.to_string();
                    let labels = labels([
                        ("job_id", &details.jid),
                        ("job_name", &details.name),
                        ("task_id", &vertex.id),
                        ("task_name", &vertex.name),
                        ("task_attempt_id", &format!("{}_{index}_{attempt}", vertex.id)),
                        ("task_attempt_num", &attempt),
                        ("subtask_index", &index),
                        ("tm_id", &tm_id),
                        ("host", &host),
                    ]);
                    let scrape = SubtaskScrape {
                        subtask,
                        key: (details.jid.clone(), vertex.id.clone(), subtask.subtask, subtask.start_time),
                        labels,
                        // Flink's value before the first watermark is Long.MIN_VALUE.
                        watermark: subtask.input_watermark.unwrap_or(i64::MIN),
                    };
                    self.task(&scrape);
                    let late_dropped =
                        dropped.get(vertex_index).and_then(|v| v.get(subtask.subtask as usize)).copied().unwrap_or(0);
                    self.operators(&scrape, &chain, late_dropped);
                }
            }
        }

        /// A deployed subtask's own gauges (`flink_taskmanager_job_task_*`).
        fn task(&mut self, scrape: &SubtaskScrape) {
            let (task_labels, io, now) = (&scrape.labels, &scrape.subtask.metrics, self.now);
            self.set(TASK, "numRecordsIn", task_labels, gauge_value(io.read_records));
            self.set(TASK, "numRecordsOut", task_labels, gauge_value(io.write_records));
            self.set(TASK, "currentInputWatermark", task_labels, scrape.watermark);
            if let Some(rate) = records_per_second(&scrape.key, "numRecordsIn".into(), now, io.read_records) {
                self.set_rate(TASK, "numRecordsInPerSecond", task_labels, rate);
            }
            if let Some(rate) = records_per_second(&scrape.key, "numRecordsOut".into(), now, io.write_records) {
                self.set_rate(TASK, "numRecordsOutPerSecond", task_labels, rate);
            }
            // Bytes that crossed TCP (channels within a process serialize nothing).
            self.set(TASK, "numBytesIn", task_labels, gauge_value(io.read_bytes));
            self.set(TASK, "numBytesOut", task_labels, gauge_value(io.write_bytes));
            if let Some(rate) = records_per_second(&scrape.key, "numBytesIn".into(), now, io.read_bytes) {
                self.set_rate(TASK, "numBytesInPerSecond", task_labels, rate);
            }
            if let Some(rate) = records_per_second(&scrape.key, "numBytesOut".into(), now, io.write_bytes) {
                self.set_rate(TASK, "numBytesOutPerSecond", task_labels, rate);
            }
            self.set(TASK, "accumulatedIdleTimeMs", task_labels, gauge_value(io.accumulated_idle_time));
            self.set(TASK, "accumulatedBusyTimeMs", task_labels, io.accumulated_busy_time as i64);
            self.set(TASK, "accumulatedBackPressuredTimeMs", task_labels, gauge_value(io.backpressured_ms));
            if let Some(time) = time_per_second(&scrape.key, now, io) {
                self.set(TASK, "busyTimeMsPerSecond", task_labels, time.busy);
                self.set(TASK, "idleTimeMsPerSecond", task_labels, time.idle);
                self.set(TASK, "backPressuredTimeMsPerSecond", task_labels, time.backpressured);
            }
        }

        /// The gauges of a deployed subtask's chained operators
        /// (`flink_taskmanager_job_task_operator_*`); `late_dropped` is its late records dropped.
        fn operators(&mut self, scrape: &SubtaskScrape, chain: &Chain, late_dropped: u64) {
            let (subtask, io, now) = (scrape.subtask, &scrape.subtask.metrics, self.now);
            for (position, operator) in subtask.operators.iter().enumerate() {
                let name = match chain.names.get(position) {
                    Some(name) if chain.names.len() == subtask.operators.len() => *name,
                    _ => operator.uid.as_str(),
                };
                let mut operator_labels = scrape.labels.clone();
                operator_labels.push(("operator_id".into(), operator_id(&operator.uid)));
                let name: String = name.chars().take(OPERATOR_NAME_MAX_LENGTH).collect();
                operator_labels.push(("operator_name".into(), label_value(&name)));
                // A source operator's records in are the records it read, as Flink's
                // source readers count them (the task's records in).
                let records_in = if position == 0 && chain.is_source { io.read_records } else { operator.read_records };
                self.set(OPERATOR, "numRecordsIn", &operator_labels, gauge_value(records_in));
                self.set(OPERATOR, "numRecordsOut", &operator_labels, gauge_value(operator.write_records));
                let counter = format!("{position}.numRecordsIn");
                if let Some(rate) = records_per_second(&scrape.key, counter, now, records_in) {
                    self.set_rate(OPERATOR, "numRecordsInPerSecond", &operator_labels, rate);
                }
                let counter = format!("{position}.numRecordsOut");
                if let Some(rate) = records_per_second(&scrape.key, counter, now, operator.write_records) {
                    self.set_rate(OPERATOR, "numRecordsOutPerSecond", &operator_labels, rate);
                }
                if let Some(watermark) = operator.output_watermark {
                    self.set(OPERATOR, "currentOutputWatermark", &operator_labels, watermark);
                }
                // A chained operator's input watermark is the output watermark of the one
                // before it; the head's is the task's.
                match position.checked_sub(1).and_then(|before| subtask.operators.get(before)?.output_watermark) {
                    Some(watermark) => self.set(OPERATOR, "currentInputWatermark", &operator_labels, watermark),
                    None if position == 0 => {
                        self.set(OPERATOR, "currentInputWatermark", &operator_labels, scrape.watermark)
                    }
                    None => {}
                }
                if position + 1 == subtask.operators.len() && subtask.send_errors > 0 {
                    // A sink's writer is the last of its chain.
                    self.set(OPERATOR, "numRecordsSendErrors", &operator_labels, gauge_value(subtask.send_errors));
                }
                if position == 0 {
                    // Late records are counted by the keyed operator a keyed exchange
                    // feeds, the first of its task.
                    if subtask.late_records > 0 {
                        self.set(OPERATOR, "numLateRecordsDropped", &operator_labels, gauge_value(late_dropped));
                    }
                    // A source reading splits with a known end (Kafka partitions): the
                    // records still to read, FLIP-33's `pendingRecords`, and the largest
                    // partition lag, as Kafka's consumer reports `records-lag-max`.
                    let lags: Vec<i64> = subtask.splits.iter().filter_map(|split| split.lag).collect();
                    if chain.is_source && !lags.is_empty() {
                        self.set(OPERATOR, "pendingRecords", &operator_labels, lags.iter().sum());
                        let max = lags.iter().copied().max().unwrap_or(0);
                        self.set(OPERATOR, "KafkaSourceReader_KafkaConsumer_records_lag_max", &operator_labels, max);
                    }
                }
            }
        }

        /// Registers every gauge, `flink_jobmanager_numRunningJobs` last counted.
        pub(super) fn register(mut self, registry: &mut Registry) {
            let jm = labels([("host", &self.host)]);
            let running = gauge_value(self.running_jobs);
            self.set(JOBMANAGER, "numRunningJobs", &jm, running);
            self.process(&jm);
            registry.register_collector(Box::new(FlinkGauges(self.gauges)));
        }
    }

    /// The gauges of one scrape as a collector: a registered metric's help gets a full stop
    /// appended, and Flink's help text has none.
    #[derive(Debug)]
    struct FlinkGauges(BTreeMap<(&'static str, &'static str), FlinkFamily>);

    impl Collector for FlinkGauges {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            for ((scope, name), family) in &self.0 {
                let full_name = format!("flink_{scope}_{name}");
                let help = format!("{name} (scope: {scope})");
                match family {
                    FlinkFamily::Whole(family) => {
                        let metric = encoder.encode_descriptor(&full_name, &help, None, family.metric_type())?;
                        family.encode(metric)?;
                    }
                    FlinkFamily::Rate(family) => {
                        let metric = encoder.encode_descriptor(&full_name, &help, None, family.metric_type())?;
                        family.encode(metric)?;
                    }
                }
            }
            Ok(())
        }
    }

    #[cfg(test)]
    mod tests {
        use std::time::Duration;

        use super::*;

        #[test]
        fn label_values_are_filtered_as_flinks_reporter_does() {
            assert_eq!(label_value("Source: counter -> KeyedProcess"), "Source:_counter____KeyedProcess");
            assert_eq!(label_value("127.0.0.1"), "127_0_0_1");
            assert_eq!(label_value("a_b:C9"), "a_b:C9");
        }

        #[test]
        fn record_rates_are_per_counter_and_not_whole() {
            let key = ("job".to_string(), "vertex".to_string(), 1, 1);
            let start = Instant::now();
            assert_eq!(records_per_second(&key, "numRecordsIn".into(), start, 10), None);
            assert_eq!(records_per_second(&key, "numRecordsOut".into(), start, 0), None, "its own readings");
            let later = start + Duration::from_millis(1500);
            assert_eq!(records_per_second(&key, "numRecordsIn".into(), later, 11), Some(0.667));
            assert_eq!(records_per_second(&key, "numRecordsOut".into(), later, 3000), Some(2000.0));
        }
    }
}
