//! [`KafkaSource`]: topic partitions are the splits. Each subtask reads the partitions Flink's
//! enumerator would give it (`partition_owner`), from offsets that live in the checkpoint;
//! the consumer group only receives them after a checkpoint completes
//! (`commit.offsets.on.checkpoint`), as Flink's source does.
//!
//! Position elements (union state, so any parallelism finds its partitions on restore):
//! postcard of `(version = 1, topic, partition, next_offset, stop_offset)`
//! (docs/savepoint-format.md).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::de::DeserializeOwned;
use weir_api::error::TaskError;
use weir_api::operator::TaskContext;
use weir_api::snapshot::Redistribution;
use weir_api::source::{Boundedness, Source, SourcePoll, SourcePositions, SourceReader, SplitInfo};

use super::{client_config, partition_owner};

/// Which topics a source reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topics {
    /// These topics; a missing one is an error naming it.
    Names(Vec<String>),
    /// Every topic whose whole name matches this regular expression (Flink's topic pattern).
    Pattern(String),
}

/// Where a partition starts when the snapshot has no offset for it (Flink's
/// `OffsetsInitializer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartingOffsets {
    /// The first offset still in the partition.
    Earliest,
    /// The end of the partition when the reader starts.
    Latest,
    /// The consumer group's committed offset, or the reset strategy where it has none.
    Committed(OffsetReset),
    /// The first offset whose record timestamp is at or after these epoch milliseconds.
    Timestamp(i64),
}

/// What [`StartingOffsets::Committed`] does for a partition the group never committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetReset {
    /// Start at the earliest offset.
    Earliest,
    /// Start at the end.
    Latest,
    /// Fail, naming the partition.
    None,
}

/// One Kafka record as a deserialiser sees it.
#[derive(Clone, Copy, Debug)]
pub struct KafkaRecord<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp (epoch ms), if it has one.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value.
    pub payload: Option<&'a [u8]>,
}

/// Turns a Kafka record into a stream element; an error names what is wrong with it.
pub trait KafkaDeserializer<T>: Send + Sync + 'static {
    /// The element of `record`.
    fn deserialize(&self, record: &KafkaRecord<'_>) -> Result<T, String>;
}

impl<T, F> KafkaDeserializer<T> for F
where
    F: Fn(&KafkaRecord<'_>) -> Result<T, String> + Send + Sync + 'static,
{
    fn deserialize(&self, record: &KafkaRecord<'_>) -> Result<T, String> {
        self(record)
    }
}

/// The value's bytes (an absent value is empty).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawBytes;

impl KafkaDeserializer<Vec<u8>> for RawBytes {
    fn deserialize(&self, record: &KafkaRecord<'_>) -> Result<Vec<u8>, String> {
        Ok(record.payload.unwrap_or_default().to_vec())
    }
}

/// The value as UTF-8 text, without a trailing `\n` or `\r\n`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Utf8Lines;

impl KafkaDeserializer<String> for Utf8Lines {
    fn deserialize(&self, record: &KafkaRecord<'_>) -> Result<String, String> {
        let bytes = record.payload.unwrap_or_default();
        let text = std::str::from_utf8(bytes).map_err(|e| format!("the value is not UTF-8 ({e})"))?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        Ok(text.strip_suffix('\r').unwrap_or(text).to_string())
    }
}

/// The value as JSON of `T`.
pub struct Json<T>(PhantomData<fn() -> T>);

impl<T> Default for Json<T> {
    fn default() -> Self {
        Json(PhantomData)
    }
}

impl<T: DeserializeOwned + 'static> KafkaDeserializer<T> for Json<T> {
    fn deserialize(&self, record: &KafkaRecord<'_>) -> Result<T, String> {
        serde_json::from_slice(record.payload.unwrap_or_default())
            .map_err(|e| format!("the value is not the JSON expected: {e}"))
    }
}

/// How long a reader waits for the brokers when it starts, by default.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Flink's default `partition.discovery.interval.ms` for unbounded sources (5 minutes).
const DISCOVERY_INTERVAL_DEFAULT: Duration = Duration::from_secs(300);
/// A request to the brokers while the job runs (watermarks, metadata), at most.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Position elements' format version.
const POSITION_VERSION: u8 = 1;
/// Checkpoints whose offsets wait for their completion, at most (older ones are dropped:
/// a later completion commits newer offsets anyway).
const PENDING_COMMITS_MAX: usize = 64;

/// The source's settings, shared by its readers.
#[derive(Clone)]
struct Settings {
    bootstrap: String,
    topics: Topics,
    group_id: Option<String>,
    properties: BTreeMap<String, String>,
    starting: StartingOffsets,
    bounded: bool,
    discovery_interval: Option<Duration>,
    commit_on_checkpoint: Option<bool>,
    skip_undeserializable: bool,
    startup_timeout: Duration,
}

