//! Joins of two keyed streams: the window join (records of both sides in the same window,
//! Flink's `stream.join(other).where(..).equalTo(..).window(..).apply(..)`) and the interval
//! join (Flink's `keyed.intervalJoin(otherKeyed).between(lower, upper).process(..)`).

use std::time::Duration;

use weir_state::ValueState;
use weir_state::handles::StateData;
use weir_types::Key;

use crate::Data;
use crate::connected::{Either, KeyedCoProcessAdapter, KeyedCoProcessFunction};
use crate::datastream::ConnectedKeyedStreams;
use crate::datastream::{DataStream, KeyedStream};
use crate::functions::{Collector, FnResult, KeyedContext};
use crate::graph::EdgeKind;
use crate::windows::{ProcessLogic, ProcessWindowFunction, WindowAssigner, WindowContext, WindowFunction};

/// Two streams to be joined on equal keys, before the window is chosen.
pub struct JoinedStreams<K, A, B> {
    pub(crate) keyed: ConnectedKeyedStreams<K, A, B>,
}

impl<K: Key, A: Data + StateData, B: Data + StateData> JoinedStreams<K, A, B> {
    /// The window both sides' records must share.
    pub fn window(self, assigner: WindowAssigner) -> WindowedJoin<K, A, B> {
        WindowedJoin { keyed: self.keyed, assigner }
    }
}

/// A window join waiting for its join function.
pub struct WindowedJoin<K, A, B> {
    keyed: ConnectedKeyedStreams<K, A, B>,
    assigner: WindowAssigner,
}

/// Calls the join function for every pair of a window's records with equal keys.
#[derive(Clone)]
struct PairsInWindow<F>(F);

impl<K, A: Clone, B: Clone, O, F> ProcessWindowFunction<K, Either<A, B>, O> for PairsInWindow<F>
where
    F: FnMut(&A, &B) -> O + Clone + Send + 'static,
{
    fn process(
        &mut self,
        _key: &K,
        _context: &WindowContext<'_>,
        elements: &[Either<A, B>],
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        let lefts = elements.iter().filter_map(|e| if let Either::Left(a) = e { Some(a) } else { None });
        for left in lefts {
            for element in elements {
                if let Either::Right(right) = element {
                    out.collect((self.0)(left, right));
                }
            }
        }
        Ok(())
    }
}

/// Calls the co-group function once per key and window with both sides' records.
#[derive(Clone)]
struct CoGroupInWindow<F>(F);

