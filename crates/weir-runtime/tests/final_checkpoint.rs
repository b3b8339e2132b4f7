//! The end of a bounded job under periodic checkpoints: a subtask whose input ended waits for
//! the job's final checkpoint instead of committing at once, so a failure elsewhere before the
//! job finished replays nothing twice.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use weir_api::prelude::*;
use weir_connectors::file::FileSink;
use weir_runtime::restart::RestartStrategyConfig;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::JobStatus;

/// Set once the failure happened: the restarted attempt runs through.
static FAILED: AtomicBool = AtomicBool::new(false);

/// Passes records on; the subtask that holds key 0 fails once at the end of its input, after
/// the other subtask had time to reach its own end.
#[derive(Clone, Default)]
struct FailAtEndOnce {
    holds_key_zero: bool,
}

impl KeyedProcessFunction<u64, u64, u64> for FailAtEndOnce {
    fn process_element(
        &mut self,
        value: u64,
        _ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, u64>,
    ) -> FnResult {
        self.holds_key_zero |= value == 0;
        out.collect(value);
        Ok(())
    }

    fn on_end_of_input(&mut self, _ctx: &mut EndOfInputContext<'_, u64>, _out: &mut Collector<'_, u64>) -> FnResult {
        if self.holds_key_zero && !FAILED.swap(true, Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(300));
            return Err("failing at the end of the input, once".into());
        }
        Ok(())
    }
}

fn committed_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with("part-") {
            lines.extend(std::fs::read_to_string(entry.path()).unwrap().lines().map(str::to_string));
        }
    }
    lines
}

#[test]
fn a_failure_after_some_inputs_ended_replays_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..2_000u64).map(|i| i % 10).collect()))
        .uid("source")
        .key_by(|v: &u64| *v)
        .process(FailAtEndOnce::default())
        .uid("fail-at-end")
        .sink_to(FileSink::new(&out, |v: &u64, s: &mut String| s.push_str(&v.to_string())))
        .uid("sink");
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_millis(50));
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.path().display());
    settings.restart = RestartStrategyConfig::FixedDelay { attempts: 3, delay: Duration::ZERO };
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("fail at the end").unwrap(), settings).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(30))), JobStatus::Finished, "{:?}", job.failure_cause());
    assert!(FAILED.load(Ordering::SeqCst), "the failure never happened: the test proves nothing");
    assert_eq!(job.details().num_restarts, 1);
    let lines = committed_lines(&out);
    assert_eq!(lines.len(), 2_000, "every record exactly once");
    for key in 0..10u64 {
        assert_eq!(lines.iter().filter(|l| **l == key.to_string()).count(), 200, "key {key}");
    }
}

/// Two unconnected pipelines: a bounded one whose input ends early and an endless one. The
/// bounded pipeline's subtasks keep taking part in checkpoints (its last records are
/// committed by them) and a stop-with-savepoint ends both, every record exactly once.
#[test]
fn checkpoints_go_on_after_one_pipeline_ended_and_commit_its_last_records() {
    let dir = tempfile::tempdir().unwrap();
    let bounded_out = dir.path().join("bounded");
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..1_000u64).collect()))
        .uid("bounded-source")
        .key_by(|v: &u64| *v % 7)
        .process(FailOn(u64::MAX))
        .uid("bounded-pass")
        .sink_to(FileSink::new(&bounded_out, |v: &u64, s: &mut String| s.push_str(&v.to_string())))
        .uid("bounded-sink");
    env.from_source(EndlessSource::paced(16, Duration::from_millis(2)))
        .uid("endless-source")
        .key_by(|v: &u64| *v % 10)
        .process(RunningCount::default())
        .uid("endless-count")
        .sink_to(CollectSink::default())
        .uid("endless-sink");
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_millis(50));
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.path().display());
    settings.checkpointing.savepoints_url = Some(format!("file://{}/savepoints", dir.path().display()));
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("one ends early").unwrap(), settings).unwrap();

    // The bounded pipeline's records get committed by checkpoints taken after its input ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !bounded_out.exists() || committed_lines(&bounded_out).len() < 1_000 {
        assert!(std::time::Instant::now() < deadline, "the bounded pipeline's output was never committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(job.status(), JobStatus::Running, "the endless pipeline still runs");
    let completed_before = job.checkpoint_stats().completed;
    std::thread::sleep(Duration::from_millis(300));
    assert!(job.checkpoint_stats().completed > completed_before, "checkpoints stopped after one input ended");

    let request = job.trigger_savepoint(None, true).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished, "{:?}", job.failure_cause());
    assert!(matches!(job.savepoint_status(&request), Some(weir_runtime::job_master::SavepointStatus::Completed(_))));
    let mut lines: Vec<u64> = committed_lines(&bounded_out).iter().map(|l| l.parse().unwrap()).collect();
    lines.sort_unstable();
    assert_eq!(lines, (0..1_000).collect::<Vec<_>>(), "every bounded record exactly once");
}

