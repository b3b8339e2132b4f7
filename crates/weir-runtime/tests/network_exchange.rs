//! One job split over two "TaskManagers" in one process: every channel between them goes
//! over TCP through each side's data server, and the keyed counts are still exact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_api::operator::{SystemClock, TaskMetrics};
use weir_api::prelude::*;
use weir_runtime::execution::{CheckpointWiring, JobContext, Placement, TaskEvent, TaskEventKind, deploy};
use weir_runtime::network::{DataServer, TcpNetwork};
use weir_runtime::{JobGraph, JobSettings};
use weir_types::JobId;

#[test]
fn a_job_split_over_two_processes_counts_exactly() {
    let users = 31u64;
    let events: Vec<u64> = (0..40_000u64).map(|i| i % users).collect();
    let sink = CollectSink::default();
    let env = StreamExecutionEnvironment::new();
    env.from_source(VecSource::new(events))
        .uid("source")
        .key_by(|u: &u64| *u)
        .process(RunningCount::default())
        .uid("counter")
        .sink_to(sink.clone())
        .uid("sink");
    let graph = Arc::new(env.build("split").unwrap());
    let job = Arc::new(JobGraph::build(&graph, &JobSettings::with_parallelism(4)).unwrap());
    let job_id = JobId::generate();

    let servers = [
        DataServer::start("127.0.0.1:0", weir_runtime::security::WireSecurity::open()).unwrap(),
        DataServer::start("127.0.0.1:0", weir_runtime::security::WireSecurity::open()).unwrap(),
    ];
    let addresses = [servers[0].address(), servers[1].address()];
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<TaskEvent>();
    let (writer_tx, _writer_rx) = crossbeam_channel::unbounded();
    let mut keep_alive = Vec::new();
    let mut handles = Vec::new();
    for (side, server) in servers.iter().enumerate() {
        let is_local = move |_vertex: usize, subtask: u32| subtask as usize % 2 == side;
        let network = TcpNetwork {
            job_id: job_id.to_string(),
            attempt: 0,
            server: Arc::clone(server),
            address_of: Arc::new(move |_vertex, subtask| Some(addresses[subtask as usize % 2].to_string())),
        };
        let placement = Placement { is_local: Arc::new(is_local), network: Some(Arc::new(network)) };
        let metrics: Vec<Vec<Arc<TaskMetrics>>> = job
            .vertices
            .iter()
            .map(|v| (0..v.parallelism).map(|_| Arc::new(TaskMetrics::default())).collect())
            .collect();
        let mut controls = Vec::new();
        for vertex in &job.vertices {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..vertex.parallelism).map(|_| crossbeam_channel::unbounded()).unzip();
            keep_alive.push(senders);
            controls.push(receivers);
        }
        let job_ctx = JobContext {
            job_id,
            job_name: "split".into(),
            cancel: Arc::default(),
            clock: Arc::new(SystemClock),
            attempt: 0,
            placement,
        };
        let wiring = CheckpointWiring {
            exactly_once: true,
            ended: weir_runtime::checkpointing::ended::EndedCheckpoints::new(),
            writer: writer_tx.clone(),
            restore: None,
            final_checkpoint: false,
            incremental: None,
            spill: None,
        };
        handles.extend(deploy(&graph, &job, &job_ctx, &metrics, controls, &wiring, &events_tx).unwrap());
    }

    let total = job.subtask_count() as usize;
    let mut finished = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while finished < total {
        let event =
            events_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("subtasks finish");
        match event.kind {
            TaskEventKind::Finished => finished += 1,
            TaskEventKind::Failed(error) => panic!("subtask {}/{} failed: {error}", event.vertex, event.subtask),
            _ => {}
        }
    }
    for handle in handles {
        handle.join().unwrap();
    }

    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (user, count) in sink.records() {
        per_user.entry(user).or_default().push(count);
    }
    assert_eq!(per_user.len() as u64, users);
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        let expected = (0..40_000u64).filter(|i| i % users == user).count() as u64;
        assert_eq!(counts, (1..=expected).collect::<Vec<u64>>(), "user {user}");
    }
}
