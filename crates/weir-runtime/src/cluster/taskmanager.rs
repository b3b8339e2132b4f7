//! A TaskManager process: registers its slots with the JobManager, heartbeats, and runs the
//! subtasks the JobManager deploys to it.
//!
//! With high availability the TaskManager finds the leader JobManager in etcd, follows it
//! when it changes, and refuses a JobManager whose leadership epoch is lower than one it
//! followed before. Its subtasks keep running while no leader exists (data keeps flowing
//! between TaskManagers); their reports wait in an outbox, and the registration with the next
//! leader lists every attempt it runs, so the leader takes them over instead of restarting
//! them. Without high availability a lost JobManager ends its jobs here.

use super::memory_guard::{MemoryCheck, MemoryGuard, resident_bytes};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufReader, BufWriter};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use weir_api::graph::StreamGraph;
use weir_api::operator::{SystemClock, TaskMetrics};
use weir_api::snapshot::TaskControl;
use weir_types::{ExecutionState, JobId};

use super::GraphBuilder;
use super::protocol::{
    DeploySpec, Frame, Hardware, RunningAttempt, SubtaskCounters, ToJobManager, ToTaskManager, receive, send,
};
use crate::checkpointing::RestoreSource;
use crate::checkpointing::ended::EndedCheckpoints;
use crate::checkpointing::writer::{SnapshotWriter, WriteOutcome};
use crate::execution::{CheckpointWiring, JobContext, Placement, TaskEvent, TaskEventKind, deploy};
use crate::executor::{ReportedAttempt, ReportedSubtask};
use crate::job_settings::JobSettings;
use crate::jobgraph::JobGraph;
use crate::network::{DataServer, TcpNetwork};
use crate::security::{Plane, WireSecurity};

/// Reports kept while no JobManager is connected, at most (the oldest go first).
const OUTBOX_MAX: usize = 100_000;
/// How often the leader record in etcd is looked at.
const LEADER_POLL: Duration = Duration::from_millis(200);
/// How long a TaskManager waits for the JobManager's welcome after registering.
const WELCOME_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long an attempt whose subtasks all ended is still reported to a new leader.
const ENDED_ATTEMPT_KEPT: Duration = Duration::from_secs(600);

/// Where a TaskManager finds its JobManager.
pub enum JobManagerSource {
    /// A fixed RPC address (no high availability).
    Fixed(String),
    /// The leader the cluster's HA services publish.
    Leader(Arc<weir_ha::HaServices>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The local subtasks of an attempt with their last known state.
type SubtaskStates = Arc<Mutex<BTreeMap<(usize, u32), (ExecutionState, bool)>>>;

struct Attempt {
    region: Option<usize>,
    controls: HashMap<(usize, u32), Sender<TaskControl>>,
    /// Its checkpoints that ended (the JobManager said so).
    ended_checkpoints: Arc<EndedCheckpoints>,
    cancel: Arc<AtomicBool>,
    slot_addresses: Vec<String>,
    states: SubtaskStates,
    /// When every local subtask ended (`None` while some run).
    ended_at: Arc<Mutex<Option<Instant>>>,
}

/// The connection to the current JobManager, or the reports waiting for the next one.
#[derive(Default)]
struct Uplink {
    inner: Mutex<UplinkInner>,
}

#[derive(Default)]
struct UplinkInner {
    link: Option<BufWriter<TcpStream>>,
    outbox: VecDeque<ToJobManager>,
}

impl Uplink {
    /// Sends `message`, or keeps it for the next JobManager (task events and snapshot
    /// outcomes; counters and heartbeats are only worth sending now).
    fn send(&self, message: ToJobManager) -> bool {
        self.send_built(|| message)
    }

    /// Sends the message `build` makes while holding the link, so that counters read by two
    /// threads reach the JobManager in the order they were read: a periodic report read
    /// before a subtask's final counters can never overwrite them.
    fn send_built(&self, build: impl FnOnce() -> ToJobManager) -> bool {
        let mut inner = lock(&self.inner);
        let message = build();
        if let Some(link) = &mut inner.link {
            match send(link, &message) {
                Ok(()) => return true,
                // Too large to send: the JobManager would close the connection for it.
                Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => {
                    tracing::error!(%error, "a report to the JobManager was not sent");
                    return false;
                }
                Err(_) => inner.link = None,
            }
        }
        if matches!(message, ToJobManager::TaskEvent { .. } | ToJobManager::Snapshot { .. }) {
            inner.outbox.push_back(message);
            while inner.outbox.len() > OUTBOX_MAX {
                inner.outbox.pop_front();
            }
        }
        false
    }

    /// Uses `link` from now on, after sending what waited for it.
    fn attach(&self, mut link: BufWriter<TcpStream>) {
        let mut inner = lock(&self.inner);
        while let Some(message) = inner.outbox.pop_front() {
            if send(&mut link, &message).is_err() {
                inner.outbox.push_front(message);
                return;
            }
        }
        inner.link = Some(link);
    }

    fn detach(&self) {
        lock(&self.inner).link = None;
    }

    fn connected(&self) -> bool {
        lock(&self.inner).link.is_some()
    }
}

/// A TaskManager's `heartbeat.interval` (how often it tells the JobManager it is alive) and
/// `heartbeat.timeout` (how long it waits to hear from the JobManager before counting it as
/// gone and, past that, stopping its subtasks: nothing of it runs on as a zombie).
#[derive(Clone, Copy, Debug)]
pub struct Heartbeats {
    /// `heartbeat.interval`.
    pub interval: Duration,
    /// `heartbeat.timeout`.
    pub timeout: Duration,
}

/// What a TaskManager offers and may use: `taskmanager.numberOfTaskSlots` and
/// `taskmanager.memory.process.size`.
#[derive(Clone, Copy, Debug)]
pub struct TaskManagerResources {
    /// The slots it registers.
    pub slots: u32,
    /// The most resident memory the process may hold, bytes; `None` for no limit.
    pub memory_limit: Option<u64>,
}

/// Milliseconds on a process-wide monotonic clock.
fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Where a TaskManager's data server listens and what it tells its peers (Flink's
/// `taskmanager.host`, `taskmanager.bind-host`, `taskmanager.data.port`).
#[derive(Clone, Debug, Default)]
pub struct DataAddresses {
    /// The host peers reach this TaskManager at; `None`: the local address of its
    /// connection to the JobManager (the interface that reaches the cluster).
    pub host: Option<String>,
    /// Where the data server listens; `None`: the advertised host.
    pub bind_host: Option<String>,
    /// The data server's port; 0: any free port.
    pub port: u16,
}

/// `host:port`, with an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// The local address this host uses to reach `address` (`host:port`): what the routing
/// table picks for it, found with a connected UDP socket (nothing is sent).
fn local_address_towards(address: &str) -> std::io::Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs as _;
    let target = address.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{address} resolves to no address"))
    })?;
    let unspecified = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let socket = std::net::UdpSocket::bind(unspecified)?;
    socket.connect(target)?;
    Ok(socket.local_addr()?.ip())
}

