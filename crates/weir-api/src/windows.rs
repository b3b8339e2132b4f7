//! Windows on keyed streams, with Flink's semantics: assigners (tumbling, sliding, session,
//! in event or processing time; count windows), window functions (`reduce`, `aggregate`,
//! `process`, and incremental-plus-process), allowed lateness.
//!
//! A window operator is a keyed process function: each key's open windows and their
//! accumulators are one value state (`window-contents`, a short list per key), and a window
//! fires on a timer at its last millisecond (event-time timers for event-time windows). So
//! window state is snapshotted, restored and rescaled by key group like any keyed state.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_state::ValueState;
use weir_state::handles::StateData;
use weir_types::Key;

use crate::functions::{Collector, FnResult, KeyedContext, KeyedProcessFunction, TimeDomain};

/// A window of time `[start, end)` in epoch ms (Flink's `TimeWindow`); count windows use
/// [`TimeWindow::GLOBAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimeWindow {
    /// First millisecond in the window.
    pub start: i64,
    /// First millisecond after it.
    pub end: i64,
}

impl TimeWindow {
    /// The one window of a count window (Flink's `GlobalWindow`).
    pub const GLOBAL: TimeWindow = TimeWindow { start: i64::MIN, end: i64::MAX };

    /// The window `[start, end)`.
    pub fn new(start: i64, end: i64) -> TimeWindow {
        TimeWindow { start, end }
    }

    /// The last millisecond in the window: when it fires.
    pub fn max_timestamp(&self) -> i64 {
        self.end.saturating_sub(1)
    }

    /// True when the windows overlap or touch (sessions merge then).
    pub fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// The smallest window that covers both.
    pub fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// The start of the window of `size` (with `offset`) that holds `timestamp` (Flink's
/// `TimeWindow.getWindowStartWithOffset`).
pub fn window_start(timestamp: i64, offset: i64, size: i64) -> i64 {
    let remainder = (timestamp - offset + size).rem_euclid(size);
    timestamp - remainder
}

/// Which windows a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed, non-overlapping windows of `size`, shifted by `offset`.
    Tumbling {
        /// Window length, ms.
        size: i64,
        /// Shift of the window starts, ms.
        offset: i64,
        /// Event time (true) or processing time.
        event_time: bool,
    },
    /// Windows of `size` starting every `slide`.
    Sliding {
        /// Window length, ms.
        size: i64,
        /// Distance between window starts, ms.
        slide: i64,
        /// Shift of the window starts, ms.
        offset: i64,
        /// Event time (true) or processing time.
        event_time: bool,
    },
    /// Sessions: a record opens `[t, t + gap)`, and overlapping windows merge.
    Session {
        /// Inactivity that closes a session, ms.
        gap: i64,
        /// Event time (true) or processing time.
        event_time: bool,
    },
    /// One window per key that fires (and is purged) every `count` records.
    Count {
        /// Records per firing.
        count: u64,
    },
}

fn millis(duration: Duration) -> i64 {
    duration.as_millis().min(i64::MAX as u128) as i64
}

/// Tumbling windows in event time.
pub struct TumblingEventTimeWindows;
impl TumblingEventTimeWindows {
    /// Windows of `size`.
    pub fn of(size: Duration) -> WindowAssigner {
        WindowAssigner::Tumbling { size: millis(size), offset: 0, event_time: true }
    }
    /// Windows of `size` whose starts are shifted by `offset` (time zones, say).
    pub fn with_offset(size: Duration, offset: Duration) -> WindowAssigner {
        WindowAssigner::Tumbling { size: millis(size), offset: millis(offset), event_time: true }
    }
}

/// Tumbling windows in processing time.
pub struct TumblingProcessingTimeWindows;
impl TumblingProcessingTimeWindows {
    /// Windows of `size`.
    pub fn of(size: Duration) -> WindowAssigner {
        WindowAssigner::Tumbling { size: millis(size), offset: 0, event_time: false }
    }
}

/// Sliding windows in event time.
pub struct SlidingEventTimeWindows;
impl SlidingEventTimeWindows {
    /// Windows of `size` every `slide`.
    pub fn of(size: Duration, slide: Duration) -> WindowAssigner {
        WindowAssigner::Sliding { size: millis(size), slide: millis(slide), offset: 0, event_time: true }
    }
}

/// Sliding windows in processing time.
pub struct SlidingProcessingTimeWindows;
impl SlidingProcessingTimeWindows {
    /// Windows of `size` every `slide`.
    pub fn of(size: Duration, slide: Duration) -> WindowAssigner {
        WindowAssigner::Sliding { size: millis(size), slide: millis(slide), offset: 0, event_time: false }
    }
}

/// Session windows in event time.
pub struct EventTimeSessionWindows;
impl EventTimeSessionWindows {
    /// Sessions closed by `gap` without records.
    pub fn with_gap(gap: Duration) -> WindowAssigner {
        WindowAssigner::Session { gap: millis(gap), event_time: true }
    }
}

/// Session windows in processing time.
pub struct ProcessingTimeSessionWindows;
impl ProcessingTimeSessionWindows {
    /// Sessions closed by `gap` without records.
    pub fn with_gap(gap: Duration) -> WindowAssigner {
        WindowAssigner::Session { gap: millis(gap), event_time: false }
    }
}

impl WindowAssigner {
    /// True for event-time windows.
    pub fn is_event_time(&self) -> bool {
        match self {
            WindowAssigner::Tumbling { event_time, .. }
            | WindowAssigner::Sliding { event_time, .. }
            | WindowAssigner::Session { event_time, .. } => *event_time,
            WindowAssigner::Count { .. } => false,
        }
    }

    /// Checks the sizes (a zero size or slide would never fire).
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            WindowAssigner::Tumbling { size, offset, .. } if size <= 0 || offset.abs() >= size => Err(format!(
                "a tumbling window needs a size above 0 and |offset| below it (size {size} ms, offset {offset} ms)"
            )),
            WindowAssigner::Sliding { size, slide, offset, .. } if size <= 0 || slide <= 0 || offset.abs() >= slide => {
                Err(format!(
                    "a sliding window needs a size and a slide above 0 and |offset| below the slide (size {size} ms, slide {slide} ms, offset {offset} ms)"
                ))
            }
            WindowAssigner::Session { gap, .. } if gap <= 0 => {
                Err(format!("a session window needs a gap above 0 ms (got {gap} ms)"))
            }
            WindowAssigner::Count { count: 0 } => Err("a count window needs a count above 0".into()),
            _ => Ok(()),
        }
    }

    /// The windows a record at `timestamp` belongs to (for processing-time windows, pass the
    /// current processing time).
    pub fn assign(&self, timestamp: i64) -> Vec<TimeWindow> {
        let mut windows = Vec::new();
        self.assign_into(timestamp, &mut windows);
        windows
    }

    /// As [`assign`](Self::assign), into `windows` (cleared first).
    pub fn assign_into(&self, timestamp: i64, windows: &mut Vec<TimeWindow>) {
        windows.clear();
        match *self {
            WindowAssigner::Tumbling { size, offset, .. } => {
                let start = window_start(timestamp, offset, size);
                windows.push(TimeWindow::new(start, start.saturating_add(size)));
            }
            WindowAssigner::Sliding { size, slide, offset, .. } => {
                let mut start = window_start(timestamp, offset, slide);
                while start > timestamp - size {
                    windows.push(TimeWindow::new(start, start.saturating_add(size)));
                    start -= slide;
                }
            }
            WindowAssigner::Session { gap, .. } => {
                windows.push(TimeWindow::new(timestamp, timestamp.saturating_add(gap)))
            }
            WindowAssigner::Count { .. } => windows.push(TimeWindow::GLOBAL),
        }
    }
}

/// Merges overlapping windows (sessions): each result window with the indices of the
/// windows it covers, in start order (Flink's `TimeWindow.mergeWindows`).
pub fn merge_windows(windows: &[TimeWindow]) -> Vec<(TimeWindow, Vec<usize>)> {
    let mut order: Vec<usize> = (0..windows.len()).collect();
    order.sort_by_key(|&i| (windows[i].start, windows[i].end));
    let mut merged: Vec<(TimeWindow, Vec<usize>)> = Vec::new();
    for index in order {
        let window = windows[index];
        match merged.last_mut() {
            Some((current, members)) if current.intersects(&window) => {
                *current = current.cover(&window);
                members.push(index);
            }
            _ => merged.push((window, vec![index])),
        }
    }
    merged
}

