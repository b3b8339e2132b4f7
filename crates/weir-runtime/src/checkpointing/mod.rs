//! Checkpoints and savepoints on the job master's side: settings, the coordinator's
//! bookkeeping and its retention plans, the asynchronous writer of subtask snapshots, and reading restored state.

pub mod book;
pub mod coordinator;
pub mod driver;
pub mod ended;
pub mod incremental;
pub mod restore;
mod retention;
pub mod settings;
pub mod stats;
pub mod writer;

pub use coordinator::CheckpointCoordinator;
pub use restore::{RestoreOpenError, RestoreSource};
pub use settings::CheckpointSettings;