/// Everything one TaskManager process shares between its connections.
struct TaskManagerState {
    id: String,
    slots: u32,
    server: Arc<DataServer>,
    /// The data address registered with the JobManager and named in deploys (`host:port`).
    data_address: String,
    builder: GraphBuilder,
    /// By (job, attempt): with region failover several attempts of a job run at once.
    attempts: Mutex<HashMap<(String, u32), Attempt>>,
    uplink: Arc<Uplink>,
    /// The highest leadership epoch followed: a JobManager with a lower one is refused.
    max_epoch: AtomicI64,
    /// High availability: attempts outlive a lost JobManager.
    keep_running: bool,
    /// The connection to the JobManager being served, to close it on shutdown.
    connection: Mutex<Option<TcpStream>>,
    /// Set when the process was asked to stop: no reconnecting.
    stopping: AtomicBool,
    /// When a JobManager was last heard from ([`monotonic_ms`]).
    last_contact_ms: AtomicU64,
    /// When the watchdog last looked ([`monotonic_ms`]): a longer pause than
    /// `heartbeat.timeout` since means the process was stopped (SIGSTOP) or starved that long.
    watchdog_tick_ms: AtomicU64,
    /// `taskmanager.memory.process.size`, watched by the watchdog.
    memory: Option<MemoryGuard>,
}

/// Cancels every attempt still running once no JobManager was heard from for `timeout`: a
/// TaskManager cut off from its JobManager (a partition, a JobManager that hangs) must not run
/// its subtasks on as zombies while the JobManager restarts them elsewhere. A leader's
/// failover ends well within `heartbeat.timeout` (the lease's TTL), so reconciling with a new
/// leader is not affected.
///
/// A process stopped (SIGSTOP) for longer than `timeout` counts as cut off too, whatever it
/// reads on waking: what the JobManager sent before it gave up on this TaskManager still sits
/// in the socket, and the watchdog's own pause tells.
fn stop_zombies(state: &TaskManagerState, timeout: Duration) {
    let now = monotonic_ms();
    let silent_ms = now.saturating_sub(state.last_contact_ms.load(Ordering::SeqCst));
    let stalled_ms = now.saturating_sub(state.watchdog_tick_ms.load(Ordering::SeqCst));
    let timeout_ms = timeout.as_millis() as u64;
    if silent_ms <= timeout_ms && stalled_ms <= timeout_ms {
        return;
    }
    let attempts = lock(&state.attempts);
    let running: Vec<&(String, u32)> = attempts
        .iter()
        .filter(|(_, a)| lock(&a.ended_at).is_none() && !a.cancel.load(Ordering::SeqCst))
        .map(|(key, _)| key)
        .collect();
    if running.is_empty() {
        return;
    }
    tracing::warn!(
        silent_ms,
        stalled_ms,
        attempts = running.len(),
        "no JobManager heard from for longer than heartbeat.timeout (or this process was stopped that long): cancelling this TaskManager's subtasks (the job restarts them elsewhere)"
    );
    for attempt in attempts.values() {
        attempt.cancel.store(true, Ordering::SeqCst);
    }
}

/// How long a stopping TaskManager waits for its cancelled subtasks to end before it
/// deregisters anyway.
const SHUTDOWN_TASKS_WAIT_MAX: Duration = Duration::from_secs(10);

