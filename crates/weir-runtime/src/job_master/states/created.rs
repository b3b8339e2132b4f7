//! CREATED: the job graph, the subtask records, the checkpoint coordinator and the snapshot
//! writers are built; then the job is deployed (RUNNING), or, when a new leader recovered it,
//! reconciled with the attempt still running on the TaskManagers (RECONCILING). A cancel
//! that arrived meanwhile ends it CANCELED before anything runs.

use std::sync::Arc;

use crossbeam_channel::Receiver;
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_types::lifecycle::now_ms;
use weir_types::{ExecutionState, JobStatus, StateHistory};

use super::State;
use crate::checkpointing::CheckpointCoordinator;
use crate::checkpointing::coordinator::OperatorInfo;
use crate::checkpointing::writer::SnapshotWriter;
use crate::executor::{Executor, LocalExecutor};
use crate::job_master::effects::{ClusterIo, MasterIo};
use crate::job_master::run::{Deployment, JobRun, Supervisor};
use crate::job_master::{JobMaster, LOCAL_HOST, MasterEvent, SavepointStatus, SubtaskRecord};
use crate::job_settings::JobSettings;
use crate::jobgraph::JobGraph;
use crate::restart::RestartStrategy;

pub(super) fn run(
    master: Arc<JobMaster>,
    graph: StreamGraph,
    settings: JobSettings,
    events: Receiver<MasterEvent>,
) -> Option<(JobRun, State)> {
    run_with_io(master, graph, settings, events, |io| io)
}

/// [`run`], its effects carried out by what `wrap` makes of the JobManager's io (the stepped
/// tests watch them).
pub(super) fn run_with_io(
    master: Arc<JobMaster>,
    graph: StreamGraph,
    settings: JobSettings,
    events: Receiver<MasterEvent>,
    wrap: impl FnOnce(Box<dyn MasterIo>) -> Box<dyn MasterIo>,
) -> Option<(JobRun, State)> {
    let job_graph = build_job_graph(&master, &graph, &settings)?;
    // A cancel that arrived while the job was being created ends it before it runs.
    if let Ok(MasterEvent::Cancel) = events.try_recv() {
        master.update(|record| {
            master.transition_job(record, JobStatus::Cancelling);
            master.transition_job(record, JobStatus::Canceled);
        });
        return None;
    }
    let fail = |cause: String| {
        master.update(|record| {
            record.failure_cause = Some(cause);
            master.transition_job(record, JobStatus::Failed);
        });
    };
    let coordinator = match new_coordinator(&master, &graph, &job_graph, &settings) {
        Ok(coordinator) => coordinator,
        Err(error) => {
            fail(error);
            return None;
        }
    };
    let (snapshot_events, snapshot_receiver) = crossbeam_channel::unbounded::<MasterEvent>();
    let writer = match SnapshotWriter::start(snapshot_events.clone()) {
        Ok(writer) => writer,
        Err(error) => {
            fail(format!("cannot start the snapshot writer threads: {error}"));
            return None;
        }
    };
    let recovered = settings.ha.as_ref().and_then(|ha| ha.recovered.clone());
    let ended = coordinator.ended();
    let sup = supervisor(&master, &settings, coordinator);
    let io = wrap(Box::new(cluster_io(&master, &graph, &job_graph, &settings)));
    let (dep, region_count) = deployment(graph, &job_graph, &settings, ended, &writer, snapshot_events);
    let run = JobRun {
        master: Arc::clone(&master),
        events,
        snapshots: snapshot_receiver,
        tasks: None,
        sup,
        dep,
        restore: settings.restore.clone(),
        region_count,
        writer: Some(writer),
        io,
        reconcile_timeout: settings.ha.as_ref().map(|ha| ha.reconcile_timeout).unwrap_or_default(),
        clock: settings.clock.clone(),
        orphaned_savepoints: recovered.as_ref().map(|r| r.savepoints.clone()).unwrap_or_default(),
    };
    Some(enter(run, recovered.is_some()))
}

