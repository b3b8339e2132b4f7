//! The data side of a TaskManager: a listener that accepts channel connections from other
//! processes, and the [`NetworkWiring`] that connects this process's producers to them.
//!
//! A connection starts with the handshake of [`crate::security`] (the cluster's shared
//! secret, and TLS when configured), then one frame naming the channel (job, attempt, edge,
//! producer, consumer) as JSON; after that it carries `weir_api::network`'s protocol.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weir_api::error::TaskError;
use weir_api::network::{read_frame_of_at_most, write_frame};

use crate::execution::NetworkWiring;
use crate::security::{Plane, WireSecurity};

/// How long a consumer waits for its producer's connection, and a producer retries to reach
/// its consumer's process, before the channel (and so the attempt) fails.
pub const CHANNEL_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Which channel a connection carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChannelKey {
    /// The job.
    pub job_id: String,
    /// The attempt (connections of an earlier attempt are never mixed in).
    pub attempt: u32,
    /// The job edge.
    pub edge: usize,
    /// Producer subtask.
    pub producer: u32,
    /// Consumer subtask.
    pub consumer: u32,
}

/// How long a connection nobody claimed is kept before it is closed. A consumer claims its
/// connection as soon as its attempt is deployed here (it waits up to
/// [`CHANNEL_CONNECT_TIMEOUT`] for it); a connection still unclaimed after twice that has no
/// consumer coming (its attempt never started here, or failed before it got this far).
pub const UNCLAIMED_CONNECTION_KEPT_MAX: Duration = Duration::from_secs(2 * CHANNEL_CONNECT_TIMEOUT.as_secs());

/// The channel connections that arrived and no consumer claimed yet, and the attempts known
/// to be over in this process (whose connections nobody will ever claim).
#[derive(Default)]
struct Channels {
    /// Unclaimed connections with the time each arrived.
    unclaimed: HashMap<ChannelKey, (TcpStream, Instant)>,
    /// `(job, attempt)` -> when this process learned that the attempt is over here.
    ended: HashMap<(String, u32), Instant>,
}

