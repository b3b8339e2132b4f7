//! Sinks: where records leave a job.

use crate::error::TaskError;
use crate::operator::TaskContext;

/// A sink: creates one writer per subtask.
pub trait Sink<T>: Send + Sync + 'static {
    /// The writer of subtask `ctx.subtask_index`.
    fn create_writer(&self, ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError>;
}

/// Writes records for one subtask.
pub trait SinkWriter<T>: Send {
    /// Writes and drains `batch`.
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError>;

    /// Makes written records visible where the sink's contract says so (the task is idle).
    fn flush(&mut self) -> Result<(), TaskError>;

    /// The input ended: write everything and commit.
    fn finish(&mut self) -> Result<(), TaskError>;
}
