//! Processing-time timers of a keyed operator: at most one timer per key and timestamp.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

/// The pending timers of one keyed operator in one subtask.
pub struct TimerService<K> {
    by_time: BTreeMap<u64, Vec<K>>,
    registered: HashSet<(K, u64), foldhash::fast::RandomState>,
}

impl<K: Eq + Hash + Clone> Default for TimerService<K> {
    fn default() -> Self {
        TimerService { by_time: BTreeMap::new(), registered: HashSet::default() }
    }
}

impl<K: Eq + Hash + Clone> TimerService<K> {
    /// Registers a timer for `key` at `timestamp_ms`; a duplicate is ignored, as in Flink.
    pub fn register(&mut self, key: &K, timestamp_ms: u64) {
        if self.registered.insert((key.clone(), timestamp_ms)) {
            self.by_time.entry(timestamp_ms).or_default().push(key.clone());
        }
    }

    /// Deletes the timer for `key` at `timestamp_ms`, if there is one.
    pub fn delete(&mut self, key: &K, timestamp_ms: u64) {
        if !self.registered.remove(&(key.clone(), timestamp_ms)) {
            return;
        }
        if let Some(keys) = self.by_time.get_mut(&timestamp_ms) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_time.remove(&timestamp_ms);
            }
        }
    }

    /// The earliest pending timer.
    pub fn next_deadline(&self) -> Option<u64> {
        self.by_time.keys().next().copied()
    }

    /// Removes and returns one timer due at or before `now_ms`, earliest first.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(u64, K)> {
        let mut entry = self.by_time.first_entry()?;
        let timestamp = *entry.key();
        if timestamp > now_ms {
            return None;
        }
        let keys = entry.get_mut();
        let key = keys.pop()?;
        if keys.is_empty() {
            entry.remove();
        }
        self.registered.remove(&(key.clone(), timestamp));
        Some((timestamp, key))
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.registered.len()
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_time_order_once_per_key_and_time() {
        let mut timers = TimerService::<&str>::default();
        timers.register(&"b", 20);
        timers.register(&"a", 10);
        timers.register(&"a", 10);
        timers.register(&"c", 30);
        timers.delete(&"c", 30);
        assert_eq!(timers.len(), 2);
        assert_eq!(timers.next_deadline(), Some(10));
        assert_eq!(timers.pop_due(5), None);
        assert_eq!(timers.pop_due(25), Some((10, "a")));
        assert_eq!(timers.pop_due(25), Some((20, "b")));
        assert_eq!(timers.pop_due(100), None);
        assert!(timers.is_empty());
    }
}