/// A Kafka source of `T`; see the module docs.
pub struct KafkaSource<T> {
    settings: Arc<Settings>,
    deserializer: Arc<dyn KafkaDeserializer<T>>,
}

impl<T> Clone for KafkaSource<T> {
    fn clone(&self) -> Self {
        KafkaSource { settings: Arc::clone(&self.settings), deserializer: Arc::clone(&self.deserializer) }
    }
}

impl<T: Send + 'static> KafkaSource<T> {
    /// Reads `topics` from the brokers `bootstrap` (`host:port,...`) through `deserializer`,
    /// unbounded, from the earliest offsets.
    pub fn new(bootstrap: &str, topics: Topics, deserializer: impl KafkaDeserializer<T>) -> KafkaSource<T> {
        KafkaSource {
            settings: Arc::new(Settings {
                bootstrap: bootstrap.to_string(),
                topics,
                group_id: None,
                properties: BTreeMap::new(),
                starting: StartingOffsets::Earliest,
                bounded: false,
                discovery_interval: Some(DISCOVERY_INTERVAL_DEFAULT),
                commit_on_checkpoint: None,
                skip_undeserializable: false,
                startup_timeout: STARTUP_TIMEOUT,
            }),
            deserializer: Arc::new(deserializer),
        }
    }

    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The consumer group (`group.id`): committed offsets start from it, and checkpoints
    /// commit to it.
    pub fn group_id(mut self, group: &str) -> Self {
        self.settings_mut().group_id = Some(group.to_string());
        self
    }
    /// Where partitions without a checkpointed offset start.
    pub fn starting_offsets(mut self, starting: StartingOffsets) -> Self {
        self.settings_mut().starting = starting;
        self
    }
    /// Stop at the offsets that were the latest when each partition was first assigned, then
    /// finish.
    pub fn bounded(mut self) -> Self {
        self.settings_mut().bounded = true;
        self
    }
    /// A librdkafka client property (`security.protocol`, `isolation.level`, ...). Two keys
    /// are the source's own, as in Flink: `partition.discovery.interval.ms` (0 or less:
    /// never) and `commit.offsets.on.checkpoint`.
    pub fn property(mut self, key: &str, value: &str) -> Result<Self, String> {
        let settings = self.settings_mut();
        match key {
            "partition.discovery.interval.ms" => {
                let ms: i64 = value.parse().map_err(|_| {
                    format!("partition.discovery.interval.ms '{value}' is not a number of milliseconds")
                })?;
                settings.discovery_interval = (ms > 0).then(|| Duration::from_millis(ms as u64));
            }
            "commit.offsets.on.checkpoint" => {
                let on = value
                    .parse::<bool>()
                    .map_err(|_| format!("commit.offsets.on.checkpoint '{value}' is not true or false"))?;
                settings.commit_on_checkpoint = Some(on);
            }
            "group.id" => settings.group_id = Some(value.to_string()),
            "enable.auto.commit" if value == "true" => {
                return Err("enable.auto.commit=true is not supported: offsets live in checkpoints and go to the group when one completes (commit.offsets.on.checkpoint)".to_string());
            }
            _ => {
                settings.properties.insert(key.to_string(), value.to_string());
            }
        }
        Ok(self)
    }
    /// Records the deserialiser rejects are skipped (and counted) instead of failing the job.
    pub fn skip_undeserializable(mut self) -> Self {
        self.settings_mut().skip_undeserializable = true;
        self
    }
    /// How long a reader retries brokers it cannot reach when it starts (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.settings_mut().startup_timeout = timeout;
        self
    }
}

/// One partition position in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct PartitionPosition {
    version: u8,
    topic: String,
    partition: i32,
    next_offset: i64,
    stop_offset: Option<i64>,
}

fn decode_positions(elements: &[Vec<u8>]) -> Result<Vec<PartitionPosition>, String> {
    let mut positions = Vec::with_capacity(elements.len());
    for bytes in elements {
        let position: PartitionPosition = postcard::from_bytes(bytes).map_err(|e| {
            format!("kafka source: a checkpointed offset cannot be decoded ({e}); the snapshot's source state was not written by a Kafka source")
        })?;
        if position.version != POSITION_VERSION {
            return Err(format!(
                "kafka source: a checkpointed offset has format version {}, this weir reads version {POSITION_VERSION}",
                position.version
            ));
        }
        if position.topic.is_empty() || position.partition < 0 || position.next_offset < 0 {
            return Err(format!(
                "kafka source: the checkpointed offset '{}' partition {} offset {} is not valid; the snapshot is corrupt",
                position.topic, position.partition, position.next_offset
            ));
        }
        positions.push(position);
    }
    Ok(positions)
}

