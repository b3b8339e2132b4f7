//! `high-availability.type: kubernetes`: the HA key-value store on one ConfigMap,
//! `<cluster-id>-cluster-config-map` (Flink's name), with etcd's semantics for what weir's
//! election and HA store ask of it ([`KeyValueStore`]).
//!
//! The whole store is one JSON document in the ConfigMap's `weir-ha.json`: the keys with their
//! create and modification revisions and leases, a revision counter, and the leases with a
//! renewal counter. Every write is a replace conditioned on the ConfigMap's resource version,
//! so a transaction is atomic and a writer whose view is stale retries from a fresh read: the
//! same fencing as an etcd transaction (a leader's epoch is its key's create revision).
//!
//! Kubernetes has no lease that expires by itself, so expiry is observed, as client-go's
//! leader election does it: a lease is expired for this process once its renewal counter has
//! not changed for its whole TTL on this process's monotonic clock. The holder counts itself
//! leader only until two thirds of the TTL after a renewal was *sent*, and another process
//! starts counting only after it *saw* that renewal, so two leaders never act at once as
//! long as clocks run at the same rate. Expired leases and their keys are removed by the
//! next write of any process, in the same conditioned replace.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};
use weir_ha::EtcdError;
use weir_ha::kv::{Compare, KeyValue, KeyValueStore, Op, TxnResult};

use crate::client::{Kube, is_conflict, is_not_found};

/// The ConfigMap's data key holding the store.
pub const DATA_KEY: &str = "weir-ha.json";
/// Longest one request to the API server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Conditioned replaces retried at most this often in one call before giving up.
const CONFLICT_RETRIES: usize = 50;

/// The name of the HA ConfigMap of `cluster_id`.
pub fn config_map_name(cluster_id: &str) -> String {
    format!("{cluster_id}-cluster-config-map")
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    /// The value, as UTF-8 when it is (every value weir writes), else base64 in `value_base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
    create_revision: i64,
    mod_revision: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    lease: i64,
}

fn is_zero(value: &i64) -> bool {
    *value == 0
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct LeaseRecord {
    ttl_ms: u64,
    renewals: u64,
}

/// The document in the ConfigMap.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Document {
    /// Format version of this document.
    version: u32,
    revision: i64,
    keys: BTreeMap<String, Entry>,
    leases: BTreeMap<i64, LeaseRecord>,
}

