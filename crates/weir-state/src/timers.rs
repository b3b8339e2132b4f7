//! Timers of a keyed operator, one service per time domain (processing time, event time): at
//! most one timer per key and timestamp.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

use weir_types::key::with_canonical_bytes;
use weir_types::{Key, KeyGroupRange, assign_to_key_group};

use crate::error::StateError;
use crate::handles::StateKind;
use crate::table::{RestoredTable, TableSnapshot};

/// The name under which a keyed operator's processing-time timers are stored in a snapshot.
pub const TIMERS_STATE: &str = "__timers";
/// The name under which a keyed operator's event-time timers are stored in a snapshot. Their
/// timestamps are event times (`i64` epoch ms) mapped order-preserving onto `u64`
/// ([`event_time_to_timer`]).
pub const EVENT_TIMERS_STATE: &str = "__event_timers";

/// An event time as a timer timestamp: `i64` onto `u64` keeping the order (the sign bit
/// flipped), so event times before 1970 order right too.
pub fn event_time_to_timer(event_time: i64) -> u64 {
    (event_time as u64) ^ (1 << 63)
}

/// The event time of a timer timestamp made by [`event_time_to_timer`].
pub fn timer_to_event_time(timer: u64) -> i64 {
    (timer ^ (1 << 63)) as i64
}

/// Stale entries a timer service keeps before it sweeps them (see `TimerService::by_time`).
const STALE_SWEEP_MIN: usize = 1024;
/// Keys of one timestamp a sweep deduplicates by a scan before it builds a set.
const SWEEP_SCAN_MAX: usize = 16;

/// The pending timers of one keyed operator in one subtask.
pub struct TimerService<K> {
    /// Keys by timestamp. A deletion only leaves `registered` (finding a key among all the
    /// keys of one millisecond costs a scan, and a session window moves its timer on every
    /// record): the entry it leaves here is stale, skipped when due, and swept out once
    /// stale entries outnumber the pending timers.
    by_time: BTreeMap<u64, Vec<K>>,
    registered: HashSet<(K, u64), foldhash::fast::RandomState>,
    /// Entries of `by_time` no pending timer stands for.
    stale: usize,
    /// The state name in snapshots ([`TIMERS_STATE`] or [`EVENT_TIMERS_STATE`]).
    name: &'static str,
}

impl<K: Eq + Hash + Clone> Default for TimerService<K> {
    /// Processing-time timers.
    fn default() -> Self {
        TimerService::named(TIMERS_STATE)
    }
}

impl<K: Eq + Hash + Clone> TimerService<K> {
    /// Timers stored in snapshots as state `name`.
    pub fn named(name: &'static str) -> Self {
        TimerService { by_time: BTreeMap::new(), registered: HashSet::default(), stale: 0, name }
    }

    /// The state name of these timers in snapshots.
    pub fn name(&self) -> &'static str {
        self.name
    }

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
        self.stale += 1;
        if self.stale > STALE_SWEEP_MIN && self.stale > self.registered.len() {
            self.sweep();
        }
    }

    /// Drops the stale entries of `by_time` (and the second entry of a timer deleted and
    /// registered again before its first was swept). A duplicate can only sit beside its
    /// twin under the same timestamp, so each timestamp's keys are deduplicated on their
    /// own: by a scan when few are left (the common case, no allocation), by a set otherwise
    /// (many keys due at one time must not make the sweep quadratic).
    fn sweep(&mut self) {
        let registered = &self.registered;
        self.by_time.retain(|&timestamp, keys| {
            keys.retain(|key| registered.contains(&(key.clone(), timestamp)));
            if keys.len() <= SWEEP_SCAN_MAX {
                let mut kept = 0;
                for index in 0..keys.len() {
                    if !keys[..kept].contains(&keys[index]) {
                        keys.swap(kept, index);
                        kept += 1;
                    }
                }
                keys.truncate(kept);
            } else {
                let mut seen: HashSet<K, foldhash::fast::RandomState> =
                    HashSet::with_capacity_and_hasher(keys.len(), Default::default());
                keys.retain(|key| seen.insert(key.clone()));
            }
            !keys.is_empty()
        });
        self.stale = 0;
    }

    /// The earliest pending timer (or, after deletions, a time at which a deleted one was
    /// due: waking then for nothing is harmless).
    pub fn next_deadline(&self) -> Option<u64> {
        self.by_time.keys().next().copied()
    }

    /// Removes and returns one timer due at or before `now_ms`, earliest first.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(u64, K)> {
        loop {
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
            if self.registered.remove(&(key.clone(), timestamp)) {
                return Some((timestamp, key));
            }
            self.stale = self.stale.saturating_sub(1);
        }
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

