//! Timers of a keyed operator, one service per time domain (processing time, event time): at
//! most one timer per key and timestamp.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
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

/// Stale entries one timestamp's keys may hold before they are compacted (see [`TimeSlot`]).
const STALE_COMPACT_MIN: usize = 1024;

/// Keys one timestamp holds before it indexes them (below that a scan is cheaper than a
/// map, and most timestamps of a processing function's timers have one or two keys).
const SMALL_SLOT_MAX: usize = 8;

/// The timers due at one timestamp.
///
/// Small, `keys` holds exactly the pending keys. Large, `live` maps each pending key to its
/// index in `keys`, and a deletion only unmaps its key (finding it among the keys costs a
/// scan): the entry it leaves is stale, skipped when due, and compacted away once stale
/// entries outnumber the live ones; a key deleted and registered again has two entries,
/// the one `live` names is the timer. With no stale entry (the common case: window timers
/// are registered once and fire) firing needs no lookup at all.
struct TimeSlot<K> {
    /// Keys in registration order (they fire last first).
    keys: Vec<K>,
    /// Each pending key's index in `keys`, once there are more than [`SMALL_SLOT_MAX`].
    live: Option<HashMap<K, usize, foldhash::fast::RandomState>>,
}

impl<K> Default for TimeSlot<K> {
    fn default() -> Self {
        TimeSlot { keys: Vec::new(), live: None }
    }
}

impl<K: Eq + Hash + Clone> TimeSlot<K> {
    /// Adds `key`; false when it is pending here already.
    fn insert(&mut self, key: &K) -> bool {
        let Some(live) = &mut self.live else {
            if self.keys.contains(key) {
                return false;
            }
            self.keys.push(key.clone());
            if self.keys.len() > SMALL_SLOT_MAX {
                self.live = Some(self.keys.iter().cloned().enumerate().map(|(index, key)| (key, index)).collect());
            }
            return true;
        };
        match live.entry(key.clone()) {
            Entry::Occupied(_) => false,
            Entry::Vacant(vacant) => {
                vacant.insert(self.keys.len());
                self.keys.push(key.clone());
                true
            }
        }
    }

    /// The index in `keys` of `key`'s pending timer.
    fn find(&self, key: &K) -> Option<usize> {
        match &self.live {
            None => self.keys.iter().position(|k| k == key),
            Some(live) => live.get(key).copied(),
        }
    }

    /// Removes `key`'s pending timer; false if it had none. A small slot moves the keys
    /// after it down by one.
    fn remove(&mut self, key: &K) -> bool {
        match self.find(key) {
            Some(index) => {
                self.remove_at(key, index);
                true
            }
            None => false,
        }
    }

    /// Removes `key`'s pending timer, which [`Self::find`] found at `index`.
    fn remove_at(&mut self, key: &K, index: usize) {
        match &mut self.live {
            None => {
                self.keys.remove(index);
            }
            // The entry in `keys` goes stale.
            Some(live) => {
                live.remove(key);
            }
        }
    }

    /// Whether entry `index` of `keys` is a pending timer (not stale, not a twin).
    #[inline]
    fn is_live(&self, index: usize) -> bool {
        match &self.live {
            None => true,
            Some(live) => self.keys.len() == live.len() || live.get(&self.keys[index]) == Some(&index),
        }
    }

    /// Number of pending timers.
    fn live_len(&self) -> usize {
        self.live.as_ref().map_or(self.keys.len(), HashMap::len)
    }

    /// Every pending key.
    fn live_keys(&self) -> impl Iterator<Item = &K> {
        (0..self.keys.len()).filter(|&index| self.is_live(index)).map(|index| &self.keys[index])
    }

    /// Drops the stale entries once they outnumber the live ones, keeping the order.
    fn compact_if_stale(&mut self) {
        let Some(live) = &mut self.live else { return };
        let stale = self.keys.len() - live.len();
        if stale <= STALE_COMPACT_MIN || stale <= live.len() {
            return;
        }
        let mut kept = 0;
        for index in 0..self.keys.len() {
            if live.get(&self.keys[index]) == Some(&index) {
                self.keys.swap(kept, index);
                if let Some(position) = live.get_mut(&self.keys[kept]) {
                    *position = kept;
                }
                kept += 1;
            }
        }
        self.keys.truncate(kept);
    }
}

/// The timestamp whose timers are firing: taken out of `by_time` whole, its keys fire from
/// `cursor` down; those at `cursor` and above fired already.
struct Firing<K> {
    time: u64,
    slot: TimeSlot<K>,
    cursor: usize,
}

