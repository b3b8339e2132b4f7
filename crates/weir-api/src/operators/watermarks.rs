//! Assigns event timestamps and emits watermarks (Flink's `TimestampsAndWatermarksOperator`).

use std::sync::Arc;

use super::split_watermarks::{CombinedTime, SplitWatermarks};
use crate::error::TaskError;
use crate::operator::{Clock, MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Operator, TaskContext};
use crate::snapshot::{Barrier, TaskSnapshot};
use crate::source::SplitInfo;
use crate::watermarks::{TimestampAssigner, WatermarkGenerator, WatermarkStrategy};

/// Gives every record a timestamp and emits a watermark every
/// `pipeline.auto-watermark-interval` when it advanced; upstream watermarks are dropped
/// (this operator decides the event time from here on) except the final one.
pub struct TimestampsAndWatermarksOperator<T> {
    assigner: Option<TimestampAssigner<T>>,
    generator: WatermarkGenerator,
    emits: bool,
    interval_ms: u64,
    next_emit_ms: u64,
    idle_timeout_ms: Option<u64>,
    last_record_ms: u64,
    idle: bool,
    clock: Arc<dyn Clock>,
    timestamps: Vec<i64>,
    /// A strategy given to its source: one watermark per split of the source's reader.
    splits: Option<SplitWatermarks>,
    /// The newest watermark emitted from the splits' combined time.
    emitted: i64,
    next: Box<dyn Operator<T>>,
}

impl<T> TimestampsAndWatermarksOperator<T> {
    /// Applies `strategy` for the subtask of `ctx`, into `next`.
    pub fn new(ctx: &TaskContext, strategy: &WatermarkStrategy<T>, next: Box<dyn Operator<T>>) -> Self {
        let now = ctx.clock.now_ms();
        let interval_ms = ctx.auto_watermark_interval_ms;
        TimestampsAndWatermarksOperator {
            assigner: strategy.assigner.clone(),
            generator: WatermarkGenerator::new(strategy.out_of_orderness_ms),
            emits: strategy.emits && interval_ms > 0,
            interval_ms,
            next_emit_ms: now + interval_ms,
            idle_timeout_ms: strategy.idleness.map(|d| d.as_millis() as u64),
            last_record_ms: now,
            idle: false,
            clock: Arc::clone(&ctx.clock),
            timestamps: Vec::new(),
            splits: None,
            emitted: MIN_WATERMARK,
            next,
        }
    }

    /// Applies `strategy` given to the source itself: when the source's reader has splits
    /// (a Kafka source's partitions), each split gets its own watermark and the subtask
    /// emits their minimum (Flink's per-split watermarks of `fromSource(source, strategy)`).
    pub fn per_split(ctx: &TaskContext, strategy: &WatermarkStrategy<T>, next: Box<dyn Operator<T>>) -> Self {
        let mut op = Self::new(ctx, strategy, next);
        op.splits = Some(SplitWatermarks::new(strategy.out_of_orderness_ms));
        op
    }

    /// The subtask's own watermark and idleness, from every record it saw.
    fn emit_subtask_time(&mut self, now_ms: u64) -> Result<(), TaskError> {
        if let Some(watermark) = self.generator.on_periodic_emit() {
            // Splits seen later must not take the watermark back below this one.
            self.emitted = self.emitted.max(watermark);
            self.next.process_watermark(watermark)?;
        }
        if let Some(timeout) = self.idle_timeout_ms
            && !self.idle
            && now_ms.saturating_sub(self.last_record_ms) >= timeout
        {
            self.idle = true;
            self.next.process_watermark_status(true)?;
        }
        Ok(())
    }

    /// The splits' combined watermark, or the subtask's idleness when every split is idle.
    fn emit_combined_time(&mut self, combined: CombinedTime, now_ms: u64) -> Result<(), TaskError> {
        match combined {
            CombinedTime::Nothing => self.emit_subtask_time(now_ms),
            CombinedTime::Idle => {
                if !self.idle {
                    self.idle = true;
                    self.next.process_watermark_status(true)?;
                }
                Ok(())
            }
            CombinedTime::Watermark(watermark) => {
                if self.idle {
                    self.idle = false;
                    self.next.process_watermark_status(false)?;
                }
                if watermark > self.emitted {
                    self.emitted = watermark;
                    self.next.process_watermark(watermark)?;
                }
                Ok(())
            }
        }
    }

    fn assign(&mut self, batch: &[T], carried: Option<&[i64]>) {
        self.timestamps.clear();
        for (index, record) in batch.iter().enumerate() {
            let previous = carried.and_then(|c| c.get(index).copied()).unwrap_or(NO_TIMESTAMP);
            let timestamp = match &self.assigner {
                Some(assigner) => assigner(record, previous),
                None => previous,
            };
            if timestamp != NO_TIMESTAMP {
                self.generator.on_event(timestamp);
            }
            self.timestamps.push(timestamp);
        }
    }

    fn on_records(&mut self, count: usize) -> Result<(), TaskError> {
        if count == 0 {
            return Ok(());
        }
        self.last_record_ms = self.clock.now_ms();
        if self.idle {
            self.idle = false;
            self.next.process_watermark_status(false)?;
        }
        Ok(())
    }
}

impl<T: Send> Operator<T> for TimestampsAndWatermarksOperator<T> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        self.assign(batch, None);
        self.on_records(batch.len())?;
        self.next.process_timestamped_batch(batch, &mut self.timestamps, &mut Vec::new())
    }

    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<T>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        hashes.clear();
        self.assign(batch, Some(timestamps));
        timestamps.clear();
        self.on_records(batch.len())?;
        self.next.process_timestamped_batch(batch, &mut self.timestamps, &mut Vec::new())
    }

    fn process_split_batch(&mut self, batch: &mut Vec<T>, splits: SplitInfo<'_>) -> Result<(), TaskError> {
        self.assign(batch, None);
        if let Some(split_time) = self.splits.as_mut() {
            split_time.on_records(splits, &self.timestamps, self.clock.now_ms());
        }
        self.on_records(batch.len())?;
        self.next.process_timestamped_batch(batch, &mut self.timestamps, &mut Vec::new())
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
        // Only the end of input's (or a drain's) final watermark passes: the strategy owns
        // event time here. After it, event time is over: no periodic watermark follows.
        if watermark == MAX_WATERMARK {
            self.emits = false;
            return self.next.process_watermark(MAX_WATERMARK);
        }
        Ok(())
    }

    fn process_watermark_status(&mut self, _idle: bool) -> Result<(), TaskError> {
        Ok(())
    }

    fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
        if self.emits && now_ms >= self.next_emit_ms {
            self.next_emit_ms = now_ms + self.interval_ms;
            match self.splits.as_mut() {
                Some(split_time) => {
                    let combined = split_time.on_periodic_emit(now_ms, self.idle_timeout_ms);
                    self.emit_combined_time(combined, now_ms)?;
                }
                None => self.emit_subtask_time(now_ms)?,
            }
        }
        self.next.fire_timers(now_ms)
    }

    fn next_timer(&self) -> Option<u64> {
        let own = self.emits.then_some(self.next_emit_ms);
        match (own, self.next.next_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn end_input(&mut self) -> Result<(), TaskError> {
        self.next.end_input()
    }

    fn flush(&mut self) -> Result<(), TaskError> {
        self.next.flush()
    }

    fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
        // Watermarks are not state: after a restore they start again from the minimum.
        self.next.snapshot_state(barrier, snapshot)
    }

    fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        self.next.notify_checkpoint_complete(checkpoint_id)
    }
}
