//! What a user of the Kafka connector reaches for around a job: create and list topics,
//! produce records, read a topic back (read_committed, so only what a transactional sink
//! committed). `weir kafka` is these on the command line, so the tutorial's Kafka step needs
//! nothing but the installed binary and a broker.

use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::client_config;

/// How long a request to the broker may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// A failure naming the broker and what was asked of it.
#[derive(Debug, thiserror::Error)]
#[error("{what} at {bootstrap}: {reason}")]
pub struct KafkaToolError {
    what: String,
    bootstrap: String,
    reason: String,
}

fn failed(what: impl Into<String>, bootstrap: &str, reason: impl std::fmt::Display) -> KafkaToolError {
    KafkaToolError { what: what.into(), bootstrap: bootstrap.to_string(), reason: reason.to_string() }
}

/// Creates `topic` with `partitions` partitions (replication 1); an existing topic is an
/// error saying so.
pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), KafkaToolError> {
    let what = format!("creating topic {topic}");
    let admin: AdminClient<DefaultClientContext> =
        client_config(bootstrap, &Default::default()).create().map_err(|e| failed(&what, bootstrap, e))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(BROKER_TIMEOUT));
    let results =
        futures::executor::block_on(admin.create_topics([&new], &options)).map_err(|e| failed(&what, bootstrap, e))?;
    for result in results {
        result.map_err(|(_, e)| failed(&what, bootstrap, e))?;
    }
    Ok(())
}

/// The broker's topics, each with its partitions' count, by name (internal ones left out).
pub fn topics(bootstrap: &str) -> Result<Vec<(String, usize)>, KafkaToolError> {
    let consumer: BaseConsumer =
        client_config(bootstrap, &Default::default()).create().map_err(|e| failed("listing topics", bootstrap, e))?;
    let metadata = consumer.fetch_metadata(None, BROKER_TIMEOUT).map_err(|e| failed("listing topics", bootstrap, e))?;
    let mut topics: Vec<(String, usize)> = metadata
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__"))
        .map(|t| (t.name().to_string(), t.partitions().len()))
        .collect();
    topics.sort();
    Ok(topics)
}

/// Sends every value of `values` to `topic` (no key: the partitioner spreads them) and waits
/// until the broker has them all; how many were sent.
pub fn produce(bootstrap: &str, topic: &str, values: impl Iterator<Item = String>) -> Result<u64, KafkaToolError> {
    let what = format!("producing to {topic}");
    let producer: BaseProducer = client_config(bootstrap, &Default::default())
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .create()
        .map_err(|e| failed(&what, bootstrap, e))?;
    let mut sent = 0u64;
    for value in values {
        let mut record = BaseRecord::<str, str>::to(topic).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                // The local queue is full: let deliveries drain it.
                Err((
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    record = back;
                    producer.poll(Duration::from_millis(1));
                }
                Err((error, _)) => return Err(failed(&what, bootstrap, error)),
            }
        }
        sent += 1;
        if sent.is_multiple_of(1000) {
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(BROKER_TIMEOUT).map_err(|e| failed(&what, bootstrap, e))?;
    Ok(sent)
}

/// Reads `topic` from its beginning, read_committed (what a transactional sink committed,
/// once), handing each value to `each`, until `max` records or `idle` without one; how many
/// were read.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    max: Option<u64>,
    idle: Duration,
    mut each: impl FnMut(&[u8]),
) -> Result<u64, KafkaToolError> {
    let what = format!("reading {topic}");
    let consumer: BaseConsumer = client_config(bootstrap, &Default::default())
        .set("group.id", format!("weir-kafka-consume-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| failed(&what, bootstrap, e))?;
    consumer.subscribe(&[topic]).map_err(|e| failed(&what, bootstrap, e))?;
    let mut read = 0u64;
    let mut last = Instant::now();
    while max.is_none_or(|max| read < max) && last.elapsed() < idle {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                each(message.payload().unwrap_or_default());
                read += 1;
                last = Instant::now();
            }
            Some(Err(error)) => return Err(failed(&what, bootstrap, error)),
            None => {}
        }
    }
    Ok(read)
}
