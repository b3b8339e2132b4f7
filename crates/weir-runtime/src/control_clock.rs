//! The control plane's monotonic clock: the system's in a cluster, or one that moves only
//! when a test moves it, so that a job master stepped by a test (its restart delays, its
//! checkpoint schedule and timeouts) replays the same for the same seed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic clock; [`ControlClock::system`] unless a test steps it.
#[derive(Clone, Debug, Default)]
pub struct ControlClock {
    /// `None`: the system's clock. Otherwise the instant it started at and the microseconds
    /// the test moved it since.
    manual: Option<(Instant, Arc<AtomicU64>)>,
}

impl ControlClock {
    /// The system's monotonic clock.
    pub fn system() -> ControlClock {
        ControlClock { manual: None }
    }

    /// A clock standing still at the current instant until [`ControlClock::advance`] moves
    /// it (clones share it).
    pub fn manual() -> ControlClock {
        ControlClock { manual: Some((Instant::now(), Arc::new(AtomicU64::new(0)))) }
    }

    /// The current instant.
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some((start, micros)) => *start + Duration::from_micros(micros.load(Ordering::SeqCst)),
        }
    }

    /// Moves a manual clock on by `by` (the system's clock moves by itself: nothing happens).
    pub fn advance(&self, by: Duration) {
        if let Some((_, micros)) = &self.manual {
            micros.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
        }
    }

    /// Waits `by`: the thread sleeps on the system's clock; a manual clock moves on at once
    /// (so that a retry loop of a stepped job master replays the same, without waiting).
    pub fn sleep(&self, by: Duration) {
        match &self.manual {
            None => std::thread::sleep(by),
            Some(_) => self.advance(by),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_follow() {
        let clock = ControlClock::manual();
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.now(), start);
        let clone = clock.clone();
        clock.advance(Duration::from_millis(250));
        assert_eq!(clone.now(), start + Duration::from_millis(250));
        assert!(ControlClock::system().now() >= start);
        clone.sleep(Duration::from_secs(30));
        assert_eq!(clock.now(), start + Duration::from_millis(30_250));
    }
}
