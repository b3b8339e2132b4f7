//! weir's built-in connectors: a parallel sequence generator, a text-file line source, a
//! file sink with in-progress/committed part files, a stdout print sink, a discard sink, and
//! Kafka (a source whose offsets live in checkpoints, a transactional sink).
//!
//! Every source keeps its read position explicit (see [`weir_api::source::SourceReader`]),
//! and every I/O failure is a [`TaskError::External`](weir_api::error::TaskError) whose text
//! names the file and what to do about it.
#![warn(missing_docs)]

/// Decoders under test may not allocate a claimed size: see [`weir_types::fuzzing`].
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: weir_types::fuzzing::CappedAlloc = weir_types::fuzzing::CappedAlloc;

pub mod discard;
pub mod file;
pub mod file_sink;
pub mod kafka;
pub mod print;
pub mod sequence;

pub use discard::DiscardSink;
pub use file::{FileSink, TextLineSource};
pub use print::PrintSink;
pub use sequence::SequenceSource;
