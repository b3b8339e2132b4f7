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
use weir_api::network::{read_frame, write_frame};

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

impl DataServer {
    /// Listens on `bind` (port 0: any free port) and accepts connections on a thread.
    pub fn start(bind: &str) -> std::io::Result<Arc<DataServer>> {
        let listener = TcpListener::bind(bind)?;
        let address = listener.local_addr()?;
        let registry: Registry = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        let accepted = Arc::clone(&registry);
        std::thread::Builder::new().name("weir-data-server".into()).spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut header = Vec::new();
                // A connection that does not name its channel is dropped.
                let Ok(true) = read_frame(&mut stream, &mut header) else { continue };
                let Ok(key) = serde_json::from_slice::<ChannelKey>(&header) else { continue };
                let (streams, arrived) = &*accepted;
                if let Ok(mut streams) = streams.lock() {
                    streams.insert(key, stream);
                }
                arrived.notify_all();
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
