//! One watermark per source split, combined into the subtask's (Flink's per-split
//! watermarks and its `WatermarkOutputMultiplexer`): the subtask's watermark is the minimum
//! over the splits that have neither ended nor gone idle, so records of a split read later
//! than the others (a slow Kafka partition) are not late.

use crate::operator::{MIN_WATERMARK, NO_TIMESTAMP};
use crate::source::SplitInfo;
use crate::watermarks::WatermarkGenerator;

/// The event time of one split.
#[derive(Debug)]
struct SplitTime {
    generator: WatermarkGenerator,
    /// Its newest watermark (`MIN_WATERMARK` before its first records).
    watermark: i64,
    /// When it last had records, or when it was first seen (processing time, ms).
    last_record_ms: u64,
    idle: bool,
    ended: bool,
}

/// The splits of one source subtask and their watermarks.
#[derive(Debug)]
pub(crate) struct SplitWatermarks {
    out_of_orderness_ms: i64,
    splits: Vec<SplitTime>,
}

/// What the splits say at a periodic emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CombinedTime {
    /// The minimum over the active splits (it may not have advanced).
    Watermark(i64),
    /// Every split that has not ended is idle: the subtask holds nothing back.
    Idle,
    /// No split has been seen yet, or every one ended.
    Nothing,
}

impl SplitWatermarks {
    pub(crate) fn new(out_of_orderness_ms: i64) -> Self {
        SplitWatermarks { out_of_orderness_ms, splits: Vec::new() }
    }

    /// Takes a batch's timestamps (`timestamps[i]` of the record from split
    /// `splits.records[i]`) at processing time `now_ms`.
    pub(crate) fn on_records(&mut self, splits: SplitInfo<'_>, timestamps: &[i64], now_ms: u64) {
        while self.splits.len() < splits.ended.len() {
            self.splits.push(SplitTime {
                generator: WatermarkGenerator::new(self.out_of_orderness_ms),
                watermark: MIN_WATERMARK,
                last_record_ms: now_ms,
                idle: false,
                ended: false,
            });
        }
        for (split, ended) in self.splits.iter_mut().zip(splits.ended) {
            split.ended = *ended;
        }
        for (&split, &timestamp) in splits.records.iter().zip(timestamps) {
            let Some(split) = self.splits.get_mut(split as usize) else { continue };
            split.last_record_ms = now_ms;
            split.idle = false;
            if timestamp != NO_TIMESTAMP {
                split.generator.on_event(timestamp);
            }
        }
    }

    /// Advances every split's watermark, marks those without records for `idle_timeout_ms`
    /// idle, and combines them.
    pub(crate) fn on_periodic_emit(&mut self, now_ms: u64, idle_timeout_ms: Option<u64>) -> CombinedTime {
        let mut combined: Option<i64> = None;
        let mut idle = false;
        for split in self.splits.iter_mut().filter(|s| !s.ended) {
            if let Some(watermark) = split.generator.on_periodic_emit() {
                split.watermark = watermark;
            }
            if let Some(timeout) = idle_timeout_ms
                && now_ms.saturating_sub(split.last_record_ms) >= timeout
            {
                split.idle = true;
            }
            if split.idle {
                idle = true;
            } else {
                combined = Some(combined.map_or(split.watermark, |c| c.min(split.watermark)));
            }
        }
        match (combined, idle) {
            (Some(watermark), _) => CombinedTime::Watermark(watermark),
            (None, true) => CombinedTime::Idle,
            (None, false) => CombinedTime::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info<'a>(records: &'a [u32], ended: &'a [bool]) -> SplitInfo<'a> {
        SplitInfo { records, ended }
    }

    #[test]
    fn a_split_without_records_holds_the_watermark_back_until_it_is_idle() {
        let mut splits = SplitWatermarks::new(0);
        splits.on_records(info(&[0, 0], &[false, false]), &[10_000, 10_500], 0);
        assert_eq!(splits.on_periodic_emit(200, Some(1_000)), CombinedTime::Watermark(MIN_WATERMARK));
        // Split 1's old records are on time: the watermark waited for them.
        splits.on_records(info(&[1], &[false, false]), &[1_000], 300);
        assert_eq!(splits.on_periodic_emit(400, Some(1_000)), CombinedTime::Watermark(999));
        // Split 1 goes quiet: after the timeout only split 0 counts.
        splits.on_records(info(&[0], &[false, false]), &[11_000], 1_350);
        assert_eq!(splits.on_periodic_emit(1_400, Some(1_000)), CombinedTime::Watermark(10_999));
        // Both quiet: nothing holds the watermark back.
        assert_eq!(splits.on_periodic_emit(2_400, Some(1_000)), CombinedTime::Idle);
        // Records make a split active again.
        splits.on_records(info(&[1], &[false, false]), &[2_000], 2_500);
        assert_eq!(splits.on_periodic_emit(2_600, Some(1_000)), CombinedTime::Watermark(1_999));
    }

    #[test]
    fn an_ended_split_no_longer_counts_and_without_idleness_a_quiet_split_holds_forever() {
        let mut splits = SplitWatermarks::new(100);
        splits.on_records(info(&[0, 1], &[false, false]), &[5_000, 1_000], 0);
        assert_eq!(splits.on_periodic_emit(1_000_000, None), CombinedTime::Watermark(899));
        splits.on_records(info(&[0], &[false, true]), &[6_000], 1_000_001);
        assert_eq!(splits.on_periodic_emit(1_000_002, None), CombinedTime::Watermark(5_899));
        splits.on_records(info(&[], &[true, true]), &[], 1_000_003);
        assert_eq!(splits.on_periodic_emit(1_000_004, None), CombinedTime::Nothing);
    }

    #[test]
    fn a_split_seen_later_joins_with_nothing_and_records_without_timestamps_count_as_activity() {
        let mut splits = SplitWatermarks::new(0);
        assert_eq!(splits.on_periodic_emit(0, None), CombinedTime::Nothing);
        splits.on_records(info(&[0], &[false]), &[3_000], 0);
        assert_eq!(splits.on_periodic_emit(10, None), CombinedTime::Watermark(2_999));
        splits.on_records(info(&[1], &[false, false]), &[NO_TIMESTAMP], 20);
        assert_eq!(splits.on_periodic_emit(30, None), CombinedTime::Watermark(MIN_WATERMARK));
    }
}