impl<K: Key> TimerService<K> {
    /// A copy of the pending timers, grouped by key group, for a checkpoint.
    pub fn snapshot(&self, range: KeyGroupRange, max_parallelism: u32) -> TimersSnapshot {
        let mut by_key: BTreeMap<Vec<u8>, (u32, Vec<u64>)> = BTreeMap::new();
        for (key, timestamp) in &self.registered {
            let key_bytes = with_canonical_bytes(key, <[u8]>::to_vec);
            let key_group = assign_to_key_group(key, max_parallelism);
            by_key.entry(key_bytes).or_insert_with(|| (key_group, Vec::new())).1.push(*timestamp);
        }
        let mut groups: BTreeMap<u32, Vec<KeyTimers>> = BTreeMap::new();
        for (key_bytes, (key_group, mut timestamps)) in by_key {
            timestamps.sort_unstable();
            groups.entry(key_group).or_default().push((key_bytes, timestamps));
        }
        TimersSnapshot { range, groups, name: self.name }
    }

    /// Registers the timers of a restored snapshot table.
    pub fn restore(&mut self, table: &RestoredTable) -> Result<(), StateError> {
        for (key_group, (bytes, _)) in &table.key_groups {
            let corrupt = |what: &str, e: postcard::Error| StateError::Corrupt {
                name: self.name.to_string(),
                key_group: *key_group,
                reason: format!("cannot decode {what}: {e}"),
            };
            let entries: Vec<(&[u8], Vec<u64>)> = postcard::from_bytes(bytes).map_err(|e| corrupt("timers", e))?;
            for (key_bytes, timestamps) in entries {
                let key: K = postcard::from_bytes(key_bytes).map_err(|e| corrupt("a key", e))?;
                for timestamp in timestamps {
                    self.register(&key, timestamp);
                }
            }
        }
        Ok(())
    }
}

/// One key's canonical bytes and its timer timestamps.
type KeyTimers = (Vec<u8>, Vec<u64>);

/// Pending timers copied at a barrier: per key group, `(key bytes, timestamps)` sorted by key.
pub struct TimersSnapshot {
    range: KeyGroupRange,
    groups: BTreeMap<u32, Vec<KeyTimers>>,
    name: &'static str,
}

