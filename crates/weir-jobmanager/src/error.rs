//! What fails in preparing a job or running a JobManager, split the way a command line
//! reports it: the user's arguments or configuration (`Usage`) or the work itself (`Runtime`).

/// A failure of job preparation or of the JobManager; the message is the whole text.
#[derive(Debug, thiserror::Error)]
pub enum JobManagerError {
    /// Bad arguments or configuration: a catalog job or argument, an option, a snapshot this
    /// job cannot restore from.
    #[error("{0}")]
    Usage(String),
    /// The work could not be done: a port, the HA store, the Kubernetes API.
    #[error("{0}")]
    Runtime(String),
}

impl JobManagerError {
    /// A usage error.
    pub fn usage(message: impl std::fmt::Display) -> JobManagerError {
        JobManagerError::Usage(message.to_string())
    }

    /// A runtime error.
    pub fn runtime(message: impl std::fmt::Display) -> JobManagerError {
        JobManagerError::Runtime(message.to_string())
    }
}
