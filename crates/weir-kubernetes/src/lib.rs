//! weir on Kubernetes.
//!
//! - [`resource`]: the `WeirDeployment` custom resource (`weir.dev/v1`): the deployment
//!   spec and status of [`weir_deploy`] as a Kubernetes object, and its CRD generated from
//!   those Rust types (`deploy/kubernetes/crd.yaml`).
//! - [`client`]: the API client, used from the controller's blocking threads.
//! - [`store`]: the resources as the controller's store (status writes conditioned on the
//!   resource version, a finalizer for deletes).
//! - [`clusters`]: a deployment's clusters as Deployments, a Service and a ConfigMap.
//! - [`ha`]: `high-availability.type: kubernetes`, the JobManagers' HA store on a ConfigMap.
//! - [`native`]: native TaskManagers, pods a JobManager creates for its jobs' slots.
//! - [`lease`]: leader election of operator replicas through a `Lease`.
//! - [`watch`]: watches that wake the operator's controller on every change.
#![warn(missing_docs)]

pub mod client;
pub mod clusters;
pub mod ha;
pub mod lease;
pub mod native;
pub mod resource;
pub mod store;
pub mod watch;

pub use client::Kube;
pub use clusters::KubernetesClusters;
pub use lease::LeaseLeadership;
pub use resource::{WeirDeployment, WeirDeploymentSpec, crd, crd_yaml};
pub use store::KubernetesStore;
