//! `/metrics` serves Flink's PrometheusReporter names beside weir's own: on a running job
//! with event time, late records and checkpoints, every Flink name is there with Flink's
//! labels and the values weir's own series and REST give, and it goes when the job ends.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_api::prelude::*;
use weir_rest::{ClusterInfo, RestServer};
use weir_runtime::{Dispatcher, JobSettings};

const DEADLINE: Duration = Duration::from_secs(30);

/// One series: its labels and value.
#[derive(Debug)]
struct Series {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The series of `name` in Prometheus text (label values without escapes, as Flink's are).
fn series(text: &str, name: &str) -> Vec<Series> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(|rest| {
            let (labels, value) = rest.rsplit_once("} ").unwrap_or_else(|| panic!("{name}{{{rest}"));
            let labels = labels
                .split(',')
                .map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or_else(|| panic!("label {pair} of {name}"));
                    (key.to_string(), value.trim_matches('"').to_string())
                })
                .collect();
            Series { labels, value: value.parse().unwrap_or_else(|e| panic!("{name} value {value}: {e}")) }
        })
        .collect()
}

/// The one series of `name` with every label of `with`.
fn one(text: &str, name: &str, with: &[(&str, &str)]) -> Series {
    let mut found: Vec<Series> = series(text, name)
        .into_iter()
        .filter(|s| with.iter().all(|(key, value)| s.labels.get(*key).map(String::as_str) == Some(*value)))
        .collect();
    assert_eq!(found.len(), 1, "one {name} with {with:?}: {found:?}\n{text}");
    found.remove(0)
}

/// A label value as Flink's reporter writes it.
fn flink_label(value: &str) -> String {
    value.chars().map(|c| if c.is_ascii_alphanumeric() || c == ':' || c == '_' { c } else { '_' }).collect()
}

fn get(server: &RestServer, path: &str) -> String {
    let mut response = ureq::get(format!("{}{path}", server.url())).call().unwrap();
    assert_eq!(response.status().as_u16(), 200, "{path}");
    response.body_mut().read_to_string().unwrap()
}

fn json(server: &RestServer, path: &str) -> Value {
    serde_json::from_str(&get(server, path)).unwrap()
}

const JOB_LABELS: [&str; 3] = ["host", "job_id", "job_name"];
const TASK_LABELS: [&str; 9] = [
    "host",
    "job_id",
    "job_name",
    "subtask_index",
    "task_attempt_id",
    "task_attempt_num",
    "task_id",
    "task_name",
    "tm_id",
];