/// Flink's `AggregateFunction`: an accumulator per window, built one record at a time.
pub trait AggregateFunction<I, A, O>: Clone + Send + 'static {
    /// A new, empty accumulator.
    fn create_accumulator(&self) -> A;
    /// Adds one record.
    fn add(&self, value: I, accumulator: A) -> A;
    /// The window's result.
    fn get_result(&self, accumulator: &A) -> O;
    /// Combines two accumulators (session windows merging).
    fn merge(&self, a: A, b: A) -> A;
}

/// What a [`ProcessWindowFunction`] knows about the window that fires.
pub struct WindowContext<'a> {
    /// The window.
    pub window: &'a TimeWindow,
    /// The operator's watermark now.
    pub current_watermark: i64,
    /// Processing time now, epoch ms.
    pub current_processing_time: u64,
}

/// Flink's `ProcessWindowFunction`: sees every record of the window (or the single
/// pre-aggregated value, combined with `reduce`/`aggregate`) and the window itself.
pub trait ProcessWindowFunction<K, I, O>: Clone + Send + 'static {
    /// The window fired for `key`.
    fn process(&mut self, key: &K, context: &WindowContext<'_>, elements: &[I], out: &mut Collector<'_, O>)
    -> FnResult;
}

/// How a window's records become its accumulator and its output.
pub trait WindowLogic<K, T, O>: Clone + Send + 'static {
    /// What a window keeps.
    type Acc: StateData;
    /// Adds `value` to the window's accumulator (`None`: the window is new).
    fn add(&mut self, acc: Option<&mut Self::Acc>, value: T) -> Option<Self::Acc>;
    /// Combines the accumulators of merging windows.
    fn merge(&mut self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Emits the window's result.
    fn emit(&mut self, key: &K, context: &WindowContext<'_>, acc: &Self::Acc, out: &mut Collector<'_, O>) -> FnResult;
}

/// `reduce(f)`: the window keeps one value.
#[derive(Clone)]
pub struct ReduceLogic<F>(F);

impl<K, T: StateData, F: FnMut(T, T) -> T + Clone + Send + 'static> WindowLogic<K, T, T> for ReduceLogic<F> {
    type Acc = T;
    fn add(&mut self, acc: Option<&mut T>, value: T) -> Option<T> {
        match acc {
            Some(acc) => {
                let current = acc.clone();
                *acc = (self.0)(current, value);
                None
            }
            None => Some(value),
        }
    }
    fn merge(&mut self, a: T, b: T) -> T {
        (self.0)(a, b)
    }
    fn emit(&mut self, _key: &K, _context: &WindowContext<'_>, acc: &T, out: &mut Collector<'_, T>) -> FnResult {
        out.collect(acc.clone());
        Ok(())
    }
}

/// `aggregate(f)`: the window keeps an accumulator.
pub struct AggregateLogic<F, A>(F, std::marker::PhantomData<fn() -> A>);

impl<F: Clone, A> Clone for AggregateLogic<F, A> {
    fn clone(&self) -> Self {
        AggregateLogic(self.0.clone(), std::marker::PhantomData)
    }
}

impl<K, T, A: StateData, O, F: AggregateFunction<T, A, O>> WindowLogic<K, T, O> for AggregateLogic<F, A> {
    type Acc = A;
    fn add(&mut self, acc: Option<&mut A>, value: T) -> Option<A> {
        match acc {
            Some(acc) => {
                let current = std::mem::replace(acc, self.0.create_accumulator());
                *acc = self.0.add(value, current);
                None
            }
            None => Some(self.0.add(value, self.0.create_accumulator())),
        }
    }
    fn merge(&mut self, a: A, b: A) -> A {
        self.0.merge(a, b)
    }
    fn emit(&mut self, _key: &K, _context: &WindowContext<'_>, acc: &A, out: &mut Collector<'_, O>) -> FnResult {
        out.collect(self.0.get_result(acc));
        Ok(())
    }
}

/// `process(f)`: the window keeps every record.
#[derive(Clone)]
pub struct ProcessLogic<P>(pub(crate) P);

impl<K, T: StateData, O, P: ProcessWindowFunction<K, T, O>> WindowLogic<K, T, O> for ProcessLogic<P> {
    type Acc = Vec<T>;
    fn add(&mut self, acc: Option<&mut Vec<T>>, value: T) -> Option<Vec<T>> {
        match acc {
            Some(acc) => {
                acc.push(value);
                None
            }
            None => Some(vec![value]),
        }
    }
    fn merge(&mut self, mut a: Vec<T>, b: Vec<T>) -> Vec<T> {
        a.extend(b);
        a
    }
    fn emit(&mut self, key: &K, context: &WindowContext<'_>, acc: &Vec<T>, out: &mut Collector<'_, O>) -> FnResult {
        self.0.process(key, context, acc, out)
    }
}

/// Incremental then process: `reduce`/`aggregate` keeps one value, `process` sees it and the
/// window when it fires.
pub struct ThenProcess<L, P, M>(L, P, std::marker::PhantomData<fn() -> M>);

impl<L: Clone, P: Clone, M> Clone for ThenProcess<L, P, M> {
    fn clone(&self) -> Self {
        ThenProcess(self.0.clone(), self.1.clone(), std::marker::PhantomData)
    }
}

impl<K, T, M: Send + 'static, O, L, P> WindowLogic<K, T, O> for ThenProcess<L, P, M>
where
    L: WindowLogic<K, T, M>,
    P: ProcessWindowFunction<K, M, O>,
{
    type Acc = L::Acc;
    fn add(&mut self, acc: Option<&mut L::Acc>, value: T) -> Option<L::Acc> {
        self.0.add(acc, value)
    }
    fn merge(&mut self, a: L::Acc, b: L::Acc) -> L::Acc {
        self.0.merge(a, b)
    }
    fn emit(&mut self, key: &K, context: &WindowContext<'_>, acc: &L::Acc, out: &mut Collector<'_, O>) -> FnResult {
        let mut single = Vec::with_capacity(1);
        self.0.emit(key, context, acc, &mut Collector::new(&mut single))?;
        self.1.process(key, context, &single, out)
    }
}

/// One open window of a key: the window, records in it, and its accumulator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WindowEntry<A> {
    /// The window.
    pub window: TimeWindow,
    /// Records added (count windows fire on it).
    pub count: u64,
    /// Whether it fired already (kept for the state's shape and for inspection: whether a
    /// record fires a window at once depends only on the watermark, as in Flink).
    pub fired: bool,
    /// The accumulator.
    pub acc: A,
}

/// The keyed function behind a windowed stream.
pub struct WindowFunction<K, T, O, L: WindowLogic<K, T, O>> {
    assigner: WindowAssigner,
    allowed_lateness: i64,
    late_tag: Option<crate::side_output::OutputTag<T>>,
    logic: L,
    contents: ValueState<Vec<WindowEntry<L::Acc>>>,
    /// Reused per record: the record's windows, and those new to its key.
    windows: Vec<TimeWindow>,
    new_windows: Vec<TimeWindow>,
    /// Reused per record: the sessions a record's window merges with.
    members: Vec<usize>,
    /// Session timers may lag behind their sessions' ends (see [`Self::lazy_timers_for`]);
    /// tests turn it off to compare with exact timers.
    lazy_session_timers: bool,
    _types: std::marker::PhantomData<fn(K, T) -> O>,
}

impl<K, T, O, L: WindowLogic<K, T, O>> Clone for WindowFunction<K, T, O, L> {
    fn clone(&self) -> Self {
        WindowFunction {
            assigner: self.assigner,
            allowed_lateness: self.allowed_lateness,
            late_tag: self.late_tag.clone(),
            logic: self.logic.clone(),
            contents: self.contents.clone(),
            windows: Vec::new(),
            new_windows: Vec::new(),
            members: Vec::new(),
            lazy_session_timers: self.lazy_session_timers,
            _types: std::marker::PhantomData,
        }
    }
}

