//! [`KafkaSink`] with Flink's delivery guarantees.
//!
//! `exactly-once`: each subtask writes into one transaction per checkpoint. Its id is
//! `<prefix>-<job id>-<subtask>-<n>`, `n` counting the subtask's transactions, so every id is
//! used once and the ids a crashed run may have left open follow the last one a snapshot
//! names. The job id makes the ids the job's own: two jobs writing one topic, even with the
//! same configured prefix, never abort or commit each other's transactions (a job only ever
//! aborts ids of its own job id, or ids after the last one the snapshot it restores names,
//! which only the job that wrote that snapshot opened). The configured prefix stays the
//! ids' prefix, for brokers whose ACLs grant transactional ids by prefix. At the
//! barrier the transaction is flushed and its id goes into the snapshot (pre-committed); when
//! the checkpoint completes it is committed. A restore commits the pre-committed transactions
//! of the snapshot through [`super::protocol`] (their producer is gone), then aborts every
//! later id of the old subtasks until one the broker never saw: nothing a failed attempt
//! wrote becomes visible, and nothing stays open to block `read_committed` readers.
//!
//! Committable elements (union state): postcard of `(version = 1, prefix, subtask,
//! parallelism, seq, transactional_id)`, one per pre-committed transaction, plus one per
//! subtask with no id whose `seq` is the subtask's next (docs/savepoint-format.md).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use weir_api::error::TaskError;
use weir_api::operator::{TaskContext, TaskMetrics};
use weir_api::sink::{Sink, SinkWriter};

use super::client_config;
use super::protocol::TransactionAdmin;

/// Flink's `DeliveryGuarantee`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryGuarantee {
    /// Records are sent and not waited for: a failure may lose or duplicate them.
    None,
    /// Every checkpoint waits until the brokers acknowledged every record sent before it: a
    /// failure may duplicate, never lose.
    AtLeastOnce,
    /// Transactions committed with checkpoints: `read_committed` readers see each record once.
    ExactlyOnce,
}

impl std::str::FromStr for DeliveryGuarantee {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.to_ascii_lowercase().replace('_', "-").as_str() {
            "none" => Ok(DeliveryGuarantee::None),
            "at-least-once" => Ok(DeliveryGuarantee::AtLeastOnce),
            "exactly-once" => Ok(DeliveryGuarantee::ExactlyOnce),
            _ => Err(format!("delivery guarantee '{text}' is not one of none, at-least-once, exactly-once")),
        }
    }
}

/// What the serialiser makes of one element.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaSinkRecord {
    /// The key (the default partitioner hashes it, murmur2 as Java clients do).
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// A partition chosen by the job; `None` lets the partitioner choose.
    pub partition: Option<i32>,
}

/// How long a flush, a commit or a transaction's start may take.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// librdkafka's `transaction.timeout.ms` unless the user sets it: the largest a broker
/// accepts by default (15 minutes), so a restore long after a crash still finds the
/// pre-committed transactions open (Flink's documentation gives the same advice).
const TRANSACTION_TIMEOUT_MS_DEFAULT: &str = "900000";
const COMMITTABLE_VERSION: u8 = 1;

type Serializer<T> = dyn Fn(&T) -> KafkaSinkRecord + Send + Sync;

/// A Kafka sink of `T`; see the module docs.
pub struct KafkaSink<T> {
    bootstrap: String,
    topic: String,
    properties: BTreeMap<String, String>,
    guarantee: DeliveryGuarantee,
    prefix: Option<String>,
    serializer: Arc<Serializer<T>>,
}

