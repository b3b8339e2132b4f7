//! Operator state (list, union list, broadcast) through a stop-with-savepoint and a restore
//! at another parallelism, driven through the dispatcher as the CLI does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_api::prelude::*;
use weir_checkpoint::{SnapshotStorage, load_metadata, plan_restore};
use weir_runtime::checkpointing::RestoreSource;
use weir_runtime::job_master::SavepointStatus;
use weir_runtime::{Dispatcher, JobSettings};
use weir_types::{ExecutionState, JobStatus};

/// What a subtask restored: (subtask, list elements, union elements, broadcast elements).
type Restored = (u32, Vec<u64>, Vec<u32>, Vec<String>);

#[derive(Clone)]
struct CountingFunction {
    subtask: u32,
    count: u64,
    restored: Arc<Mutex<Vec<Restored>>>,
    snapshots: Arc<Mutex<BTreeMap<u32, u64>>>,
}

impl ProcessFunction<u64, u64> for CountingFunction {
    fn initialize_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        self.subtask = state.subtask().0;
        let counts: Vec<u64> = state.restored("counts")?;
        let union: Vec<u32> = state.restored("subtasks")?;
        let broadcast: Vec<String> = state.restored("config")?;
        self.count = counts.iter().sum();
        self.restored.lock().unwrap().push((self.subtask, counts, union, broadcast));
        Ok(())
    }

    fn process_element(&mut self, record: u64, out: &mut Collector<'_, u64>) -> FnResult {
        self.count += 1;
        out.collect(record);
        Ok(())
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateContext) -> FnResult {
        state.set_list_state("counts", &[self.count])?;
        state.set_union_list_state("subtasks", &[self.subtask])?;
        state.set_broadcast_state("config", &[format!("config-v1 from {}", self.subtask)])?;
        self.snapshots.lock().unwrap().insert(self.subtask, self.count);
        Ok(())
    }
}

fn job(function: CountingFunction) -> StreamExecutionEnvironment {
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(64, Duration::from_micros(200)))
        .uid("source")
        .rebalance()
        .process(function)
        .uid("counting")
        .sink_to(CollectSink::default())
        .uid("sink");
    env
}

