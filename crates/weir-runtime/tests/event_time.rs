//! Event time and streams with more than one input, end to end in one process at several
//! parallelisms: watermarks across channels, windows firing at the end of a bounded input,
//! idle inputs that do not hold back the watermark, union, connect (keyed or not) and the
//! broadcast state pattern.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use weir_api::prelude::*;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::JobStatus;

fn run(env: &StreamExecutionEnvironment, p: u32) {
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("event-time").unwrap(), JobSettings::with_parallelism(p)).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(60))), JobStatus::Finished, "p={p}: {:?}", job.details());
}

/// Event `i`: user `i % 7`, at `i * 10` ms give or take 40 ms (out of order, within 100 ms).
fn events(n: u64) -> Vec<(u64, i64)> {
    (0..n).map(|i| (i % 7, (i * 10) as i64 + [0, 40, -40, 20, -20][(i % 5) as usize])).collect()
}

fn strategy() -> WatermarkStrategy<(u64, i64)> {
    WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(100))
        .with_timestamp_assigner(|event: &(u64, i64), _| event.1)
}

#[derive(Clone)]
struct CountPerWindow;

impl ProcessWindowFunction<u64, (u64, i64), (u64, i64, usize)> for CountPerWindow {
    fn process(
        &mut self,
        key: &u64,
        context: &WindowContext<'_>,
        elements: &[(u64, i64)],
        out: &mut Collector<'_, (u64, i64, usize)>,
    ) -> FnResult {
        out.collect((*key, context.window.start, elements.len()));
        Ok(())
    }
}

#[test]
fn event_time_windows_over_channels_fire_once_each_at_every_parallelism() {
    let input = events(20_000);
    // Independently: per user and 1-second window start, the number of events.
    let mut expected: BTreeMap<(u64, i64), usize> = BTreeMap::new();
    for (user, at) in &input {
        *expected.entry((*user, at.div_euclid(1000) * 1000)).or_default() += 1;
    }
    for p in [1u32, 2, 3] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        env.from_source_with_watermarks(VecSource::new(input.clone()), strategy())
            .key_by(|e: &(u64, i64)| e.0)
            .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
            .process(CountPerWindow)
            .sink_to(sink.clone());
        run(&env, p);
        let mut seen: BTreeMap<(u64, i64), usize> = BTreeMap::new();
        for (user, start, count) in sink.records() {
            assert!(seen.insert((user, start), count).is_none(), "p={p}: window ({user}, {start}) fired twice");
        }
        assert_eq!(seen, expected, "p={p}");
    }
}

#[test]
fn union_and_connect_read_every_record_of_both_inputs() {
    #[derive(Clone)]
    struct Label;
    impl CoProcessFunction<u64, String, String> for Label {
        fn process_element1(&mut self, value: u64, out: &mut Collector<'_, String>) -> FnResult {
            out.collect(format!("n{value}"));
            Ok(())
        }
        fn process_element2(&mut self, value: String, out: &mut Collector<'_, String>) -> FnResult {
            out.collect(format!("s{value}"));
            Ok(())
        }
    }
    for p in [1u32, 2] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let a = env.from_source(VecSource::new((0..500u64).collect()));
        let b = env.from_source(VecSource::new((500..800u64).collect()));
        let c = env.from_source(VecSource::new((800..1000u64).collect())).rebalance();
        let words = env.from_source(VecSource::new((0..100u64).map(|i| i.to_string()).collect()));
        a.union(&[b, c]).connect(&words).process(Label).sink_to(sink.clone());
        run(&env, p);
        let mut seen = sink.records();
        seen.sort();
        let mut expected: Vec<String> = (0..1000u64).map(|i| format!("n{i}")).collect();
        expected.extend((0..100u64).map(|i| format!("s{i}")));
        expected.sort();
        assert_eq!(seen, expected, "p={p}");
    }
}

/// Orders joined with the newest price of their product, keyed by product.
#[derive(Clone)]
struct Enrich {
    price: ValueState<u64>,
    waiting: ListState<u64>,
}

