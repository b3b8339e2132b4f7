//! Streams with more than one input: `union`, `connect` with co-process functions (keyed or
//! not), and the broadcast state pattern.
//!
//! A connected stream is a union in disguise: each side is mapped into [`Either`] right where
//! it is produced (chained, no extra hop), and the operator reading both is an ordinary
//! one-input operator over `Either<A, B>` whose input channels come from both sides. So
//! barriers align across every channel of both inputs, the watermark is the minimum over all
//! of them, and state is snapshotted, restored and rescaled as for any operator.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_state::StateDeclaration;
use weir_state::handles::StateData;
use weir_types::Key;

use crate::functions::{
    Collector, EndOfInputContext, FnResult, KeyedContext, KeyedProcessFunction, OperatorStateContext, ProcessFunction,
};

/// A record of one of two connected inputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Either<A, B> {
    /// From the first input.
    Left(A),
    /// From the second input.
    Right(B),
}

/// Flink's `CoProcessFunction`: one function over two inputs, with operator state.
pub trait CoProcessFunction<I1, I2, O>: Clone + Send + 'static {
    /// Called once per subtask before the first record, with the restored state if any.
    fn initialize_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }
    /// A record of the first input.
    fn process_element1(&mut self, value: I1, out: &mut Collector<'_, O>) -> FnResult;
    /// A record of the second input.
    fn process_element2(&mut self, value: I2, out: &mut Collector<'_, O>) -> FnResult;
    /// Writes the function's state at a checkpoint barrier.
    fn snapshot_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        Ok(())
    }
    /// Both inputs ended.
    fn on_end_of_input(&mut self, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }
}

/// Flink's `KeyedCoProcessFunction`: two inputs keyed alike, one key's state and timers.
pub trait KeyedCoProcessFunction<K, I1, I2, O>: Clone + Send + 'static {
    /// The keyed states the function uses (as [`KeyedProcessFunction::states`]).
    fn states(&self) -> Vec<StateDeclaration> {
        Vec::new()
    }
    /// A record of the first input, with its key's context.
    fn process_element1(&mut self, value: I1, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult;
    /// A record of the second input, with its key's context.
    fn process_element2(&mut self, value: I2, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult;
    /// A timer of the current key fired (`ctx.time_domain()` says which clock).
    fn on_timer(&mut self, _timestamp: i64, _ctx: &mut KeyedContext<'_, K>, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }
    /// Both inputs ended.
    fn on_end_of_input(&mut self, _ctx: &mut EndOfInputContext<'_, K>, _out: &mut Collector<'_, O>) -> FnResult {
        Ok(())
    }
}

/// Runs a [`CoProcessFunction`] as a process function over `Either`.
#[derive(Clone)]
pub(crate) struct CoProcessAdapter<F>(pub(crate) F);

impl<I1, I2, O, F: CoProcessFunction<I1, I2, O>> ProcessFunction<Either<I1, I2>, O> for CoProcessAdapter<F> {
    fn initialize_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.0.initialize_state(state)
    }
    fn process_element(&mut self, record: Either<I1, I2>, out: &mut Collector<'_, O>) -> FnResult {
        match record {
            Either::Left(value) => self.0.process_element1(value, out),
            Either::Right(value) => self.0.process_element2(value, out),
        }
    }
    fn snapshot_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.0.snapshot_state(state)
    }
    fn on_end_of_input(&mut self, out: &mut Collector<'_, O>) -> FnResult {
        self.0.on_end_of_input(out)
    }
}

/// Runs a [`KeyedCoProcessFunction`] as a keyed process function over `Either`.
#[derive(Clone)]
pub(crate) struct KeyedCoProcessAdapter<F>(pub(crate) F);

impl<K: Key, I1, I2, O, F: KeyedCoProcessFunction<K, I1, I2, O>> KeyedProcessFunction<K, Either<I1, I2>, O>
    for KeyedCoProcessAdapter<F>
{
    fn states(&self) -> Vec<StateDeclaration> {
        self.0.states()
    }
    fn process_element(
        &mut self,
        record: Either<I1, I2>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        match record {
            Either::Left(value) => self.0.process_element1(value, ctx, out),
            Either::Right(value) => self.0.process_element2(value, ctx, out),
        }
    }
    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        self.0.on_timer(timestamp, ctx, out)
    }
    fn on_end_of_input(&mut self, ctx: &mut EndOfInputContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        self.0.on_end_of_input(ctx, out)
    }
}

/// The broadcast state of one operator: the same map in every subtask, built from the
/// broadcast input (Flink's `BroadcastState` of a `MapStateDescriptor`). On restore at any
/// parallelism every subtask gets subtask 0's copy.
#[derive(Clone, Debug)]
pub struct BroadcastState<K, V> {
    name: &'static str,
    entries: BTreeMap<K, V>,
}

impl<K: Ord, V> BroadcastState<K, V> {
    /// An empty state named `name` (its name in snapshots).
    pub fn new(name: &'static str) -> Self {
        BroadcastState { name, entries: BTreeMap::new() }
    }
    /// The value of `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key)
    }
    /// Sets `key` (only the broadcast side may write).
    pub fn put(&mut self, key: K, value: V) {
        self.entries.insert(key, value);
    }
    /// Removes `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key)
    }
    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter()
    }
    /// True when the state holds `key`.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<K: StateData + Ord, V: StateData> BroadcastState<K, V> {
    fn restore(&mut self, state: &OperatorStateContext) -> FnResult {
        let entries: Vec<(K, V)> = state.restored(self.name)?;
        self.entries = entries.into_iter().collect();
        Ok(())
    }

    fn snapshot(&self, state: &mut OperatorStateContext) -> FnResult {
        let entries: Vec<(K, V)> = self.entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        state.set_broadcast_state(self.name, &entries)
    }
}