fn external(what: impl Into<String>, e: impl std::fmt::Display) -> TaskError {
    TaskError::external(what.into(), e.to_string())
}

impl<T: Send + 'static> Source<T> for KafkaSource<T> {
    fn boundedness(&self) -> Boundedness {
        if self.settings.bounded { Boundedness::Bounded } else { Boundedness::Unbounded }
    }

    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        Ok(Box::new(KafkaReader::open(self, ctx, None)?))
    }

    fn restore_reader(
        &self,
        ctx: &TaskContext,
        positions: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SourceReader<T>>, TaskError> {
        let positions = decode_positions(&positions).map_err(|e| external("kafka source: restoring offsets", e))?;
        Ok(Box::new(KafkaReader::open(self, ctx, Some(positions))?))
    }

    fn check_restore(&self, positions: &[Vec<u8>]) -> Result<Vec<String>, String> {
        let positions = decode_positions(positions)?;
        let topics: BTreeSet<&str> = positions.iter().map(|p| p.topic.as_str()).collect();
        Ok(vec![format!(
            "kafka source: resumes {} partitions of {} from their checkpointed offsets; partitions not in the snapshot start from the earliest offset",
            positions.len(),
            topics.into_iter().collect::<Vec<_>>().join(", ")
        )])
    }
}

/// librdkafka's statistics (every `statistics.interval.ms`): each partition's end, for the
/// lag metric, read without a request to the brokers.
#[derive(Clone, Default)]
struct SourceContext {
    ends: Arc<std::sync::Mutex<BTreeMap<(String, i32), i64>>>,
}

impl rdkafka::ClientContext for SourceContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        for (name, topic) in statistics.topics {
            for (partition, stats) in topic.partitions {
                // The last stable offset is the end a read_committed consumer reads to.
                let end = if stats.ls_offset >= 0 { stats.ls_offset } else { stats.hi_offset };
                if partition >= 0 && end >= 0 {
                    ends.insert((name.clone(), partition), end);
                }
            }
        }
    }
}

impl ConsumerContext for SourceContext {}

/// How often a reader publishes its partitions' offsets and lag.
const METRICS_INTERVAL: Duration = Duration::from_secs(1);

struct PartitionReader {
    topic: String,
    partition: i32,
    next_offset: i64,
    stop_offset: Option<i64>,
    done: bool,
    /// The offset at which the consumer last reported the partition's end, and how many times
    /// in a row it did there (bounded mode).
    eof_at: Option<(i64, Instant)>,
}

struct KafkaReader<T> {
    consumer: Arc<BaseConsumer<SourceContext>>,
    context: SourceContext,
    metrics: Arc<weir_api::operator::TaskMetrics>,
    next_metrics: Instant,
    settings: Arc<Settings>,
    decoder: Decoder<T>,
    subtask: u32,
    parallelism: u32,
    partitions: Vec<PartitionReader>,
    /// Each partition's record queue, by the index of `partitions`.
    queues: Vec<PartitionQueue<SourceContext>>,
    /// The partition (index of `partitions`) of each record the last poll appended, and per
    /// partition whether it ended: the splits of per-partition watermarks.
    record_splits: Vec<u32>,
    ended: Vec<bool>,
    cursor: usize,
    pattern: Option<regex::Regex>,
    pending_commits: VecDeque<(u64, TopicPartitionList)>,
    commit_on_checkpoint: bool,
    next_discovery: Option<Instant>,
    operator: String,
}