/// Stops a TaskManager gracefully: tells the JobManager it deregisters, cancels every
/// attempt, waits (at most [`SHUTDOWN_TASKS_WAIT_MAX`]) for the subtasks to end (their sinks
/// abort what they staged), and closes the connection.
fn shut_down(state: &TaskManagerState) {
    state.stopping.store(true, Ordering::SeqCst);
    // First out of the JobManager's pool: it fails this TaskManager's subtasks at once and
    // places their restart elsewhere, rather than in a slot here that is going away.
    let deregistered = state.uplink.send(ToJobManager::Deregister);
    let cancelled: usize = {
        let attempts = lock(&state.attempts);
        for attempt in attempts.values() {
            attempt.cancel.store(true, Ordering::SeqCst);
        }
        attempts.values().filter(|a| lock(&a.ended_at).is_none()).count()
    };
    let deadline = Instant::now() + SHUTDOWN_TASKS_WAIT_MAX;
    while Instant::now() < deadline && lock(&state.attempts).values().any(|a| lock(&a.ended_at).is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(connection) = lock(&state.connection).take() {
        let _ = connection.shutdown(std::net::Shutdown::Both);
    }
    eprintln!(
        "TaskManager {}: stopped {cancelled} running attempt(s){}",
        state.id,
        if deregistered { " and deregistered from the JobManager" } else { " (no JobManager connected)" }
    );
}

/// Runs a TaskManager with `resources` against the JobManager `source` names until the
/// process is stopped; reconnects (to the new leader, with HA) when the JobManager goes away.
///
/// Every connection, to the JobManager and to and from other TaskManagers, passes
/// `security`'s handshake; a JobManager that refuses this TaskManager (another shared
/// secret, or none) ends it with that error, since trying again would not change the answer.
pub fn run_taskmanager(
    source: JobManagerSource,
    resources: TaskManagerResources,
    heartbeat: Heartbeats,
    builder: GraphBuilder,
    security: WireSecurity,
    addresses: DataAddresses,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let host = match addresses.host {
        Some(host) => host,
        None => advertised_host(&source),
    };
    let bind_host = addresses.bind_host.unwrap_or_else(|| host.clone());
    let server = start_data_server(&bind_host, addresses.port, &security)?;
    let data_address = host_port(&host, server.address().port());
    let state = Arc::new(TaskManagerState {
        id: JobId::generate().to_string(),
        slots: resources.slots,
        server,
        data_address,
        builder,
        attempts: Mutex::new(HashMap::new()),
        uplink: Arc::new(Uplink::default()),
        max_epoch: AtomicI64::new(0),
        keep_running: matches!(source, JobManagerSource::Leader(_)),
        connection: Mutex::new(None),
        stopping: AtomicBool::new(false),
        last_contact_ms: AtomicU64::new(monotonic_ms()),
        watchdog_tick_ms: AtomicU64::new(monotonic_ms()),
        memory: resources.memory_limit.map(MemoryGuard::new),
    });
    spawn_watchdog(&state, heartbeat.timeout)?;
    let stopped = spawn_stopper(&state, stop)?;
    eprintln!("TaskManager {} listening on {}, data port {}", state.id, state.server.address(), state.data_address);
    loop {
        if state.stopping.load(Ordering::SeqCst) {
            // The stop ran (or runs) on its own thread; it ends with the deregistration.
            let _ = stopped.recv_timeout(SHUTDOWN_TASKS_WAIT_MAX + Duration::from_secs(5));
            return Ok(());
        }
        let Some((jobmanager, leader_epoch)) = find_jobmanager(&source, &state) else {
            std::thread::sleep(LEADER_POLL);
            continue;
        };
        // The watch lives until the end of this round, the wait before reconnecting included.
        let Some((stream, _watch)) = connect(&source, &security, &jobmanager, leader_epoch)? else {
            continue;
        };
        if let Err(error) = follow(&state, stream, &jobmanager, leader_epoch, heartbeat) {
            tracing::warn!(%jobmanager, %error, "connection to the JobManager failed");
        }
        if state.stopping.load(Ordering::SeqCst) {
            continue;
        }
        lost_jobmanager(&state, &jobmanager);
    }
}

/// Starts the data server on `bind_host:port`.
fn start_data_server(bind_host: &str, port: u16, security: &WireSecurity) -> std::io::Result<Arc<DataServer>> {
    DataServer::start(&host_port(bind_host, port), security.clone()).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot listen for data connections on {}: {e}; set taskmanager.bind-host and taskmanager.data.port",
                host_port(bind_host, port)
            ),
        )
    })
}

/// Starts the thread that cancels the subtasks of a TaskManager cut off from its JobManager
/// ([`stop_zombies`]).
/// Over `taskmanager.memory.process.size`: cancels every running attempt, whose subtasks then
/// report the limit as their failure (see [`EventReporter::report`]).
fn fail_over_memory(state: &TaskManagerState) {
    let (Some(guard), Some(resident)) = (&state.memory, resident_bytes()) else { return };
    match guard.check(resident, &state.id) {
        MemoryCheck::Within => return,
        MemoryCheck::Exceeded(reason) => tracing::error!("{reason}"),
        MemoryCheck::StillOver => {}
    }
    for attempt in lock(&state.attempts).values() {
        if lock(&attempt.ended_at).is_none() {
            attempt.cancel.store(true, Ordering::SeqCst);
        }
    }
}

fn spawn_watchdog(state: &Arc<TaskManagerState>, timeout: Duration) -> std::io::Result<()> {
    let state = Arc::clone(state);
    std::thread::Builder::new().name("weir-tm-watchdog".into()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            stop_zombies(&state, timeout);
            fail_over_memory(&state);
            state.watchdog_tick_ms.store(monotonic_ms(), Ordering::SeqCst);
        }
    })?;
    Ok(())
}

/// Starts the thread that shuts the TaskManager down once `stop` is set; the receiver hears
/// when it is done.
fn spawn_stopper(
    state: &Arc<TaskManagerState>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<crossbeam_channel::Receiver<()>> {
    let (stopped_sender, stopped) = crossbeam_channel::bounded::<()>(1);
    let state = Arc::clone(state);
    std::thread::Builder::new().name("weir-tm-stop".into()).spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        shut_down(&state);
        let _ = stopped_sender.send(());
    })?;
    Ok(stopped)
}