impl KeyedCoProcessFunction<u64, (u64, u64), (u64, u64), String> for Enrich {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.price.declaration(), self.waiting.declaration()]
    }
    fn process_element1(
        &mut self,
        order: (u64, u64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        match ctx.value(&self.price)?.get().copied() {
            Some(price) => out.collect(format!("order {} of {} at {price}", order.1, order.0)),
            None => ctx.list(&self.waiting)?.add(order.1),
        }
        Ok(())
    }
    fn process_element2(
        &mut self,
        price: (u64, u64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        ctx.value(&self.price)?.set(price.1);
        let waiting = ctx.list(&self.waiting)?.get().to_vec();
        for order in waiting {
            out.collect(format!("order {order} of {} at {}", price.0, price.1));
        }
        ctx.list(&self.waiting)?.clear();
        Ok(())
    }
}

#[test]
fn keyed_connect_shares_each_keys_state_between_both_inputs() {
    for p in [1u32, 2, 4] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let orders = env.from_source(VecSource::new((0..300u64).map(|i| (i % 10, i)).collect()));
        let prices = env.from_source(VecSource::new((0..10u64).map(|p| (p, p * 100)).collect()));
        let enrich = Enrich { price: ValueState::new("price"), waiting: ListState::new("waiting") };
        orders
            .key_by(|o: &(u64, u64)| o.0)
            .connect(&prices.key_by(|p: &(u64, u64)| p.0))
            .process(enrich)
            .sink_to(sink.clone());
        run(&env, p);
        let mut seen = sink.records();
        seen.sort();
        let mut expected: Vec<String> =
            (0..300u64).map(|i| format!("order {i} of {} at {}", i % 10, (i % 10) * 100)).collect();
        expected.sort();
        assert_eq!(seen, expected, "p={p}");
    }
}

/// Each record of the keyed side is tagged with the rule its key's parity names; records that
/// come before their rule wait in keyed state until the final watermark.
#[derive(Clone)]
struct ApplyRules {
    waiting: ListState<u64>,
}

impl KeyedBroadcastProcessFunction<u64, u64, (u64, String), u64, String, String> for ApplyRules {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.waiting.declaration()]
    }
    fn process_element(
        &mut self,
        value: u64,
        ctx: &mut KeyedContext<'_, u64>,
        rules: &BroadcastState<u64, String>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        match rules.get(&(value % 2)) {
            Some(rule) => out.collect(format!("{value}:{rule}")),
            None => {
                // Until the rule arrives; the final watermark fires this timer after it did.
                ctx.list(&self.waiting)?.add(value);
                ctx.register_event_time_timer(i64::MAX - 1);
            }
        }
        Ok(())
    }
    fn process_broadcast_element(
        &mut self,
        rule: (u64, String),
        rules: &mut BroadcastState<u64, String>,
        _out: &mut Collector<'_, String>,
    ) -> FnResult {
        rules.put(rule.0, rule.1);
        Ok(())
    }
    fn on_timer(
        &mut self,
        _timestamp: i64,
        ctx: &mut KeyedContext<'_, u64>,
        rules: &BroadcastState<u64, String>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        for value in ctx.list(&self.waiting)?.get().to_vec() {
            let rule = rules.get(&(value % 2)).ok_or("the rules never arrived")?;
            out.collect(format!("{value}:{rule}"));
        }
        ctx.list(&self.waiting)?.clear();
        Ok(())
    }
}

#[test]
fn broadcast_state_reaches_every_subtask() {
    for p in [1u32, 3] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let rules = env.from_source(VecSource::new(vec![(0u64, "even".to_string()), (1, "odd".to_string())]));
        let values = env.from_source(VecSource::new((0..200u64).collect()));
        values
            .key_by(|v: &u64| *v)
            .connect_broadcast(&rules.broadcast())
            .process("rules", ApplyRules { waiting: ListState::new("waiting") })
            .sink_to(sink.clone());
        run(&env, p);
        let mut seen = sink.records();
        seen.sort();
        let mut expected: Vec<String> =
            (0..200u64).map(|v| format!("{v}:{}", if v % 2 == 0 { "even" } else { "odd" })).collect();
        expected.sort();
        assert_eq!(seen, expected, "p={p}: every subtask has both rules");
    }
}

