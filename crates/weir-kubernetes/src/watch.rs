//! Watches that wake the operator's controller (kube-rs `kube::runtime::watcher`): any
//! change to a `WeirDeployment` of the namespace (applied, deleted, its status written) or
//! to a pod of one of their clusters (started, ready, crashed, gone) starts the next
//! reconcile pass at once. The pass reads the resources fresh from the API server rather
//! than from a watch cache: a stale cache could show a submission as not yet made and have
//! it made twice.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use weir_deploy::Wake;

use crate::client::Kube;
use crate::clusters::DEPLOYMENT_LABEL;
use crate::resource::WeirDeployment;

/// The running watches; dropping it ends them.
pub struct Watches {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts watching the namespace's `WeirDeployment`s and their clusters' pods, notifying
/// `wake` on every change.
pub fn wake_on_changes(kube: &Kube, wake: Arc<Wake>) -> Watches {
    let deployments = kube.spawn_task(notify_on_changes(
        kube.api::<PartialObjectMeta<WeirDeployment>>(),
        watcher::Config::default(),
        Arc::clone(&wake),
        "WeirDeployments",
    ));
    let pods = kube.spawn_task(notify_on_changes(
        kube.api::<PartialObjectMeta<Pod>>(),
        watcher::Config::default().labels(DEPLOYMENT_LABEL),
        wake,
        "pods",
    ));
    Watches { tasks: vec![deployments, pods] }
}

async fn notify_on_changes<K>(api: kube::Api<K>, config: watcher::Config, wake: Arc<Wake>, what: &'static str)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // Only metadata (`PartialObjectMeta`): a change of any field moves the resource version, which is all a
    // wake-up needs. Errors (the API server restarting, a watch expired) are retried with
    // kube-rs's backoff; meanwhile the controller falls back to its resync.
    let mut changes = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(change) = changes.next().await {
        match change {
            Ok(_) => wake.notify(),
            Err(error) => tracing::debug!("watching {what}: {error}; retrying"),
        }
    }
}