impl<T: Send + 'static> KafkaSink<T> {
    /// Writes into `topic` on the brokers `bootstrap`, each element as `serializer` makes it,
    /// with [`DeliveryGuarantee::AtLeastOnce`].
    pub fn new(
        bootstrap: &str,
        topic: &str,
        serializer: impl Fn(&T) -> KafkaSinkRecord + Send + Sync + 'static,
    ) -> Self {
        KafkaSink {
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            properties: BTreeMap::new(),
            guarantee: DeliveryGuarantee::AtLeastOnce,
            prefix: None,
            serializer: Arc::new(serializer),
        }
    }
    /// The delivery guarantee.
    pub fn delivery_guarantee(mut self, guarantee: DeliveryGuarantee) -> Self {
        self.guarantee = guarantee;
        self
    }
    /// The transactional id prefix (exactly-once; `weir-<topic>` unless set): the ids are
    /// `<prefix>-<job id>-<subtask>-<n>`, so they are the job's own whatever the prefix.
    pub fn transactional_id_prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_string());
        self
    }
    /// A librdkafka producer property, passed through.
    pub fn property(mut self, key: &str, value: &str) -> Self {
        self.properties.insert(key.to_string(), value.to_string());
        self
    }

    fn producer_properties(&self) -> BTreeMap<String, String> {
        let mut properties = BTreeMap::new();
        // Java clients' partitioner, so a key lands where a Flink job would put it.
        properties.insert("partitioner".to_string(), "murmur2_random".to_string());
        if self.guarantee == DeliveryGuarantee::ExactlyOnce {
            properties.insert("transaction.timeout.ms".to_string(), TRANSACTION_TIMEOUT_MS_DEFAULT.to_string());
        }
        properties.extend(self.properties.clone());
        properties
    }

    /// The prefix of this job's transactional ids: the configured prefix (`weir-<topic>` by
    /// default) and the job id, which no other job has (16 random bytes). Every attempt of
    /// the job (restarts, a leader's takeover) shares it; a job restored from a snapshot has
    /// a new id, and finishes the snapshot's transactions under the prefix they name.
    fn job_prefix(&self, ctx: &TaskContext) -> String {
        let base = match self.prefix.as_deref().filter(|p| !p.is_empty()) {
            Some(prefix) => prefix.to_string(),
            None => format!("weir-{}", self.topic),
        };
        format!("{base}-{}", ctx.job_id)
    }

    fn admin(&self) -> TransactionAdmin {
        TransactionAdmin::new(&self.bootstrap, TRANSACTION_TIMEOUT)
    }

    /// Aborts the open transaction of `transactional_id` by starting a producer under that id,
    /// as Flink does: the coordinator aborts it and bumps the producer epoch, so the producer
    /// that opened it (a zombie: a frozen process woken, whose client still holds queued
    /// records) is fenced. An `EndTxn` abort under the old epoch would let those records in
    /// afterwards, as a transaction no coordinator knows, holding every `read_committed`
    /// reader of the partition back for good (Kafka's KIP-890).
    fn fence(&self, transactional_id: &str) -> Result<(), String> {
        let mut properties = self.producer_properties();
        properties.insert("transactional.id".to_string(), transactional_id.to_string());
        let producer: BaseProducer =
            client_config(&self.bootstrap, &properties).create().map_err(|e| format!("creating a producer: {e}"))?;
        producer.init_transactions(TRANSACTION_TIMEOUT).map_err(|e| format!("fencing its producer: {e}"))
    }

    /// Aborts every open transaction `<prefix>-<subtask>-<n>` from `from` on, up to the first
    /// id the broker never saw, fencing the producers that opened them; returns that `n` (the
    /// next free sequence).
    fn abort_lingering(&self, prefix: &str, subtask: u32, from: u64) -> Result<u64, TaskError> {
        let admin = self.admin();
        let mut seq = from;
        loop {
            let id = transactional_id(prefix, subtask, seq);
            let failed =
                |e: String| TaskError::external(format!("kafka sink: aborting the lingering transaction '{id}'"), e);
            match admin.describe(&id).map_err(failed)? {
                None => return Ok(seq),
                Some(txn) => {
                    if matches!(txn.state.as_str(), "Ongoing" | "PrepareAbort") {
                        self.fence(&id).map_err(failed)?;
                        tracing::info!(transaction = %id, "kafka sink: aborted a lingering transaction");
                    }
                }
            }
            seq += 1;
        }
    }

    fn writer(&self, ctx: &TaskContext, prefix: String, next_seq: u64) -> Result<KafkaWriter<T>, TaskError> {
        let writer = KafkaWriter {
            bootstrap: self.bootstrap.clone(),
            topic: self.topic.clone(),
            properties: self.producer_properties(),
            guarantee: self.guarantee,
            prefix,
            serializer: Arc::clone(&self.serializer),
            subtask: ctx.subtask_index,
            parallelism: ctx.parallelism,
            next_seq,
            current: None,
            staged: Vec::new(),
            plain: None,
            commit_at_end: !ctx.waits_for_final_checkpoint(),
            metrics: Arc::clone(&ctx.metrics),
        };
        writer.check_topic()?;
        Ok(writer)
    }
}

/// One pre-committed transaction in a snapshot, or (with no id) a subtask's next sequence.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Committable {
    version: u8,
    prefix: String,
    subtask: u32,
    parallelism: u32,
    seq: u64,
    transactional_id: Option<String>,
}

