//! Runtime errors with a class: whose fault it is and whether a retry can help.

/// Who is responsible for a failure (read by restart strategies instead of matching text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorDomain {
    /// The job's own code or data (a user function returned an error or panicked).
    User,
    /// Something outside weir: a file, a network peer, storage.
    External,
    /// weir itself (a bug or a broken invariant).
    Internal,
}

/// A failure of a task, carried to the job master and shown in REST and the CLI.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum TaskError {
    /// A user function failed.
    #[error("{operator}: {message}")]
    User {
        /// The operator (name) whose function failed.
        operator: String,
        /// The function's error, as it displays.
        message: String,
    },
    /// An external system failed.
    #[error("{context}: {message}")]
    External {
        /// What weir was doing.
        context: String,
        /// The underlying error.
        message: String,
    },
    /// An internal invariant broke.
    #[error("internal error: {0}")]
    Internal(String),
    /// The task was asked to stop; not a failure.
    #[error("task cancelled")]
    Cancelled,
}

impl TaskError {
    /// The failure's domain.
    pub fn domain(&self) -> ErrorDomain {
        match self {
            TaskError::User { .. } => ErrorDomain::User,
            TaskError::External { .. } => ErrorDomain::External,
            TaskError::Internal(_) | TaskError::Cancelled => ErrorDomain::Internal,
        }
    }

    /// A user-function failure in `operator`.
    pub fn user(operator: &str, message: impl std::fmt::Display) -> TaskError {
        TaskError::User { operator: operator.to_string(), message: message.to_string() }
    }

    /// An external failure while doing `context`.
    pub fn external(context: impl Into<String>, message: impl std::fmt::Display) -> TaskError {
        TaskError::External { context: context.into(), message: message.to_string() }
    }

    /// A short class name for exception listings (`UserFunctionError` ...).
    pub fn class_name(&self) -> &'static str {
        match self {
            TaskError::User { .. } => "UserFunctionError",
            TaskError::External { .. } => "ExternalSystemError",
            TaskError::Internal(_) => "InternalError",
            TaskError::Cancelled => "Cancelled",
        }
    }
}