/// Connects to the JobManager at `jobmanager` and passes the handshake: the connection, with
/// the [`LeaderWatch`] that ends it when etcd names another leader; `None` (after a pause)
/// when it should be tried again; an error when the JobManager refused this TaskManager.
fn connect(
    source: &JobManagerSource,
    security: &WireSecurity,
    jobmanager: &str,
    leader_epoch: Option<i64>,
) -> std::io::Result<Option<(TcpStream, Option<LeaderWatch>)>> {
    let stream = match crate::network::connect_to(jobmanager, crate::network::CONNECT_ATTEMPT_TIMEOUT) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%jobmanager, %error, "JobManager not reachable; retrying");
            std::thread::sleep(Duration::from_millis(200));
            return Ok(None);
        }
    };
    // From the first byte on, not only once registered: a JobManager that stopped leading
    // (cut off from etcd, frozen) may still complete TCP handshakes on its port without
    // ever answering, and the TaskManager must go to the new leader as soon as etcd
    // names it rather than wait out the handshake's timeout.
    let watch = match (source, leader_epoch) {
        (JobManagerSource::Leader(ha), Some(epoch)) => LeaderWatch::start(Arc::clone(ha), epoch, &stream),
        _ => None,
    };
    match security.connect(stream, Plane::Control) {
        Ok(stream) => Ok(Some((stream, watch))),
        Err(error) if error.is_refusal() => {
            tracing::error!(%jobmanager, %error, "refused");
            Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, error.to_string()))
        }
        Err(error) => {
            tracing::warn!(%jobmanager, %error, "no handshake with the JobManager; retrying");
            std::thread::sleep(Duration::from_millis(200));
            Ok(None)
        }
    }
}

/// After the connection to the JobManager ended (not for a stop): reports wait for the next
/// one, and without HA the attempts end; a pause before reconnecting.
fn lost_jobmanager(state: &TaskManagerState, jobmanager: &str) {
    state.uplink.detach();
    if !state.keep_running {
        // Without HA no JobManager will ever take these subtasks over.
        for attempt in lock(&state.attempts).values() {
            attempt.cancel.store(true, Ordering::SeqCst);
        }
    }
    tracing::warn!(%jobmanager, "lost the JobManager; reconnecting");
    std::thread::sleep(Duration::from_millis(100));
}

/// The host to advertise when `taskmanager.host` is not set: the local address of the route
/// to the JobManager (found again until the JobManager or its leader record is known). A
/// TaskManager on another host thus advertises an address its peers reach without any
/// configuration; on one machine with the default loopback JobManager it is 127.0.0.1.
fn advertised_host(source: &JobManagerSource) -> String {
    let mut warned = false;
    loop {
        let jobmanager = match source {
            JobManagerSource::Fixed(address) => Some(address.clone()),
            JobManagerSource::Leader(ha) => ha.leader().ok().flatten().map(|(info, _)| info.rpc_address),
        };
        if let Some(jobmanager) = jobmanager {
            match local_address_towards(&jobmanager) {
                Ok(ip) => return ip.to_string(),
                Err(error) if !warned => {
                    tracing::warn!(%jobmanager, %error, "cannot tell which local address reaches the JobManager; retrying (or set taskmanager.host)");
                    warned = true;
                }
                Err(_) => {}
            }
        }
        std::thread::sleep(LEADER_POLL);
    }
}

/// The JobManager to connect to: the fixed address, or the leader in etcd (with its epoch).
fn find_jobmanager(source: &JobManagerSource, state: &TaskManagerState) -> Option<(String, Option<i64>)> {
    match source {
        JobManagerSource::Fixed(address) => Some((address.clone(), None)),
        JobManagerSource::Leader(ha) => match ha.leader() {
            Ok(Some((info, epoch))) if epoch >= state.max_epoch.load(Ordering::SeqCst) => {
                Some((info.rpc_address, Some(epoch)))
            }
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%error, "cannot look up the leader JobManager in etcd; retrying");
                None
            }
        },
    }
}

/// Follows the leader in etcd while a connection to the JobManager of `epoch` lasts (its
/// handshake, registration and service): another epoch, or none at all, shuts the connection
/// down, also when the old leader's socket stays open (a frozen process, or one that stopped
/// leading and no longer accepts). Stops when dropped.
struct LeaderWatch {
    alive: Arc<AtomicBool>,
}

