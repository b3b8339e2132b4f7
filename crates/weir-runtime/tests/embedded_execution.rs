//! Jobs run end to end inside one process: keyed state across parallel subtasks, chaining,
//! timers, failure and cancellation.

use std::collections::HashMap;
use std::time::Duration;

use weir_api::prelude::*;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::{ExecutionState, JobStatus};

fn settings(p: u32) -> JobSettings {
    JobSettings::with_parallelism(p)
}

#[test]
fn keyed_counts_are_exact_at_every_parallelism() {
    for p in [1u32, 2, 4] {
        let users = 37u64;
        let events: Vec<u64> = (0..20_000u64).map(|i| i % users).collect();
        let sink = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        env.from_source(VecSource::new(events))
            .uid("source")
            .key_by(|u: &u64| *u)
            .process(RunningCount::default())
            .uid("counter")
            .sink_to(sink.clone())
            .uid("sink");
        let dispatcher = Dispatcher::new("localhost");
        let job = dispatcher.submit(env.build("count").unwrap(), settings(p)).unwrap();
        assert_eq!(job.wait_terminal(Some(Duration::from_secs(30))), JobStatus::Finished, "p={p}");

        let mut per_user: HashMap<u64, Vec<u64>> = HashMap::new();
        for (user, count) in sink.records() {
            per_user.entry(user).or_default().push(count);
        }
        assert_eq!(per_user.len() as u64, users);
        for (user, mut counts) in per_user {
            counts.sort_unstable();
            let expected: Vec<u64> = (1..=counts.len() as u64).collect();
            assert_eq!(counts, expected, "user {user} at p={p}");
            let events_of_user = (0..20_000u64).filter(|i| i % users == user).count();
            assert_eq!(counts.len(), events_of_user);
        }
        let details = job.details();
        assert_eq!(details.vertices.len(), 2);
        assert!(details.vertices.iter().all(|v| v.parallelism == p && v.max_parallelism == 128));
        assert!(details.vertices.iter().flat_map(|v| &v.subtasks).all(|s| s.status == ExecutionState::Finished));
        for state in ["INITIALIZING", "CREATED", "RUNNING", "FINISHED"] {
            assert!(details.timestamps.contains_key(state), "{state} missing in {:?}", details.timestamps);
        }
    }
}

#[test]
fn a_failing_user_function_fails_the_job_with_its_error() {
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..1000u64).collect()))
        .key_by(|v: &u64| *v)
        .process(FailOn(500))
        .name("validator")
        .sink_to(CollectSink::default());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("failing").unwrap(), settings(2)).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(30))), JobStatus::Failed);
    let cause = job.failure_cause().unwrap();
    assert!(cause.contains("refusing record 500") && cause.contains("validator"), "{cause}");
    let exceptions = job.exceptions();
    assert_eq!(exceptions[0].exception_name, "UserFunctionError");
    let details = job.details();
    assert!(details.timestamps.contains_key("FAILING"));
}

#[test]
fn a_panicking_map_fails_the_job_instead_of_crashing() {
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new((0..100u64).collect()))
        .map(|v: u64| if v == 42 { panic!("boom at {v}") } else { v })
        .sink_to(CollectSink::default());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("panicking").unwrap(), settings(1)).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(30))), JobStatus::Failed);
    assert!(job.failure_cause().unwrap().contains("boom at 42"));
}

#[test]
fn cancelling_an_unbounded_job_ends_canceled_even_under_backpressure() {
    let env = StreamExecutionEnvironment::new();
    // A slow sink keeps the channels full so the source is blocked when the cancel comes.
    env.from_source(EndlessSource::new())
        .key_by(|v: &u64| *v % 10)
        .process(FailOn(u64::MAX))
        .map(|v| {
            std::thread::sleep(Duration::from_micros(50));
            v
        })
        .sink_to(CollectSink::default());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("endless").unwrap(), settings(2)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(job.status(), JobStatus::Running);
    job.cancel().unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(10))), JobStatus::Canceled);
    let details = job.details();
    assert!(details.vertices.iter().flat_map(|v| &v.subtasks).all(|s| s.status == ExecutionState::Canceled));
    assert!(job.cancel().is_err(), "a second cancel of an ended job is refused");
}

