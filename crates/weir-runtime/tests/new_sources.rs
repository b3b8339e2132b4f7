//! A source that is not in the snapshot a job restores (a new source, or one whose uid
//! changed) starts exactly as in a fresh job: it reads everything. Before, it was restored
//! with no positions and read nothing.

#[path = "../../weir-cli/tests/common/kafka.rs"]
#[allow(dead_code)]
mod kafka;

use std::sync::Arc;
use std::time::Duration;

use weir_api::prelude::*;
use weir_checkpoint::{SnapshotStorage, load_metadata, plan_restore};
use weir_connectors::kafka::{KafkaSource, StartingOffsets, Topics, Utf8Lines};
use weir_connectors::{SequenceSource, TextLineSource};
use weir_runtime::checkpointing::RestoreSource;
use weir_runtime::checkpointing::restore::restore_request;
use weir_runtime::job_master::SavepointStatus;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::{ExecutionState, JobStatus};

/// A savepoint (stop) of an unbounded job whose only source has uid `source`.
fn savepoint_of_an_endless_job(dir: &std::path::Path) -> String {
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(64, Duration::from_micros(200)))
        .uid("source")
        .map(|n: u64| n.to_string())
        .sink_to(CollectSink::default())
        .uid("sink");
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.savepoints_url = Some(format!("file://{}", dir.display()));
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("endless").unwrap(), settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !job.details().vertices.iter().flat_map(|v| &v.subtasks).all(|s| s.status == ExecutionState::Running) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let request = job.trigger_savepoint(None, true).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished);
    match job.savepoint_status(&request) {
        Some(SavepointStatus::Completed(location)) => location,
        other => panic!("savepoint did not complete: {other:?}"),
    }
}

/// Runs `env`'s job restored from `location` with non-restored state allowed.
fn run_restored(env: StreamExecutionEnvironment, location: &str) {
    let graph = env.build("restored").unwrap();
    let storage = SnapshotStorage::from_url(location).unwrap();
    let blocking = storage.blocking();
    let metadata = blocking.block_on(load_metadata(&storage)).unwrap();
    let plan = plan_restore(&metadata, &restore_request(&graph, |_| 2, None, true)).unwrap();
    assert_eq!(plan.non_restored, vec!["source".to_string()]);
    let mut settings = JobSettings::with_parallelism(2);
    settings.max_parallelism = Some(plan.max_parallelism);
    settings.restore =
        Some(Arc::new(RestoreSource { storage: blocking, location: location.to_string(), metadata, plan }));
    let job = Dispatcher::new("localhost").submit(graph, settings).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished, "{:?}", job.failure_cause());
}

#[test]
fn every_built_in_source_absent_from_the_snapshot_reads_from_its_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let location = savepoint_of_an_endless_job(dir.path());
    let input = dir.path().join("lines.txt");
    std::fs::write(&input, (0..500).map(|i| format!("line {i}\n")).collect::<String>()).unwrap();

    // Sequence source under a new uid.
    let collected = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    env.from_source(SequenceSource::new(Some(1000), None, |i| i.to_string()))
        .uid("numbers")
        .sink_to(collected.clone())
        .uid("sink");
    run_restored(env, &location);
    let mut got: Vec<u64> = collected.records().iter().map(|s: &String| s.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..1000).collect::<Vec<u64>>(), "sequence source");

    // Text line source.
    let collected = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    env.from_source(TextLineSource::new(&input)).uid("lines").sink_to(collected.clone()).uid("sink");
    run_restored(env, &location);
    assert_eq!(collected.records().len(), 500, "text line source");

    // Vector source.
    let collected = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..300u64).map(|i| i.to_string()).collect()))
        .uid("vector")
        .sink_to(collected.clone())
        .uid("sink");
    run_restored(env, &location);
    assert_eq!(collected.records().len(), 300, "vector source");
}

/// The Kafka source under a uid the snapshot does not have reads from its configured start
/// (here the earliest offsets) to the end, as in a fresh job; the broker is noida-db.
#[test]
fn a_kafka_source_absent_from_the_snapshot_reads_from_its_configured_start() {
    let broker = kafka::Broker::start();
    broker.create_topic("events", 2);
    broker.produce("events", 2, (0..200).map(|i| i.to_string()));
    broker.wait_for_end("events", 2, 200);
    let dir = tempfile::tempdir().unwrap();
    let location = savepoint_of_an_endless_job(dir.path());

    let collected = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    let source = KafkaSource::new(&broker.bootstrap, Topics::Names(vec!["events".into()]), Utf8Lines)
        .starting_offsets(StartingOffsets::Earliest)
        .bounded();
    env.from_source(source).uid("kafka").sink_to(collected.clone()).uid("sink");
    run_restored(env, &location);
    let mut got: Vec<u64> = collected.records().iter().map(|s: &String| s.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..200).collect::<Vec<u64>>(), "kafka source");
}
