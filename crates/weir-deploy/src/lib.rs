//! weir's declarative deployments, as the Flink Kubernetes Operator's `FlinkDeployment`: a
//! user applies a [`spec::WeirDeployment`] (the program, its configuration, the cluster, the
//! job and its `upgradeMode`), and the [`controller::Controller`] moves what runs to it
//! without losing or duplicating a record, reporting a [`status::DeploymentStatus`] in the
//! operator's shape.
//!
//! - [`spec`]: the spec and its parsing, with field paths in every error.
//! - [`status`]: the status, the lifecycle rules, the operation in progress.
//! - [`store`]: where specs and statuses live (the data directory, or etcd).
//! - [`fence`]: the leadership every controller write and process action is conditioned on.
//! - [`controller`]: the reconcile loop and its operations (deploy, upgrade, suspend,
//!   resume, rollback, recover, delete).
//! - [`events`]: a deployment's events (its steps and failures), as Kubernetes Events.
//! - [`effects`]: what the controller does to the world, as values carried out in one place.
//! - [`backend`]: where clusters run ([`backend::ClusterBackend`]): processes here, or
//!   Kubernetes objects (`weir-kubernetes`); the controller's rules are the same for both.
//! - [`processes`]: a deployment's clusters as processes of its binary.
//! - [`cluster_api`]: the controller's client of a cluster's REST API.
//! - [`history`]: trimming the savepoint history.
//! - [`schema`]: JSON-schema helpers for the spec and status (the `WeirDeployment` CRD).
#![warn(missing_docs)]

pub mod backend;
pub mod cluster_api;
pub mod controller;
pub mod effects;
pub mod events;
pub mod fence;
pub mod history;
pub mod lock;
pub mod processes;
pub mod schema;
#[cfg(test)]
mod simulation;
pub mod spec;
pub mod status;
pub mod store;
pub mod wake;
pub mod world;

pub use backend::{ClusterBackend, ProcessClusters};
pub use controller::Controller;
pub use fence::{Fence, LeadershipLost};
pub use spec::{DeploymentSpec, SpecError, UpgradeMode, WeirDeployment};
pub use status::{DeploymentStatus, LifecycleState};
pub use store::{ApplyOutcome, DeploymentStore, EtcdStore, FileStore, StoredDeployment};
pub use wake::Wake;
