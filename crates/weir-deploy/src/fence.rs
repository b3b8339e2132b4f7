//! What the controller's writes and actions are conditioned on: this operator's leadership.
//!
//! An operator that lost its leadership (its etcd lease expired while it was frozen, or it
//! was cut off from etcd) may still be in the middle of an operation when it wakes. Every
//! status write then goes to etcd as a transaction compared on the leader key's create
//! revision (the leadership's epoch), and every process action (a cancel, a stop, a cluster
//! stopped or started, a job submitted, a savepoint disposed) first asks the fence, which
//! counts the leadership as held only until two thirds of the lease's TTL after its last
//! renewal (`weir_ha::election`), before etcd can elect another. So a process that lost its
//! lease makes no further write, and no further process action once it has noticed; the
//! window left is the one between that check and the action (microseconds, not the lease).

use weir_ha::{Leadership, LeadershipGuard};

/// The leadership a controller acts under.
#[derive(Clone)]
pub struct Fence {
    guard: LeadershipGuard,
    /// The etcd leader key whose create revision is the epoch; `None` for a file lock.
    leader_key: Option<String>,
}

/// The controller's leadership is gone: it makes no further write or process action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this operator lost its leadership (its etcd lease expired or another operator took over): it stops acting and stands by"
)]
pub struct LeadershipLost;

impl Fence {
    /// An operator holding the data directory's lock file: it leads until the process ends
    /// (the kernel releases the lock only then), so nothing can take over from it.
    pub fn lock_file() -> Fence {
        Fence { guard: LeadershipGuard::standalone(), leader_key: None }
    }

    /// An operator leading through `leadership` in etcd.
    pub fn etcd(leadership: &Leadership) -> Fence {
        Fence { guard: leadership.guard(), leader_key: Some(leadership.key().to_string()) }
    }

    /// A fence from a guard and its leader key (tests).
    pub fn from_guard(guard: LeadershipGuard, leader_key: Option<String>) -> Fence {
        Fence { guard, leader_key }
    }

    /// Ok while the leadership is held.
    pub fn check(&self) -> Result<(), LeadershipLost> {
        if self.guard.is_held() { Ok(()) } else { Err(LeadershipLost) }
    }

    /// True while the leadership is held.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// The condition an etcd write must meet: the leader key still has this leadership's
    /// create revision.
    pub fn etcd_condition(&self) -> Option<(&str, i64)> {
        self.leader_key.as_deref().map(|key| (key, self.guard.epoch()))
    }

    /// Gives the leadership up locally: a conditional write found it gone.
    pub fn mark_lost(&self) {
        self.guard.mark_lost();
    }
}