/// The pending timers of one keyed operator in one subtask.
pub struct TimerService<K> {
    /// Keys by timestamp.
    by_time: BTreeMap<u64, TimeSlot<K>>,
    /// The timestamp firing now, if a `pop_due` run is under way.
    firing: Option<Firing<K>>,
    /// Number of pending timers.
    pending: usize,
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
        TimerService { by_time: BTreeMap::new(), firing: None, pending: 0, name }
    }

    /// The state name of these timers in snapshots.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Registers a timer for `key` at `timestamp_ms`; a duplicate is ignored, as in Flink.
    /// While timers fire, one registered for a key whose timer at that time fired already
    /// is new and fires in the same run; one earlier than the time firing fires next, as
    /// Flink's priority queue would.
    pub fn register(&mut self, key: &K, timestamp_ms: u64) {
        if let Some(firing) = &self.firing {
            if timestamp_ms == firing.time && firing.slot.find(key).is_some_and(|index| index < firing.cursor) {
                return;
            }
            if timestamp_ms < firing.time {
                self.put_back_firing();
            }
        }
        if self.by_time.entry(timestamp_ms).or_default().insert(key) {
            self.pending += 1;
        }
    }

    /// Deletes the timer for `key` at `timestamp_ms`, if there is one.
    pub fn delete(&mut self, key: &K, timestamp_ms: u64) {
        if let Some(firing) = &mut self.firing
            && timestamp_ms == firing.time
            && let Some(index) = firing.slot.find(key).filter(|&index| index < firing.cursor)
        {
            firing.slot.remove_at(key, index);
            if firing.slot.live.is_none() {
                // The keys after it, down to the cursor, moved down by one.
                firing.cursor -= 1;
            }
            self.pending -= 1;
            return;
        }
        let Some(slot) = self.by_time.get_mut(&timestamp_ms) else { return };
        if !slot.remove(key) {
            return;
        }
        self.pending -= 1;
        if slot.live_len() == 0 {
            self.by_time.remove(&timestamp_ms);
        } else {
            slot.compact_if_stale();
        }
    }

    /// Returns the timers of the time firing that did not fire yet to `by_time` (a timer
    /// earlier than it was registered and must fire first).
    fn put_back_firing(&mut self) {
        let Some(firing) = self.firing.take() else { return };
        let slot = self.by_time.entry(firing.time).or_default();
        for index in 0..firing.cursor {
            // Already counted in `pending`; none of them can be in `slot` (registering a
            // pending one there is a duplicate).
            if firing.slot.is_live(index) {
                slot.insert(&firing.slot.keys[index]);
            }
        }
        if slot.keys.is_empty() {
            self.by_time.remove(&firing.time);
        }
    }

    /// The earliest pending timer (or, after deletions, a time at which a deleted one was
    /// due: waking then for nothing is harmless).
    pub fn next_deadline(&self) -> Option<u64> {
        let firing = self.firing.as_ref().filter(|firing| firing.cursor > 0).map(|firing| firing.time);
        match (firing, self.by_time.keys().next().copied()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes and returns one timer due at or before `now_ms`, earliest first.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(u64, K)> {
        loop {
            if let Some(firing) = &mut self.firing {
                if firing.time > now_ms {
                    // Only if the clock went back; the rest fires when it is due again.
                    return None;
                }
                while firing.cursor > 0 {
                    firing.cursor -= 1;
                    if firing.slot.is_live(firing.cursor) {
                        self.pending -= 1;
                        return Some((firing.time, firing.slot.keys[firing.cursor].clone()));
                    }
                }
                self.firing = None;
            }
            let entry = self.by_time.first_entry()?;
            if *entry.key() > now_ms {
                return None;
            }
            let (time, slot) = entry.remove_entry();
            self.firing = Some(Firing { time, cursor: slot.keys.len(), slot });
        }
    }

    /// The key whose timer `pop_due` returns `ahead + 1` calls from now, if it is due at the
    /// time firing now (a guess: a deletion in between makes it wrong, which is harmless
    /// for what it is for, prefetching that key's state).
    #[inline]
    pub fn upcoming(&self, ahead: usize) -> Option<&K> {
        let firing = self.firing.as_ref()?;
        firing.cursor.checked_sub(ahead + 1).map(|index| &firing.slot.keys[index])
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.pending
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Every pending timer, `(key, timestamp)`, in no particular order.
    fn pending_timers(&self) -> impl Iterator<Item = (&K, u64)> {
        let firing = self.firing.iter().flat_map(|firing| {
            (0..firing.cursor)
                .filter(|&index| firing.slot.is_live(index))
                .map(|index| (&firing.slot.keys[index], firing.time))
        });
        let waiting = self.by_time.iter().flat_map(|(&time, slot)| slot.live_keys().map(move |key| (key, time)));
        firing.chain(waiting)
    }
}

impl<K: Key> TimerService<K> {
    /// A copy of the pending timers, grouped by key group, for a checkpoint.
    pub fn snapshot(&self, range: KeyGroupRange, max_parallelism: u32) -> TimersSnapshot {
        let mut by_key: BTreeMap<Vec<u8>, (u32, Vec<u64>)> = BTreeMap::new();
        for (key, timestamp) in self.pending_timers() {
            let key_bytes = with_canonical_bytes(key, <[u8]>::to_vec);
            let key_group = assign_to_key_group(key, max_parallelism);
            by_key.entry(key_bytes).or_insert_with(|| (key_group, Vec::new())).1.push(timestamp);
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
    fn timers_moved_on_every_record_fire_once_at_their_last_time_and_stale_entries_go() {
        // As a session window with exact timers moves its timer with every record of its key.
        let mut timers = TimerService::<u64>::default();
        for step in 0..10_000u64 {
            let key = step % 7;
            if step >= 7 {
                timers.delete(&key, step - 7);
            }
            timers.register(&key, step);
        }
        assert_eq!(timers.len(), 7);
        let entries: usize = timers.by_time.values().map(|slot| slot.keys.len()).sum();
        assert_eq!(entries, 7, "a timestamp whose timers were all deleted kept its entries");
        let mut fired = Vec::new();
        while let Some(timer) = timers.pop_due(u64::MAX) {
            fired.push(timer);
        }
        let expected: Vec<(u64, u64)> = (9_993..10_000u64).map(|step| (step, step % 7)).collect();
        assert_eq!(fired, expected);
        assert!(timers.is_empty());
    }

    #[test]
    fn stale_entries_and_twins_of_one_time_are_compacted_away() {
        // 2 000 keys due at one time, each deleted and registered again (two entries, one
        // timer), 1 500 of them deleted for good: stale entries outnumber live ones.
        let mut timers = TimerService::<u64>::default();
        for key in 0..2_000u64 {
            timers.register(&key, 5);
        }
        for key in 0..2_000u64 {
            timers.delete(&key, 5);
            timers.register(&key, 5);
        }
        for key in 0..1_500u64 {
            timers.delete(&key, 5);
        }
        timers.register(&99_999, 7);
        let slot = &timers.by_time[&5];
        assert!(slot.keys.len() < 2_500, "{} entries kept for 500 timers: not compacted", slot.keys.len());
        let mut fired = Vec::new();
        while let Some((_, key)) = timers.pop_due(10) {
            fired.push(key);
        }
        fired.sort_unstable();
        assert_eq!(fired, (1_500..2_000u64).chain([99_999]).collect::<Vec<_>>());
        assert!(timers.is_empty());
    }

    #[test]
    fn registering_and_deleting_while_timers_fire_behaves_as_a_priority_queue() {
        let mut timers = TimerService::<&str>::default();
        for key in ["a", "b", "c", "d"] {
            timers.register(&key, 10);
        }
        timers.register(&"z", 20);
        let (time, first) = timers.pop_due(100).unwrap();
        assert_eq!(time, 10);
        // The one that fired is new again; another still pending is a duplicate.
        timers.register(&first, 10);
        let pending = ["a", "b", "c", "d"].into_iter().find(|k| *k != first).unwrap();
        timers.register(&pending, 10);
        assert_eq!(timers.len(), 5);
        // A deleted pending one does not fire.
        let deleted = ["a", "b", "c", "d"].into_iter().rev().find(|k| *k != first && *k != pending).unwrap();
        timers.delete(&deleted, 10);
        assert_eq!(timers.len(), 4);
        // An earlier one fires next.
        timers.register(&"early", 5);
        assert_eq!(timers.pop_due(100), Some((5, "early")));
        let mut rest = Vec::new();
        while let Some(timer) = timers.pop_due(100) {
            rest.push(timer);
        }
        let at_ten: Vec<&str> = rest.iter().filter(|(t, _)| *t == 10).map(|(_, k)| *k).collect();
        assert_eq!(at_ten.len(), 3, "{rest:?}");
        assert!(at_ten.contains(&first) && at_ten.contains(&pending) && !at_ten.contains(&deleted));
        assert_eq!(rest.last(), Some(&(20, "z")));
        assert!(timers.is_empty());
    }

    proptest::proptest! {
        /// Against a model of Flink's timer queue (a set of `(time, key)`, the earliest due
        /// first): the same timers fire, each at the earliest pending time, also when timers
        /// are registered and deleted between two firings of one run.
        #[test]
        fn fires_as_a_set_of_timers_earliest_first(
            ops in proptest::collection::vec((0u8..4, 0u64..12, 0u64..6), 1..300),
        ) {
            let mut timers = TimerService::<u64>::default();
            let mut model: std::collections::BTreeSet<(u64, u64)> = Default::default();
            for (op, key, time) in ops {
                match op {
                    0 | 1 => {
                        timers.register(&key, time);
                        model.insert((time, key));
                    }
                    2 => {
                        timers.delete(&key, time);
                        model.remove(&(time, key));
                    }
                    _ => {
                        let now = time + 1;
                        let earliest = model.iter().next().copied().filter(|&(t, _)| t <= now);
                        match timers.pop_due(now) {
                            Some((t, k)) => {
                                proptest::prop_assert_eq!(Some(t), earliest.map(|(t, _)| t));
                                proptest::prop_assert!(model.remove(&(t, k)), "fired ({t}, {k}) was not pending");
                            }
                            None => proptest::prop_assert_eq!(earliest, None),
                        }
                    }
                }
                proptest::prop_assert_eq!(timers.len(), model.len());
                let mut pending: Vec<(u64, u64)> = timers.pending_timers().map(|(k, t)| (t, *k)).collect();
                pending.sort_unstable();
                proptest::prop_assert_eq!(pending, model.iter().copied().collect::<Vec<_>>());
            }
        }
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
