//! weir on Kubernetes.
//!
//! - [`resource`]: the `WeirDeployment` custom resource (`weir.dev/v1`): the deployment
//!   spec and status of [`weir_deploy`] as a Kubernetes object, and its CRD generated from
//!   those Rust types (`deploy/kubernetes/crd.yaml`).
#![warn(missing_docs)]

pub mod resource;

pub use resource::{WeirDeployment, WeirDeploymentSpec, crd, crd_yaml};