#[test]
fn an_idle_input_does_not_hold_back_the_watermark_once_marked_idle() {
    // A paced endless input with timestamps, unioned with an input that never sends a record.
    let windows_fired_within = |idleness: Option<Duration>, wait: Duration| -> usize {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let live = env
            .from_source(EndlessSource::paced(10, Duration::from_millis(5)))
            .map(|i: u64| (i % 3, (i * 10) as i64))
            .assign_timestamps_and_watermarks(strategy());
        let mut silent =
            WatermarkStrategy::for_monotonous_timestamps().with_timestamp_assigner(|e: &(u64, i64), _| e.1);
        if let Some(idleness) = idleness {
            silent = silent.with_idleness(idleness);
        }
        let never = env
            .from_source(EndlessSource::paced(1, Duration::from_millis(5)))
            .filter(|_| false)
            .map(|i: u64| (i, 0i64))
            .assign_timestamps_and_watermarks(silent);
        live.union(&[never])
            .key_by(|e: &(u64, i64)| e.0)
            .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
            .reduce(|a, b| (a.0, a.1.max(b.1)))
            .sink_to(sink.clone());
        let dispatcher = Dispatcher::new("localhost");
        let job = dispatcher.submit(env.build("idle").unwrap(), JobSettings::with_parallelism(1)).unwrap();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && sink.records().is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let fired = sink.records().len();
        job.cancel().unwrap();
        job.wait_terminal(Some(Duration::from_secs(10)));
        fired
    };
    assert_eq!(windows_fired_within(None, Duration::from_millis(1500)), 0, "a silent input holds the watermark back");
    assert!(
        windows_fired_within(Some(Duration::from_millis(200)), Duration::from_secs(20)) > 0,
        "idleness did not release it"
    );
}

#[test]
fn window_join_pairs_every_left_and_right_of_a_key_in_the_same_window() {
    // (user, n, at): left every 7 ms, right every 11 ms, over 5 users.
    let left: Vec<(u64, u64, i64)> = (0..2000u64).map(|i| (i % 5, i, (i * 7) as i64)).collect();
    let right: Vec<(u64, u64, i64)> = (0..1300u64).map(|i| (i % 5, i, (i * 11) as i64)).collect();
    let mut expected: Vec<String> = Vec::new();
    for l in &left {
        for r in &right {
            if l.0 == r.0 && l.2.div_euclid(500) == r.2.div_euclid(500) {
                expected.push(format!("{}:{}-{}", l.0, l.1, r.1));
            }
        }
    }
    expected.sort();
    let stamp = || {
        WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(100))
            .with_timestamp_assigner(|e: &(u64, u64, i64), _| e.2)
    };
    for p in [1u32, 2] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let l = env.from_source_with_watermarks(VecSource::new(left.clone()), stamp());
        let r = env.from_source_with_watermarks(VecSource::new(right.clone()), stamp());
        l.join(&r)
            .where_key(|e: &(u64, u64, i64)| e.0)
            .equal_to(|e: &(u64, u64, i64)| e.0)
            .window(TumblingEventTimeWindows::of(Duration::from_millis(500)))
            .apply(|a: &(u64, u64, i64), b: &(u64, u64, i64)| format!("{}:{}-{}", a.0, a.1, b.1))
            .sink_to(sink.clone());
        run(&env, p);
        let mut seen = sink.records();
        seen.sort();
        assert_eq!(seen.len(), expected.len(), "p={p}");
        assert_eq!(seen, expected, "p={p}");
    }
}

