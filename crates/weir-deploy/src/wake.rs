//! Wakes the controller's loop early. Where the deployments live behind a watch (the
//! Kubernetes API server), a change (a resource applied, a status written, a pod that ended)
//! starts the next reconcile pass at once, and an idle controller need not poll. The pass
//! itself still reads every deployment fresh from the store: a wake-up only says *when*.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A latch the watchers set and the controller's loop waits on.
#[derive(Debug, Default)]
pub struct Wake {
    pending: Mutex<bool>,
    changed: Condvar,
}

impl Wake {
    /// A latch with nothing pending.
    pub fn new() -> Wake {
        Wake::default()
    }

    /// Something changed: the next (or current) wait returns at once.
    pub fn notify(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        *pending = true;
        self.changed.notify_all();
    }

    /// Waits until notified or `timeout` passes, and clears the latch; true when notified.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        while !*pending {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pending = self.changed.wait_timeout(pending, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        *pending = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_notification_before_the_wait_is_not_lost_and_is_consumed_once() {
        let wake = Wake::new();
        wake.notify();
        assert!(wake.wait(Duration::from_secs(5)));
        let started = Instant::now();
        assert!(!wake.wait(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_notification_from_another_thread_ends_the_wait_early() {
        let wake = Arc::new(Wake::new());
        let notifier = Arc::clone(&wake);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            notifier.notify();
        });
        let started = Instant::now();
        assert!(wake.wait(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
        thread.join().expect("the notifier ends");
    }
}