/// The state that holds each key's open windows.
pub const WINDOW_CONTENTS_STATE: &str = "window-contents";

impl<K: Key, T, O, L: WindowLogic<K, T, O>> WindowFunction<K, T, O, L> {
    pub(crate) fn new(assigner: WindowAssigner, allowed_lateness: i64, logic: L) -> Self {
        WindowFunction {
            assigner,
            allowed_lateness,
            late_tag: None,
            logic,
            contents: ValueState::new(WINDOW_CONTENTS_STATE),
            windows: Vec::new(),
            new_windows: Vec::new(),
            members: Vec::new(),
            lazy_session_timers: Self::lazy_timers_for(assigner, allowed_lateness),
            _types: std::marker::PhantomData,
        }
    }

    /// Whether a session's timer may lag behind its end (Flink moves it on every merge: a
    /// deletion and a registration per record, most of a session operator's timer work).
    /// A session keeps the timer it has when it grows or merges; when a timer fires, the
    /// key's sessions that end later register their end again (a duplicate is ignored), and
    /// one due already fires in the same advance, in time order. So every session has a
    /// pending timer at or before its end, and fires exactly when Flink's would. Not with
    /// allowed lateness in event time: there a session may fire at once on a late merge and
    /// again later, and only exact timers tell those firings apart.
    fn lazy_timers_for(assigner: WindowAssigner, allowed_lateness: i64) -> bool {
        matches!(assigner, WindowAssigner::Session { .. }) && (allowed_lateness == 0 || !assigner.is_event_time())
    }

    /// When a window's state goes: its end plus the allowed lateness (event time; Flink's
    /// `cleanupTime`, saturating instead of overflowing).
    fn cleanup_time(&self, window: &TimeWindow) -> i64 {
        if self.assigner.is_event_time() {
            window.max_timestamp().saturating_add(self.allowed_lateness)
        } else {
            window.max_timestamp()
        }
    }

    /// Flink's `isWindowLate`: an event-time window whose cleanup time the watermark reached.
    fn is_window_late(&self, window: &TimeWindow, watermark: i64) -> bool {
        self.assigner.is_event_time() && self.cleanup_time(window) <= watermark
    }

    /// The timers of `window`: where it fires (Flink's `EventTimeTrigger` registers that only
    /// while the watermark has not passed it: a window past it fires at once instead) and
    /// where its state goes (`registerCleanupTimer`). Timers are a set per key and
    /// timestamp, so registering again is harmless.
    fn register(&self, ctx: &mut KeyedContext<'_, K>, window: &TimeWindow, watermark: i64) {
        match self.assigner {
            WindowAssigner::Count { .. } => {}
            _ if self.assigner.is_event_time() => {
                if window.max_timestamp() > watermark {
                    ctx.register_event_time_timer(window.max_timestamp());
                }
                if self.allowed_lateness > 0 {
                    ctx.register_event_time_timer(self.cleanup_time(window));
                }
            }
            _ => ctx.register_processing_time_timer(window.max_timestamp().max(0) as u64),
        }
    }

    fn unregister(&self, ctx: &mut KeyedContext<'_, K>, window: &TimeWindow) {
        if self.assigner.is_event_time() {
            ctx.delete_event_time_timer(window.max_timestamp());
            if self.allowed_lateness > 0 {
                ctx.delete_event_time_timer(self.cleanup_time(window));
            }
        } else if !matches!(self.assigner, WindowAssigner::Count { .. }) {
            ctx.delete_processing_time_timer(window.max_timestamp().max(0) as u64);
        }
    }

    /// A record too late for every window it belongs to: to the late-data side output (with
    /// its own timestamp), or dropped; counted either way.
    fn late(&self, record: T, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult
    where
        T: 'static,
    {
        match &self.late_tag {
            Some(tag) => {
                ctx.count_late_record_sent_aside();
                out.output(tag, record)
            }
            None => {
                ctx.count_late_record();
                Ok(())
            }
        }
    }

    fn context<'a>(window: &'a TimeWindow, ctx: &KeyedContext<'_, K>) -> WindowContext<'a> {
        WindowContext {
            window,
            current_watermark: ctx.current_watermark(),
            current_processing_time: ctx.current_processing_time(),
        }
    }
}

impl<K, T, O, L> KeyedProcessFunction<K, T, O> for WindowFunction<K, T, O, L>
where
    K: Key,
    T: Clone + Send + 'static,
    O: Send + 'static,
    L: WindowLogic<K, T, O>,
{
    fn states(&self) -> Vec<weir_state::StateDeclaration> {
        vec![self.contents.declaration()]
    }

    fn process_element(&mut self, record: T, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        let event_time = self.assigner.is_event_time();
        let time = if event_time {
            match ctx.timestamp() {
                Some(timestamp) => timestamp,
                None => {
                    return Err("a record without an event timestamp reached an event-time window: assign timestamps with assign_timestamps_and_watermarks(WatermarkStrategy::...) before the window".into());
                }
            }
        } else {
            ctx.current_processing_time() as i64
        };
        let watermark = ctx.current_watermark();
        let mut windows = std::mem::take(&mut self.windows);
        self.assigner.assign_into(time, &mut windows);
        let result = match self.assigner {
            WindowAssigner::Tumbling { .. } | WindowAssigner::Sliding { .. } => {
                // Late: the watermark passed the window's end plus the allowed lateness.
                windows.retain(|w| !self.is_window_late(w, watermark));
                if windows.is_empty() {
                    self.late(record, ctx, out)
                } else {
                    self.add_to_time_windows(record, &windows, watermark, event_time, ctx, out)
                }
            }
            WindowAssigner::Session { .. } => match windows.first() {
                Some(&window) => self.add_to_session(record, window, watermark, event_time, ctx, out),
                None => self.late(record, ctx, out),
            },
            WindowAssigner::Count { count } => self.add_to_count_window(record, count, ctx, out),
        };
        self.windows = windows;
        result
    }

    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedContext<'_, K>, out: &mut Collector<'_, O>) -> FnResult {
        let event_time = ctx.time_domain() == Some(TimeDomain::EventTime);
        if event_time != self.assigner.is_event_time() {
            return Ok(());
        }
        let key = ctx.current_key().clone();
        let (current_watermark, current_processing_time) = (ctx.current_watermark(), ctx.current_processing_time());
        let lateness = if event_time { self.allowed_lateness } else { 0 };
        let mut state = ctx.value(&self.contents)?;
        let entries = state.get_or_insert_with(Vec::new);
        for entry in entries.iter_mut() {
            if entry.window.max_timestamp() == timestamp {
                let context = WindowContext { window: &entry.window, current_watermark, current_processing_time };
                self.logic.emit(&key, &context, &entry.acc, out)?;
                entry.fired = true;
            }
        }
        // Gone once the watermark (or the clock) passed its end plus the allowed lateness.
        entries.retain(|e| e.window.max_timestamp().saturating_add(lateness) > timestamp);
        if entries.is_empty() {
            state.clear();
            return Ok(());
        }
        if self.lazy_session_timers {
            // This may have been a session's lagging timer: each later session registers its
            // end again (a timer due already fires in this advance, in time order).
            let mut later = std::mem::take(&mut self.new_windows);
            later.clear();
            later.extend(entries.iter().map(|e| e.window));
            for end in later.iter().map(TimeWindow::max_timestamp) {
                if event_time {
                    ctx.register_event_time_timer(end);
                } else {
                    ctx.register_processing_time_timer(end.max(0) as u64);
                }
            }
            self.new_windows = later;
        }
        Ok(())
    }
}

