//! Moving batches between subtasks: the channel protocol, partitioners, and the two task
//! bodies (a source driving its chain; input channels driving theirs).
//!
//! Every pair of producer and consumer subtasks of an edge has its own bounded channel of
//! batches, so a full consumer blocks only its producers (backpressure), and a later
//! checkpoint can block exactly the channels whose barrier has arrived (alignment). A remote
//! channel will bridge a local one to a TCP connection, carrying the same elements.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{
    Receiver, RecvError, RecvTimeoutError, Select, SelectedOperation, SendError, SendTimeoutError, Sender,
    TryRecvError, TrySendError,
};
use weir_types::keygroups::{compute_operator_index_for_key_group, key_group_for_hash};

use crate::Data;
use crate::error::TaskError;
use crate::in_flight::{InFlightCapture, restored_in_flight};
use crate::operator::{
    BATCH_RECORDS_MAX, IDLE_WAIT_MAX, MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Operator, Step, TaskBody, TaskContext,
};
use crate::snapshot::{
    Barrier, OperatorSnapshotData, OperatorStateData, SOURCE_POSITIONS_STATE, SnapshotTimings, TaskControl,
    TaskSnapshot,
};
use crate::source::{SourcePoll, SourceReader};

/// Batches buffered in one channel, at most, before its producer blocks.
pub const CHANNEL_BATCHES_MAX: usize = 16;

/// What travels on a channel.
#[derive(Debug)]
pub enum StreamElement<T> {
    /// A batch of records, in order.
    Records(Vec<T>),
    /// A batch of records over a key-partitioned edge, with each record's key hash
    /// (`hashes[i]` is `records[i]`'s) so the keyed consumer does not hash again.
    KeyedRecords {
        /// The records.
        records: Vec<T>,
        /// Their keys' stable hashes.
        hashes: Vec<u32>,
    },
    /// A batch of records with event timestamps (`timestamps[i]` is `records[i]`'s, or
    /// [`NO_TIMESTAMP`](crate::operator::NO_TIMESTAMP)); `hashes` as in `KeyedRecords`, empty
    /// over an edge that is not key-partitioned.
    TimestampedRecords {
        /// The records.
        records: Vec<T>,
        /// Their event timestamps.
        timestamps: Vec<i64>,
        /// Their keys' stable hashes, or empty.
        hashes: Vec<u32>,
    },
    /// The producer's event time advanced: no record older than this follows from it.
    Watermark(i64),
    /// The producer went idle (`true`: it does not hold back the consumer's watermark) or
    /// active again.
    WatermarkStatus(bool),
    /// A checkpoint barrier: everything before it belongs to the checkpoint.
    Barrier(Barrier),
    /// The producer subtask has ended; nothing follows.
    EndOfPartition,
}

/// Longest a record waits in a partially filled output batch while its task is busy
/// (Flink's `execution.buffer-timeout`, 100 ms by default); an idle task flushes at once.
pub const BUFFER_TIMEOUT: Duration = Duration::from_millis(100);

/// Flushes a chain when [`BUFFER_TIMEOUT`] has passed since its last flush.
struct FlushTimer {
    last_flush: Instant,
}

impl FlushTimer {
    fn new() -> FlushTimer {
        FlushTimer { last_flush: Instant::now() }
    }

    fn flush_if_due<T>(&mut self, head: &mut dyn Operator<T>) -> Result<(), TaskError> {
        let now = Instant::now();
        if now.duration_since(self.last_flush) >= BUFFER_TIMEOUT {
            self.last_flush = now;
            head.flush()?;
        }
        Ok(())
    }
}

/// The producing end of a channel.
///
/// Batch buffers are not recycled back to the producer on purpose: measured, handing
/// emptied buffers back made the counter benchmark ~2x slower (the producer then writes
/// into cache lines the consumer's core owns), while fresh thread-local allocations from
/// mimalloc cost almost nothing.
///
/// A producer that finds the channel full waits until its consumer has taken half of it
/// ([`Room`]), then refills it in one go: a plain bounded channel wakes a blocked producer
/// for every batch taken, and a producer faster than its consumer then sleeps and wakes
/// once per batch, the consumer paying a wake-up system call each time (measured: 19 000
/// context switches for the counter's 20 000 batches, BENCHMARKS.md).
pub struct ChannelSender<T> {
    inner: Sender<StreamElement<T>>,
    room: Arc<Room>,
}

/// The consuming end of a channel. Everything it hands out goes through [`Room::taken`],
/// which wakes a producer waiting for room.
pub struct ChannelReceiver<T> {
    // Declared before `room`: dropped first, so a producer woken by the close finds the
    // channel disconnected (not still full).
    inner: Receiver<StreamElement<T>>,
    room: ConsumerRoom,
}

/// The consumer's hold on its [`Room`]: closes it when dropped, after the receiver itself.
struct ConsumerRoom(Arc<Room>);

impl std::ops::Deref for ConsumerRoom {
    type Target = Room;

    fn deref(&self) -> &Room {
        &self.0
    }
}

impl Drop for ConsumerRoom {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Creates one bounded channel.
pub fn channel<T>() -> (ChannelSender<T>, ChannelReceiver<T>) {
    channel_with_capacity(CHANNEL_BATCHES_MAX)
}

/// Creates one bounded channel of `capacity` elements (tests use small ones).
pub(crate) fn channel_with_capacity<T>(capacity: usize) -> (ChannelSender<T>, ChannelReceiver<T>) {
    let (sender, receiver) = crossbeam_channel::bounded(capacity);
    let low_water = capacity / 2;
    let room = Arc::new(Room { low_water, capacity, wake_at: AtomicUsize::new(low_water), ..Room::default() });
    (
        ChannelSender { inner: sender, room: Arc::clone(&room) },
        ChannelReceiver { inner: receiver, room: ConsumerRoom(room) },
    )
}

/// The hand-over between a producer blocked on a full channel and its consumer: the
/// consumer wakes the producer once the channel is down to `low_water` elements (or when it
/// goes away), not at every element it takes. The wake-up is one `unpark` (no lock the woken
/// producer would then wait for).
#[derive(Default)]
struct Room {
    /// Elements left in the channel when the waiting producer is woken.
    low_water: usize,
    /// Elements the channel holds, at most (with those its consumer stashed).
    capacity: usize,
    /// Elements left when the producer now waiting is woken: `low_water`, or one less than
    /// `capacity` for a producer that must reach its snapshot soon.
    wake_at: AtomicUsize,
    /// Elements the consumer took early for an unaligned checkpoint and has not processed:
    /// they still take room, so taking them early does not lift backpressure.
    stashed: AtomicUsize,
    /// A producer waits for room: set by it (after `producer`), cleared by whoever wakes it.
    waiting: AtomicBool,
    /// The consumer is gone: no room will be made.
    closed: AtomicBool,
    /// The thread that waits.
    producer: Mutex<Option<Thread>>,
    /// Notices of unaligned barriers, ahead of everything queued in the channel.
    priority: Mutex<Vec<PriorityBarrier>>,
    /// `priority` holds a notice: the consumer's one load per element.
    has_priority: AtomicBool,
    /// The consuming task's [`TaskContext::urgent`], set with every notice.
    consumer_urgent: std::sync::OnceLock<Arc<AtomicBool>>,
}

/// The notice of an unaligned checkpoint's barrier, which overtakes the elements queued in a
/// channel (Flink's priority events): the producer had snapshotted its chain after sending
/// `records_before` records on the channel, so the consumer records those it has not read
/// yet as the checkpoint's in-flight state instead of waiting for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityBarrier {
    /// The barrier.
    pub barrier: Barrier,
    /// Records the producer sent on this channel before its snapshot (counting those still
    /// in its output buffer, which go out next).
    pub records_before: u64,
}

impl Room {
    fn producer(&self) -> MutexGuard<'_, Option<Thread>> {
        // Held only to store or read the handle: a poisoned lock holds a whole one.
        self.producer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The producer's side: waits up to `timeout` for the consumer to drain the channel to
    /// `threshold` (`len` counts what is in it) or to go away; false on timeout.
    fn wait(&self, len: impl Fn() -> usize, threshold: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.wake_at.store(threshold, Ordering::Relaxed);
        {
            let current = std::thread::current();
            let mut producer = self.producer();
            if producer.as_ref().map(Thread::id) != Some(current.id()) {
                *producer = Some(current);
            }
        }
        self.waiting.store(true, Ordering::Release);
        // Pairs with the fence in `taken`: either this reads the consumer's latest take, or
        // the consumer reads `waiting` and wakes us.
        fence(Ordering::SeqCst);
        loop {
            // Woken (or a spurious wake-up that finds room anyway).
            if !self.waiting.load(Ordering::Acquire) || len() <= threshold || self.closed.load(Ordering::Acquire) {
                self.waiting.store(false, Ordering::Relaxed);
                self.wake_at.store(self.low_water, Ordering::Relaxed);
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                // A wake-up racing with this leaves an unpark token: the next park (ours or
                // crossbeam's) returns early once and looks again.
                self.waiting.store(false, Ordering::Relaxed);
                self.wake_at.store(self.low_water, Ordering::Relaxed);
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }

    /// The consumer's side, after each element taken (`len` is what is left in the channel,
    /// stashed elements included): wakes a waiting producer once the channel is down to its
    /// threshold. Above it (the channel of a busy consumer) this is one comparison.
    #[inline]
    fn taken(&self, len: usize) {
        // `len` is never more than what the channel holds (this thread's own takes are
        // counted, the producer's latest sends may not be yet).
        if len > self.wake_at.load(Ordering::Relaxed) {
            return;
        }
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Acquire) {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        if self.waiting.swap(false, Ordering::AcqRel)
            && let Some(producer) = self.producer().as_ref()
        {
            producer.unpark();
        }
    }

    fn priority(&self) -> MutexGuard<'_, Vec<PriorityBarrier>> {
        // Held only to push or take whole notices: a poisoned lock holds whole ones.
        self.priority.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The consumer went away: a waiting producer finds out at once.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // As in `taken`: a producer that starts waiting now sees `closed`, or we see it wait.
        fence(Ordering::SeqCst);
        self.wake();
    }
}

impl<T> ChannelSender<T> {
    /// Posts the notice of an unaligned barrier ahead of what is queued. The producer posts
    /// it before it sends any record after its snapshot: a consumer that reads one of those
    /// records finds the notice when it looks after the read.
    pub fn post_priority(&self, notice: PriorityBarrier) {
        let mut priority = self.room.priority();
        priority.push(notice);
        self.room.has_priority.store(true, Ordering::Release);
        if let Some(urgent) = self.room.consumer_urgent.get() {
            urgent.store(true, Ordering::Release);
        }
    }

    /// What the channel holds, with what its consumer stashed.
    fn occupied(&self) -> usize {
        self.inner.len() + self.room.stashed.load(Ordering::Acquire)
    }

    /// Sends without waiting.
    pub fn try_send(&self, element: StreamElement<T>) -> Result<(), TrySendError<StreamElement<T>>> {
        // One load on the hot path: elements stashed by the consumer still take room.
        if self.room.stashed.load(Ordering::Relaxed) > 0 && self.occupied() >= self.room.capacity {
            return Err(TrySendError::Full(element));
        }
        self.inner.try_send(element)
    }

