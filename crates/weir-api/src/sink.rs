//! Sinks: where records leave a job.

use crate::error::TaskError;
use crate::operator::TaskContext;
use crate::snapshot::Barrier;

/// A sink: creates one writer per subtask.
pub trait Sink<T>: Send + Sync + 'static {
    /// The writer of subtask `ctx.subtask_index`.
    fn create_writer(&self, ctx: &TaskContext) -> Result<Box<dyn SinkWriter<T>>, TaskError>;

    /// Where this sink writes, when no other sink of the job may write there too (a file
    /// sink's directory: two of them would commit files under the same names). Building a
    /// job with two sinks of the same target fails.
    fn exclusive_target(&self) -> Option<String> {
        None
    }

    /// Whether it prints its records to the process's stdout (a print sink): the command
    /// line then writes its own status lines to stderr, so stdout holds only records.
    fn writes_to_stdout(&self) -> bool {
        false
    }

    /// The writer of a restored job: `committables` are every subtask's pending commits of
    /// the snapshot (their checkpoint completed, so they must end up committed, once).
    /// Sinks without pending commits need not override this.
    fn restore_writer(
        &self,
        ctx: &TaskContext,
        committables: Vec<Vec<u8>>,
    ) -> Result<Box<dyn SinkWriter<T>>, TaskError> {
        if !committables.is_empty() {
            return Err(TaskError::Internal(format!(
                "{}: the snapshot holds {} pending commits but this sink cannot restore them",
                ctx.operator_name,
                committables.len()
            )));
        }
        self.create_writer(ctx)
    }

    /// Checks, before a restored job starts, every subtask's pending commits in the snapshot
    /// (the elements [`Sink::restore_writer`] would get): an error refuses the restore and
    /// names what is wrong; the lines say what the restore will do (`weir run --dry-run`
    /// prints them). Nothing may change.
    fn check_restore(&self, committables: &[Vec<u8>]) -> Result<Vec<String>, String> {
        if committables.is_empty() {
            return Ok(Vec::new());
        }
        Err(format!("the snapshot holds {} pending commits but this sink cannot restore them", committables.len()))
    }
}

/// Writes records for one subtask. The defaults suit a sink without buffering or
/// transactions (nothing to flush, nothing to stage or commit: at-least-once).
pub trait SinkWriter<T>: Send {
    /// Writes and drains `batch`.
    fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), TaskError>;

    /// Makes written records visible where the sink's contract says so (the task is idle).
    fn flush(&mut self) -> Result<(), TaskError> {
        Ok(())
    }

    /// The input ended: write everything. Without periodic checkpoints commit it too; with
    /// them ([`TaskContext::waits_for_final_checkpoint`]) the job's final checkpoint stages it
    /// ([`SinkWriter::prepare_commit`]) and its completion commits it.
    fn finish(&mut self) -> Result<(), TaskError> {
        Ok(())
    }

    /// A checkpoint barrier: stage everything written so far for commit and return the
    /// pending commits (stored in the snapshot so a restore can finish them).
    fn prepare_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<Vec<u8>>, TaskError> {
        Ok(Vec::new())
    }

    /// A barrier, checkpoint or savepoint: [`SinkWriter::prepare_commit`] unless the sink
    /// needs to tell them apart (a savepoint's staged output may be needed long after the job
    /// moved on: only the savepoint's own restore commits it).
    fn prepare_commit_at(&mut self, barrier: &Barrier) -> Result<Vec<Vec<u8>>, TaskError> {
        self.prepare_commit(barrier.checkpoint_id)
    }

    /// Checkpoint `checkpoint_id` completed: make what was staged up to it visible.
    fn commit(&mut self, _checkpoint_id: u64) -> Result<(), TaskError> {
        Ok(())
    }
}
