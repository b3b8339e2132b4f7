//! weir's DataStream API: what a job is written against.
//!
//! A job builds a [`StreamGraph`](graph::StreamGraph) through a
//! [`StreamExecutionEnvironment`](datastream::StreamExecutionEnvironment):
//! sources, `map`/`filter`/`flat_map`, `key_by` with keyed process functions holding state
//! and timers, and sinks, each with `.uid()`, `.name()` and `.parallelism()`. The graph's
//! nodes carry type-erased factories; the runtime turns them into chained operators that
//! pass records in batches ([`operator::Operator`]) and into tasks that exchange batches
//! over bounded channels ([`exchange`]).
//!
//! ```
//! use weir_api::prelude::*;
//!
//! let env = StreamExecutionEnvironment::new();
//! env.from_source(VecSource::new(vec![1u64, 2, 3]))
//!     .uid("numbers")
//!     .map(|n| n * 10)
//!     .sink_to(CollectSink::default())
//!     .uid("out");
//! let graph = env.build("example").unwrap();
//! assert_eq!(graph.nodes().len(), 3);
//! ```
#![warn(missing_docs)]

/// The wire decoders' tests may not allocate a claimed size: see [`weir_types::fuzzing`].
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: weir_types::fuzzing::CappedAlloc = weir_types::fuzzing::CappedAlloc;

pub mod catalog;
pub mod connected;
pub mod datastream;
pub mod error;
pub mod exchange;
pub mod functions;
pub mod graph;
pub mod in_flight;
pub mod joins;
pub mod network;
pub mod operator;
pub mod operators;
pub mod side_output;
pub mod sink;
pub mod snapshot;
pub mod source;
pub mod testing;
pub mod watermarks;
pub mod windows;

/// Everything a job author needs in scope.
pub mod prelude {
    pub use crate::connected::{
        BroadcastProcessFunction, BroadcastState, CoProcessFunction, Either, KeyedBroadcastProcessFunction,
        KeyedCoProcessFunction,
    };
    pub use crate::datastream::{DataStream, DataStreamSink, KeyedStream, StreamExecutionEnvironment};
    pub use crate::error::{ErrorDomain, TaskError};
    pub use crate::functions::{
        Collector, EndOfInputContext, FnResult, KeyedContext, KeyedProcessFunction, OperatorStateContext,
        ProcessFunction, TimeDomain,
    };
    pub use crate::joins::ProcessJoinFunction;
    pub use crate::side_output::OutputTag;
    pub use crate::sink::{Sink, SinkWriter};
    pub use crate::source::{Boundedness, Source, SourcePoll, SourceReader, SplitInfo};
    pub use crate::testing::{CollectSink, EndlessSource, FailOn, RunningCount, VecSource};
    pub use crate::watermarks::WatermarkStrategy;
    pub use crate::windows::{
        AggregateFunction, EventTimeSessionWindows, ProcessWindowFunction, ProcessingTimeSessionWindows,
        SlidingEventTimeWindows, SlidingProcessingTimeWindows, TimeWindow, TumblingEventTimeWindows,
        TumblingProcessingTimeWindows, WindowContext,
    };
    pub use weir_state::{ListState, MapState, ReducingState, StateDeclaration, ValueState};
    pub use weir_types::Key;
}

/// Records that flow between operators: cloneable (fan-out), sendable between subtasks, and
/// serializable so the same job can later exchange them between processes.
pub trait Data: Clone + Send + serde::Serialize + serde::de::DeserializeOwned + 'static {}
impl<T: Clone + Send + serde::Serialize + serde::de::DeserializeOwned + 'static> Data for T {}

/// docs/event-time.md, whose examples `cargo test` compiles and runs as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/event-time.md")]
pub struct EventTimeGuide;