    /// Sends, waiting up to about `timeout` for room; a full channel is waited on until its
    /// consumer took half of it.
    pub fn send_timeout(
        &self,
        element: StreamElement<T>,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<StreamElement<T>>> {
        self.send_when_down_to(element, self.room.low_water, timeout)
    }

    /// Sends, waiting up to `timeout` for the first room the consumer makes (no hysteresis:
    /// a task that must reach a snapshot soon).
    pub fn send_urgent_timeout(
        &self,
        element: StreamElement<T>,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<StreamElement<T>>> {
        self.send_when_down_to(element, self.room.capacity.saturating_sub(1), timeout)
    }

    /// Sends; a full channel is waited on, up to `timeout`, until it holds `threshold`.
    fn send_when_down_to(
        &self,
        mut element: StreamElement<T>,
        threshold: usize,
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<StreamElement<T>>> {
        let deadline = Instant::now() + timeout;
        loop {
            element = match self.try_send(element) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(element)) => return Err(SendTimeoutError::Disconnected(element)),
                Err(TrySendError::Full(element)) => element,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.room.wait(|| self.occupied(), threshold, left) {
                return Err(SendTimeoutError::Timeout(element));
            }
            if self.room.closed.load(Ordering::Acquire) {
                // The consumer is going away: the next try sees it disconnected.
                return match self.inner.try_send(element) {
                    Ok(()) => Ok(()),
                    Err(TrySendError::Full(element)) => Err(SendTimeoutError::Timeout(element)),
                    Err(TrySendError::Disconnected(element)) => Err(SendTimeoutError::Disconnected(element)),
                };
            }
        }
    }

    /// Sends, waiting as long as it takes.
    pub fn send(&self, mut element: StreamElement<T>) -> Result<(), SendError<StreamElement<T>>> {
        loop {
            match self.send_timeout(element, crate::operator::IDLE_WAIT_MAX) {
                Ok(()) => return Ok(()),
                Err(SendTimeoutError::Timeout(back)) => element = back,
                Err(SendTimeoutError::Disconnected(back)) => return Err(SendError(back)),
            }
        }
    }
}

impl<T> ChannelReceiver<T> {
    /// True when an unaligned barrier's notice waits (one load: checked after every element).
    #[inline]
    pub fn has_priority(&self) -> bool {
        self.room.has_priority.load(Ordering::Acquire)
    }

    /// Takes the notices of unaligned barriers posted so far, oldest first.
    pub fn take_priority(&self) -> Vec<PriorityBarrier> {
        if !self.has_priority() {
            return Vec::new();
        }
        let mut priority = self.room.priority();
        self.room.has_priority.store(false, Ordering::Release);
        std::mem::take(&mut *priority)
    }

    /// What the channel holds, with what this consumer stashed.
    #[inline]
    fn occupied(&self) -> usize {
        self.inner.len() + self.room.stashed.load(Ordering::Relaxed)
    }

    /// Takes an element if one is ready.
    pub fn try_recv(&self) -> Result<StreamElement<T>, TryRecvError> {
        let element = self.inner.try_recv()?;
        self.room.taken(self.occupied());
        Ok(element)
    }

    /// Takes an element early, to keep aside unprocessed: it keeps taking room until
    /// [`ChannelReceiver::unstash`] (backpressure holds while it waits).
    fn try_recv_to_stash(&self) -> Result<StreamElement<T>, TryRecvError> {
        self.room.stashed.fetch_add(1, Ordering::AcqRel);
        self.inner.try_recv().inspect_err(|_| {
            self.room.stashed.fetch_sub(1, Ordering::AcqRel);
        })
    }

    /// A stashed element was taken out to be processed: its room is free.
    fn unstash(&self) {
        self.room.stashed.fetch_sub(1, Ordering::AcqRel);
        self.room.taken(self.occupied());
    }

    /// Takes an element, waiting up to `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<StreamElement<T>, RecvTimeoutError> {
        let element = self.inner.recv_timeout(timeout)?;
        self.room.taken(self.occupied());
        Ok(element)
    }

    /// Takes an element, waiting as long as it takes; an error once the producer is gone
    /// and the channel empty.
    pub fn recv(&self) -> Result<StreamElement<T>, RecvError> {
        let element = self.inner.recv()?;
        self.room.taken(self.occupied());
        Ok(element)
    }

    /// Completes a [`Select`] operation on this channel (registered with `select.recv(&self.inner)`).
    fn recv_selected(&self, operation: SelectedOperation<'_>) -> Result<StreamElement<T>, RecvError> {
        let element = operation.recv(&self.inner)?;
        self.room.taken(self.occupied());
        Ok(element)
    }
}

/// How records are spread over the consumer subtasks of an edge.
pub enum Partitioner<T> {
    /// Subtask i sends to subtask i (equal parallelism, not chained).
    Forward,
    /// Round-robin over all consumers.
    Rebalance,
    /// By key group of the record's key: the stable hash of its canonical bytes.
    KeyGroups(Arc<dyn Fn(&T) -> u32 + Send + Sync>),
    /// A copy of every record to every consumer.
    Broadcast,
}

impl<T> Clone for Partitioner<T> {
    fn clone(&self) -> Self {
        match self {
            Partitioner::Forward => Partitioner::Forward,
            Partitioner::Rebalance => Partitioner::Rebalance,
            Partitioner::KeyGroups(hash) => Partitioner::KeyGroups(Arc::clone(hash)),
            Partitioner::Broadcast => Partitioner::Broadcast,
        }
    }
}

/// The tail link of a task: partitions records into per-consumer batches and sends them.
pub struct ChannelOutput<T> {
    partitioner: Partitioner<T>,
    senders: Vec<ChannelSender<T>>,
    buffers: Vec<Vec<T>>,
    /// Per target, the key hashes of the buffered records (key-partitioned edges only).
    hash_buffers: Vec<Vec<u32>>,
    /// Per target, the event timestamps of the buffered records: empty until a timestamped
    /// batch came, then one per buffered record.
    timestamp_buffers: Vec<Vec<i64>>,
    /// A timestamped batch came: every batch sent from now on carries timestamps.
    timestamped: bool,
    /// The last watermark status sent (idle or not).
    idle: bool,
    next_round_robin: usize,
    max_parallelism: u32,
    /// End of partition was sent: only barriers follow (while the task waits for the job's
    /// final checkpoint), and a consumer that already finished is no error.
    ended: bool,
    /// Per target, the records sent so far: an unaligned barrier's notice says how many
    /// came before it.
    sent_records: Vec<u64>,
    ctx: TaskContext,
}

impl<T: Clone + Send> ChannelOutput<T> {
    /// Sends to `senders` (one per consumer subtask, in subtask order).
    pub fn new(partitioner: Partitioner<T>, senders: Vec<ChannelSender<T>>, ctx: &TaskContext) -> Self {
        let mut buffers = Vec::with_capacity(senders.len());
        let mut hash_buffers = Vec::with_capacity(senders.len());
        let keyed = matches!(partitioner, Partitioner::KeyGroups(_));
        for _ in 0..senders.len() {
            buffers.push(Vec::with_capacity(BATCH_RECORDS_MAX));
            hash_buffers.push(if keyed { Vec::with_capacity(BATCH_RECORDS_MAX) } else { Vec::new() });
        }
        let timestamp_buffers = (0..senders.len()).map(|_| Vec::new()).collect();
        let consumers = senders.len();
        ChannelOutput {
            partitioner,
            senders,
            buffers,
            hash_buffers,
            timestamp_buffers,
            timestamped: false,
            idle: false,
            next_round_robin: ctx.subtask_index as usize,
            max_parallelism: ctx.max_parallelism,
            ended: false,
            sent_records: vec![0; consumers],
            ctx: ctx.clone(),
        }
    }

    fn send(&mut self, target: usize, element: StreamElement<T>) -> Result<(), TaskError> {
        let sender = &self.senders[target];
        let mut element = match sender.try_send(element) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(element)) => element,
            Err(TrySendError::Disconnected(_)) => return Err(self.consumer_gone(target)),
        };
        // Backpressure: wait for room, checking for cancellation between waits. The start of
        // the wait is published so the metric grows while the sender is still blocked.
        let since = weir_types::lifecycle::now_ms().max(1);
        self.ctx.metrics.backpressured_since_ms.store(since, std::sync::atomic::Ordering::Relaxed);
        let result = loop {
            if self.ctx.is_cancelled() {
                break Err(TaskError::Cancelled);
            }
            // A notice or a trigger waits for this task: take the first room made.
            let urgent = self.ctx.urgent.load(std::sync::atomic::Ordering::Acquire)
                || self.ctx.control.as_ref().is_some_and(|control| !control.is_empty());
            let sent = if urgent {
                sender.send_urgent_timeout(element, IDLE_WAIT_MAX)
            } else {
                sender.send_timeout(element, IDLE_WAIT_MAX)
            };
            match sent {
                Ok(()) => break Ok(()),
                Err(SendTimeoutError::Timeout(back)) => element = back,
                Err(SendTimeoutError::Disconnected(_)) => break Err(self.consumer_gone(target)),
            }
        };
        // On the clock `since` is on, so the metric never shrinks as a wait ends.
        let blocked_ms = weir_types::lifecycle::now_ms().saturating_sub(since);
        self.ctx.metrics.backpressured_ms.fetch_add(blocked_ms, std::sync::atomic::Ordering::Relaxed);
        self.ctx.metrics.backpressured_since_ms.store(0, std::sync::atomic::Ordering::Relaxed);
        result
    }

    fn consumer_gone(&self, target: usize) -> TaskError {
        // The consumer ended without being asked to: it failed. The job master cancels this
        // task shortly; report a failure of our own only if it does not.
        if wait_for_cancel(&self.ctx) {
            return TaskError::Cancelled;
        }
        TaskError::Internal(format!(
            "{}: consumer subtask {target} went away while this task was still sending",
            self.ctx.task_name
        ))
    }

    fn send_buffer(&mut self, target: usize) -> Result<(), TaskError> {
        let full = std::mem::replace(&mut self.buffers[target], Vec::with_capacity(BATCH_RECORDS_MAX));
        self.ctx.metrics.add_out(full.len());
        self.sent_records[target] += full.len() as u64;
        let keyed = matches!(self.partitioner, Partitioner::KeyGroups(_));
        let element = if self.timestamped {
            let mut timestamps =
                std::mem::replace(&mut self.timestamp_buffers[target], Vec::with_capacity(BATCH_RECORDS_MAX));
            timestamps.resize(full.len(), NO_TIMESTAMP);
            let hashes = if keyed {
                std::mem::replace(&mut self.hash_buffers[target], Vec::with_capacity(BATCH_RECORDS_MAX))
            } else {
                Vec::new()
            };
            StreamElement::TimestampedRecords { records: full, timestamps, hashes }
        } else if keyed {
            let hashes = std::mem::replace(&mut self.hash_buffers[target], Vec::with_capacity(BATCH_RECORDS_MAX));
            StreamElement::KeyedRecords { records: full, hashes }
        } else {
            StreamElement::Records(full)
        };
        self.send(target, element)
    }

    /// The one consumer of a forward edge: the subtask of the same index.
    fn forward_target(&self) -> usize {
        (self.ctx.subtask_index as usize).min(self.senders.len() - 1)
    }

    /// A forward edge with nothing buffered takes a whole batch as its buffer (and its
    /// timestamps, when they flow), instead of moving each record into the buffer: the
    /// caller gets the empty buffer back. False when it did not (records are buffered, or
    /// the batch is larger than one buffer); then the records go one by one.
    fn forward_whole(&mut self, batch: &mut Vec<T>, timestamps: Option<&mut Vec<i64>>) -> Result<bool, TaskError> {
        let target = self.forward_target();
        if !self.buffers[target].is_empty() || batch.is_empty() || batch.len() > BATCH_RECORDS_MAX {
            return Ok(false);
        }
        if let Some(timestamps) = timestamps {
            if timestamps.len() != batch.len() || !self.timestamp_buffers[target].is_empty() {
                return Ok(false);
            }
            std::mem::swap(&mut self.timestamp_buffers[target], timestamps);
        }
        std::mem::swap(&mut self.buffers[target], batch);
        if self.buffers[target].len() >= BATCH_RECORDS_MAX {
            self.send_buffer(target)?;
        }
        Ok(true)
    }

