//! The runtime side of operators: chained links that pass records in batches, and the
//! task bodies the runtime drives.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;
use weir_types::JobId;

use crate::error::TaskError;
use crate::snapshot::{Barrier, RestoredOperator, SnapshotSink, TaskControl, TaskSnapshot};
use crate::source::SplitInfo;

/// A record without an event timestamp (Flink's `Long.MIN_VALUE`).
pub const NO_TIMESTAMP: i64 = i64::MIN;
/// The watermark before any was seen.
pub const MIN_WATERMARK: i64 = i64::MIN;
/// The watermark at the end of a bounded input: every event-time timer and window fires.
pub const MAX_WATERMARK: i64 = i64::MAX;

/// Records a source reads or a channel carries in one batch, at most.
pub const BATCH_RECORDS_MAX: usize = 1024;
/// Longest a task blocks waiting for input before it re-checks cancellation and timers.
pub const IDLE_WAIT_MAX: Duration = Duration::from_millis(20);

/// One link of an operator chain: consumes batches of `I`, pushes its output to the next link.
///
/// Every method is called from the owning subtask's thread only.
pub trait Operator<I>: Send {
    /// Processes and drains `batch`.
    fn process_batch(&mut self, batch: &mut Vec<I>) -> Result<(), TaskError>;

    /// Processes and drains a batch that arrived over a key-partitioned channel, with each
    /// record's key hash as the partitioner computed it (`hashes[i]` is `batch[i]`'s), so a
    /// keyed operator need not hash the key again.
    fn process_hashed_batch(&mut self, batch: &mut Vec<I>, hashes: &mut Vec<u32>) -> Result<(), TaskError> {
        hashes.clear();
        self.process_batch(batch)
    }

    /// Processes and drains a batch whose records carry event timestamps (`timestamps[i]` is
    /// `batch[i]`'s, [`NO_TIMESTAMP`] for none); `hashes` is empty unless the batch came over
    /// a key-partitioned channel. Links that do not care about time drop the timestamps.
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<I>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        timestamps.clear();
        if hashes.is_empty() { self.process_batch(batch) } else { self.process_hashed_batch(batch, hashes) }
    }

    /// Processes and drains a source's batch with the reader's splits (which split each
    /// record came from): the source's own watermark strategy keeps a watermark per split;
    /// every other link ignores them.
    fn process_split_batch(&mut self, batch: &mut Vec<I>, _splits: SplitInfo<'_>) -> Result<(), TaskError> {
        self.process_batch(batch)
    }

    /// The event-time clock of this link's input advanced to `watermark`: fire the event-time
    /// timers it passed, then pass it on (Flink's `processWatermark`).
    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError>;

    /// The input went idle (`true`) or active again: an idle stream does not hold back the
    /// watermark of the operators it feeds (Flink's `WatermarkStatus`).
    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError>;

    /// Fires processing-time timers due at `now_ms`, here and further down the chain.
    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError>;

    /// The earliest pending timer here or further down the chain.
    fn next_timer(&self) -> Option<u64>;

    /// The input has ended: emit final results, then tell the next link.
    fn end_input(&mut self) -> Result<(), TaskError>;

    /// Pushes partially filled output batches on (called when the task goes idle).
    fn flush(&mut self) -> Result<(), TaskError>;

    /// A barrier reached this link (aligned, for exactly-once): copy this link's state into
    /// `snapshot`, then pass the barrier on. No record may be emitted in between.
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError>;

    /// Checkpoint `checkpoint_id` completed everywhere: commit what was staged for it, here
    /// and further down the chain.
    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError>;
}

