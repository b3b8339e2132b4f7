//! weir's high availability on etcd (`high-availability.type: etcd`) or a Kubernetes
//! ConfigMap (`kubernetes`): leader election among JobManagers ([`election`]), and what a new
//! leader recovers jobs from ([`store`]), with every key built in [`layout`], on a store with
//! etcd's semantics ([`kv`]): etcd reached through its JSON gateway ([`etcd`]), or the
//! ConfigMap store of `weir-kubernetes`, or held in memory for tests that step a job master
//! by hand ([`memory`]).
//!
//! The design follows Flink's ZooKeeper and Kubernetes HA services: the coordination service
//! holds small pointers, the blobs go to `high-availability.storageDir`. What weir adds: the
//! leader's epoch (its key's create revision) conditions every write, and a new leader
//! reconciles with the tasks that kept running instead of restarting them.
#![warn(missing_docs)]

pub mod election;
pub mod etcd;
pub mod kv;
pub mod layout;
pub mod memory;
pub mod store;
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use weir_checkpoint::SnapshotStorage;

pub use election::{Election, LeaderInfo, Leadership, LeadershipGuard};
pub use etcd::{EtcdClient, EtcdError};
pub use kv::KeyValueStore;
pub use layout::Layout;
pub use store::{HaStore, JobResult, JobStore, RecoverableJob, newest_recorded_checkpoint};

/// How a cluster reaches its HA services (from `high-availability.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaSettings {
    /// `high-availability.etcd.endpoints`.
    pub endpoints: Vec<String>,
    /// `high-availability.cluster-id`.
    pub cluster_id: String,
    /// `high-availability.storageDir`: an object-store URL.
    pub storage_dir: String,
    /// `high-availability.etcd.lease-ttl`, or with Kubernetes
    /// `high-availability.kubernetes.leader-election.lease-duration`.
    pub lease_ttl: Duration,
    /// Set with `high-availability.type: kubernetes`: the store is a ConfigMap (built by the
    /// caller, see [`HaServices::on`]), not etcd at `endpoints`.
    pub kubernetes: Option<KubernetesHa>,
}

/// Where the HA ConfigMap of `high-availability.type: kubernetes` lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesHa {
    /// `kubernetes.namespace`; `None`: the pod's (or the kubeconfig's) namespace.
    pub namespace: Option<String>,
}

/// An HA failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HaError {
    /// etcd could not be reached or refused a request.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// This JobManager is not (or no longer) the leader: it writes nothing.
    #[error(
        "this JobManager lost its leadership (another one took over, or its etcd lease expired); it stops acting as leader"
    )]
    LostLeadership,
    /// `high-availability.storageDir` cannot be used.
    #[error("high-availability.storageDir: {0}")]
    Storage(String),
    /// A value in etcd is not what weir writes.
    #[error(
        "etcd key {key} holds something weir did not write ({reason}); remove the key or fix high-availability.cluster-id"
    )]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// The HA services of one cluster, as one process sees them.
pub struct HaServices {
    client: Arc<dyn KeyValueStore>,
    settings: HaSettings,
    layout: Layout,
    blobs: weir_checkpoint::storage::BlockingStorage,
}

impl HaServices {
    /// Connects to etcd (an unreachable etcd is an error naming the endpoints) and opens the
    /// blob directory.
    pub fn connect(settings: HaSettings) -> Result<HaServices, HaError> {
        let client = Arc::new(EtcdClient::connect(&settings.endpoints)?);
        HaServices::on(settings, client)
    }

    /// The HA services of `settings` on `client`, a store other than etcd (a Kubernetes
    /// ConfigMap), already checked by its caller.
    pub fn on(settings: HaSettings, client: Arc<dyn KeyValueStore>) -> Result<HaServices, HaError> {
        let storage = SnapshotStorage::from_url(&settings.storage_dir)
            .map_err(|e| HaError::Storage(e.to_string()))?
            .child(&settings.cluster_id);
        let layout = Layout::new(&settings.cluster_id);
        Ok(HaServices { client, settings, layout, blobs: storage.blocking() })
    }

    /// The settings.
    pub fn settings(&self) -> &HaSettings {
        &self.settings
    }

    /// The store: etcd, or a Kubernetes ConfigMap.
    pub fn client(&self) -> &Arc<dyn KeyValueStore> {
        &self.client
    }

    /// The election of the cluster's leader JobManager.
    pub fn election(&self) -> Election {
        Election::new(Arc::clone(&self.client), &self.layout.leader(), self.settings.lease_ttl)
    }

    /// The current leader and its epoch.
    pub fn leader(&self) -> Result<Option<(LeaderInfo, i64)>, HaError> {
        Ok(self.election().leader()?)
    }

    /// The store a leader writes through during `guard`'s leadership.
    pub fn store(&self, guard: LeadershipGuard) -> HaStore {
        HaStore::new(Arc::clone(&self.client), self.layout.clone(), self.blobs.clone(), guard)
    }
}
