//! Runs a [`KeyedProcessFunction`] with per-key-group state and processing-time timers.

use std::marker::PhantomData;
use std::sync::Arc;

use weir_state::{
    EVENT_TIMERS_STATE, KeySlot, KeyedStateBackend, TIMERS_STATE, event_time_to_timer, timer_to_event_time,
};
use weir_types::{Key, compute_key_group_range_for_operator_index};

use crate::error::TaskError;
use crate::functions::{Collector, EndOfInputContext, KeyedContext, KeyedProcessFunction, TimeDomain, TimeState};
use crate::operator::{Clock, NO_TIMESTAMP, Operator, TaskContext};
use crate::snapshot::{Barrier, BarrierKind, OperatorSnapshotData, RestoredOperator, TaskSnapshot};

/// How many records ahead of the one processed a keyed operator prefetches state: enough
/// for a cache miss (about 100 ns) to complete behind the records between.
const PREFETCH_AHEAD: usize = 8;

/// Extracts the key of a record.
pub type KeySelector<T, K> = Arc<dyn Fn(&T) -> K + Send + Sync>;

/// The operator behind `key_by(..).process(..)`.
pub struct KeyedProcessOperator<K, I, O, F> {
    name: String,
    uid: String,
    func: F,
    key_selector: KeySelector<I, K>,
    backend: KeyedStateBackend<K>,
    time: TimeState<K>,
    clock: Arc<dyn Clock>,
    out: Vec<O>,
    /// The output's timestamps: empty, or one per record of `out`.
    out_timestamps: Vec<i64>,
    side: crate::side_output::SideOutputs,
    metrics: Arc<crate::operator::TaskMetrics>,
    next: Box<dyn Operator<O>>,
    /// Restored as finished: its end-of-input results were emitted before the snapshot.
    finished_on_restore: bool,
    /// Restored operator state (broadcast state), handed to the function once.
    restored_operator_states: std::collections::HashMap<String, Vec<Vec<u8>>>,
    subtask: (u32, u32),
    _input: PhantomData<fn(I)>,
}

impl<K: Key, I, O, F> KeyedProcessOperator<K, I, O, F> {
    /// `func` over the key groups of subtask `ctx.subtask_index`, output into `next`.
    pub fn new(ctx: &TaskContext, func: F, key_selector: KeySelector<I, K>, next: Box<dyn Operator<O>>) -> Self {
        let range = compute_key_group_range_for_operator_index(ctx.max_parallelism, ctx.parallelism, ctx.subtask_index);
        KeyedProcessOperator {
            name: ctx.operator_name.clone(),
            uid: ctx.operator_uid.clone(),
            func,
            key_selector,
            backend: match &ctx.spill {
                Some(options) => KeyedStateBackend::new(range, ctx.max_parallelism).with_spill(options.clone()),
                None => KeyedStateBackend::new(range, ctx.max_parallelism),
            }
            .tracking_changes(ctx.incremental),
            time: TimeState::new(),
            clock: Arc::clone(&ctx.clock),
            out: Vec::new(),
            out_timestamps: Vec::new(),
            side: crate::side_output::SideOutputs::take(ctx),
            metrics: Arc::clone(&ctx.metrics),
            next,
            finished_on_restore: false,
            restored_operator_states: Default::default(),
            subtask: (ctx.subtask_index, ctx.parallelism),
            _input: PhantomData,
        }
    }

    /// The operator's keyed state (snapshots, tests).
    pub fn backend(&self) -> &KeyedStateBackend<K> {
        &self.backend
    }

    /// Loads restored keyed state (before the first record).
    pub fn restore(&mut self, restored: &RestoredOperator) -> Result<(), TaskError> {
        self.finished_on_restore = restored.finished;
        self.restored_operator_states = restored.operator_states.clone();
        if restored.keyed.is_empty() && restored.key_type.is_none() {
            return Ok(());
        }
        let key_type = restored.key_type.clone().unwrap_or_default();
        let mut tables = Vec::with_capacity(restored.keyed.len());
        for table in &restored.keyed {
            if table.name == TIMERS_STATE || table.name == EVENT_TIMERS_STATE {
                let timers = if table.name == TIMERS_STATE { &mut self.time.processing } else { &mut self.time.event };
                timers.restore(table).map_err(|e| {
                    TaskError::user(&self.name, format!("cannot restore the timers of operator '{}': {e}", self.uid))
                })?;
            } else {
                tables.push(table.clone());
            }
        }
        self.backend
            .restore(&key_type, tables)
            .map_err(|e| TaskError::user(&self.name, format!("cannot restore operator '{}': {e}", self.uid)))
    }