impl<K, A: Clone, B: Clone, O, F> ProcessWindowFunction<K, Either<A, B>, O> for CoGroupInWindow<F>
where
    F: FnMut(&crate::windows::TimeWindow, &[A], &[B], &mut Collector<'_, O>) + Clone + Send + 'static,
{
    fn process(
        &mut self,
        _key: &K,
        context: &WindowContext<'_>,
        elements: &[Either<A, B>],
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        let (mut lefts, mut rights) = (Vec::new(), Vec::new());
        for element in elements {
            match element {
                Either::Left(a) => lefts.push(a.clone()),
                Either::Right(b) => rights.push(b.clone()),
            }
        }
        (self.0)(context.window, &lefts, &rights, out);
        Ok(())
    }
}

impl<K: Key, A: Data + StateData, B: Data + StateData> WindowedJoin<K, A, B> {
    /// Calls `co_group(window, lefts, rights, out)` once per key and window that has records
    /// on either side (Flink's `coGroup`: outer joins and per-group logic).
    pub fn co_group<O: Data, F>(&self, co_group: F) -> DataStream<O>
    where
        F: FnMut(&crate::windows::TimeWindow, &[A], &[B], &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        let function = WindowFunction::new(self.assigner, 0, ProcessLogic(CoGroupInWindow(co_group)));
        self.keyed.process_keyed("Window CoGroup", function, EdgeKind::Hash, self.assigner.validate().err())
    }

    /// Emits `join(a, b)` for every pair of records with equal keys in the same window, when
    /// the window fires (Flink's inner join semantics: a window with one side only emits
    /// nothing).
    pub fn apply<O: Data, F>(&self, join: F) -> DataStream<O>
    where
        F: FnMut(&A, &B) -> O + Clone + Send + Sync + 'static,
    {
        let function = WindowFunction::new(self.assigner, 0, ProcessLogic(PairsInWindow(join)));
        self.keyed.process_keyed("Window Join", function, EdgeKind::Hash, self.assigner.validate().err())
    }
}

/// Flink's `ProcessJoinFunction`: one call per joined pair.
pub trait ProcessJoinFunction<L, R, O>: Clone + Send + 'static {
    /// `left` and `right` have equal keys and `right`'s timestamp is within the bounds of
    /// `left`'s; emit through `out` (the result's timestamp is the later of the two).
    fn process_element(&mut self, left: &L, right: &R, out: &mut Collector<'_, O>) -> FnResult;
}

/// An interval join waiting for its bounds.
pub struct IntervalJoin<K, A, B> {
    pub(crate) keyed: ConnectedKeyedStreams<K, A, B>,
}

impl<K: Key, A: Data + StateData, B: Data + StateData> IntervalJoin<K, A, B> {
    /// Joins a left record at `t` with right records at `t + lower ..= t + upper` (both
    /// inclusive; negative bounds look back).
    pub fn between(self, lower: i64, upper: i64) -> IntervalJoinBounded<K, A, B> {
        IntervalJoinBounded { keyed: self.keyed, lower, upper }
    }
}

/// An interval join with its bounds.
pub struct IntervalJoinBounded<K, A, B> {
    keyed: ConnectedKeyedStreams<K, A, B>,
    lower: i64,
    upper: i64,
}

impl<K: Key, A: Data + StateData, B: Data + StateData> IntervalJoinBounded<K, A, B> {
    /// Runs `join` for every pair within the bounds; each side's records are kept in keyed
    /// state until the watermark passes the last time a partner could come.
    pub fn process<O: Data, F: ProcessJoinFunction<A, B, O>>(&self, join: F) -> DataStream<O> {
        let invalid = (self.lower > self.upper)
            .then(|| format!("interval join: lower bound {} ms is above upper bound {} ms", self.lower, self.upper));
        let function = IntervalJoinFunction::<A, B, F>::new(self.lower, self.upper, join);
        self.keyed.process_keyed("Interval Join", KeyedCoProcessAdapter(function), EdgeKind::Hash, invalid)
    }
}

/// The keyed function behind an interval join: both sides buffered per key with their
/// timestamps.
struct IntervalJoinFunction<A, B, F> {
    lower: i64,
    upper: i64,
    join: F,
    left: ValueState<Vec<(i64, A)>>,
    right: ValueState<Vec<(i64, B)>>,
}

impl<A, B, F: Clone> Clone for IntervalJoinFunction<A, B, F> {
    fn clone(&self) -> Self {
        IntervalJoinFunction {
            lower: self.lower,
            upper: self.upper,
            join: self.join.clone(),
            left: self.left.clone(),
            right: self.right.clone(),
        }
    }
}

impl<A: StateData, B: StateData, F> IntervalJoinFunction<A, B, F> {
    fn new(lower: i64, upper: i64, join: F) -> Self {
        IntervalJoinFunction {
            lower,
            upper,
            join,
            left: ValueState::new("left-buffer"),
            right: ValueState::new("right-buffer"),
        }
    }
}

fn timestamp_of<K: Key>(ctx: &KeyedContext<'_, K>) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    ctx.timestamp().ok_or_else(|| {
        "an interval join needs event timestamps: assign them with assign_timestamps_and_watermarks before the join"
            .into()
    })
}