impl Entry {
    fn new(value: &[u8], create_revision: i64, revision: i64, lease: i64) -> Entry {
        use base64::Engine;
        let (text, base64) = match std::str::from_utf8(value) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(value))),
        };
        Entry { value: text, value_base64: base64, create_revision, mod_revision: revision, lease }
    }

    fn bytes(&self) -> Vec<u8> {
        use base64::Engine;
        match (&self.value, &self.value_base64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD.decode(encoded).unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}

/// The HA store of one cluster on its ConfigMap.
pub struct ConfigMapStore {
    kube: Arc<Kube>,
    name: String,
    observer: LeaseObserver,
}

/// When this process considers leases expired: per lease, the renewal count it last saw and
/// since when it has seen it.
#[derive(Default)]
struct LeaseObserver {
    observed: Mutex<HashMap<i64, (u64, Instant)>>,
}

impl LeaseObserver {
    /// The leases of `document` not renewed for their TTL as of `now`, updating the
    /// observations.
    fn expired(&self, document: &Document, now: Instant) -> Vec<i64> {
        let mut observed = match self.observed.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        observed.retain(|lease, _| document.leases.contains_key(lease));
        let mut expired = Vec::new();
        for (&lease, record) in &document.leases {
            let seen = observed.entry(lease).or_insert((record.renewals, now));
            if seen.0 != record.renewals {
                *seen = (record.renewals, now);
            }
            if now.duration_since(seen.1) >= Duration::from_millis(record.ttl_ms) {
                expired.push(lease);
            }
        }
        expired
    }
}

impl ConfigMapStore {
    /// The store of `cluster_id` in `kube`'s namespace, checked by one read: an API server
    /// that cannot be reached, or a service account that may not read ConfigMaps, is an
    /// error naming the ConfigMap.
    pub fn connect(kube: Arc<Kube>, cluster_id: &str) -> Result<ConfigMapStore, EtcdError> {
        let store = ConfigMapStore { kube, name: config_map_name(cluster_id), observer: LeaseObserver::default() };
        store.load()?;
        Ok(store)
    }

    fn qualified(&self) -> String {
        format!("{}/{}", self.kube.namespace(), self.name)
    }

    fn error(&self, operation: &'static str, reason: impl ToString) -> EtcdError {
        EtcdError::Kubernetes { config_map: self.qualified(), operation, reason: reason.to_string() }
    }

    /// Runs a request on the client's runtime from any thread (also a tokio worker: the
    /// REST server asks for the leader), bounded by [`REQUEST_TIMEOUT`].
    fn request<T: Send + 'static>(
        &self,
        operation: &'static str,
        future: impl Future<Output = Result<T, kube::Error>> + Send + 'static,
    ) -> Result<Result<T, kube::Error>, EtcdError> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.kube.spawn(async move {
            let _ = sender.send(tokio::time::timeout(REQUEST_TIMEOUT, future).await);
        });
        match receiver.recv() {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(self.error(operation, format!("no answer within {REQUEST_TIMEOUT:?}"))),
            Err(_) => Err(self.error(operation, "the client's runtime stopped")),
        }
    }

    /// The document and the ConfigMap it was read from (`None`: no ConfigMap yet).
    fn load(&self) -> Result<(Document, Option<ConfigMap>), EtcdError> {
        let api = self.kube.api::<ConfigMap>();
        let name = self.name.clone();
        match self.request("read", async move { api.get(&name).await })? {
            Ok(map) => {
                let document = match map.data.as_ref().and_then(|data| data.get(DATA_KEY)) {
                    Some(text) => serde_json::from_str(text).map_err(|e| {
                        self.error("read", format!("its {DATA_KEY} is not weir's HA store ({e}); delete the ConfigMap only if no job of this cluster must survive"))
                    })?,
                    None => Document::default(),
                };
                Ok((document, Some(map)))
            }
            Err(error) if is_not_found(&error) => Ok((Document::default(), None)),
            Err(error) => Err(self.error("read", error)),
        }
    }

    /// Writes `document` into `read` (its labels and owner kept) if the ConfigMap is still
    /// at the version read: `Ok(false)` when another writer came first.
    fn store(&self, document: &Document, read: Option<ConfigMap>) -> Result<bool, EtcdError> {
        let text = serde_json::to_string(document).map_err(|e| self.error("update", e))?;
        let api = self.kube.api::<ConfigMap>();
        let exists = read.is_some();
        let mut map = read.unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "weir".to_string())])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        map.data.get_or_insert_with(BTreeMap::new).insert(DATA_KEY.to_string(), text);
        let name = self.name.clone();
        let answer = if exists {
            self.request("update", async move { api.replace(&name, &PostParams::default(), &map).await })?
        } else {
            self.request("create", async move { api.create(&PostParams::default(), &map).await })?
        };
        match answer {
            Ok(_) => Ok(true),
            Err(error) if is_conflict(&error) => Ok(false),
            Err(error) => Err(self.error("update", error)),
        }
    }

    /// Removes expired leases and the keys attached to them (or to no lease at all); true
    /// when something was removed.
    fn purge(&self, document: &mut Document) -> bool {
        let expired = self.observer.expired(document, Instant::now());
        for lease in &expired {
            document.leases.remove(lease);
        }
        let before = document.keys.len();
        let leases = &document.leases;
        document.keys.retain(|_, entry| entry.lease == 0 || leases.contains_key(&entry.lease));
        !expired.is_empty() || document.keys.len() != before
    }

    /// Reads, changes and writes the document until the write is not preempted.
    fn update<T>(&self, mut change: impl FnMut(&mut Document) -> (bool, T)) -> Result<T, EtcdError> {
        for _ in 0..CONFLICT_RETRIES {
            let (mut document, read) = self.load()?;
            let purged = self.purge(&mut document);
            let (changed, answer) = change(&mut document);
            if !changed && !purged {
                return Ok(answer);
            }
            document.version = 1;
            if self.store(&document, read)? {
                return Ok(answer);
            }
        }
        Err(self
            .error("update", format!("{CONFLICT_RETRIES} conditioned writes in a row were preempted by other writers")))
    }

    /// The keys a reader sees: without expired leases' keys.
    fn live(&self) -> Result<Document, EtcdError> {
        let (mut document, _) = self.load()?;
        self.purge(&mut document);
        Ok(document)
    }
}

fn key_value(key: &str, entry: &Entry) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: entry.bytes(),
        create_revision: entry.create_revision,
        mod_revision: entry.mod_revision,
        lease: entry.lease,
    }
}

/// Applies `ops` at a new revision.
fn apply(document: &mut Document, ops: &[Op]) {
    // The first revision of a new store: the wall clock in ms, so a ConfigMap deleted and
    // created again never hands out an epoch it handed out before.
    if document.revision == 0 {
        document.revision = weir_types::lifecycle::now_ms() as i64;
    }
    document.revision += 1;
    let revision = document.revision;
    for op in ops {
        match op {
            Op::Put { key, value, lease } => {
                let create_revision = document.keys.get(key).map_or(revision, |entry| entry.create_revision);
                document.keys.insert(key.clone(), Entry::new(value, create_revision, revision, *lease));
            }
            Op::Delete { key, prefix: false } => {
                document.keys.remove(key);
            }
            Op::Delete { key, prefix: true } => document.keys.retain(|k, _| !k.starts_with(key.as_str())),
        }
    }
}

fn holds(document: &Document, compare: &Compare) -> bool {
    match compare {
        Compare::CreateRevision(key, revision) => {
            document.keys.get(key).map_or(0, |entry| entry.create_revision) == *revision
        }
    }
}

