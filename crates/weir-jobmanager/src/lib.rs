//! weir's JobManager process, composed in one place.
//!
//! A JobManager is the TaskManagers' RPC endpoint (`ClusterResources`), the `Dispatcher`
//! that runs each job's master, and the REST API that accepts jobs and reports on them; with
//! high availability also a campaign for leadership, terms while it leads, and the recovery of
//! the jobs a former leader left. The command line used to compose this twice (with and
//! without high availability) inside its command modules, each with its own submitter,
//! TaskManager list and REST wiring; here [`JobManager`] composes it once, and the two modes
//! differ only in what a term is: without high availability one term that lasts as long as
//! the process, with it one term per leadership.
//!
//! Preparing a job (its graph from the catalog, its settings from the configuration, the
//! restore from a snapshot planned and checked) is here too, because a JobManager does it for
//! every submission and recovered job; `weir run`, `weir run --dry-run` and TaskManagers use
//! the same functions, so a job is read from the catalog and the configuration one way.
//!
//! The crate prints what an operator of the process reads (where it listens, who leads,
//! which jobs it recovered) on stderr, as the command line does, and stops when the caller's
//! stop flag is set: signal handling stays with the binary.

#![warn(missing_docs)]

mod error;
mod leadership;
mod prepare;
mod recovery;
pub mod restore;
mod server;
pub mod settings;

pub use error::JobManagerError;
pub use prepare::{PreparedJob, build_graph, fixed_job_id, job_config, prepare};
pub use restore::snapshot_storage;
pub use server::JobManager;