#[test]
fn list_state_splits_union_state_unions_and_broadcast_state_copies_on_rescale() {
    let dir = tempfile::tempdir().unwrap();
    let snapshots = Arc::new(Mutex::new(BTreeMap::new()));
    let first = CountingFunction { subtask: 0, count: 0, restored: Arc::default(), snapshots: Arc::clone(&snapshots) };
    let mut settings = JobSettings::with_parallelism(3);
    settings.checkpointing.savepoints_url = Some(format!("file://{}", dir.path().display()));
    let dispatcher = Dispatcher::new("localhost");
    let job_1 = dispatcher.submit(job(first).build("operator-state").unwrap(), settings.clone()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !job_1
        .details()
        .vertices
        .iter()
        .flat_map(|v| &v.subtasks)
        .all(|s| s.status == weir_types::ExecutionState::Running)
    {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let request = job_1.trigger_savepoint(None, true).unwrap();
    assert_eq!(job_1.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished);
    let Some(SavepointStatus::Completed(location)) = job_1.savepoint_status(&request) else {
        panic!("savepoint did not complete: {:?}", job_1.savepoint_status(&request));
    };
    let at_savepoint = snapshots.lock().unwrap().clone();
    assert_eq!(at_savepoint.len(), 3);
    let total: u64 = at_savepoint.values().sum();
    assert!(total > 0);

    // Restore the same job at parallelism 5.
    let storage = SnapshotStorage::from_url(&location).unwrap();
    let blocking = storage.blocking();
    let metadata = blocking.block_on(load_metadata(&storage)).unwrap();
    let restored = Arc::new(Mutex::new(Vec::new()));
    let second = CountingFunction { subtask: 0, count: 0, restored: Arc::clone(&restored), snapshots: Arc::default() };
    let graph = job(second).build("operator-state").unwrap();
    let request = weir_runtime::checkpointing::restore::restore_request(&graph, |_| 5, None, false);
    let plan = plan_restore(&metadata, &request).unwrap();
    let mut settings = JobSettings::with_parallelism(5);
    settings.max_parallelism = Some(plan.max_parallelism);
    settings.restore = Some(Arc::new(RestoreSource { storage: blocking, location: location.clone(), metadata, plan }));
    let job_2 = dispatcher.submit(graph, settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while restored.lock().unwrap().len() < 5 {
        assert!(std::time::Instant::now() < deadline, "subtasks did not initialize");
        std::thread::sleep(Duration::from_millis(10));
    }
    job_2.cancel().unwrap();
    job_2.wait_terminal(Some(Duration::from_secs(10)));

    let restored = restored.lock().unwrap().clone();
    // Split: the three old counts, each to exactly one new subtask, balanced (3 over 5).
    let mut split: Vec<u64> = restored.iter().flat_map(|r| r.1.clone()).collect();
    split.sort_unstable();
    let mut expected: Vec<u64> = at_savepoint.values().copied().collect();
    expected.sort_unstable();
    assert_eq!(split, expected);
    assert!(restored.iter().all(|r| r.1.len() <= 1));
    // Union: every new subtask sees every old subtask's element.
    for r in &restored {
        let mut union = r.2.clone();
        union.sort_unstable();
        assert_eq!(union, vec![0, 1, 2], "subtask {}", r.0);
        // Broadcast: every new subtask gets old subtask 0's copy.
        assert_eq!(r.3, vec!["config-v1 from 0".to_string()], "subtask {}", r.0);
    }
}

/// Starts slowly: its subtasks stay INITIALIZING for a while after the job is RUNNING.
#[derive(Clone)]
struct SlowStart;

impl ProcessFunction<u64, u64> for SlowStart {
    fn initialize_state(&mut self, _state: &mut OperatorStateContext) -> FnResult {
        std::thread::sleep(Duration::from_millis(400));
        Ok(())
    }

    fn process_element(&mut self, record: u64, out: &mut Collector<'_, u64>) -> FnResult {
        out.collect(record);
        Ok(())
    }
}

/// A stop-with-savepoint asked for while the subtasks still start (the job is RUNNING a moment
/// before they are) waits for them instead of failing.
#[test]
fn a_savepoint_asked_for_while_subtasks_start_is_taken_once_they_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.savepoints_url = Some(format!("file://{}", dir.path().display()));
    let env = StreamExecutionEnvironment::new();
    env.from_source(EndlessSource::paced(64, Duration::from_micros(200)))
        .uid("source")
        .rebalance()
        .process(SlowStart)
        .uid("slow")
        .sink_to(CollectSink::default())
        .uid("sink");
    let dispatcher = Dispatcher::new("localhost");
    let job = dispatcher.submit(env.build("slow start").unwrap(), settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while job.status() != JobStatus::Running {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let starting = job.details().vertices.iter().flat_map(|v| &v.subtasks).any(|s| s.status != ExecutionState::Running);
    assert!(starting, "the slow subtasks already run; the test would prove nothing");
    let request = job.trigger_savepoint(None, true).unwrap();
    assert_eq!(job.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished);
    let status = job.savepoint_status(&request);
    let Some(SavepointStatus::Completed(location)) = status else { panic!("savepoint not taken: {status:?}") };
    assert!(std::path::Path::new(location.trim_start_matches("file://")).join("_metadata").is_file(), "{location}");
}

/// Tags each value with the rule its parity names, or "missing" when the subtask has no rule.
#[derive(Clone)]
struct TagWithRule;

impl KeyedBroadcastProcessFunction<u64, u64, (u64, String), u64, String, String> for TagWithRule {
    fn process_element(
        &mut self,
        value: u64,
        _ctx: &mut KeyedContext<'_, u64>,
        rules: &BroadcastState<u64, String>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        out.collect(rules.get(&(value % 2)).cloned().unwrap_or_else(|| "missing".into()));
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
}

fn broadcast_job(sink: CollectSink<String>) -> StreamExecutionEnvironment {
    let env = StreamExecutionEnvironment::new();
    let rules = env.from_source(VecSource::new(vec![(0u64, "even".to_string()), (1, "odd".to_string())])).uid("rules");
    env.from_source(EndlessSource::paced(16, Duration::from_millis(1)))
        .uid("values")
        .key_by(|v: &u64| *v)
        .connect_broadcast(&rules.broadcast())
        .process("rules", TagWithRule)
        .uid("tagger")
        .sink_to(sink)
        .uid("sink");
    env
}

#[test]
fn keyed_broadcast_state_is_copied_to_every_subtask_on_rescale() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = JobSettings::with_parallelism(2);
    settings.checkpointing.savepoints_url = Some(format!("file://{}", dir.path().display()));
    settings.checkpointing.checkpoints_url = format!("file://{}/chk", dir.path().display());
    // Periodic checkpoints keep the finished rules source taking part in snapshots.
    settings.checkpointing.interval = Some(Duration::from_millis(100));
    let dispatcher = Dispatcher::new("localhost");
    let first = CollectSink::default();
    let job_1 = dispatcher.submit(broadcast_job(first.clone()).build("rules").unwrap(), settings).unwrap();
    // Both rules reached both subtasks once values come out tagged on each of them.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while first.records().iter().rev().take(50).filter(|r| *r != "missing").count() < 50 {
        assert!(std::time::Instant::now() < deadline, "the rules never arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
    let request = job_1.trigger_savepoint(None, true).unwrap();
    assert_eq!(job_1.wait_terminal(Some(Duration::from_secs(20))), JobStatus::Finished);
    let Some(SavepointStatus::Completed(location)) = job_1.savepoint_status(&request) else {
        panic!("savepoint did not complete: {:?}", job_1.savepoint_status(&request));
    };

    // At parallelism 4 the rules source has finished and sends nothing: the rules every new
    // subtask knows come from the restored broadcast state.
    let storage = SnapshotStorage::from_url(&location).unwrap();
    let blocking = storage.blocking();
    let metadata = blocking.block_on(load_metadata(&storage)).unwrap();
    let second = CollectSink::default();
    let graph = broadcast_job(second.clone()).build("rules").unwrap();
    let request = weir_runtime::checkpointing::restore::restore_request(&graph, |_| 4, None, false);
    let plan = plan_restore(&metadata, &request).unwrap();
    let mut settings = JobSettings::with_parallelism(4);
    settings.max_parallelism = Some(plan.max_parallelism);
    settings.restore = Some(Arc::new(RestoreSource { storage: blocking, location, metadata, plan }));
    let job_2 = dispatcher.submit(graph, settings).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while second.records().len() < 2000 {
        assert!(std::time::Instant::now() < deadline, "the restored job produced too little");
        std::thread::sleep(Duration::from_millis(20));
    }
    job_2.cancel().unwrap();
    job_2.wait_terminal(Some(Duration::from_secs(10)));
    let tagged = second.records();
    let missing = tagged.iter().filter(|r| *r == "missing").count();
    assert_eq!(missing, 0, "{missing} of {} values met a subtask without the rules", tagged.len());
    assert!(tagged.iter().any(|r| r == "even") && tagged.iter().any(|r| r == "odd"));
}
