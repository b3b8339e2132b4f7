//! User functions and the contexts they see.

use weir_state::handles::{ListAccess, MapAccess, ReducingAccess, StateData, ValueAccess};
use weir_state::{
    KeyRef, KeyedStateBackend, ListState, MapState, ReducingState, StateDeclaration, StateError, TimerService,
    ValueState,
};
use weir_types::Key;

/// What a user function returns: any error type converts with `?`, and a string works too
/// (`Err("bad record".into())`). An error fails the job (or triggers a restart).
pub type FnResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Where a function puts its output records.
pub struct Collector<'a, O> {
    pub(crate) buffer: &'a mut Vec<O>,
    /// When the output carries event timestamps: their column, and the timestamp every
    /// record collected now gets (the input record's, or the firing timer's).
    pub(crate) timestamps: Option<(&'a mut Vec<i64>, i64)>,
    /// The operator's side outputs, when any is read.
    pub(crate) side: Option<&'a mut crate::side_output::SideOutputs>,
}

impl<'a, O> Collector<'a, O> {
    pub(crate) fn new(buffer: &'a mut Vec<O>) -> Self {
        Collector { buffer, timestamps: None, side: None }
    }

    pub(crate) fn timestamped(buffer: &'a mut Vec<O>, timestamps: &'a mut Vec<i64>, timestamp: i64) -> Self {
        Collector { buffer, timestamps: Some((timestamps, timestamp)), side: None }
    }

    /// The same collector, also feeding `side` outputs (when any is read).
    pub(crate) fn with_side(mut self, side: &'a mut crate::side_output::SideOutputs) -> Self {
        if !side.is_empty() {
            self.side = Some(side);
        }
        self
    }

    /// The same collector (and side outputs), giving what it collects event timestamp
    /// `timestamp` instead of the current one: a window that fires while a record is processed
    /// emits at its last millisecond, as Flink's `TimestampedCollector` does. On a stream
    /// without timestamps the records stay without one.
    pub(crate) fn at_timestamp(&mut self, timestamp: i64) -> Collector<'_, O> {
        Collector {
            buffer: &mut *self.buffer,
            timestamps: self.timestamps.as_mut().map(|(column, _)| (&mut **column, timestamp)),
            side: self.side.as_deref_mut(),
        }
    }

    /// Emits `value` to side output `tag` (with the current record's timestamp); dropped
    /// when no `get_side_output(&tag)` reads it, as in Flink.
    pub fn output<S: 'static>(&mut self, tag: &crate::side_output::OutputTag<S>, value: S) -> FnResult {
        let timestamp = self.timestamps.as_ref().map_or(crate::side_output::SIDE_NO_TIMESTAMP, |(_, t)| *t);
        match &mut self.side {
            Some(side) => side.push(tag, value, timestamp).map_err(Into::into),
            None => Ok(()),
        }
    }

    /// Emits one record.
    #[inline]
    pub fn collect(&mut self, record: O) {
        self.buffer.push(record);
        if let Some((timestamps, timestamp)) = &mut self.timestamps {
            timestamps.push(*timestamp);
        }
    }

    /// Emits one record with event timestamp `timestamp` instead of the current one (a join's
    /// result gets the later of its two inputs' timestamps). On a stream without timestamps
    /// the record is emitted without one.
    pub fn collect_with_timestamp(&mut self, record: O, timestamp: i64) {
        self.buffer.push(record);
        if let Some((timestamps, _)) = &mut self.timestamps {
            timestamps.push(timestamp);
        }
    }
}

/// Which clock a timer belongs to (Flink's `TimeDomain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeDomain {
    /// Event time: the timer fired because the watermark passed it.
    EventTime,
    /// Processing time: the timer fired because the wall clock passed it.
    ProcessingTime,
}

/// A keyed operator's clocks: its timers of both domains, its watermark, and what the call
/// being made knows about time (kept in one place so a call's context is small).
pub(crate) struct TimeState<K> {
    pub(crate) processing: TimerService<K>,
    pub(crate) event: TimerService<K>,
    /// The input watermark as passed on last.
    pub(crate) watermark: i64,
    /// Late records so far, dropped or sent to a late-data side output (the operator
    /// publishes them as a metric).
    pub(crate) late_records: u64,
    /// Of `late_records`, those dropped (Flink's `numLateRecordsDropped`).
    pub(crate) late_dropped: u64,
    /// The event timestamp of the record (or event-time timer) being processed.
    pub(crate) timestamp: Option<i64>,
    /// Set while a timer fires.
    pub(crate) domain: Option<TimeDomain>,
}

impl<K: Eq + std::hash::Hash + Clone> TimeState<K> {
    pub(crate) fn new() -> Self {
        TimeState {
            processing: TimerService::default(),
            event: TimerService::named(weir_state::EVENT_TIMERS_STATE),
            watermark: crate::operator::MIN_WATERMARK,
            late_records: 0,
            late_dropped: 0,
            timestamp: None,
            domain: None,
        }
    }
}