impl<K: Key, A: StateData, B: StateData, O, F: ProcessJoinFunction<A, B, O>> KeyedCoProcessFunction<K, A, B, O>
    for IntervalJoinFunction<A, B, F>
{
    fn states(&self) -> Vec<weir_state::StateDeclaration> {
        vec![self.left.declaration(), self.right.declaration()]
    }

    fn process_element1(&mut self, value: A, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        let at = timestamp_of(ctx)?;
        if at < ctx.current_watermark() {
            ctx.count_late_record();
            return Ok(());
        }
        if let Some(rights) = ctx.value(&self.right)?.get() {
            for (right_at, right) in rights {
                if at.saturating_add(self.lower) <= *right_at && *right_at <= at.saturating_add(self.upper) {
                    let mut pair = Vec::with_capacity(1);
                    self.join.process_element(&value, right, &mut Collector::new(&mut pair))?;
                    for record in pair {
                        out.collect_with_timestamp(record, at.max(*right_at));
                    }
                }
            }
        }
        ctx.value(&self.left)?.get_or_insert_with(Vec::new).push((at, value));
        // No right record can join it once the watermark passes `at + upper`.
        ctx.register_event_time_timer(at.saturating_add(self.upper));
        Ok(())
    }

    fn process_element2(&mut self, value: B, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        let at = timestamp_of(ctx)?;
        if at < ctx.current_watermark() {
            ctx.count_late_record();
            return Ok(());
        }
        if let Some(lefts) = ctx.value(&self.left)?.get() {
            for (left_at, left) in lefts {
                if left_at.saturating_add(self.lower) <= at && at <= left_at.saturating_add(self.upper) {
                    let mut pair = Vec::with_capacity(1);
                    self.join.process_element(left, &value, &mut Collector::new(&mut pair))?;
                    for record in pair {
                        out.collect_with_timestamp(record, at.max(*left_at));
                    }
                }
            }
        }
        ctx.value(&self.right)?.get_or_insert_with(Vec::new).push((at, value));
        // No left record can join it once the watermark passes `at - lower`.
        ctx.register_event_time_timer(at.saturating_sub(self.lower));
        Ok(())
    }

    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedContext<'_, K>, _out: &mut Collector<'_, O>) -> FnResult {
        let (lower, upper) = (self.lower, self.upper);
        let mut left = ctx.value(&self.left)?;
        let buffer = left.get_or_insert_with(Vec::new);
        buffer.retain(|(at, _)| at.saturating_add(upper) > timestamp);
        if buffer.is_empty() {
            left.clear();
        }
        let mut right = ctx.value(&self.right)?;
        let buffer = right.get_or_insert_with(Vec::new);
        buffer.retain(|(at, _)| at.saturating_sub(lower) > timestamp);
        if buffer.is_empty() {
            right.clear();
        }
        Ok(())
    }
}

impl<A: Data + StateData> DataStream<A> {
    /// This stream joined with `other` on equal keys within windows (then `where_key`,
    /// `equal_to`, `window` and `apply`).
    pub fn join<B: Data + StateData>(&self, other: &DataStream<B>) -> JoinBuilder<A, B> {
        JoinBuilder { left: self.clone(), right: other.clone() }
    }
}

/// A window join before its keys are chosen.
pub struct JoinBuilder<A, B> {
    left: DataStream<A>,
    right: DataStream<B>,
}

impl<A: Data + StateData, B: Data + StateData> JoinBuilder<A, B> {
    /// The key of the left records.
    pub fn where_key<K: Key>(self, key: impl Fn(&A) -> K + Send + Sync + 'static) -> JoinWhere<K, A, B> {
        JoinWhere { builder: self, left_key: std::sync::Arc::new(key) }
    }
}

/// A window join with its left key.
pub struct JoinWhere<K, A, B> {
    builder: JoinBuilder<A, B>,
    left_key: std::sync::Arc<dyn Fn(&A) -> K + Send + Sync>,
}

impl<K: Key, A: Data + StateData, B: Data + StateData> JoinWhere<K, A, B> {
    /// The key of the right records: records join when the keys are equal.
    pub fn equal_to(self, key: impl Fn(&B) -> K + Send + Sync + 'static) -> JoinedStreams<K, A, B> {
        let left_key = self.left_key;
        let keyed = self.builder.left.connect(&self.builder.right).key_by(move |a: &A| left_key(a), key);
        JoinedStreams { keyed }
    }
}

impl<K: Key, A: Data + StateData> KeyedStream<K, A> {
    /// This keyed stream joined with `other` by timestamps within bounds (then `between` and
    /// `process`).
    pub fn interval_join<B: Data + StateData>(&self, other: &KeyedStream<K, B>) -> IntervalJoin<K, A, B> {
        IntervalJoin { keyed: self.connect(other) }
    }
}

/// A time bound in the unit of `between` (ms), from a `Duration`.
pub fn bound_ms(duration: Duration) -> i64 {
    duration.as_millis().min(i64::MAX as u128) as i64
}