fn decode_committables(elements: &[Vec<u8>]) -> Result<Vec<Committable>, String> {
    let mut found = Vec::with_capacity(elements.len());
    for bytes in elements {
        let committable: Committable = postcard::from_bytes(bytes).map_err(|e| {
            format!("kafka sink: a pending transaction cannot be decoded ({e}); the snapshot's sink state was not written by a Kafka sink")
        })?;
        if committable.version != COMMITTABLE_VERSION {
            return Err(format!(
                "kafka sink: a pending transaction has format version {}, this weir reads version {COMMITTABLE_VERSION}",
                committable.version
            ));
        }
        if let Some(id) = &committable.transactional_id
            && *id != transactional_id(&committable.prefix, committable.subtask, committable.seq)
        {
            return Err(format!(
                "kafka sink: the pending transaction '{id}' does not match its prefix, subtask and sequence; the snapshot is corrupt"
            ));
        }
        if committable.parallelism == 0 || committable.subtask >= committable.parallelism {
            return Err(
                "kafka sink: a pending transaction names an impossible subtask; the snapshot is corrupt".to_string()
            );
        }
        found.push(committable);
    }
    Ok(found)
}

fn transactional_id(prefix: &str, subtask: u32, seq: u64) -> String {
    format!("{prefix}-{subtask}-{seq}")
}

impl<T: Send + 'static> Sink<T> for KafkaSink<T> {
    fn create_writer(&self, ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        let prefix = self.job_prefix(ctx);
        let mut next_seq = 0;
        if self.guarantee == DeliveryGuarantee::ExactlyOnce {
            // A start without a snapshot: abort what an earlier attempt of this job (a restart
            // before its first checkpoint) left open here. The ids carry the job id, so no
            // other job's transaction is ever among them.
            next_seq = self.abort_lingering(&prefix, ctx.subtask_index, 0)?;
        }
        Ok(Box::new(self.writer(ctx, prefix, next_seq)?))
    }

    fn restore_writer(
        &self,
        ctx: &TaskContext,
        committables: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        let committables =
            decode_committables(&committables).map_err(|e| TaskError::external("kafka sink: restoring", e))?;
        let admin = self.admin();
        let prefix = self.job_prefix(ctx);
        let (subtask, parallelism) = (ctx.subtask_index, ctx.parallelism);
        // Old subtask s goes to new subtask s mod p: it commits s's pre-committed transactions
        // and aborts what s may have opened after them.
        let mut next_by_old: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for committable in &committables {
            if committable.subtask % parallelism != subtask {
                continue;
            }
            let key = (committable.prefix.clone(), committable.subtask);
            let next = next_by_old.entry(key).or_insert(0);
            *next = (*next).max(committable.seq + u64::from(committable.transactional_id.is_some()));
            if let Some(id) = &committable.transactional_id {
                commit_restored(&admin, id)?;
            }
        }
        let mut own_next = None;
        for ((old_prefix, old_subtask), next) in &next_by_old {
            let after = self.abort_lingering(old_prefix, *old_subtask, *next)?;
            if *old_subtask == subtask && *old_prefix == prefix {
                own_next = Some(after);
            }
        }
        let next_seq = match (own_next, self.guarantee) {
            (Some(next), _) => next,
            (None, DeliveryGuarantee::ExactlyOnce) => self.abort_lingering(&prefix, subtask, 0)?,
            (None, _) => 0,
        };
        Ok(Box::new(self.writer(ctx, prefix, next_seq)?))
    }

    fn check_restore(&self, committables: &[Vec<u8>]) -> Result<Vec<String>, String> {
        let committables = decode_committables(committables)?;
        let pending = committables.iter().filter(|c| c.transactional_id.is_some()).count();
        if committables.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![format!(
            "kafka sink: commits {pending} pre-committed transactions of the snapshot and aborts the later ones of its prefix"
        )])
    }
}