    fn user_error(&self, error: impl std::fmt::Display) -> TaskError {
        TaskError::user(&self.name, error)
    }
}

impl<K, I, O, F> KeyedProcessOperator<K, I, O, F>
where
    K: Key,
    I: Send,
    O: Send,
    F: KeyedProcessFunction<K, I, O>,
{
    /// Binds the backend to the states the function declares, checking restored state
    /// against them now (call after [`Self::restore`], before the first record).
    pub fn declare_states(&mut self) -> Result<(), TaskError> {
        let restored = std::mem::take(&mut self.restored_operator_states);
        let mut state = crate::functions::OperatorStateContext::restoring(restored, self.subtask.0, self.subtask.1);
        if let Err(e) = self.func.initialize_operator_state(&mut state) {
            return Err(TaskError::user(&self.name, format!("initializing operator state of '{}': {e}", self.uid)));
        }
        let declarations = self.func.states();
        self.backend
            .declare(declarations)
            .map_err(|e| TaskError::user(&self.name, format!("cannot restore operator '{}': {e}", self.uid)))
    }

    /// Prefetches the state of the first records of a batch whose key hashes came with it
    /// (the loop over the batch prefetches [`PREFETCH_AHEAD`] records ahead from there on):
    /// the ring of the slots in flight, record `i`'s at `i % PREFETCH_AHEAD`.
    #[inline]
    fn prefetch_first(&self, hashes: &[u32]) -> [Option<KeySlot>; PREFETCH_AHEAD] {
        let mut slots = [None; PREFETCH_AHEAD];
        for (slot, &hash) in slots.iter_mut().zip(hashes) {
            *slot = self.backend.prefetch(hash);
        }
        slots
    }

    /// Takes record `index`'s slot out of the ring and prefetches the record
    /// [`PREFETCH_AHEAD`] after it into its place.
    #[inline]
    fn next_slot(
        &self,
        slots: &mut [Option<KeySlot>; PREFETCH_AHEAD],
        hashes: &[u32],
        index: usize,
    ) -> Option<KeySlot> {
        let ring = index % PREFETCH_AHEAD;
        let slot = slots[ring];
        slots[ring] = hashes.get(index + PREFETCH_AHEAD).and_then(|&ahead| self.backend.prefetch(ahead));
        slot
    }

    /// Processes a keyed record: its key's place found by its prefetch (`slot`), or from
    /// its stable hash.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn process_one(
        &mut self,
        record: I,
        key: &K,
        stable_hash: u32,
        slot: Option<KeySlot>,
        now_ms: u64,
        timestamp: Option<i64>,
        plain: bool,
    ) -> Result<(), TaskError> {
        let located = match slot {
            Some(slot) => self.backend.locate_at(key, slot),
            None => match self.backend.locate_hashed(key, stable_hash) {
                Ok(located) => located,
                Err(e) => {
                    return Err(TaskError::Internal(format!("{}: record routed to the wrong subtask: {e}", self.name)));
                }
            },
        };
        // Plain: no timestamps, no side outputs (the time state's timestamp is None then).
        if !plain {
            self.time.timestamp = timestamp;
        }
        let mut ctx = KeyedContext { backend: &mut self.backend, time: &mut self.time, key: located, now_ms };
        let mut out = if plain {
            Collector::new(&mut self.out)
        } else {
            output(&mut self.out, &mut self.out_timestamps, timestamp, &mut self.side)
        };
        match self.func.process_element(record, &mut ctx, &mut out) {
            Ok(()) => Ok(()),
            Err(e) => Err(TaskError::user(&self.name, e)),
        }
    }

    /// The copy of the keyed state at `barrier`, timers included (they are keyed state too:
    /// restored with their keys' groups after a rescale).
    fn snapshot_keyed(&mut self, barrier: &Barrier) -> Result<weir_state::KeyedBackendSnapshot, TaskError> {
        let native = barrier.kind.format() == crate::snapshot::SnapshotFormat::Native;
        let mut keyed = self
            .backend
            .snapshot_in(native, barrier.checkpoint_id)
            .map_err(|e| TaskError::external(format!("{}: snapshotting keyed state", self.name), e))?;
        for timers in [&self.time.processing, &self.time.event] {
            if !timers.is_empty() {
                keyed.tables.push(Box::new(timers.snapshot(keyed.range, self.backend.max_parallelism())));
            }
        }
        Ok(keyed)
    }

    fn emit(&mut self) -> Result<(), TaskError> {
        if self.time.late_records > 0 {
            self.metrics
                .records_late
                .fetch_add(std::mem::take(&mut self.time.late_records), std::sync::atomic::Ordering::Relaxed);
            self.metrics
                .records_late_dropped
                .fetch_add(std::mem::take(&mut self.time.late_dropped), std::sync::atomic::Ordering::Relaxed);
        }
        self.side.emit()?;
        if self.out.is_empty() {
            return Ok(());
        }
        if self.out_timestamps.is_empty() {
            return self.next.process_batch(&mut self.out);
        }
        self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())
    }

    /// True when this batch's output needs no timestamp column and no side output: the
    /// cheapest collector does (checked once per batch).
    fn plain(&self) -> bool {
        self.out_timestamps.is_empty() && self.side.is_empty()
    }

    fn process_unkeyed(&mut self, record: I, timestamp: Option<i64>) -> Result<(), TaskError> {
        let mut out = output(&mut self.out, &mut self.out_timestamps, timestamp, &mut self.side);
        self.func.process_unkeyed(record, &mut out).map_err(|e| TaskError::user(&self.name, e))
    }

    /// Fires the timers of `domain` due at `due` (a timer timestamp).
    fn fire(&mut self, domain: TimeDomain, due: u64, now_ms: u64) -> Result<(), TaskError> {
        loop {
            let timers = match domain {
                TimeDomain::ProcessingTime => &mut self.time.processing,
                TimeDomain::EventTime => &mut self.time.event,
            };
            let Some((timer, key)) = timers.pop_due(due) else { break };
            // Timers fire in key order unrelated to the state's layout: each is a cache miss
            // unless the state of a later one is on its way.
            if let Some(ahead) = timers.upcoming(PREFETCH_AHEAD) {
                self.backend.prefetch(ahead.stable_hash());
            }
            let located = match self.backend.locate(&key) {
                Ok(located) => located,
                Err(e) => return Err(self.user_error(e)),
            };
            // An event-time timer's output carries its time; a processing-time one's none.
            let (timestamp, fired_at) = match domain {
                TimeDomain::EventTime => (Some(timer_to_event_time(timer)), timer_to_event_time(timer)),
                TimeDomain::ProcessingTime => (None, timer as i64),
            };
            self.time.timestamp = timestamp;
            self.time.domain = Some(domain);
            let mut ctx = KeyedContext { backend: &mut self.backend, time: &mut self.time, key: located, now_ms };
            let mut out = output(&mut self.out, &mut self.out_timestamps, timestamp, &mut self.side);
            let result = self.func.on_timer(fired_at, &mut ctx, &mut out);
            self.time.domain = None;
            self.time.timestamp = None;
            if let Err(e) = result {
                return Err(TaskError::user(&self.name, e));
            }
        }
        self.emit()
    }
}