/// Flink's `BroadcastProcessFunction`: a stream read against a broadcast state that the other,
/// broadcast stream writes.
pub trait BroadcastProcessFunction<I1, I2, BK, BV, O>: Clone + Send + 'static {
    /// A record of the non-broadcast input; the broadcast state is read-only here.
    fn process_element(&mut self, value: I1, state: &BroadcastState<BK, BV>, out: &mut Collector<'_, O>) -> FnResult;
    /// A record of the broadcast input (every subtask sees every one); update the state here.
    fn process_broadcast_element(
        &mut self,
        value: I2,
        state: &mut BroadcastState<BK, BV>,
        out: &mut Collector<'_, O>,
    ) -> FnResult;
}

/// Flink's `KeyedBroadcastProcessFunction`: as [`BroadcastProcessFunction`] with the keyed
/// side's state and timers.
pub trait KeyedBroadcastProcessFunction<K, I1, I2, BK, BV, O>: Clone + Send + 'static {
    /// The keyed states the function uses.
    fn states(&self) -> Vec<StateDeclaration> {
        Vec::new()
    }
    /// A record of the keyed input, with its key's context; the broadcast state is read-only.
    fn process_element(
        &mut self,
        value: I1,
        ctx: &mut KeyedContext<'_, K>,
        state: &BroadcastState<BK, BV>,
        out: &mut Collector<'_, O>,
    ) -> FnResult;
    /// A record of the broadcast input (no current key).
    fn process_broadcast_element(
        &mut self,
        value: I2,
        state: &mut BroadcastState<BK, BV>,
        out: &mut Collector<'_, O>,
    ) -> FnResult;
    /// A timer of the current key fired.
    fn on_timer(
        &mut self,
        _timestamp: i64,
        _ctx: &mut KeyedContext<'_, K>,
        _state: &BroadcastState<BK, BV>,
        _out: &mut Collector<'_, O>,
    ) -> FnResult {
        Ok(())
    }
}

/// Runs a [`BroadcastProcessFunction`] as a process function over `Either`.
pub(crate) struct BroadcastAdapter<F, BK, BV> {
    pub(crate) function: F,
    pub(crate) state: BroadcastState<BK, BV>,
}

impl<F: Clone, BK: Clone, BV: Clone> Clone for BroadcastAdapter<F, BK, BV> {
    fn clone(&self) -> Self {
        BroadcastAdapter { function: self.function.clone(), state: self.state.clone() }
    }
}

impl<I1, I2, BK, BV, O, F> ProcessFunction<Either<I1, I2>, O> for BroadcastAdapter<F, BK, BV>
where
    BK: StateData + Ord,
    BV: StateData,
    F: BroadcastProcessFunction<I1, I2, BK, BV, O>,
{
    fn initialize_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.state.restore(state)
    }
    fn process_element(&mut self, record: Either<I1, I2>, out: &mut Collector<'_, O>) -> FnResult {
        match record {
            Either::Left(value) => self.function.process_element(value, &self.state, out),
            Either::Right(value) => self.function.process_broadcast_element(value, &mut self.state, out),
        }
    }
    fn snapshot_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.state.snapshot(state)
    }
}

/// Runs a [`KeyedBroadcastProcessFunction`] as a keyed process function over `Either`: the
/// broadcast side has no key and goes to [`KeyedProcessFunction::process_unkeyed`].
pub(crate) struct KeyedBroadcastAdapter<F, BK, BV> {
    pub(crate) function: F,
    pub(crate) state: BroadcastState<BK, BV>,
}

impl<F: Clone, BK: Clone, BV: Clone> Clone for KeyedBroadcastAdapter<F, BK, BV> {
    fn clone(&self) -> Self {
        KeyedBroadcastAdapter { function: self.function.clone(), state: self.state.clone() }
    }
}

impl<K, I1, I2, BK, BV, O, F> KeyedProcessFunction<K, Either<I1, I2>, O> for KeyedBroadcastAdapter<F, BK, BV>
where
    K: Key,
    BK: StateData + Ord,
    BV: StateData,
    F: KeyedBroadcastProcessFunction<K, I1, I2, BK, BV, O>,
{
    fn states(&self) -> Vec<StateDeclaration> {
        self.function.states()
    }
    fn is_keyed(&self, record: &Either<I1, I2>) -> bool {
        matches!(record, Either::Left(_))
    }
    fn process_element(
        &mut self,
        record: Either<I1, I2>,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        match record {
            Either::Left(value) => self.function.process_element(value, ctx, &self.state, out),
            Either::Right(value) => self.function.process_broadcast_element(value, &mut self.state, out),
        }
    }
    fn process_unkeyed(&mut self, record: Either<I1, I2>, out: &mut Collector<'_, O>) -> FnResult {
        match record {
            Either::Right(value) => self.function.process_broadcast_element(value, &mut self.state, out),
            Either::Left(_) => Err("a keyed record reached the broadcast side".into()),
        }
    }
    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        self.function.on_timer(timestamp, ctx, &self.state, out)
    }
    fn initialize_operator_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.state.restore(state)
    }
    fn snapshot_operator_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.state.snapshot(state)
    }
}
