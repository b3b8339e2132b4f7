//! The Kafka sink against a real broker (noida-db, started as the weir-cli Kafka tests start
//! it; `.ci/test` installs it).

use super::*;
use rdkafka::producer::{BaseRecord, Producer};

#[path = "../../../weir-cli/tests/common/kafka.rs"]
#[allow(dead_code)]
mod broker;

fn transactional(bootstrap: &str, id: &str) -> ThreadedProducer<DeliveryErrors> {
    let mut properties = BTreeMap::new();
    properties.insert("transactional.id".to_string(), id.to_string());
    let producer: ThreadedProducer<DeliveryErrors> =
        client_config(bootstrap, &properties).create_with_context(DeliveryErrors::default()).unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    producer.begin_transaction().unwrap();
    producer
}

fn send(producer: &ThreadedProducer<DeliveryErrors>, topic: &str, value: &str) -> Result<(), String> {
    producer.send(BaseRecord::<(), str>::to(topic).payload(value).partition(0)).map_err(|(e, _)| e.to_string())?;
    producer.flush(Duration::from_secs(10)).map_err(|e| e.to_string())?;
    match producer.context().0.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// An exactly-once sink of strings into `out`, with `out` created on a fresh broker.
fn exactly_once_sink() -> (broker::Broker, KafkaSink<String>) {
    let broker = broker::Broker::start();
    broker.create_topic("out", 1);
    let serializer = |v: &String| KafkaSinkRecord { value: v.as_bytes().to_vec(), ..KafkaSinkRecord::default() };
    let sink = KafkaSink::new(&broker.bootstrap, "out", serializer).delivery_guarantee(DeliveryGuarantee::ExactlyOnce);
    (broker, sink)
}

/// A zombie's producer whose open transaction a restore aborted sends on (a frozen process
/// woken: librdkafka's queued requests go out at once). Its records must be refused: a
/// record accepted after the abort opens a transaction no coordinator knows, which holds
/// every `read_committed` reader of the partition back for good (Kafka's KIP-890).
#[test]
fn a_zombie_writing_after_its_lingering_transaction_was_aborted_blocks_no_reader() {
    let (broker, sink) = exactly_once_sink();
    let zombie = transactional(&broker.bootstrap, "p-0-3");
    send(&zombie, "out", "zombie-1").unwrap();
    assert_eq!(sink.abort_lingering("p", 0, 3).unwrap(), 4);
    let late = send(&zombie, "out", "zombie-2");
    let next = transactional(&broker.bootstrap, "p-0-4");
    send(&next, "out", "restored-1").unwrap();
    next.commit_transaction(Duration::from_secs(10)).unwrap();
    let seen = broker.read_committed("out", 1, Duration::from_secs(10));
    assert_eq!(seen, vec!["restored-1".to_string()], "the zombie's late send: {late:?}");
}

/// A zombie that opens its next transaction after the job restarted it elsewhere finds the
/// id in use (the new attempt committed under it) and opens nothing.
#[test]
fn a_writer_never_opens_a_transaction_under_an_id_the_broker_knows() {
    let (broker, sink) = exactly_once_sink();
    let used = transactional(&broker.bootstrap, "p-0-7");
    send(&used, "out", "restored-1").unwrap();
    used.commit_transaction(Duration::from_secs(10)).unwrap();
    let writer = sink.writer(&TaskContext::for_test(0, 1, 128), "p".into(), 7).unwrap();
    let error = writer.check_unused("p-0-7").unwrap_err().to_string();
    assert!(error.contains("already knows this transactional id") && error.contains("CompleteCommit"), "{error}");
    assert!(writer.check_unused("p-0-8").is_ok());
}

/// A record the client refuses (larger than `message.max.bytes`) fails the writer with the
/// reason and counts as a send error in the subtask's metrics (Flink's `numRecordsSendErrors`).
#[test]
fn a_record_the_client_refuses_is_counted_as_a_send_error() {
    let broker = broker::Broker::start();
    broker.create_topic("out", 1);
    let serializer = |v: &String| KafkaSinkRecord { value: v.as_bytes().to_vec(), ..KafkaSinkRecord::default() };
    let sink = KafkaSink::new(&broker.bootstrap, "out", serializer)
        .delivery_guarantee(DeliveryGuarantee::AtLeastOnce)
        .property("message.max.bytes", "1000");
    let ctx = TaskContext::for_test(0, 1, 128);
    let mut writer = sink.create_writer(&ctx).unwrap();
    writer.write_batch(&mut vec!["small".to_string()]).unwrap();
    let error = writer.write_batch(&mut vec!["x".repeat(5000)]).unwrap_err().to_string();
    assert!(error.contains("sending to 'out'"), "{error}");
    assert_eq!(ctx.metrics.records_send_errors.load(std::sync::atomic::Ordering::Relaxed), 1);
}