/// Without periodic checkpoints a finished subtask is gone (nothing waits for a final
/// checkpoint): a savepoint asked for after one pipeline of the job ended fails at once with a
/// message that says why, rather than waiting for acknowledgements that never come.
#[test]
fn a_savepoint_after_a_pipeline_ended_without_checkpoints_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..100u64).collect()))
        .uid("bounded-source")
        .sink_to(CollectSink::default())
        .uid("bounded-sink");
    env.from_source(EndlessSource::paced(16, Duration::from_millis(2)))
        .uid("endless-source")
        .sink_to(CollectSink::default())
        .uid("endless-sink");
    let mut settings = JobSettings::with_parallelism(1);
    settings.checkpointing.savepoints_url = Some(format!("file://{}/savepoints", dir.path().display()));
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("one ends early, no checkpoints").unwrap(), settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !job
        .details()
        .vertices
        .iter()
        .any(|v| v.subtasks.iter().all(|s| s.status == weir_types::ExecutionState::Finished))
    {
        assert!(std::time::Instant::now() < deadline, "the bounded pipeline never finished: {:?}", job.details());
        std::thread::sleep(Duration::from_millis(10));
    }
    let request = job.trigger_savepoint(None, false).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match job.savepoint_status(&request) {
            Some(weir_runtime::job_master::SavepointStatus::Failed(cause)) => {
                assert!(cause.contains("finish"), "{cause}");
                break;
            }
            Some(weir_runtime::job_master::SavepointStatus::InProgress) => {
                assert!(std::time::Instant::now() < deadline, "the savepoint hangs");
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(job.status(), JobStatus::Running);
    job.cancel().unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Canceled);
}

/// Passes records on; every checkpoint of a subtask takes 60 ms.
#[derive(Clone)]
struct SlowSnapshots;

impl ProcessFunction<u64, u64> for SlowSnapshots {
    fn process_element(&mut self, record: u64, out: &mut Collector<'_, u64>) -> FnResult {
        out.collect(record);
        Ok(())
    }

    fn snapshot_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        std::thread::sleep(Duration::from_millis(60));
        Ok(())
    }
}

/// `execution.checkpointing.max-concurrent-checkpoints` (1) binds the final checkpoint too:
/// with checkpoints back to back (each takes 60 ms, the interval is 5 ms) one is in flight
/// when the input ends, and the final one starts only after it completed.
#[test]
fn the_final_checkpoint_waits_for_a_free_slot_under_max_concurrent_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let env = StreamExecutionEnvironment::new();
    env.from_source(weir_connectors::SequenceSource::new(Some(600), Some(2_000.0), |i| i))
        .uid("source")
        .process(SlowSnapshots)
        .uid("slow")
        .sink_to(FileSink::new(&out, |v: &u64, s: &mut String| s.push_str(&v.to_string())))
        .uid("sink");
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_millis(5));
    settings.checkpointing.max_concurrent = 1;
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.path().display());
    let job = Dispatcher::new("localhost").submit(env.build("slow snapshots").unwrap(), settings).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(30))), JobStatus::Finished, "{:?}", job.failure_cause());
    assert_eq!(committed_lines(&out).len(), 600, "every record committed");
    let history = job.checkpoint_stats().history;
    assert!(history.len() >= 2, "too few checkpoints to overlap: {history:?}");
    let mut spans: Vec<(u64, u64, u64)> =
        history.iter().map(|c| (c.trigger_timestamp, c.trigger_timestamp + c.end_to_end_duration, c.id)).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((_, ended, earlier), (started, _, later)) = (pair[0], pair[1]);
        assert!(
            started >= ended,
            "checkpoint {later} started at {started} before {earlier} ended at {ended}: {history:?}"
        );
    }
}