/// Counters of one subtask, read by REST and metrics while the task runs.
#[derive(Debug, Default)]
pub struct TaskMetrics {
    /// Records received from upstream tasks (or read, for a source).
    pub records_in: AtomicU64,
    /// Records sent to downstream tasks or written by a sink.
    pub records_out: AtomicU64,
    /// Milliseconds spent blocked on full output channels (backpressure), up to the end of
    /// the last wait.
    pub backpressured_ms: AtomicU64,
    /// When the wait on a full output channel going on now began (epoch ms; 0: none), so a
    /// reader counts a sender blocked right now ([`TaskMetrics::backpressured_ms_now`]).
    pub backpressured_since_ms: AtomicU64,
    /// Milliseconds spent waiting for input (an input task with nothing to read, a source
    /// with nothing available), up to the end of the last wait: Flink's idle time.
    pub idle_ms: AtomicU64,
    /// When the wait for input going on now began (epoch ms; 0: none).
    pub idle_since_ms: AtomicU64,
    /// Snapshot bytes read while restoring this subtask's state.
    pub restored_bytes: AtomicU64,
    /// Each chained operator's counters, in the order of the task's chain (head first).
    pub operators: Vec<OperatorMetrics>,
    /// A source's read position per split (a Kafka source's partitions), refreshed by its
    /// reader about once a second; empty for other tasks.
    pub splits: std::sync::Mutex<Vec<SplitPosition>>,
    /// Records a source skipped because they could not be deserialised (when the user chose
    /// to skip such records rather than fail).
    pub records_skipped: AtomicU64,
    /// The watermark of the subtask's input (the minimum over its active input channels;
    /// [`MIN_WATERMARK`] before the first), stored order-preserving as `u64` (sign bit
    /// flipped) so the default 0 means none.
    pub input_watermark: AtomicU64,
    /// Records that came after the watermark had passed their windows' ends (plus allowed
    /// lateness) and were dropped or sent to a late-data side output.
    pub records_late: AtomicU64,
    /// Of [`TaskMetrics::records_late`], those dropped: not sent to a late-data side output
    /// (Flink's `numLateRecordsDropped`).
    pub records_late_dropped: AtomicU64,
    /// Bytes received over TCP from producers in other processes, frames with their length
    /// prefixes (Flink's `numBytesIn`). Channels within a process hand records over without
    /// serializing them and count none.
    pub bytes_in: AtomicU64,
    /// Bytes sent over TCP to consumers in other processes (Flink's `numBytesOut`), as
    /// [`TaskMetrics::bytes_in`].
    pub bytes_out: AtomicU64,
    /// Records a sink could not write: refused by the external system or its client
    /// (Flink's FLIP-33 `numRecordsSendErrors`). The sink fails the task too.
    pub records_send_errors: AtomicU64,
    /// The subtask's channels to other processes whose bridge has not yet sent the end of
    /// partition: a finished subtask's final counters wait for them, so they hold every
    /// byte it sent.
    pub bridges_sending: AtomicU64,
}

/// Where a source reads one split, for metrics: a Kafka partition's next offset and how far
/// behind the partition's end it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitPosition {
    /// The split (`<topic>-<partition>` for Kafka).
    pub split: String,
    /// The next offset to read.
    pub current_offset: i64,
    /// Records between the position and the split's end, when known.
    pub lag: Option<i64>,
}

/// Records out of one operator of a chain (counted per batch by a [`Metered`] link). Its
/// records in need no counter: they are the records out of the operator feeding it
/// (`fed_by`), or the task's records in for the head.
#[derive(Debug, Default)]
pub struct OperatorMetrics {
    /// The operator's uid.
    pub uid: String,
    /// The position in the chain of the operator feeding this one (`None`: the head).
    pub fed_by: Option<usize>,
    /// Records it emitted.
    pub records_out: AtomicU64,
    /// The newest watermark it emitted (Flink's operator `currentOutputWatermark`), stored
    /// as [`TaskMetrics::input_watermark`] is: 0 before the first.
    pub output_watermark: AtomicU64,
}

impl OperatorMetrics {
    /// The newest watermark the operator emitted, `None` before the first.
    pub fn output_watermark(&self) -> Option<i64> {
        let watermark = weir_state::timer_to_event_time(self.output_watermark.load(Ordering::Relaxed));
        (watermark != MIN_WATERMARK).then_some(watermark)
    }
}

impl TaskMetrics {
    /// Counters for a task whose chain holds the operators `uids` (head first), each fed by
    /// the operator at the position `fed_by` names (`None`: the task's input).
    pub fn for_chain(uids: &[String], fed_by: &[Option<usize>]) -> TaskMetrics {
        TaskMetrics {
            operators: uids
                .iter()
                .enumerate()
                .map(|(position, uid)| OperatorMetrics {
                    uid: uid.clone(),
                    fed_by: fed_by.get(position).copied().flatten(),
                    ..OperatorMetrics::default()
                })
                .collect(),
            ..TaskMetrics::default()
        }
    }
}