/// The current key's state and timers, given to [`KeyedProcessFunction`] calls.
pub struct KeyedContext<'a, K> {
    pub(crate) backend: &'a mut KeyedStateBackend<K>,
    pub(crate) time: &'a mut TimeState<K>,
    pub(crate) key: KeyRef<'a, K>,
    pub(crate) now_ms: u64,
}

impl<K: Key> KeyedContext<'_, K> {
    /// The key of the record (or timer) being processed.
    pub fn current_key(&self) -> &K {
        self.key.key
    }

    /// The current key's value state.
    #[inline]
    pub fn value<V: StateData>(&mut self, state: &ValueState<V>) -> Result<ValueAccess<'_, K, V>, StateError> {
        self.backend.value(state, self.key)
    }

    /// The current key's list state.
    pub fn list<V: StateData>(&mut self, state: &ListState<V>) -> Result<ListAccess<'_, K, V>, StateError> {
        self.backend.list(state, self.key)
    }

    /// The current key's map state.
    pub fn map<UK: StateData + Eq + std::hash::Hash, UV: StateData>(
        &mut self,
        state: &MapState<UK, UV>,
    ) -> Result<MapAccess<'_, K, UK, UV>, StateError> {
        self.backend.map(state, self.key)
    }

    /// The current key's reducing state.
    pub fn reducing<V: StateData>(&mut self, state: &ReducingState<V>) -> Result<ReducingAccess<'_, K, V>, StateError> {
        self.backend.reducing(state, self.key)
    }

    /// Processing time now, epoch milliseconds.
    pub fn current_processing_time(&self) -> u64 {
        self.now_ms
    }

    /// Calls `on_timer` for the current key when processing time reaches `timestamp_ms`.
    pub fn register_processing_time_timer(&mut self, timestamp_ms: u64) {
        self.time.processing.register(self.key.key, timestamp_ms);
    }

    /// Deletes a timer registered for the current key.
    pub fn delete_processing_time_timer(&mut self, timestamp_ms: u64) {
        self.time.processing.delete(self.key.key, timestamp_ms);
    }

    /// The event timestamp of the record being processed (of the timer, in `on_timer` for an
    /// event-time timer); `None` when the stream has no timestamps (assign them with a
    /// `WatermarkStrategy`).
    pub fn timestamp(&self) -> Option<i64> {
        self.time.timestamp
    }

    /// The operator's current watermark (`i64::MIN` before the first one).
    pub fn current_watermark(&self) -> i64 {
        self.time.watermark
    }

    /// Calls `on_timer` for the current key once the watermark reaches `timestamp`.
    pub fn register_event_time_timer(&mut self, timestamp: i64) {
        self.time.event.register(self.key.key, weir_state::event_time_to_timer(timestamp));
    }

    /// Deletes an event-time timer registered for the current key.
    pub fn delete_event_time_timer(&mut self, timestamp: i64) {
        self.time.event.delete(self.key.key, weir_state::event_time_to_timer(timestamp));
    }

    /// In `on_timer`: which clock fired the timer. `None` outside `on_timer`.
    pub fn time_domain(&self) -> Option<TimeDomain> {
        self.time.domain
    }

    /// Counts a record dropped because it came too late (the subtask's late-records metric,
    /// and Flink's `numLateRecordsDropped`).
    pub fn count_late_record(&mut self) {
        self.time.late_records += 1;
        self.time.late_dropped += 1;
    }

    /// Counts a record that came too late and went to a late-data side output instead of
    /// being dropped (a late record, but not a dropped one).
    pub(crate) fn count_late_record_sent_aside(&mut self) {
        self.time.late_records += 1;
    }
}

/// All keys' state at the end of a bounded input.
pub struct EndOfInputContext<'a, K> {
    pub(crate) backend: &'a mut KeyedStateBackend<K>,
}

impl<K: Key> EndOfInputContext<'_, K> {
    /// Calls `f` with every key that has a value in `state`.
    pub fn for_each_value<V: StateData>(
        &mut self,
        state: &ValueState<V>,
        f: impl FnMut(&K, &V),
    ) -> Result<(), StateError> {
        self.backend.for_each_value(state, f)
    }
}