impl TableSnapshot for TimersSnapshot {
    fn name(&self) -> &str {
        self.name
    }
    fn kind(&self) -> StateKind {
        StateKind::Timers
    }
    fn cell_type(&self) -> &str {
        if self.name == EVENT_TIMERS_STATE { "event-time timers" } else { "processing-time timers" }
    }
    fn key_group_entries(&self, key_group: u32) -> u64 {
        if !self.range.contains(key_group) {
            return 0;
        }
        self.groups.get(&key_group).map(|entries| entries.len() as u64).unwrap_or(0)
    }
    fn write_key_group(&self, key_group: u32, out: &mut Vec<u8>) -> Result<(), StateError> {
        let empty = Vec::new();
        let entries = self.groups.get(&key_group).unwrap_or(&empty);
        postcard::to_io(entries, out).map(|_| ()).map_err(|e| StateError::Corrupt {
            name: self.name.to_string(),
            key_group,
            reason: format!("cannot encode: {e}"),
        })
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

    #[test]
    fn a_timer_deleted_and_registered_again_fires_once() {
        let mut timers = TimerService::<&str>::default();
        timers.register(&"a", 10);
        timers.delete(&"a", 10);
        assert_eq!(timers.pop_due(100), None, "a deleted timer fired");
        timers.register(&"a", 10);
        timers.delete(&"a", 10);
        timers.register(&"a", 10);
        assert_eq!(timers.len(), 1);
        assert_eq!(timers.pop_due(100), Some((10, "a")));
        assert_eq!(timers.pop_due(100), None, "a timer registered twice around a deletion fired twice");
        assert!(timers.is_empty());
    }

    #[test]
    fn timers_moved_on_every_record_fire_once_at_their_last_time_and_stale_entries_are_swept() {
        // As a session window moves its timer with every record of its key.
        let mut timers = TimerService::<u64>::default();
        for step in 0..10_000u64 {
            let key = step % 7;
            if step >= 7 {
                timers.delete(&key, step - 7);
            }
            timers.register(&key, step);
        }
        assert_eq!(timers.len(), 7);
        let entries: usize = timers.by_time.values().map(Vec::len).sum();
        assert!(
            entries <= 7 + 2 * STALE_SWEEP_MIN + 2,
            "{entries} entries kept for 7 timers: stale ones were not swept"
        );
        let mut fired = Vec::new();
        while let Some(timer) = timers.pop_due(u64::MAX) {
            fired.push(timer);
        }
        let expected: Vec<(u64, u64)> = (9_993..10_000u64).map(|step| (step, step % 7)).collect();
        assert_eq!(fired, expected);
        assert!(timers.is_empty());
    }

    #[test]
    fn a_sweep_keeps_one_entry_per_pending_timer_however_many_keys_share_a_time() {
        // 40 keys due at one time (past the sweep's scan limit), each deleted and registered
        // again (two entries, one timer), and 10 of them deleted for good.
        let mut timers = TimerService::<u64>::default();
        for key in 0..40u64 {
            timers.register(&key, 5);
        }
        for key in 0..40u64 {
            timers.delete(&key, 5);
            if key >= 10 {
                timers.register(&key, 5);
            }
        }
        timers.register(&99, 7);
        assert_eq!(timers.by_time[&5].len(), 70);
        timers.sweep();
        let mut kept = timers.by_time[&5].clone();
        kept.sort_unstable();
        assert_eq!(kept, (10..40u64).collect::<Vec<_>>(), "a stale entry or a twin survived the sweep");
        assert_eq!(timers.by_time[&7], vec![99]);
        let mut fired = Vec::new();
        while let Some((_, key)) = timers.pop_due(10) {
            fired.push(key);
        }
        fired.sort_unstable();
        assert_eq!(fired, (10..40u64).chain([99]).collect::<Vec<_>>());
    }

    #[test]
    fn timers_survive_a_snapshot_and_restore() {
        let mut timers = TimerService::<u64>::default();
        for key in 0..50u64 {
            timers.register(&key, 1000 + key);
            timers.register(&key, 5000);
        }
        let range = KeyGroupRange::new(0, 127);
        let snapshot = timers.snapshot(range, 128);
        let mut key_groups = BTreeMap::new();
        for key_group in range.iter() {
            let entries = snapshot.key_group_entries(key_group);
            if entries > 0 {
                let mut bytes = Vec::new();
                snapshot.write_key_group(key_group, &mut bytes).unwrap();
                key_groups.insert(key_group, (bytes, entries));
            }
        }
        let table =
            RestoredTable { name: TIMERS_STATE.into(), kind: StateKind::Timers, cell_type: String::new(), key_groups };
        let mut restored = TimerService::<u64>::default();
        restored.restore(&table).unwrap();
        assert_eq!(restored.len(), 100);
        assert_eq!(restored.next_deadline(), Some(1000));
        assert_eq!(restored.pop_due(1000), Some((1000, 0)));
    }
}