impl TaskMetrics {
    /// An outbound bridge of the subtask sent its end of partition, or ended without.
    pub fn bridge_done_sending(&self) {
        let _ = self.bridges_sending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Publishes the input watermark.
    pub fn set_input_watermark(&self, watermark: i64) {
        self.input_watermark.store(weir_state::event_time_to_timer(watermark), Ordering::Relaxed);
    }

    /// The input watermark, `None` before the first.
    pub fn input_watermark(&self) -> Option<i64> {
        let watermark = weir_state::timer_to_event_time(self.input_watermark.load(Ordering::Relaxed));
        (watermark != MIN_WATERMARK).then_some(watermark)
    }

    /// Replaces the split positions (a source reader, about once a second).
    pub fn set_splits(&self, splits: Vec<SplitPosition>) {
        *self.splits.lock().unwrap_or_else(|p| p.into_inner()) = splits;
    }

    /// The split positions last reported.
    pub fn splits(&self) -> Vec<SplitPosition> {
        self.splits.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds `n` to records in.
    #[inline]
    pub fn add_in(&self, n: usize) {
        self.records_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds `n` to records out.
    #[inline]
    pub fn add_out(&self, n: usize) {
        self.records_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A wait for input begins: its start is published, so the idle time grows while the
    /// task waits. Returns the start for [`TaskMetrics::idle_ended`]. (Two clock reads per
    /// wait, on the path where the task has nothing to do.)
    pub fn idle_begins(&self) -> u64 {
        let since = weir_types::lifecycle::now_ms().max(1);
        self.idle_since_ms.store(since, Ordering::Relaxed);
        since
    }

    /// The wait for input that began at `since` ended.
    pub fn idle_ended(&self, since: u64) {
        // On the clock `since` is on, so the total never shrinks as a wait ends.
        let waited = weir_types::lifecycle::now_ms().saturating_sub(since);
        self.idle_ms.fetch_add(waited, Ordering::Relaxed);
        self.idle_since_ms.store(0, Ordering::Relaxed);
    }

    /// Milliseconds waiting for input so far, the wait going on now included.
    pub fn idle_ms_now(&self) -> u64 {
        let done = self.idle_ms.load(Ordering::Relaxed);
        match self.idle_since_ms.load(Ordering::Relaxed) {
            0 => done,
            since => done + weir_types::lifecycle::now_ms().saturating_sub(since),
        }
    }

    /// Milliseconds blocked on full output channels so far, the wait going on now included.
    pub fn backpressured_ms_now(&self) -> u64 {
        let done = self.backpressured_ms.load(Ordering::Relaxed);
        match self.backpressured_since_ms.load(Ordering::Relaxed) {
            0 => done,
            since => done + weir_types::lifecycle::now_ms().saturating_sub(since),
        }
    }
}

/// Processing time, behind a seam so tests can control it.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
    }
}

/// What a subtask knows about itself; given to every factory and function.
#[derive(Clone)]
pub struct TaskContext {
    /// The job.
    pub job_id: JobId,
    /// The job's name.
    pub job_name: String,
    /// The task (chain) name, e.g. `Source: source -> Map`.
    pub task_name: String,
    /// The name of the operator being built or run (errors name it).
    pub operator_name: String,
    /// This subtask's index, from 0.
    pub subtask_index: u32,
    /// The task's parallelism.
    pub parallelism: u32,
    /// The job's max parallelism (key groups).
    pub max_parallelism: u32,
    /// Set when the task must stop (cancel, failure elsewhere).
    pub cancel: Arc<AtomicBool>,
    /// Set while an unaligned barrier's notice waits at one of the task's inputs: an output
    /// blocked on a full channel then takes the first room made, not half a channel's, so
    /// the task reaches its snapshot soon.
    pub urgent: Arc<AtomicBool>,
    /// This subtask's counters.
    pub metrics: Arc<TaskMetrics>,
    /// Processing time.
    pub clock: Arc<dyn Clock>,
    /// The uid of the operator being built (state is matched by it).
    pub operator_uid: String,
    /// Restored state of this subtask's operators, by uid (absent when starting empty).
    pub restored: Option<Arc<HashMap<String, RestoredOperator>>>,
    /// Messages from the job master (checkpoint triggers, completions).
    pub control: Option<Receiver<TaskControl>>,
    /// Where this subtask's snapshots go.
    pub snapshots: Option<Arc<dyn SnapshotSink>>,
    /// Exactly-once barrier alignment (false: at-least-once, no alignment).
    pub exactly_once: bool,
    /// `state.backend.type: spillable`: keyed state spills cold key groups to a local
    /// store; `None` for the `hashmap` backend.
    pub spill: Option<weir_state::spill::SpillOptions>,
    /// Incremental checkpoints (`execution.checkpointing.incremental`): keyed state records
    /// what is written after each snapshot, so a checkpoint writes only that (entry deltas).
    pub incremental: bool,
    /// Which run of the job this is: 0 first, +1 for every restart after a failure.
    pub attempt: u32,
    /// How often watermark strategies emit watermarks, ms (`pipeline.auto-watermark-interval`;
    /// 0: only the final one).
    pub auto_watermark_interval_ms: u64,
    /// The side outputs of the operator being built that someone reads (taken by its
    /// factory).
    pub side_outputs: Option<crate::side_output::SideLinks>,
    /// Set when the job takes periodic checkpoints: at the end of its input the task reports
    /// here and keeps taking part in checkpoints instead of ending; it ends when the job
    /// master sends [`TaskControl::Finish`], after a checkpoint that followed the end of
    /// every task's input (Flink's final checkpoint), so sinks commit their last records
    /// through a checkpoint and a failure until then replays nothing twice.
    pub end_of_data: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl TaskContext {
    /// True once the task was asked to stop.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The restored state of the operator being built, if the job was restored.
    pub fn restored_operator(&self) -> Option<&RestoredOperator> {
        self.restored.as_ref().and_then(|all| all.get(&self.operator_uid))
    }

    /// Hands a finished snapshot to the runtime.
    pub fn submit_snapshot(&self, snapshot: TaskSnapshot) -> Result<(), TaskError> {
        match &self.snapshots {
            Some(sink) => {
                sink.submit(snapshot);
                Ok(())
            }
            None => Err(TaskError::Internal(format!(
                "{}: a barrier arrived but checkpointing is not set up",
                self.task_name
            ))),
        }
    }

    /// Tells the runtime that checkpoint `checkpoint_id` completed.
    pub fn checkpoint_complete(&self, checkpoint_id: u64) {
        if let Some(sink) = &self.snapshots {
            sink.checkpoint_complete(checkpoint_id);
        }
    }

    /// A context for one subtask outside a running job (unit tests of operators).
    pub fn for_test(subtask_index: u32, parallelism: u32, max_parallelism: u32) -> TaskContext {
        TaskContext {
            job_id: JobId::from_u128(0),
            job_name: "test".into(),
            task_name: "test".into(),
            operator_name: "test".into(),
            subtask_index,
            parallelism,
            max_parallelism,
            cancel: Arc::new(AtomicBool::new(false)),
            urgent: Arc::new(AtomicBool::new(false)),
            metrics: Arc::new(TaskMetrics::default()),
            clock: Arc::new(SystemClock),
            operator_uid: "test".into(),
            restored: None,
            control: None,
            snapshots: None,
            exactly_once: true,
            spill: None,
            incremental: false,
            attempt: 0,
            auto_watermark_interval_ms: 200,
            side_outputs: None,
            end_of_data: None,
        }
    }

    /// True when this task waits for the job's final checkpoint at the end of its input.
    pub fn waits_for_final_checkpoint(&self) -> bool {
        self.end_of_data.is_some() && self.control.is_some()
    }
}

/// What one call of [`TaskBody::step`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Work was done; call again.
    Worked,
    /// Nothing to do right now (the body already waited a bounded time); call again.
    Idle,
    /// All input ended and every output was closed.
    Finished,
}

/// A subtask's whole work loop body: a source with its chain, or input channels with theirs.
pub trait TaskBody: Send {
    /// Does a bounded amount of work, blocking at most [`IDLE_WAIT_MAX`] when idle.
    fn step(&mut self) -> Result<Step, TaskError>;
}

/// A link that drops everything: the tail of a chain whose last operator has no consumer.
pub struct Discard;

impl<T: Send> Operator<T> for Discard {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        batch.clear();
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
    fn snapshot_state(&mut self, _barrier: &Barrier, _snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        Ok(())
    }
    fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), TaskError> {
        Ok(())
    }
}

/// Counts the records operator `operator` of the chain emits into `inner` (the link after it),
/// and keeps the newest watermark it emitted. One atomic add per batch.
pub struct Metered<T> {
    inner: Box<dyn Operator<T>>,
    metrics: Arc<TaskMetrics>,
    operator: usize,
}

impl<T> Metered<T> {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn Operator<T>>, metrics: Arc<TaskMetrics>, operator: usize) -> Metered<T> {
        Metered { inner, metrics, operator }
    }