impl<T: Send + 'static> KafkaReader<T> {
    fn open(
        source: &KafkaSource<T>,
        ctx: &TaskContext,
        restored: Option<Vec<PartitionPosition>>,
    ) -> Result<Self, TaskError> {
        let settings = Arc::clone(&source.settings);
        let mut properties = settings.properties.clone();
        properties.insert("enable.auto.commit".into(), "false".into());
        properties.insert("enable.auto.offset.store".into(), "false".into());
        properties.insert("enable.partition.eof".into(), settings.bounded.to_string());
        if let Some(group) = &settings.group_id {
            properties.insert("group.id".into(), group.clone());
        } else {
            // librdkafka wants a group to create a consumer; nothing is committed to it.
            properties.insert("group.id".into(), format!("weir-{}", ctx.job_id));
        }
        properties.entry("statistics.interval.ms".into()).or_insert_with(|| "1000".into());
        let context = SourceContext::default();
        let consumer: BaseConsumer<SourceContext> = client_config(&settings.bootstrap, &properties)
            .create_with_context(context.clone())
            .map_err(|e| external(format!("kafka source: creating a consumer for {}", settings.bootstrap), e))?;
        let pattern = match &settings.topics {
            Topics::Pattern(pattern) => Some(regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
                external(
                    format!("kafka source: the topic pattern '{pattern}'"),
                    format!("{e}; give a regular expression"),
                )
            })?),
            Topics::Names(_) => None,
        };
        let commit_on_checkpoint = settings.commit_on_checkpoint.unwrap_or(settings.group_id.is_some());
        let mut reader = KafkaReader {
            consumer: Arc::new(consumer),
            context,
            metrics: Arc::clone(&ctx.metrics),
            next_metrics: Instant::now(),
            settings,
            decoder: Decoder {
                deserializer: Arc::clone(&source.deserializer),
                skip_undeserializable: source.settings.skip_undeserializable,
                metrics: Arc::clone(&ctx.metrics),
            },
            subtask: ctx.subtask_index,
            parallelism: ctx.parallelism,
            partitions: Vec::new(),
            queues: Vec::new(),
            record_splits: Vec::new(),
            ended: Vec::new(),
            cursor: 0,
            pattern,
            pending_commits: VecDeque::new(),
            commit_on_checkpoint,
            next_discovery: None,
            operator: ctx.operator_name.clone(),
        };
        let available = reader.wait_for_brokers(ctx)?;
        let mut restored_positions = Vec::new();
        let fresh_start = restored.is_none();
        for position in restored.unwrap_or_default() {
            if partition_owner(&position.topic, position.partition, reader.parallelism) == reader.subtask {
                restored_positions.push(position);
            }
        }
        reader.assign_restored(restored_positions)?;
        reader.assign_new(&available, fresh_start)?;
        if !reader.settings.bounded {
            reader.next_discovery = reader.settings.discovery_interval.map(|interval| Instant::now() + interval);
        }
        Ok(reader)
    }

    /// The partitions of the source's topics, waiting for the brokers up to the startup timeout.
    fn wait_for_brokers(&self, ctx: &TaskContext) -> Result<Vec<(String, i32)>, TaskError> {
        let deadline = Instant::now() + self.settings.startup_timeout;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.list_partitions() {
                Ok(found) => return Ok(found),
                Err(ListError::Fatal(e)) => return Err(e),
                Err(ListError::Unreachable(reason)) => {
                    if Instant::now() >= deadline || ctx.cancel.load(std::sync::atomic::Ordering::Relaxed) {
                        return Err(TaskError::external(
                            format!("kafka source: reaching the brokers {}", self.settings.bootstrap),
                            format!(
                                "{reason} (tried for {:?}); check bootstrap.servers and that the brokers run",
                                self.settings.startup_timeout
                            ),
                        ));
                    }
                    tracing::warn!(
                        bootstrap = %self.settings.bootstrap,
                        attempt,
                        "kafka source {}: waiting for the brokers: {reason}",
                        self.operator
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }

    /// Every partition of the source's topics (all subtasks').
    fn list_partitions(&self) -> Result<Vec<(String, i32)>, ListError> {
        let timeout = Duration::from_secs(2);
        let unreachable = |e: KafkaError| ListError::Unreachable(e.to_string());
        let mut found = Vec::new();
        match &self.settings.topics {
            Topics::Names(names) => {
                for name in names {
                    let metadata = self.consumer.fetch_metadata(Some(name), timeout).map_err(unreachable)?;
                    let Some(topic) = metadata.topics().iter().find(|t| t.name() == name) else {
                        return Err(ListError::missing(name, &self.settings.bootstrap));
                    };
                    if let Some(error) = topic.error() {
                        let code = RDKafkaErrorCode::from(error);
                        if code == RDKafkaErrorCode::UnknownTopicOrPartition || code == RDKafkaErrorCode::UnknownTopic {
                            return Err(ListError::missing(name, &self.settings.bootstrap));
                        }
                        return Err(ListError::Unreachable(format!("topic '{name}': {code}")));
                    }
                    if topic.partitions().is_empty() {
                        return Err(ListError::missing(name, &self.settings.bootstrap));
                    }
                    found.extend(topic.partitions().iter().map(|p| (name.clone(), p.id())));
                }
            }
            Topics::Pattern(_) => {
                let metadata = self.consumer.fetch_metadata(None, timeout).map_err(unreachable)?;
                for topic in metadata.topics() {
                    if self.pattern.as_ref().is_some_and(|p| p.is_match(topic.name())) && topic.error().is_none() {
                        found.extend(topic.partitions().iter().map(|p| (topic.name().to_string(), p.id())));
                    }
                }
            }
        }
        found.sort();
        Ok(found)
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), TaskError> {
        self.consumer.fetch_watermarks(topic, partition, REQUEST_TIMEOUT).map_err(|e| {
            external(
                format!(
                    "kafka source: reading the offsets of '{topic}' partition {partition} on {}",
                    self.settings.bootstrap
                ),
                e,
            )
        })
    }

    /// Where a partition without a checkpointed offset starts: the configured starting
    /// offsets on a fresh start, the earliest offset for one discovered later (Flink's rule).
    fn starting_offset(&self, topic: &str, partition: i32, fresh_start: bool) -> Result<i64, TaskError> {
        let (low, high) = self.watermarks(topic, partition)?;
        let starting = if fresh_start { self.settings.starting } else { StartingOffsets::Earliest };
        Ok(match starting {
            StartingOffsets::Earliest => low,
            StartingOffsets::Latest => high,
            StartingOffsets::Committed(reset) => {
                let mut list = TopicPartitionList::new();
                list.add_partition(topic, partition);
                let committed = self.consumer.committed_offsets(list, REQUEST_TIMEOUT).map_err(|e| {
                    external(
                        format!("kafka source: reading the committed offset of '{topic}' partition {partition}"),
                        e,
                    )
                })?;
                match committed.find_partition(topic, partition).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) => offset.clamp(low, high),
                    _ => match reset {
                        OffsetReset::Earliest => low,
                        OffsetReset::Latest => high,
                        OffsetReset::None => {
                            return Err(TaskError::external(
                                format!(
                                    "kafka source: starting '{topic}' partition {partition} from the committed offset"
                                ),
                                format!(
                                    "the group '{}' has no committed offset for it and the reset strategy is none; choose starting offsets earliest or latest, or a reset strategy",
                                    self.settings.group_id.as_deref().unwrap_or("")
                                ),
                            ));
                        }
                    },
                }
            }
            StartingOffsets::Timestamp(ms) => {
                let mut list = TopicPartitionList::new();
                list.add_partition_offset(topic, partition, Offset::Offset(ms))
                    .map_err(|e| external("kafka source", e))?;
                let found = self.consumer.offsets_for_times(list, REQUEST_TIMEOUT).map_err(|e| {
                    external(
                        format!(
                            "kafka source: finding the offset of timestamp {ms} in '{topic}' partition {partition}"
                        ),
                        e,
                    )
                })?;
                match found.find_partition(topic, partition).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) => offset,
                    _ => high,
                }
            }
        })
    }

    fn add_partition(
        &mut self,
        topic: &str,
        partition: i32,
        next_offset: i64,
        stop_offset: Option<i64>,
    ) -> Result<(), TaskError> {
        // The queue is split off before the partition is assigned, so its first fetch lands
        // in it (a record that still reaches the main queue is routed by `poll_next`).
        let queue = self.consumer.split_partition_queue(topic, partition).ok_or_else(|| {
            TaskError::Internal(format!("kafka source: no queue for '{topic}' partition {partition}"))
        })?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(next_offset))
            .map_err(|e| external("kafka source", e))?;
        self.consumer
            .incremental_assign(&list)
            .map_err(|e| external(format!("kafka source: assigning '{topic}' partition {partition}"), e))?;
        let done = stop_offset.is_some_and(|stop| next_offset >= stop);
        self.partitions.push(PartitionReader {
            topic: topic.to_string(),
            partition,
            next_offset,
            stop_offset,
            done,
            eof_at: None,
        });
        self.queues.push(queue);
        Ok(())
    }

    fn assign_restored(&mut self, positions: Vec<PartitionPosition>) -> Result<(), TaskError> {
        for position in positions {
            // A position from an unbounded run, restored into a bounded one, stops at today's end.
            let stop = match (self.settings.bounded, position.stop_offset) {
                (false, _) => None,
                (true, Some(stop)) => Some(stop),
                (true, None) => Some(self.watermarks(&position.topic, position.partition)?.1),
            };
            tracing::info!(
                topic = %position.topic, partition = position.partition, offset = position.next_offset, stop = ?stop,
                "kafka source {}: resuming a partition", self.operator
            );
            self.add_partition(&position.topic, position.partition, position.next_offset, stop)?;
        }
        Ok(())
    }

    /// Assigns the partitions of `available` this subtask owns and does not read yet.
    fn assign_new(&mut self, available: &[(String, i32)], fresh_start: bool) -> Result<(), TaskError> {
        let reading: BTreeSet<(String, i32)> = self.partitions.iter().map(|p| (p.topic.clone(), p.partition)).collect();
        for (topic, partition) in available {
            if partition_owner(topic, *partition, self.parallelism) != self.subtask
                || reading.contains(&(topic.clone(), *partition))
            {
                continue;
            }
            let start = self.starting_offset(topic, *partition, fresh_start)?;
            let stop = if self.settings.bounded { Some(self.watermarks(topic, *partition)?.1) } else { None };
            tracing::info!(topic = %topic, partition, offset = start, stop = ?stop, "kafka source {}: reading a partition", self.operator);
            self.add_partition(topic, *partition, start, stop)?;
        }
        Ok(())
    }

    fn discover(&mut self) -> Result<(), TaskError> {
        match self.list_partitions() {
            Ok(available) => self.assign_new(&available, false),
            Err(ListError::Fatal(e)) => Err(e),
            Err(ListError::Unreachable(reason)) => {
                tracing::warn!("kafka source {}: partition discovery failed, retried later: {reason}", self.operator);
                Ok(())
            }
        }
    }

    /// Publishes each partition's position and lag to the task's metrics.
    fn publish_metrics(&mut self) {
        self.next_metrics = Instant::now() + METRICS_INTERVAL;
        let ends = self.context.ends.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let splits = self
            .partitions
            .iter()
            .map(|p| weir_api::operator::SplitPosition {
                split: format!("{}-{}", p.topic, p.partition),
                current_offset: p.next_offset,
                lag: ends.get(&(p.topic.clone(), p.partition)).map(|end| (end - p.next_offset).max(0)),
            })
            .collect();
        self.metrics.set_splits(splits);
    }

    /// An error the consumer reported: a missing topic or a fatal client error fails the task;
    /// anything else (a broker briefly away) is logged and retried by librdkafka.
    fn on_error(&self, error: KafkaError) -> Result<(), TaskError> {
        let code = error.rdkafka_error_code();
        if matches!(error, KafkaError::MessageConsumptionFatal(_))
            || matches!(
                code,
                Some(
                    RDKafkaErrorCode::UnknownTopicOrPartition
                        | RDKafkaErrorCode::UnknownTopic
                        | RDKafkaErrorCode::TopicAuthorizationFailed
                )
            )
        {
            return Err(external(format!("kafka source: reading from {}", self.settings.bootstrap), error));
        }
        tracing::warn!("kafka source {}: {error}", self.operator);
        Ok(())
    }
}

