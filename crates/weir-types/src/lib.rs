//! weir's shared vocabulary: identifiers, key groups and the lifecycle state machines.
//!
//! Everything here is plain data with no I/O, so every layer above (state, api, runtime,
//! REST, CLI) can speak the same types.
#![warn(missing_docs)]

pub mod format;
pub mod fuzzing;
pub mod ids;
pub mod key;
pub mod keygroups;
pub mod lifecycle;
pub mod seeded;

pub use format::SnapshotFormat;
pub use ids::JobId;
pub use key::Key;
pub use keygroups::{
    KeyGroupRange, MAX_PARALLELISM_UPPER_BOUND, assign_to_key_group, compute_default_max_parallelism,
    compute_key_group_range_for_operator_index, compute_operator_index_for_key_group,
};
pub use lifecycle::{ExecutionState, IllegalTransition, JobStatus, Lifecycle, StateHistory, now_ms};
