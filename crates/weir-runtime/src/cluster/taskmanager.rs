//! A TaskManager process: registers its slots with the JobManager, heartbeats, and runs the
//! subtasks the JobManager deploys to it.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use weir_api::operator::{SystemClock, TaskMetrics};
use weir_api::snapshot::TaskControl;
use weir_checkpoint::SnapshotStorage;
use weir_types::JobId;

use super::GraphBuilder;
use super::protocol::{DeploySpec, SubtaskCounters, ToJobManager, ToTaskManager, receive, send};
use crate::checkpointing::RestoreSource;
use crate::checkpointing::coordinator::SnapshotDirs;
use crate::checkpointing::writer::{SnapshotWriter, WriteOutcome};
use crate::execution::{CheckpointWiring, JobContext, Placement, TaskEvent, TaskEventKind, deploy};
use crate::jobgraph::{JobGraph, JobSettings};
use crate::network::{DataServer, TcpNetwork};

/// The connection to the JobManager, shared by the threads that report to it.
type Link = Arc<Mutex<BufWriter<TcpStream>>>;

struct Attempt {
    region: Option<usize>,
    controls: HashMap<(usize, u32), Sender<TaskControl>>,
    dirs: SnapshotDirs,
    cancel: Arc<AtomicBool>,
}

fn report(link: &Link, message: &ToJobManager) -> bool {
    match link.lock() {
        Ok(mut writer) => send(&mut *writer, message).is_ok(),
        Err(_) => false,
    }
}

