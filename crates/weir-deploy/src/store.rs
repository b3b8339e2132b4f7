//! Where deployments live: the applied spec (with its generation), the controller's status
//! and delete requests. In the data directory without high availability, in etcd with it.
//! `weir deployment apply` writes specs here and the controller reads them, as `kubectl
//! apply` and the Flink operator meet in the Kubernetes API server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_ha::etcd::{Compare, EtcdClient, Op};

use crate::events::{DeploymentEvent, appended};
use crate::fence::{Fence, LeadershipLost};
use crate::spec::WeirDeployment;
use crate::status::DeploymentStatus;

/// A deployment as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDeployment {
    /// The applied spec, with its generation.
    pub deployment: WeirDeployment,
    /// What the controller recorded (default before it acted).
    pub status: DeploymentStatus,
    /// `weir deployment delete` asked for it to go.
    pub delete_requested: bool,
}

impl StoredDeployment {
    /// `{"apiVersion", "kind", "metadata", "spec", "status"}`, as REST and `-o json` show it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(&self.deployment).unwrap_or(serde_json::Value::Null);
        value["status"] = serde_json::to_value(&self.status).unwrap_or(serde_json::Value::Null);
        value
    }
}

/// What an apply did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// A new deployment.
    Created,
    /// A changed spec: a new generation.
    Configured,
    /// The same spec as stored.
    Unchanged,
}

impl ApplyOutcome {
    /// kubectl's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyOutcome::Created => "created",
            ApplyOutcome::Configured => "configured",
            ApplyOutcome::Unchanged => "unchanged",
        }
    }
}

/// A store failure, naming where.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(String),
    /// Stored bytes are not what weir writes.
    #[error("{what} is not a deployment record weir wrote ({reason}); remove it or restore it from a backup")]
    Corrupt {
        /// The file or key.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// The controller writing lost its leadership: nothing was written.
    #[error(transparent)]
    LeadershipLost(#[from] LeadershipLost),
    /// Applying a deployment that is being deleted.
    #[error("deployment '{0}' is being deleted; apply it again once `weir deployment get` no longer lists it")]
    Deleting(String),
}

/// The deployments of one controller.
pub trait DeploymentStore: Send + Sync {
    /// Records `deployment` as the desired spec; a changed spec gets the next generation, and
    /// so does an unchanged one with `retry` (a refused upgrade tried again).
    fn apply(&self, deployment: WeirDeployment, retry: bool) -> Result<(ApplyOutcome, u64), StoreError>;
    /// One deployment.
    fn get(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError>;
    /// Every deployment, by name.
    fn list(&self) -> Result<Vec<StoredDeployment>, StoreError>;
    /// Marks a deployment for deletion (the controller stops its job and cluster, then
    /// removes it); false when there is none.
    fn request_delete(&self, name: &str) -> Result<bool, StoreError>;
    /// Removes a deployment's record, if `fence`'s leadership still holds.
    fn remove(&self, name: &str, fence: &Fence) -> Result<(), StoreError>;
    /// Writes the controller's status of a deployment, if `fence`'s leadership still holds
    /// (in etcd: a transaction compared on the leader key, so a controller that lost its
    /// lease while frozen cannot write its stale status over its successor's).
    fn put_status(&self, name: &str, status: &DeploymentStatus, fence: &Fence) -> Result<(), StoreError>;
    /// Where it keeps things, for messages.
    fn describe(&self) -> String;
    /// Records an event of deployment `name` (not fenced: an event changes nothing the
    /// controller decides on). A store whose events live elsewhere records none.
    fn record_event(&self, _name: &str, _event: &DeploymentEvent) -> Result<(), StoreError> {
        Ok(())
    }
    /// The events of deployment `name`, oldest first.
    fn events(&self, name: &str) -> Result<Vec<DeploymentEvent>, StoreError> {
        Err(StoreError::Io(format!("{} keeps no events of deployment '{name}'", self.describe())))
    }
}

/// Events as stored: a JSON array.
fn decode_events(bytes: &[u8], what: &str) -> Result<Vec<DeploymentEvent>, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt { what: what.to_string(), reason: e.to_string() })
}

pub(crate) fn next_generation(
    existing: Option<&StoredDeployment>,
    deployment: &mut WeirDeployment,
    retry: bool,
) -> ApplyOutcome {
    match existing {
        None => {
            deployment.metadata.generation = 1;
            ApplyOutcome::Created
        }
        Some(stored) if stored.deployment.spec == deployment.spec && !retry => {
            deployment.metadata.generation = stored.deployment.metadata.generation;
            ApplyOutcome::Unchanged
        }
        Some(stored) => {
            deployment.metadata.generation = stored.deployment.metadata.generation + 1;
            ApplyOutcome::Configured
        }
    }
}