#[test]
fn interval_join_pairs_records_within_the_bounds_exactly_once() {
    #[derive(Clone)]
    struct Pair;
    impl ProcessJoinFunction<(u64, i64), (u64, i64), String> for Pair {
        fn process_element(
            &mut self,
            left: &(u64, i64),
            right: &(u64, i64),
            out: &mut Collector<'_, String>,
        ) -> FnResult {
            out.collect(format!("{}@{}-{}", left.0, left.1, right.1));
            Ok(())
        }
    }
    let left: Vec<(u64, i64)> = (0..1500u64).map(|i| (i % 4, (i * 13) as i64)).collect();
    let right: Vec<(u64, i64)> = (0..1500u64).map(|i| (i % 4, (i * 13 + 5) as i64)).collect();
    let mut expected = Vec::new();
    for l in &left {
        for r in &right {
            if l.0 == r.0 && l.1 - 60 <= r.1 && r.1 <= l.1 + 30 {
                expected.push(format!("{}@{}-{}", l.0, l.1, r.1));
            }
        }
    }
    expected.sort();
    let stamp = || {
        WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(100))
            .with_timestamp_assigner(|e: &(u64, i64), _| e.1)
    };
    for p in [1u32, 3] {
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        let l = env.from_source_with_watermarks(VecSource::new(left.clone()), stamp()).key_by(|e: &(u64, i64)| e.0);
        let r = env.from_source_with_watermarks(VecSource::new(right.clone()), stamp()).key_by(|e: &(u64, i64)| e.0);
        l.interval_join(&r).between(-60, 30).process(Pair).sink_to(sink.clone());
        run(&env, p);
        let mut seen = sink.records();
        seen.sort();
        assert_eq!(seen, expected, "p={p}");
    }
}

#[test]
fn side_outputs_carry_what_a_process_function_routes_there() {
    #[derive(Clone)]
    struct SplitOdd(OutputTag<String>);
    impl ProcessFunction<u64, u64> for SplitOdd {
        fn process_element(&mut self, value: u64, out: &mut Collector<'_, u64>) -> FnResult {
            if value % 2 == 1 {
                out.output(&self.0, format!("odd {value}"))?;
            } else {
                out.collect(value);
            }
            Ok(())
        }
    }
    for p in [1u32, 2] {
        let odd = OutputTag::<String>::new("odd");
        let (evens, odds) = (CollectSink::default(), CollectSink::default());
        let env = StreamExecutionEnvironment::new();
        let main = env.from_source(VecSource::new((0..1000u64).collect())).process(SplitOdd(odd.clone()));
        main.get_side_output(&odd).sink_to(odds.clone());
        main.sink_to(evens.clone());
        run(&env, p);
        let mut seen = evens.records();
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).step_by(2).collect::<Vec<u64>>(), "p={p}");
        let mut seen = odds.records();
        seen.sort();
        let mut expected: Vec<String> = (1..1000).step_by(2).map(|v| format!("odd {v}")).collect();
        expected.sort();
        assert_eq!(seen, expected, "p={p}");
    }
}

#[test]
fn records_too_late_for_their_window_go_to_the_late_side_output_and_nowhere_else() {
    // Record i at i * 100 ms; every 50th from i = 500 on is 20 s late (well past the 1 s bound).
    let late = OutputTag::<(u64, i64, bool)>::new("late");
    let (windows, lates) = (CollectSink::default(), CollectSink::default());
    let env = StreamExecutionEnvironment::new();
    let counted = env
        .from_source(EndlessSource::paced(10, Duration::from_millis(20)))
        .parallelism(1)
        .map(|i: u64| {
            let is_late = i >= 500 && i.is_multiple_of(50);
            (i % 3, (i * 100) as i64 - if is_late { 20_000 } else { 0 }, is_late)
        })
        .assign_timestamps_and_watermarks(
            WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_secs(1))
                .with_timestamp_assigner(|e: &(u64, i64, bool), _| e.1),
        )
        .key_by(|e: &(u64, i64, bool)| e.0)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .side_output_late_data(&late)
        .aggregate(LateInWindow);
    counted.get_side_output(&late).sink_to(lates.clone());
    counted.sink_to(windows.clone());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("late").unwrap(), JobSettings::with_parallelism(2)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lates.records().len() < 5 {
        assert!(Instant::now() < deadline, "no late records arrived: {:?}", job.details());
        std::thread::sleep(Duration::from_millis(20));
    }
    job.cancel().unwrap();
    job.wait_terminal(Some(Duration::from_secs(10)));
    let lates = lates.records();
    assert!(lates.iter().all(|e| e.2), "an on-time record went to the late output: {lates:?}");
    let mut indices: Vec<i64> = lates.iter().map(|e| e.1).collect();
    indices.sort_unstable();
    indices.dedup();
    assert_eq!(indices.len(), lates.len(), "a late record went to the late output twice");
    assert!(
        windows.records().iter().all(|late_in_window| *late_in_window == 0),
        "a late record was counted in a window"
    );
    let late_metric: u64 = job.details().vertices.iter().flat_map(|v| &v.subtasks).map(|s| s.late_records).sum();
    assert!(late_metric >= lates.len() as u64, "late-records metric {late_metric} below {}", lates.len());
    let dropped: u64 = job
        .record()
        .subtasks
        .iter()
        .flatten()
        .map(|s| s.metrics.records_late_dropped.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert_eq!(dropped, 0, "records sent to the late output are late, not dropped (Flink's numLateRecordsDropped)");
}

