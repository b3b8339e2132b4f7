//! Errors raised while loading configuration or reading a typed value from it.

use std::fmt;
use std::path::PathBuf;

/// Where a configuration value came from; shown in every error and warning about it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// Read from this YAML configuration file.
    File(PathBuf),
    /// Given on the command line as `-D key=value`.
    Override,
    /// Set programmatically; the text names the origin (for example `-p`).
    Set(String),
    /// The option's built-in default.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Override => f.write_str("-D"),
            Source::Set(origin) => f.write_str(origin),
            Source::Default => f.write_str("default"),
        }
    }
}

/// Everything that can go wrong when loading configuration or reading a value from it.
///
/// The `Display` text is a single lowercase line that names the key, the bad value, where it
/// came from and what is expected, so it can be shown to the user as is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file '{}': {reason}", path.display())]
    Read {
        /// The file that was requested.
        path: PathBuf,
        /// The operating system's reason, lowercased.
        reason: String,
        /// The underlying I/O error kind.
        kind: std::io::ErrorKind,
    },
    /// The configuration file is not valid YAML or not shaped as a map of options.
    #[error("invalid configuration file '{}': {reason}", path.display())]
    InvalidFile {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A `-D` override is not of the form `key=value`.
    #[error("invalid override '-D {entry}': {reason}; expected the form -D key=value")]
    BadOverride {
        /// The override as given, without the `-D`.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value does not parse or is out of range for its key.
    #[error("bad value '{value}' for configuration key '{key}' (from {origin}): {reason}")]
    BadValue {
        /// The key as it was written (which may be a deprecated alias of the option's key).
        key: String,
        /// The raw value.
        value: String,
        /// Where the value came from.
        origin: Source,
        /// What is expected instead, usually starting with "expected".
        reason: String,
    },
    /// Two individually valid values contradict each other.
    #[error("{message}")]
    Inconsistent {
        /// One line naming both keys, their values, origins and the rule they break.
        message: String,
    },
}

impl ConfigError {
    /// Returns the configuration key this error is about, if it is about a single key.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::BadValue { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Lowercases the first character so messages from other libraries read as one sentence.
pub(crate) fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    let Some(first) = chars.next() else {
        return String::new();
    };
    let mut out: String = first.to_lowercase().collect();
    out.push_str(chars.as_str());
    out
}

/// Collapses line breaks so every error stays on one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