    #[inline]
    fn count(&self, n: usize) {
        if let Some(operator) = self.metrics.operators.get(self.operator) {
            operator.records_out.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

impl<T: Send> Operator<T> for Metered<T> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        self.count(batch.len());
        self.inner.process_batch(batch)
    }
    fn process_hashed_batch(&mut self, batch: &mut Vec<T>, hashes: &mut Vec<u32>) -> Result<(), TaskError> {
        self.count(batch.len());
        self.inner.process_hashed_batch(batch, hashes)
    }
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<T>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        self.count(batch.len());
        self.inner.process_timestamped_batch(batch, timestamps, hashes)
    }
    fn process_split_batch(&mut self, batch: &mut Vec<T>, splits: SplitInfo<'_>) -> Result<(), TaskError> {
        self.count(batch.len());
        self.inner.process_split_batch(batch, splits)
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        if let Some(operator) = self.metrics.operators.get(self.operator) {
            operator.output_watermark.store(weir_state::event_time_to_timer(watermark), Ordering::Relaxed);
        }
        self.inner.process_watermark(watermark)
    }
    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        self.inner.process_watermark_status(idle)
    }
    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
        self.inner.fire_timers(now_ms)
    }
    fn next_timer(&self) -> Option<u64> {
        self.inner.next_timer()
    }
    fn end_input(&mut self) -> Result<(), TaskError> {
        self.inner.end_input()
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.inner.flush()
    }
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        self.inner.snapshot_state(barrier, snapshot)
    }
    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.inner.notify_checkpoint_complete(checkpoint_id)
    }
}