/// A collector into `out` (and `side`), keeping `timestamps` one per record once any record
/// has one.
#[inline]
fn output<'a, O>(
    out: &'a mut Vec<O>,
    timestamps: &'a mut Vec<i64>,
    timestamp: Option<i64>,
    side: &'a mut crate::side_output::SideOutputs,
) -> Collector<'a, O> {
    let collector = match timestamp {
        None if timestamps.is_empty() => Collector::new(out),
        Some(timestamp) => {
            timestamps.resize(out.len(), NO_TIMESTAMP);
            Collector::timestamped(out, timestamps, timestamp)
        }
        None => Collector::timestamped(out, timestamps, NO_TIMESTAMP),
    };
    collector.with_side(side)
}

impl<K, I, O, F> Operator<I> for KeyedProcessOperator<K, I, O, F>
where
    K: Key,
    I: Send,
    O: Send,
    F: KeyedProcessFunction<K, I, O>,
{
    fn process_batch(&mut self, batch: &mut Vec<I>) -> Result<(), TaskError> {
        // One clock read per batch: processing time is coarse anyway.
        let now_ms = self.clock.now_ms();
        let plain = self.plain();
        for record in batch.drain(..) {
            if !self.func.is_keyed(&record) {
                self.process_unkeyed(record, None)?;
                continue;
            }
            let key = (self.key_selector)(&record);
            let stable_hash = key.stable_hash();
            self.process_one(record, &key, stable_hash, None, now_ms, None, plain)?;
        }
        self.emit()
    }

    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<I>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        if batch.len() != timestamps.len() || (!hashes.is_empty() && hashes.len() != batch.len()) {
            return Err(TaskError::Internal(format!(
                "{}: {} records arrived with {} timestamps and {} key hashes",
                self.name,
                batch.len(),
                timestamps.len(),
                hashes.len()
            )));
        }
        let now_ms = self.clock.now_ms();
        let hashed = !hashes.is_empty();
        let mut slots = self.prefetch_first(hashes);
        for (index, (record, timestamp)) in batch.drain(..).zip(timestamps.drain(..)).enumerate() {
            let slot = self.next_slot(&mut slots, hashes, index);
            let timestamp_of = (timestamp != NO_TIMESTAMP).then_some(timestamp);
            if !self.func.is_keyed(&record) {
                self.process_unkeyed(record, timestamp_of)?;
                continue;
            }
            let key = (self.key_selector)(&record);
            let stable_hash = if hashed { hashes[index] } else { key.stable_hash() };
            self.process_one(record, &key, stable_hash, slot, now_ms, timestamp_of, false)?;
        }
        self.time.timestamp = None;
        hashes.clear();
        self.emit()
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        if watermark <= self.time.watermark {
            return Ok(());
        }
        self.time.watermark = watermark;
        let now_ms = self.clock.now_ms();
        self.fire(TimeDomain::EventTime, event_time_to_timer(watermark), now_ms)?;
        self.side.process_watermark(watermark)?;
        self.next.process_watermark(watermark)
    }

    fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
        self.side.process_watermark_status(idle)?;
        self.next.process_watermark_status(idle)
    }

    fn process_hashed_batch(&mut self, batch: &mut Vec<I>, hashes: &mut Vec<u32>) -> Result<(), TaskError> {
        if batch.len() != hashes.len() {
            return Err(TaskError::Internal(format!(
                "{}: {} records arrived with {} key hashes",
                self.name,
                batch.len(),
                hashes.len()
            )));
        }
        let now_ms = self.clock.now_ms();
        let plain = self.plain();
        let mut slots = self.prefetch_first(hashes);
        for (index, record) in batch.drain(..).enumerate() {
            let slot = self.next_slot(&mut slots, hashes, index);
            let stable_hash = hashes[index];
            let key = (self.key_selector)(&record);
            // Paired check: the partitioner hashed the same key with the same function.
            debug_assert_eq!(key.stable_hash(), stable_hash);
            self.process_one(record, &key, stable_hash, slot, now_ms, None, plain)?;
        }
        hashes.clear();
        self.emit()
    }

    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
        self.fire(TimeDomain::ProcessingTime, now_ms, now_ms)?;
        self.next.fire_timers(now_ms)
    }

    fn next_timer(&self) -> Option<u64> {
        match (self.time.processing.next_deadline(), self.next.next_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn end_input(&mut self) -> Result<(), TaskError> {
        if self.finished_on_restore {
            // Its end-of-input results went downstream before the snapshot it restored.
            self.side.end_input()?;
            return self.next.end_input();
        }
        let mut ctx = EndOfInputContext { backend: &mut self.backend };
        let mut out = output(&mut self.out, &mut self.out_timestamps, None, &mut self.side);
        if let Err(e) = self.func.on_end_of_input(&mut ctx, &mut out) {
            return Err(TaskError::user(&self.name, e));
        }
        self.emit()?;
        self.side.end_input()?;
        self.next.end_input()
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        self.side.flush()?;
        self.next.flush()
    }

    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        self.side.snapshot_state(barrier, snapshot)?;
        let keyed = if snapshot.finished && matches!(barrier.kind, BarrierKind::Checkpoint { .. }) {
            // A finished subtask restores finished and runs nothing again, so nothing reads
            // its keyed state: a checkpoint leaves it out (Flink's finished operators,
            // FLIP-147), the final checkpoint of a bounded job most of all. A savepoint
            // keeps it.
            None
        } else {
            Some(self.snapshot_keyed(barrier)?)
        };
        let mut state = crate::functions::OperatorStateContext::snapshotting();
        if let Err(e) = self.func.snapshot_operator_state(&mut state) {
            return Err(TaskError::user(&self.name, format!("snapshotting operator state: {e}")));
        }
        snapshot.operators.push(OperatorSnapshotData {
            uid: self.uid.clone(),
            keyed,
            operator_states: state.into_states(),
        });
        self.next.snapshot_state(barrier, snapshot)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.next.notify_checkpoint_complete(checkpoint_id)
    }
}