    /// Sends `element` (a watermark or a status) to every consumer, after the records before it.
    fn broadcast(&mut self, element: impl Fn() -> StreamElement<T>) -> Result<(), TaskError> {
        if self.ended {
            return Ok(());
        }
        self.flush()?;
        for target in 0..self.senders.len() {
            self.send(target, element())?;
        }
        Ok(())
    }
}

impl<T: Clone + Send> Operator<T> for ChannelOutput<T> {
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<T>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        hashes.clear();
        if !self.timestamped {
            // Records buffered so far had no timestamps.
            self.timestamped = true;
            for (buffer, timestamps) in self.buffers.iter().zip(&mut self.timestamp_buffers) {
                timestamps.resize(buffer.len(), NO_TIMESTAMP);
            }
        }
        if matches!(self.partitioner, Partitioner::Forward) && self.forward_whole(batch, Some(timestamps))? {
            return Ok(());
        }
        let consumers = self.senders.len();
        let hash = match &self.partitioner {
            Partitioner::KeyGroups(hash) => Some(Arc::clone(hash)),
            _ => None,
        };
        if let Partitioner::Broadcast = self.partitioner {
            for (record, timestamp) in batch.drain(..).zip(timestamps.drain(..)) {
                for target in 0..consumers {
                    self.buffers[target].push(record.clone());
                    self.timestamp_buffers[target].push(timestamp);
                    if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                        self.send_buffer(target)?;
                    }
                }
            }
            return Ok(());
        }
        for (record, timestamp) in batch.drain(..).zip(timestamps.drain(..)) {
            let target = match (&self.partitioner, &hash) {
                (Partitioner::KeyGroups(_), Some(hash)) => {
                    let stable_hash = hash(&record);
                    let key_group = key_group_for_hash(stable_hash, self.max_parallelism);
                    let target = compute_operator_index_for_key_group(self.max_parallelism, consumers as u32, key_group)
                        as usize;
                    self.hash_buffers[target].push(stable_hash);
                    target
                }
                (Partitioner::Rebalance, _) => {
                    let target = self.next_round_robin % consumers;
                    self.next_round_robin = self.next_round_robin.wrapping_add(1);
                    target
                }
                _ => self.forward_target(),
            };
            self.buffers[target].push(record);
            self.timestamp_buffers[target].push(timestamp);
            if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                self.send_buffer(target)?;
            }
        }
        Ok(())
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        self.broadcast(|| StreamElement::Watermark(watermark))
    }

    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        if self.idle == idle {
            return Ok(());
        }
        self.idle = idle;
        self.broadcast(|| StreamElement::WatermarkStatus(idle))
    }

    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        if self.timestamped {
            // Once timestamps flow, untimestamped records travel with NO_TIMESTAMP.
            let mut timestamps = vec![NO_TIMESTAMP; batch.len()];
            return self.process_timestamped_batch(batch, &mut timestamps, &mut Vec::new());
        }
        let consumers = self.senders.len();
        match &self.partitioner {
            Partitioner::Forward => {
                if self.forward_whole(batch, None)? {
                    return Ok(());
                }
                let target = self.forward_target();
                for record in batch.drain(..) {
                    self.buffers[target].push(record);
                    if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                        self.send_buffer(target)?;
                    }
                }
            }
            Partitioner::Rebalance => {
                for record in batch.drain(..) {
                    let target = self.next_round_robin % consumers;
                    self.next_round_robin = self.next_round_robin.wrapping_add(1);
                    self.buffers[target].push(record);
                    if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                        self.send_buffer(target)?;
                    }
                }
            }
            Partitioner::Broadcast => {
                for record in batch.drain(..) {
                    for target in 0..consumers {
                        self.buffers[target].push(record.clone());
                        if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                            self.send_buffer(target)?;
                        }
                    }
                }
            }
            Partitioner::KeyGroups(hash) => {
                let hash = Arc::clone(hash);
                let parallelism = consumers as u32;
                for record in batch.drain(..) {
                    let stable_hash = hash(&record);
                    let key_group = key_group_for_hash(stable_hash, self.max_parallelism);
                    let target =
                        compute_operator_index_for_key_group(self.max_parallelism, parallelism, key_group) as usize;
                    self.hash_buffers[target].push(stable_hash);
                    self.buffers[target].push(record);
                    if self.buffers[target].len() >= BATCH_RECORDS_MAX {
                        self.send_buffer(target)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn fire_timers(&mut self, _now_ms: u64) -> Result<(), TaskError> {
        Ok(())
    }

    fn next_timer(&self) -> Option<u64> {
        None
    }

    fn end_input(&mut self) -> Result<(), TaskError> {
        self.flush()?;
        for target in 0..self.senders.len() {
            self.send(target, StreamElement::EndOfPartition)?;
        }
        self.ended = true;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        for target in 0..self.buffers.len() {
            if !self.buffers[target].is_empty() {
                self.send_buffer(target)?;
            }
        }
        Ok(())
    }

    fn snapshot_state(&mut self, barrier: &Barrier, _snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        if barrier.is_unaligned() {
            // The notice overtakes what is queued; the buffered records count as sent before
            // it, as they go out ahead of anything this task produces after its snapshot.
            // Nothing here waits for room: a full channel's consumer reads on and hears the
            // notice, an empty one's gets the barrier in band too (which wakes it). After
            // the end of partition too: the consumer then takes the rest early.
            for (target, sender) in self.senders.iter().enumerate() {
                let records_before = self.sent_records[target] + self.buffers[target].len() as u64;
                sender.post_priority(PriorityBarrier { barrier: barrier.clone(), records_before });
                let _ = sender.try_send(StreamElement::Barrier(barrier.clone()));
            }
            return Ok(());
        }
        // Records before the barrier go out first, then the barrier on every channel.
        self.flush()?;
        for target in 0..self.senders.len() {
            if self.ended {
                match self.senders[target].try_send(StreamElement::Barrier(barrier.clone())) {
                    Ok(()) | Err(TrySendError::Disconnected(_)) => continue,
                    Err(TrySendError::Full(element)) => self.send(target, element)?,
                }
                continue;
            }
            self.send(target, StreamElement::Barrier(barrier.clone()))?;
        }
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), TaskError> {
        Ok(())
    }
}

/// What a control message asks of a task body.
enum ControlOutcome {
    /// Nothing further.
    Continue,
    /// The stop-with-savepoint completed, or the job's final checkpoint did: end the task now.
    Stop,
}

/// Applies a completion or abort to a task's chain and stop state.
fn on_completion<T>(
    head: &mut dyn Operator<T>,
    stopping: &mut Option<u64>,
    control: TaskControl,
) -> Result<ControlOutcome, TaskError> {
    match control {
        TaskControl::CheckpointComplete(id) => {
            head.notify_checkpoint_complete(id)?;
            if *stopping == Some(id) {
                return Ok(ControlOutcome::Stop);
            }
        }
        TaskControl::CheckpointAborted(id) => {
            // A failed stop-with-savepoint leaves the job running, as in Flink.
            if *stopping == Some(id) {
                *stopping = None;
            }
        }
        TaskControl::Finish => return Ok(ControlOutcome::Stop),
        TaskControl::TriggerCheckpoint(_) => {}
    }
    Ok(ControlOutcome::Continue)
}

/// Handles the pending control messages of a task body. After a stop-with-savepoint barrier
/// (`stopping`) nothing more is read: the body only waits, a bounded time, for the
/// savepoint's completion. `Some` is the step the body returns without doing more work.
///
/// Everything queued is taken at once, and a trigger whose abort is queued behind it is
/// skipped: a source that fell behind (expired checkpoints) does not take snapshots nobody
/// will use before it reads again.
fn poll_control(
    control: Option<Receiver<TaskControl>>,
    stopping: bool,
    mut on_control: impl FnMut(TaskControl) -> Result<ControlOutcome, TaskError>,
) -> Result<Option<Step>, TaskError> {
    let Some(control) = control else {
        return Ok(None);
    };
    let mut queued: Vec<TaskControl> = Vec::new();
    let mut disconnected = false;
    while queued.len() < CONTROL_BATCH_MAX {
        match control.try_recv() {
            Ok(message) => queued.push(message),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                disconnected = true;
                break;
            }
        }
    }
    let aborted: Vec<u64> = queued
        .iter()
        .filter_map(|message| match message {
            TaskControl::CheckpointAborted(id) => Some(*id),
            _ => None,
        })
        .collect();
    for message in queued {
        // Aborted by a message after it in this batch (ids only go up: an abort in the batch
        // names a trigger before it).
        if let TaskControl::TriggerCheckpoint(barrier) = &message
            && aborted.contains(&barrier.checkpoint_id)
        {
            continue;
        }
        if let ControlOutcome::Stop = on_control(message)? {
            return Ok(Some(Step::Finished));
        }
    }
    if disconnected {
        return Err(orphaned());
    }
    if !stopping {
        return Ok(None);
    }
    match control.recv_timeout(IDLE_WAIT_MAX) {
        Ok(message) => {
            if let ControlOutcome::Stop = on_control(message)? {
                return Ok(Some(Step::Finished));
            }
        }
        Err(RecvTimeoutError::Disconnected) => return Err(orphaned()),
        Err(RecvTimeoutError::Timeout) => {}
    }
    Ok(Some(Step::Idle))
}

/// The task's control channel closed: whoever ran it (the job master, its TaskManager) is
/// gone, so no checkpoint, stop or cancel can reach it any more. It ends as cancelled
/// rather than run (or, waiting for a stop, spin) unsupervised. (Info, not a warning: an
/// attempt being replaced drops its channels while its cancelled subtasks wind down.)
fn orphaned() -> TaskError {
    tracing::info!("a task's control channel closed: nothing supervises it any more, so it cancels itself");
    TaskError::Cancelled
}

/// Control messages handled in one step, at most (the rest wait for the next step).
const CONTROL_BATCH_MAX: usize = 256;

/// Snapshots the chain at `barrier` and hands the snapshot to the runtime; `finished` when
/// the chain's end of input already ran.
fn take_snapshot<T>(
    head: &mut dyn Operator<T>,
    (barrier, mut timings): (&Barrier, SnapshotTimings),
    first: Option<OperatorSnapshotData>,
    finished: bool,
    ctx: &TaskContext,
) -> Result<(), TaskError> {
    let started = Instant::now();
    let mut snapshot = TaskSnapshot::new(barrier.clone());
    snapshot.finished = finished;
    if let Some(first) = first {
        snapshot.operators.push(first);
    }
    head.snapshot_state(barrier, &mut snapshot)?;
    timings.sync_ms = started.elapsed().as_millis() as u64;
    snapshot.timings = timings;
    ctx.submit_snapshot(snapshot)
}

/// Milliseconds from `barrier`'s trigger (the job master's clock) to now.
fn since_trigger(barrier: &Barrier) -> u64 {
    weir_types::lifecycle::now_ms().saturating_sub(barrier.timestamp_ms)
}

/// A source subtask: polls its reader and pushes batches through its chain; on a trigger
/// from the job master it snapshots its read position and the chain and emits the barrier.
pub struct SourceBody<T> {
    reader: Box<dyn SourceReader<T>>,
    head: Box<dyn Operator<T>>,
    batch: Vec<T>,
    flush_timer: FlushTimer,
    /// Set after a stop-with-savepoint barrier: emit nothing more, wait for its completion.
    stopping: Option<u64>,
    /// The reader ended and the task waits for the job's final checkpoint.
    data_ended: bool,
    /// Restored as finished: the reader is not polled, the source ends at once.
    skip_reading: bool,
    ctx: TaskContext,
}

impl<T: Send> SourceBody<T> {
    /// Reads from `reader` into `head`.
    pub fn new(reader: Box<dyn SourceReader<T>>, head: Box<dyn Operator<T>>, ctx: &TaskContext) -> Self {
        SourceBody {
            reader,
            head,
            batch: Vec::with_capacity(BATCH_RECORDS_MAX),
            flush_timer: FlushTimer::new(),
            stopping: None,
            data_ended: false,
            skip_reading: false,
            ctx: ctx.clone(),
        }
    }

    /// The source had finished when the snapshot it restores was taken: it reads nothing and
    /// goes straight to its end of input (whose chained operators, finished too, emit nothing).
    pub fn finished_on_restore(&mut self) {
        self.skip_reading = true;
    }

    fn checkpoint(&mut self, barrier: &Barrier) -> Result<(), TaskError> {
        if barrier.drains() && !self.data_ended {
            // Flink's `stop --drain`: the final watermark goes ahead of the barrier, in band,
            // so every event-time window and timer downstream fires before its snapshot.
            self.head.process_watermark(MAX_WATERMARK)?;
            self.head.flush()?;
        }
        let positions = self.reader.snapshot_positions_for(barrier.checkpoint_id);
        let source_state = OperatorSnapshotData {
            uid: self.ctx.operator_uid.clone(),
            keyed: None,
            operator_states: vec![OperatorStateData {
                name: SOURCE_POSITIONS_STATE.to_string(),
                mode: positions.mode,
                elements: positions.elements,
            }],
        };
        let timings = SnapshotTimings { start_delay_ms: since_trigger(barrier), ..SnapshotTimings::default() };
        take_snapshot(self.head.as_mut(), (barrier, timings), Some(source_state), self.data_ended, &self.ctx)?;
        if barrier.terminates() {
            self.stopping = Some(barrier.checkpoint_id);
        }
        Ok(())
    }

    /// Handles one control message; `Stop` ends the task.
    fn on_control(&mut self, control: TaskControl) -> Result<ControlOutcome, TaskError> {
        if let TaskControl::TriggerCheckpoint(barrier) = control {
            // Stopping sources take no further checkpoints.
            if self.stopping.is_none() {
                self.checkpoint(&barrier)?;
            }
            return Ok(ControlOutcome::Continue);
        }
        if let TaskControl::CheckpointComplete(id) = control {
            self.ctx.checkpoint_complete(id);
            self.reader.notify_checkpoint_complete(id)?;
        }
        on_completion(self.head.as_mut(), &mut self.stopping, control)
    }
}

impl<T: Send> TaskBody for SourceBody<T> {
    fn step(&mut self) -> Result<Step, TaskError> {
        // After its end of data a source only takes part in checkpoints until told to finish.
        let waiting = self.stopping.is_some() || self.data_ended;
        if let Some(step) = poll_control(self.ctx.control.clone(), waiting, |message| self.on_control(message))? {
            return Ok(step);
        }
        fire_due_timers(self.head.as_mut(), &self.ctx)?;
        let poll = if self.skip_reading {
            SourcePoll::End
        } else {
            self.reader.poll_next(&mut self.batch, BATCH_RECORDS_MAX)?
        };
        match poll {
            SourcePoll::Data => {
                self.ctx.metrics.add_in(self.batch.len());
                match self.reader.splits() {
                    Some(splits) if splits.records.len() == self.batch.len() => {
                        self.head.process_split_batch(&mut self.batch, splits)?
                    }
                    _ => self.head.process_batch(&mut self.batch)?,
                }
                self.flush_timer.flush_if_due(self.head.as_mut())?;
                Ok(Step::Worked)
            }
            SourcePoll::Idle(wait) => {
                self.head.flush()?;
                let wait = wait.min(IDLE_WAIT_MAX).min(time_to_next_timer(self.head.as_ref(), &self.ctx));
                let idle_since = self.ctx.metrics.idle_begins();
                std::thread::sleep(wait);
                self.ctx.metrics.idle_ended(idle_since);
                Ok(Step::Idle)
            }
            SourcePoll::End => {
                // Flink's final watermark: every event-time window and timer fires.
                self.head.process_watermark(MAX_WATERMARK)?;
                self.head.end_input()?;
                self.head.flush()?;
                match &self.ctx.end_of_data {
                    Some(report) if self.ctx.waits_for_final_checkpoint() => {
                        self.data_ended = true;
                        report();
                        Ok(Step::Idle)
                    }
                    _ => Ok(Step::Finished),
                }
            }
        }
    }
}

/// A barrier being aligned across a task's inputs.
struct Alignment {
    barrier: Barrier,
    received: Vec<bool>,
    /// When the first of its barriers came, and how long after the trigger.
    started: Instant,
    start_delay_ms: u64,
}

/// A subtask fed by channels: receives batches from every upstream subtask into its chain,
/// aligning barriers across inputs (exactly-once) or only counting them (at-least-once).
pub struct InputBody<T> {
    inputs: Vec<ChannelReceiver<T>>,
    /// Inputs past their end of partition (only barriers may still come).
    ended: Vec<bool>,
    /// Ended inputs whose producer is gone too: nothing more to read.
    closed: Vec<bool>,
    /// Every input ended and the chain's end of input ran (at once, before anything after the
    /// last end of partition, so a snapshot is either wholly before it or wholly after).
    input_ended: bool,
    /// Every input ended and the task waits for the job's final checkpoint.
    data_ended: bool,
    /// The newest checkpoint snapshotted: a barrier of it or older is not taken again.
    last_snapshot: u64,
    /// Checkpoints the job master aborted that are newer than `last_snapshot`: a late barrier
    /// of one of them starts no alignment (which would block an input until the next one).
    aborted: std::collections::BTreeSet<u64>,
    /// Inputs whose barrier arrived while others' did not yet (exactly-once alignment).
    blocked: Vec<bool>,
    /// Per input, the newest watermark it sent, and whether it is idle.
    input_watermarks: Vec<i64>,
    input_idle: Vec<bool>,
    /// The minimum over the active inputs, as passed to the chain last.
    watermark: i64,
    /// Every input still running is idle, and the chain was told so.
    idle: bool,
    live: usize,
    next_input: usize,
    alignment: Option<Alignment>,
    /// Per input, the records read from it so far (stashed ones included).
    received: Vec<u64>,
    /// The unaligned checkpoint whose in-flight records are being collected.
    in_flight: Option<InFlightCapture>,
    /// Per input, elements taken early (to reach an unaligned barrier's count at once) and
    /// not yet processed; read before the channel.
    stash: Vec<VecDeque<StreamElement<T>>>,
    /// Restored in-flight records, processed before any input is read.
    replay: VecDeque<StreamElement<T>>,
    stopping: Option<u64>,
    head: Box<dyn Operator<T>>,
    flush_timer: FlushTimer,
    ctx: TaskContext,
}

/// Aborted checkpoints an input body remembers, at most.
const ABORTED_REMEMBERED_MAX: usize = 1024;
/// Batches taken from the inputs in one step before timers and cancellation are checked.
const BATCHES_PER_STEP_MAX: usize = 64;
/// How long one step takes batches at most: a slow operator (64 batches can be seconds of
/// its work) still hears a cancel, a control message and its timers this often.
const STEP_TIME_MAX: Duration = Duration::from_millis(10);
/// How long a subtask whose peer vanished without end of input waits for the job to cancel it.
const CLOSED_INPUT_GRACE: Duration = Duration::from_secs(5);

impl<T: Data> InputBody<T> {
    /// Reads `inputs` (one per upstream subtask) into `head`, after the in-flight records
    /// of the unaligned checkpoint it restores (its context's operator uid is the head's).
    pub fn new(
        inputs: Vec<ChannelReceiver<T>>,
        head: Box<dyn Operator<T>>,
        ctx: &TaskContext,
    ) -> Result<Self, TaskError> {
        let live = inputs.len();
        for input in &inputs {
            // A channel has one consumer: the first registration is the only one.
            let _ = input.room.consumer_urgent.set(Arc::clone(&ctx.urgent));
        }
        Ok(InputBody {
            ended: vec![false; live],
            closed: vec![false; live],
            input_ended: false,
            data_ended: false,
            last_snapshot: 0,
            aborted: std::collections::BTreeSet::new(),
            blocked: vec![false; live],
            input_watermarks: vec![MIN_WATERMARK; live],
            input_idle: vec![false; live],
            watermark: MIN_WATERMARK,
            idle: false,
            live,
            next_input: 0,
            alignment: None,
            received: vec![0; live],
            in_flight: None,
            stash: (0..live).map(|_| VecDeque::new()).collect(),
            replay: restored_in_flight(ctx)?,
            stopping: None,
            inputs,
            head,
            flush_timer: FlushTimer::new(),
            ctx: ctx.clone(),
        })
    }

    /// Ended inputs stay readable while their producer lives: a producer waiting for the final
    /// checkpoint still sends barriers, which must not fill the channel.
    fn readable(&self, input: usize) -> bool {
        !self.closed[input] && !self.blocked[input]
    }

    fn handle(&mut self, input: usize, element: StreamElement<T>) -> Result<(), TaskError> {
        match element {
            StreamElement::Records(mut records) => {
                self.ctx.metrics.add_in(records.len());
                self.head.process_batch(&mut records)
            }
            StreamElement::KeyedRecords { mut records, mut hashes } => {
                self.ctx.metrics.add_in(records.len());
                self.head.process_hashed_batch(&mut records, &mut hashes)
            }
            StreamElement::TimestampedRecords { mut records, mut timestamps, mut hashes } => {
                self.ctx.metrics.add_in(records.len());
                self.head.process_timestamped_batch(&mut records, &mut timestamps, &mut hashes)
            }
            StreamElement::Watermark(watermark) => {
                let seen = &mut self.input_watermarks[input];
                *seen = (*seen).max(watermark);
                self.advance_watermark()
            }
            StreamElement::WatermarkStatus(idle) => {
                self.input_idle[input] = idle;
                self.advance_watermark()
            }
            StreamElement::Barrier(barrier) => self.on_barrier(input, barrier),
            StreamElement::EndOfPartition => {
                if !self.ended[input] {
                    self.ended[input] = true;
                    self.live -= 1;
                }
                if self.live == 0 && !self.input_ended {
                    // The end of input runs before any later barrier is taken: a snapshot
                    // whose barrier came after every end of partition holds its results.
                    // Every window and event-time timer fires first (the final watermark,
                    // which a bounded source sends; sent here too for inputs without one).
                    self.input_ended = true;
                    if self.watermark < MAX_WATERMARK {
                        self.watermark = MAX_WATERMARK;
                        self.ctx.metrics.set_input_watermark(MAX_WATERMARK);
                        self.head.process_watermark(MAX_WATERMARK)?;
                    }
                    self.head.end_input()?;
                    self.head.flush()?;
                }
                // An ended input has nothing more before any barrier.
                self.complete_unaligned_if_ready()?;
                self.complete_alignment_if_ready()
            }
        }
    }

    /// Passes the minimum watermark over the inputs that are neither idle nor ended to the
    /// chain when it advanced; tells the chain when every running input went idle, or one
    /// came back (Flink's `StatusWatermarkValve`).
    fn advance_watermark(&mut self) -> Result<(), TaskError> {
        let mut active = (0..self.inputs.len()).filter(|&i| !self.ended[i] && !self.input_idle[i]).peekable();
        let all_idle = active.peek().is_none() && self.live > 0;
        let combined = active.map(|i| self.input_watermarks[i]).min();
        if let Some(combined) = combined
            && combined > self.watermark
        {
            self.watermark = combined;
            self.ctx.metrics.set_input_watermark(combined);
            self.head.process_watermark(combined)?;
        }
        if all_idle != self.idle {
            self.idle = all_idle;
            self.head.process_watermark_status(all_idle)?;
        }
        Ok(())
    }

    fn on_barrier(&mut self, input: usize, barrier: Barrier) -> Result<(), TaskError> {
        if barrier.is_unaligned() {
            // In band: everything this input sent before it was counted.
            self.on_unaligned_notice(input, barrier, None)?;
            self.read_ahead()?;
            return self.complete_unaligned_if_ready();
        }
        if self.in_flight.as_ref().is_some_and(|capture| capture.checkpoint_id() < barrier.checkpoint_id) {
            // A newer (aligned) barrier overtook an unaligned checkpoint not yet complete here.
            self.in_flight = None;
        }
        if barrier.checkpoint_id <= self.last_snapshot || self.aborted.contains(&barrier.checkpoint_id) {
            // Taken already (the copy of an input that ended before it delivered the barrier),
            // or aborted: nothing to align.
            return Ok(());
        }
        let current = self.alignment.as_ref().map(|a| a.barrier.checkpoint_id);
        match current {
            Some(id) if barrier.checkpoint_id < id => return Ok(()),
            Some(id) if barrier.checkpoint_id > id => {
                // A newer barrier overtook an unfinished alignment: that checkpoint is lost.
                self.abort_alignment();
                self.start_alignment(barrier);
            }
            Some(_) => {}
            None => self.start_alignment(barrier),
        }
        if let Some(alignment) = &mut self.alignment {
            alignment.received[input] = true;
        }
        if self.ctx.exactly_once {
            self.blocked[input] = true;
        }
        self.complete_alignment_if_ready()
    }

    fn start_alignment(&mut self, barrier: Barrier) {
        let start_delay_ms = since_trigger(&barrier);
        self.alignment = Some(Alignment {
            barrier,
            received: vec![false; self.inputs.len()],
            started: Instant::now(),
            start_delay_ms,
        });
    }

    fn abort_alignment(&mut self) {
        self.alignment = None;
        self.blocked.iter_mut().for_each(|b| *b = false);
    }

    fn complete_alignment_if_ready(&mut self) -> Result<(), TaskError> {
        let Some(alignment) = &self.alignment else {
            return Ok(());
        };
        let all_arrived = (0..self.inputs.len()).all(|i| alignment.received[i] || self.ended[i]);
        if !all_arrived {
            return Ok(());
        }
        let barrier = alignment.barrier.clone();
        let timings = SnapshotTimings {
            start_delay_ms: alignment.start_delay_ms,
            alignment_ms: alignment.started.elapsed().as_millis() as u64,
            ..SnapshotTimings::default()
        };
        self.abort_alignment();
        self.last_snapshot = barrier.checkpoint_id;
        self.aborted = self.aborted.split_off(&(barrier.checkpoint_id + 1));
        take_snapshot(self.head.as_mut(), (&barrier, timings), None, self.input_ended, &self.ctx)?;
        if barrier.terminates() {
            self.stopping = Some(barrier.checkpoint_id);
        }
        Ok(())
    }

    /// The next element of `input`: a stashed one, else one from its channel.
    fn try_receive(&mut self, input: usize) -> Result<Result<StreamElement<T>, TryRecvError>, TaskError> {
        if !self.stash[input].is_empty() {
            // Notices are heard before the element leaves the stash: a snapshot they start
            // records everything stashed (read, not processed) as in flight.
            self.hear_priority(input)?;
        }
        if let Some(element) = self.stash[input].pop_front() {
            self.inputs[input].unstash();
            if self.in_flight.is_some() {
                // What the producers send meanwhile (their buffered records) is taken early too.
                self.read_ahead()?;
                self.complete_unaligned_if_ready()?;
            }
            return Ok(Ok(element));
        }
        match self.inputs[input].try_recv() {
            Ok(element) => self.arrived(input, element).map(Ok),
            Err(error) => Ok(Err(error)),
        }
    }

    /// An element just read from `input`'s channel: the unaligned barriers' notices posted
    /// before it are heard first, then its records are counted (and recorded while an
    /// unaligned checkpoint collects them).
    fn arrived(&mut self, input: usize, element: StreamElement<T>) -> Result<StreamElement<T>, TaskError> {
        self.hear_priority(input)?;
        self.count(input, &element)?;
        if self.in_flight.is_some() {
            self.read_ahead()?;
            self.complete_unaligned_if_ready()?;
        }
        Ok(element)
    }

    /// Hears the unaligned barriers' notices posted on `input`'s channel.
    fn hear_priority(&mut self, input: usize) -> Result<(), TaskError> {
        if !self.inputs[input].has_priority() {
            return Ok(());
        }
        for notice in self.inputs[input].take_priority() {
            self.on_unaligned_notice(input, notice.barrier, Some(notice.records_before))?;
        }
        let waiting = self.inputs.iter().any(ChannelReceiver::has_priority);
        self.ctx.urgent.store(waiting, Ordering::Release);
        Ok(())
    }

    /// Counts the records of `element`, read from `input`, and records those that belong to
    /// the unaligned checkpoint being collected.
    fn count(&mut self, input: usize, element: &StreamElement<T>) -> Result<(), TaskError> {
        let Some(parts) = record_parts(element) else {
            return Ok(());
        };
        let before = self.received[input];
        self.received[input] = before + parts.0.len() as u64;
        if let Some(capture) = &mut self.in_flight
            && !self.ended[input]
        {
            capture.record(input, before, parts, &self.ctx)?;
        }
        Ok(())
    }

    /// Takes from each input what its producer sent before its snapshot and is already in
    /// the channel, into the input's stash (processed later, in order): the unaligned
    /// checkpoint then completes without waiting for this subtask to process it.
    fn read_ahead(&mut self) -> Result<(), TaskError> {
        for input in 0..self.inputs.len() {
            while let Some(capture) = &self.in_flight
                && !self.closed[input]
                && capture.behind(input, self.received[input])
            {
                let Ok(element) = self.inputs[input].try_recv_to_stash() else { break };
                self.count(input, &element)?;
                let ends = matches!(element, StreamElement::EndOfPartition);
                self.stash[input].push_back(element);
                if ends {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The notice of an unaligned barrier on `input` (`records_before`: what its producer
    /// sent before its snapshot; `None` for the barrier in band, after all of it). The first
    /// notice of a checkpoint snapshots the chain at once.
    fn on_unaligned_notice(
        &mut self,
        input: usize,
        barrier: Barrier,
        records_before: Option<u64>,
    ) -> Result<(), TaskError> {
        let id = barrier.checkpoint_id;
        if self.aborted.contains(&id) {
            return Ok(());
        }
        match self.in_flight.as_ref().map(InFlightCapture::checkpoint_id) {
            Some(current) if current > id => return Ok(()),
            // Overtaken by a newer one: this subtask never acknowledges it (it expires).
            Some(current) if current < id => self.in_flight = None,
            _ => {}
        }
        if self.in_flight.is_none() {
            if id <= self.last_snapshot || self.stopping.is_some() {
                return Ok(());
            }
            self.start_unaligned(barrier)?;
        }
        let received = self.received[input];
        if let Some(capture) = &mut self.in_flight {
            capture.set_target(input, records_before.unwrap_or(received));
        }
        // The caller reads ahead and completes, once the element in hand is counted.
        Ok(())
    }

    /// Snapshots the chain for an unaligned checkpoint (its output posts the notice
    /// downstream at once) and starts collecting the checkpoint's in-flight records.
    fn start_unaligned(&mut self, barrier: Barrier) -> Result<(), TaskError> {
        if self.alignment.is_some() {
            // An older aligned barrier overtaken: that checkpoint is lost, as in on_barrier.
            self.abort_alignment();
        }
        let started = Instant::now();
        let start_delay_ms = since_trigger(&barrier);
        let mut snapshot = TaskSnapshot::new(barrier.clone());
        snapshot.finished = self.input_ended;
        self.last_snapshot = barrier.checkpoint_id;
        self.aborted = self.aborted.split_off(&(barrier.checkpoint_id + 1));
        self.head.snapshot_state(&barrier, &mut snapshot)?;
        snapshot.timings = SnapshotTimings {
            start_delay_ms,
            sync_ms: started.elapsed().as_millis() as u64,
            ..SnapshotTimings::default()
        };
        let mut capture = InFlightCapture::new(snapshot, self.inputs.len());
        // Read but not processed yet (taken early for an earlier checkpoint): in flight.
        for (input, stash) in self.stash.iter().enumerate() {
            for element in stash {
                if let Some(parts) = record_parts(element) {
                    capture.record(input, 0, parts, &self.ctx)?;
                }
            }
        }
        for input in (0..self.inputs.len()).filter(|&input| self.ended[input]) {
            capture.set_target(input, self.received[input]);
        }
        self.in_flight = Some(capture);
        Ok(())
    }

    /// Hands the unaligned checkpoint's snapshot over once every input's in-flight records
    /// were read (the time that took is reported as its alignment).
    fn complete_unaligned_if_ready(&mut self) -> Result<(), TaskError> {
        let Some(capture) = &self.in_flight else {
            return Ok(());
        };
        if !(0..self.inputs.len()).all(|i| self.ended[i] || capture.input_complete(i, self.received[i])) {
            return Ok(());
        }
        let Some(capture) = self.in_flight.take() else {
            return Ok(());
        };
        let collecting_ms = capture.started.elapsed().as_millis() as u64;
        let mut snapshot = capture.into_snapshot(&self.ctx.operator_uid);
        snapshot.timings.alignment_ms = collecting_ms;
        self.ctx.submit_snapshot(snapshot)
    }

    fn on_control(&mut self, control: TaskControl) -> Result<ControlOutcome, TaskError> {
        if let TaskControl::CheckpointAborted(id) = control {
            if self.in_flight.as_ref().is_some_and(|capture| capture.checkpoint_id() == id) {
                self.in_flight = None;
            }
            if self.alignment.as_ref().is_some_and(|a| a.barrier.checkpoint_id == id) {
                self.abort_alignment();
            }
            if id > self.last_snapshot {
                self.aborted.insert(id);
                while self.aborted.len() > ABORTED_REMEMBERED_MAX {
                    self.aborted.pop_first();
                }
            }
        }
        if let TaskControl::CheckpointComplete(id) = control {
            self.ctx.checkpoint_complete(id);
        }
        on_completion(self.head.as_mut(), &mut self.stopping, control)
    }

    /// Before a barrier is handled, applies the control messages queued meanwhile (a step may
    /// take many slow batches after its one poll). The completion of the previous checkpoint
    /// is usually among them, as the job master sends it before it triggers the next one: an
    /// incremental snapshot that has heard it writes deltas on it instead of whole key groups.
    fn poll_control_before_barrier(&mut self, element: &StreamElement<T>) -> Result<Option<Step>, TaskError> {
        if !matches!(element, StreamElement::Barrier(_)) {
            return Ok(None);
        }
        poll_control(self.ctx.control.clone(), false, |message| self.on_control(message))
    }

    /// The producer of `input` is gone: fine after its end of partition, a failure before.
    fn on_disconnected(&mut self, input: usize) -> Result<(), TaskError> {
        if self.ended[input] {
            self.closed[input] = true;
            return Ok(());
        }
        Err(self.input_closed(input))
    }

    fn input_closed(&self, input: usize) -> TaskError {
        // The producer is gone without saying so: it failed or was cancelled. The job master
        // cancels this task shortly in either case; report a failure only if it does not.
        if wait_for_cancel(&self.ctx) {
            return TaskError::Cancelled;
        }
        TaskError::Internal(format!(
            "{}: input from upstream subtask {input} closed without end of input",
            self.ctx.task_name
        ))
    }
}

/// The records of `element` with their timestamps and key hashes (each may be empty), or
/// `None` for an element without records.
#[allow(clippy::type_complexity)]
fn record_parts<T>(element: &StreamElement<T>) -> Option<(&[T], &[i64], &[u32])> {
    match element {
        StreamElement::Records(records) => Some((records, &[], &[])),
        StreamElement::KeyedRecords { records, hashes } => Some((records, &[], hashes)),
        StreamElement::TimestampedRecords { records, timestamps, hashes } => Some((records, timestamps, hashes)),
        _ => None,
    }
}

/// Waits up to [`CLOSED_INPUT_GRACE`] for the task to be cancelled; true if it was.
fn wait_for_cancel(ctx: &TaskContext) -> bool {
    let deadline = Instant::now() + CLOSED_INPUT_GRACE;
    while Instant::now() < deadline {
        if ctx.is_cancelled() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ctx.is_cancelled()
}

impl<T: Data> TaskBody for InputBody<T> {
    fn step(&mut self) -> Result<Step, TaskError> {
        let stopping = self.stopping.is_some();
        if let Some(step) = poll_control(self.ctx.control.clone(), stopping, |message| self.on_control(message))? {
            return Ok(step);
        }
        if self.input_ended && !self.data_ended {
            match &self.ctx.end_of_data {
                Some(report) if self.ctx.waits_for_final_checkpoint() => {
                    // Keep reading barriers from the ended inputs until the job says finish.
                    self.data_ended = true;
                    report();
                }
                _ => return Ok(Step::Finished),
            }
        }
        fire_due_timers(self.head.as_mut(), &self.ctx)?;
        if !self.replay.is_empty() {
            // Restored in-flight records go first: they were sent before anything the inputs
            // bring, and a barrier must not overtake them.
            for element in self.replay.drain(..self.replay.len().min(BATCHES_PER_STEP_MAX)).collect::<Vec<_>>() {
                self.handle(0, element)?;
            }
            return Ok(Step::Worked);
        }

        // Fast path: take what is ready, round-robin over the readable inputs for fairness.
        let mut taken = 0;
        let count = self.inputs.len();
        let mut empty_in_a_row = 0;
        let started = Instant::now();
        while taken < BATCHES_PER_STEP_MAX && empty_in_a_row < count && self.stopping.is_none() {
            if taken > 0 && started.elapsed() >= STEP_TIME_MAX {
                break;
            }
            let input = self.next_input;
            self.next_input = (self.next_input + 1) % count;
            if !self.readable(input) {
                empty_in_a_row += 1;
                continue;
            }
            match self.try_receive(input)? {
                Ok(element) => {
                    if let Some(step) = self.poll_control_before_barrier(&element)? {
                        return Ok(step);
                    }
                    self.handle(input, element)?;
                    taken += 1;
                    empty_in_a_row = 0;
                }
                Err(TryRecvError::Empty) => empty_in_a_row += 1,
                Err(TryRecvError::Disconnected) => {
                    self.on_disconnected(input)?;
                    empty_in_a_row += 1;
                }
            }
        }
        if taken > 0 {
            self.flush_timer.flush_if_due(self.head.as_mut())?;
            return Ok(Step::Worked);
        }

        // Nothing ready: hand partial batches on, then block on any readable input or control.
        self.head.flush()?;
        let wait = IDLE_WAIT_MAX.min(time_to_next_timer(self.head.as_ref(), &self.ctx));
        let mut select = Select::new();
        let mut indices = Vec::with_capacity(self.live);
        for (input, receiver) in self.inputs.iter().enumerate() {
            if self.readable(input) {
                select.recv(&receiver.inner);
                indices.push(input);
            }
        }
        let control = self.ctx.control.clone();
        if let Some(control) = &control {
            select.recv(control);
        }
        let metrics = std::sync::Arc::clone(&self.ctx.metrics);
        let idle_since = metrics.idle_begins();
        let operation = match select.select_timeout(wait) {
            Ok(operation) => {
                metrics.idle_ended(idle_since);
                operation
            }
            Err(_) => {
                metrics.idle_ended(idle_since);
                return Ok(Step::Idle);
            }
        };
        if operation.index() == indices.len() {
            // The control channel: handled at the top of the next step.
            if let Some(control) = &control
                && let Ok(message) = operation.recv(control)
                && let ControlOutcome::Stop = self.on_control(message)?
            {
                return Ok(Step::Finished);
            }
            return Ok(Step::Worked);
        }
        let input = indices[operation.index()];
        match self.inputs[input].recv_selected(operation) {
            Ok(element) => {
                let element = self.arrived(input, element)?;
                if let Some(step) = self.poll_control_before_barrier(&element)? {
                    return Ok(step);
                }
                self.handle(input, element)?;
                Ok(Step::Worked)
            }
            Err(_) => {
                self.on_disconnected(input)?;
                Ok(Step::Worked)
            }
        }
    }
}

fn fire_due_timers<T>(head: &mut dyn Operator<T>, ctx: &TaskContext) -> Result<(), TaskError> {
    if let Some(deadline) = head.next_timer() {
        let now = ctx.clock.now_ms();
        if deadline <= now {
            head.fire_timers(now)?;
        }
    }
    Ok(())
}

fn time_to_next_timer<T>(head: &dyn Operator<T>, ctx: &TaskContext) -> Duration {
    match head.next_timer() {
        Some(deadline) => Duration::from_millis(deadline.saturating_sub(ctx.clock.now_ms())),
        None => IDLE_WAIT_MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{BarrierKind, SnapshotSink};
    use std::sync::Mutex;

    /// Collects the records reaching the end of a chain. With a channel and a message, sends
    /// the message when the first batch comes: a control message that arrives while a (slow)
    /// batch is processed.
    struct Collect(Arc<Mutex<Vec<u64>>>, Option<(crossbeam_channel::Sender<TaskControl>, TaskControl)>);

    impl Operator<u64> for Collect {
        fn process_batch(&mut self, batch: &mut Vec<u64>) -> Result<(), TaskError> {
            if let Some((control, message)) = self.1.take() {
                control.send(message).unwrap();
            }
            self.0.lock().unwrap().append(batch);
            Ok(())
        }
        fn process_watermark(&mut self, _watermark: i64) -> Result<(), TaskError> {
            Ok(())
        }
        fn process_watermark_status(&mut self, _idle: bool) -> Result<(), TaskError> {
            Ok(())
        }
        fn fire_timers(&mut self, _now_ms: u64) -> Result<(), TaskError> {
            Ok(())
        }
        fn next_timer(&self) -> Option<u64> {
            None
        }
        fn end_input(&mut self) -> Result<(), TaskError> {
            Ok(())
        }
        fn flush(&mut self) -> Result<(), TaskError> {
            Ok(())
        }
        fn snapshot_state(&mut self, _barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
            // What the chain had processed at the snapshot.
            let seen = self.0.lock().unwrap().iter().map(|r| r.to_le_bytes().to_vec()).collect();
            let state =
                OperatorStateData { name: "seen".into(), mode: crate::snapshot::Redistribution::Split, elements: seen };
            snapshot.operators.push(OperatorSnapshotData {
                uid: "test".into(),
                keyed: None,
                operator_states: vec![state],
            });
            Ok(())
        }
        fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), TaskError> {
            Ok(())
        }
    }

    /// Records the checkpoint ids snapshots were submitted for, and (in `1`) the order of
    /// submissions and completions heard.
    #[derive(Default)]
    #[allow(clippy::type_complexity)]
    struct Snapshots(
        Mutex<Vec<u64>>,
        Mutex<Vec<String>>,
        Mutex<Vec<SnapshotTimings>>,
        /// Per snapshot, each operator state as (uid, name, elements).
        Mutex<Vec<Vec<(String, String, Vec<Vec<u8>>)>>>,
    );

    impl SnapshotSink for Snapshots {
        fn submit(&self, snapshot: TaskSnapshot) {
            let states = snapshot
                .operators
                .iter()
                .flat_map(|o| o.operator_states.iter().map(|s| (o.uid.clone(), s.name.clone(), s.elements.clone())))
                .collect();
            self.3.lock().unwrap().push(states);
            self.0.lock().unwrap().push(snapshot.barrier.checkpoint_id);
            self.2.lock().unwrap().push(snapshot.timings);
            self.1.lock().unwrap().push(format!("snapshot {}", snapshot.barrier.checkpoint_id));
        }
        fn checkpoint_complete(&self, checkpoint_id: u64) {
            self.1.lock().unwrap().push(format!("complete {checkpoint_id}"));
        }
    }

    fn barrier(checkpoint_id: u64) -> Barrier {
        Barrier {
            checkpoint_id,
            timestamp_ms: 0,
            kind: BarrierKind::Checkpoint { full: false, unaligned: false },
            location: format!("memory://exchange-test/chk-{checkpoint_id}").into(),
        }
    }

    fn context(control: Receiver<TaskControl>, snapshots: &Arc<Snapshots>) -> TaskContext {
        let mut ctx = TaskContext::for_test(0, 1, 8);
        ctx.control = Some(control);
        ctx.snapshots = Some(Arc::clone(snapshots) as Arc<dyn SnapshotSink>);
        ctx
    }

    /// An input body over two channels that collects into `seen`, with its control channel
    /// and its snapshots.
    struct TwoInputs {
        control_tx: crossbeam_channel::Sender<TaskControl>,
        snapshots: Arc<Snapshots>,
        in0_tx: ChannelSender<u64>,
        in1_tx: ChannelSender<u64>,
        seen: Arc<Mutex<Vec<u64>>>,
        body: InputBody<u64>,
    }

    fn two_inputs() -> TwoInputs {
        let (control_tx, control) = crossbeam_channel::unbounded();
        let snapshots = Arc::new(Snapshots::default());
        let ctx = context(control, &snapshots);
        let (in0_tx, in0) = channel::<u64>();
        let (in1_tx, in1) = channel::<u64>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let body = InputBody::new(vec![in0, in1], Box::new(Collect(Arc::clone(&seen), None)), &ctx).unwrap();
        TwoInputs { control_tx, snapshots, in0_tx, in1_tx, seen, body }
    }

    #[test]
    fn a_barrier_arriving_after_its_checkpoint_was_aborted_blocks_no_input() {
        let TwoInputs { control_tx, snapshots, in0_tx, in1_tx, seen, mut body } = two_inputs();
        let run = |body: &mut InputBody<u64>| {
            for _ in 0..8 {
                body.step().unwrap();
            }
        };
        in0_tx.send(StreamElement::Barrier(barrier(1))).unwrap();
        run(&mut body);
        control_tx.send(TaskControl::CheckpointAborted(1)).unwrap();
        run(&mut body);
        // Input 1's copy of the aborted barrier comes late, then records on both inputs.
        in1_tx.send(StreamElement::Barrier(barrier(1))).unwrap();
        in1_tx.send(StreamElement::Records(vec![10, 11])).unwrap();
        in0_tx.send(StreamElement::Records(vec![1])).unwrap();
        run(&mut body);
        let mut got = seen.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, vec![1, 10, 11], "an input stayed blocked by the aborted checkpoint's barrier");
        assert!(snapshots.0.lock().unwrap().is_empty());
        // The next checkpoint aligns as usual.
        in0_tx.send(StreamElement::Barrier(barrier(2))).unwrap();
        in1_tx.send(StreamElement::Barrier(barrier(2))).unwrap();
        run(&mut body);
        assert_eq!(*snapshots.0.lock().unwrap(), vec![2]);
    }

    #[test]
    fn a_completion_queued_during_a_step_is_heard_before_the_next_barrier_is_snapshotted() {
        let (control_tx, control) = crossbeam_channel::unbounded();
        let snapshots = Arc::new(Snapshots::default());
        let ctx = context(control, &snapshots);
        let (in_tx, input) = channel::<u64>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let head = Collect(Arc::clone(&seen), Some((control_tx.clone(), TaskControl::CheckpointComplete(1))));
        let mut body = InputBody::new(vec![input], Box::new(head), &ctx).unwrap();
        // One step takes both: the completion of 1 comes while the batch is processed, after
        // the step's poll of its control channel and before barrier 2.
        in_tx.send(StreamElement::Records(vec![1, 2])).unwrap();
        in_tx.send(StreamElement::Barrier(barrier(2))).unwrap();
        body.step().unwrap();
        assert_eq!(
            *snapshots.1.lock().unwrap(),
            vec!["complete 1".to_string(), "snapshot 2".to_string()],
            "checkpoint 2 was snapshotted before the subtask heard that 1 completed: an incremental \
             snapshot could not build on 1"
        );
        assert_eq!(*seen.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_slow_operator_ends_its_step_within_the_step_time_budget() {
        let (_control_tx, control) = crossbeam_channel::unbounded();
        let snapshots = Arc::new(Snapshots::default());
        let ctx = context(control, &snapshots);
        let (in_tx, input) = channel_with_capacity::<u64>(BATCHES_PER_STEP_MAX);
        let seen = Arc::new(Mutex::new(Vec::new()));
        // A slow operator: 4 ms per record, and each batch is one record.
        let slow = crate::operators::MapOperator::new(
            |record: u64| {
                std::thread::sleep(Duration::from_millis(4));
                record
            },
            Box::new(Collect(Arc::clone(&seen), None)),
        );
        let mut body = InputBody::new(vec![input], Box::new(slow), &ctx).unwrap();
        for record in 0..BATCHES_PER_STEP_MAX as u64 {
            in_tx.send(StreamElement::Records(vec![record])).unwrap();
        }
        // 64 batches of 4 ms would hold the task 256 ms away from its cancel flag, control
        // channel and timers; the budget ends the step after 10 ms (3 batches, 4 at most).
        body.step().unwrap();
        let taken = seen.lock().unwrap().len();
        assert!((1..=4).contains(&taken), "one step took {taken} batches of a slow operator");
        body.step().unwrap();
        assert!(seen.lock().unwrap().len() > taken, "the next step goes on where the last stopped");
    }

    #[test]
    fn a_snapshot_times_its_start_delay_and_alignment() {
        let TwoInputs { control_tx: _supervised, snapshots, in0_tx, in1_tx, mut body, .. } = two_inputs();
        // Triggered 300 ms ago; the second input's barrier comes 100 ms after the first's.
        let triggered = Barrier { timestamp_ms: weir_types::lifecycle::now_ms() - 300, ..barrier(1) };
        in0_tx.send(StreamElement::Barrier(triggered.clone())).unwrap();
        body.step().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        in1_tx.send(StreamElement::Barrier(triggered)).unwrap();
        body.step().unwrap();
        let timings = snapshots.2.lock().unwrap().clone();
        assert_eq!(timings.len(), 1, "{timings:?}");
        let timings = timings[0];
        assert!((300..5_000).contains(&timings.start_delay_ms), "{timings:?}");
        assert!((100..5_000).contains(&timings.alignment_ms), "{timings:?}");
        assert!(timings.sync_ms < 5_000 && timings.async_ms == 0, "{timings:?}");
    }

    #[test]
    fn a_task_whose_control_channel_closed_cancels_itself() {
        let TwoInputs { control_tx, in0_tx, in1_tx: _open, mut body, .. } = two_inputs();
        in0_tx.send(StreamElement::Records(vec![1])).unwrap();
        assert!(body.step().is_ok(), "supervised: it runs");
        // Its job master or TaskManager is gone: nothing can checkpoint, stop or cancel it.
        drop(control_tx);
        assert!(matches!(body.step(), Err(TaskError::Cancelled)));
    }

    /// A reader of `1, 2, 3 ...` forever.
    struct Counting(u64);

    impl SourceReader<u64> for Counting {
        fn poll_next(&mut self, out: &mut Vec<u64>, max_records: usize) -> Result<SourcePoll, TaskError> {
            for _ in 0..max_records.min(4) {
                self.0 += 1;
                out.push(self.0);
            }
            Ok(SourcePoll::Data)
        }
        fn snapshot_positions(&self) -> crate::source::SourcePositions {
            crate::source::SourcePositions { mode: crate::snapshot::Redistribution::Split, elements: Vec::new() }
        }
    }

    #[test]
    fn a_source_skips_queued_triggers_whose_abort_is_queued_too() {
        let (control_tx, control) = crossbeam_channel::unbounded();
        let snapshots = Arc::new(Snapshots::default());
        let ctx = context(control, &snapshots);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut body = SourceBody::new(Box::new(Counting(0)), Box::new(Collect(Arc::clone(&seen), None)), &ctx);
        for id in 1..=3 {
            control_tx.send(TaskControl::TriggerCheckpoint(barrier(id))).unwrap();
            if id < 3 {
                control_tx.send(TaskControl::CheckpointAborted(id)).unwrap();
            }
        }
        body.step().unwrap();
        assert_eq!(*snapshots.0.lock().unwrap(), vec![3]);
        assert!(!seen.lock().unwrap().is_empty(), "the source read on");
    }

    #[test]
    fn a_sender_blocked_on_a_full_channel_shows_in_backpressure_while_it_waits() {
        let ctx = TaskContext::for_test(0, 1, 8);
        let metrics = Arc::clone(&ctx.metrics);
        let (sender, receiver) = channel::<u64>();
        let mut output = ChannelOutput::new(Partitioner::Forward, vec![sender], &ctx);
        let producer = std::thread::spawn(move || {
            for _ in 0..CHANNEL_BATCHES_MAX + 1 {
                output.process_batch(&mut vec![0; BATCH_RECORDS_MAX]).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let blocked = metrics.backpressured_ms_now();
        assert!(blocked >= 100, "a sender blocked for 300 ms shows {blocked} ms");
        while !producer.is_finished() {
            let _ = receiver.try_recv();
        }
        producer.join().unwrap();
        assert_eq!(metrics.backpressured_since_ms.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(metrics.backpressured_ms_now() >= blocked);
    }

    /// Everything a forward output sent, as (record, timestamp) pairs and watermarks.
    fn drained(receiver: &ChannelReceiver<u64>) -> Vec<String> {
        let mut seen = Vec::new();
        while let Ok(element) = receiver.try_recv() {
            match element {
                StreamElement::Records(records) => seen.extend(records.iter().map(|r| format!("{r}"))),
                StreamElement::TimestampedRecords { records, timestamps, .. } => {
                    assert_eq!(records.len(), timestamps.len(), "a record without its timestamp");
                    seen.extend(records.iter().zip(&timestamps).map(|(r, t)| format!("{r}@{t}")));
                }
                StreamElement::Watermark(watermark) => seen.push(format!("W{watermark}")),
                _ => {}
            }
        }
        seen
    }

    #[test]
    fn a_forward_output_hands_whole_batches_on_and_keeps_records_in_order_with_their_timestamps() {
        let ctx = TaskContext::for_test(0, 1, 8);
        let (sender, receiver) = channel::<u64>();
        let mut output = ChannelOutput::new(Partitioner::Forward, vec![sender], &ctx);
        // Taken whole (nothing buffered), then appended to, then a full batch taken whole.
        let mut batch = vec![1, 2];
        output.process_batch(&mut batch).unwrap();
        assert!(batch.is_empty(), "the caller's batch is handed on, and it gets an empty one back");
        output.process_batch(&mut vec![3]).unwrap();
        output.process_watermark(7).unwrap();
        output.process_batch(&mut (10..10 + BATCH_RECORDS_MAX as u64).collect()).unwrap();
        let mut expected: Vec<String> = ["1", "2", "3", "W7"].map(String::from).to_vec();
        expected.extend((10..10 + BATCH_RECORDS_MAX as u64).map(|r| r.to_string()));
        assert_eq!(drained(&receiver), expected, "a full batch goes at once");
        // Timestamps travel with their records, whole or appended, and records without
        // timestamps after them carry none.
        output.process_timestamped_batch(&mut vec![20, 21], &mut vec![200, 210], &mut Vec::new()).unwrap();
        output.process_timestamped_batch(&mut vec![22], &mut vec![220], &mut Vec::new()).unwrap();
        output.process_batch(&mut vec![23]).unwrap();
        output.flush().unwrap();
        output.process_timestamped_batch(&mut vec![24], &mut vec![240], &mut Vec::new()).unwrap();
        output.flush().unwrap();
        assert_eq!(drained(&receiver), ["20@200", "21@210", "22@220", &format!("23@{NO_TIMESTAMP}"), "24@240"]);
    }

    /// Elements in the channel, as the test sees it.
    fn queued(receiver: &ChannelReceiver<u64>) -> usize {
        receiver.inner.len()
    }

    /// Waits up to 10 s for `condition`.
    fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "{what} did not happen in 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_producer_blocked_on_a_full_channel_resumes_once_half_of_it_was_taken() {
        let (sender, receiver) = channel_with_capacity::<u64>(4);
        for batch in 0..4 {
            sender.try_send(StreamElement::Records(vec![batch])).unwrap();
        }
        let producer = std::thread::spawn(move || {
            sender.send_timeout(StreamElement::Records(vec![4]), Duration::from_secs(10)).unwrap();
            sender
        });
        eventually("the producer waiting", || receiver.room.waiting.load(Ordering::Relaxed));
        receiver.try_recv().unwrap();
        // One free slot is no reason to wake the producer: it would send one batch and
        // block again.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(queued(&receiver), 3, "the producer was woken by the first batch taken");
        receiver.try_recv().unwrap();
        // Down to half: the producer refills.
        eventually("the producer's send", || producer.is_finished());
        let _sender = producer.join().unwrap();
        let taken: Vec<u64> = std::iter::from_fn(|| match receiver.try_recv() {
            Ok(StreamElement::Records(batch)) => Some(batch[0]),
            _ => None,
        })
        .collect();
        assert_eq!(taken, [2, 3, 4]);
    }

    #[test]
    fn a_producer_waiting_for_room_learns_at_once_that_its_consumer_went_away() {
        let (sender, receiver) = channel_with_capacity::<u64>(2);
        for batch in 0..2 {
            sender.try_send(StreamElement::Records(vec![batch])).unwrap();
        }
        let producer = std::thread::spawn(move || {
            let started = Instant::now();
            let result = sender.send_timeout(StreamElement::Records(vec![2]), Duration::from_secs(60));
            (matches!(result, Err(SendTimeoutError::Disconnected(_))), started.elapsed())
        });
        eventually("the producer waiting", || receiver.room.waiting.load(Ordering::Relaxed));
        drop(receiver);
        let (disconnected, waited) = producer.join().unwrap();
        assert!(disconnected, "the send did not fail with the consumer gone");
        assert!(waited < Duration::from_secs(30), "the producer waited {waited:?} for a consumer that was gone");
    }

    /// Producer and consumer race through a small channel with every way of taking: each
    /// element arrives once and in order, and no wake-up is lost (the producer's waits end by
    /// a wake-up, never by their 10 s timeout).
    #[test]
    fn a_small_channel_hands_everything_over_in_order_under_contention() {
        const ELEMENTS: u64 = 50_000;
        let (sender, receiver) = channel_with_capacity::<u64>(4);
        let producer = std::thread::spawn(move || {
            for element in 0..ELEMENTS {
                if let Err(e) = sender.send_timeout(StreamElement::Records(vec![element]), Duration::from_secs(10)) {
                    panic!("element {element} not sent: {e:?}");
                }
            }
        });
        let mut next = 0;
        while next < ELEMENTS {
            let element = match next % 3 {
                0 => receiver.recv_timeout(Duration::from_secs(30)).unwrap(),
                1 => match receiver.try_recv() {
                    Ok(element) => element,
                    Err(TryRecvError::Empty) => continue,
                    Err(TryRecvError::Disconnected) => break,
                },
                _ => {
                    let mut select = Select::new();
                    select.recv(&receiver.inner);
                    let operation = select.select_timeout(Duration::from_secs(30)).unwrap();
                    receiver.recv_selected(operation).unwrap()
                }
            };
            match element {
                StreamElement::Records(batch) => assert_eq!(batch, vec![next]),
                other => panic!("unexpected {other:?}"),
            }
            next += 1;
        }
        producer.join().unwrap();
        assert_eq!(next, ELEMENTS);
    }

    fn unaligned(checkpoint_id: u64) -> Barrier {
        Barrier { kind: BarrierKind::Checkpoint { full: false, unaligned: true }, ..barrier(checkpoint_id) }
    }

    fn notice(checkpoint_id: u64, records_before: u64) -> PriorityBarrier {
        PriorityBarrier { barrier: unaligned(checkpoint_id), records_before }
    }

    /// The in-flight records of snapshot `index`, decoded in order, and what the chain had
    /// processed when it was taken.
    fn in_flight_of(snapshots: &Snapshots, index: usize) -> (Vec<u64>, Vec<u64>) {
        let states = snapshots.3.lock().unwrap()[index].clone();
        let mut in_flight = Vec::new();
        let mut seen = Vec::new();
        for (_, name, elements) in states {
            for element in elements {
                if name == crate::snapshot::IN_FLIGHT_STATE {
                    let batch: crate::in_flight::InFlightBatch<u64> = postcard::from_bytes(&element).unwrap();
                    in_flight.extend(batch.records);
                } else {
                    seen.push(u64::from_le_bytes(element.try_into().unwrap()));
                }
            }
        }
        (in_flight, seen)
    }

    /// The notice overtakes queued records: the subtask snapshots before processing them and
    /// records, per input, exactly the records its producer sent before its own snapshot,
    /// also those of a batch that straddles the count and those read before the notice.
    #[test]
    fn an_unaligned_barrier_overtakes_queued_records_and_records_them_as_in_flight() {
        let TwoInputs { control_tx: _supervised, snapshots, in0_tx, in1_tx, seen, mut body } = two_inputs();
        in0_tx.send(StreamElement::Records(vec![1, 2])).unwrap();
        in0_tx.send(StreamElement::Records(vec![3])).unwrap();
        in0_tx.post_priority(notice(1, 3));
        in0_tx.send(StreamElement::Records(vec![4])).unwrap();
        in1_tx.send(StreamElement::Records(vec![10])).unwrap();
        body.step().unwrap();
        assert!(snapshots.0.lock().unwrap().is_empty(), "input 1's notice has not come");
        // Input 1's producer snapshotted after sending 10 and 11; 12 follows in the same batch.
        in1_tx.post_priority(notice(1, 2));
        in1_tx.send(StreamElement::Records(vec![11, 12])).unwrap();
        for _ in 0..4 {
            body.step().unwrap();
        }
        assert_eq!(*snapshots.0.lock().unwrap(), vec![1]);
        let (mut in_flight, seen_at_snapshot) = in_flight_of(&snapshots, 0);
        in_flight.sort_unstable();
        assert_eq!(seen_at_snapshot, Vec::<u64>::new(), "the snapshot waited for queued records");
        assert_eq!(in_flight, vec![1, 2, 3, 10, 11]);
        let mut all = seen.lock().unwrap().clone();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3, 4, 10, 11, 12], "records were lost or repeated while processing");
        // The in-band copies that follow change nothing.
        in0_tx.send(StreamElement::Barrier(unaligned(1))).unwrap();
        in1_tx.send(StreamElement::Barrier(unaligned(1))).unwrap();
        body.step().unwrap();
        assert_eq!(*snapshots.0.lock().unwrap(), vec![1]);
    }

    /// Records taken early for one checkpoint and not yet processed when the next one's
    /// notice comes are in flight for that one too: nothing is lost between the two.
    #[test]
    fn records_read_ahead_but_not_processed_are_in_flight_for_the_next_checkpoint() {
        let (control_tx, control) = crossbeam_channel::unbounded();
        let snapshots = Arc::new(Snapshots::default());
        let ctx = context(control, &snapshots);
        let (tx, rx) = channel::<u64>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut body = InputBody::new(vec![rx], Box::new(Collect(Arc::clone(&seen), None)), &ctx).unwrap();
        for batch in 0..6u64 {
            tx.send(StreamElement::Records(vec![batch])).unwrap();
        }
        tx.post_priority(notice(1, 6));
        // The first element read hears notice 1, which takes the other five early.
        let first = body.try_receive(0).unwrap().unwrap();
        assert_eq!(*snapshots.0.lock().unwrap(), vec![1]);
        body.handle(0, first).unwrap();
        assert_eq!(body.stash[0].len(), 5);
        // Checkpoint 2's producer snapshot came after all six and two more.
        tx.send(StreamElement::Records(vec![6])).unwrap();
        tx.post_priority(notice(2, 8));
        tx.send(StreamElement::Records(vec![7])).unwrap();
        tx.send(StreamElement::Records(vec![8])).unwrap();
        drop(control_tx);
        let mut taken = 0;
        while snapshots.0.lock().unwrap().len() < 2 {
            let element = body.try_receive(0).unwrap().unwrap();
            body.handle(0, element).unwrap();
            taken += 1;
            assert!(taken < 20, "checkpoint 2 never completed");
        }
        let (mut in_flight, processed) = in_flight_of(&snapshots, 1);
        in_flight.sort_unstable();
        let mut before_2 = processed.clone();
        before_2.extend(&in_flight);
        before_2.sort_unstable();
        assert_eq!(before_2, (0..8).collect::<Vec<u64>>(), "processed {processed:?}, in flight {in_flight:?}");
    }

    /// Elements taken early still take room: reading ahead for an unaligned checkpoint does
    /// not let the producer fill the channel again (buffers stay bounded under backpressure).
    #[test]
    fn stashed_elements_keep_taking_room_until_processed() {
        let (tx, rx) = channel_with_capacity::<u64>(4);
        for i in 0..4 {
            tx.try_send(StreamElement::Records(vec![i])).unwrap();
        }
        for _ in 0..4 {
            rx.try_recv_to_stash().unwrap();
        }
        assert!(matches!(tx.try_send(StreamElement::Records(vec![9])), Err(TrySendError::Full(_))));
        assert!(matches!(
            tx.send_timeout(StreamElement::Records(vec![9]), Duration::from_millis(20)),
            Err(SendTimeoutError::Timeout(_))
        ));
        rx.unstash();
        tx.try_send(StreamElement::Records(vec![9])).unwrap();
        assert!(matches!(tx.try_send(StreamElement::Records(vec![10])), Err(TrySendError::Full(_))));
    }

    /// An idle producer's barrier in band is a notice too (nothing was in flight), and an
    /// input that ended owes nothing.
    #[test]
    fn an_unaligned_barrier_in_band_completes_with_nothing_in_flight() {
        let TwoInputs { control_tx: _supervised, snapshots, in0_tx, in1_tx, mut body, .. } = two_inputs();
        in0_tx.send(StreamElement::Records(vec![1])).unwrap();
        in0_tx.send(StreamElement::Barrier(unaligned(1))).unwrap();
        in1_tx.send(StreamElement::EndOfPartition).unwrap();
        for _ in 0..4 {
            body.step().unwrap();
        }
        assert_eq!(*snapshots.0.lock().unwrap(), vec![1]);
        let (in_flight, seen_at_snapshot) = in_flight_of(&snapshots, 0);
        assert_eq!((in_flight, seen_at_snapshot), (vec![], vec![1]));
        assert!(snapshots.3.lock().unwrap()[0].iter().all(|(_, name, _)| name != crate::snapshot::IN_FLIGHT_STATE));
    }

    /// A restored body, the sender of its one input, and what its chain processed.
    type Restored = (InputBody<u64>, ChannelSender<u64>, Arc<Mutex<Vec<u64>>>);

    fn restored_body(
        batches: Vec<crate::in_flight::InFlightBatch<u64>>,
        subtask: u32,
        parallelism: u32,
    ) -> Result<Restored, TaskError> {
        let elements = batches.iter().map(|b| b.encode().unwrap()).collect();
        let mut ctx = TaskContext::for_test(subtask, parallelism, 8);
        let restored = crate::snapshot::RestoredOperator {
            operator_states: [(crate::snapshot::IN_FLIGHT_STATE.to_string(), elements)].into(),
            ..Default::default()
        };
        ctx.restored = Some(Arc::new([("test".to_string(), restored)].into()));
        let (tx, rx) = channel::<u64>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let body = InputBody::new(vec![rx], Box::new(Collect(Arc::clone(&seen), None)), &ctx)?;
        Ok((body, tx, seen))
    }

    fn batch(
        subtask: u32,
        parallelism: u32,
        records: Vec<u64>,
        hashes: Vec<u32>,
    ) -> crate::in_flight::InFlightBatch<u64> {
        crate::in_flight::InFlightBatch { version: 1, subtask, parallelism, records, timestamps: vec![], hashes }
    }

    /// A restore replays the in-flight records first: a subtask's own ones at the same
    /// parallelism, keyed ones by key group at any.
    #[test]
    fn restored_in_flight_records_are_replayed_before_the_inputs_and_split_by_key_group() {
        let batches = vec![batch(0, 2, vec![1, 2], vec![]), batch(1, 2, vec![3], vec![])];
        let (mut body, tx, seen) = restored_body(batches, 0, 2).unwrap();
        tx.send(StreamElement::Records(vec![9])).unwrap();
        for _ in 0..3 {
            body.step().unwrap();
        }
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 9]);

        // Keyed, rescaled from 2 to 3 subtasks: each record goes to its key group's owner.
        let hashes: Vec<u32> = (0..40u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let records: Vec<u64> = (0..40).collect();
        let mut all = Vec::new();
        for subtask in 0..3 {
            let batches = vec![batch(0, 2, records.clone(), hashes.clone())];
            let (mut body, _tx, seen) = restored_body(batches, subtask, 3).unwrap();
            body.step().unwrap();
            for record in seen.lock().unwrap().iter() {
                let key_group = key_group_for_hash(hashes[*record as usize], 8);
                assert_eq!(compute_operator_index_for_key_group(8, 3, key_group), subtask);
                all.push(*record);
            }
        }
        all.sort_unstable();
        assert_eq!(all, records, "a keyed in-flight record was lost or replayed twice across the rescale");

        // Records of an exchange that is not keyed cannot move to another parallelism.
        let Err(error) = restored_body(vec![batch(0, 2, vec![1], vec![])], 0, 3) else {
            panic!("a rescale of non-keyed in-flight records was accepted")
        };
        assert!(error.to_string().contains("restore at parallelism 2"), "{error}");
    }
}