/// Commits a transaction the snapshot names as pre-committed, unless it already was.
fn commit_restored(admin: &TransactionAdmin, id: &str) -> Result<(), TaskError> {
    let failed = |e: String| TaskError::external(format!("kafka sink: committing the restored transaction '{id}'"), e);
    match admin.describe(id).map_err(failed)? {
        Some(txn) if matches!(txn.state.as_str(), "Ongoing" | "PrepareCommit") => {
            admin.end(id, txn.producer_id, txn.producer_epoch, true).map_err(failed)?;
            tracing::info!(transaction = id, "kafka sink: committed a restored transaction");
        }
        Some(txn) if txn.state == "CompleteCommit" => {}
        other => {
            // As Flink's committer: the transaction is gone (timed out, or aborted by hand);
            // its records cannot be committed any more.
            let state = other.map(|t| t.state).unwrap_or_else(|| "unknown to the broker".to_string());
            tracing::error!(
                transaction = id,
                state = %state,
                "kafka sink: a transaction the restored checkpoint pre-committed can no longer be committed; its records are lost. Either the broker timed it out (raise transaction.timeout.ms, and the broker's transaction.max.timeout.ms, above the longest time a job may be down) or another writer aborted it: a copy of this job restored from the same snapshot while it ran, or a client using the same transactional ids"
            );
        }
    }
    Ok(())
}

/// Keeps the first delivery error the brokers report, and counts every record they refused
/// in the subtask's metrics (`numRecordsSendErrors`), when it has some.
#[derive(Clone, Default)]
struct DeliveryErrors(Arc<Mutex<Option<String>>>, Option<Arc<TaskMetrics>>);

impl ClientContext for DeliveryErrors {}

impl ProducerContext for DeliveryErrors {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        if let Err((error, message)) = result {
            use rdkafka::Message;
            if let Some(metrics) = &self.1 {
                metrics.records_send_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some(format!("'{}' partition {}: {error}", message.topic(), message.partition()));
            }
        }
    }
}

struct OpenProducer {
    producer: ThreadedProducer<DeliveryErrors>,
    errors: DeliveryErrors,
    transactional_id: Option<String>,
    seq: u64,
}

struct KafkaWriter<T> {
    bootstrap: String,
    topic: String,
    properties: BTreeMap<String, String>,
    guarantee: DeliveryGuarantee,
    prefix: String,
    serializer: Arc<Serializer<T>>,
    subtask: u32,
    parallelism: u32,
    next_seq: u64,
    /// The open transaction (exactly-once).
    current: Option<OpenProducer>,
    /// Pre-committed transactions and the checkpoint each waits for.
    staged: Vec<(u64, OpenProducer)>,
    /// The producer of `none` and `at-least-once`.
    plain: Option<OpenProducer>,
    commit_at_end: bool,
    /// The subtask's metrics: records the client or the brokers refused are counted there.
    metrics: Arc<TaskMetrics>,
}

