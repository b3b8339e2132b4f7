//! weir's runtime: turns a [`StreamGraph`](weir_api::graph::StreamGraph) into running
//! subtasks and drives the job's lifecycle.
//!
//! - [`jobgraph`]: parallelism and max parallelism resolved, forward-connected operators
//!   of equal parallelism chained into one task (a job vertex).
//! - [`execution`]: channels between subtasks, one thread per subtask running its chain.
//! - [`job_master`]: the job's state machine (INITIALIZING -> CREATED -> RUNNING ->
//!   FINISHED / FAILING -> FAILED / CANCELLING -> CANCELED), fed by subtask events.
//! - [`dispatcher`]: the jobs of one cluster (embedded or standalone).
//! - [`status`]: Flink-shaped views of jobs for REST and the CLI.
#![warn(missing_docs)]

/// The wire decoders' tests may not allocate a claimed size: see [`weir_types::fuzzing`].
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: weir_types::fuzzing::CappedAlloc = weir_types::fuzzing::CappedAlloc;

pub mod checkpointing;
pub mod cluster;
pub mod control_clock;
pub mod crash;
pub mod dispatcher;
pub mod execution;
pub mod executor;
pub mod job_master;
pub mod job_settings;
pub mod jobgraph;
pub mod log_tail;
pub mod network;
pub mod restart;
pub mod security;
#[cfg(test)]
mod simulation;
pub mod status;

pub use status::{JobDetails, JobOverview};

pub use dispatcher::{Dispatcher, SubmitError};
pub use job_master::JobMaster;
pub use job_settings::JobSettings;
pub use jobgraph::{JobGraph, JobGraphError};
pub use weir_api::snapshot::SnapshotFormat;