/// How the job's subtasks are deployed: the graph, where they run, what their snapshots
/// need, and its pipelined regions (with the number of them).
fn deployment(
    graph: StreamGraph,
    job_graph: &Arc<JobGraph>,
    settings: &JobSettings,
    ended: Arc<crate::checkpointing::ended::EndedCheckpoints>,
    writer: &SnapshotWriter,
    snapshot_events: crossbeam_channel::Sender<MasterEvent>,
) -> (Deployment, Option<usize>) {
    // A job of one region restarts whole anyway.
    let regions = Some(job_graph.regions())
        .filter(|regions| !settings.failover_full && regions.iter().any(|r| *r > 0))
        .map(Arc::new);
    let region_count = regions.as_ref().map(|r| r.iter().max().map_or(0, |m| m + 1));
    let dep = Deployment {
        graph: Arc::new(graph),
        job_graph: Arc::clone(job_graph),
        exactly_once: settings.checkpointing.exactly_once,
        final_checkpoint: settings.checkpointing.interval.is_some(),
        incremental: settings.checkpointing.incremental,
        spill: settings.checkpointing.spill.clone(),
        ended,
        writer: writer.queue(),
        snapshot_events,
        initial_restore: settings.restore.clone(),
        regions,
    };
    (dep, region_count)
}

/// Builds the job graph and the subtask records (CREATED); FAILED when the graph is invalid.
fn build_job_graph(master: &JobMaster, graph: &StreamGraph, settings: &JobSettings) -> Option<Arc<JobGraph>> {
    let job_graph = match JobGraph::build(graph, settings) {
        Ok(job_graph) => Arc::new(job_graph),
        Err(error) => {
            master.update(|record| {
                record.failure_cause = Some(error.to_string());
                master.transition_job(record, JobStatus::Failed);
            });
            return None;
        }
    };
    let metrics = job_graph.new_task_metrics();
    master.update(|record| {
        record.job_graph = Some(Arc::clone(&job_graph));
        record.subtasks = metrics
            .iter()
            .map(|vertex| {
                vertex
                    .iter()
                    .map(|m| SubtaskRecord {
                        history: StateHistory::new(ExecutionState::Created, now_ms()),
                        metrics: Arc::clone(m),
                        host: LOCAL_HOST.to_string(),
                        data_ended: false,
                    })
                    .collect()
            })
            .collect();
        master.transition_job(record, JobStatus::Created);
    });
    Some(job_graph)
}

/// The checkpoint coordinator of the job: ids continue after what it restores and what a
/// previous leader recorded; a recovered job adopts the recorded checkpoints, a claimed
/// restore is the job's own.
fn new_coordinator(
    master: &JobMaster,
    graph: &StreamGraph,
    job_graph: &JobGraph,
    settings: &JobSettings,
) -> Result<CheckpointCoordinator, String> {
    let operators = graph
        .nodes()
        .iter()
        .map(|node| OperatorInfo {
            uid: node.uid_or_generated(),
            name: node.name.clone(),
            parallelism: job_graph.vertices[job_graph.vertex_of_node[node.id]].parallelism,
            vertex: job_graph.vertex_of_node[node.id],
        })
        .collect();
    let recovered = settings.ha.as_ref().and_then(|ha| ha.recovered.as_ref());
    let mut first_id = settings.restore.as_ref().map(|r| r.metadata.checkpoint_id + 1).unwrap_or(1);
    if let Some(recovered) = recovered {
        first_id = first_id.max(recovered.next_checkpoint_id);
    }
    // A recovered job takes its running tasks over: it restores nothing unless it restarts.
    let restored_now = settings.restore.as_ref().filter(|_| recovered.is_none());
    if let Some(restore) = restored_now {
        if let Ok(mut stats) = master.checkpoint_stats.lock() {
            stats.restored = Some((restore.metadata.checkpoint_id, restore.location.clone(), now_ms()));
        }
        let total = restore.total_bytes();
        master.update(|record| {
            record.restore = Some((restore.location.clone(), restore.metadata.checkpoint_id, total));
        });
    }
    let mut coordinator = CheckpointCoordinator::new(
        settings.checkpointing.clone(),
        &master.job_id.to_string(),
        &master.job_name,
        job_graph.max_parallelism,
        operators,
        job_graph.subtask_count() as usize,
        first_id,
        Arc::clone(&master.checkpoint_stats),
        settings.clock.clone(),
    )?;
    if let Some(ha) = &settings.ha {
        coordinator = coordinator.with_ha(ha.store.clone());
    } else if settings.checkpointing.interval.is_some() {
        coordinator.guard_job_dir();
    }
    if let Some(recovered) = recovered {
        coordinator.adopt_retained(&recovered.checkpoints)?;
    }
    if settings.checkpointing.claim_restored
        && let Some(restore) = restored_now
    {
        coordinator.claim(restore.metadata.checkpoint_id, &restore.location)?;
    }
    Ok(coordinator)
}