/// Deployments under `<data dir>/deployments/<name>/`: `deployment.json`, `status.json`,
/// `delete-requested`, `events.json`. Every write goes to a temporary file renamed into place.
pub struct FileStore {
    root: PathBuf,
}

impl FileStore {
    /// The store under `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> FileStore {
        FileStore { root: root.into() }
    }

    /// The directory of deployment `name`.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn read(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        let dir = self.dir(name);
        let spec_path = dir.join("deployment.json");
        let bytes = match std::fs::read(&spec_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::Io(format!("cannot read {}: {e}", spec_path.display()))),
        };
        let deployment = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt { what: spec_path.display().to_string(), reason: e.to_string() })?;
        let status_path = dir.join("status.json");
        let status = match std::fs::read(&status_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::Corrupt { what: status_path.display().to_string(), reason: e.to_string() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => DeploymentStatus::default(),
            Err(e) => return Err(StoreError::Io(format!("cannot read {}: {e}", status_path.display()))),
        };
        Ok(Some(StoredDeployment { deployment, status, delete_requested: dir.join("delete-requested").exists() }))
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory, synced, so a
/// reader sees the old or the new content, never a part.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write as _;
    let io = |what: &str, e: std::io::Error| StoreError::Io(format!("cannot {what} {}: {e}", path.display()));
    let dir = path.parent().ok_or_else(|| StoreError::Io(format!("{} has no directory", path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut file = std::fs::File::create(&temporary).map_err(|e| io("write", e))?;
    file.write_all(bytes).map_err(|e| io("write", e))?;
    file.sync_all().map_err(|e| io("sync", e))?;
    std::fs::rename(&temporary, path).map_err(|e| io("replace", e))?;
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

impl DeploymentStore for FileStore {
    fn apply(&self, mut deployment: WeirDeployment, retry: bool) -> Result<(ApplyOutcome, u64), StoreError> {
        let name = deployment.metadata.name.clone();
        let existing = self.read(&name)?;
        if existing.as_ref().is_some_and(|e| e.delete_requested) {
            return Err(StoreError::Deleting(name));
        }
        let outcome = next_generation(existing.as_ref(), &mut deployment, retry);
        if outcome != ApplyOutcome::Unchanged {
            let bytes = serde_json::to_vec_pretty(&deployment).map_err(|e| StoreError::Io(e.to_string()))?;
            write_atomically(&self.dir(&name).join("deployment.json"), &bytes)?;
        }
        Ok((outcome, deployment.metadata.generation))
    }

    fn get(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        self.read(name)
    }

    fn list(&self) -> Result<Vec<StoredDeployment>, StoreError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::Io(format!("cannot list {}: {e}", self.root.display()))),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("deployment.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        names.sort();
        let mut all = Vec::new();
        for name in names {
            if let Some(stored) = self.read(&name)? {
                all.push(stored);
            }
        }
        Ok(all)
    }

    fn request_delete(&self, name: &str) -> Result<bool, StoreError> {
        if self.read(name)?.is_none() {
            return Ok(false);
        }
        write_atomically(&self.dir(name).join("delete-requested"), b"")?;
        Ok(true)
    }

    fn remove(&self, name: &str, fence: &Fence) -> Result<(), StoreError> {
        fence.check()?;
        let dir = self.dir(name);
        // The record goes first, so a half-removed deployment is never listed.
        for file in ["deployment.json", "status.json", "delete-requested", "events.json"] {
            match std::fs::remove_file(dir.join(file)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::Io(format!("cannot remove {}: {e}", dir.join(file).display()))),
            }
        }
        Ok(())
    }

    fn put_status(&self, name: &str, status: &DeploymentStatus, fence: &Fence) -> Result<(), StoreError> {
        fence.check()?;
        let bytes = serde_json::to_vec_pretty(status).map_err(|e| StoreError::Io(e.to_string()))?;
        write_atomically(&self.dir(name).join("status.json"), &bytes)
    }

    fn describe(&self) -> String {
        format!("the data directory ({})", self.root.display())
    }

    fn record_event(&self, name: &str, event: &DeploymentEvent) -> Result<(), StoreError> {
        // Only a leading operator writes here (the data directory's lock file), so the read
        // and the write need no lock of their own. Events a damaged file held are lost; the
        // new one is kept.
        let events = self.events(name).unwrap_or_default();
        let bytes = serde_json::to_vec(&appended(events, event.clone())).map_err(|e| StoreError::Io(e.to_string()))?;
        write_atomically(&self.dir(name).join("events.json"), &bytes)
    }

    fn events(&self, name: &str) -> Result<Vec<DeploymentEvent>, StoreError> {
        let path = self.dir(name).join("events.json");
        match std::fs::read(&path) {
            Ok(bytes) => decode_events(&bytes, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(StoreError::Io(format!("cannot read {}: {e}", path.display()))),
        }
    }
}

/// Deployments in etcd under `/weir/<cluster-id>/deployments/<name>/`: `spec`, `status`,
/// `delete`, `events`.
pub struct EtcdStore {
    client: Arc<EtcdClient>,
    prefix: String,
    cluster_id: String,
}

impl EtcdStore {
    /// The deployments of `cluster_id` in the etcd `client` reaches.
    pub fn new(client: Arc<EtcdClient>, cluster_id: &str) -> EtcdStore {
        EtcdStore { client, prefix: format!("/weir/{cluster_id}/deployments/"), cluster_id: cluster_id.to_string() }
    }

    fn key(&self, name: &str, what: &str) -> String {
        format!("{}{name}/{what}", self.prefix)
    }

    fn etcd(error: weir_ha::etcd::EtcdError) -> StoreError {
        StoreError::Io(error.to_string())
    }

    fn read(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        let found = self.client.get_prefix(&format!("{}{name}/", self.prefix)).map_err(Self::etcd)?;
        self.assemble(name, &found)
    }

    fn assemble(&self, name: &str, keys: &[weir_ha::etcd::KeyValue]) -> Result<Option<StoredDeployment>, StoreError> {
        let value = |what: &str| keys.iter().find(|kv| kv.key == self.key(name, what));
        let Some(spec) = value("spec") else { return Ok(None) };
        let deployment = serde_json::from_slice(&spec.value)
            .map_err(|e| StoreError::Corrupt { what: format!("etcd key {}", spec.key), reason: e.to_string() })?;
        let status = match value("status") {
            Some(kv) => serde_json::from_slice(&kv.value)
                .map_err(|e| StoreError::Corrupt { what: format!("etcd key {}", kv.key), reason: e.to_string() })?,
            None => DeploymentStatus::default(),
        };
        Ok(Some(StoredDeployment { deployment, status, delete_requested: value("delete").is_some() }))
    }

    /// Runs `op` if `fence`'s leadership holds: checked locally, then by etcd (the leader
    /// key's create revision must still be the fence's epoch). A write etcd refuses marks
    /// the leadership lost.
    fn fenced_write(&self, fence: &Fence, op: Op) -> Result<(), StoreError> {
        fence.check()?;
        let compares: Vec<Compare> = match fence.etcd_condition() {
            Some((key, epoch)) => vec![Compare::CreateRevision(key.to_string(), epoch)],
            None => Vec::new(),
        };
        let result = self.client.txn(&compares, &[op], &[]).map_err(Self::etcd)?;
        if !result.succeeded {
            fence.mark_lost();
            return Err(StoreError::LeadershipLost(LeadershipLost));
        }
        Ok(())
    }
}

impl DeploymentStore for EtcdStore {
    fn apply(&self, mut deployment: WeirDeployment, retry: bool) -> Result<(ApplyOutcome, u64), StoreError> {
        let name = deployment.metadata.name.clone();
        let existing = self.read(&name)?;
        if existing.as_ref().is_some_and(|e| e.delete_requested) {
            return Err(StoreError::Deleting(name));
        }
        let outcome = next_generation(existing.as_ref(), &mut deployment, retry);
        if outcome != ApplyOutcome::Unchanged {
            let bytes = serde_json::to_vec(&deployment).map_err(|e| StoreError::Io(e.to_string()))?;
            self.client.put(&self.key(&name, "spec"), &bytes, 0).map_err(Self::etcd)?;
        }
        Ok((outcome, deployment.metadata.generation))
    }

    fn get(&self, name: &str) -> Result<Option<StoredDeployment>, StoreError> {
        self.read(name)
    }

    fn list(&self) -> Result<Vec<StoredDeployment>, StoreError> {
        let keys = self.client.get_prefix(&self.prefix).map_err(Self::etcd)?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(&self.prefix)?.strip_suffix("/spec").map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        let mut all = Vec::new();
        for name in names {
            if let Some(stored) = self.assemble(&name, &keys)? {
                all.push(stored);
            }
        }
        Ok(all)
    }

    fn request_delete(&self, name: &str) -> Result<bool, StoreError> {
        if self.read(name)?.is_none() {
            return Ok(false);
        }
        self.client.put(&self.key(name, "delete"), b"", 0).map_err(Self::etcd)?;
        Ok(true)
    }

    fn remove(&self, name: &str, fence: &Fence) -> Result<(), StoreError> {
        self.fenced_write(fence, Op::Delete { key: format!("{}{name}/", self.prefix), prefix: true })
    }

    fn put_status(&self, name: &str, status: &DeploymentStatus, fence: &Fence) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(status).map_err(|e| StoreError::Io(e.to_string()))?;
        self.fenced_write(fence, Op::Put { key: self.key(name, "status"), value: bytes, lease: 0 })
    }

    fn describe(&self) -> String {
        format!("etcd at {} (cluster-id '{}')", self.client.endpoints().join(","), self.cluster_id)
    }

    fn record_event(&self, name: &str, event: &DeploymentEvent) -> Result<(), StoreError> {
        let events = self.events(name).unwrap_or_default();
        let bytes = serde_json::to_vec(&appended(events, event.clone())).map_err(|e| StoreError::Io(e.to_string()))?;
        self.client.put(&self.key(name, "events"), &bytes, 0).map_err(Self::etcd)
    }

    fn events(&self, name: &str) -> Result<Vec<DeploymentEvent>, StoreError> {
        let key = self.key(name, "events");
        match self.client.get(&key).map_err(Self::etcd)? {
            Some(kv) => decode_events(&kv.value, &format!("etcd key {key}")),
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    fn deployment(parallelism: u32) -> WeirDeployment {
        let text = format!(
            "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: orders\nspec:\n  binary: /bin/weir\n  taskManager:\n    replicas: 4\n  job:\n    name: counter\n    parallelism: {parallelism}\n"
        );
        parse(&text, &mut Vec::new()).unwrap()
    }

    #[test]
    fn apply_gives_generations_and_delete_marks_then_removes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        assert_eq!(store.apply(deployment(2), false).unwrap(), (ApplyOutcome::Created, 1));
        assert_eq!(store.apply(deployment(2), false).unwrap(), (ApplyOutcome::Unchanged, 1));
        assert_eq!(store.apply(deployment(3), false).unwrap(), (ApplyOutcome::Configured, 2));
        let stored = store.get("orders").unwrap().unwrap();
        assert_eq!(stored.deployment.metadata.generation, 2);
        assert_eq!(stored.status, DeploymentStatus::default());

        let status = DeploymentStatus { observed_generation: 2, ..Default::default() };
        store.put_status("orders", &status, &Fence::lock_file()).unwrap();
        assert_eq!(store.list().unwrap()[0].status.observed_generation, 2);

        assert!(store.request_delete("orders").unwrap());
        assert!(matches!(store.apply(deployment(4), false), Err(StoreError::Deleting(_))));
        assert!(store.get("orders").unwrap().unwrap().delete_requested);
        store.remove("orders", &Fence::lock_file()).unwrap();
        assert!(store.get("orders").unwrap().is_none());
        assert!(store.list().unwrap().is_empty());
        assert!(!store.request_delete("orders").unwrap());
    }

    /// A controller that lost its leadership to another writes nothing over its successor's
    /// status, even before it noticed the loss itself: etcd compares the leader key.
    #[test]
    fn a_status_write_of_a_superseded_leadership_is_refused_by_etcd() {
        use std::sync::atomic::AtomicBool;
        let etcd = weir_ha::testing::EtcdServer::start();
        let client = Arc::new(EtcdClient::new(&[etcd.endpoint()], std::time::Duration::from_secs(2)));
        let store = EtcdStore::new(Arc::clone(&client), "fenced");
        store.apply(deployment(2), false).unwrap();
        let old = crate::lock::lead(Arc::clone(&client), "fenced", "old:1", &AtomicBool::new(false)).unwrap().unwrap();
        let old_fence = Fence::etcd(&old);
        store
            .put_status("orders", &DeploymentStatus { observed_generation: 1, ..Default::default() }, &old_fence)
            .unwrap();

        // Another operator takes the leader key (as after the old one's lease expired while
        // it was frozen); the old one has not noticed yet.
        client.txn(&[], &[Op::Delete { key: old.key().to_string(), prefix: false }], &[]).unwrap();
        let new = crate::lock::lead(Arc::clone(&client), "fenced", "new:1", &AtomicBool::new(false)).unwrap().unwrap();
        let new_fence = Fence::etcd(&new);
        let successor = DeploymentStatus { observed_generation: 7, ..Default::default() };
        store.put_status("orders", &successor, &new_fence).unwrap();

        let stale = DeploymentStatus { observed_generation: 1, ..Default::default() };
        let refused = store.put_status("orders", &stale, &old_fence).unwrap_err();
        assert!(matches!(refused, StoreError::LeadershipLost(_)), "{refused}");
        assert!(!old_fence.is_held(), "a refused write marks the leadership lost");
        assert!(matches!(store.remove("orders", &old_fence), Err(StoreError::LeadershipLost(_))));
        let stored = store.get("orders").unwrap().unwrap();
        assert_eq!(stored.status, successor);
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        store.apply(deployment(2), false).unwrap();
        std::fs::write(dir.path().join("orders/status.json"), b"{not json").unwrap();
        let text = store.get("orders").unwrap_err().to_string();
        assert!(text.contains("orders/status.json") && text.contains("not a deployment record"), "{text}");
    }
}