enum ListError {
    /// The brokers did not answer in time.
    Unreachable(String),
    /// A configured topic is missing (or another error that retrying does not fix).
    Fatal(TaskError),
}

impl ListError {
    fn missing(topic: &str, bootstrap: &str) -> ListError {
        ListError::Fatal(TaskError::external(
            format!("kafka source: topic '{topic}'"),
            format!("it does not exist on {bootstrap}; create it or correct the topic name"),
        ))
    }
}

/// How long a bounded partition's end must be reported at the same offset, fetching anew each
/// time, before the partition counts as read although its stop offset was not reached (the
/// offsets left are transaction markers). A loaded broker can report an end early; it never
/// keeps doing so for a second.
const EOF_CONFIRMATION_TIME: Duration = Duration::from_secs(1);
/// Turns a partition's records into elements; skipped records count in the task's metrics.
struct Decoder<T> {
    deserializer: Arc<dyn KafkaDeserializer<T>>,
    skip_undeserializable: bool,
    metrics: Arc<weir_api::operator::TaskMetrics>,
}

impl<T: 'static> Decoder<T> {
    /// Takes one record of `partition`: appends its element to `out` (true) unless it is at
    /// or past the stop offset, before the position, or skipped as undeserialisable, and moves
    /// the position past it.
    fn accept(
        &self,
        partition: &mut PartitionReader,
        message: &rdkafka::message::BorrowedMessage<'_>,
        out: &mut Vec<T>,
    ) -> Result<bool, TaskError> {
        let offset = message.offset();
        if let Some(stop) = partition.stop_offset
            && offset >= stop
        {
            partition.done = true;
            return Ok(false);
        }
        if offset < partition.next_offset {
            // Delivered again (a fetch that overlapped a seek): already emitted.
            return Ok(false);
        }
        let record = KafkaRecord {
            topic: &partition.topic,
            partition: partition.partition,
            offset,
            timestamp: message.timestamp().to_millis(),
            key: message.key(),
            payload: message.payload(),
        };
        let emitted = match self.deserializer.deserialize(&record) {
            Ok(element) => {
                out.push(element);
                true
            }
            Err(reason) if self.skip_undeserializable => {
                let skipped = self.metrics.records_skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                tracing::warn!(
                    topic = %partition.topic, partition = partition.partition, offset, skipped,
                    "kafka source: skipped a record that cannot be deserialised: {reason}"
                );
                false
            }
            Err(reason) => {
                return Err(TaskError::external(
                    format!(
                        "kafka source: deserialising the record at offset {offset} of '{}' partition {}",
                        partition.topic, partition.partition
                    ),
                    format!("{reason}; fix the producer, or let the source skip such records (skip-undeserializable)"),
                ));
            }
        };
        partition.next_offset = offset + 1;
        partition.eof_at = None;
        if partition.stop_offset.is_some_and(|stop| partition.next_offset >= stop) {
            partition.done = true;
        }
        Ok(emitted)
    }
}

