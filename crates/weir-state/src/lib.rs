//! weir's keyed state: the heap state backend (`state.backend.type: hashmap`), the same
//! tables spilling cold key groups to a local LSM store (`spillable`, [`spill`]), and every
//! entry in a local LSM store with the hot ones cached in those tables (`fjall`, [`lsm`]).
//!
//! Keyed state lives in key groups. Each state a function declares is a table holding one
//! hash map per key group of the subtask's [`KeyGroupRange`](weir_types::KeyGroupRange), so
//! a snapshot or a rescale moves whole key groups and never has to re-hash keys. Tables are
//! typed (no per-access serialization); they serialize to canonical bytes only when written
//! out ([`table::StateTable::write_key_group`]).
//!
//! A subtask's backend is used from that subtask's thread only (mailbox style), so nothing
//! here locks.
#![warn(missing_docs)]

/// Decoders under test may not allocate a claimed size: see [`weir_types::fuzzing`].
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: weir_types::fuzzing::CappedAlloc = weir_types::fuzzing::CappedAlloc;

pub mod backend;
mod delta;
pub mod error;
pub mod handles;
pub mod keymap;
pub mod lsm;
mod scratch;
pub mod spill;
pub mod table;
pub mod timers;

pub use backend::{KeySlot, KeyedBackendSnapshot, KeyedStateBackend};
pub use delta::apply_deltas;
pub use error::StateError;
pub use handles::{ListState, MapState, ReducingState, StateDeclaration, StateKind, ValueState};
pub use keymap::{KeyRef, memory_hash};
pub use table::{RestoredTable, TableSnapshot};
pub use timers::{
    EVENT_TIMERS_STATE, TIMERS_STATE, TimerService, TimersSnapshot, event_time_to_timer, timer_to_event_time,
};

/// Hash maps for in-memory state: fast, and never persisted or used for routing, so the
/// hasher's seed does not matter (snapshots are written in canonical key-byte order).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
