//! Sources: where records enter a job.

use crate::error::TaskError;
use crate::operator::TaskContext;
use crate::snapshot::Redistribution;
use std::time::Duration;

/// Whether a source ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundedness {
    /// The source ends; the job then finishes.
    Bounded,
    /// The source runs until the job is cancelled or stopped.
    Unbounded,
}

/// What a poll produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records were appended (possibly fewer than asked for).
    Data,
    /// Nothing now; poll again after about this long (rate limits, waiting for data).
    Idle(Duration),
    /// The source has ended; nothing was appended.
    End,
}

/// A source: creates one reader per subtask.
pub trait Source<T>: Send + Sync + 'static {
    /// Whether the source ends.
    fn boundedness(&self) -> Boundedness;

    /// The reader of subtask `ctx.subtask_index` of `ctx.parallelism`, from the beginning.
    fn create_reader(&self, ctx: &TaskContext) -> Result<Box<dyn SourceReader<T>>, TaskError>;

    /// The reader of subtask `ctx.subtask_index` resuming from restored position elements
    /// (redistributed over the new parallelism as the reader's
    /// [`SourcePositions::mode`] says).
    fn restore_reader(&self, ctx: &TaskContext, positions: Vec<Vec<u8>>)
    -> Result<Box<dyn SourceReader<T>>, TaskError>;

    /// Checks, before a restored job starts, every old subtask's position elements in the
    /// snapshot: an error refuses the restore and says what is wrong; the lines say what the
    /// restore will do. The default accepts anything (the reader checks when it restores).
    fn check_restore(&self, _positions: &[Vec<u8>]) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}

/// A reader's read position, as list-state elements.
#[derive(Clone, Debug)]
pub struct SourcePositions {
    /// How the elements are redistributed on restore.
    pub mode: Redistribution,
    /// The encoded elements (e.g. one per split).
    pub elements: Vec<Vec<u8>>,
}

/// Reads records for one subtask. Its read position is what a checkpoint will store, so a
/// reader keeps it explicit (an offset, a sequence number), never hidden in an iterator.
pub trait SourceReader<T>: Send {
    /// Appends up to `max_records` records to `out`.
    fn poll_next(&mut self, out: &mut Vec<T>, max_records: usize) -> Result<SourcePoll, TaskError>;

    /// The read position; restoring it must resume right after the last record returned by
    /// `poll_next`.
    fn snapshot_positions(&self) -> SourcePositions;

    /// The read position for checkpoint `checkpoint_id` (the source task calls this at the
    /// barrier); a reader that acts on completed checkpoints (a Kafka source committing its
    /// offsets to the consumer group) remembers which position belongs to which checkpoint.
    fn snapshot_positions_for(&mut self, _checkpoint_id: u64) -> SourcePositions {
        self.snapshot_positions()
    }

    /// Checkpoint `checkpoint_id` completed. Nothing in the job depends on what the reader
    /// does here (its position is already in the checkpoint); an error fails the task.
    fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<(), TaskError> {
        Ok(())
    }

    /// The splits the reader reads (a Kafka source's partitions), for per-split watermarks:
    /// a watermark strategy given to the source
    /// ([`from_source_with_watermarks`](crate::datastream::StreamExecutionEnvironment::from_source_with_watermarks))
    /// then keeps one watermark per split and emits their minimum, so one slow split's
    /// records are not made late by the others (Flink's per-partition watermarks). `None`
    /// (the default): the reader has no splits, and the strategy sees its records as one
    /// stream.
    fn splits(&self) -> Option<SplitInfo<'_>> {
        None
    }
}

/// A reader's splits as [`SourceReader::splits`] reports them, after a poll.
#[derive(Clone, Copy, Debug)]
pub struct SplitInfo<'a> {
    /// The split of each record the last `poll_next` appended, in order: an index into
    /// `ended`. A split keeps its index for the reader's life; a new one takes the next.
    pub records: &'a [u32],
    /// Per split, whether it ended (a bounded split read to its stop): an ended split no
    /// longer holds back the watermark. A split that has not ended holds it back until it has
    /// records, or until it is idle for the strategy's idleness timeout, as in Flink.
    pub ended: &'a [bool],
}
