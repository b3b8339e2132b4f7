//! Trimming a deployment's savepoint history by count and age, as the Flink operator does
//! (`kubernetes.operator.savepoint.history.max.count` / `.max.age`): the newest savepoint is
//! always kept, and so is any savepoint the deployment may still start from.

use std::time::Duration;

use crate::status::SavepointRecord;

/// The history's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    /// At most this many entries.
    pub max_count: u32,
    /// Entries older than this go.
    pub max_age: Duration,
}

/// Splits `history` (oldest first) into what stays and what is disposed. `protected`
/// locations always stay.
pub fn trim(
    history: &[SavepointRecord],
    limits: HistoryLimits,
    now_ms: u64,
    protected: &[&str],
) -> (Vec<SavepointRecord>, Vec<SavepointRecord>) {
    let newest = history.iter().map(|r| r.time_stamp).max();
    let max_age_ms = u64::try_from(limits.max_age.as_millis()).unwrap_or(u64::MAX);
    let mut kept = Vec::new();
    let mut disposed = Vec::new();
    // Newest first, so the count keeps the newest.
    let mut by_age: Vec<&SavepointRecord> = history.iter().collect();
    by_age.sort_by_key(|r| std::cmp::Reverse(r.time_stamp));
    for record in by_age {
        let is_newest =
            Some(record.time_stamp) == newest && !kept.iter().any(|k: &SavepointRecord| Some(k.time_stamp) == newest);
        let too_old = now_ms.saturating_sub(record.time_stamp) > max_age_ms;
        let too_many = kept.len() >= limits.max_count as usize;
        if is_newest || protected.contains(&record.location.as_str()) || (!too_old && !too_many) {
            kept.push(record.clone());
        } else {
            disposed.push(record.clone());
        }
    }
    kept.reverse();
    disposed.reverse();
    (kept, disposed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::TriggerType;
    use proptest::prelude::*;

    fn record(time_stamp: u64) -> SavepointRecord {
        SavepointRecord {
            time_stamp,
            location: format!("file:///sp/{time_stamp}"),
            trigger_type: TriggerType::Manual,
            format_type: "CANONICAL".into(),
            trigger_nonce: None,
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn count_and_age_trim_the_oldest_and_keep_the_newest() {
        let history: Vec<_> = (1..=5).map(|h| record(h * 3_600_000)).collect();
        let now = 6 * 3_600_000;
        let (kept, disposed) = trim(&history, HistoryLimits { max_count: 3, max_age: 24 * HOUR }, now, &[]);
        assert_eq!(kept.iter().map(|r| r.time_stamp / 3_600_000).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(disposed.len(), 2);
        let (kept, _) = trim(&history, HistoryLimits { max_count: 10, max_age: 2 * HOUR }, now, &[]);
        assert_eq!(kept.iter().map(|r| r.time_stamp / 3_600_000).collect::<Vec<_>>(), [4, 5]);
        // Everything too old: the newest stays anyway.
        let (kept, _) = trim(&history, HistoryLimits { max_count: 10, max_age: Duration::from_millis(1) }, now, &[]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].time_stamp, 5 * 3_600_000);
        // A protected savepoint stays beyond the limits.
        let (kept, _) =
            trim(&history, HistoryLimits { max_count: 1, max_age: 24 * HOUR }, now, &["file:///sp/3600000"]);
        assert_eq!(kept.iter().map(|r| r.time_stamp / 3_600_000).collect::<Vec<_>>(), [1, 5]);
    }

    proptest! {
        #[test]
        fn every_entry_is_kept_or_disposed_once_and_the_newest_is_kept(
            stamps in proptest::collection::btree_set(0u64..1_000_000, 0..30),
            max_count in 1u32..10,
            max_age in 0u64..1_000_000,
        ) {
            let history: Vec<_> = stamps.iter().map(|&t| record(t)).collect();
            let limits = HistoryLimits { max_count, max_age: Duration::from_millis(max_age) };
            let (kept, disposed) = trim(&history, limits, 1_000_000, &[]);
            prop_assert_eq!(kept.len() + disposed.len(), history.len());
            prop_assert!(kept.len() <= max_count as usize || kept.len() == 1);
            if let Some(newest) = stamps.iter().max() {
                prop_assert!(kept.iter().any(|r| r.time_stamp == *newest));
            }
            prop_assert!(kept.windows(2).all(|w| w[0].time_stamp < w[1].time_stamp));
        }
    }
}
