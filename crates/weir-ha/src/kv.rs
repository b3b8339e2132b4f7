//! The strongly consistent key-value store HA runs on, as election and the HA store use it:
//! keys and prefixes, transactions conditioned on a key's create revision, and leases that
//! take their keys with them when they lapse. etcd has exactly this ([`crate::etcd`]);
//! weir's Kubernetes backend builds it on one ConfigMap with compare-and-swap on its resource
//! version (`weir-kubernetes`), as Flink's Kubernetes HA does.

use std::time::Duration;

use crate::etcd::EtcdError;

/// One key with its value and revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value's bytes.
    pub value: Vec<u8>,
    /// The revision that created the key (unique per creation: a leadership's epoch).
    pub create_revision: i64,
    /// The revision of the last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A condition of a transaction.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key was created at this revision (0: the key does not exist).
    CreateRevision(String, i64),
}

/// One operation of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    /// Sets `key` to `value`, attached to `lease` when not 0.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease, or 0.
        lease: i64,
    },
    /// Deletes `key`, or every key starting with it when `prefix`.
    Delete {
        /// The key or prefix.
        key: String,
        /// Delete the whole prefix.
        prefix: bool,
    },
}

/// What a transaction did.
#[derive(Clone, Debug)]
pub struct TxnResult {
    /// True when every comparison held and the success operations ran.
    pub succeeded: bool,
    /// The store's revision after it.
    pub revision: i64,
}

/// A store with etcd's semantics for the calls HA makes.
pub trait KeyValueStore: Send + Sync {
    /// Where the store is, for messages (`etcd at http://…`, `ConfigMap ns/name`).
    fn describe(&self) -> String;
    /// The key `key`, if it exists.
    fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError>;
    /// Every key starting with `prefix`, in key order.
    fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError>;
    /// Runs `success` if every comparison holds, else `failure`, atomically.
    fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult, EtcdError>;
    /// Sets `key` (no condition).
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let put = Op::Put { key: key.to_string(), value: value.to_vec(), lease };
        self.txn(&[], &[put], &[]).map(|_| ())
    }
    /// A new lease of about `ttl`: its id and its actual TTL.
    fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError>;
    /// Renews `lease`; `None` when it has expired (or was revoked).
    fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError>;
    /// Ends `lease` now: the keys attached to it go.
    fn revoke(&self, lease: i64) -> Result<(), EtcdError>;
    /// How many ended jobs' results the HA store keeps (the newest; a new leader shows them
    /// as ended jobs). A store of bounded size (a ConfigMap holds 1 MiB) keeps fewer.
    fn job_results_retained(&self) -> usize {
        1000
    }
}