impl<K: Key, T: Clone + 'static, O, L: WindowLogic<K, T, O>> WindowFunction<K, T, O, L> {
    /// Tumbling and sliding windows: adds `record` to each of `windows` (none of them late)
    /// in place (one state access) and registers the timers of the windows new to the key.
    /// A window the watermark already passed (the record is within the allowed lateness)
    /// fires at once, at its last millisecond, whether it is new or fired before (Flink's
    /// `EventTimeTrigger.onElement`): each such record fires it once more.
    fn add_to_time_windows(
        &mut self,
        record: T,
        windows: &[TimeWindow],
        watermark: i64,
        event_time: bool,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        let mut new_windows = std::mem::take(&mut self.new_windows);
        new_windows.clear();
        let fire_now = event_time && windows.iter().any(|w| w.max_timestamp() <= watermark);
        {
            let mut state = ctx.value(&self.contents)?;
            let entries = state.get_or_insert_with(Vec::new);
            let last = windows.len().saturating_sub(1);
            let mut record = Some(record);
            for (position, window) in windows.iter().enumerate() {
                // The last window takes the record itself, the others a copy.
                let value = if position == last { record.take() } else { record.clone() };
                let Some(value) = value else { break };
                match entries.iter_mut().find(|e| e.window == *window) {
                    Some(entry) => {
                        entry.count += 1;
                        if let Some(acc) = self.logic.add(Some(&mut entry.acc), value) {
                            entry.acc = acc;
                        }
                    }
                    None => {
                        let Some(acc) = self.logic.add(None, value) else {
                            return Err("a window function made no accumulator for a new window".into());
                        };
                        entries.push(WindowEntry { window: *window, count: 1, fired: false, acc });
                        new_windows.push(*window);
                    }
                }
            }
        }
        for window in &new_windows {
            self.register(ctx, window, watermark);
        }
        self.new_windows = new_windows;
        if fire_now {
            let key = ctx.current_key().clone();
            let (current_watermark, current_processing_time) = (ctx.current_watermark(), ctx.current_processing_time());
            let mut state = ctx.value(&self.contents)?;
            let entries = state.get_or_insert_with(Vec::new);
            // In the order of the record's windows, as Flink fires them.
            for window in windows.iter().filter(|w| w.max_timestamp() <= watermark) {
                if let Some(entry) = entries.iter_mut().find(|e| e.window == *window) {
                    let context = WindowContext { window: &entry.window, current_watermark, current_processing_time };
                    self.logic.emit(&key, &context, &entry.acc, &mut out.at_timestamp(window.max_timestamp()))?;
                    entry.fired = true;
                }
            }
        }
        Ok(())
    }

    /// Session windows, as Flink's `WindowOperator` with its `MergingWindowSet`: the record's
    /// window `[t, t + gap)` merges first with every session of the key it overlaps or
    /// touches (combining accumulators and moving timers), and only the merged window is
    /// checked for lateness, so a record whose own window the watermark passed still joins
    /// a session that is not late. A merged window the watermark already passed fires at
    /// once, at its last millisecond.
    fn add_to_session(
        &mut self,
        record: T,
        window: TimeWindow,
        watermark: i64,
        event_time: bool,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        // Taken out of the state (a move, not a copy) and put back.
        let mut entries = std::mem::take(ctx.value(&self.contents)?.get_or_insert_with(Vec::new));
        // A key's sessions never overlap or touch one another (they would have merged), so
        // the sessions the record's window merges with are those it overlaps or touches
        // itself, and the merged window is their cover: Flink's `mergeWindows` for the new
        // window's group, in one pass and without allocating (this runs once per record).
        let mut members = std::mem::take(&mut self.members);
        members.clear();
        let mut merged = window;
        for (index, entry) in entries.iter().enumerate() {
            if entry.window.intersects(&window) {
                members.push(index);
                merged = merged.cover(&entry.window);
            }
        }
        let result: Result<usize, T> = if self.is_window_late(&merged, watermark) {
            // Flink adds it to the set, sees it late and retires it: nothing changes.
            Err(record)
        } else {
            Ok(self.merge_into_session(record, window, merged, &members, &mut entries, watermark, ctx)?)
        };
        // A lazy session that grew or merged keeps a timer of its members'.
        let needs_timer = members.is_empty() || !self.lazy_session_timers;
        self.members = members;
        if let Ok(index) = result {
            let entry = &mut entries[index];
            let window = entry.window;
            if needs_timer {
                self.register(ctx, &window, watermark);
            }
            if event_time && window.max_timestamp() <= watermark {
                self.logic.emit(
                    ctx.current_key(),
                    &Self::context(&entry.window, ctx),
                    &entry.acc,
                    &mut out.at_timestamp(window.max_timestamp()),
                )?;
                entry.fired = true;
            }
        }
        let mut state = ctx.value(&self.contents)?;
        if entries.is_empty() {
            state.clear()
        } else {
            state.set(entries)
        }
        match result {
            Ok(_) => Ok(()),
            Err(record) => self.late(record, ctx, out),
        }
    }

    /// Adds `record` (of `window`) to the session `merged` of `members` (indices into
    /// `entries`), merging them into one entry; returns the session's index. With exact
    /// timers a session's timers move with its end, and the others' are registered again,
    /// since a deleted timer (per key and timestamp) may have been another session's too;
    /// lazy ones stay where they are ([`Self::lazy_timers_for`]).
    #[allow(clippy::too_many_arguments)]
    fn merge_into_session(
        &mut self,
        record: T,
        window: TimeWindow,
        merged: TimeWindow,
        members: &[usize],
        entries: &mut Vec<WindowEntry<L::Acc>>,
        watermark: i64,
        ctx: &mut KeyedContext<'_, K>,
    ) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        let lazy = self.lazy_session_timers;
        let mut entry = match members {
            [] => {
                let Some(acc) = self.logic.add(None, record) else {
                    return Err("a window function made no accumulator for a new window".into());
                };
                entries.push(WindowEntry { window, count: 1, fired: false, acc });
                return Ok(entries.len() - 1);
            }
            // Inside a session already: nothing merges, no timer moves.
            [only] if entries[*only].window == merged => {
                let entry = &mut entries[*only];
                entry.count += 1;
                if let Some(acc) = self.logic.add(Some(&mut entry.acc), record) {
                    entry.acc = acc;
                }
                return Ok(*only);
            }
            [only] => {
                let entry = entries.remove(*only);
                if !lazy {
                    self.unregister(ctx, &entry.window);
                }
                entry
            }
            _ => {
                // Members are in index order: removed from the back, combined by start.
                let mut taken: Vec<WindowEntry<L::Acc>> = members.iter().rev().map(|&m| entries.remove(m)).collect();
                taken.sort_by_key(|e| e.window.start);
                let mut combined: Option<WindowEntry<L::Acc>> = None;
                for entry in taken {
                    if !lazy {
                        self.unregister(ctx, &entry.window);
                    }
                    combined = Some(match combined {
                        None => entry,
                        Some(mut acc) => {
                            acc.count += entry.count;
                            acc.fired |= entry.fired;
                            acc.acc = self.logic.merge(acc.acc, entry.acc);
                            acc
                        }
                    });
                }
                combined.ok_or("a session merge found none of its sessions")?
            }
        };
        entry.window = merged;
        if !lazy {
            for other in entries.iter() {
                self.register(ctx, &other.window, watermark);
            }
        }
        entry.count += 1;
        if let Some(acc) = self.logic.add(Some(&mut entry.acc), record) {
            entry.acc = acc;
        }
        entries.push(entry);
        Ok(entries.len() - 1)
    }

    /// Count windows: one global window per key that fires and is purged every `count`
    /// records (Flink's `PurgingTrigger(CountTrigger)`).
    fn add_to_count_window(
        &mut self,
        record: T,
        count: u64,
        ctx: &mut KeyedContext<'_, K>,
        out: &mut Collector<'_, O>,
    ) -> FnResult {
        let mut entries = std::mem::take(ctx.value(&self.contents)?.get_or_insert_with(Vec::new));
        let index = match entries.iter().position(|e| e.window == TimeWindow::GLOBAL) {
            Some(index) => {
                let entry = &mut entries[index];
                entry.count += 1;
                if let Some(acc) = self.logic.add(Some(&mut entry.acc), record) {
                    entry.acc = acc;
                }
                index
            }
            None => {
                let Some(acc) = self.logic.add(None, record) else {
                    return Err("a window function made no accumulator for a new window".into());
                };
                entries.push(WindowEntry { window: TimeWindow::GLOBAL, count: 1, fired: false, acc });
                entries.len() - 1
            }
        };
        if entries[index].count >= count {
            let entry = entries.remove(index);
            self.logic.emit(ctx.current_key(), &Self::context(&entry.window, ctx), &entry.acc, out)?;
        }
        let mut state = ctx.value(&self.contents)?;
        if entries.is_empty() {
            state.clear()
        } else {
            state.set(entries)
        }
        Ok(())
    }
}

