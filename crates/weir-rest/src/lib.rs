//! weir's REST API: Flink-shaped JSON over the [`Dispatcher`](weir_runtime::Dispatcher).
//!
//! - [`router`] builds the routes at Flink's paths, in Flink's response schemas (checked
//!   against Flink's own classes by `crates/weir-cli/tests/flink_tools.rs`), each also under
//!   `/v1` like Flink's versioned API; docs/rest-api.md lists them against Flink's. Errors
//!   answer Flink's shape `{"errors":["..."]}`.
//! - [`serve`] runs a router on a listener until a shutdown future completes.
//! - [`RestServer`] does both on its own small runtime for synchronous callers (the CLI).
//! - [`responses`] holds the response bodies, so clients can deserialize them.
//! - [`leader`]: a standby JobManager forwards every request to the leader.
#![warn(missing_docs)]

pub mod applications;
pub mod backpressure;
pub mod checkpoints;
pub mod deployments;
pub mod disposal;
pub mod error;
pub mod jobmanager;
pub mod leader;
pub mod logs;
pub mod metric_queries;
mod metrics;
pub mod openapi;
mod process;
mod rates;
pub mod responses;
pub mod routes;
pub mod server;
pub mod subtasks;
mod ui;
mod uploads;
pub mod watermarks;

pub use error::RestError;
pub use leader::LeaderRoute;
pub use routes::{ClusterInfo, LeaderLookup, SubmittedJob, router};
pub use server::{RestServer, serve};