impl Channels {
    /// Files `stream` under `key`, unless its attempt is over here (then it is closed).
    /// Connections of other attempts, of this job or any other, are never touched: the
    /// pipelined regions of a job run as attempts of their own, side by side.
    fn file(&mut self, key: ChannelKey, stream: TcpStream, now: Instant) {
        self.forget_stale(now);
        if self.ended.contains_key(&(key.job_id.clone(), key.attempt)) {
            tracing::debug!(?key, "a connection for an attempt that is over here; closed");
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        self.unclaimed.insert(key, (stream, now));
    }

    /// Closes what attempt `(job_id, attempt)` left unclaimed, and every connection of it
    /// that still arrives.
    fn attempt_ended(&mut self, job_id: &str, attempt: u32, now: Instant) {
        self.forget_stale(now);
        self.unclaimed.retain(|key, (stream, _)| {
            let of_it = key.job_id == job_id && key.attempt == attempt;
            if of_it {
                let _ = stream.shutdown(Shutdown::Both);
            }
            !of_it
        });
        self.ended.insert((job_id.to_string(), attempt), now);
    }

    /// Closes connections unclaimed for longer than [`UNCLAIMED_CONNECTION_KEPT_MAX`], and
    /// forgets ended attempts as old.
    fn forget_stale(&mut self, now: Instant) {
        self.unclaimed.retain(|key, (stream, arrived)| {
            let stale = now.saturating_duration_since(*arrived) > UNCLAIMED_CONNECTION_KEPT_MAX;
            if stale {
                tracing::warn!(
                    ?key,
                    "no subtask claimed this data connection within {UNCLAIMED_CONNECTION_KEPT_MAX:?}; closed"
                );
                let _ = stream.shutdown(Shutdown::Both);
            }
            !stale
        });
        self.ended.retain(|_, at| now.saturating_duration_since(*at) <= UNCLAIMED_CONNECTION_KEPT_MAX);
    }
}

type Registry = Arc<(Mutex<Channels>, Condvar)>;

/// Accepts channel connections for the subtasks of this process.
pub struct DataServer {
    address: SocketAddr,
    registry: Registry,
    /// How connections to and from it are authenticated.
    security: WireSecurity,
}

/// Connections that have not named their channel yet, at most: more are closed at once, so
/// a flood of idle connections ties up no more than this many threads (each for at most
/// the handshake's and the header's timeouts).
pub const PENDING_DATA_CONNECTIONS_MAX: usize = 256;

/// A data connection must name its channel within this time, in a header of at most
/// [`CHANNEL_HEADER_BYTES_MAX`] bytes, or it is dropped.
const CHANNEL_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CHANNEL_HEADER_BYTES_MAX: usize = 4096;

/// Reads the header naming a connection's channel and files the connection under it; a
/// connection that does not name its channel in time is dropped.
fn register_channel(stream: TcpStream, registry: &Registry, security: &WireSecurity) {
    let peer = stream.peer_addr().map_or_else(|_| "an unknown peer".to_string(), |a| a.to_string());
    let mut stream = match security.accept(stream, Plane::Data) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(%peer, %error, "refused a data connection");
            return;
        }
    };
    if stream.set_read_timeout(Some(CHANNEL_HEADER_TIMEOUT)).is_err() {
        return;
    }
    let mut header = Vec::new();
    let Ok(true) = read_frame_of_at_most(&mut stream, &mut header, CHANNEL_HEADER_BYTES_MAX) else { return };
    let Ok(key) = serde_json::from_slice::<ChannelKey>(&header) else { return };
    // Records may pause for any time: the bridge waits as long as the connection lives.
    if stream.set_read_timeout(None).is_err() {
        return;
    }
    let (channels, arrived) = &**registry;
    lock(channels).file(key, stream, Instant::now());
    arrived.notify_all();
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl DataServer {
    /// Listens on `bind` (port 0: any free port) and accepts connections on a thread; each
    /// connection must pass `security`'s handshake (as must this process's connections to
    /// other data servers, [`TcpNetwork`]).
    pub fn start(bind: &str, security: WireSecurity) -> std::io::Result<Arc<DataServer>> {
        let listener = TcpListener::bind(bind)?;
        let address = listener.local_addr()?;
        let registry: Registry = Arc::new((Mutex::new(Channels::default()), Condvar::new()));
        let accepted = Arc::clone(&registry);
        let accepting_security = security.clone();
        let pending = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new().name("weir-data-server".into()).spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if pending.fetch_add(1, Ordering::SeqCst) >= PENDING_DATA_CONNECTIONS_MAX {
                    pending.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(
                        peer = ?stream.peer_addr().ok(),
                        "{PENDING_DATA_CONNECTIONS_MAX} data connections are still naming their channels; this one is closed"
                    );
                    continue;
                }
                // Each connection names its channel on a thread of its own: a peer that
                // connects and then sends nothing holds up no other channel.
                let registry = Arc::clone(&accepted);
                let security = accepting_security.clone();
                let done = Arc::clone(&pending);
                let named = std::thread::Builder::new().name("weir-data-accept".into()).spawn(move || {
                    register_channel(stream, &registry, &security);
                    done.fetch_sub(1, Ordering::SeqCst);
                });
                if let Err(error) = named {
                    pending.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(%error, "cannot start a thread for a data connection; it is dropped");
                }
            }
        })?;
        Ok(Arc::new(DataServer { address, registry, security }))
    }

    /// Attempt `attempt` of `job_id` is over in this process (cancelled, replaced, or every
    /// subtask of it here ended): what of it no subtask claimed is closed, and so is every
    /// connection of it that still arrives, so its producers elsewhere see the end.
    pub fn attempt_ended(&self, job_id: &str, attempt: u32) {
        lock(&self.registry.0).attempt_ended(job_id, attempt, Instant::now());
    }

    /// The address producers connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits for the connection of channel `key`.
    pub fn wait_for(&self, key: &ChannelKey, timeout: Duration) -> Result<TcpStream, TaskError> {
        let deadline = Instant::now() + timeout;
        let (channels, arrived) = &*self.registry;
        let mut guard = lock(channels);
        loop {
            if let Some((stream, _)) = guard.unclaimed.remove(key) {
                return Ok(stream);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TaskError::external(
                    format!("waiting for the producer of channel {key:?}"),
                    format!("no connection within {timeout:?}; is the producing TaskManager alive?"),
                ));
            }
            guard = match arrived.wait_timeout(guard, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// How long one attempt at opening a connection may take: a peer cut off by a partition
/// drops the connection request without an answer, and the operating system would wait for
/// minutes.
pub const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to `address` (`host:port`, a name resolved now), trying each of its addresses
/// for at most `timeout`.
pub fn connect_to(address: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs as _;
    let mut last = None;
    for resolved in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&resolved, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{address} resolves to no address"))
    }))
}