impl LeaderWatch {
    fn start(ha: Arc<weir_ha::HaServices>, epoch: i64, stream: &TcpStream) -> Option<LeaderWatch> {
        let watched = stream.try_clone().ok()?;
        let alive = Arc::new(AtomicBool::new(true));
        let watching = Arc::clone(&alive);
        std::thread::Builder::new()
            .name("weir-tm-leader-watch".into())
            .spawn(move || {
                while watching.load(Ordering::SeqCst) {
                    std::thread::sleep(LEADER_POLL);
                    match ha.leader() {
                        Ok(Some((_, leader))) if leader == epoch => {}
                        Ok(_) if watching.load(Ordering::SeqCst) => {
                            tracing::warn!(epoch, "the JobManager this TaskManager follows is no longer the leader");
                            let _ = watched.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Ok(_) | Err(_) => {}
                    }
                }
            })
            .ok()?;
        Some(LeaderWatch { alive })
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
    }
}

/// Registers with the JobManager on `stream` and serves it until the connection ends (with
/// HA, a [`LeaderWatch`] ends it when etcd names another leader).
fn follow(
    state: &Arc<TaskManagerState>,
    stream: TcpStream,
    jobmanager: &str,
    leader_epoch: Option<i64>,
    heartbeat: Heartbeats,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    // Back after heartbeat.timeout without a JobManager (a process frozen and woken, a
    // partition healed before the watchdog's next look): its subtasks were restarted
    // elsewhere, so they stop now, before this JobManager hears of them.
    stop_zombies(state, heartbeat.timeout);
    let mut writer = BufWriter::new(stream.try_clone()?);
    let register = ToJobManager::Register {
        taskmanager_id: state.id.clone(),
        slots: state.slots,
        data_address: state.data_address.clone(),
        running: running_attempts(state),
        hardware: Hardware::of_this_machine(),
    };
    send(&mut writer, &register)?;
    stream.set_read_timeout(Some(WELCOME_WAIT_MAX))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let epoch = match receive::<Frame<ToTaskManager>>(&mut reader)? {
        Some(Frame { epoch, message: ToTaskManager::Welcome }) => epoch,
        _ => return Err(std::io::Error::other("the JobManager did not answer the registration")),
    };
    // The JobManager heartbeats every fifth of heartbeat.timeout: silence for the whole
    // timeout means it is gone (or cut off), even when no connection reset ever arrives.
    stream.set_read_timeout(Some(heartbeat.timeout))?;
    state.last_contact_ms.store(monotonic_ms(), Ordering::SeqCst);
    let followed = state.max_epoch.load(Ordering::SeqCst);
    if epoch < followed {
        return Err(std::io::Error::other(format!(
            "the JobManager at {jobmanager} leads epoch {epoch}, older than epoch {followed} this TaskManager follows; refused"
        )));
    }
    if let Some(named) = leader_epoch.filter(|&named| named != epoch) {
        // It lost the leadership etcd named it for and won another since: look it up again.
        return Err(std::io::Error::other(format!(
            "the JobManager at {jobmanager} leads epoch {epoch}, not epoch {named} etcd named it for; looking the leader up again"
        )));
    }
    state.max_epoch.store(epoch, Ordering::SeqCst);
    state.uplink.attach(writer);
    *lock(&state.connection) = stream.try_clone().ok();
    eprintln!("TaskManager {} registered at {jobmanager} with {} slots", state.id, state.slots);
    let alive = Arc::new(AtomicBool::new(true));
    {
        let uplink = Arc::clone(&state.uplink);
        let alive = Arc::clone(&alive);
        std::thread::spawn(move || {
            while alive.load(Ordering::SeqCst) && uplink.send(ToJobManager::Heartbeat) {
                std::thread::sleep(heartbeat.interval);
            }
        });
    }
    serve_jobmanager(state, reader);
    alive.store(false, Ordering::SeqCst);
    Ok(())
}

/// Every attempt this TaskManager runs (or ran recently), with its local subtasks' states.
fn running_attempts(state: &TaskManagerState) -> Vec<RunningAttempt> {
    let mut attempts = lock(&state.attempts);
    attempts.retain(|_, attempt| lock(&attempt.ended_at).is_none_or(|at| at.elapsed() < ENDED_ATTEMPT_KEPT));
    let mut running = Vec::new();
    for ((job_id, number), attempt) in attempts.iter() {
        let subtasks = lock(&attempt.states)
            .iter()
            .map(|((vertex, subtask), (state, data_ended))| ReportedSubtask {
                vertex: *vertex,
                subtask: *subtask,
                state: *state,
                data_ended: *data_ended,
                taskmanager: String::new(),
            })
            .collect();
        running.push(RunningAttempt {
            job_id: job_id.clone(),
            attempt: ReportedAttempt {
                attempt: *number,
                region: attempt.region,
                slot_addresses: attempt.slot_addresses.clone(),
                subtasks,
            },
        });
    }
    running
}

/// The message of `frame`, unless a JobManager of an older leadership than the newest one
/// this TaskManager has seen sent it: that one is refused (dropped, with a warning).
fn admit(max_epoch: &AtomicI64, frame: Frame<ToTaskManager>) -> Option<ToTaskManager> {
    let highest = max_epoch.fetch_max(frame.epoch, Ordering::SeqCst);
    if frame.epoch < highest {
        tracing::warn!(
            epoch = frame.epoch,
            highest,
            "refused a message from the JobManager of epoch {}: this TaskManager follows epoch {highest}",
            frame.epoch
        );
        return None;
    }
    Some(frame.message)
}

/// Serves the JobManager's messages on `reader` until the connection ends or falls silent
/// for `heartbeat.timeout`.
fn serve_jobmanager(state: &Arc<TaskManagerState>, mut reader: BufReader<TcpStream>) {
    while let Some(frame) = next_frame(&mut reader) {
        let Some(message) = admit(&state.max_epoch, frame) else { continue };
        state.last_contact_ms.store(monotonic_ms(), Ordering::SeqCst);
        match message {
            ToTaskManager::Welcome | ToTaskManager::Heartbeat => {}
            ToTaskManager::Deploy(spec) if state.stopping.load(Ordering::SeqCst) => {
                // Sent before the JobManager read the deregistration: the job master hears of
                // this TaskManager's loss and places the attempt again.
                tracing::info!(job_id = %spec.job_id, attempt = spec.attempt, "not deployed: this TaskManager is stopping");
            }
            ToTaskManager::Deploy(spec) => deploy_attempt(state, &spec),
            ToTaskManager::Control { job_id, attempt, vertex, subtask, control } => {
                pass_control(state, (job_id, attempt), (vertex, subtask), control);
            }
            ToTaskManager::Cancel { job_id, attempt } => {
                // Nothing of the attempt will claim a connection here any more (also when its
                // deploy never got this far).
                state.server.attempt_ended(&job_id, attempt);
                if let Some(current) = lock(&state.attempts).get(&(job_id, attempt)) {
                    current.cancel.store(true, Ordering::SeqCst);
                }
            }
        }
    }
}

/// The next frame from the JobManager; `None` when the connection ended or nothing came
/// within `heartbeat.timeout`.
fn next_frame(reader: &mut BufReader<TcpStream>) -> Option<Frame<ToTaskManager>> {
    match receive::<Frame<ToTaskManager>>(reader) {
        Ok(Some(frame)) => Some(frame),
        Ok(None) => None,
        Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            tracing::warn!("nothing heard from the JobManager within heartbeat.timeout; reconnecting");
            None
        }
        Err(_) => None,
    }
}

