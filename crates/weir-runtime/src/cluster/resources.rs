//! The JobManager's side of the cluster: registered TaskManagers and their slots, failure
//! detection (a lost connection at once, silence past the heartbeat timeout), and the
//! executor that deploys job attempts onto TaskManagers.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};
use weir_api::error::TaskError;
use weir_api::graph::StreamGraph;
use weir_api::operator::TaskMetrics;

use super::protocol::{
    DeploySpec, Frame, Hardware, JobSubmission, REGISTRATION_LINE_BYTES_MAX, SubtaskCounters, ToJobManager,
    ToTaskManager, receive, receive_at_most, send,
};
use super::slots::{AttemptSlot, Cancel, SlotLedger};
use crate::checkpointing::writer::WriteOutcome;
use crate::execution::{TaskEvent, TaskEventKind};
use crate::executor::{AttemptHandle, AttemptSpec, Executor, ReportedAttempt};
use crate::job_master::events::MasterEvent;
use crate::jobgraph::JobGraph;
use crate::security::{HANDSHAKE_TIMEOUT, Plane, WireSecurity};

/// How long a job waits for enough free slots before its attempt fails.
pub const SLOT_WAIT_MAX: Duration = Duration::from_secs(300);

/// How long a connection on the TaskManager port has, after its handshake, to register.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections registering at once, at most: more are closed at once, so a flood of idle
/// connections ties up no more than this many threads (each for at most the handshake's
/// and the registration's timeouts).
pub const PENDING_REGISTRATIONS_MAX: usize = 64;

/// A TaskManager as `GET /taskmanagers` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskManagerInfo {
    /// Its id.
    pub id: String,
    /// Its data address.
    pub path: String,
    /// Slots it offers.
    #[serde(rename = "slotsNumber")]
    pub slots_number: u32,
    /// Slots not in use.
    #[serde(rename = "freeSlots")]
    pub free_slots: u32,
    /// When its last heartbeat came, epoch ms: what Flink sends under this (misleading)
    /// name, and its dashboard shows as a date.
    #[serde(rename = "timeSinceLastHeartbeat")]
    pub last_heartbeat_ms: u64,
    /// Its machine.
    #[serde(skip)]
    pub hardware: Hardware,
}

/// A registered TaskManager's connection (its slots are in the [`SlotLedger`]).
struct TaskManager {
    data_address: String,
    link: Arc<Mutex<BufWriter<TcpStream>>>,
    connection: TcpStream,
    last_heartbeat: Instant,
    hardware: Hardware,
}

/// Where a job attempt's reports go.
struct Route {
    task_events: Sender<TaskEvent>,
    snapshot_events: Sender<MasterEvent>,
    /// TaskManager id of each slot.
    slots: Vec<String>,
    /// Vertex parallelisms, 0 for vertices outside the attempt's region (to fail a lost
    /// TaskManager's subtasks).
    parallelism: Vec<u32>,
    /// The job master's counters of each subtask, updated from TaskManager reports.
    metrics: Vec<Vec<Arc<TaskMetrics>>>,
}

impl Route {
    /// True when `taskmanager` runs subtask `subtask` of the attempt (subtask `i` of every
    /// vertex runs in the attempt's slot `i`).
    fn runs(&self, taskmanager: &str, subtask: u32) -> bool {
        self.slots.get(subtask as usize).is_some_and(|owner| owner == taskmanager)
    }
}

/// Warns of a report about a subtask its sender does not run (dropped).
fn foreign_report(taskmanager: &str, (job_id, attempt): &(String, u32), what: &str, vertex: usize, subtask: u32) {
    tracing::warn!(
        %taskmanager, %job_id, attempt, vertex, subtask,
        "dropped a {what} from TaskManager {taskmanager} about subtask {subtask} of vertex {vertex}, which it does not run"
    );
}

/// Stores the counters a TaskManager reported of one subtask in the job master's `metrics`.
fn store_counters(metrics: &TaskMetrics, counters: SubtaskCounters) {
    metrics.records_in.store(counters.records_in, Ordering::Relaxed);
    metrics.records_out.store(counters.records_out, Ordering::Relaxed);
    metrics.backpressured_ms.store(counters.backpressured_ms, Ordering::Relaxed);
    metrics.idle_ms.store(counters.idle_ms, Ordering::Relaxed);
    metrics.restored_bytes.store(counters.restored_bytes, Ordering::Relaxed);
    for (operator, records_out) in metrics.operators.iter().zip(&counters.operators) {
        operator.records_out.store(*records_out, Ordering::Relaxed);
    }
    metrics.set_splits(counters.splits);
    metrics.records_skipped.store(counters.records_skipped, Ordering::Relaxed);
    metrics.records_late.store(counters.records_late, Ordering::Relaxed);
    metrics.records_late_dropped.store(counters.records_late_dropped, Ordering::Relaxed);
    metrics.input_watermark.store(counters.input_watermark, Ordering::Relaxed);
    for (operator, watermark) in metrics.operators.iter().zip(&counters.output_watermarks) {
        operator.output_watermark.store(*watermark, Ordering::Relaxed);
    }
    metrics.bytes_in.store(counters.bytes_in, Ordering::Relaxed);
    metrics.bytes_out.store(counters.bytes_out, Ordering::Relaxed);
    metrics.records_send_errors.store(counters.records_send_errors, Ordering::Relaxed);
}

