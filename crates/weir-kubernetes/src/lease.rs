//! Leader election of `weir operator --kubernetes` replicas through a `Lease`
//! (`coordination.k8s.io/v1`): the holder renews `renewTime` every third of the lease's
//! duration; another replica takes the lease over only once it was not renewed for the
//! whole duration. Every write is a replace conditioned on the resource version, so two
//! replicas never both win. The leader counts itself leader only until two thirds of the
//! duration after its last successful renewal (its [`Fence`] says so), before another can
//! take over, even when it was frozen. `leaseTransitions` is the leadership's epoch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use weir_deploy::Fence;
use weir_ha::LeadershipGuard;

use crate::client::{Kube, is_conflict, is_not_found};

/// The lease the operators of one namespace compete for.
pub const LEASE_NAME: &str = "weir-operator";

/// A leadership held through the Lease.
pub struct LeaseLeadership {
    kube: Arc<Kube>,
    identity: String,
    guard: LeadershipGuard,
    stop: Arc<AtomicBool>,
    keeper: Option<std::thread::JoinHandle<()>>,
}

impl LeaseLeadership {
    /// The fence the controller acts under.
    pub fn fence(&self) -> Fence {
        Fence::from_guard(self.guard.clone(), None)
    }

    /// Gives the leadership up: the lease is released at once (no holder), so a standby
    /// takes over at its next look instead of waiting the duration out.
    pub fn resign(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        self.guard.mark_lost();
        let api = self.kube.api::<Lease>();
        let released = self.kube.block_on(async {
            let mut lease = api.get(LEASE_NAME).await?;
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.renew_time = None;
            api.replace(LEASE_NAME, &PostParams::default(), &lease).await.map(|_| ())
        });
        if let Err(error) = released {
            tracing::warn!(%error, "cannot release the operator lease; it expires by itself");
        }
    }
}

/// Campaigns for the lease as `identity` until it is won (`Ok(Some)`) or `stop` is set
/// (`Ok(None)`).
pub fn lead(
    kube: Arc<Kube>,
    identity: &str,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<Option<LeaseLeadership>, kube::Error> {
    let mut announced = false;
    while !stop.load(Ordering::SeqCst) {
        match try_acquire(&kube, identity, duration)? {
            Some(epoch) => {
                let guard = LeadershipGuard::external(epoch);
                guard.renewed(duration * 2 / 3);
                tracing::info!(epoch, lease = LEASE_NAME, namespace = kube.namespace(), "elected leader");
                let keeper_stop = Arc::new(AtomicBool::new(false));
                let keeper = {
                    let kube = Arc::clone(&kube);
                    let guard = guard.clone();
                    let identity = identity.to_string();
                    let stop = Arc::clone(&keeper_stop);
                    std::thread::Builder::new()
                        .name("weir-lease".into())
                        .spawn(move || keep(&kube, &identity, duration, &guard, &stop))
                        .ok()
                };
                return Ok(Some(LeaseLeadership {
                    kube,
                    identity: identity.to_string(),
                    guard,
                    stop: keeper_stop,
                    keeper,
                }));
            }
            None => {
                if !announced {
                    tracing::info!(lease = LEASE_NAME, "another operator leads; standing by");
                    announced = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    Ok(None)
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One attempt: the lease is taken when nobody holds it, or its holder has not renewed it
/// for its whole duration. The epoch (transitions) of a won lease.
fn try_acquire(kube: &Kube, identity: &str, duration: Duration) -> Result<Option<i64>, kube::Error> {
    let api = kube.api::<Lease>();
    kube.block_on(async {
        let existing = api.get_opt(LEASE_NAME).await?;
        let seconds = duration.as_secs().max(1) as i32;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(LEASE_NAME.into()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.into()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(1),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Some(1)),
                Err(error) if is_conflict(&error) => Ok(None),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let held_by_other = spec.holder_identity.as_deref().is_some_and(|holder| !holder.is_empty());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(seconds)) => {
                let age = Timestamp::now().duration_since(renewed.0);
                age.as_secs() >= i64::from(seconds)
            }
            _ => true,
        };
        if held_by_other && !expired && spec.holder_identity.as_deref() != Some(identity) {
            return Ok(None);
        }
        let epoch = i64::from(spec.lease_transitions.unwrap_or(0)) + 1;
        spec.holder_identity = Some(identity.into());
        spec.lease_duration_seconds = Some(seconds);
        spec.acquire_time = Some(now());
        spec.renew_time = Some(now());
        spec.lease_transitions = Some(epoch as i32);
        // Conditioned on the resource version read: of two contenders, one wins.
        match api.replace(LEASE_NAME, &PostParams::default(), &lease).await {
            Ok(_) => Ok(Some(epoch)),
            Err(error) if is_conflict(&error) || is_not_found(&error) => Ok(None),
            Err(error) => Err(error),
        }
    })
}

/// Renews the lease every third of its duration while it is ours; marks the guard lost
/// when another holds it.
fn keep(kube: &Kube, identity: &str, duration: Duration, guard: &LeadershipGuard, stop: &AtomicBool) {
    let api = kube.api::<Lease>();
    while !stop.load(Ordering::SeqCst) {
        // In short naps, so a resign is not held up by a sleeping keeper.
        let next = std::time::Instant::now() + duration / 3;
        while std::time::Instant::now() < next {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let renewed = kube.block_on(async {
            let mut lease = api.get(LEASE_NAME).await?;
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(identity) {
                return Ok(false);
            }
            spec.renew_time = Some(now());
            api.replace(LEASE_NAME, &PostParams::default(), &lease).await.map(|_| true)
        });
        match renewed {
            Ok(true) => guard.renewed(duration * 2 / 3),
            Ok(false) => {
                tracing::warn!(lease = LEASE_NAME, "another operator holds the lease now: this one stops acting");
                guard.mark_lost();
                return;
            }
            Err(error) => tracing::warn!(%error, "cannot renew the operator lease; retrying"),
        }
    }
}