/// Counts the records flagged late that a window holds (always 0 when lateness works).
#[derive(Clone)]
struct LateInWindow;

impl AggregateFunction<(u64, i64, bool), u64, u64> for LateInWindow {
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, value: (u64, i64, bool), acc: u64) -> u64 {
        acc + u64::from(value.2)
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

/// Counts the elements of each (key, window).
#[derive(Clone)]
struct CountValues;

impl ProcessWindowFunction<u64, u64, (u64, i64, usize)> for CountValues {
    fn process(
        &mut self,
        key: &u64,
        context: &WindowContext<'_>,
        elements: &[u64],
        out: &mut Collector<'_, (u64, i64, usize)>,
    ) -> FnResult {
        out.collect((*key, context.window.start, elements.len()));
        Ok(())
    }
}

/// Runs an endless event-time job (value `v` at `v * 10` ms, 1-second windows per `v % 5`)
/// at p=2 until a stop-with-savepoint, with or without drain; the windows that fired, and the
/// values each source subtask read (0 up to its count).
fn stop_endless_windows(drain: bool) -> (BTreeMap<(u64, i64), usize>, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let sink = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    let strategy = WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(100))
        .with_timestamp_assigner(|v: &u64, _| (*v * 10) as i64);
    env.from_source_with_watermarks(EndlessSource::paced(16, Duration::from_millis(2)), strategy)
        .key_by(|v: &u64| *v % 5)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .process(CountValues)
        .sink_to(sink.clone());
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.interval = Some(Duration::from_millis(100));
    settings.checkpointing.checkpoints_url = format!("file://{}/checkpoints", dir.path().display());
    settings.checkpointing.savepoints_url = Some(format!("file://{}/savepoints", dir.path().display()));
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("drain").unwrap(), settings).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Run until some windows fired and others are open.
    while sink.records().len() < 10 {
        assert!(Instant::now() < deadline, "no window fired: {:?}", job.details());
        std::thread::sleep(Duration::from_millis(20));
    }
    let request = job.trigger_stop(None, weir_api::snapshot::SnapshotFormat::Canonical, drain).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished, "{:?}", job.failure_cause());
    assert!(
        matches!(job.savepoint_status(&request), Some(weir_runtime::job_master::SavepointStatus::Completed(_))),
        "{:?}",
        job.savepoint_status(&request)
    );
    let read: Vec<u64> = job.details().vertices[0].subtasks.iter().map(|s| s.metrics.write_records).collect();
    let mut fired = BTreeMap::new();
    for (key, start, count) in sink.records() {
        assert!(fired.insert((key, start), count).is_none(), "window ({key}, {start}) fired twice");
    }
    (fired, read)
}

#[test]
fn stop_with_drain_fires_every_window_over_what_was_read_and_a_plain_stop_keeps_them_open() {
    let (fired, read) = stop_endless_windows(true);
    // Independently: every value each source subtask read, in its key's 1-second window.
    let mut expected: BTreeMap<(u64, i64), usize> = BTreeMap::new();
    for count in &read {
        for v in 0..*count {
            *expected.entry((v % 5, (v * 10) as i64 / 1000 * 1000)).or_default() += 1;
        }
    }
    assert!(read.iter().all(|n| *n > 0), "{read:?}");
    assert_eq!(fired, expected, "a drained stop fires each window once, over exactly what was read");

    // Without drain the newest windows stay open in the savepoint.
    let (fired, read) = stop_endless_windows(false);
    let counted: usize = fired.values().sum();
    assert!((counted as u64) < read.iter().sum::<u64>(), "a plain stop fired every window: {counted} of {read:?}");
}