/// The next message of a registered TaskManager; `None` at the end of its connection or on
/// a broken one (an oversized or malformed line: logged, and the connection is closed).
fn next_message(reader: &mut BufReader<TcpStream>, taskmanager: &str) -> Option<ToJobManager> {
    match receive::<ToJobManager>(reader) {
        Ok(message) => message,
        Err(error) => {
            tracing::warn!(%taskmanager, %error, "closing the connection of TaskManager {taskmanager}");
            None
        }
    }
}

/// The TaskManagers of a cluster and the jobs deployed on them.
pub struct ClusterResources {
    /// Connections. Locked before `ledger` when both are needed.
    taskmanagers: Mutex<HashMap<String, TaskManager>>,
    /// Slots, what jobs hold and what the TaskManagers reported running.
    ledger: Mutex<SlotLedger>,
    /// By (job, attempt): with region failover several attempts of a job run at once.
    routes: Mutex<HashMap<(String, u32), Route>>,
    heartbeat_timeout: Duration,
    /// This JobManager's leadership epoch (0 without high availability), sent with every
    /// message to a TaskManager.
    epoch: i64,
    /// Set when this JobManager stops leading: the TaskManagers' connections close.
    stopped: AtomicBool,
    /// Where the RPC listener listens (to wake its accept loop on stop).
    rpc_address: std::net::SocketAddr,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl ClusterResources {
    /// Accepts TaskManagers on `rpc_bind`; returns the resources and the bound address.
    pub fn start(
        rpc_bind: &str,
        heartbeat_timeout: Duration,
        security: WireSecurity,
    ) -> std::io::Result<(Arc<ClusterResources>, std::net::SocketAddr)> {
        let listener = TcpListener::bind(rpc_bind)?;
        let address = listener.local_addr()?;
        let resources = ClusterResources::start_term(listener, heartbeat_timeout, 0, security)?;
        // Without high availability this JobManager never takes a job over: every attempt a
        // TaskManager reports (it lost its connection and came back) is stale.
        *lock(&resources.ledger) = SlotLedger::new(false);
        Ok((resources, address))
    }

    /// Accepts TaskManagers on `listener` for one leadership term with `epoch`, until
    /// [`ClusterResources::stop`]; each must pass `security`'s handshake and register
    /// within [`REGISTRATION_TIMEOUT`].
    pub fn start_term(
        listener: TcpListener,
        heartbeat_timeout: Duration,
        epoch: i64,
        security: WireSecurity,
    ) -> std::io::Result<Arc<ClusterResources>> {
        let rpc_address = listener.local_addr()?;
        let resources = Arc::new(ClusterResources {
            taskmanagers: Mutex::new(HashMap::new()),
            ledger: Mutex::new(SlotLedger::new(true)),
            routes: Mutex::new(HashMap::new()),
            heartbeat_timeout,
            epoch,
            stopped: AtomicBool::new(false),
            rpc_address,
        });
        let accepting = Arc::clone(&resources);
        let registering = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::Builder::new().name("weir-rpc".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    return;
                }
                if registering.fetch_add(1, Ordering::SeqCst) >= PENDING_REGISTRATIONS_MAX {
                    registering.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(peer = ?stream.peer_addr().ok(), "{PENDING_REGISTRATIONS_MAX} connections are still registering; this one is closed");
                    continue;
                }
                let (serving, security, registering) =
                    (Arc::clone(&accepting), security.clone(), Arc::clone(&registering));
                std::thread::spawn(move || serving.serve(stream, &security, &registering));
            }
        })?;
        let watching = Arc::clone(&resources);
        std::thread::Builder::new().name("weir-heartbeats".into()).spawn(move || {
            // The TaskManagers count this JobManager as gone after heartbeat.timeout of
            // silence: tell them it lives five times per timeout.
            let period = watching.heartbeat_timeout / 5;
            let mut next_heartbeat = Instant::now();
            while !watching.stopped.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                watching.expire_silent();
                if Instant::now() >= next_heartbeat {
                    next_heartbeat = Instant::now() + period;
                    watching.heartbeat_taskmanagers();
                }
            }
        })?;
        Ok(resources)
    }

    /// Slots the jobs need: those in use plus those attempts wait for (free ones included)
    /// (what a resource manager starting TaskManagers on demand provides for).
    pub fn slots_demanded(&self) -> u32 {
        lock(&self.ledger).slots_demanded()
    }

    /// Ends this term: no more TaskManagers are accepted and the connections close (the
    /// TaskManagers keep their tasks and look for the next leader).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it drops the listener.
        let _ = TcpStream::connect_timeout(&self.rpc_address, Duration::from_millis(200));
        for tm in lock(&self.taskmanagers).values() {
            let _ = tm.connection.shutdown(Shutdown::Both);
        }
    }

    /// The leadership epoch of this term.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The registered TaskManagers.
    pub fn taskmanagers(&self) -> Vec<TaskManagerInfo> {
        let taskmanagers = lock(&self.taskmanagers);
        let offers = lock(&self.ledger).offers();
        offers
            .into_iter()
            .filter_map(|(id, path, slots_number, free_slots)| {
                let tm = taskmanagers.get(&id)?;
                let since = tm.last_heartbeat.elapsed().as_millis() as u64;
                let last_heartbeat_ms = weir_types::lifecycle::now_ms().saturating_sub(since);
                Some(TaskManagerInfo { id, path, slots_number, free_slots, last_heartbeat_ms, hardware: tm.hardware })
            })
            .collect()
    }

    /// Sends every TaskManager a heartbeat.
    fn heartbeat_taskmanagers(&self) {
        let ids: Vec<String> = lock(&self.taskmanagers).keys().cloned().collect();
        for id in ids {
            self.send_to(&id, &ToTaskManager::Heartbeat);
        }
    }

    /// Closes connections of TaskManagers silent past the heartbeat timeout.
    fn expire_silent(&self) {
        for (id, tm) in lock(&self.taskmanagers).iter() {
            if tm.last_heartbeat.elapsed() > self.heartbeat_timeout {
                tracing::warn!(taskmanager = %id, "heartbeat timeout");
                let _ = tm.connection.shutdown(Shutdown::Both);
            }
        }
    }

    fn serve(self: Arc<Self>, stream: TcpStream, security: &WireSecurity, registering: &AtomicUsize) {
        let registered = self.register(stream, security);
        registering.fetch_sub(1, Ordering::SeqCst);
        if let Some((taskmanager_id, reader)) = registered {
            self.serve_registered(taskmanager_id, reader);
        }
    }

    /// The handshake and the registration of a connection on the TaskManager port, within
    /// [`HANDSHAKE_TIMEOUT`] and [`REGISTRATION_TIMEOUT`]: the TaskManager's id and the
    /// connection's reader once registered, `None` (the connection dropped, the reason
    /// logged) otherwise.
    fn register(&self, stream: TcpStream, security: &WireSecurity) -> Option<(String, BufReader<TcpStream>)> {
        let peer = stream.peer_addr().map_or_else(|_| "an unknown peer".to_string(), |a| a.to_string());
        let stream = match security.accept(stream, Plane::Control) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%peer, %error, "refused a connection on the TaskManager port");
                return None;
            }
        };
        let _ = stream.set_nodelay(true);
        let writer = stream.try_clone().ok()?;
        let connection = stream.try_clone().ok()?;
        stream.set_read_timeout(Some(REGISTRATION_TIMEOUT)).ok()?;
        let mut reader = BufReader::new(stream);
        let (taskmanager_id, slots, data_address, running, hardware) = match receive_at_most(
            &mut reader,
            REGISTRATION_LINE_BYTES_MAX,
        ) {
            Ok(Some(ToJobManager::Register { taskmanager_id, slots, data_address, running, hardware })) => {
                (taskmanager_id, slots, data_address, running, hardware)
            }
            Ok(Some(_)) => {
                tracing::warn!(%peer, "a connection on the TaskManager port sent a message before registering; dropped");
                return None;
            }
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(%peer, %error, "a connection on the TaskManager port did not register; dropped");
                return None;
            }
        };
        reader.get_ref().set_read_timeout(None).ok()?;
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        // A TaskManager that stops reading (partitioned, frozen) must not block whoever sends
        // to it: a write that cannot finish within the heartbeat timeout ends the connection.
        let _ = writer.set_write_timeout(Some(self.heartbeat_timeout));
        let link = Arc::new(Mutex::new(BufWriter::new(writer)));
        let mut taskmanagers = lock(&self.taskmanagers);
        if taskmanagers.contains_key(&taskmanager_id) {
            // Its reports would pass as the registered one's: refused (a TaskManager that
            // reconnects registers again once its old connection is gone).
            tracing::warn!(%peer, taskmanager = %taskmanager_id, "refused a registration under the id of a connected TaskManager");
            return None;
        }
        // The welcome goes out before any other message can (`send_to` takes the link
        // under this lock); a peer that does not read cannot hold the lock for long.
        connection.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).ok()?;
        if send(&mut *lock(&link), &Frame { epoch: self.epoch, message: ToTaskManager::Welcome }).is_err() {
            return None;
        }
        connection.set_write_timeout(None).ok()?;
        tracing::info!(taskmanager = %taskmanager_id, slots, %data_address, running = running.len(), "TaskManager registered");
        let stale = lock(&self.ledger).register(&taskmanager_id, slots, data_address.clone(), running);
        taskmanagers.insert(
            taskmanager_id.clone(),
            TaskManager { data_address, link, connection, last_heartbeat: Instant::now(), hardware },
        );
        drop(taskmanagers);
        for cancel in &stale {
            tracing::info!(taskmanager = %taskmanager_id, job_id = %cancel.job_id, attempt = cancel.attempt, "cancelling a reported attempt no job master takes over");
        }
        self.send_cancels(stale);
        Some((taskmanager_id, reader))
    }

    /// Serves a registered TaskManager's messages until its connection ends. Reports about
    /// a subtask go to its job master only when this TaskManager runs that subtask.
    fn serve_registered(&self, taskmanager_id: String, mut reader: BufReader<TcpStream>) {
        let mut why = "the connection was lost (the process died or the network failed)";
        while let Some(message) = next_message(&mut reader, &taskmanager_id) {
            // Any message shows the TaskManager alive, as any frame of this JobManager shows
            // it alive to the TaskManager: both sides count the same silence, so a TaskManager
            // cut off stops its subtasks (its watchdog) about when they are restarted here,
            // not up to heartbeat.interval later (its own heartbeats are that far apart).
            if let Some(tm) = lock(&self.taskmanagers).get_mut(&taskmanager_id) {
                tm.last_heartbeat = Instant::now();
            }
            match message {
                ToJobManager::Deregister => {
                    tracing::info!(taskmanager = %taskmanager_id, "TaskManager deregistered: it is shutting down");
                    why = "the TaskManager shut down (it was stopped, e.g. by SIGTERM)";
                    break;
                }
                ToJobManager::Heartbeat | ToJobManager::Register { .. } => {}
                ToJobManager::TaskEvent { job_id, attempt, event } => {
                    self.route_task_event(&taskmanager_id, (job_id, attempt), event);
                }
                ToJobManager::Metrics { job_id, attempt, subtasks } => {
                    if let Some(route) = lock(&self.routes).get(&(job_id, attempt)) {
                        for counters in subtasks.into_iter().filter(|c| route.runs(&taskmanager_id, c.subtask)) {
                            let slot =
                                route.metrics.get(counters.vertex).and_then(|v| v.get(counters.subtask as usize));
                            if let Some(metrics) = slot {
                                store_counters(metrics, counters);
                            }
                        }
                    }
                }
                ToJobManager::Snapshot { job_id, attempt, outcome } => {
                    self.route_snapshot(&taskmanager_id, (job_id, attempt), outcome);
                }
            }
        }
        self.lost(&taskmanager_id, why);
    }

    /// Passes a subtask's event from `taskmanager_id` to the job master of attempt `key`,
    /// or keeps it for the master that takes the attempt over.
    fn route_task_event(&self, taskmanager_id: &str, key: (String, u32), event: TaskEvent) {
        if let Some(route) = lock(&self.routes).get(&key) {
            if route.runs(taskmanager_id, event.subtask) {
                let _ = route.task_events.send(event);
            } else {
                foreign_report(taskmanager_id, &key, "event", event.vertex, event.subtask);
            }
            return;
        }
        // Not taken over yet: kept for the job master that will.
        let (vertex, subtask) = (event.vertex, event.subtask);
        if lock(&self.ledger).note_event(taskmanager_id, &key, event) == Some(false) {
            foreign_report(taskmanager_id, &key, "event", vertex, subtask);
        }
    }

    /// Passes a snapshot's outcome from `taskmanager_id` to the job master of attempt `key`.
    fn route_snapshot(&self, taskmanager_id: &str, key: (String, u32), outcome: WriteOutcome) {
        if let Some(route) = lock(&self.routes).get(&key) {
            // A decline names no subtask: it must come from a TaskManager of the attempt.
            let runs = match &outcome {
                WriteOutcome::Acknowledged(ack) => route.runs(taskmanager_id, ack.subtask),
                WriteOutcome::Declined { .. } => route.slots.iter().any(|slot| slot == taskmanager_id),
            };
            if runs {
                let _ = route.snapshot_events.send(MasterEvent::Snapshot(outcome));
            } else {
                let (vertex, subtask) = match &outcome {
                    WriteOutcome::Acknowledged(ack) => (ack.vertex, ack.subtask),
                    WriteOutcome::Declined { .. } => (0, 0),
                };
                foreign_report(taskmanager_id, &key, "snapshot", vertex, subtask);
            }
        }
    }

    /// A new leader recovered `jobs` from the HA store, each RECONCILING: from now on only
    /// their reports are kept (until each settles), and what else was reported is
    /// cancelled on its TaskManagers, its reserved slots freed.
    pub fn recovered(&self, jobs: &[String]) {
        let cancels = lock(&self.ledger).recovered(jobs);
        self.send_cancels(cancels);
    }

    /// `job_id`'s master left RECONCILING (it took the reported attempts over, or gave up and
    /// restarts): every attempt of it still reported is cancelled on its TaskManagers, its
    /// reserved slots freed, and later reports of it are cancelled at once.
    fn settle(&self, job_id: &str) {
        let cancels = lock(&self.ledger).settle(job_id);
        self.send_cancels(cancels);
    }

    /// Stops a reported attempt on the TaskManagers running it and forgets it.
    fn cancel_reported(&self, job_id: &str, attempt: u32) {
        let cancels = lock(&self.ledger).cancel_reported(job_id, attempt);
        self.send_cancels(cancels);
    }

    /// Carries out the ledger's cancels.
    fn send_cancels(&self, cancels: Vec<Cancel>) {
        for Cancel { taskmanager, job_id, attempt } in cancels {
            self.send_to(&taskmanager, &ToTaskManager::Cancel { job_id, attempt });
        }
    }

    /// A TaskManager is gone (`why`): every subtask it ran fails at once.
    fn lost(&self, taskmanager_id: &str, why: &str) {
        let removed = lock(&self.taskmanagers).remove(taskmanager_id);
        let Some(removed) = removed else { return };
        // Its slots, and its part of attempts not taken over yet, are gone with it.
        lock(&self.ledger).lost(taskmanager_id);
        tracing::warn!(taskmanager = %taskmanager_id, address = %removed.data_address, "TaskManager lost: {why}");
        for route in lock(&self.routes).values() {
            for (slot, owner) in route.slots.iter().enumerate() {
                if owner != taskmanager_id {
                    continue;
                }
                for (vertex, parallelism) in route.parallelism.iter().enumerate() {
                    if (slot as u32) < *parallelism {
                        let error = TaskError::external(
                            format!("TaskManager {taskmanager_id} at {}", removed.data_address),
                            why,
                        );
                        let _ = route.task_events.send(TaskEvent {
                            vertex,
                            subtask: slot as u32,
                            kind: TaskEventKind::Failed(error),
                        });
                    }
                }
            }
        }
    }

    /// The job's slots `0..count` for one attempt, waiting up to [`SLOT_WAIT_MAX`] for free
    /// TaskManager slots where the job has none yet (or its slot's TaskManager is gone).
    /// Slots other attempts of the job hold are shared, not taken again.
    fn allocate(&self, job_id: &str, count: u32, cancelled: impl Fn() -> bool) -> Result<Vec<AttemptSlot>, TaskError> {
        let count = count as usize;
        let started = Instant::now();
        let deadline = started + SLOT_WAIT_MAX;
        let mut told = false;
        loop {
            if let Some(slots) = lock(&self.ledger).try_allocate(job_id, count) {
                if told {
                    tracing::warn!(job = %job_id, "the job got its {count} slots after {:?}", started.elapsed());
                }
                return Ok(slots);
            }
            // Once, the first time it waits: a job that does not start says why.
            if !told {
                told = true;
                let offers = lock(&self.ledger).offers();
                let (total, free) = offers.iter().fold((0, 0), |(t, f), (_, _, slots, free)| (t + slots, f + free));
                tracing::warn!(
                    job = %job_id,
                    "the job waits for {count} slots; the cluster's {} TaskManager(s) have {free} of {total} free: start more TaskManagers (weir cluster add-taskmanager, or raise taskmanager.numberOfTaskSlots), or it fails after {SLOT_WAIT_MAX:?}",
                    offers.len()
                );
            }
            let given_up = cancelled() || Instant::now() >= deadline;
            if given_up {
                lock(&self.ledger).stop_waiting(job_id);
            }
            if cancelled() {
                return Err(TaskError::Cancelled);
            }
            if Instant::now() >= deadline {
                return Err(TaskError::external(
                    "waiting for TaskManager slots",
                    format!("{count} slots needed, not available within {SLOT_WAIT_MAX:?}; start more TaskManagers"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An attempt of `job_id` ended: its slots go back (those no other attempt uses).
    fn release(&self, job_id: &str, slots: &[AttemptSlot]) {
        lock(&self.ledger).release(job_id, slots);
    }

    fn send_to(&self, taskmanager_id: &str, message: &ToTaskManager) {
        let link = lock(&self.taskmanagers).get(taskmanager_id).map(|tm| Arc::clone(&tm.link));
        if let Some(link) = link
            && let Err(error) = send(&mut *lock(&link), &Frame { epoch: self.epoch, message })
        {
            // Half a line may have gone out: the connection is unusable. Closing it makes its
            // reader count the TaskManager lost, as a dropped connection does.
            tracing::warn!(taskmanager = %taskmanager_id, %error, "cannot send to the TaskManager; closing its connection");
            if let Some(tm) = lock(&self.taskmanagers).get(taskmanager_id) {
                let _ = tm.connection.shutdown(Shutdown::Both);
            }
        }
    }
}

/// The restore request for a job graph's operators at their current parallelism.
pub fn restore_request(
    graph: &StreamGraph,
    job_graph: &JobGraph,
    allow_non_restored_state: bool,
) -> weir_checkpoint::RestoreRequest {
    crate::checkpointing::restore::restore_request(
        graph,
        |node| job_graph.vertices[job_graph.vertex_of_node[node.id]].parallelism,
        Some(job_graph.max_parallelism),
        allow_non_restored_state,
    )
}

/// Deploys a job's attempts onto the cluster's TaskManagers.
pub struct RemoteExecutor {
    /// The cluster.
    pub resources: Arc<ClusterResources>,
    /// The job as submitted (each TaskManager builds the graph from it).
    pub submission: JobSubmission,
    /// The parallelism the job graph was built with.
    pub default_parallelism: u32,
}

struct RemoteAttempt {
    resources: Arc<ClusterResources>,
    job_id: String,
    attempt: u32,
    slots: Vec<AttemptSlot>,
    done: Arc<AtomicBool>,
}

impl AttemptHandle for RemoteAttempt {
    fn join(self: Box<Self>) {
        self.done.store(true, Ordering::SeqCst);
        self.resources.release(&self.job_id, &self.slots);
        lock(&self.resources.routes).remove(&(self.job_id.clone(), self.attempt));
    }

    fn host_of(&self, subtask: u32) -> Option<String> {
        self.slots.get(subtask as usize).map(|(_, taskmanager, _)| taskmanager.clone())
    }
}

impl Executor for RemoteExecutor {
    fn start(&self, spec: AttemptSpec) -> Result<Box<dyn AttemptHandle>, TaskError> {
        let parallelism = self.parallelism_in_scope(&spec);
        let slot_count = parallelism.iter().copied().max().unwrap_or(1).max(1);
        let job_id = spec.job_id.to_string();
        let slots = self.resources.allocate(&job_id, slot_count, || {
            spec.cancel.load(Ordering::SeqCst) || spec.job_cancelled.load(Ordering::SeqCst)
        })?;
        let owners: Vec<String> = slots.iter().map(|(_, taskmanager, _)| taskmanager.clone()).collect();
        lock(&self.resources.routes).insert(
            (job_id.clone(), spec.attempt),
            Route {
                task_events: spec.task_events.clone(),
                snapshot_events: spec.snapshot_events.clone(),
                slots: owners.clone(),
                parallelism: parallelism.clone(),
                metrics: spec.metrics.clone(),
            },
        );
        let deploy = DeploySpec {
            job_id: job_id.clone(),
            job_name: spec.job_name.clone(),
            attempt: spec.attempt,
            submission: self.submission.clone(),
            default_parallelism: self.default_parallelism,
            max_parallelism: spec.job_graph.max_parallelism,
            slot_addresses: slots.iter().map(|(_, _, address)| address.clone()).collect(),
            exactly_once: spec.wiring.exactly_once,
            final_checkpoint: spec.wiring.final_checkpoint,
            incremental: spec.wiring.incremental,
            spill: spec.wiring.spill.clone(),
            restore: spec.restore.as_ref().map(|r| r.location.clone()),
            auto_watermark_interval_ms: Some(spec.job_graph.auto_watermark_interval_ms),
            region: spec.region.as_ref().map(|(_, region)| *region),
        };
        let mut involved: Vec<String> = owners.clone();
        involved.sort();
        involved.dedup();
        for taskmanager in &involved {
            self.resources.send_to(taskmanager, &ToTaskManager::Deploy(Box::new(deploy.clone())));
        }
        Ok(self.wire(spec, &parallelism, owners, involved, slots))
    }

    fn running_attempts(&self, job_id: &str) -> Vec<ReportedAttempt> {
        lock(&self.resources.ledger).running_attempts(job_id)
    }

    fn adopt(&self, spec: AttemptSpec, reported: &ReportedAttempt) -> Result<Box<dyn AttemptHandle>, TaskError> {
        let job_id = spec.job_id.to_string();
        let parallelism = self.parallelism_in_scope(&spec);
        let slots = lock(&self.resources.ledger)
            .adopt_slots(&job_id, &reported.slot_addresses)
            .map_err(|(context, reason)| TaskError::external(context, reason))?;
        let owners: Vec<String> = slots.iter().map(|(_, taskmanager, _)| taskmanager.clone()).collect();
        let key = (job_id.clone(), spec.attempt);
        {
            let mut routes = lock(&self.resources.routes);
            // Taken over: no longer reported, and what its job reserved goes once no reported
            // attempt of it is left.
            let pending = lock(&self.resources.ledger).take_over(&job_id, spec.attempt);
            for event in pending {
                let _ = spec.task_events.send(event);
            }
            routes.insert(
                key,
                Route {
                    task_events: spec.task_events.clone(),
                    snapshot_events: spec.snapshot_events.clone(),
                    slots: owners.clone(),
                    parallelism: parallelism.clone(),
                    metrics: spec.metrics.clone(),
                },
            );
        }
        let mut involved: Vec<String> = owners.clone();
        involved.sort();
        involved.dedup();
        tracing::info!(job_id = %job_id, attempt = spec.attempt, taskmanagers = involved.len(), "took over a running attempt");
        Ok(self.wire(spec, &parallelism, owners, involved, slots))
    }

    fn cancel_attempt(&self, job_id: &str, attempt: u32) {
        self.resources.cancel_reported(job_id, attempt);
    }

    fn reconciled(&self, job_id: &str) {
        self.resources.settle(job_id);
    }
}

impl RemoteExecutor {
    /// Vertex parallelisms, 0 for vertices outside the attempt's region.
    fn parallelism_in_scope(&self, spec: &AttemptSpec) -> Vec<u32> {
        let in_scope = |vertex: usize| match &spec.region {
            Some((regions, region)) => regions.get(vertex) == Some(region),
            None => true,
        };
        spec.job_graph
            .vertices
            .iter()
            .enumerate()
            .map(|(vertex, v)| if in_scope(vertex) { v.parallelism } else { 0 })
            .collect()
    }

    /// Forwards the attempt's control messages to the TaskManagers of their subtasks (a
    /// trigger's barrier carries where its snapshots go), and sends the attempt's
    /// cancellation to every involved TaskManager when its cancel flag is set.
    fn wire(
        &self,
        spec: AttemptSpec,
        parallelism: &[u32],
        owners: Vec<String>,
        involved: Vec<String>,
        slots: Vec<AttemptSlot>,
    ) -> Box<dyn AttemptHandle> {
        let job_id = spec.job_id.to_string();
        for (vertex, receivers) in spec.controls.into_iter().enumerate() {
            if parallelism[vertex] == 0 {
                continue;
            }
            for (subtask, receiver) in receivers.into_iter().enumerate() {
                let resources = Arc::clone(&self.resources);
                let owner = owners[subtask].clone();
                let (job_id, attempt) = (job_id.clone(), spec.attempt);
                std::thread::spawn(move || {
                    for control in receiver {
                        let message = ToTaskManager::Control {
                            job_id: job_id.clone(),
                            attempt,
                            vertex,
                            subtask: subtask as u32,
                            control,
                        };
                        resources.send_to(&owner, &message);
                    }
                });
            }
        }
        // Cancellation of the attempt (a cancel, a failure elsewhere, a restart).
        let done = Arc::new(AtomicBool::new(false));
        let watching = Arc::clone(&done);
        let resources = Arc::clone(&self.resources);
        let cancel = Arc::clone(&spec.cancel);
        let (cancel_job, attempt) = (job_id.clone(), spec.attempt);
        std::thread::spawn(move || {
            while !watching.load(Ordering::SeqCst) {
                if cancel.load(Ordering::SeqCst) {
                    for taskmanager in &involved {
                        resources.send_to(taskmanager, &ToTaskManager::Cancel { job_id: cancel_job.clone(), attempt });
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Box::new(RemoteAttempt { resources: Arc::clone(&self.resources), job_id, attempt: spec.attempt, slots, done })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::RunningAttempt;

    /// Resources with TaskManagers `ids`, each offering `slots` (their connections are a
    /// loopback pair nobody reads).
    fn resources(ids: &[&str], slots: u32) -> (ClusterResources, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peers = Vec::new();
        let mut taskmanagers = HashMap::new();
        let mut ledger = SlotLedger::new(false);
        for id in ids {
            let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            peers.push(listener.accept().unwrap().0);
            ledger.register(id, slots, format!("{id}:1"), Vec::new());
            taskmanagers.insert(
                id.to_string(),
                TaskManager {
                    data_address: format!("{id}:1"),
                    link: Arc::new(Mutex::new(BufWriter::new(ours.try_clone().unwrap()))),
                    connection: ours,
                    last_heartbeat: Instant::now(),
                    hardware: Hardware::default(),
                },
            );
        }
        let resources = ClusterResources {
            taskmanagers: Mutex::new(taskmanagers),
            ledger: Mutex::new(ledger),
            routes: Mutex::new(HashMap::new()),
            heartbeat_timeout: Duration::from_secs(60),
            epoch: 0,
            stopped: AtomicBool::new(false),
            rpc_address: listener.local_addr().unwrap(),
        };
        (resources, peers)
    }

    fn free(resources: &ClusterResources) -> u32 {
        lock(&resources.ledger).offers().iter().map(|(_, _, _, free)| free).sum()
    }

    /// A TaskManager `id` with two slots registers at `address`, reporting `running`; its
    /// side of the connection, after the welcome.
    fn register(address: std::net::SocketAddr, id: &str, running: Vec<RunningAttempt>) -> BufReader<TcpStream> {
        let stream = TcpStream::connect(address).unwrap();
        let mut stream = WireSecurity::open().connect(stream, Plane::Control).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let register = ToJobManager::Register {
            taskmanager_id: id.into(),
            slots: 2,
            data_address: format!("{id}:1"),
            running,
            hardware: Hardware::default(),
        };
        send(&mut stream, &register).unwrap();
        let mut reader = BufReader::new(stream);
        let welcome: Option<Frame<ToTaskManager>> = receive(&mut reader).unwrap();
        assert!(matches!(welcome, Some(Frame { message: ToTaskManager::Welcome, .. })));
        reader
    }

    fn running(job: &str, attempt: u32, taskmanager: &str) -> RunningAttempt {
        let subtask = crate::executor::ReportedSubtask {
            vertex: 0,
            subtask: 0,
            state: weir_types::ExecutionState::Running,
            data_ended: false,
            taskmanager: taskmanager.into(),
        };
        RunningAttempt {
            job_id: job.into(),
            attempt: ReportedAttempt {
                attempt,
                region: None,
                slot_addresses: vec![format!("{taskmanager}:1")],
                subtasks: vec![subtask],
            },
        }
    }

    /// The next message on a TaskManager's connection is the cancellation of `attempt` of
    /// `job`.
    fn expect_cancel(reader: &mut BufReader<TcpStream>, job: &str, attempt: u32) {
        let frame: Option<Frame<ToTaskManager>> = receive(reader).unwrap();
        match frame.map(|f| f.message) {
            Some(ToTaskManager::Cancel { job_id, attempt: cancelled }) => {
                assert_eq!((job_id.as_str(), cancelled), (job, attempt))
            }
            other => panic!("expected the cancellation of {job}/{attempt}, got {other:?}"),
        }
    }

    #[test]
    fn the_slots_demanded_count_those_in_use_and_those_an_attempt_waits_for() {
        let (resources, _peers) = resources(&["a", "b"], 1);
        let resources = Arc::new(resources);
        let held = resources.allocate("one", 1, || false).unwrap();
        assert_eq!(resources.slots_demanded(), 1);
        // A job of parallelism 3 waits: 1 free slot, 2 missing; it needs 3 more.
        let give_up = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (resources, give_up) = (Arc::clone(&resources), Arc::clone(&give_up));
            std::thread::spawn(move || resources.allocate("two", 3, || give_up.load(Ordering::SeqCst)))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while resources.slots_demanded() != 4 {
            assert!(Instant::now() < deadline, "demand {} instead of 4", resources.slots_demanded());
            std::thread::sleep(Duration::from_millis(10));
        }
        give_up.store(true, Ordering::SeqCst);
        assert!(waiter.join().unwrap().is_err());
        assert_eq!(resources.slots_demanded(), 1, "a job that gave up waits for nothing");
        resources.release("one", &held);
        assert_eq!(resources.slots_demanded(), 0);
    }

    fn wait_free(resources: &ClusterResources, expected: u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while free(resources) != expected {
            assert!(Instant::now() < deadline, "free slots {} instead of {expected}", free(resources));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Without high availability no job is ever taken over: a TaskManager that comes back
    /// with a running attempt has it cancelled at once and reserves nothing.
    #[test]
    fn a_standalone_jobmanager_cancels_every_reported_attempt_at_once() {
        let (resources, address) =
            ClusterResources::start("127.0.0.1:0", Duration::from_secs(60), WireSecurity::open()).unwrap();
        let mut tm = register(address, "a", vec![running("job", 4, "a")]);
        expect_cancel(&mut tm, "job", 4);
        wait_free(&resources, 2);
        assert_eq!(lock(&resources.ledger).reported_count(), 0);
        resources.stop();
    }

    /// A new leader keeps reports until it recovered its jobs; then only those of jobs that
    /// reconcile. When a job's master leaves RECONCILING, what of it was not taken over is
    /// cancelled and its slots freed, and a TaskManager that reports it later (it was frozen)
    /// has it cancelled at once.
    #[test]
    fn reports_a_leader_does_not_take_over_are_cancelled_and_free_their_slots() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let resources =
            ClusterResources::start_term(listener, Duration::from_secs(60), 7, WireSecurity::open()).unwrap();
        let mut a = register(address, "a", vec![running("recovered", 3, "a"), running("ended", 1, "a")]);
        // The welcome goes out a moment before the JobManager records the registration.
        let deadline = Instant::now() + Duration::from_secs(5);
        while resources.taskmanagers().is_empty() {
            assert!(Instant::now() < deadline, "TaskManager a never showed as registered");
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_free(&resources, 0);
        assert_eq!(lock(&resources.ledger).reported_count(), 2, "kept while the leader recovers its jobs");

        resources.recovered(&["recovered".to_string()]);
        expect_cancel(&mut a, "ended", 1);
        wait_free(&resources, 1);

        // Its master gave up on the takeover (the other half of the attempt is gone).
        resources.settle("recovered");
        expect_cancel(&mut a, "recovered", 3);
        wait_free(&resources, 2);
        assert_eq!(lock(&resources.ledger).reported_count(), 0);

        // A TaskManager frozen through all this comes back with the stale attempt.
        let mut b = register(address, "b", vec![running("recovered", 3, "b")]);
        expect_cancel(&mut b, "recovered", 3);
        wait_free(&resources, 4);
        assert_eq!(lock(&resources.ledger).reported_count(), 0);
        resources.stop();
    }

    /// Every message of a TaskManager counts as a heartbeat: one that reports its counters
    /// but sends no heartbeat within the timeout stays; one that falls silent is dropped
    /// once the timeout passed.
    #[test]
    fn any_message_of_a_taskmanager_keeps_it_alive_and_silence_drops_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let timeout = Duration::from_secs(1);
        let resources = ClusterResources::start_term(listener, timeout, 1, WireSecurity::open()).unwrap();
        let tm = register(address, "a", Vec::new());
        let mut writer = tm.get_ref().try_clone().unwrap();
        let metrics = ToJobManager::Metrics { job_id: "job".into(), attempt: 0, subtasks: Vec::new() };
        let until = Instant::now() + 3 * timeout;
        let mut silent = Instant::now();
        while Instant::now() < until {
            send(&mut writer, &metrics).unwrap();
            silent = Instant::now();
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(resources.taskmanagers().len(), 1, "a TaskManager that reports counters was dropped");
        }
        while !resources.taskmanagers().is_empty() {
            assert!(silent.elapsed() < 5 * timeout, "a silent TaskManager stayed registered");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(silent.elapsed() >= timeout, "dropped after {:?} of silence", silent.elapsed());
        resources.stop();
    }

    const NEVER: fn() -> bool = || false;
    const GIVE_UP: fn() -> bool = || true;

    #[test]
    fn the_regions_of_a_job_share_its_slots_and_free_them_with_the_last_one() {
        let (resources, _peers) = resources(&["a", "b"], 1);
        let region_0 = resources.allocate("job", 2, NEVER).unwrap();
        let owners: Vec<&str> = region_0.iter().map(|(_, tm, _)| tm.as_str()).collect();
        assert_eq!(owners, ["a", "b"], "spread over the TaskManagers");
        assert_eq!(free(&resources), 0);
        // A second region of the same job runs in the same two slots.
        let region_1 = resources.allocate("job", 2, NEVER).unwrap();
        assert_eq!(region_0, region_1);
        // Another job finds no free slot (and gives up when told to).
        assert!(matches!(resources.allocate("other", 1, GIVE_UP), Err(TaskError::Cancelled)));
        // A region restart: the slots stay with the job while the other region holds them.
        resources.release("job", &region_0);
        assert_eq!(free(&resources), 0);
        assert_eq!(resources.allocate("job", 2, NEVER).unwrap(), region_1);
        resources.release("job", &region_1);
        resources.release("job", &region_1);
        assert_eq!(free(&resources), 2, "the last release frees the slots");
        assert!(lock(&resources.ledger).holds_nothing());
    }

    #[test]
    fn a_slot_on_a_lost_taskmanager_is_replaced_and_its_holders_release_cleanly() {
        let (resources, _peers) = resources(&["a", "b", "c"], 1);
        let before = resources.allocate("job", 2, NEVER).unwrap();
        assert_eq!(before.iter().map(|(_, tm, _)| tm.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        lock(&resources.taskmanagers).remove("a");
        lock(&resources.ledger).lost("a");
        // The restarted attempt keeps the slot on b and gets a new one on c for index 0.
        let after = resources.allocate("job", 2, NEVER).unwrap();
        assert_eq!(after[1], before[1]);
        assert_eq!(after[0].1, "c");
        resources.release("job", &before);
        resources.release("job", &after);
        assert_eq!(free(&resources), 2, "b and c are free again");
        assert!(lock(&resources.ledger).holds_nothing());
    }
}