/// Channels of one job attempt in one process: accepts through the local [`DataServer`],
/// connects to the data server of whichever process runs the consumer.
pub struct TcpNetwork {
    /// The job.
    pub job_id: String,
    /// The attempt.
    pub attempt: u32,
    /// This process's data server.
    pub server: Arc<DataServer>,
    /// The data address of the process running subtask `(vertex, subtask)`.
    /// `host:port` as that process advertises it (a name is resolved at connect time).
    pub address_of: Arc<dyn Fn(usize, u32) -> Option<String> + Send + Sync>,
}

impl NetworkWiring for TcpNetwork {
    fn connect(&self, edge: usize, target_vertex: usize, producer: u32, consumer: u32) -> Result<TcpStream, TaskError> {
        let key = ChannelKey { job_id: self.job_id.clone(), attempt: self.attempt, edge, producer, consumer };
        let address = (self.address_of)(target_vertex, consumer).ok_or_else(|| {
            TaskError::Internal(format!("no TaskManager placed for subtask {consumer} of vertex {target_vertex}"))
        })?;
        let header = serde_json::to_vec(&key).map_err(|e| TaskError::Internal(e.to_string()))?;
        let deadline = Instant::now() + CHANNEL_CONNECT_TIMEOUT;
        loop {
            match connect_to(&address, CONNECT_ATTEMPT_TIMEOUT) {
                Ok(stream) => {
                    let mut stream =
                        self.server.security.connect(stream, Plane::Data).map_err(|e| {
                            TaskError::external(format!("connecting to the TaskManager at {address}"), e)
                        })?;
                    write_frame(&mut stream, &header)
                        .map_err(|e| TaskError::external(format!("connecting to {address}"), e))?;
                    return Ok(stream);
                }
                Err(error) if Instant::now() < deadline => {
                    tracing::debug!(%address, %error, "consumer not reachable yet");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) => {
                    return Err(TaskError::external(format!("connecting to the TaskManager at {address}"), error));
                }
            }
        }
    }