/// How long an idle reader sleeps before it looks again.
const IDLE_WAIT: Duration = Duration::from_millis(5);

impl<T: Send + 'static> SourceReader<T> for KafkaReader<T> {
    fn poll_next(&mut self, out: &mut Vec<T>, max_records: usize) -> Result<SourcePoll, TaskError> {
        if let Some(due) = self.next_discovery
            && Instant::now() >= due
        {
            self.discover()?;
            self.next_discovery = self.settings.discovery_interval.map(|interval| Instant::now() + interval);
        }
        if Instant::now() >= self.next_metrics {
            self.publish_metrics();
        }
        let budget = max_records.saturating_sub(out.len());
        let mut produced = 0;
        self.record_splits.clear();
        // The main queue carries errors and commit results. Records come from the partitions'
        // queues, but one fetched before its queue was split off lands here: it goes to its
        // partition like any other (never dropped: its offset would be skipped).
        let consumer = Arc::clone(&self.consumer);
        while produced < budget {
            let Some(event) = consumer.poll(Duration::ZERO) else { break };
            match event {
                Ok(message) => {
                    let found = self
                        .partitions
                        .iter()
                        .position(|p| p.partition == message.partition() && p.topic == message.topic());
                    let Some(index) = found else { continue };
                    let partition = &mut self.partitions[index];
                    if partition.done {
                        continue;
                    }
                    if self.decoder.accept(partition, &message, out)? {
                        produced += 1;
                        self.record_splits.push(index as u32);
                    }
                }
                Err(KafkaError::PartitionEOF(_)) => {}
                Err(e) => self.on_error(e)?,
            }
        }
        let mut refetch = Vec::new();
        let count = self.partitions.len();
        for step in 0..count {
            if produced >= budget {
                break;
            }
            let index = (self.cursor + step) % count;
            let (queue, partition) = (&self.queues[index], &mut self.partitions[index]);
            if partition.done {
                continue;
            }
            while produced < budget {
                let Some(event) = queue.poll(Duration::ZERO) else { break };
                let message = match event {
                    Ok(message) => message,
                    Err(KafkaError::PartitionEOF(_)) => {
                        if partition.stop_offset.is_some() {
                            // The end of a bounded partition whose last offsets before the stop
                            // are transaction markers (no record to see them by). An end seen
                            // while the broker lags is not the end: only the same end, seen
                            // again after fetching anew for EOF_CONFIRMATION_TIME, counts.
                            match partition.eof_at {
                                Some((offset, _)) if offset == partition.next_offset => {}
                                _ => partition.eof_at = Some((partition.next_offset, Instant::now())),
                            }
                            let confirmed =
                                partition.eof_at.is_some_and(|(_, since)| since.elapsed() >= EOF_CONFIRMATION_TIME);
                            if confirmed {
                                tracing::info!(
                                    topic = %partition.topic, partition = partition.partition, next_offset = partition.next_offset,
                                    "kafka source: reached the end of a bounded partition"
                                );
                                partition.done = true;
                            } else {
                                refetch.push((partition.topic.clone(), partition.partition, partition.next_offset));
                            }
                        }
                        break;
                    }
                    Err(e) => {
                        let code = e.rdkafka_error_code();
                        if matches!(e, KafkaError::MessageConsumptionFatal(_))
                            || matches!(
                                code,
                                Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic)
                            )
                        {
                            return Err(external(
                                format!(
                                    "kafka source: reading '{}' partition {}",
                                    partition.topic, partition.partition
                                ),
                                e,
                            ));
                        }
                        tracing::warn!("kafka source: '{}' partition {}: {e}", partition.topic, partition.partition);
                        break;
                    }
                };
                if self.decoder.accept(partition, &message, out)? {
                    produced += 1;
                    self.record_splits.push(index as u32);
                }
                if partition.done {
                    break;
                }
            }
        }
        if count > 0 {
            self.cursor = (self.cursor + 1) % count;
        }
        self.ended.clear();
        self.ended.extend(self.partitions.iter().map(|p| p.done));
        for (topic, partition, offset) in refetch {
            if let Err(e) = self.consumer.seek(&topic, partition, Offset::Offset(offset), REQUEST_TIMEOUT) {
                tracing::warn!("kafka source: fetching '{topic}' partition {partition} again from {offset}: {e}");
            }
        }
        if produced > 0 {
            return Ok(SourcePoll::Data);
        }
        if self.settings.bounded && self.partitions.iter().all(|p| p.done) {
            return Ok(SourcePoll::End);
        }
        Ok(SourcePoll::Idle(IDLE_WAIT))
    }

    fn splits(&self) -> Option<SplitInfo<'_>> {
        Some(SplitInfo { records: &self.record_splits, ended: &self.ended })
    }

    fn snapshot_positions(&self) -> SourcePositions {
        let elements = self
            .partitions
            .iter()
            .map(|p| {
                let position = PartitionPosition {
                    version: POSITION_VERSION,
                    topic: p.topic.clone(),
                    partition: p.partition,
                    next_offset: p.next_offset,
                    stop_offset: p.stop_offset,
                };
                // Serializing strings and integers into memory cannot fail.
                postcard::to_allocvec(&position).unwrap_or_default()
            })
            .collect();
        SourcePositions { mode: Redistribution::Union, elements }
    }

    fn snapshot_positions_for(&mut self, checkpoint_id: u64) -> SourcePositions {
        if self.commit_on_checkpoint {
            let mut list = TopicPartitionList::new();
            for p in &self.partitions {
                let _ = list.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.next_offset));
            }
            self.pending_commits.push_back((checkpoint_id, list));
            while self.pending_commits.len() > PENDING_COMMITS_MAX {
                self.pending_commits.pop_front();
            }
        }
        self.snapshot_positions()
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        let mut newest = None;
        while self.pending_commits.front().is_some_and(|(id, _)| *id <= checkpoint_id) {
            newest = self.pending_commits.pop_front();
        }
        if let Some((id, list)) = newest
            && list.count() > 0
            && let Err(e) = self.consumer.commit(&list, CommitMode::Sync)
        {
            // The offsets are in the checkpoint; the group's copy is for monitoring and
            // stateless restarts, so a failed commit is not the job's failure (as in Flink).
            tracing::warn!(
                "kafka source {}: committing the offsets of checkpoint {id} to the group: {e}",
                self.operator
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn positions_round_trip(topic in "[a-z]{1,10}", partition in 0i32..1000, offset in 0i64..i64::MAX, stop in proptest::option::of(0i64..i64::MAX)) {
            let position = PartitionPosition { version: POSITION_VERSION, topic, partition, next_offset: offset, stop_offset: stop };
            let bytes = postcard::to_allocvec(&position).unwrap();
            prop_assert_eq!(decode_positions(&[bytes]).unwrap(), vec![position]);
        }
    }

    #[test]
    fn a_bad_position_is_refused_naming_the_problem() {
        let bad = PartitionPosition {
            version: POSITION_VERSION,
            topic: "t".into(),
            partition: -1,
            next_offset: 0,
            stop_offset: None,
        };
        let err = decode_positions(&[postcard::to_allocvec(&bad).unwrap()]).unwrap_err();
        assert!(err.contains("corrupt"), "{err}");
        let newer = PartitionPosition { version: 9, ..bad };
        assert!(decode_positions(&[postcard::to_allocvec(&newer).unwrap()]).unwrap_err().contains("version 9"));
        assert!(decode_positions(&[vec![1, 2]]).is_err());
    }

    #[test]
    fn deserialisers() {
        let record = |payload: &'static [u8]| KafkaRecord {
            topic: "t",
            partition: 0,
            offset: 5,
            timestamp: None,
            key: None,
            payload: Some(payload),
        };
        assert_eq!(Utf8Lines.deserialize(&record(b"hello\r\n")).unwrap(), "hello");
        assert!(Utf8Lines.deserialize(&record(b"\xff")).is_err());
        assert_eq!(RawBytes.deserialize(&record(b"\x00\x01")).unwrap(), vec![0, 1]);
        let json: Json<BTreeMap<String, u64>> = Json::default();
        assert_eq!(json.deserialize(&record(br#"{"user":3}"#)).unwrap()["user"], 3);
        assert!(json.deserialize(&record(b"nope")).is_err());
    }

    proptest! {
        /// Valid checkpointed offsets, mutated: decoding and the restore check are errors or
        /// valid positions, never a panic or a claimed-size allocation.
        #[test]
        fn mutated_positions_decode_or_fail_cleanly(
            topic in "[a-z]{1,10}",
            partition in 0i32..1000,
            offset in 0i64..1_000_000,
            stop in proptest::option::of(0i64..1_000_000),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let position = PartitionPosition { version: POSITION_VERSION, topic, partition, next_offset: offset, stop_offset: stop };
            let bytes = weir_types::fuzzing::mutate(&postcard::to_allocvec(&position).unwrap(), &mutations);
            let decoded = weir_types::fuzzing::with_allocation_cap(64 << 20, || decode_positions(std::slice::from_ref(&bytes)));
            match decoded {
                Err(refused) => prop_assert!(false, "decoding asked for {} bytes at once", refused),
                Ok(Err(_)) => {}
                Ok(Ok(positions)) => {
                    prop_assert!(positions.iter().all(|p| !p.topic.is_empty() && p.partition >= 0 && p.next_offset >= 0));
                }
            }
        }
    }
}
