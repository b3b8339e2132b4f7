//! A [`KeyValueStore`] in memory with etcd's semantics for the calls HA makes: revisions,
//! transactions conditioned on a key's create revision, leases that take their keys with
//! them when revoked. Nothing persists and leases never lapse by themselves: it is for tests
//! and simulations that step a job master or a JobManager by hand (a cluster uses etcd, or a
//! ConfigMap on Kubernetes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::etcd::EtcdError;
use crate::kv::{Compare, KeyValue, KeyValueStore, Op, TxnResult};

/// The keys, their revisions and the leases granted.
#[derive(Default)]
struct Keyspace {
    revision: i64,
    keys: BTreeMap<String, KeyValue>,
    leases: BTreeSet<i64>,
}

/// An etcd-like store in memory (see the module's documentation).
#[derive(Default)]
pub struct MemoryStore {
    keyspace: Mutex<Keyspace>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn keyspace(&self) -> std::sync::MutexGuard<'_, Keyspace> {
        // Every change is made whole under the lock: a panicking holder left nothing half done.
        self.keyspace.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl KeyValueStore for MemoryStore {
    fn describe(&self) -> String {
        "an in-memory store".into()
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        Ok(self.keyspace().keys.get(key).cloned())
    }

    fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let keyspace = self.keyspace();
        let from = keyspace.keys.range(prefix.to_string()..);
        Ok(from.take_while(|(key, _)| key.starts_with(prefix)).map(|(_, kv)| kv.clone()).collect())
    }

    fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError> {
        let mut keyspace = self.keyspace();
        let succeeded = compares.iter().all(|Compare::CreateRevision(key, revision)| {
            keyspace.keys.get(key).map_or(0, |kv| kv.create_revision) == *revision
        });
        let ops = if succeeded { success } else { failure };
        if !ops.is_empty() {
            keyspace.revision += 1;
        }
        let revision = keyspace.revision;
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let create_revision = keyspace.keys.get(key).map_or(revision, |kv| kv.create_revision);
                    let (key, value, lease) = (key.clone(), value.clone(), *lease);
                    let kv = KeyValue { key: key.clone(), value, create_revision, mod_revision: revision, lease };
                    keyspace.keys.insert(key, kv);
                }
                Op::Delete { key, prefix } => {
                    keyspace.keys.retain(|k, _| !(k == key || (*prefix && k.starts_with(key))))
                }
            }
        }
        Ok(TxnResult { succeeded, revision })
    }

    fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        let mut keyspace = self.keyspace();
        keyspace.revision += 1;
        let lease = keyspace.revision;
        keyspace.leases.insert(lease);
        Ok((lease, ttl))
    }

    fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        // Leases never lapse here: a held one is renewed for as long as anyone asks.
        Ok(self.keyspace().leases.contains(&lease).then_some(Duration::from_secs(3600)))
    }

    fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        let mut keyspace = self.keyspace();
        if keyspace.leases.remove(&lease) {
            keyspace.revision += 1;
            keyspace.keys.retain(|_, kv| kv.lease != lease);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> Op {
        Op::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: 0 }
    }

    #[test]
    fn writes_are_conditioned_on_a_keys_create_revision_which_puts_keep() {
        let store = MemoryStore::new();
        let created = store.txn(&[Compare::CreateRevision("leader".into(), 0)], &[put("leader", "a")], &[]).unwrap();
        assert!(created.succeeded);
        let epoch = store.get("leader").unwrap().unwrap().create_revision;
        assert_eq!(epoch, created.revision);
        // A second candidate loses: the key exists.
        assert!(
            !store.txn(&[Compare::CreateRevision("leader".into(), 0)], &[put("leader", "b")], &[]).unwrap().succeeded
        );
        let fenced = [Compare::CreateRevision("leader".into(), epoch)];
        store.txn(&fenced, &[put("jobs/j/1", "x"), put("jobs/j/2", "y"), put("jobs/k", "z")], &[]).unwrap();
        store.txn(&fenced, &[put("leader", "a again")], &[]).unwrap();
        assert_eq!(store.get("leader").unwrap().unwrap().create_revision, epoch, "a put keeps the create revision");
        let keys = |prefix: &str| store.get_prefix(prefix).unwrap().into_iter().map(|kv| kv.key).collect::<Vec<_>>();
        assert_eq!(keys("jobs/j/"), ["jobs/j/1", "jobs/j/2"]);
        store.txn(&fenced, &[Op::Delete { key: "jobs/j/".into(), prefix: true }], &[]).unwrap();
        assert_eq!(keys("jobs/"), ["jobs/k"]);
        // An old epoch writes nothing.
        let stale = [Compare::CreateRevision("leader".into(), epoch - 1)];
        assert!(!store.txn(&stale, &[put("jobs/k", "stale")], &[]).unwrap().succeeded);
        assert_eq!(store.get("jobs/k").unwrap().unwrap().value, b"z");
    }

    #[test]
    fn a_revoked_lease_takes_its_keys() {
        let store = MemoryStore::new();
        let (lease, _) = store.grant(Duration::from_secs(5)).unwrap();
        store.txn(&[], &[Op::Put { key: "leader".into(), value: vec![1], lease }], &[]).unwrap();
        assert!(store.keep_alive(lease).unwrap().is_some());
        store.revoke(lease).unwrap();
        assert!(store.get("leader").unwrap().is_none());
        assert!(store.keep_alive(lease).unwrap().is_none());
    }
}