/// Fans one stream out to several links (each gets a copy of every batch).
pub struct Tee<T> {
    outputs: Vec<Box<dyn Operator<T>>>,
    scratch: Vec<T>,
}

impl<T> Tee<T> {
    /// Sends to every one of `outputs`.
    pub fn new(outputs: Vec<Box<dyn Operator<T>>>) -> Tee<T> {
        Tee { outputs, scratch: Vec::new() }
    }
}

impl<T: Clone + Send> Operator<T> for Tee<T> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        let last = self.outputs.len().saturating_sub(1);
        for (index, output) in self.outputs.iter_mut().enumerate() {
            if index == last {
                output.process_batch(batch)?;
            } else {
                self.scratch.extend(batch.iter().cloned());
                output.process_batch(&mut self.scratch)?;
            }
        }
        batch.clear();
        Ok(())
    }
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<T>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        let last = self.outputs.len().saturating_sub(1);
        for (index, output) in self.outputs.iter_mut().enumerate() {
            if index == last {
                output.process_timestamped_batch(batch, timestamps, &mut Vec::new())?;
            } else {
                self.scratch.extend(batch.iter().cloned());
                let mut copy = timestamps.clone();
                output.process_timestamped_batch(&mut self.scratch, &mut copy, &mut Vec::new())?;
            }
        }
        batch.clear();
        timestamps.clear();
        hashes.clear();
        Ok(())
    }
    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.process_watermark(watermark)?;
        }
        Ok(())
    }
    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.process_watermark_status(idle)?;
        }
        Ok(())
    }
    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.fire_timers(now_ms)?;
        }
        Ok(())
    }
    fn next_timer(&self) -> Option<u64> {
        self.outputs.iter().filter_map(|o| o.next_timer()).min()
    }
    fn end_input(&mut self) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.end_input()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.flush()?;
        }
        Ok(())
    }
    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.snapshot_state(barrier, snapshot)?;
        }
        Ok(())
    }
    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        for output in &mut self.outputs {
            output.notify_checkpoint_complete(checkpoint_id)?;
        }
        Ok(())
    }
}
