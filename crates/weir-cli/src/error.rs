//! CLI errors with their exit codes: 2 for usage and configuration, 1 for runtime.

/// A failed command.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or configuration (exit 2).
    Usage(String),
    /// The command could not do its work (exit 1).
    Runtime(String),
}

impl std::error::Error for CliError {}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(message) | CliError::Runtime(message) => f.write_str(message),
        }
    }
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Runtime(_) => 1,
        }
    }

    /// A usage error.
    pub fn usage(message: impl std::fmt::Display) -> CliError {
        CliError::Usage(message.to_string())
    }

    /// A runtime error.
    pub fn runtime(message: impl std::fmt::Display) -> CliError {
        CliError::Runtime(message.to_string())
    }
}

/// Preparation and JobManager errors keep their kind: usage is exit 2, runtime exit 1.
impl From<weir_jobmanager::JobManagerError> for CliError {
    fn from(error: weir_jobmanager::JobManagerError) -> CliError {
        match error {
            weir_jobmanager::JobManagerError::Usage(message) => CliError::Usage(message),
            weir_jobmanager::JobManagerError::Runtime(message) => CliError::Runtime(message),
        }
    }
}