#[derive(Clone)]
struct TimerEcho {
    seen: ValueState<u64>,
}

impl KeyedProcessFunction<u64, u64, String> for TimerEcho {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.seen.declaration()]
    }

    fn process_element(
        &mut self,
        value: u64,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, String>,
    ) -> FnResult {
        ctx.value(&self.seen)?.set(value);
        let at = ctx.current_processing_time() + 50;
        ctx.register_processing_time_timer(at);
        Ok(())
    }

    fn on_timer(&mut self, _ts: i64, ctx: &mut KeyedContext<'_, u64>, out: &mut Collector<'_, String>) -> FnResult {
        let key = *ctx.current_key();
        let seen = ctx.value(&self.seen)?.get().copied().unwrap_or_default();
        out.collect(format!("timer {key} {seen}"));
        Ok(())
    }
}

#[test]
fn processing_time_timers_fire_for_their_key() {
    let sink = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::new())
        .filter(|v: &u64| *v < 3)
        .key_by(|v: &u64| *v)
        .process(TimerEcho { seen: ValueState::new("seen") })
        .sink_to(sink.clone());
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("timers").unwrap(), settings(1)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sink.records().len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    job.cancel().unwrap();
    job.wait_terminal(Some(Duration::from_secs(10)));
    let mut fired = sink.records();
    fired.sort();
    assert_eq!(fired, vec!["timer 0 0", "timer 1 1", "timer 2 2"]);
}

/// Two unconnected pipelines; the second fails once, after the first has written all its
/// output. Region failover restarts only the failing pipeline (the first one's output stays
/// single); `failover_full` restarts both (the first one runs again).
#[test]
fn a_failure_restarts_only_its_pipelined_region_unless_failover_is_full() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    use weir_runtime::restart::RestartStrategyConfig;

    for failover_full in [false, true] {
        let steady = CollectSink::default();
        let flaky = CollectSink::default();
        let env = StreamExecutionEnvironment::new();
        env.from_source(VecSource::new((0..100u64).collect()))
            .uid("steady-source")
            .map(|x: u64| x)
            .sink_to(steady.clone())
            .uid("steady-sink");
        let failed = Arc::new(AtomicBool::new(false));
        let steady_seen = steady.clone();
        env.from_source(VecSource::new((0..100u64).collect()))
            .uid("flaky-source")
            .map(move |x: u64| {
                if x == 50 && !failed.swap(true, Ordering::SeqCst) {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while steady_seen.records().len() < 100 && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    panic!("injected failure at {x}");
                }
                x
            })
            .sink_to(flaky.clone())
            .uid("flaky-sink");
        let mut job_settings = settings(1);
        job_settings.restart = RestartStrategyConfig::FixedDelay { attempts: 3, delay: Duration::ZERO };
        job_settings.failover_full = failover_full;
        let dispatcher = Dispatcher::new("localhost");
        let job = dispatcher.submit(env.build("regions").unwrap(), job_settings).unwrap();
        let status = job.wait_terminal(Some(Duration::from_secs(30)));
        assert_eq!(status, JobStatus::Finished, "full={failover_full}: {:?}", job.failure_cause());
        assert_eq!(job.record().restarts, 1, "full={failover_full}");
        let expected_steady = if failover_full { 200 } else { 100 };
        assert_eq!(steady.records().len(), expected_steady, "full={failover_full}");
        let mut flaky_values = flaky.records();
        flaky_values.sort_unstable();
        flaky_values.dedup();
        assert_eq!(flaky_values, (0..100u64).collect::<Vec<_>>(), "full={failover_full}");
    }
}