/// A function over a keyed stream with per-key state and timers (Flink's `KeyedProcessFunction`).
///
/// One instance runs per subtask (cloned from the one given to `process`); the runtime sets
/// the current key before each call, so state handles read and write that key's state.
pub trait KeyedProcessFunction<K, I, O>: Clone + Send + 'static {
    /// The keyed states this function uses, as their handles declare them
    /// (`vec![self.count.declaration()]`): known before the job starts, so a restore is
    /// checked against the snapshot (kind and type of every state) before anything runs,
    /// and `weir run --dry-run` checks it without running anything. Using a state not
    /// listed here is an error. A function without keyed state keeps the default.
    fn states(&self) -> Vec<StateDeclaration> {
        Vec::new()
    }

    /// Handles one record of the current key.
    fn process_element(&mut self, record: I, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult;

    /// A timer of the current key fired: its timestamp (epoch ms for a processing-time timer,
    /// the event time for an event-time one); `ctx.time_domain()` says which.
    fn on_timer(&mut self, _timestamp: i64, _ctx: &mut KeyedContext<'_, K>, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }

    /// A bounded input ended: emit final results for all keys (after the final watermark
    /// fired every event-time timer).
    fn on_end_of_input(&mut self, _ctx: &mut EndOfInputContext<'_, K>, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }

    /// False for records without a key (the broadcast side of a keyed broadcast function):
    /// they go to [`process_unkeyed`](Self::process_unkeyed) instead.
    fn is_keyed(&self, _record: &I) -> bool {
        true
    }

    /// A record without a key (see [`is_keyed`](Self::is_keyed)).
    fn process_unkeyed(&mut self, _record: I, _out: &mut Collector<'_, O>) -> FnResult {
        Err("this keyed function received a record without a key".into())
    }

    /// Operator (non-keyed) state next to the keyed state, read once before the first record
    /// (broadcast state, say).
    fn initialize_operator_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }

    /// Writes that operator state at a checkpoint barrier.
    fn snapshot_operator_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }
}

/// Operator (non-keyed) state of one subtask: named lists of elements, redistributed on
/// restore as Flink does — list state split evenly, union list state given whole to every
/// subtask, broadcast state copied from subtask 0.
pub struct OperatorStateContext {
    restored: std::collections::HashMap<String, Vec<Vec<u8>>>,
    subtask_index: u32,
    parallelism: u32,
    written: Vec<crate::snapshot::OperatorStateData>,
}

impl OperatorStateContext {
    pub(crate) fn restoring(
        restored: std::collections::HashMap<String, Vec<Vec<u8>>>,
        subtask_index: u32,
        parallelism: u32,
    ) -> Self {
        OperatorStateContext { restored, subtask_index, parallelism, written: Vec::new() }
    }

    pub(crate) fn snapshotting() -> Self {
        OperatorStateContext { restored: Default::default(), subtask_index: 0, parallelism: 0, written: Vec::new() }
    }

    pub(crate) fn into_states(self) -> Vec<crate::snapshot::OperatorStateData> {
        self.written
    }

    /// True when the job was restored from a snapshot that had any state of this operator.
    pub fn is_restored(&self) -> bool {
        !self.restored.is_empty()
    }

    /// This subtask's index and the operator's parallelism.
    pub fn subtask(&self) -> (u32, u32) {
        (self.subtask_index, self.parallelism)
    }

    /// The restored elements of state `name` assigned to this subtask (empty when none).
    pub fn restored<T: weir_state::handles::StateData>(
        &self,
        name: &str,
    ) -> Result<Vec<T>, Box<dyn std::error::Error + Send + Sync>> {
        let mut items = Vec::new();
        for bytes in self.restored.get(name).map(Vec::as_slice).unwrap_or(&[]) {
            let item: T = postcard::from_bytes(bytes).map_err(|e| {
                format!("operator state '{name}' cannot be read as {}: {e}", std::any::type_name::<T>())
            })?;
            items.push(item);
        }
        Ok(items)
    }

    fn write<T: weir_state::handles::StateData>(
        &mut self,
        name: &str,
        mode: crate::snapshot::Redistribution,
        items: &[T],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut elements = Vec::with_capacity(items.len());
        for item in items {
            elements.push(postcard::to_allocvec(item).map_err(|e| format!("operator state '{name}': {e}"))?);
        }
        self.written.push(crate::snapshot::OperatorStateData { name: name.to_string(), mode, elements });
        Ok(())
    }

    /// Writes list state `name`: on restore its elements are split evenly over the subtasks.
    pub fn set_list_state<T: weir_state::handles::StateData>(
        &mut self,
        name: &str,
        items: &[T],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.write(name, crate::snapshot::Redistribution::Split, items)
    }

    /// Writes union list state `name`: on restore every subtask gets every element.
    pub fn set_union_list_state<T: weir_state::handles::StateData>(
        &mut self,
        name: &str,
        items: &[T],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.write(name, crate::snapshot::Redistribution::Union, items)
    }

    /// Writes broadcast state `name` (every subtask holds the same copy): on restore every
    /// subtask gets subtask 0's copy.
    pub fn set_broadcast_state<T: weir_state::handles::StateData>(
        &mut self,
        name: &str,
        items: &[T],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.write(name, crate::snapshot::Redistribution::Broadcast, items)
    }
}

/// A non-keyed function with operator state (Flink's `ProcessFunction` +
/// `CheckpointedFunction`): it reads its restored state in `initialize_state` and writes its
/// current state at every checkpoint in `snapshot_state`.
pub trait ProcessFunction<I, O>: Clone + Send + 'static {
    /// Called once per subtask before the first record, with the restored state if any.
    fn initialize_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }

    /// Handles one record.
    fn process_element(&mut self, record: I, out: &mut Collector<'_, O>) -> FnResult;

    /// Writes the function's state at a checkpoint barrier.
    fn snapshot_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }

    /// A bounded input ended.
    fn on_end_of_input(&mut self, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }
}