/// The io that carries out the job master's effects: on the executor `settings` name (this
/// process's threads by default), recording in its HA store.
fn cluster_io(master: &JobMaster, graph: &StreamGraph, job_graph: &JobGraph, settings: &JobSettings) -> ClusterIo {
    let sources: Vec<usize> = job_graph
        .vertices
        .iter()
        .enumerate()
        .filter(|(_, v)| graph.nodes()[v.nodes[0]].role == weir_api::graph::NodeRole::Source)
        .map(|(index, _)| index)
        .collect();
    let executor: Arc<dyn Executor> = match &settings.executor {
        Some(executor) => Arc::clone(executor),
        None => Arc::new(LocalExecutor),
    };
    let ha = settings.ha.as_ref().map(|ha| ha.store.clone());
    ClusterIo::new(master.job_id.to_string(), executor, ha, sources)
}

/// What the job's run keeps across its states.
fn supervisor(master: &JobMaster, settings: &JobSettings, coordinator: CheckpointCoordinator) -> Supervisor {
    let seed = (master.job_id.to_string().bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))) | 1;
    let recovered = settings.ha.as_ref().and_then(|ha| ha.recovered.as_ref());
    Supervisor {
        coordinator,
        savepoints_url: settings.checkpointing.savepoints_url.clone(),
        any_finished: false,
        restart: RestartStrategy::new(settings.restart.clone(), seed),
        pending_restart: None,
        started: settings.clock.now(),
        region_restarts: Vec::new(),
        task_events: None,
        handles: Vec::new(),
        next_attempt: recovered.map_or(0, |r| r.next_attempt),
        waiting_savepoints: Vec::new(),
        waiting_checkpoints: Vec::new(),
        manual_checkpoints: Vec::new(),
        final_checkpoint: None,
        finishing: false,
        completed_stop: None,
        all_finished: false,
    }
}

/// A recovered job goes RECONCILING (its savepoints in flight answered once a client polls);
/// any other is deployed and RUNNING.
fn enter(mut run: JobRun, recovered: bool) -> (JobRun, State) {
    let master = Arc::clone(&run.master);
    if recovered {
        master.update(|record| {
            for request_id in &run.orphaned_savepoints {
                // Known to the client that asked: answered once it polls this leader.
                record.savepoints.insert(request_id.clone(), (SavepointStatus::InProgress, false));
            }
            master.transition_job(record, JobStatus::Reconciling);
        });
        return (run, State::Reconciling(super::Reconciling::default()));
    }
    master.update(|record| master.transition_job(record, JobStatus::Running));
    match first_deploy(&mut run) {
        Ok(()) => (run, State::Running),
        Err(ended) => (run, ended),
    }
}

/// Deploys the first round; a failure ends the job before it ran ([`deploy_failed`]): the
/// state it ends in is the error.
pub(super) fn first_deploy(run: &mut JobRun) -> Result<(), State> {
    run.deploy_round().map_err(|error| deploy_failed(run, error))
}

/// True when `error` is a user's cancel stopping the deploy (its wait for slots).
pub(super) fn cancelled_by_user(run: &JobRun, error: &TaskError) -> bool {
    matches!(error, TaskError::Cancelled) && run.master.cancel_requested.load(std::sync::atomic::Ordering::SeqCst)
}

/// Ends a job whose deploy failed with `error` before it ran: CANCELED when a cancel stopped
/// the wait for slots, else FAILED, recorded in the HA store before it shows (a job shown
/// ended never runs again under a later leader); SUSPENDED when another leader decides.
pub(super) fn deploy_failed(run: &mut JobRun, error: TaskError) -> State {
    if !run.leading() {
        // The new leader reconciles with whatever of this deploy went out: it is not stopped
        // from here (it may be the attempt the new leader takes over).
        return State::Suspended;
    }
    run.stop_tasks();
    run.join_handles();
    let terminal = if cancelled_by_user(run, &error) {
        run.cancel_before_start();
        JobStatus::Canceled
    } else {
        run.fail_before_start(error.to_string());
        JobStatus::Failed
    };
    super::finished::end_before_start(run, terminal)
}