/// Runs a TaskManager with `slots` slots against the JobManager at `jobmanager` (RPC
/// address) until the process is stopped; reconnects when the JobManager goes away.
pub fn run_taskmanager(
    jobmanager: &str,
    slots: u32,
    heartbeat: Duration,
    builder: GraphBuilder,
) -> std::io::Result<()> {
    let server = DataServer::start("127.0.0.1:0")?;
    let taskmanager_id = JobId::generate().to_string();
    eprintln!("TaskManager {taskmanager_id} data port {}", server.address());
    loop {
        let stream = match TcpStream::connect(jobmanager) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%jobmanager, %error, "JobManager not reachable; retrying");
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let link: Link = Arc::new(Mutex::new(BufWriter::new(stream.try_clone()?)));
        let register = ToJobManager::Register {
            taskmanager_id: taskmanager_id.clone(),
            slots,
            data_address: server.address().to_string(),
        };
        if !report(&link, &register) {
            continue;
        }
        eprintln!("TaskManager {taskmanager_id} registered at {jobmanager} with {slots} slots");
        let alive = Arc::new(AtomicBool::new(true));
        let heartbeat_link = Arc::clone(&link);
        let heartbeat_alive = Arc::clone(&alive);
        std::thread::spawn(move || {
            while heartbeat_alive.load(Ordering::SeqCst) && report(&heartbeat_link, &ToJobManager::Heartbeat) {
                std::thread::sleep(heartbeat);
            }
        });
        serve_jobmanager(stream, &link, &server, &builder);
        alive.store(false, Ordering::SeqCst);
        tracing::warn!(%jobmanager, "lost the JobManager; reconnecting");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn serve_jobmanager(stream: TcpStream, link: &Link, server: &Arc<DataServer>, builder: &GraphBuilder) {
    let mut reader = BufReader::new(stream);
    // By (job, attempt): with region failover several attempts of a job run at once.
    let mut attempts: HashMap<(String, u32), Attempt> = HashMap::new();
    while let Ok(Some(message)) = receive::<ToTaskManager>(&mut reader) {
        match message {
            ToTaskManager::Deploy(spec) => {
                // A new attempt replaces the job's attempts it overlaps: all of them for a whole
                // job deploy, the same region's for a region deploy.
                attempts.retain(|(job_id, _), old| {
                    let replaced = *job_id == spec.job_id
                        && (spec.region.is_none() || old.region.is_none() || old.region == spec.region);
                    if replaced {
                        old.cancel.store(true, Ordering::SeqCst);
                    }
                    !replaced
                });
                match start_attempt(&spec, link, server, builder) {
                    Ok(attempt) => {
                        attempts.insert((spec.job_id.clone(), spec.attempt), attempt);
                    }
                    Err(error) => {
                        // Tell the job master, so the job fails or restarts instead of waiting.
                        tracing::error!(job_id = %spec.job_id, %error, "cannot deploy");
                        let mine = server.address().to_string();
                        let slot = spec.slot_addresses.iter().position(|a| *a == mine).unwrap_or(0);
                        let event = TaskEvent {
                            vertex: 0,
                            subtask: slot as u32,
                            kind: crate::execution::TaskEventKind::Failed(weir_api::error::TaskError::external(
                                format!("deploying on the TaskManager at {mine}"),
                                error,
                            )),
                        };
                        report(
                            link,
                            &ToJobManager::TaskEvent { job_id: spec.job_id.clone(), attempt: spec.attempt, event },
                        );
                    }
                }
            }
            ToTaskManager::Control { job_id, attempt, vertex, subtask, control } => {
                if let TaskControl::CheckpointComplete(id) | TaskControl::CheckpointAborted(id) = control {
                    // Late snapshots of an ended checkpoint are dropped, not waited for.
                    for (_, current) in attempts.iter().filter(|((job, _), _)| *job == job_id) {
                        current.dirs.retire(id);
                    }
                }
                if let Some(current) = attempts.get(&(job_id, attempt))
                    && let Some(sender) = current.controls.get(&(vertex, subtask))
                {
                    let _ = sender.send(control);
                }
            }
            ToTaskManager::CheckpointDir { job_id, checkpoint_id, url } => {
                let Ok(storage) = SnapshotStorage::from_url(&url) else { continue };
                let storage = Arc::new(storage.blocking());
                for (_, current) in attempts.iter().filter(|((job, _), _)| *job == job_id) {
                    current.dirs.open(checkpoint_id, Arc::clone(&storage));
                }
            }
            ToTaskManager::Cancel { job_id, attempt } => {
                if let Some(current) = attempts.get(&(job_id, attempt)) {
                    current.cancel.store(true, Ordering::SeqCst);
                }
            }
        }
    }
    // The JobManager is gone: its jobs' subtasks here cannot report any more.
    for attempt in attempts.values() {
        attempt.cancel.store(true, Ordering::SeqCst);
    }
}

fn start_attempt(
    spec: &DeploySpec,
    link: &Link,
    server: &Arc<DataServer>,
    builder: &GraphBuilder,
) -> Result<Attempt, String> {
    let graph = Arc::new(builder(&spec.submission)?);
    let settings = JobSettings {
        max_parallelism: Some(spec.max_parallelism),
        ..JobSettings::with_parallelism(spec.default_parallelism)
    };
    let job_graph = Arc::new(JobGraph::build(&graph, &settings).map_err(|e| e.to_string())?);
    let job_id: JobId = spec.job_id.parse().map_err(|e: weir_types::ids::BadJobId| e.to_string())?;
    let my_address = server.address().to_string();
    let slots = spec.slot_addresses.clone();
    let local_slots = slots.clone();
    let regions = job_graph.regions();
    let region = spec.region;
    let is_local = move |vertex: usize, subtask: u32| {
        local_slots.get(subtask as usize) == Some(&my_address)
            && region.is_none_or(|region| regions.get(vertex) == Some(&region))
    };
    let address_slots = slots.clone();
    let network = TcpNetwork {
        job_id: spec.job_id.clone(),
        attempt: spec.attempt,
        server: Arc::clone(server),
        address_of: Arc::new(move |_vertex, subtask| address_slots.get(subtask as usize).and_then(|a| a.parse().ok())),
    };
    let restore = match &spec.restore {
        Some(location) => Some(Arc::new(restore_source(location, &graph, &job_graph)?)),
        None => None,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let job_ctx = JobContext {
        job_id,
        job_name: spec.job_name.clone(),
        cancel: Arc::clone(&cancel),
        clock: Arc::new(SystemClock),
        attempt: spec.attempt,
        placement: Placement { is_local: Arc::new(is_local), network: Some(Arc::new(network)) },
    };
    let metrics = job_graph.new_task_metrics();
    let mut controls = HashMap::new();
    let mut control_receivers = Vec::new();
    for (vertex_index, vertex) in job_graph.vertices.iter().enumerate() {
        let mut receivers = Vec::new();
        for subtask in 0..vertex.parallelism {
            let (sender, receiver) = crossbeam_channel::unbounded();
            controls.insert((vertex_index, subtask), sender);
            receivers.push(receiver);
        }
        control_receivers.push(receivers);
    }
    let dirs: SnapshotDirs = crate::checkpointing::dirs::SnapshotDirectories::new();
    let (outcomes, outcome_receiver) = crossbeam_channel::unbounded::<WriteOutcome>();
    let writer = SnapshotWriter::start(outcomes).map_err(|e| e.to_string())?;
    let wiring = CheckpointWiring {
        exactly_once: spec.exactly_once,
        dirs: Arc::clone(&dirs),
        writer: writer.queue(),
        restore,
        final_checkpoint: spec.final_checkpoint,
    };
    let (events, event_receiver) = crossbeam_channel::unbounded::<TaskEvent>();
    let threads = deploy(&graph, &job_graph, &job_ctx, &metrics, control_receivers, &wiring, &events)
        .map_err(|e| e.to_string())?;
    drop(events);
    let ended = Arc::new(AtomicBool::new(false));
    let local = local_counters(&job_ctx.placement, metrics);
    report_metrics(spec, link, Arc::clone(&local), Arc::clone(&ended));
    // Report events and snapshot outcomes to the JobManager until the attempt ends.
    let event_link = Arc::clone(link);
    let (event_job, attempt) = (spec.job_id.clone(), spec.attempt);
    std::thread::spawn(move || {
        for event in event_receiver {
            // A subtask's final counters go ahead of its terminal event, while the JobManager
            // still routes this attempt's reports.
            if !matches!(event.kind, TaskEventKind::Initializing | TaskEventKind::Running) {
                let subtasks: Vec<SubtaskCounters> = local
                    .iter()
                    .filter(|(vertex, subtask, _)| *vertex == event.vertex && *subtask == event.subtask)
                    .map(|(vertex, subtask, m)| counters(*vertex, *subtask, m))
                    .collect();
                let metrics = ToJobManager::Metrics { job_id: event_job.clone(), attempt, subtasks };
                report(&event_link, &metrics);
            }
            report(&event_link, &ToJobManager::TaskEvent { job_id: event_job.clone(), attempt, event });
        }
        for thread in threads {
            let _ = thread.join();
        }
        ended.store(true, Ordering::SeqCst);
        writer.shutdown();
    });
    let snapshot_link = Arc::clone(link);
    let snapshot_job = spec.job_id.clone();
    std::thread::spawn(move || {
        for outcome in outcome_receiver {
            report(&snapshot_link, &ToJobManager::Snapshot { job_id: snapshot_job.clone(), attempt, outcome });
        }
    });
    Ok(Attempt { region: spec.region, controls, dirs, cancel })
}

/// The same restore plan the JobManager made (it is a pure function of the snapshot and the
/// job graph).
/// How often a TaskManager reports its subtasks' counters to the JobManager.
const METRICS_INTERVAL: Duration = Duration::from_millis(200);

type LocalCounters = Arc<Vec<(usize, u32, Arc<TaskMetrics>)>>;

/// The counters of the subtasks this TaskManager runs, with their vertex and subtask index.
fn local_counters(placement: &Placement, metrics: Vec<Vec<Arc<TaskMetrics>>>) -> LocalCounters {
    let mut local = Vec::new();
    for (vertex, subtasks) in metrics.into_iter().enumerate() {
        for (subtask, counters) in subtasks.into_iter().enumerate() {
            if (placement.is_local)(vertex, subtask as u32) {
                local.push((vertex, subtask as u32, counters));
            }
        }
    }
    Arc::new(local)
}

fn counters(vertex: usize, subtask: u32, metrics: &TaskMetrics) -> SubtaskCounters {
    SubtaskCounters {
        vertex,
        subtask,
        records_in: metrics.records_in.load(Ordering::Relaxed),
        records_out: metrics.records_out.load(Ordering::Relaxed),
        backpressured_ms: metrics.backpressured_ms_now(),
        restored_bytes: metrics.restored_bytes.load(Ordering::Relaxed),
        operators: metrics.operators.iter().map(|o| o.records_out.load(Ordering::Relaxed)).collect(),
    }
}

/// Reports the local subtasks' counters every [`METRICS_INTERVAL`] until the attempt ended
/// (each subtask's final counters go with its terminal event).
fn report_metrics(spec: &DeploySpec, link: &Link, local: LocalCounters, ended: Arc<AtomicBool>) {
    let link = Arc::clone(link);
    let (job_id, attempt) = (spec.job_id.clone(), spec.attempt);
    std::thread::spawn(move || {
        while !ended.load(Ordering::SeqCst) {
            let subtasks = local.iter().map(|(vertex, subtask, m)| counters(*vertex, *subtask, m)).collect();
            if !report(&link, &ToJobManager::Metrics { job_id: job_id.clone(), attempt, subtasks }) {
                return;
            }
            std::thread::sleep(METRICS_INTERVAL);
        }
    });
}

fn restore_source(
    location: &str,
    graph: &weir_api::graph::StreamGraph,
    job_graph: &JobGraph,
) -> Result<RestoreSource, String> {
    let storage = SnapshotStorage::from_url(location).map_err(|e| e.to_string())?;
    let blocking = storage.blocking();
    let metadata = blocking.block_on(weir_checkpoint::load_metadata(&storage)).map_err(|e| e.to_string())?;
    let plan =
        weir_checkpoint::plan_restore(&metadata, &crate::cluster::resources::restore_request(graph, job_graph, true))
            .map_err(|e| e.to_string())?;
    Ok(RestoreSource { storage: blocking, location: location.to_string(), metadata, plan })
}
