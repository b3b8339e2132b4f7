//! Assigns event timestamps and emits watermarks (Flink's `TimestampsAndWatermarksOperator`).

use std::sync::Arc;

use crate::error::TaskError;
use crate::operator::{Clock, MAX_WATERMARK, NO_TIMESTAMP, Operator, TaskContext};
use crate::snapshot::{Barrier, TaskSnapshot};
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
            next,
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
            if let Some(watermark) = self.generator.on_periodic_emit() {
                self.next.process_watermark(watermark)?;
            }
            if let Some(timeout) = self.idle_timeout_ms
                && !self.idle
                && now_ms.saturating_sub(self.last_record_ms) >= timeout
            {
                self.idle = true;
                self.next.process_watermark_status(true)?;
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
