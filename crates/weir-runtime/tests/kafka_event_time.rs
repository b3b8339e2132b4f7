//! Per-partition watermarks of the Kafka source, against a real broker (noida-db, started
//! here; `.ci/test` installs it): with the strategy given to the source, a partition read
//! later than the others holds the watermark back, so its records are on time; with the
//! strategy applied after the source (one watermark for the subtask), they are late, as in
//! Flink.

#[path = "../../weir-cli/tests/common/kafka.rs"]
#[allow(dead_code)]
mod kafka;

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_api::prelude::*;
use weir_connectors::kafka::{KafkaRecord, KafkaSource, StartingOffsets, Topics};
use weir_runtime::job_master::JobMaster;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::JobStatus;

const WAIT_MAX: Duration = Duration::from_secs(30);

/// Sends `timestamps` (as text values) to partition `partition` of `topic`.
fn produce_to(bootstrap: &str, topic: &str, partition: i32, timestamps: impl IntoIterator<Item = i64>) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("log_level", "3").create().unwrap();
    for timestamp in timestamps {
        let value = timestamp.to_string();
        let record = BaseRecord::<str, str>::to(topic).payload(&value).partition(partition);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// The event time of a record: its value.
fn timestamp_of(record: &KafkaRecord<'_>) -> Result<i64, String> {
    let text = std::str::from_utf8(record.payload.unwrap_or_default()).map_err(|e| e.to_string())?;
    text.trim().parse().map_err(|e| format!("'{text}': {e}"))
}

#[derive(Clone)]
struct CountPerWindow;

impl ProcessWindowFunction<u8, i64, (i64, usize)> for CountPerWindow {
    fn process(
        &mut self,
        _key: &u8,
        context: &WindowContext<'_>,
        elements: &[i64],
        out: &mut Collector<'_, (i64, usize)>,
    ) -> FnResult {
        out.collect((context.window.start, elements.len()));
        Ok(())
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The window vertex's (the last one's) input watermark and late records.
fn window_time(job: &JobMaster) -> (Option<i64>, u64) {
    let details = job.details();
    let subtask = details.vertices.last().and_then(|window| window.subtasks.first());
    subtask.map_or((None, 0), |s| (s.input_watermark, s.late_records))
}

/// The records the source's vertex sent on (0 before it is deployed).
fn source_records(job: &JobMaster) -> u64 {
    job.details().vertices.first().map_or(0, |v| v.subtasks.iter().map(|s| s.metrics.write_records).sum())
}

/// Runs the scenario on topic `topic`: 100 records at 10 s on partition 0, a pause, 100
/// records at 1 s on partition 1, then a record at 20 s on each. Returns the windows counted
/// and the records dropped as late.
fn late_partition(broker: &kafka::Broker, topic: &str, per_partition: bool) -> (Vec<(i64, usize)>, u64) {
    broker.create_topic(topic, 2);
    produce_to(&broker.bootstrap, topic, 0, 10_000..10_100);
    let source = KafkaSource::new(&broker.bootstrap, Topics::Names(vec![topic.into()]), timestamp_of)
        .starting_offsets(StartingOffsets::Earliest);
    let strategy = WatermarkStrategy::for_monotonous_timestamps().with_timestamp_assigner(|t: &i64, _| *t);
    let env = StreamExecutionEnvironment::new();
    let stamped = if per_partition {
        env.from_source_with_watermarks(source, strategy)
    } else {
        env.from_source(source).assign_timestamps_and_watermarks(strategy)
    };
    let windows = CollectSink::default();
    stamped
        .key_by(|_: &i64| 0u8)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .process(CountPerWindow)
        .sink_to(windows.clone());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build(topic).unwrap(), JobSettings::with_parallelism(1)).unwrap();

    wait_until("the source read partition 0", || source_records(&job) == 100);
    if per_partition {
        // Five watermark intervals: the empty partition 1 holds the watermark back.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(window_time(&job).0, None, "partition 1 has no records yet: no watermark");
    } else {
        wait_until("the watermark passed partition 0's records", || window_time(&job).0 >= Some(10_000));
    }
    produce_to(&broker.bootstrap, topic, 1, 1_000..1_100);
    produce_to(&broker.bootstrap, topic, 0, [20_000]);
    produce_to(&broker.bootstrap, topic, 1, [20_000]);
    wait_until("the watermark passed 11 s", || window_time(&job).0 >= Some(11_000));
    let late = window_time(&job).1;
    job.cancel().unwrap();
    assert_eq!(job.wait_terminal(Some(WAIT_MAX)), JobStatus::Canceled);
    let mut counted = windows.records();
    counted.sort_unstable();
    (counted, late)
}

#[test]
fn a_partition_read_late_holds_the_watermark_back_only_when_the_strategy_is_the_sources() {
    let broker = kafka::Broker::start();
    let (windows, late) = late_partition(&broker, "per-partition", true);
    assert_eq!(windows, vec![(1_000, 100), (10_000, 100)], "every record in its window");
    assert_eq!(late, 0);

    let (windows, late) = late_partition(&broker, "per-subtask", false);
    assert_eq!(windows, vec![(10_000, 100)], "partition 1's records came after the watermark passed them");
    assert_eq!(late, 100);
}
