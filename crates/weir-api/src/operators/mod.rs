//! The built-in chain links: stateless transforms, the keyed process operator and the sink.

mod keyed_process;
mod process;
mod sink;
mod split_watermarks;
mod stateless;
mod watermarks;

pub use keyed_process::KeyedProcessOperator;
/// Types the keyed operator's builders share.
pub mod keyed_process_types {
    pub use super::keyed_process::KeySelector;
}
pub use process::ProcessOperator;
pub use sink::SinkOperator;
pub use stateless::{FilterOperator, FlatMapOperator, MapOperator};
pub use watermarks::TimestampsAndWatermarksOperator;