impl<T: Send + 'static> KafkaWriter<T> {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> TaskError {
        TaskError::external(format!("kafka sink to '{}' on {}: {what}", self.topic, self.bootstrap), e.to_string())
    }

    fn create_producer(&self, transactional_id: Option<&str>) -> Result<OpenProducer, TaskError> {
        let mut properties = self.properties.clone();
        if let Some(id) = transactional_id {
            properties.insert("transactional.id".to_string(), id.to_string());
        }
        let errors = DeliveryErrors(Arc::default(), Some(Arc::clone(&self.metrics)));
        let producer: ThreadedProducer<DeliveryErrors> = client_config(&self.bootstrap, &properties)
            .create_with_context(errors.clone())
            .map_err(|e| self.failed("creating a producer", e))?;
        Ok(OpenProducer {
            producer,
            errors,
            transactional_id: transactional_id.map(str::to_string),
            seq: self.next_seq,
        })
    }

    /// A missing topic is an error naming it, before anything is written.
    fn check_topic(&self) -> Result<(), TaskError> {
        let probe = self.create_producer(None)?;
        let metadata =
            probe.producer.client().fetch_metadata(Some(&self.topic), Duration::from_secs(30)).map_err(|e| {
                self.failed("reaching the brokers", format!("{e}; check bootstrap.servers and that the brokers run"))
            })?;
        let missing = match metadata.topics().iter().find(|t| t.name() == self.topic) {
            None => true,
            Some(topic) => {
                topic.partitions().is_empty()
                    || topic.error().is_some_and(|e| {
                        matches!(
                            RDKafkaErrorCode::from(e),
                            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic
                        )
                    })
            }
        };
        if missing {
            return Err(TaskError::external(
                format!("kafka sink: topic '{}'", self.topic),
                format!("it does not exist on {}; create it or correct the topic name", self.bootstrap),
            ));
        }
        Ok(())
    }

    /// The producer records go to now, opening a transaction if none is.
    fn producer(&mut self) -> Result<&OpenProducer, TaskError> {
        if self.guarantee != DeliveryGuarantee::ExactlyOnce {
            if self.plain.is_none() {
                self.plain = Some(self.create_producer(None)?);
            }
            return Ok(self.plain.as_ref().unwrap_or_else(|| unreachable!()));
        }
        if self.current.is_none() {
            let id = transactional_id(&self.prefix, self.subtask, self.next_seq);
            self.check_unused(&id)?;
            let open = self.create_producer(Some(&id))?;
            open.producer
                .init_transactions(TRANSACTION_TIMEOUT)
                .map_err(|e| self.failed(&format!("starting transaction '{id}'"), e))?;
            open.producer.begin_transaction().map_err(|e| self.failed(&format!("starting transaction '{id}'"), e))?;
            self.next_seq += 1;
            self.current = Some(open);
        }
        Ok(self.current.as_ref().unwrap_or_else(|| unreachable!()))
    }

    /// Every transaction a writer opens has an id the broker never saw: a restore continues
    /// after the last id it found. One it knows was opened by another attempt of this subtask
    /// since: either this writer is a zombie (its process was frozen and the job restarted
    /// it elsewhere), which must open nothing (its transaction would stay open, unseen by
    /// the new attempt, holding `read_committed` readers back until it times out), or a
    /// zombie is writing, and the restart this failure causes fences it.
    fn check_unused(&self, id: &str) -> Result<(), TaskError> {
        let admin = TransactionAdmin::new(&self.bootstrap, TRANSACTION_TIMEOUT);
        match admin.describe(id).map_err(|e| self.failed(&format!("looking up transaction '{id}'"), e))? {
            None => Ok(()),
            Some(txn) => Err(self.failed(
                &format!("starting transaction '{id}'"),
                format!(
                    "the broker already knows this transactional id (state {}): another attempt of this subtask wrote under it, so this one is stale or a stale one runs beside it; the subtask stops, and the job's restart fences the other",
                    txn.state
                ),
            )),
        }
    }

    fn flush_producer(&self, open: &OpenProducer) -> Result<(), TaskError> {
        open.producer
            .flush(TRANSACTION_TIMEOUT)
            .map_err(|e| self.failed("waiting for the brokers' acknowledgements", e))?;
        if let Some(error) = open.errors.0.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(self.failed("a record was not delivered", error));
        }
        Ok(())
    }

    /// Flushes the open transaction and stages it for `checkpoint_id`.
    fn stage(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        if let Some(open) = self.current.take() {
            self.flush_producer(&open)?;
            self.staged.push((checkpoint_id, open));
        }
        Ok(())
    }

    fn commit_up_to(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        while let Some(index) = self.staged.iter().position(|(id, _)| *id <= checkpoint_id) {
            let (_, open) = self.staged.remove(index);
            let id = open.transactional_id.clone().unwrap_or_default();
            open.producer
                .commit_transaction(TRANSACTION_TIMEOUT)
                .map_err(|e| self.failed(&format!("committing transaction '{id}'"), e))?;
        }
        Ok(())
    }

    fn committable(&self, seq: u64, transactional_id: Option<String>) -> Vec<u8> {
        let committable = Committable {
            version: COMMITTABLE_VERSION,
            prefix: self.prefix.clone(),
            subtask: self.subtask,
            parallelism: self.parallelism,
            seq,
            transactional_id,
        };
        // Serializing strings and integers into memory cannot fail.
        postcard::to_allocvec(&committable).unwrap_or_default()
    }
}

