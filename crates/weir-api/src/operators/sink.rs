//! The last link of a chain: hands batches to a sink writer.

use std::sync::Arc;

use crate::error::TaskError;
use crate::operator::{Operator, TaskMetrics};
use crate::sink::SinkWriter;

/// Writes every batch through a [`SinkWriter`].
pub struct SinkOperator<T> {
    writer: Box<dyn SinkWriter<T>>,
    metrics: Arc<TaskMetrics>,
}

impl<T> SinkOperator<T> {
    /// Writes through `writer`, counting records out in `metrics`.
    pub fn new(writer: Box<dyn SinkWriter<T>>, metrics: Arc<TaskMetrics>) -> Self {
        SinkOperator { writer, metrics }
    }
}

impl<T: Send> Operator<T> for SinkOperator<T> {
    fn process_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError> {
        self.metrics.add_out(batch.len());
        self.writer.write_batch(batch)
    }
    fn fire_timers(&mut self, _now_ms: u64) -> Result<(), TaskError> {
        Ok(())
    }
    fn next_timer(&self) -> Option<u64> {
        None
    }
    fn end_input(&mut self) -> Result<(), TaskError> {
        self.writer.finish()
    }
    fn flush(&mut self) -> Result<(), TaskError> {
        self.writer.flush()
    }
}
