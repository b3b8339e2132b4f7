//! Jobs of two pipelined regions (region failover, Flink's default) whose second region
//! fails at the end of the job: in the final checkpoint, at its completion, or in a
//! stop-with-savepoint. Each case hung (part of) the job before its fix, found by the job
//! master's random-subtask test: subtasks waited for a `Finish`, or for the end of a stop,
//! that nobody would send.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use weir_api::operator::TaskContext;
use weir_api::prelude::*;
use weir_api::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader};
use weir_connectors::file::FileSink;
use weir_runtime::restart::RestartStrategyConfig;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::JobStatus;

/// Set once the snapshot failure happened.
static FAILED_AT_SNAPSHOT: AtomicBool = AtomicBool::new(false);
/// Set once the completion failure happened.
static FAILED_AT_COMPLETION: AtomicBool = AtomicBool::new(false);
/// Set by the stop test before it asks for the stop: the next snapshot fails.
static STOP_ASKED: AtomicBool = AtomicBool::new(false);
/// Set once the stop's snapshot failed.
static FAILED_AT_STOP: AtomicBool = AtomicBool::new(false);
/// Records the endless region's sink received.
static ENDLESS_RECORDS: AtomicU64 = AtomicU64::new(0);

const RECORDS: u64 = 500;

/// Passes records on; fails at its first snapshot after its input ended (the final
/// checkpoint's), once.
#[derive(Clone, Default)]
struct FailAtFinalSnapshotOnce {
    input_ended: bool,
}

impl ProcessFunction<u64, u64> for FailAtFinalSnapshotOnce {
    fn process_element(&mut self, record: u64, out: &mut Collector<'_, u64>) -> FnResult {
        out.collect(record);
        Ok(())
    }

    fn snapshot_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        if self.input_ended && !FAILED_AT_SNAPSHOT.swap(true, Ordering::SeqCst) {
            return Err("failing in the final checkpoint's snapshot, once".into());
        }
        Ok(())
    }

    fn on_end_of_input(&mut self, _out: &mut Collector<'_, u64>) -> FnResult {
        self.input_ended = true;
        Ok(())
    }
}

/// The records 0..RECORDS, read by readers that fail when the first checkpoint completes
/// (the final one: `Finish` goes out with its completion), once.
struct FailAtFinalCompletionOnce(VecSource<u64>);

struct FailingReader(Box<dyn SourceReader<u64>>);

impl Source<u64> for FailAtFinalCompletionOnce {
    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<u64>>, TaskError> {
        Ok(Box::new(FailingReader(self.0.create_reader(ctx)?)))
    }

    fn restore_reader(
        &self,
        ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<u64>>, TaskError> {
        Ok(Box::new(FailingReader(self.0.restore_reader(ctx, positions)?)))
    }
}

impl SourceReader<u64> for FailingReader {
    fn poll_next(&mut self, out: &mut Vec<u64>, max_records: usize) -> Result<SourcePoll, TaskError> {
        self.0.poll_next(out, max_records)
    }

    fn snapshot_positions(&self) -> SourcePositions {
        self.0.snapshot_positions()
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        if !FAILED_AT_COMPLETION.swap(true, Ordering::SeqCst) {
            return Err(TaskError::Internal(format!("failing at checkpoint {checkpoint_id}'s completion, once")));
        }
        self.0.notify_checkpoint_complete(checkpoint_id)
    }
}

fn committed(dir: &Path) -> Vec<u64> {
    let mut records = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with("part-") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            records.extend(text.lines().map(|line| line.parse::<u64>().unwrap()));
        }
    }
    records.sort_unstable();
    records
}

fn sink(dir: &Path) -> FileSink<u64> {
    FileSink::new(dir, |v: &u64, s: &mut String| s.push_str(&v.to_string()))
}

/// Runs the job `env` built over `dir` to its end; the restarts it took.
fn run_to_the_end(env: &StreamExecutionEnvironment, dir: &Path, name: &str) -> u32 {
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_secs(60));
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.display());
    settings.restart = RestartStrategyConfig::FixedDelay { attempts: 3, delay: Duration::ZERO };
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build(name).unwrap(), settings).unwrap();
    let status = job.wait_terminal(Some(Duration::from_secs(30)));
    if status != JobStatus::Finished {
        let _ = job.cancel();
        job.wait_terminal(Some(Duration::from_secs(10)));
    }
    assert_eq!(status, JobStatus::Finished, "the job hung or failed: {:?}", job.failure_cause());
    job.details().num_restarts
}