impl<T: Send + 'static> SinkWriter<T> for KafkaWriter<T> {
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        if batch.is_empty() {
            return Ok(());
        }
        let serializer = Arc::clone(&self.serializer);
        let topic = self.topic.clone();
        let metrics = Arc::clone(&self.metrics);
        let open = self.producer()?;
        for element in batch.drain(..) {
            let record = serializer(&element);
            let mut base: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&topic).payload(&record.value[..]);
            if let Some(key) = &record.key {
                base = base.key(&key[..]);
            }
            if let Some(partition) = record.partition {
                base = base.partition(partition);
            }
            loop {
                match open.producer.send(base) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                        // The local queue is full: wait for the brokers (backpressure).
                        base = returned;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((e, _)) => {
                        metrics.records_send_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Err(TaskError::external(format!("kafka sink: sending to '{topic}'"), e.to_string()));
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TaskError> {
        if let Some(plain) = &self.plain {
            self.flush_producer(plain)?;
        }
        if self.commit_at_end && self.guarantee == DeliveryGuarantee::ExactlyOnce {
            // No checkpoints: the end of input is the only point to commit at.
            self.stage(u64::MAX)?;
            self.commit_up_to(u64::MAX)?;
        } else if let Some(open) = &self.current {
            self.flush_producer(open)?;
        }
        Ok(())
    }

    fn prepare_commit(&mut self, checkpoint_id: u64) -> Result<Vec<Vec<u8>>, TaskError> {
        match self.guarantee {
            DeliveryGuarantee::None => Ok(Vec::new()),
            DeliveryGuarantee::AtLeastOnce => {
                if let Some(plain) = &self.plain {
                    self.flush_producer(plain)?;
                }
                Ok(Vec::new())
            }
            DeliveryGuarantee::ExactlyOnce => {
                self.stage(checkpoint_id)?;
                let mut committables: Vec<Vec<u8>> = self
                    .staged
                    .iter()
                    .map(|(_, open)| self.committable(open.seq, open.transactional_id.clone()))
                    .collect();
                committables.push(self.committable(self.next_seq, None));
                Ok(committables)
            }
        }
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.commit_up_to(checkpoint_id)
    }
}

impl<T> Drop for KafkaWriter<T> {
    fn drop(&mut self) {
        // The open transaction was never pre-committed: abort it so it blocks no reader.
        // Pre-committed ones stay for a restore to commit.
        if let Some(open) = self.current.take() {
            let _ = open.producer.abort_transaction(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn committables_round_trip(prefix in "[a-z-]{1,12}", parallelism in 1u32..64, seq in 0u64..u64::MAX / 2, staged in any::<bool>()) {
            let subtask = parallelism - 1;
            let committable = Committable {
                version: COMMITTABLE_VERSION,
                transactional_id: staged.then(|| transactional_id(&prefix, subtask, seq)),
                prefix, subtask, parallelism, seq,
            };
            let bytes = postcard::to_allocvec(&committable).unwrap();
            prop_assert_eq!(decode_committables(&[bytes]).unwrap(), vec![committable]);
        }
    }

    #[test]
    fn a_forged_committable_is_refused() {
        let forged = Committable {
            version: COMMITTABLE_VERSION,
            prefix: "p".into(),
            subtask: 0,
            parallelism: 1,
            seq: 3,
            transactional_id: Some("someone-elses-txn".into()),
        };
        assert!(decode_committables(&[postcard::to_allocvec(&forged).unwrap()]).unwrap_err().contains("corrupt"));
        let impossible = Committable { subtask: 4, transactional_id: None, ..forged };
        assert!(decode_committables(&[postcard::to_allocvec(&impossible).unwrap()]).is_err());
    }

    #[test]
    fn guarantees_parse_as_flink_names_them() {
        assert_eq!("EXACTLY_ONCE".parse::<DeliveryGuarantee>().unwrap(), DeliveryGuarantee::ExactlyOnce);
        assert_eq!("at-least-once".parse::<DeliveryGuarantee>().unwrap(), DeliveryGuarantee::AtLeastOnce);
        assert!("twice".parse::<DeliveryGuarantee>().unwrap_err().contains("none, at-least-once, exactly-once"));
    }

    proptest! {
        /// Valid committables, mutated: decoding is an error or a consistent committable,
        /// never a panic or a claimed-size allocation.
        #[test]
        fn mutated_committables_decode_or_fail_cleanly(
            prefix in "[a-z-]{1,12}",
            parallelism in 1u32..64,
            seq in 0u64..1_000_000,
            staged in any::<bool>(),
            mutations in proptest::collection::vec(any::<weir_types::fuzzing::Mutation>(), 1..6),
        ) {
            let subtask = parallelism - 1;
            let committable = Committable {
                version: COMMITTABLE_VERSION,
                transactional_id: staged.then(|| transactional_id(&prefix, subtask, seq)),
                prefix, subtask, parallelism, seq,
            };
            let bytes = weir_types::fuzzing::mutate(&postcard::to_allocvec(&committable).unwrap(), &mutations);
            let decoded = weir_types::fuzzing::with_allocation_cap(64 << 20, || decode_committables(std::slice::from_ref(&bytes)));
            match decoded {
                Err(refused) => prop_assert!(false, "decoding asked for {} bytes at once", refused),
                Ok(Err(_)) => {}
                Ok(Ok(found)) => prop_assert!(found.iter().all(|c| c.subtask < c.parallelism)),
            }
        }
    }
}

/// Against a real broker (noida-db, as the weir-cli Kafka tests start it).
#[cfg(test)]
#[path = "sink_broker_tests.rs"]
mod broker_tests;