/// Starts the attempt `spec` deploys, in place of the job's attempts it overlaps; a failure
/// to start is reported to the job master.
fn deploy_attempt(state: &Arc<TaskManagerState>, spec: &DeploySpec) {
    // A new attempt replaces the job's attempts it overlaps: all of them for a whole
    // job deploy, the same region's for a region deploy.
    lock(&state.attempts).retain(|(job_id, number), old| {
        let replaced =
            *job_id == spec.job_id && (spec.region.is_none() || old.region.is_none() || old.region == spec.region);
        if replaced {
            old.cancel.store(true, Ordering::SeqCst);
            state.server.attempt_ended(job_id, *number);
        }
        !replaced
    });
    match start_attempt(spec, state) {
        Ok(attempt) => {
            lock(&state.attempts).insert((spec.job_id.clone(), spec.attempt), attempt);
        }
        Err(error) => {
            // Tell the job master, so the job fails or restarts instead of waiting.
            tracing::error!(job_id = %spec.job_id, %error, "cannot deploy");
            let mine = state.data_address.clone();
            let slot = spec.slot_addresses.iter().position(|a| *a == mine).unwrap_or(0);
            let event = TaskEvent {
                vertex: 0,
                subtask: slot as u32,
                kind: TaskEventKind::Failed(weir_api::error::TaskError::external(
                    format!("deploying on the TaskManager at {mine}"),
                    error,
                )),
            };
            state.uplink.send(ToJobManager::TaskEvent { job_id: spec.job_id.clone(), attempt: spec.attempt, event });
        }
    }
}

/// Passes `control` to subtask `(vertex, subtask)` of attempt `(job_id, attempt)`; the end of
/// a checkpoint also reaches the job's other attempts here.
fn pass_control(
    state: &TaskManagerState,
    (job_id, attempt): (String, u32),
    (vertex, subtask): (usize, u32),
    control: TaskControl,
) {
    let attempts = lock(&state.attempts);
    if let TaskControl::CheckpointComplete(id) | TaskControl::CheckpointAborted(id) = control {
        // Late snapshots of an ended checkpoint are not written.
        for (_, current) in attempts.iter().filter(|((job, _), _)| *job == job_id) {
            current.ended_checkpoints.end(id);
        }
    }
    if let Some(current) = attempts.get(&(job_id, attempt))
        && let Some(sender) = current.controls.get(&(vertex, subtask))
    {
        let _ = sender.send(control);
    }
}

/// Builds the attempt `spec` deploys, starts its local subtasks, and reports their events,
/// counters and snapshots to the JobManager until the attempt ends.
fn start_attempt(spec: &DeploySpec, state: &Arc<TaskManagerState>) -> Result<Attempt, String> {
    let (graph, job_graph) = build_graphs(spec, state)?;
    let job_id: JobId = spec.job_id.parse().map_err(|e: weir_types::ids::BadJobId| e.to_string())?;
    let placement = attempt_placement(spec, state, &job_graph);
    let restore = spec.restore.as_ref().map(|location| restore_source(location, &graph, &job_graph)).transpose()?;
    let cancel = Arc::new(AtomicBool::new(false));
    let job_ctx = JobContext {
        job_id,
        job_name: spec.job_name.clone(),
        cancel: Arc::clone(&cancel),
        clock: Arc::new(SystemClock),
        attempt: spec.attempt,
        placement,
    };
    let metrics = job_graph.new_task_metrics();
    let channels = ControlChannels::of(&job_graph, &job_ctx.placement);
    let ended_checkpoints = EndedCheckpoints::new();
    let (outcomes, outcome_receiver) = crossbeam_channel::unbounded::<WriteOutcome>();
    let writer = SnapshotWriter::start(outcomes).map_err(|e| e.to_string())?;
    let wiring = CheckpointWiring {
        exactly_once: spec.exactly_once,
        ended: Arc::clone(&ended_checkpoints),
        writer: writer.queue(),
        restore: restore.map(Arc::new),
        final_checkpoint: spec.final_checkpoint,
        incremental: spec.incremental,
        spill: spec.spill.clone(),
    };
    let (events, event_receiver) = crossbeam_channel::unbounded::<TaskEvent>();
    let threads = deploy(&graph, &job_graph, &job_ctx, &metrics, channels.receivers, &wiring, &events)
        .map_err(|e| e.to_string())?;
    drop(events);
    let ended = Arc::new(AtomicBool::new(false));
    let ended_at = Arc::new(Mutex::new(None));
    let local = local_counters(&job_ctx.placement, metrics);
    report_metrics(spec, &state.uplink, Arc::clone(&local), Arc::clone(&ended));
    // Report events and snapshot outcomes to the JobManager until the attempt ends.
    let reporter = EventReporter {
        taskmanager: Arc::clone(state),
        job_id: spec.job_id.clone(),
        attempt: spec.attempt,
        states: Arc::clone(&channels.states),
        ended_at: Arc::clone(&ended_at),
        ended,
        local,
    };
    std::thread::spawn(move || reporter.run(event_receiver, threads, writer));
    report_outcomes(spec, &state.uplink, outcome_receiver);
    Ok(Attempt {
        region: spec.region,
        controls: channels.senders,
        ended_checkpoints,
        cancel,
        slot_addresses: spec.slot_addresses.clone(),
        states: channels.states,
        ended_at,
    })
}

/// The stream graph of `spec`'s job and its job graph, built as the JobManager built them.
fn build_graphs(spec: &DeploySpec, state: &TaskManagerState) -> Result<(Arc<StreamGraph>, Arc<JobGraph>), String> {
    let graph = Arc::new((state.builder)(&spec.submission)?);
    let settings = JobSettings {
        max_parallelism: Some(spec.max_parallelism),
        auto_watermark_interval_ms: spec.auto_watermark_interval_ms,
        ..JobSettings::with_parallelism(spec.default_parallelism)
    };
    let job_graph = Arc::new(JobGraph::build(&graph, &settings).map_err(|e| e.to_string())?);
    Ok((graph, job_graph))
}

