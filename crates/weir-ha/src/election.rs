//! Leader election through an etcd lease: the leader key exists while its lease lives, and
//! its create revision is the leadership's *epoch* (unique and increasing across
//! leaderships), the fencing token every leader write and every message to TaskManagers
//! carries.
//!
//! A leader counts itself as leader only while it renewed its lease recently enough: it
//! stops at two thirds of the lease's TTL after its last successful renewal, before etcd can
//! expire the lease and elect another, so two leaders never act at once, even when this
//! process was frozen (SIGSTOP) and wakes up late.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::etcd::EtcdError;
use crate::kv::{Compare, KeyValueStore, Op};

/// How often a contender looks whether the leader key is gone.
pub const CAMPAIGN_POLL: Duration = Duration::from_millis(100);

/// What the leader publishes about itself under the leader key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// The JobManager's id (32 hex).
    pub id: String,
    /// Its REST address, `host:port`.
    pub rest_address: String,
    /// Its RPC address for TaskManagers, `host:port`.
    pub rpc_address: String,
}

/// Milliseconds on a process-wide monotonic clock.
fn monotonic_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A leadership this process holds.
pub struct Leadership {
    client: Arc<dyn KeyValueStore>,
    key: String,
    lease: i64,
    epoch: i64,
    /// Monotonic ms until which this process may act as leader.
    valid_until_ms: Arc<AtomicU64>,
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
}

/// A cheap handle to ask whether a leadership is still held.
#[derive(Clone)]
pub struct LeadershipGuard {
    epoch: i64,
    valid_until_ms: Arc<AtomicU64>,
    lost: Arc<AtomicBool>,
}

impl LeadershipGuard {
    /// The leadership's epoch.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// True while the leadership is held: not lost, and renewed recently enough.
    pub fn is_held(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && monotonic_ms() < self.valid_until_ms.load(Ordering::SeqCst)
    }