/// A keyed stream cut into windows: pick the window function with `reduce`, `aggregate` or
/// `process` (or the `*_with_process` pairs).
pub struct WindowedStream<K, T> {
    pub(crate) keyed: crate::datastream::KeyedStream<K, T>,
    pub(crate) assigner: WindowAssigner,
    pub(crate) allowed_lateness: i64,
    pub(crate) late_tag: Option<crate::side_output::OutputTag<T>>,
}

impl<K: Key, T: crate::Data + StateData> WindowedStream<K, T> {
    /// Records up to `lateness` behind the watermark still update their windows (each such
    /// record fires its window at once, once more, as Flink's `EventTimeTrigger`); later
    /// ones are dropped and counted as late.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.allowed_lateness = millis(lateness);
        self
    }

    /// Records too late for every window they belong to go to side output `tag` (read it with
    /// `get_side_output(&tag)` on the window's result) instead of being dropped; they are
    /// counted as late either way.
    pub fn side_output_late_data(mut self, tag: &crate::side_output::OutputTag<T>) -> Self {
        self.late_tag = Some(tag.clone());
        self
    }

    fn apply<O: crate::Data, L: WindowLogic<K, T, O>>(&self, name: &str, logic: L) -> crate::datastream::DataStream<O> {
        let mut function = WindowFunction::new(self.assigner, self.allowed_lateness, logic);
        function.late_tag = self.late_tag.clone();
        self.keyed.process_named(name, function, self.assigner.validate().err())
    }

    /// Combines a window's records pairwise; emits the result when it fires.
    pub fn reduce<F>(&self, reduce: F) -> crate::datastream::DataStream<T>
    where
        F: FnMut(T, T) -> T + Clone + Send + Sync + 'static,
    {
        self.apply("Window(Reduce)", ReduceLogic(reduce))
    }

    /// Aggregates a window's records with `aggregate`'s accumulator.
    pub fn aggregate<A: StateData, O: crate::Data, F: AggregateFunction<T, A, O>>(
        &self,
        aggregate: F,
    ) -> crate::datastream::DataStream<O> {
        self.apply("Window(Aggregate)", AggregateLogic(aggregate, std::marker::PhantomData))
    }

    /// Hands every record of a window, and the window, to `process` when it fires.
    pub fn process<O: crate::Data, P: ProcessWindowFunction<K, T, O>>(
        &self,
        process: P,
    ) -> crate::datastream::DataStream<O> {
        self.apply("Window(Process)", ProcessLogic(process))
    }

    /// Reduces incrementally, then hands the single result and the window to `process`.
    pub fn reduce_with_process<O: crate::Data, F, P>(&self, reduce: F, process: P) -> crate::datastream::DataStream<O>
    where
        F: FnMut(T, T) -> T + Clone + Send + Sync + 'static,
        P: ProcessWindowFunction<K, T, O>,
    {
        self.apply("Window(Reduce, Process)", ThenProcess(ReduceLogic(reduce), process, std::marker::PhantomData))
    }

    /// Aggregates incrementally, then hands the result and the window to `process`.
    pub fn aggregate_with_process<A: StateData, M: crate::Data, O: crate::Data, F, P>(
        &self,
        aggregate: F,
        process: P,
    ) -> crate::datastream::DataStream<O>
    where
        F: AggregateFunction<T, A, M>,
        P: ProcessWindowFunction<K, M, O>,
    {
        let logic = ThenProcess(AggregateLogic(aggregate, std::marker::PhantomData), process, std::marker::PhantomData);
        self.apply("Window(Aggregate, Process)", logic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tumbling_and_sliding_windows_follow_flinks_start_rule() {
        let tumbling = TumblingEventTimeWindows::of(Duration::from_millis(10));
        assert_eq!(tumbling.assign(0), vec![TimeWindow::new(0, 10)]);
        assert_eq!(tumbling.assign(9), vec![TimeWindow::new(0, 10)]);
        assert_eq!(tumbling.assign(10), vec![TimeWindow::new(10, 20)]);
        assert_eq!(tumbling.assign(-1), vec![TimeWindow::new(-10, 0)]);
        let sliding = SlidingEventTimeWindows::of(Duration::from_millis(10), Duration::from_millis(5));
        assert_eq!(sliding.assign(7), vec![TimeWindow::new(5, 15), TimeWindow::new(0, 10)]);
        assert_eq!(sliding.assign(10), vec![TimeWindow::new(10, 20), TimeWindow::new(5, 15)]);
    }

    #[test]
    fn sessions_merge_when_they_overlap_or_touch() {
        let windows = [TimeWindow::new(0, 5), TimeWindow::new(10, 15), TimeWindow::new(4, 9), TimeWindow::new(15, 16)];
        let merged = merge_windows(&windows);
        assert_eq!(merged, vec![(TimeWindow::new(0, 9), vec![0, 2]), (TimeWindow::new(10, 16), vec![1, 3])]);
    }

    proptest! {
        #[test]
        fn every_window_holds_its_timestamp(timestamp in -1_000_000i64..1_000_000, size in 1i64..500, slide in 1i64..500) {
            let tumbling = WindowAssigner::Tumbling { size, offset: 0, event_time: true };
            let windows = tumbling.assign(timestamp);
            prop_assert_eq!(windows.len(), 1);
            prop_assert!(windows[0].start <= timestamp && timestamp < windows[0].end);
            prop_assert_eq!(windows[0].start.rem_euclid(size), 0);
            let sliding = WindowAssigner::Sliding { size, slide, offset: 0, event_time: true };
            let windows = sliding.assign(timestamp);
            // Exactly the windows [k*slide, k*slide + size) that hold the timestamp.
            let expected = (timestamp.div_euclid(slide) - size / slide - 1..=timestamp.div_euclid(slide))
                .map(|k| k * slide)
                .filter(|start| *start <= timestamp && timestamp < start + size)
                .count();
            prop_assert_eq!(windows.len(), expected);
            for window in &windows {
                prop_assert!(window.start <= timestamp && timestamp < window.end);
                prop_assert_eq!(window.end - window.start, size);
            }
        }

        #[test]
        fn merged_sessions_cover_their_members_and_do_not_touch(starts in proptest::collection::vec(0i64..1000, 1..40), gap in 1i64..50) {
            let windows: Vec<TimeWindow> = starts.iter().map(|&s| TimeWindow::new(s, s + gap)).collect();
            let merged = merge_windows(&windows);
            let mut seen = 0;
            for (window, members) in &merged {
                seen += members.len();
                for &m in members {
                    prop_assert!(window.start <= windows[m].start && windows[m].end <= window.end);
                }
            }
            prop_assert_eq!(seen, windows.len());
            for pair in merged.windows(2) {
                prop_assert!(pair[0].0.end < pair[1].0.start, "{:?} and {:?} should have merged", pair[0].0, pair[1].0);
            }
        }
    }
}

#[cfg(test)]
mod operator_tests {
    //! The window operator driven by hand: records with timestamps, watermarks, exact outputs.

    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::error::TaskError;
    use crate::operator::{Operator, TaskContext};
    use crate::operators::KeyedProcessOperator;
    use crate::snapshot::{Barrier, TaskSnapshot};

    /// What reached the end of the chain: `(record, timestamp)` and watermarks, in order.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<T: std::fmt::Debug + Send> Operator<T> for Seen {
        fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(batch.drain(..).map(|r| format!("{r:?}")));
            Ok(())
        }
        fn process_timestamped_batch(
            &mut self,
            batch: &mut Vec<T>,
            timestamps: &mut Vec<i64>,
            _hashes: &mut Vec<u32>,
        ) -> Result<(), TaskError> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(batch.drain(..).zip(timestamps.drain(..)).map(|(r, t)| format!("{r:?}@{t}")));
            Ok(())
        }
        fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
            self.0.lock().unwrap().push(format!("W{watermark}"));
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

    impl Seen {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    type Event = (u64, u64);

    fn operator<O: Send + std::fmt::Debug + 'static, L: WindowLogic<u64, Event, O>>(
        assigner: WindowAssigner,
        lateness_ms: i64,
        logic: L,
    ) -> (Box<dyn Operator<Event>>, Seen, Arc<crate::operator::TaskMetrics>) {
        operator_in(TaskContext::for_test(0, 1, 128), assigner, lateness_ms, logic)
    }

    fn operator_in<O: Send + std::fmt::Debug + 'static, L: WindowLogic<u64, Event, O>>(
        ctx: TaskContext,
        assigner: WindowAssigner,
        lateness_ms: i64,
        logic: L,
    ) -> (Box<dyn Operator<Event>>, Seen, Arc<crate::operator::TaskMetrics>) {
        operator_of(ctx, WindowFunction::new(assigner, lateness_ms, logic))
    }

    fn operator_of<O: Send + std::fmt::Debug + 'static, L: WindowLogic<u64, Event, O>>(
        ctx: TaskContext,
        function: WindowFunction<u64, Event, O, L>,
    ) -> (Box<dyn Operator<Event>>, Seen, Arc<crate::operator::TaskMetrics>) {
        let seen = Seen::default();
        let metrics = Arc::clone(&ctx.metrics);
        let mut op = KeyedProcessOperator::new(&ctx, function, Arc::new(|e: &Event| e.0), Box::new(seen.clone()));
        op.declare_states().unwrap();
        (Box::new(op), seen, metrics)
    }

    fn send(op: &mut Box<dyn Operator<Event>>, events: &[(u64, u64, i64)]) {
        let mut batch: Vec<Event> = events.iter().map(|(k, v, _)| (*k, *v)).collect();
        let mut timestamps: Vec<i64> = events.iter().map(|e| e.2).collect();
        op.process_timestamped_batch(&mut batch, &mut timestamps, &mut Vec::new()).unwrap();
    }

    fn sum() -> ReduceLogic<impl FnMut(Event, Event) -> Event + Clone + Send + 'static> {
        ReduceLogic(|a: Event, b: Event| (a.0, a.1 + b.1))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tumbling_windows_fire_on_the_watermark_and_drop_late_records() {
        let (mut op, seen, metrics) = operator(TumblingEventTimeWindows::of(ms(10)), 0, sum());
        send(&mut op, &[(1, 1, 1), (1, 2, 5), (2, 4, 3), (1, 8, 12), (1, 16, 7)]);
        assert_eq!(seen.take(), Vec::<String>::new(), "nothing fires before the watermark");
        op.process_watermark(9).unwrap();
        let mut fired = seen.take();
        fired.sort();
        assert_eq!(fired, ["(1, 19)@9", "(2, 4)@9", "W9"]);
        // Late: the watermark passed the end of [0, 10).
        send(&mut op, &[(1, 100, 8)]);
        assert_eq!(metrics.records_late.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(metrics.records_late_dropped.load(std::sync::atomic::Ordering::Relaxed), 1, "no late output");
        op.process_watermark(19).unwrap();
        assert_eq!(seen.take(), ["(1, 8)@19", "W19"]);
    }

    #[test]
    fn allowed_lateness_fires_a_window_again_then_drops_its_state() {
        let (mut op, seen, metrics) = operator(TumblingEventTimeWindows::of(ms(10)), 5, sum());
        send(&mut op, &[(1, 1, 1), (1, 2, 5)]);
        op.process_watermark(9).unwrap();
        assert_eq!(seen.take(), ["(1, 3)@9", "W9"]);
        send(&mut op, &[(1, 10, 8)]);
        assert_eq!(seen.take(), ["(1, 13)@9"], "a late record within the lateness fires again, at the window's end");
        op.process_watermark(14).unwrap();
        assert_eq!(seen.take(), ["W14"]);
        send(&mut op, &[(1, 100, 9)]);
        assert_eq!(seen.take(), Vec::<String>::new());
        assert_eq!(metrics.records_late.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[derive(Clone)]
    struct CountAndSum;
    impl AggregateFunction<Event, (u64, u64), String> for CountAndSum {
        fn create_accumulator(&self) -> (u64, u64) {
            (0, 0)
        }
        fn add(&self, value: Event, acc: (u64, u64)) -> (u64, u64) {
            (acc.0 + 1, acc.1 + value.1)
        }
        fn get_result(&self, acc: &(u64, u64)) -> String {
            format!("{}x{}", acc.0, acc.1)
        }
        fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
            (a.0 + b.0, a.1 + b.1)
        }
    }

    #[derive(Clone)]
    struct Describe;
    impl<I: std::fmt::Debug> ProcessWindowFunction<u64, I, String> for Describe {
        fn process(
            &mut self,
            key: &u64,
            context: &WindowContext<'_>,
            elements: &[I],
            out: &mut Collector<'_, String>,
        ) -> FnResult {
            out.collect(format!("{key} [{}, {}) {elements:?}", context.window.start, context.window.end));
            Ok(())
        }
    }

    #[test]
    fn sessions_merge_across_gaps_that_a_record_closes() {
        let assigner = EventTimeSessionWindows::with_gap(ms(5));
        let (mut op, seen, _) = operator(assigner, 0, AggregateLogic(CountAndSum, std::marker::PhantomData));
        send(&mut op, &[(1, 1, 1), (1, 2, 4), (1, 3, 20), (1, 4, 12)]);
        op.process_watermark(10).unwrap();
        assert_eq!(seen.take(), ["\"2x3\"@8", "W10"], "[1, 9) fired: the watermark passed it");
        let (mut op, seen, _) = operator(assigner, 0, AggregateLogic(CountAndSum, std::marker::PhantomData));
        send(&mut op, &[(1, 1, 1), (1, 2, 4), (1, 3, 20), (1, 4, 12), (1, 5, 8)]);
        op.process_watermark(30).unwrap();
        // [1, 9) + [8, 13) + [12, 17) merged into [1, 17); [20, 25) alone.
        assert_eq!(seen.take(), ["\"4x12\"@16", "\"1x3\"@24", "W30"]);
    }

    proptest::proptest! {
        /// Sessions built record by record, in any arrival order and with merges of several
        /// sessions at once, are those of the sorted timestamps split where a gap exceeds the
        /// session gap: each fires once, at its end, with its records' count and sum.
        #[test]
        fn sessions_in_any_order_are_the_sorted_records_split_at_gaps(
            records in proptest::collection::vec((0u64..3, 0i64..400), 1..60),
            gap in 1i64..40,
        ) {
            let assigner = EventTimeSessionWindows::with_gap(ms(gap as u64));
            let (mut op, seen, _) = operator(assigner, 0, AggregateLogic(CountAndSum, std::marker::PhantomData));
            let events: Vec<(u64, u64, i64)> =
                records.iter().enumerate().map(|(i, &(key, t))| (key, i as u64, t)).collect();
            send(&mut op, &events);
            op.process_watermark(i64::MAX).unwrap();
            let mut got = seen.take();
            proptest::prop_assert_eq!(got.pop(), Some(format!("W{}", i64::MAX)));
            got.sort();
            let mut expected = Vec::new();
            for key in 0..3u64 {
                let mut mine: Vec<(i64, u64)> =
                    events.iter().filter(|e| e.0 == key).map(|e| (e.2, e.1)).collect();
                mine.sort_unstable();
                let mut session: Option<(i64, u64, u64)> = None; // (end, count, sum)
                for (t, v) in mine {
                    session = match session {
                        Some((end, count, sum)) if t <= end => Some((end.max(t + gap), count + 1, sum + v)),
                        Some((end, count, sum)) => {
                            expected.push(format!("\"{count}x{sum}\"@{}", end - 1));
                            Some((t + gap, 1, v))
                        }
                        None => Some((t + gap, 1, v)),
                    };
                }
                if let Some((end, count, sum)) = session {
                    expected.push(format!("\"{count}x{sum}\"@{}", end - 1));
                }
            }
            expected.sort();
            proptest::prop_assert_eq!(got, expected);
        }
    }

    /// Count-and-sum sessions without allowed lateness, with lazy timers or exact ones
    /// (Flink's, moved on every merge).
    fn sessions(
        ctx: TaskContext,
        assigner: WindowAssigner,
        exact: bool,
    ) -> (Box<dyn Operator<Event>>, Seen, Arc<crate::operator::TaskMetrics>) {
        let mut function = WindowFunction::new(assigner, 0, AggregateLogic(CountAndSum, std::marker::PhantomData));
        function.lazy_session_timers = !exact;
        operator_of(ctx, function)
    }

    /// What came out between two markers, sorted (keys due at the same time may fire in
    /// another order), after checking that event times never go back within it.
    fn by_segment(seen: Vec<String>, marker: char) -> Result<Vec<Vec<String>>, String> {
        let mut segments = vec![Vec::new()];
        for line in seen {
            if line.starts_with(marker) {
                segments.push(vec![line]);
                segments.push(Vec::new());
            } else {
                segments.last_mut().ok_or("no segment")?.push(line);
            }
        }
        for segment in &mut segments {
            let times: Vec<i64> = segment.iter().filter_map(|l| l.rsplit_once('@')?.1.parse().ok()).collect();
            if times.windows(2).any(|pair| pair[0] > pair[1]) {
                return Err(format!("fired out of time order: {segment:?}"));
            }
            segment.sort();
        }
        Ok(segments)
    }

    proptest::proptest! {
        /// Lazy session timers fire what exact ones fire, at the same watermarks and in time
        /// order: records forward and back in time (some late, dropped), merging sessions,
        /// watermarks in between that pass several sessions' ends at once.
        #[test]
        fn lazy_session_timers_fire_as_exact_ones_in_event_time(
            steps in proptest::collection::vec((0u8..4, 0u64..3, 0i64..40), 1..80),
            gap in 1i64..30,
        ) {
            let run = |exact: bool| {
                let assigner = EventTimeSessionWindows::with_gap(ms(gap as u64));
                let (mut op, seen, metrics) = sessions(TaskContext::for_test(0, 1, 128), assigner, exact);
                let (mut time, mut watermark) = (0i64, 0i64);
                for (i, &(kind, key, step)) in steps.iter().enumerate() {
                    match kind {
                        0 => {
                            watermark += step;
                            op.process_watermark(watermark).unwrap();
                        }
                        1 => time = (time - step).max(0),
                        _ => time += step,
                    }
                    if kind != 0 {
                        send(&mut op, &[(key, i as u64, time)]);
                    }
                }
                op.process_watermark(i64::MAX).unwrap();
                (by_segment(seen.take(), 'W'), late_records(&metrics))
            };
            let (lazy, exact) = (run(false), run(true));
            proptest::prop_assert!(lazy.0.is_ok(), "{:?}", lazy.0);
            proptest::prop_assert_eq!(lazy, exact);
        }

        /// The same in processing time: sessions on the clock, timers fired as it advances.
        #[test]
        fn lazy_session_timers_fire_as_exact_ones_in_processing_time(
            steps in proptest::collection::vec((0u8..3, 0u64..3, 0u64..40), 1..80),
            gap in 1u64..30,
        ) {
            let run = |exact: bool| {
                let (ctx, clock) = context_at(1_000);
                let (mut op, seen, _) = sessions(ctx, ProcessingTimeSessionWindows::with_gap(ms(gap)), exact);
                let mut now = 1_000;
                for (i, &(kind, key, step)) in steps.iter().enumerate().chain([(steps.len(), &(0, 0, 10_000))]) {
                    if kind == 0 {
                        now += step;
                        clock.set(now);
                        op.fire_timers(now).unwrap();
                        seen.0.lock().unwrap().push(format!("F{now}"));
                    } else {
                        op.process_batch(&mut vec![(key, i as u64)]).unwrap();
                    }
                }
                by_segment(seen.take(), 'F')
            };
            proptest::prop_assert_eq!(run(false), run(true));
        }
    }

    #[test]
    fn sliding_windows_with_process_see_every_record_and_the_window() {
        let assigner = SlidingEventTimeWindows::of(ms(10), ms(5));
        let (mut op, seen, _) = operator(assigner, 0, ProcessLogic(Describe));
        send(&mut op, &[(1, 1, 2), (1, 2, 7), (1, 3, 11)]);
        op.process_watermark(i64::MAX).unwrap();
        assert_eq!(
            seen.take(),
            [
                "\"1 [-5, 5) [(1, 1)]\"@4",
                "\"1 [0, 10) [(1, 1), (1, 2)]\"@9",
                "\"1 [5, 15) [(1, 2), (1, 3)]\"@14",
                "\"1 [10, 20) [(1, 3)]\"@19",
                &format!("W{}", i64::MAX),
            ]
        );
    }

    #[test]
    fn incremental_aggregation_hands_its_result_to_the_process_function() {
        let logic =
            ThenProcess(AggregateLogic(CountAndSum, std::marker::PhantomData), Describe, std::marker::PhantomData);
        let (mut op, seen, _) = operator(TumblingEventTimeWindows::of(ms(10)), 0, logic);
        send(&mut op, &[(1, 1, 2), (1, 2, 7)]);
        op.process_watermark(9).unwrap();
        assert_eq!(seen.take(), ["\"1 [0, 10) [\\\"2x3\\\"]\"@9", "W9"]);
    }

    #[test]
    fn count_windows_fire_and_purge_every_n_records() {
        let (mut op, seen, _) = operator(WindowAssigner::Count { count: 3 }, 0, sum());
        let mut batch: Vec<Event> = (1..=7).map(|v| (1, v)).collect();
        op.process_batch(&mut batch).unwrap();
        assert_eq!(seen.take(), ["(1, 6)", "(1, 15)"]);
    }

    fn late_records(metrics: &crate::operator::TaskMetrics) -> u64 {
        metrics.records_late.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn a_late_record_that_opens_a_window_the_watermark_passed_fires_it_at_once_each_time() {
        // Flink's EventTimeTrigger.onElement: FIRE when window.maxTimestamp() <= watermark.
        let (mut op, seen, metrics) = operator(TumblingEventTimeWindows::of(ms(10)), 10, sum());
        op.process_watermark(15).unwrap();
        assert_eq!(seen.take(), ["W15"]);
        // [0, 10) is new, past the watermark, within the lateness (cleanup at 19).
        send(&mut op, &[(1, 5, 5), (1, 7, 7), (2, 1, 3)]);
        assert_eq!(seen.take(), ["(1, 5)@9", "(1, 12)@9", "(2, 1)@9"], "each record fires at once");
        // No timer at 9 was left behind: the next watermarks fire nothing again.
        op.process_watermark(16).unwrap();
        assert_eq!(seen.take(), ["W16"]);
        op.process_watermark(19).unwrap();
        assert_eq!(seen.take(), ["W19"]);
        send(&mut op, &[(1, 100, 8)]);
        assert_eq!(seen.take(), Vec::<String>::new(), "past the cleanup time: late");
        assert_eq!(late_records(&metrics), 1);
        // Sliding: both windows past the watermark fire, each at its own end.
        let assigner = SlidingEventTimeWindows::of(ms(10), ms(5));
        let (mut op, seen, _) = operator(assigner, 25, ProcessLogic(Describe));
        op.process_watermark(30).unwrap();
        send(&mut op, &[(1, 1, 7)]);
        assert_eq!(seen.take(), ["W30", "\"1 [5, 15) [(1, 1)]\"@14", "\"1 [0, 10) [(1, 1)]\"@9"]);
    }

    #[test]
    fn a_late_record_that_extends_a_session_the_watermark_passed_fires_the_merged_session_at_once() {
        let assigner = EventTimeSessionWindows::with_gap(ms(5));
        let (mut op, seen, metrics) = operator(assigner, 20, AggregateLogic(CountAndSum, std::marker::PhantomData));
        op.process_watermark(20).unwrap();
        send(&mut op, &[(1, 1, 3)]);
        assert_eq!(seen.take(), ["W20", "\"1x1\"@7"], "[3, 8): past the watermark, fires at once");
        send(&mut op, &[(1, 2, 6)]);
        assert_eq!(seen.take(), ["\"2x3\"@10"], "merged into [3, 11), which fires at once");
        op.process_watermark(26).unwrap();
        assert_eq!(seen.take(), ["W26"], "no timer of [3, 8) or [3, 11) fires again");
        // Inside [3, 11): no merge, and it fires once more. Its cleanup timer moved with the
        // merge: it goes at 10 + 20.
        send(&mut op, &[(1, 4, 4)]);
        assert_eq!(seen.take(), ["\"3x7\"@10"]);
        op.process_watermark(30).unwrap();
        assert_eq!(seen.take(), ["W30"]);
        send(&mut op, &[(1, 8, 2)]);
        assert_eq!(seen.take(), Vec::<String>::new(), "[2, 7) is late and nothing is left to merge with");
        assert_eq!(late_records(&metrics), 1);
    }

    #[test]
    fn session_lateness_is_decided_on_the_merged_window() {
        // Flink's WindowOperator: merge first, then isWindowLate(the merged window).
        let assigner = EventTimeSessionWindows::with_gap(ms(5));
        let (mut op, seen, metrics) = operator(assigner, 3, AggregateLogic(CountAndSum, std::marker::PhantomData));
        send(&mut op, &[(1, 10, 10)]);
        op.process_watermark(14).unwrap();
        assert_eq!(seen.take(), ["\"1x10\"@14", "W14"]);
        // [5, 10) alone would be late (cleanup 9 + 3 <= 14), but it touches [10, 15): the
        // merged [5, 15) (cleanup 17) is not late, so the record is kept and fires it.
        send(&mut op, &[(1, 2, 5)]);
        assert_eq!(seen.take(), ["\"2x12\"@14"]);
        send(&mut op, &[(1, 3, 1)]);
        assert_eq!(seen.take(), ["\"3x15\"@14"], "[1, 6) overlaps [5, 15)");
        assert_eq!(late_records(&metrics), 0);
        // [-10, -5) touches nothing: late on its own.
        send(&mut op, &[(1, 100, -10)]);
        assert_eq!(seen.take(), Vec::<String>::new());
        assert_eq!(late_records(&metrics), 1);
        op.process_watermark(17).unwrap();
        assert_eq!(seen.take(), ["W17"]);
        send(&mut op, &[(1, 4, 9)]);
        assert_eq!(seen.take(), Vec::<String>::new());
        assert_eq!(late_records(&metrics), 2, "[1, 15) is gone at 14 + 3, and [9, 14) alone is late");
    }

    /// Processing time under the test's control.
    #[derive(Default)]
    struct TestClock(std::sync::atomic::AtomicU64);
    impl TestClock {
        fn set(&self, now_ms: u64) {
            self.0.store(now_ms, std::sync::atomic::Ordering::Relaxed);
        }
    }
    impl crate::operator::Clock for TestClock {
        fn now_ms(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    fn context_at(now_ms: u64) -> (TaskContext, Arc<TestClock>) {
        let clock = Arc::new(TestClock::default());
        clock.set(now_ms);
        let mut ctx = TaskContext::for_test(0, 1, 128);
        ctx.clock = clock.clone();
        (ctx, clock)
    }

    #[test]
    fn processing_time_tumbling_windows_fire_on_the_clock_not_the_watermark() {
        let (ctx, clock) = context_at(1_003);
        let (mut op, seen, _) = operator_in(ctx, TumblingProcessingTimeWindows::of(ms(10)), 0, sum());
        op.process_batch(&mut vec![(1, 1), (2, 4)]).unwrap();
        clock.set(1_009);
        op.process_batch(&mut vec![(1, 2)]).unwrap();
        assert_eq!(op.next_timer(), Some(1_009), "[1000, 1010) fires at its last millisecond");
        op.process_watermark(5_000).unwrap();
        op.fire_timers(1_008).unwrap();
        assert_eq!(seen.take(), ["W5000"]);
        clock.set(1_012);
        op.process_batch(&mut vec![(1, 8)]).unwrap();
        op.fire_timers(1_012).unwrap();
        let mut fired = seen.take();
        fired.sort();
        assert_eq!(fired, ["(1, 3)", "(2, 4)"]);
        op.fire_timers(1_019).unwrap();
        assert_eq!(seen.take(), ["(1, 8)"]);
        assert_eq!(op.next_timer(), None);
    }

    #[derive(Clone)]
    struct Clocks;
    impl KeyedProcessFunction<u64, Event, String> for Clocks {
        fn process_element(
            &mut self,
            _: Event,
            ctx: &mut KeyedContext<'_, u64>,
            out: &mut Collector<'_, String>,
        ) -> FnResult {
            out.collect(format!("element {:?}", ctx.time_domain()));
            ctx.register_processing_time_timer(1_050);
            if let Some(at) = ctx.timestamp() {
                ctx.register_event_time_timer(at + 10);
            }
            Ok(())
        }
        fn on_timer(
            &mut self,
            timestamp: i64,
            ctx: &mut KeyedContext<'_, u64>,
            out: &mut Collector<'_, String>,
        ) -> FnResult {
            out.collect(format!("{timestamp} {:?}", ctx.time_domain()));
            Ok(())
        }
    }

    #[test]
    fn on_timer_tells_the_time_domain_of_the_timer() {
        let (ctx, _clock) = context_at(1_000);
        let seen = Seen::default();
        let mut op = KeyedProcessOperator::new(&ctx, Clocks, Arc::new(|e: &Event| e.0), Box::new(seen.clone()));
        op.declare_states().unwrap();
        let mut op: Box<dyn Operator<Event>> = Box::new(op);
        send(&mut op, &[(1, 0, 5)]);
        op.process_watermark(20).unwrap();
        op.fire_timers(1_050).unwrap();
        assert_eq!(
            seen.take(),
            ["\"element None\"@5", "\"15 Some(EventTime)\"@15", "W20", "\"1050 Some(ProcessingTime)\""]
        );
    }

    /// A watermark strategy (timestamps from the value) in front of a tumbling window, with
    /// `pipeline.auto-watermark-interval` = `interval_ms`; what came out at each clock time.
    fn watermarks_every(interval_ms: u64, at: &[u64]) -> Vec<Vec<String>> {
        let (mut ctx, clock) = context_at(1_000);
        ctx.auto_watermark_interval_ms = interval_ms;
        let (window, seen, _) = operator(TumblingEventTimeWindows::of(ms(10)), 0, sum());
        let strategy = crate::watermarks::WatermarkStrategy::<Event>::for_monotonous_timestamps()
            .with_timestamp_assigner(|e: &Event, _| e.1 as i64);
        let mut op = crate::operators::TimestampsAndWatermarksOperator::new(&ctx, &strategy, window);
        op.process_batch(&mut vec![(1, 5), (1, 12)]).unwrap();
        at.iter()
            .map(|&now| {
                clock.set(now);
                op.fire_timers(now).unwrap();
                seen.take()
            })
            .collect()
    }

    #[test]
    fn auto_watermark_interval_decides_when_watermarks_and_so_windows_come() {
        let fired = || vec!["(1, 5)@9".to_string(), "W11".to_string()];
        let none = Vec::<String>::new;
        assert_eq!(watermarks_every(100, &[1_050, 1_100, 1_300]), [none(), fired(), none()]);
        assert_eq!(watermarks_every(300, &[1_050, 1_100, 1_300]), [none(), none(), fired()]);
        assert_eq!(
            watermarks_every(0, &[1_050, 1_100, 1_300, 100_000]),
            [none(), none(), none(), none()],
            "0: only the final one"
        );
    }

    #[test]
    fn an_event_time_window_without_timestamps_fails_naming_the_fix() {
        let (mut op, _, _) = operator(TumblingEventTimeWindows::of(ms(10)), 0, sum());
        let error = op.process_batch(&mut vec![(1, 1)]).unwrap_err().to_string();
        assert!(error.contains("assign_timestamps_and_watermarks"), "{error}");
    }
}
