//! Map, filter and flat-map: one closure per record, output batched for the next link.

use crate::error::TaskError;
use crate::functions::Collector;
use crate::operator::Operator;
use crate::snapshot::{Barrier, TaskSnapshot};

macro_rules! forward_control {
    () => {
        fn process_watermark(&mut self, watermark: i64) -> Result<(), TaskError> {
            self.next.process_watermark(watermark)
        }
        fn process_watermark_status(&mut self, idle: bool) -> Result<(), TaskError> {
            self.next.process_watermark_status(idle)
        }
        fn fire_timers(&mut self, now_ms: u64) -> Result<(), TaskError> {
            self.next.fire_timers(now_ms)
        }
        fn next_timer(&self) -> Option<u64> {
            self.next.next_timer()
        }
        fn end_input(&mut self) -> Result<(), TaskError> {
            self.next.end_input()
        }
        fn flush(&mut self) -> Result<(), TaskError> {
            self.next.flush()
        }
        fn snapshot_state(&mut self, barrier: &Barrier, snapshot: &mut TaskSnapshot) -> Result<(), TaskError> {
            self.next.snapshot_state(barrier, snapshot)
        }
        fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
            self.next.notify_checkpoint_complete(checkpoint_id)
        }
    };
}

/// Applies a function to every record.
pub struct MapOperator<I, O, F> {
    func: F,
    out: Vec<O>,
    out_timestamps: Vec<i64>,
    next: Box<dyn Operator<O>>,
    _input: std::marker::PhantomData<fn(I)>,
}

impl<I, O, F> MapOperator<I, O, F> {
    /// Maps with `func` into `next`.
    pub fn new(func: F, next: Box<dyn Operator<O>>) -> Self {
        MapOperator { func, out: Vec::new(), out_timestamps: Vec::new(), next, _input: std::marker::PhantomData }
    }
}

impl<I: Send, O: Send, F: FnMut(I) -> O + Send> Operator<I> for MapOperator<I, O, F> {
    fn process_batch(&mut self, batch: &mut Vec<I>) -> Result<(), TaskError> {
        self.out.reserve(batch.len());
        for record in batch.drain(..) {
            self.out.push((self.func)(record));
        }
        self.next.process_batch(&mut self.out)
    }
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<I>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        // A record keeps its timestamp through a map, as in Flink.
        hashes.clear();
        self.out.reserve(batch.len());
        for record in batch.drain(..) {
            self.out.push((self.func)(record));
        }
        std::mem::swap(&mut self.out_timestamps, timestamps);
        timestamps.clear();
        self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())
    }
    forward_control!();
}

/// Keeps the records for which a predicate holds.
pub struct FilterOperator<T, F> {
    func: F,
    out: Vec<T>,
    out_timestamps: Vec<i64>,
    next: Box<dyn Operator<T>>,
}

impl<T, F> FilterOperator<T, F> {
    /// Filters with `func` into `next`.
    pub fn new(func: F, next: Box<dyn Operator<T>>) -> Self {
        FilterOperator { func, out: Vec::new(), out_timestamps: Vec::new(), next }
    }
}

impl<T: Send, F: FnMut(&T) -> bool + Send> Operator<T> for FilterOperator<T, F> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        for record in batch.drain(..) {
            if (self.func)(&record) {
                self.out.push(record);
            }
        }
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_batch(&mut self.out)
    }
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<T>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        hashes.clear();
        for (record, timestamp) in batch.drain(..).zip(timestamps.drain(..)) {
            if (self.func)(&record) {
                self.out.push(record);
                self.out_timestamps.push(timestamp);
            }
        }
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())
    }
    forward_control!();
}

/// Emits zero or more records per record.
pub struct FlatMapOperator<I, O, F> {
    func: F,
    out: Vec<O>,
    out_timestamps: Vec<i64>,
    next: Box<dyn Operator<O>>,
    _input: std::marker::PhantomData<fn(I)>,
}

impl<I, O, F> FlatMapOperator<I, O, F> {
    /// Flat-maps with `func` into `next`.
    pub fn new(func: F, next: Box<dyn Operator<O>>) -> Self {
        FlatMapOperator { func, out: Vec::new(), out_timestamps: Vec::new(), next, _input: std::marker::PhantomData }
    }
}

/// Output records buffered before they are handed on, at most (bounds memory of a flat-map
/// that emits many records per input record).
const FLAT_MAP_BUFFER_MAX: usize = 4 * crate::operator::BATCH_RECORDS_MAX;

impl<I: Send, O: Send, F: FnMut(I, &mut Collector<'_, O>) + Send> Operator<I> for FlatMapOperator<I, O, F> {
    fn process_batch(&mut self, batch: &mut Vec<I>) -> Result<(), TaskError> {
        for record in batch.drain(..) {
            (self.func)(record, &mut Collector::new(&mut self.out));
            if self.out.len() >= FLAT_MAP_BUFFER_MAX {
                self.next.process_batch(&mut self.out)?;
            }
        }
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_batch(&mut self.out)
    }
    fn process_timestamped_batch(
        &mut self,
        batch: &mut Vec<I>,
        timestamps: &mut Vec<i64>,
        hashes: &mut Vec<u32>,
    ) -> Result<(), TaskError> {
        // Every record a flat-map emits has the timestamp of the record it came from.
        hashes.clear();
        for (record, timestamp) in batch.drain(..).zip(timestamps.drain(..)) {
            let mut out = Collector::timestamped(&mut self.out, &mut self.out_timestamps, timestamp);
            (self.func)(record, &mut out);
            if self.out.len() >= FLAT_MAP_BUFFER_MAX {
                self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())?;
            }
        }
        if self.out.is_empty() {
            return Ok(());
        }
        self.next.process_timestamped_batch(&mut self.out, &mut self.out_timestamps, &mut Vec::new())
    }
    forward_control!();
}