#[test]
fn a_region_failing_in_the_final_checkpoint_restarts_and_the_job_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..RECORDS).collect())).uid("first-source").sink_to(sink(&first)).uid("first-sink");
    env.from_source(VecSource::new((0..RECORDS).collect()))
        .uid("second-source")
        .process(FailAtFinalSnapshotOnce::default())
        .uid("second-fails")
        .sink_to(sink(&second))
        .uid("second-sink");
    let restarts = run_to_the_end(&env, dir.path(), "fails in the final checkpoint");
    assert!(FAILED_AT_SNAPSHOT.load(Ordering::SeqCst), "the failure never happened: the test proves nothing");
    assert_eq!(restarts, 1);
    assert_eq!(committed(&first), (0..RECORDS).collect::<Vec<_>>(), "every record of the first region once");
    assert_eq!(committed(&second), (0..RECORDS).collect::<Vec<_>>(), "every record of the second region once");
}

#[test]
fn a_region_failing_after_the_final_checkpoint_completed_restarts_the_whole_job_which_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..RECORDS).collect())).uid("first-source").sink_to(sink(&first)).uid("first-sink");
    env.from_source(FailAtFinalCompletionOnce(VecSource::new((0..RECORDS).collect())))
        .uid("second-source")
        .sink_to(sink(&second))
        .uid("second-sink");
    let restarts = run_to_the_end(&env, dir.path(), "fails after the final checkpoint");
    assert!(FAILED_AT_COMPLETION.load(Ordering::SeqCst), "the failure never happened: the test proves nothing");
    assert_eq!(restarts, 1);
    assert_eq!(committed(&first), (0..RECORDS).collect::<Vec<_>>(), "every record of the first region once");
    assert_eq!(committed(&second), (0..RECORDS).collect::<Vec<_>>(), "every record of the second region once");
}

/// Passes records on; once the stop was asked for, fails its next snapshot (the stop's
/// savepoint: the job takes no periodic checkpoints), after the other region's sources took
/// the stop's barrier.
#[derive(Clone, Default)]
struct FailTheStopOnce;

impl ProcessFunction<u64, u64> for FailTheStopOnce {
    fn process_element(&mut self, record: u64, out: &mut Collector<'_, u64>) -> FnResult {
        out.collect(record);
        Ok(())
    }

    fn snapshot_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        if STOP_ASKED.load(Ordering::SeqCst) && !FAILED_AT_STOP.swap(true, Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(300));
            return Err("failing in the stop's savepoint, once".into());
        }
        Ok(())
    }
}

/// A stop-with-savepoint fails because one region fails in it; the other region, whose
/// sources had stopped at the stop's barrier, must hear that the savepoint was aborted and
/// go on (it kept its sources stopped for good before the fix), and a second stop ends the
/// job.
#[test]
fn a_stop_that_fails_in_one_region_lets_the_other_region_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(8, Duration::from_millis(2)))
        .uid("endless-source")
        .map(|v: u64| {
            ENDLESS_RECORDS.fetch_add(1, Ordering::SeqCst);
            v
        })
        .uid("endless-count")
        .sink_to(CollectSink::default())
        .uid("endless-sink");
    env.from_source(EndlessSource::paced(8, Duration::from_millis(2)))
        .uid("failing-source")
        .process(FailTheStopOnce)
        .uid("failing-pass")
        .sink_to(CollectSink::default())
        .uid("failing-sink");
    let mut settings = JobSettings::with_parallelism(1);
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.path().display());
    settings.checkpointing.savepoints_url = Some(format!("file://{}/savepoints", dir.path().display()));
    settings.restart = RestartStrategyConfig::FixedDelay { attempts: 3, delay: Duration::ZERO };
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("a stop fails in one region").unwrap(), settings).unwrap();
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while !done() {
            if std::time::Instant::now() > deadline {
                let _ = job.cancel();
                job.wait_terminal(Some(Duration::from_secs(10)));
                panic!("{what} within 15 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("the endless region runs", &|| ENDLESS_RECORDS.load(Ordering::SeqCst) > 100);

    STOP_ASKED.store(true, Ordering::SeqCst);
    let stop = job.trigger_savepoint(None, true).unwrap();
    wait_for("the failed stop is reported", &|| {
        matches!(job.savepoint_status(&stop), Some(weir_runtime::job_master::SavepointStatus::Failed(_)))
    });
    assert!(FAILED_AT_STOP.load(Ordering::SeqCst), "the failure never happened: the test proves nothing");
    assert_eq!(job.status(), JobStatus::Running);
    let after_the_failed_stop = ENDLESS_RECORDS.load(Ordering::SeqCst);
    wait_for("the endless region's sources resume after the failed stop", &|| {
        ENDLESS_RECORDS.load(Ordering::SeqCst) > after_the_failed_stop + 100
    });

    let second = job.trigger_savepoint(None, true).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished, "{:?}", job.failure_cause());
    assert!(matches!(job.savepoint_status(&second), Some(weir_runtime::job_master::SavepointStatus::Completed(_))));
}
