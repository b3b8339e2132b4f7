//! The standalone cluster: a JobManager process that runs job masters and keeps the
//! TaskManagers' slots, and TaskManager processes that run subtasks. Both run the same binary
//! and build the same job graph from the job's catalog name and arguments.
//!
//! Control messages travel as JSON lines over one TCP connection per TaskManager
//! ([`protocol`]); records travel over the data channels of `crate::network`.

mod memory_guard;
pub mod protocol;
pub mod resources;
pub(crate) mod slots;
pub mod taskmanager;

pub use protocol::JobSubmission;
pub use resources::{ClusterResources, RemoteExecutor, TaskManagerInfo};
pub use taskmanager::{DataAddresses, Heartbeats, JobManagerSource, TaskManagerResources, run_taskmanager};

use weir_api::graph::StreamGraph;

/// Builds a job's stream graph from its submission (the catalog lives in the binary).
pub type GraphBuilder = std::sync::Arc<dyn Fn(&JobSubmission) -> Result<StreamGraph, String> + Send + Sync>;