#[test]
fn flink_names_and_labels_describe_a_running_job() {
    let dispatcher = Dispatcher::new("localhost");
    let server = RestServer::start(
        "127.0.0.1",
        0,
        Arc::clone(&dispatcher),
        ClusterInfo { taskmanagers: 1, slots_total: 6, version: "0.1.0-test".to_string(), ..ClusterInfo::default() },
    )
    .unwrap();
    // Event time at 1 ms per record; every 100th record from the 3000th on is 5 s late and
    // dropped by the windows (no late-data side output).
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(16, Duration::from_millis(2)))
        .uid("numbers")
        .map(|i: u64| {
            let late = i >= 3000 && i % 100 == 99;
            (i % 5, i as i64 - if late { 5_000 } else { 0 })
        })
        .uid("stamp")
        .assign_timestamps_and_watermarks(
            WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(100))
                .with_timestamp_assigner(|e: &(u64, i64), _| e.1),
        )
        .uid("watermarks")
        .key_by(|e: &(u64, i64)| e.0)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .reduce(|a: (u64, i64), b: (u64, i64)| (a.0, a.1.max(b.1)))
        .uid("windows")
        .sink_to(CollectSink::default())
        .uid("sink");
    let checkpoints = std::env::temp_dir().join(format!("weir-prometheus-flink-{}", std::process::id()));
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_millis(100));
    settings.checkpointing.checkpoints_url = format!("file://{}", checkpoints.display());
    let job = dispatcher.submit(env.build("flink names").unwrap(), settings).unwrap();
    let jid = job.job_id().to_string();

    // Running, with a completed checkpoint and dropped late records.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let details = job.details();
        let late: u64 = details.vertices.iter().flat_map(|v| &v.subtasks).map(|s| s.late_records).sum();
        let running = details.vertices.iter().flat_map(|v| &v.subtasks).all(|s| s.status.name() == "RUNNING");
        if running && late > 0 && job.checkpoint_stats().completed > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no running job with late records and a checkpoint: {details:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Flink's per-second gauges need two scrapes at least a second apart. The second
    // scrape's window is within what the client saw of the two.
    let first_sent = Instant::now();
    let first = get(&server, "/metrics");
    let first_answered = Instant::now();
    std::thread::sleep(Duration::from_millis(1100));
    let second_sent = Instant::now();
    let text = get(&server, "/metrics");
    let second_answered = Instant::now();
    let shortest = second_sent.duration_since(first_answered).as_secs_f64();
    let longest = second_answered.duration_since(first_sent).as_secs_f64();
    // A rate from two counts: within the growth over the longest and the shortest window
    // (rounded to a thousandth).
    let assert_rate = |rate: f64, before: f64, after: f64, what: &str| {
        let growth = after - before;
        assert!(growth >= 0.0, "{what}: {before} -> {after}");
        let (low, high) = (growth / longest - 0.001, growth / shortest + 0.001);
        assert!((low..=high).contains(&rate), "{what}: {rate}/s, from {before} to {after} in {shortest}-{longest} s");
    };
    let details = json(&server, &format!("/jobs/{jid}"));

    // Every Flink family is a gauge, helped as Flink's reporter does.
    for (name, scope) in [
        ("numRunningJobs", "jobmanager"),
        ("numRegisteredTaskManagers", "jobmanager"),
        ("taskSlotsTotal", "jobmanager"),
        ("taskSlotsAvailable", "jobmanager"),
        ("uptime", "jobmanager_job"),
        ("runningTime", "jobmanager_job"),
        ("restartingTime", "jobmanager_job"),
        ("numRestarts", "jobmanager_job"),
        ("lastCheckpointDuration", "jobmanager_job"),
        ("lastCheckpointSize", "jobmanager_job"),
        ("lastCheckpointFullSize", "jobmanager_job"),
        ("lastCompletedCheckpointId", "jobmanager_job"),
        ("lastCheckpointRestoreTimestamp", "jobmanager_job"),
        ("numberOfCompletedCheckpoints", "jobmanager_job"),
        ("numberOfFailedCheckpoints", "jobmanager_job"),
        ("numberOfInProgressCheckpoints", "jobmanager_job"),
        ("totalNumberOfCheckpoints", "jobmanager_job"),
        ("numRecordsIn", "taskmanager_job_task"),
        ("numRecordsOut", "taskmanager_job_task"),
        ("numBytesIn", "taskmanager_job_task"),
        ("numBytesOut", "taskmanager_job_task"),
        ("numBytesInPerSecond", "taskmanager_job_task"),
        ("numBytesOutPerSecond", "taskmanager_job_task"),
        ("backPressuredTimeMsPerSecond", "taskmanager_job_task"),
        ("busyTimeMsPerSecond", "taskmanager_job_task"),
        ("idleTimeMsPerSecond", "taskmanager_job_task"),
        ("accumulatedBusyTimeMs", "taskmanager_job_task"),
        ("accumulatedIdleTimeMs", "taskmanager_job_task"),
        ("accumulatedBackPressuredTimeMs", "taskmanager_job_task"),
        ("numRecordsInPerSecond", "taskmanager_job_task"),
        ("numRecordsOutPerSecond", "taskmanager_job_task"),
        ("numRecordsInPerSecond", "taskmanager_job_task_operator"),
        ("numRecordsOutPerSecond", "taskmanager_job_task_operator"),
        ("currentInputWatermark", "taskmanager_job_task"),
        ("numRecordsIn", "taskmanager_job_task_operator"),
        ("numRecordsOut", "taskmanager_job_task_operator"),
        ("currentInputWatermark", "taskmanager_job_task_operator"),
        ("currentOutputWatermark", "taskmanager_job_task_operator"),
        ("numLateRecordsDropped", "taskmanager_job_task_operator"),
    ] {
        let family = format!("flink_{scope}_{name}");
        assert!(text.contains(&format!("# TYPE {family} gauge\n")), "{family} is a gauge: {text}");
        assert!(text.contains(&format!("# HELP {family} {name} (scope: {scope})\n")), "{family} help: {text}");
    }
    // Bytes count what crossed TCP: a job in one process sends none.
    for name in ["numBytesIn", "numBytesOut", "numBytesInPerSecond", "numBytesOutPerSecond"] {
        let family = format!("flink_taskmanager_job_task_{name}");
        let values: Vec<f64> = series(&text, &family).iter().map(|s| s.value).collect();
        assert!(!values.is_empty() && values.iter().all(|v| *v == 0.0), "{family}: {values:?}");
    }

    // The JobManager: as /overview counts.
    let overview = json(&server, "/overview");
    let jm = [("host", "localhost")];
    assert_eq!(one(&text, "flink_jobmanager_numRunningJobs", &jm).value, 1.0);
    // The process, under the names of Flink's JVM status metrics and Prometheus's own.
    let cpu_ns = one(&text, "flink_jobmanager_Status_JVM_CPU_Time", &jm).value;
    assert!(cpu_ns > 0.0, "{cpu_ns}");
    let load = one(&text, "flink_jobmanager_Status_JVM_CPU_Load", &jm).value;
    assert!((0.0..=1.0).contains(&load), "{load}");
    assert!(one(&text, "flink_jobmanager_Status_JVM_Threads_Count", &jm).value >= 2.0);
    for name in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_threads", "process_open_fds"] {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}"));
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value > 0.0, "{line}");
    }
    assert_eq!(one(&text, "flink_jobmanager_numRegisteredTaskManagers", &jm).value, 1.0);
    assert_eq!(one(&text, "flink_jobmanager_taskSlotsTotal", &jm).value, 6.0);
    let available = one(&text, "flink_jobmanager_taskSlotsAvailable", &jm);
    assert_eq!(available.value, overview["slots-available"].as_f64().unwrap(), "{overview}");
    assert_eq!(available.labels.keys().collect::<Vec<_>>(), ["host"]);

    // The job.
    let job_labels = [("job_id", jid.as_str()), ("job_name", "flink_names"), ("host", "localhost")];
    let uptime = one(&text, "flink_jobmanager_job_uptime", &job_labels);
    assert_eq!(uptime.labels.keys().map(String::as_str).collect::<Vec<_>>(), JOB_LABELS);
    assert!(uptime.value > 1000.0, "running for more than the second between the scrapes: {uptime:?}");
    let running_time = one(&text, "flink_jobmanager_job_runningTime", &job_labels).value;
    assert!((running_time - uptime.value).abs() < 1.0, "{running_time} {uptime:?}");
    assert_eq!(one(&text, "flink_jobmanager_job_restartingTime", &job_labels).value, 0.0);
    assert_eq!(one(&text, "flink_jobmanager_job_numRestarts", &job_labels).value, 0.0);
    let completed = one(&text, "flink_jobmanager_job_numberOfCompletedCheckpoints", &job_labels).value;
    let failed = one(&text, "flink_jobmanager_job_numberOfFailedCheckpoints", &job_labels).value;
    let in_progress = one(&text, "flink_jobmanager_job_numberOfInProgressCheckpoints", &job_labels).value;
    assert!(completed >= 1.0, "{text}");
    assert_eq!(
        one(&text, "flink_jobmanager_job_totalNumberOfCheckpoints", &job_labels).value,
        completed + failed + in_progress
    );
    let weir_completed = one(&text, "weir_job_checkpoints_completed_total", &[("job_id", jid.as_str())]).value;
    assert_eq!(completed, weir_completed, "the same count under both names");
    // State size per operator, from the latest completed checkpoint: the windows hold some.
    let windows_state =
        one(&text, "weir_operator_state_size_bytes", &[("job_id", jid.as_str()), ("operator", "windows")]);
    assert!(windows_state.value > 0.0, "{windows_state:?}");
    assert!(one(&text, "flink_jobmanager_job_lastCheckpointDuration", &job_labels).value >= 0.0);
    assert!(one(&text, "flink_jobmanager_job_lastCheckpointSize", &job_labels).value > 0.0, "windows hold state");
    assert!(one(&text, "flink_jobmanager_job_lastCompletedCheckpointId", &job_labels).value >= 1.0);
    assert_eq!(
        one(&text, "flink_jobmanager_job_lastCheckpointRestoreTimestamp", &job_labels).value,
        -1.0,
        "not restored"
    );

    // Each subtask, with Flink's task labels and weir's counts.
    let vertices = details["vertices"].as_array().unwrap();
    assert_eq!(vertices.len(), 2, "numbers -> stamp -> watermarks, then windows -> sink: {details}");
    for vertex in vertices {
        let (vertex_id, name) = (vertex["id"].as_str().unwrap(), vertex["name"].as_str().unwrap());
        for subtask in vertex["subtasks"].as_array().unwrap() {
            let index = subtask["subtask"].as_u64().unwrap().to_string();
            let attempt_id = format!("{vertex_id}_{index}_0");
            let task_name = flink_label(name);
            let labels = [
                ("job_id", jid.as_str()),
                ("job_name", "flink_names"),
                ("task_id", vertex_id),
                ("task_name", task_name.as_str()),
                ("task_attempt_id", attempt_id.as_str()),
                ("task_attempt_num", "0"),
                ("subtask_index", index.as_str()),
                ("tm_id", "embedded"),
                ("host", "localhost"),
            ];
            let records_in = one(&text, "flink_taskmanager_job_task_numRecordsIn", &labels);
            assert_eq!(records_in.labels.keys().map(String::as_str).collect::<Vec<_>>(), TASK_LABELS);
            let weir = [("job_id", jid.as_str()), ("task", name), ("subtask", index.as_str())];
            assert_eq!(records_in.value, one(&text, "weir_task_records_in_total", &weir).value, "{vertex_id} {index}");
            let records_out = one(&text, "flink_taskmanager_job_task_numRecordsOut", &labels).value;
            assert_eq!(records_out, one(&text, "weir_task_records_out_total", &weir).value);
            // Records per second, from the growth of the counts between the two scrapes.
            for (rate, count) in [
                ("flink_taskmanager_job_task_numRecordsInPerSecond", "flink_taskmanager_job_task_numRecordsIn"),
                ("flink_taskmanager_job_task_numRecordsOutPerSecond", "flink_taskmanager_job_task_numRecordsOut"),
            ] {
                let (before, after) = (one(&first, count, &labels).value, one(&text, count, &labels).value);
                assert_rate(one(&text, rate, &labels).value, before, after, &format!("{rate} {vertex_id} {index}"));
            }
            let in_rate = one(&text, "flink_taskmanager_job_task_numRecordsInPerSecond", &labels).value;
            assert!(in_rate > 0.0, "the job is running: {in_rate}");
            // The time split: three parts of each second.
            let part = |name: &str| one(&text, &format!("flink_taskmanager_job_task_{name}"), &labels).value;
            let (busy, idle, blocked) =
                (part("busyTimeMsPerSecond"), part("idleTimeMsPerSecond"), part("backPressuredTimeMsPerSecond"));
            for value in [busy, idle, blocked] {
                assert!((0.0..=1000.0).contains(&value), "{busy} {idle} {blocked}");
            }
            assert_eq!(busy + idle + blocked, 1000.0, "the parts of a second add up to it");
            let watermark = one(&text, "flink_taskmanager_job_task_currentInputWatermark", &labels).value;

            // Its chained operators: Flink's operator labels added.
            let operators = series(&text, "flink_taskmanager_job_task_operator_numRecordsOut")
                .into_iter()
                .filter(|s| labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
                .collect::<Vec<_>>();
            let names: Vec<&str> = name.split(" -> ").collect();
            assert_eq!(operators.len(), names.len(), "one series per chained operator: {operators:?}");
            for operator in &operators {
                assert_eq!(operator.labels.len(), TASK_LABELS.len() + 2, "{operator:?}");
                let id = &operator.labels["operator_id"];
                assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{operator:?}");
                let operator_name = &operator.labels["operator_name"];
                assert!(names.iter().any(|n| flink_label(n) == *operator_name), "{operator_name} in {names:?}");
                let with: Vec<(&str, &str)> = operator.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                for (rate, count) in [
                    (
                        "flink_taskmanager_job_task_operator_numRecordsInPerSecond",
                        "flink_taskmanager_job_task_operator_numRecordsIn",
                    ),
                    (
                        "flink_taskmanager_job_task_operator_numRecordsOutPerSecond",
                        "flink_taskmanager_job_task_operator_numRecordsOut",
                    ),
                ] {
                    let (before, after) = (one(&first, count, &with).value, one(&text, count, &with).value);
                    assert_rate(one(&text, rate, &with).value, before, after, &format!("{rate} {operator_name}"));
                }
            }
            let head_name = flink_label(names[0]);
            let head = [labels.as_slice(), &[("operator_name", head_name.as_str())]].concat();
            let head_watermark = one(&text, "flink_taskmanager_job_task_operator_currentInputWatermark", &head).value;
            assert_eq!(head_watermark, watermark, "the first operator's input watermark is the task's");
            // Between chained operators: each one's input watermark is the output watermark
            // of the one before; an operator that emitted none has no output series.
            fn with_operator<'a>(labels: &[(&'a str, &'a str)], operator: &'a str) -> Vec<(&'a str, &'a str)> {
                [labels, &[("operator_name", operator)]].concat()
            }
            let output_of = |operator: &str| {
                let with = with_operator(&labels, operator);
                series(&text, "flink_taskmanager_job_task_operator_currentOutputWatermark")
                    .into_iter()
                    .find(|s| with.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
                    .map(|s| s.value)
            };
            for pair in names.windows(2) {
                let (before, after) = (flink_label(pair[0]), flink_label(pair[1]));
                if let Some(output) = output_of(&before) {
                    let with = with_operator(&labels, &after);
                    let input = one(&text, "flink_taskmanager_job_task_operator_currentInputWatermark", &with);
                    assert_eq!(input.value, output, "{after}'s input watermark is {before}'s output watermark");
                }
            }
            let assigner = output_of("Timestamps_Watermarks");
            if name.contains("Timestamps/Watermarks") {
                assert!(assigner.is_some_and(|w| w > 0.0), "the assigner emits watermarks: {assigner:?} {names:?}");
            }
            if name.starts_with("Window") {
                assert!(watermark > 0.0, "the windows have a watermark: {watermark}");
                let windows = output_of(&head_name);
                // Read a moment after the task's input watermark: not newer than it.
                assert!(windows.is_some_and(|w| w > 0.0 && w <= watermark), "{windows:?} {watermark}");
                assert!(records_in.value > 0.0);
                // The first operator receives what its task does.
                assert_eq!(
                    one(&text, "flink_taskmanager_job_task_operator_numRecordsIn", &head).value,
                    records_in.value
                );
            } else {
                assert_eq!(watermark, i64::MIN as f64, "a source task has no input watermark: Long.MIN_VALUE");
                let read = one(&text, "flink_taskmanager_job_task_operator_numRecordsIn", &head).value;
                assert_eq!(read, records_in.value, "a source reads what its task counts in");
            }
        }
    }
    let dropped: f64 = series(&text, "flink_taskmanager_job_task_operator_numLateRecordsDropped")
        .iter()
        .filter(|s| s.labels["job_id"] == jid)
        .inspect(|s| assert!(s.labels["operator_name"].starts_with("Window"), "{s:?}"))
        .map(|s| s.value)
        .sum();
    assert!(dropped > 0.0, "the windows dropped late records: {text}");

    // The job's Flink series go when it ends, as Flink closes its metric groups; weir's stay.
    job.cancel().unwrap();
    job.wait_terminal(Some(DEADLINE));
    let text = get(&server, "/metrics");
    assert!(!text.contains(&format!("flink_jobmanager_job_uptime{{job_id=\"{jid}\"")), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("flink_taskmanager") && l.contains(&jid)), "{text}");
    assert_eq!(one(&text, "flink_jobmanager_numRunningJobs", &jm).value, 0.0);
    assert!(
        text.contains(&format!("weir_job_state{{job_id=\"{jid}\",job_name=\"flink names\",state=\"CANCELED\"}} 1"))
    );
    server.shutdown();
    let _ = std::fs::remove_dir_all(&checkpoints);
}