impl KeyValueStore for ConfigMapStore {
    fn describe(&self) -> String {
        format!("ConfigMap {} on {}", self.qualified(), self.kube.server())
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        Ok(self.live()?.keys.get(key).map(|entry| key_value(key, entry)))
    }

    fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let document = self.live()?;
        Ok(document
            .keys
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, entry)| key_value(key, entry))
            .collect())
    }

    fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError> {
        self.update(|document| {
            let succeeded = compares.iter().all(|compare| holds(document, compare));
            let ops = if succeeded { success } else { failure };
            if ops.is_empty() {
                return (false, TxnResult { succeeded, revision: document.revision });
            }
            apply(document, ops);
            (true, TxnResult { succeeded, revision: document.revision })
        })
    }

    fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        let ttl_ms = ttl.as_millis().max(1) as u64;
        self.update(|document| {
            apply(document, &[]);
            let id = document.revision;
            document.leases.insert(id, LeaseRecord { ttl_ms, renewals: 0 });
            (true, (id, Duration::from_millis(ttl_ms)))
        })
    }

    fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        self.update(|document| match document.leases.get_mut(&lease) {
            Some(record) => {
                record.renewals += 1;
                (true, Some(Duration::from_millis(record.ttl_ms)))
            }
            None => (false, None),
        })
    }

    fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.update(|document| {
            if document.leases.remove(&lease).is_none() {
                return (false, ());
            }
            document.keys.retain(|_, entry| entry.lease != lease);
            (true, ())
        })
    }

    /// A ConfigMap holds at most 1 MiB, shared with the jobs' pointers: 100 results of at
    /// most about 4.5 KiB each (failures are cut at 4 KiB) leave room for them.
    fn job_results_retained(&self) -> usize {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_keep_the_create_revision_and_deletes_take_prefixes() {
        let mut document = Document::default();
        apply(&mut document, &[Op::Put { key: "/weir/a/leader".into(), value: b"x".to_vec(), lease: 0 }]);
        let created = document.keys["/weir/a/leader"].create_revision;
        assert!(created > 1_000_000_000_000, "the first revision is the wall clock in ms");
        apply(&mut document, &[Op::Put { key: "/weir/a/leader".into(), value: b"y".to_vec(), lease: 0 }]);
        let entry = &document.keys["/weir/a/leader"];
        assert_eq!((entry.create_revision, entry.mod_revision, entry.bytes()), (created, created + 1, b"y".to_vec()));
        assert!(holds(&document, &Compare::CreateRevision("/weir/a/leader".into(), created)));
        assert!(holds(&document, &Compare::CreateRevision("/weir/a/other".into(), 0)));
        apply(
            &mut document,
            &[
                Op::Put { key: "/weir/a/jobs/1".into(), value: vec![0xff, 0], lease: 0 },
                Op::Put { key: "/weir/a/jobs/1/checkpoints/7".into(), value: b"c".to_vec(), lease: 0 },
            ],
        );
        assert_eq!(document.keys["/weir/a/jobs/1"].bytes(), vec![0xff, 0], "binary values survive");
        apply(&mut document, &[Op::Delete { key: "/weir/a/jobs/".into(), prefix: true }]);
        assert_eq!(document.keys.keys().collect::<Vec<_>>(), ["/weir/a/leader"]);
    }

    #[test]
    fn a_lease_expires_only_after_its_ttl_without_a_renewal_this_process_saw() {
        let observer = LeaseObserver::default();
        let mut document = Document::default();
        document.leases.insert(7, LeaseRecord { ttl_ms: 1000, renewals: 0 });
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // First seen now: a process that just started waits the whole TTL.
        assert!(observer.expired(&document, at(0)).is_empty());
        assert!(observer.expired(&document, at(900)).is_empty());
        document.leases.insert(7, LeaseRecord { ttl_ms: 1000, renewals: 1 });
        assert!(observer.expired(&document, at(1500)).is_empty(), "renewed: counted from when it was seen");
        assert!(observer.expired(&document, at(2400)).is_empty());
        assert_eq!(observer.expired(&document, at(2500)), [7]);
        document.leases.clear();
        assert!(observer.expired(&document, at(2600)).is_empty());
        assert!(observer.observed.lock().unwrap().is_empty(), "forgotten once gone");
    }

    #[test]
    fn the_document_format_is_stable() {
        let mut document = Document { version: 1, ..Document::default() };
        document.revision = 41;
        apply(&mut document, &[Op::Put { key: "/weir/c/leader".into(), value: b"{}".to_vec(), lease: 42 }]);
        document.leases.insert(42, LeaseRecord { ttl_ms: 3000, renewals: 2 });
        assert_eq!(
            serde_json::to_string(&document).unwrap(),
            r#"{"version":1,"revision":42,"keys":{"/weir/c/leader":{"value":"{}","create_revision":42,"mod_revision":42,"lease":42}},"leases":{"42":{"ttl_ms":3000,"renewals":2}}}"#
        );
    }
}