/// Which subtasks of `spec`'s attempt run on this TaskManager (those of its slots, of the
/// region deployed), and how their channels reach the others.
fn attempt_placement(spec: &DeploySpec, state: &TaskManagerState, job_graph: &JobGraph) -> Placement {
    let my_address = state.data_address.clone();
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
        server: Arc::clone(&state.server),
        address_of: Arc::new(move |_vertex, subtask| address_slots.get(subtask as usize).cloned()),
    };
    Placement { is_local: Arc::new(is_local), network: Some(Arc::new(network)) }
}

/// The control channels of an attempt's subtasks, and the states of its local ones.
struct ControlChannels {
    /// By (vertex, subtask).
    senders: HashMap<(usize, u32), Sender<TaskControl>>,
    /// Per vertex, per subtask, as [`deploy`] takes them.
    receivers: Vec<Vec<crossbeam_channel::Receiver<TaskControl>>>,
    /// The local subtasks, deploying.
    states: SubtaskStates,
}

impl ControlChannels {
    fn of(job_graph: &JobGraph, placement: &Placement) -> ControlChannels {
        let mut senders = HashMap::new();
        let mut control_receivers = Vec::new();
        let states: SubtaskStates = Arc::new(Mutex::new(BTreeMap::new()));
        for (vertex_index, vertex) in job_graph.vertices.iter().enumerate() {
            let mut receivers = Vec::new();
            for subtask in 0..vertex.parallelism {
                let (sender, receiver) = crossbeam_channel::unbounded();
                senders.insert((vertex_index, subtask), sender);
                receivers.push(receiver);
                if (placement.is_local)(vertex_index, subtask) {
                    lock(&states).insert((vertex_index, subtask), (ExecutionState::Deploying, false));
                }
            }
            control_receivers.push(receivers);
        }
        ControlChannels { senders, receivers: control_receivers, states }
    }
}

/// Reports an attempt's subtask events to the JobManager, and ends the attempt once its
/// subtasks all ended.
struct EventReporter {
    taskmanager: Arc<TaskManagerState>,
    job_id: String,
    attempt: u32,
    states: SubtaskStates,
    ended_at: Arc<Mutex<Option<Instant>>>,
    /// Set when the attempt ended: its counters are no longer reported.
    ended: Arc<AtomicBool>,
    local: LocalCounters,
}

impl EventReporter {
    fn run(
        self,
        events: crossbeam_channel::Receiver<TaskEvent>,
        threads: Vec<std::thread::JoinHandle<()>>,
        writer: SnapshotWriter,
    ) {
        for event in events {
            self.report(event);
        }
        for thread in threads {
            let _ = thread.join();
        }
        self.ended.store(true, Ordering::SeqCst);
        *lock(&self.ended_at) = Some(Instant::now());
        self.taskmanager.server.attempt_ended(&self.job_id, self.attempt);
        writer.shutdown();
    }