    /// A guard that is always held (no high availability: this process is the only leader).
    pub fn standalone() -> LeadershipGuard {
        LeadershipGuard {
            epoch: 0,
            valid_until_ms: Arc::new(AtomicU64::new(u64::MAX)),
            lost: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Gives the leadership up locally (a write found it gone).
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// A guard of a leadership kept by another mechanism (a Kubernetes Lease) with epoch
    /// `epoch`: not held until [`LeadershipGuard::renewed`] says so.
    pub fn external(epoch: i64) -> LeadershipGuard {
        LeadershipGuard { epoch, valid_until_ms: Arc::new(AtomicU64::new(0)), lost: Arc::new(AtomicBool::new(false)) }
    }

    /// The leadership was renewed now: held for `valid_for` more (the caller's share of the
    /// lease's duration, so it stops acting before another can be elected).
    pub fn renewed(&self, valid_for: Duration) {
        self.valid_until_ms.store(monotonic_ms() + valid_for.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Leadership {
    /// The epoch: the leader key's create revision.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// A handle for the threads that act on this leadership.
    pub fn guard(&self) -> LeadershipGuard {
        LeadershipGuard {
            epoch: self.epoch,
            valid_until_ms: Arc::clone(&self.valid_until_ms),
            lost: Arc::clone(&self.lost),
        }
    }

    /// Waits until the leadership is lost or `timeout` passed; true when lost.
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let guard = self.guard();
        while Instant::now() < deadline {
            if !guard.is_held() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        !guard.is_held()
    }

    /// Gives the leadership up: revokes the lease, so the leader key goes at once.
    pub fn resign(mut self) {
        self.stop_keeper();
        self.lost.store(true, Ordering::SeqCst);
        if let Err(error) = self.client.revoke(self.lease) {
            tracing::warn!(%error, "cannot revoke the leader lease; it expires by itself");
        }
    }

    /// Gives up a leadership already lost: revokes its lease, retrying while etcd does not
    /// answer (for at most `within`), so that a leader key the lease still holds goes at once
    /// rather than after the TTL. That happens when etcd was down or frozen and came back with
    /// the lease renewed: the lease outlives the leadership this process already gave up.
    /// Nothing is unfenced: the process acts no more on this leadership.
    pub fn release_lost(mut self, within: Duration) {
        self.stop_keeper();
        self.lost.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + within;
        loop {
            match self.client.revoke(self.lease) {
                // Revoked, or etcd refused (the lease is gone already).
                Ok(()) | Err(EtcdError::Refused { .. }) => return,
                Err(_) if Instant::now() < deadline => std::thread::sleep(CAMPAIGN_POLL),
                Err(error) => {
                    tracing::warn!(%error, "cannot revoke the lost leadership's lease; it expires by itself");
                    return;
                }
            }
        }
    }

    fn stop_keeper(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }

    /// The leader key this leadership holds.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop_keeper();
    }
}

/// An election on one key.
pub struct Election {
    client: Arc<dyn KeyValueStore>,
    key: String,
    ttl: Duration,
}

impl Election {
    /// An election on `key` with leases of `ttl`.
    pub fn new(client: Arc<dyn KeyValueStore>, key: &str, ttl: Duration) -> Election {
        Election { client, key: key.to_string(), ttl }
    }

    /// The current leader and its epoch, if there is one.
    pub fn leader(&self) -> Result<Option<(LeaderInfo, i64)>, EtcdError> {
        let Some(kv) = self.client.get(&self.key)? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&kv.value).ok().map(|info| (info, kv.create_revision)))
    }

    /// Waits until this process is the leader (publishing `info`), or `stop` is set
    /// (`None`). etcd being unreachable is an error only when it never answered; later
    /// outages are waited out.
    pub fn campaign(&self, info: &LeaderInfo, stop: &AtomicBool) -> Result<Option<Leadership>, EtcdError> {
        let value = serde_json::to_vec(info).unwrap_or_default();
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let (lease, ttl) = match self.client.grant(self.ttl) {
                Ok(granted) => granted,
                Err(error) => {
                    tracing::warn!(%error, "cannot reach etcd to campaign for leadership; retrying");
                    std::thread::sleep(CAMPAIGN_POLL * 5);
                    continue;
                }
            };
            let mut renewed_at = monotonic_ms();
            loop {
                if stop.load(Ordering::SeqCst) {
                    let _ = self.client.revoke(lease);
                    return Ok(None);
                }
                let put = Op::Put { key: self.key.clone(), value: value.clone(), lease };
                match self.client.txn(&[Compare::CreateRevision(self.key.clone(), 0)], &[put], &[]) {
                    Ok(result) if result.succeeded => {
                        let epoch = result.revision;
                        tracing::info!(epoch, key = %self.key, "elected leader");
                        return Ok(Some(self.hold(lease, ttl, epoch, renewed_at)));
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "campaign for leadership failed; retrying"),
                }
                std::thread::sleep(CAMPAIGN_POLL);
                // Keep the waiting lease alive, and take a new one if it lapsed.
                if monotonic_ms() - renewed_at >= ttl.as_millis() as u64 / 3 {
                    match self.client.keep_alive(lease) {
                        Ok(Some(_)) => renewed_at = monotonic_ms(),
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
            }
        }
    }

    /// Starts the renewal thread of a won election.
    fn hold(&self, lease: i64, ttl: Duration, epoch: i64, renewed_at: u64) -> Leadership {
        let safe_ms = ttl.as_millis() as u64 * 2 / 3;
        let valid_until_ms = Arc::new(AtomicU64::new(renewed_at + safe_ms));
        let lost = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let keeper = {
            let client = Arc::clone(&self.client);
            let key = self.key.clone();
            let valid_until_ms = Arc::clone(&valid_until_ms);
            let lost = Arc::clone(&lost);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("weir-leader-lease".into())
                .spawn(move || keep_leadership(client.as_ref(), &key, lease, epoch, ttl, &valid_until_ms, &lost, &stop))
                .ok()
        };
        Leadership {
            client: Arc::clone(&self.client),
            key: self.key.clone(),
            lease,
            epoch,
            valid_until_ms,
            lost,
            stop,
            keeper,
        }
    }
}

/// Renews the lease every third of its TTL; marks the leadership lost when the lease
/// expired, the key is not ours any more, or no renewal succeeded in time.
#[allow(clippy::too_many_arguments)]
fn keep_leadership(
    client: &dyn KeyValueStore,
    key: &str,
    lease: i64,
    epoch: i64,
    ttl: Duration,
    valid_until_ms: &AtomicU64,
    lost: &AtomicBool,
    stop: &AtomicBool,
) {
    let safe_ms = ttl.as_millis() as u64 * 2 / 3;
    let interval = ttl / 3;
    let mut next = Instant::now() + interval;
    while !stop.load(Ordering::SeqCst) {
        if monotonic_ms() >= valid_until_ms.load(Ordering::SeqCst) {
            tracing::error!(epoch, "leadership lost: the lease was not renewed in time");
            lost.store(true, Ordering::SeqCst);
            return;
        }
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let attempt_at = monotonic_ms();
        match client.keep_alive(lease) {
            Ok(Some(_)) => {
                // Renewed as of when the request was sent.
                valid_until_ms.store(attempt_at + safe_ms, Ordering::SeqCst);
                next = Instant::now() + interval;
                match client.get(key) {
                    Ok(Some(kv)) if kv.create_revision == epoch => {}
                    Ok(_) => {
                        tracing::error!(epoch, "leadership lost: the leader key belongs to another leadership");
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(_) => {}
                }
            }
            Ok(None) => {
                tracing::error!(epoch, "leadership lost: the lease expired");
                lost.store(true, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot renew the leader lease; retrying");
                next = Instant::now() + Duration::from_millis(100);
            }
        }
    }
}