    fn accept(&self, edge: usize, producer: u32, consumer: u32) -> Result<TcpStream, TaskError> {
        let key = ChannelKey { job_id: self.job_id.clone(), attempt: self.attempt, edge, producer, consumer };
        self.server.wait_for(&key, CHANNEL_CONNECT_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Connections that send nothing, or a header claiming more than a header may hold,
    /// keep no channel from being named: the producer that names its channel after them is
    /// accepted at once.
    #[test]
    fn a_silent_or_oversized_connection_holds_up_no_channel() {
        let server = DataServer::start("127.0.0.1:0", WireSecurity::open()).unwrap();
        let _silent = TcpStream::connect(server.address()).unwrap();
        let _silent_after_the_handshake = handshaken(&server);
        let mut oversized = handshaken(&server);
        oversized.write_all(&(1u32 << 27).to_le_bytes()).unwrap();
        let key = ChannelKey { job_id: "job".into(), attempt: 0, edge: 1, producer: 2, consumer: 3 };
        let mut producer = handshaken(&server);
        write_frame(&mut producer, &serde_json::to_vec(&key).unwrap()).unwrap();
        producer.write_all(b"records").unwrap();
        let mut accepted = server.wait_for(&key, Duration::from_secs(5)).unwrap();
        let mut bytes = [0u8; 7];
        accepted.read_exact(&mut bytes).unwrap();
        assert_eq!(&bytes, b"records");
        // The oversized one was dropped: its peer sees the end.
        oversized.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(oversized.read(&mut [0u8; 1]).unwrap(), 0);
    }

    fn channel(job: &str, attempt: u32, producer: u32) -> ChannelKey {
        ChannelKey { job_id: job.into(), attempt, edge: 0, producer, consumer: 0 }
    }

    /// A connection to `server` that passed the (open) handshake.
    fn handshaken(server: &DataServer) -> TcpStream {
        WireSecurity::open().connect(TcpStream::connect(server.address()).unwrap(), Plane::Data).unwrap()
    }

    fn connect(server: &DataServer, key: &ChannelKey) -> TcpStream {
        let mut stream = handshaken(server);
        write_frame(&mut stream, &serde_json::to_vec(key).unwrap()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
    }

    /// True when the server closed `stream` (its peer sees the end).
    fn closed(stream: &mut TcpStream) -> bool {
        matches!(stream.read(&mut [0u8; 1]), Ok(0))
    }

    /// The pipelined regions of a job run as attempts of their own, side by side: a
    /// connection of one attempt never closes what another left unclaimed, whichever number
    /// is higher (the bug: every unclaimed connection of a lower attempt was dropped, so a
    /// multi-region job failed over once at start). What an attempt known to be over left
    /// unclaimed is closed, and so is each of its connections that still arrives.
    #[test]
    fn attempts_never_close_each_others_connections_and_an_ended_one_is_closed() {
        let server = DataServer::start("127.0.0.1:0", WireSecurity::open()).unwrap();
        let _region_0 = connect(&server, &channel("a", 0, 0));
        let _other_job = connect(&server, &channel("b", 0, 0));
        let mut ended = connect(&server, &channel("a", 2, 0));
        // Registered in order: each is claimable before the next one connects.
        std::thread::sleep(Duration::from_millis(200));
        let _region_1 = connect(&server, &channel("a", 1, 0));
        server.wait_for(&channel("a", 1, 0), Duration::from_secs(5)).unwrap();
        server.wait_for(&channel("a", 0, 0), Duration::from_secs(5)).expect("a sibling region's connection was closed");
        server.attempt_ended("a", 2);
        assert!(closed(&mut ended), "the ended attempt's unclaimed connection is still open");
        assert!(server.wait_for(&channel("a", 2, 0), Duration::from_millis(50)).is_err());
        let mut late = connect(&server, &channel("a", 2, 1));
        assert!(closed(&mut late), "a connection of an ended attempt was kept");
        let _region_3 = connect(&server, &channel("a", 3, 0));
        server.wait_for(&channel("a", 3, 0), Duration::from_secs(5)).unwrap();
        server.wait_for(&channel("b", 0, 0), Duration::from_secs(5)).unwrap();
    }

    /// A connection nobody claims is closed after [`UNCLAIMED_CONNECTION_KEPT_MAX`], not
    /// before; an ended attempt is forgotten as late.
    #[test]
    fn a_connection_unclaimed_past_the_limit_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (ours, _) = listener.accept().unwrap();
        let mut channels = Channels::default();
        let start = Instant::now();
        channels.file(channel("a", 0, 0), ours, start);
        channels.attempt_ended("a", 7, start);
        let (second, _) = {
            let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            listener.accept().unwrap()
        };
        channels.file(channel("a", 1, 0), second.try_clone().unwrap(), start + UNCLAIMED_CONNECTION_KEPT_MAX);
        assert!(channels.unclaimed.contains_key(&channel("a", 0, 0)), "closed before the limit");
        channels.forget_stale(start + UNCLAIMED_CONNECTION_KEPT_MAX + Duration::from_secs(1));
        assert!(!channels.unclaimed.contains_key(&channel("a", 0, 0)));
        assert!(closed(&mut peer), "the stale connection is still open");
        assert!(channels.unclaimed.contains_key(&channel("a", 1, 0)), "a younger one was closed too");
        assert!(channels.ended.is_empty(), "an ended attempt was remembered past the limit");
    }
}
