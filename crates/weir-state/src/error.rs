//! Errors of the state layer.

/// What can go wrong when declaring, reading or restoring state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The `spillable` backend's local store failed.
    #[error("{reason}")]
    Spill {
        /// What failed, where, and what to do.
        reason: String,
    },
    /// Two handles use one state name with different kinds or types.
    #[error("state '{name}' is declared as {existing} and again as {requested}; give each state its own name")]
    TypeMismatch {
        /// The state's name.
        name: String,
        /// What it was first declared as.
        existing: String,
        /// What the new declaration asked for.
        requested: String,
    },
    /// A function used a state it does not declare.
    #[error(
        "state '{name}' ({requested}) is used but not declared; return its declaration from the function's `states` (`fn states(&self) -> Vec<StateDeclaration> {{ vec![self.{name}.declaration(), ...] }}`), so a restore can be checked before the job starts"
    )]
    Undeclared {
        /// The state's name.
        name: String,
        /// What the use asked for.
        requested: String,
    },
    /// A function declares a state as another kind or type than it uses it.
    #[error(
        "state '{name}' is declared as a {declared} but used as a {requested}; declare it with the handle it is used through"
    )]
    DeclaredOtherwise {
        /// The state's name.
        name: String,
        /// The declaration.
        declared: String,
        /// What the use asked for.
        requested: String,
    },
    /// State was accessed outside a keyed context (no current key).
    #[error(
        "state '{0}' was used outside a keyed context; keyed state needs a current key (use it in process_element or on_timer)"
    )]
    NoCurrentKey(String),
    /// Stored bytes could not be decoded.
    #[error("state '{name}' key group {key_group}: {reason}")]
    Corrupt {
        /// The state's name.
        name: String,
        /// The key group being read.
        key_group: u32,
        /// What was wrong.
        reason: String,
    },
    /// Restored state has another kind or type than the function now declares.
    #[error(
        "state '{name}' in the snapshot is a {recorded}, but the job now declares it as a {declared}; keep the old type, give the new state another name, or start without this state (-n after removing the operator's uid)"
    )]
    RestoredTypeMismatch {
        /// The state's name.
        name: String,
        /// What the snapshot recorded.
        recorded: String,
        /// What the function declares now.
        declared: String,
    },
    /// Restored keyed state has another key type than the operator now uses.
    #[error(
        "the snapshot's keyed state is keyed by {recorded}, but the operator is now keyed by {declared}; the key type of a stateful operator cannot change"
    )]
    KeyTypeMismatch {
        /// What the snapshot recorded.
        recorded: String,
        /// What the operator uses now.
        declared: String,
    },
    /// A key group outside this backend's range.
    #[error("key group {key_group} is not in this subtask's range {range}")]
    KeyGroupOutOfRange {
        /// The key group asked for.
        key_group: u32,
        /// The range the backend owns.
        range: String,
    },
}
