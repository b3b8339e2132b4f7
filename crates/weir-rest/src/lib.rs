//! weir's REST API: Flink-shaped JSON over the [`Dispatcher`](weir_runtime::Dispatcher).
//!
//! - [`router`] builds the routes (`/overview`, `/jobs`, `/jobs/overview`, `/jobs/{jobid}`,
//!   `/jobs/{jobid}/status`, `/jobs/{jobid}/vertices/{vertexid}`, `/jobs/{jobid}/exceptions`,
//!   `PATCH /jobs/{jobid}?mode=cancel`, `/config`), each also under `/v1` like Flink's
//!   versioned API. Errors answer Flink's shape `{"errors":["..."]}`.
//! - [`serve`] runs a router on a listener until a shutdown future completes.
//! - [`RestServer`] does both on its own small runtime for synchronous callers (the CLI).
//! - [`responses`] holds the response bodies, so clients can deserialize them.
//! - [`leader`]: a standby JobManager forwards every request to the leader.
#![warn(missing_docs)]

pub mod backpressure;
pub mod checkpoints;
pub mod deployments;
pub mod error;
pub mod leader;
mod metrics;
pub mod openapi;
pub mod responses;
pub mod routes;
pub mod server;
mod ui;
pub mod watermarks;

pub use error::RestError;
pub use leader::LeaderRoute;
pub use routes::{ClusterInfo, LeaderLookup, SubmittedJob, router};
pub use server::{RestServer, serve};
