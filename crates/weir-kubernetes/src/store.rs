//! The `WeirDeployment` resources of a namespace as the controller's [`DeploymentStore`]:
//! specs come from the API server (their `metadata.generation` is the generation), the
//! status goes to the status subresource as a replace conditioned on the resource version
//! last read, so an operator that lost its lease (and read before the new leader wrote)
//! cannot write its stale status over its successor's. A finalizer keeps a deleted resource
//! until the controller has stopped its job as its upgrade mode says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use serde_json::json;
use weir_deploy::spec::{API_VERSION, KIND, Metadata};
use weir_deploy::store::{ApplyOutcome, StoreError, StoredDeployment};
use weir_deploy::{DeploymentStatus, DeploymentStore, Fence};

use crate::client::{Kube, is_conflict, is_not_found};
use crate::resource::{WeirDeployment, WeirDeploymentSpec};

/// The finalizer the operator puts on every `WeirDeployment` it controls.
pub const FINALIZER: &str = "weir.dev/finalizer";

/// The `WeirDeployment`s of one namespace.
pub struct KubernetesStore {
    kube: Arc<Kube>,
    /// What was last read of each resource: its resource version and spec, which a status
    /// write is conditioned on and carries.
    read: Mutex<HashMap<String, (String, WeirDeploymentSpec)>>,
}

fn io(error: kube::Error) -> StoreError {
    StoreError::Io(format!("Kubernetes API: {error}"))
}

impl KubernetesStore {
    /// The store of `kube`'s namespace.
    pub fn new(kube: Arc<Kube>) -> KubernetesStore {
        KubernetesStore { kube, read: Mutex::new(HashMap::new()) }
    }

    fn remember(&self, resource: &WeirDeployment) {
        if let (Some(name), Some(version)) = (&resource.metadata.name, &resource.metadata.resource_version) {
            self.read
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.clone(), (version.clone(), resource.spec.clone()));
        }
    }

    /// The stored form of a resource; its finalizer added when missing (not while deleted).
    fn stored(&self, resource: WeirDeployment) -> Result<StoredDeployment, StoreError> {
        let name = resource.metadata.name.clone().unwrap_or_default();
        let deleting = resource.metadata.deletion_timestamp.is_some();
        let has_finalizer = resource.metadata.finalizers.as_ref().is_some_and(|all| all.iter().any(|f| f == FINALIZER));
        let resource = if !deleting && !has_finalizer {
            let mut finalizers = resource.metadata.finalizers.clone().unwrap_or_default();
            finalizers.push(FINALIZER.to_string());
            let patch =
                json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource.metadata.resource_version}});
            let api = self.kube.api::<WeirDeployment>();
            self.kube.block_on(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).map_err(io)?
        } else {
            resource
        };
        self.remember(&resource);
        Ok(StoredDeployment {
            deployment: weir_deploy::WeirDeployment {
                api_version: API_VERSION.to_string(),
                kind: KIND.to_string(),
                metadata: Metadata { name, generation: resource.metadata.generation.unwrap_or(0).max(0) as u64 },
                spec: resource.spec.deployment.clone(),
            },
            status: resource.status.clone().unwrap_or_default(),
            delete_requested: deleting,
        })
    }
}

impl DeploymentStore for KubernetesStore {
    fn apply(&self, _deployment: weir_deploy::WeirDeployment, _retry: bool) -> Result<(ApplyOutcome, u64), StoreError> {
        Err(StoreError::Io(format!(
            "the deployments of `weir operator --kubernetes` are WeirDeployment resources in namespace {}: apply them with `kubectl apply -f FILE`",
            self.kube.namespace()
        )))
    }

    fn get(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        let api = self.kube.api::<WeirDeployment>();
        match self.kube.block_on(api.get_opt(name)).map_err(io)? {
            Some(resource) => Ok(Some(self.stored(resource)?)),
            None => Ok(None),
        }
    }

    fn list(&self) -> Result<Vec<StoredDeployment>, StoreError> {
        let api = self.kube.api::<WeirDeployment>();
        let list = self.kube.block_on(api.list(&ListParams::default())).map_err(io)?;
        let mut all = Vec::new();
        for resource in list.items {
            all.push(self.stored(resource)?);
        }
        all.sort_by(|a, b| a.deployment.metadata.name.cmp(&b.deployment.metadata.name));
        Ok(all)
    }

    fn request_delete(&self, name: &str) -> Result<bool, StoreError> {
        let api = self.kube.api::<WeirDeployment>();
        match self.kube.block_on(api.delete(name, &DeleteParams::default())) {
            Ok(_) => Ok(true),
            Err(error) if is_not_found(&error) => Ok(false),
            Err(error) => Err(io(error)),
        }
    }

    fn remove(&self, name: &str, fence: &Fence) -> Result<(), StoreError> {
        fence.check().map_err(StoreError::LeadershipLost)?;
        let api = self.kube.api::<WeirDeployment>();
        let Some(resource) = self.kube.block_on(api.get_opt(name)).map_err(io)? else { return Ok(()) };
        let finalizers: Vec<String> =
            resource.metadata.finalizers.unwrap_or_default().into_iter().filter(|f| f != FINALIZER).collect();
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource.metadata.resource_version}});
        match self.kube.block_on(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))) {
            Ok(_) => Ok(()),
            Err(error) if is_not_found(&error) => Ok(()),
            Err(error) => Err(io(error)),
        }
    }

    fn put_status(&self, name: &str, status: &DeploymentStatus, fence: &Fence) -> Result<(), StoreError> {
        fence.check().map_err(StoreError::LeadershipLost)?;
        let Some((version, spec)) = self.read.lock().unwrap_or_else(PoisonError::into_inner).get(name).cloned() else {
            return Err(StoreError::Io(format!("WeirDeployment {name} was not read before its status was written")));
        };
        let mut resource = WeirDeployment::new(name, spec);
        resource.metadata =
            ObjectMeta { name: Some(name.to_string()), resource_version: Some(version), ..Default::default() };
        resource.status = Some(status.clone());
        let api = self.kube.api::<WeirDeployment>();
        match self.kube.block_on(api.replace_status(name, &PostParams::default(), &resource)) {
            Ok(written) => {
                self.remember(&written);
                Ok(())
            }
            Err(error) if is_conflict(&error) => Err(StoreError::Io(format!(
                "WeirDeployment {name} changed since this operator read it (a new spec, or another operator's status): nothing was written; the next reconcile reads it again"
            ))),
            Err(error) => Err(io(error)),
        }
    }

    fn describe(&self) -> String {
        format!("WeirDeployments in namespace {} of {}", self.kube.namespace(), self.kube.server())
    }

    /// The controller's events are Kubernetes Events on the resource (the backend records
    /// them), where `kubectl` shows them.
    fn events(&self, name: &str) -> Result<Vec<weir_deploy::events::DeploymentEvent>, StoreError> {
        Err(StoreError::Io(format!(
            "the events of a WeirDeployment are Kubernetes Events: `kubectl describe weirdeployment {name} -n {}`",
            self.kube.namespace()
        )))
    }
}