    /// Waits, up to [`BRIDGE_FLUSH_MAX`], until the outbound bridges of subtask `subtask` of
    /// vertex `vertex` sent its end of partition (a slow consumer's credits hold them).
    fn wait_for_bridges(&self, vertex: usize, subtask: u32) {
        let Some((_, _, metrics)) = self.local.iter().find(|(v, s, _)| *v == vertex && *s == subtask) else { return };
        let deadline = Instant::now() + BRIDGE_FLUSH_MAX;
        while metrics.bridges_sending.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn report(&self, mut event: TaskEvent) {
        let (taskmanager, uplink, attempt) = (&self.taskmanager, &self.taskmanager.uplink, self.attempt);
        if matches!(event.kind, TaskEventKind::Canceled) && taskmanager.stopping.load(Ordering::SeqCst) {
            // Cancelled because this TaskManager stops, not because the job master asked:
            // for the job that is a failure (its subtasks must run elsewhere).
            event.kind = TaskEventKind::Failed(weir_api::error::TaskError::external(
                format!("TaskManager {} at {}", taskmanager.id, taskmanager.data_address),
                "the TaskManager shut down (it was stopped, e.g. by SIGTERM)",
            ));
        } else if matches!(event.kind, TaskEventKind::Canceled)
            && let Some(reason) = taskmanager.memory.as_ref().and_then(MemoryGuard::failure)
        {
            // Cancelled by the memory watch: the job fails over with the reason.
            event.kind = TaskEventKind::Failed(weir_api::error::TaskError::external(
                format!("TaskManager {} at {}", taskmanager.id, taskmanager.data_address),
                reason,
            ));
        }
        note_state(&self.states, &event);
        // A subtask's final counters go ahead of its terminal event, while the JobManager
        // still routes this attempt's reports; a finished one's once its bridges to other
        // processes sent their last bytes.
        if matches!(event.kind, TaskEventKind::Finished) {
            self.wait_for_bridges(event.vertex, event.subtask);
        }
        if !matches!(event.kind, TaskEventKind::Initializing | TaskEventKind::Running) {
            uplink.send_built(|| {
                let subtasks: Vec<SubtaskCounters> = self
                    .local
                    .iter()
                    .filter(|(vertex, subtask, _)| *vertex == event.vertex && *subtask == event.subtask)
                    .map(|(vertex, subtask, m)| counters(*vertex, *subtask, m))
                    .collect();
                ToJobManager::Metrics { job_id: self.job_id.clone(), attempt, subtasks }
            });
        }
        uplink.send(ToJobManager::TaskEvent { job_id: self.job_id.clone(), attempt, event });
    }
}

/// Reports the attempt's snapshot outcomes to the JobManager as they come.
fn report_outcomes(spec: &DeploySpec, uplink: &Arc<Uplink>, outcomes: crossbeam_channel::Receiver<WriteOutcome>) {
    let uplink = Arc::clone(uplink);
    let (snapshot_job, attempt) = (spec.job_id.clone(), spec.attempt);
    std::thread::spawn(move || {
        for outcome in outcomes {
            uplink.send(ToJobManager::Snapshot { job_id: snapshot_job.clone(), attempt, outcome });
        }
    });
}

/// Keeps a local subtask's last state for the registration with a new leader.
fn note_state(states: &SubtaskStates, event: &TaskEvent) {
    let mut states = lock(states);
    let Some((state, data_ended)) = states.get_mut(&(event.vertex, event.subtask)) else {
        return;
    };
    match &event.kind {
        TaskEventKind::Initializing => *state = ExecutionState::Initializing,
        TaskEventKind::Running => *state = ExecutionState::Running,
        TaskEventKind::EndOfData => *data_ended = true,
        TaskEventKind::Finished => *state = ExecutionState::Finished,
        TaskEventKind::Failed(_) => *state = ExecutionState::Failed,
        TaskEventKind::Canceled => *state = ExecutionState::Canceled,
    }
}

/// How often a TaskManager reports its subtasks' counters to the JobManager.
const METRICS_INTERVAL: Duration = Duration::from_millis(200);
/// How long a finished subtask's final counters wait for its bridges to other processes.
const BRIDGE_FLUSH_MAX: Duration = Duration::from_secs(10);

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
        idle_ms: metrics.idle_ms_now(),
        restored_bytes: metrics.restored_bytes.load(Ordering::Relaxed),
        operators: metrics.operators.iter().map(|o| o.records_out.load(Ordering::Relaxed)).collect(),
        splits: metrics.splits(),
        records_skipped: metrics.records_skipped.load(Ordering::Relaxed),
        records_late: metrics.records_late.load(Ordering::Relaxed),
        records_late_dropped: metrics.records_late_dropped.load(Ordering::Relaxed),
        input_watermark: metrics.input_watermark.load(Ordering::Relaxed),
        output_watermarks: metrics.operators.iter().map(|o| o.output_watermark.load(Ordering::Relaxed)).collect(),
        bytes_in: metrics.bytes_in.load(Ordering::Relaxed),
        bytes_out: metrics.bytes_out.load(Ordering::Relaxed),
        records_send_errors: metrics.records_send_errors.load(Ordering::Relaxed),
    }
}

/// Reports the local subtasks' counters every [`METRICS_INTERVAL`] until the attempt ended
/// (each subtask's final counters go with its terminal event); none while no JobManager is
/// connected.
fn report_metrics(spec: &DeploySpec, uplink: &Arc<Uplink>, local: LocalCounters, ended: Arc<AtomicBool>) {
    let uplink = Arc::clone(uplink);
    let (job_id, attempt) = (spec.job_id.clone(), spec.attempt);
    std::thread::spawn(move || {
        while !ended.load(Ordering::SeqCst) {
            if uplink.connected() {
                uplink.send_built(|| {
                    let subtasks = local.iter().map(|(vertex, subtask, m)| counters(*vertex, *subtask, m)).collect();
                    ToJobManager::Metrics { job_id: job_id.clone(), attempt, subtasks }
                });
            }
            std::thread::sleep(METRICS_INTERVAL);
        }
    });
}

/// The same restore plan the JobManager made (it is a pure function of the snapshot and the
/// job graph).
fn restore_source(
    location: &str,
    graph: &weir_api::graph::StreamGraph,
    job_graph: &JobGraph,
) -> Result<RestoreSource, String> {
    let request = crate::cluster::resources::restore_request(graph, job_graph, true);
    RestoreSource::open(location, &request).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_keeps_events_and_outcomes_but_not_counters() {
        let uplink = Uplink::default();
        let event = TaskEvent { vertex: 0, subtask: 1, kind: TaskEventKind::Running };
        assert!(!uplink.send(ToJobManager::TaskEvent { job_id: "j".into(), attempt: 0, event }));
        assert!(!uplink.send(ToJobManager::Heartbeat));
        assert!(!uplink.send(ToJobManager::Metrics { job_id: "j".into(), attempt: 0, subtasks: Vec::new() }));
        assert_eq!(lock(&uplink.inner).outbox.len(), 1);
    }

    #[test]
    fn messages_of_an_older_leader_epoch_are_refused() {
        let max_epoch = AtomicI64::new(0);
        let cancel = |epoch| Frame { epoch, message: ToTaskManager::Cancel { job_id: "j".into(), attempt: 0 } };
        assert!(admit(&max_epoch, cancel(7)).is_some());
        assert_eq!(max_epoch.load(Ordering::SeqCst), 7);
        assert!(admit(&max_epoch, cancel(7)).is_some(), "the leader followed");
        assert!(admit(&max_epoch, cancel(3)).is_none(), "an older leader's message was accepted");
        assert!(admit(&max_epoch, Frame { epoch: 6, message: ToTaskManager::Welcome }).is_none());
        assert_eq!(max_epoch.load(Ordering::SeqCst), 7, "an older message lowered the epoch followed");
        assert!(admit(&max_epoch, cancel(9)).is_some(), "a newer leader's message was refused");
        assert_eq!(max_epoch.load(Ordering::SeqCst), 9);
        // On the wire: the epoch travels with the message.
        let line = serde_json::to_string(&cancel(9)).unwrap();
        assert!(line.starts_with(r#"{"epoch":9,"message":{"Cancel""#), "{line}");
    }
}
