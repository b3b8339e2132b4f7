//! The data side of a TaskManager: a listener that accepts channel connections from other
//! processes, and the [`NetworkWiring`] that connects this process's producers to them.
//!
//! A connection starts with one frame naming the channel (job, attempt, edge, producer,
//! consumer) as JSON; after that it carries `weir_api::network`'s protocol.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weir_api::error::TaskError;
use weir_api::network::{read_frame_of_at_most, write_frame};

use crate::execution::NetworkWiring;

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

type Registry = Arc<(Mutex<HashMap<ChannelKey, TcpStream>>, Condvar)>;

/// Accepts channel connections for the subtasks of this process.
pub struct DataServer {
    address: SocketAddr,
    registry: Registry,
}

/// A data connection must name its channel within this time, in a header of at most
/// [`CHANNEL_HEADER_BYTES_MAX`] bytes, or it is dropped.
const CHANNEL_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CHANNEL_HEADER_BYTES_MAX: usize = 4096;

/// Reads the header naming a connection's channel and files the connection under it; a
/// connection that does not name its channel in time is dropped.
fn register_channel(mut stream: TcpStream, registry: &Registry) {
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
    let (streams, arrived) = &**registry;
    if let Ok(mut streams) = streams.lock() {
        // A job's attempts only go up: a connection of a newer attempt means the older ones
        // are over, and what of theirs no subtask claimed is closed rather than kept open
        // for as long as the process lives.
        streams.retain(|old, _| old.job_id != key.job_id || old.attempt >= key.attempt);
        streams.insert(key, stream);
    }
    arrived.notify_all();
}

impl DataServer {
    /// Listens on `bind` (port 0: any free port) and accepts connections on a thread.
    pub fn start(bind: &str) -> std::io::Result<Arc<DataServer>> {
        let listener = TcpListener::bind(bind)?;
        let address = listener.local_addr()?;
        let registry: Registry = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        let accepted = Arc::clone(&registry);
        std::thread::Builder::new().name("weir-data-server".into()).spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                // Each connection names its channel on a thread of its own: a peer that
                // connects and then sends nothing holds up no other channel.
                let registry = Arc::clone(&accepted);
                let named = std::thread::Builder::new()
                    .name("weir-data-accept".into())
                    .spawn(move || register_channel(stream, &registry));
                if let Err(error) = named {
                    tracing::warn!(%error, "cannot start a thread for a data connection; it is dropped");
                }
            }
        })?;
        Ok(Arc::new(DataServer { address, registry }))
    }

    /// The address producers connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits for the connection of channel `key`.
    pub fn wait_for(&self, key: &ChannelKey, timeout: Duration) -> Result<TcpStream, TaskError> {
        let deadline = Instant::now() + timeout;
        let (streams, arrived) = &*self.registry;
        let mut guard = streams.lock().map_err(|_| TaskError::Internal("data server registry poisoned".into()))?;
        loop {
            if let Some(stream) = guard.remove(key) {
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
                Err(_) => return Err(TaskError::Internal("data server registry poisoned".into())),
            };
        }
    }
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
    pub address_of: Arc<dyn Fn(usize, u32) -> Option<SocketAddr> + Send + Sync>,
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
            match TcpStream::connect(address) {
                Ok(mut stream) => {
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
        let server = DataServer::start("127.0.0.1:0").unwrap();
        let _silent = TcpStream::connect(server.address()).unwrap();
        let mut oversized = TcpStream::connect(server.address()).unwrap();
        oversized.write_all(&(1u32 << 27).to_le_bytes()).unwrap();
        let key = ChannelKey { job_id: "job".into(), attempt: 0, edge: 1, producer: 2, consumer: 3 };
        let mut producer = TcpStream::connect(server.address()).unwrap();
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

    /// What an earlier attempt of a job left unclaimed is closed once a newer attempt's
    /// connection arrives; other jobs' and the same attempt's stay.
    #[test]
    fn a_newer_attempt_closes_what_older_attempts_left_unclaimed() {
        let server = DataServer::start("127.0.0.1:0").unwrap();
        let key = |job: &str, attempt: u32, producer: u32| ChannelKey {
            job_id: job.into(),
            attempt,
            edge: 0,
            producer,
            consumer: 0,
        };
        let connect = |key: &ChannelKey| {
            let mut stream = TcpStream::connect(server.address()).unwrap();
            write_frame(&mut stream, &serde_json::to_vec(key).unwrap()).unwrap();
            stream
        };
        let mut stale = connect(&key("a", 0, 0));
        let _other_job = connect(&key("b", 0, 0));
        let _same_attempt = connect(&key("a", 1, 1));
        // Registered in order: each is claimable before the next one connects.
        std::thread::sleep(Duration::from_millis(200));
        let _newer = connect(&key("a", 1, 0));
        server.wait_for(&key("a", 1, 0), Duration::from_secs(5)).unwrap();
        stale.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(stale.read(&mut [0u8; 1]).unwrap(), 0, "the stale connection is still open");
        assert!(server.wait_for(&key("a", 0, 0), Duration::from_millis(50)).is_err());
        server.wait_for(&key("b", 0, 0), Duration::from_secs(5)).unwrap();
        server.wait_for(&key("a", 1, 1), Duration::from_secs(5)).unwrap();
    }
}
