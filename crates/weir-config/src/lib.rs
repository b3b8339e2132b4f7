//! weir's configuration: Apache Flink option names from a YAML file and `-D key=value`
//! overrides, with typed, validated access.
//!
//! ```
//! use weir_config::{Configuration, options};
//!
//! let overrides = vec!["parallelism.default=4".to_string()];
//! let config = Configuration::load(None, &overrides)?;
//! assert_eq!(config.get(&options::PARALLELISM_DEFAULT)?, 4);
//! assert_eq!(config.get(&options::REST_PORT)?, 8081);
//! # Ok::<(), weir_config::ConfigError>(())
//! ```
//!
//! Every error names the key, the bad value, where it came from (the file path or `-D`)
//! and what is expected, in one lowercase line.
#![warn(missing_docs)]

mod config;
mod duration;
mod error;
pub mod flink_keys;
mod option;
pub mod options;
mod values;
mod yaml;

pub use config::{Configuration, HIDDEN_CONTENT, is_sensitive_key};
pub use duration::{DURATION_FORMS, format_duration, parse_duration};
pub use error::{ConfigError, Source};
pub use option::{ConfigOption, OptionInfo};
pub use values::{
    CheckpointingMode, ClaimMode, FailoverStrategy, HighAvailabilityType, RestartStrategyType, StateBackendType,
};
