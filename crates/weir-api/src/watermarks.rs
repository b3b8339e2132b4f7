//! Event time: how records get their timestamps and how watermarks are generated from them
//! (Flink's `WatermarkStrategy`).

use std::sync::Arc;
use std::time::Duration;

/// Gives a record its event timestamp (epoch ms) from the record and the timestamp it
/// already carries ([`NO_TIMESTAMP`](crate::operator::NO_TIMESTAMP) for none).
pub type TimestampAssigner<T> = Arc<dyn Fn(&T, i64) -> i64 + Send + Sync>;

/// How a stream gets event timestamps and watermarks: a timestamp assigner, a bound on how
/// far out of order records arrive, and an idleness timeout.
///
/// ```
/// # use weir_api::prelude::*;
/// # use std::time::Duration;
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// struct Click { user: u64, at_ms: i64 }
/// let strategy = WatermarkStrategy::<Click>::for_bounded_out_of_orderness(Duration::from_secs(5))
///     .with_timestamp_assigner(|click: &Click, _| click.at_ms)
///     .with_idleness(Duration::from_secs(60));
/// # let _ = strategy;
/// ```
pub struct WatermarkStrategy<T> {
    pub(crate) out_of_orderness_ms: i64,
    pub(crate) assigner: Option<TimestampAssigner<T>>,
    pub(crate) idleness: Option<Duration>,
    /// `no_watermarks()`: timestamps only.
    pub(crate) emits: bool,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            out_of_orderness_ms: self.out_of_orderness_ms,
            assigner: self.assigner.clone(),
            idleness: self.idleness,
            emits: self.emits,
        }
    }
}

impl<T> WatermarkStrategy<T> {
    /// Timestamps only ever increase: the watermark is the newest timestamp seen, minus 1 ms.
    pub fn for_monotonous_timestamps() -> Self {
        Self::for_bounded_out_of_orderness(Duration::ZERO)
    }

    /// Records arrive at most `bound` out of order: the watermark trails the newest timestamp
    /// seen by `bound` (and 1 ms), as Flink's `BoundedOutOfOrdernessWatermarks`.
    pub fn for_bounded_out_of_orderness(bound: Duration) -> Self {
        WatermarkStrategy {
            out_of_orderness_ms: bound.as_millis().min(i64::MAX as u128) as i64,
            assigner: None,
            idleness: None,
            emits: true,
        }
    }

    /// No watermarks at all (only the final one at the end of a bounded input).
    pub fn no_watermarks() -> Self {
        WatermarkStrategy { out_of_orderness_ms: 0, assigner: None, idleness: None, emits: false }
    }

    /// Takes each record's timestamp from `assigner(record, timestamp it carries)`. Without
    /// one, the timestamps the records already carry are used.
    pub fn with_timestamp_assigner(mut self, assigner: impl Fn(&T, i64) -> i64 + Send + Sync + 'static) -> Self {
        self.assigner = Some(Arc::new(assigner));
        self
    }

    /// A stream with no records for `timeout` (processing time) is marked idle: it stops
    /// holding back the watermark downstream until it has records again.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }
}

/// Generates the watermarks of one subtask from the timestamps it sees.
#[derive(Debug)]
pub(crate) struct WatermarkGenerator {
    out_of_orderness_ms: i64,
    max_timestamp: Option<i64>,
    emitted: i64,
}

impl WatermarkGenerator {
    pub(crate) fn new(out_of_orderness_ms: i64) -> Self {
        WatermarkGenerator { out_of_orderness_ms, max_timestamp: None, emitted: crate::operator::MIN_WATERMARK }
    }

    pub(crate) fn on_event(&mut self, timestamp: i64) {
        self.max_timestamp = Some(self.max_timestamp.map_or(timestamp, |max| max.max(timestamp)));
    }

    /// The watermark to emit now, if it advanced.
    pub(crate) fn on_periodic_emit(&mut self) -> Option<i64> {
        let max = self.max_timestamp?;
        let watermark = max.saturating_sub(self.out_of_orderness_ms).saturating_sub(1);
        if watermark > self.emitted {
            self.emitted = watermark;
            return Some(watermark);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_trails_the_newest_timestamp_by_the_bound_and_never_goes_back() {
        let mut generator = WatermarkGenerator::new(100);
        assert_eq!(generator.on_periodic_emit(), None);
        generator.on_event(1_000);
        generator.on_event(950);
        assert_eq!(generator.on_periodic_emit(), Some(899));
        assert_eq!(generator.on_periodic_emit(), None);
        generator.on_event(500);
        assert_eq!(generator.on_periodic_emit(), None);
        generator.on_event(1_200);
        assert_eq!(generator.on_periodic_emit(), Some(1_099));
    }
}
