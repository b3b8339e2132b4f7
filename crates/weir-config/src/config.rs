//! The loaded configuration: flattened `key -> value` strings with their origins.

use std::collections::BTreeMap;
use std::path::Path;

use crate::duration::format_duration;
use crate::error::{ConfigError, Source, lowercase_first};
use crate::option::ConfigOption;
use crate::options;
use crate::values::RestartStrategyType;
use crate::yaml::flatten_yaml;

/// Text shown instead of the value of a sensitive key (see [`is_sensitive_key`]).
pub const HIDDEN_CONTENT: &str = "******";

/// Fragments that mark a key as sensitive, after Flink's `GlobalConfiguration.isSensitive`.
const SENSITIVE_KEY_FRAGMENTS: &[&str] = &[
    "password",
    "secret",
    "fs.azure.account.key",
    "apikey",
    "api-key",
    "auth-params",
    "service-key",
    "token",
    "basic-auth",
    "jaas.config",
    "http-headers",
];

/// Whether the value of `key` should be hidden in logs and displays (passwords, tokens, ...).
pub fn is_sensitive_key(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    for fragment in SENSITIVE_KEY_FRAGMENTS {
        if lower.contains(fragment) {
            return true;
        }
    }
    false
}

/// One explicitly set value.
#[derive(Debug, Clone)]
struct Entry {
    value: String,
    source: Source,
    /// Order in which values were set; among the names of one option the latest wins.
    sequence: u64,
}

/// weir's configuration: flattened Flink keys with string values and where each came from.
///
/// Build it with [`Configuration::load`] (YAML file plus `-D` overrides) or
/// [`Configuration::new`] and [`Configuration::set`]; read typed values with
/// [`Configuration::get`] and the options in [`crate::options`].
#[derive(Debug, Clone, Default)]
pub struct Configuration {
    entries: BTreeMap<String, Entry>,
    next_sequence: u64,
}

impl Configuration {
    /// An empty configuration: every option has its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads the YAML file (if given), then applies each `-D` override of the form
    /// `key=value`, so overrides win over the file.
    ///
    /// The file may use flat keys (`parallelism.default: 4`) or nested maps; an empty file is
    /// fine. Values are not checked here: call [`Configuration::validate`] to check every
    /// known key at once, or [`Configuration::get`] for one.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Configuration, ConfigError> {
        let mut config = Configuration::new();
        if let Some(path) = file {
            config.apply_file(path)?;
        }
        for entry in overrides {
            config.apply_override(entry)?;
        }
        Ok(config)
    }

    /// Reads a YAML configuration file and sets each of its keys, tagged with the file path.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    reason: lowercase_first(&error.to_string()),
                    kind: error.kind(),
                });
            }
        };
        let entries = flatten_yaml(&text, path)?;
        tracing::debug!(
            path = %path.display(),
            keys = entries.len(),
            "loaded configuration file"
        );
        for (key, value) in entries {
            self.insert(key, value, Source::File(path.to_path_buf()));
        }
        Ok(())
    }

    /// Applies one `-D` override given as `key=value` (without the `-D`).
    ///
    /// The key and value are trimmed; the value may be empty (which unsets optional options)
    /// and may itself contain `=`.
    pub fn apply_override(&mut self, entry: &str) -> Result<(), ConfigError> {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(ConfigError::BadOverride { entry: entry.to_string(), reason: "missing '='".to_string() });
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(ConfigError::BadOverride { entry: entry.to_string(), reason: "the key is empty".to_string() });
        }
        self.insert(key.to_string(), value.trim().to_string(), Source::Override);
        Ok(())
    }

    /// Sets a value programmatically (for example from a dedicated command-line flag).
    ///
    /// Errors about it say "from programmatic setting"; use [`Configuration::set_from`] to
    /// name the origin instead.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.set_from(key, value, "programmatic setting");
    }

    /// Sets a value programmatically, naming its origin for messages (for example `-p`).
    pub fn set_from(&mut self, key: impl Into<String>, value: impl Into<String>, origin: impl Into<String>) {
        self.insert(key.into(), value.into(), Source::Set(origin.into()));
    }

    /// Removes an explicitly set key, so its option falls back to the default.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.entries.remove(key).map(|entry| entry.value)
    }

    fn insert(&mut self, key: String, value: String, source: Source) {
        let shown = if is_sensitive_key(&key) { HIDDEN_CONTENT } else { value.as_str() };
        tracing::trace!(key = %key, value = %shown, source = %source, "configuration value set");
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.entries.insert(key, Entry { value, source, sequence });
    }

    /// Reads an option: parses the explicitly set value, or returns the option's default.
    ///
    /// The value is trimmed before parsing. If the option has fallback names, the name set
    /// last is used. A value that does not parse is a [`ConfigError::BadValue`] naming the
    /// key, the value, its origin and what is expected.
    pub fn get<T>(&self, option: &ConfigOption<T>) -> Result<T, ConfigError> {
        let Some((key, entry)) = self.lookup(option.key, option.fallback_keys) else {
            return Ok((option.default)());
        };
        match (option.parse)(entry.value.trim()) {
            Ok(value) => Ok(value),
            Err(reason) => Err(ConfigError::BadValue {
                key: key.to_string(),
                // A secret's value is never shown, not even a wrong one.
                value: if is_sensitive_key(key) { HIDDEN_CONTENT.to_string() } else { entry.value.clone() },
                origin: entry.source.clone(),
                reason,
            }),
        }
    }

    /// Whether the option is explicitly set, under its key or a fallback name.
    pub fn contains<T>(&self, option: &ConfigOption<T>) -> bool {
        self.lookup(option.key, option.fallback_keys).is_some()
    }

    /// The raw value of exactly this key, if set.
    pub fn get_raw(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(|entry| entry.value.as_str())
    }

    /// Where the value of exactly this key came from, if set.
    pub fn source(&self, key: &str) -> Option<&Source> {
        self.entries.get(key).map(|entry| &entry.source)
    }

    /// Every explicitly set `(key, raw value, source)`, sorted by key.
    ///
    /// Mask values with [`is_sensitive_key`] / [`HIDDEN_CONTENT`] before showing them.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str, &Source)> + '_ {
        self.entries.iter().map(|(key, entry)| (key.as_str(), entry.value.as_str(), &entry.source))
    }

    /// The number of explicitly set keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is explicitly set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `key=value` for every explicitly set key, sorted by key, ready to pass on as `-D`
    /// arguments to another weir process ([`Configuration::load`] reads them back).
    pub fn to_overrides(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.entries.len());
        for (key, entry) in &self.entries {
            out.push(format!("{key}={}", entry.value));
        }
        out
    }

    /// One line per problem that does not stop weir: unknown keys (ignored, with a
    /// "did you mean" suggestion when a known key is close) and options set under two
    /// names with different values.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for (key, entry) in &self.entries {
            if options::is_known_key(key) {
                continue;
            }
            let unknown = format!("unknown configuration key '{key}' (from {}); it is ignored", entry.source);
            // A typo of a key weir takes first; else one of Flink's keys weir does not take:
            // why, and what to use instead.
            let line = match suggest_key(key) {
                Some(suggestion) => format!("{unknown}; did you mean '{suggestion}'?"),
                None => crate::flink_keys::warning(key, &entry.source.to_string()).unwrap_or(unknown),
            };
            warnings.push(line);
        }
        for info in options::ALL {
            let Some((used_key, used)) = self.lookup(info.key, info.fallback_keys) else {
                continue;
            };
            for name in std::iter::once(&info.key).chain(info.fallback_keys) {
                let Some(other) = self.entries.get(*name) else {
                    continue;
                };
                if *name == used_key || other.value == used.value {
                    continue;
                }
                warnings.push(format!(
                    "configuration key '{name}' (from {}) is also set as '{used_key}' (from {}); \
                     the value '{}' of '{used_key}' is used",
                    other.source, used.source, used.value
                ));
            }
        }
        warnings
    }

    /// Checks every known option's value and the rules that tie options together
    /// (heartbeat timeout versus interval, max parallelism versus parallelism, exponential
    /// backoff bounds). Returns the first problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use options::*;

        let parallelism = self.get(&PARALLELISM_DEFAULT)?;
        let max_parallelism = self.get(&PIPELINE_MAX_PARALLELISM)?;
        self.get(&PIPELINE_AUTO_WATERMARK_INTERVAL)?;
        self.get(&REST_ADDRESS)?;
        self.get(&REST_PORT)?;
        self.get(&REST_BIND_ADDRESS)?;
        self.get(&REST_RETRY_MAX_ATTEMPTS)?;
        self.get(&EXECUTION_TARGET)?;
        self.get(&REST_RETRY_DELAY)?;
        self.get(&JOBMANAGER_RPC_ADDRESS)?;
        self.get(&JOBMANAGER_RPC_PORT)?;
        self.get(&JOBMANAGER_BIND_HOST)?;
        self.get(&TASKMANAGER_HOST)?;
        self.get(&TASKMANAGER_BIND_HOST)?;
        self.get(&TASKMANAGER_DATA_PORT)?;
        self.get(&TASKMANAGER_NUMBER_OF_TASK_SLOTS)?;
        self.get(&TASKMANAGER_MEMORY_PROCESS_SIZE)?;
        self.get(&CHECKPOINTING_INTERVAL)?;
        let mode = self.get(&CHECKPOINTING_MODE)?;
        if self.get(&CHECKPOINTING_UNALIGNED)? && matches!(mode, crate::CheckpointingMode::AtLeastOnce) {
            let (key, source) = self.origin_of(CHECKPOINTING_UNALIGNED.key, CHECKPOINTING_UNALIGNED.fallback_keys);
            return Err(ConfigError::Inconsistent {
                message: format!(
                    "configuration key '{key}' (true, from {source}) needs 'execution.checkpointing.mode: EXACTLY_ONCE' (as in Flink: an at-least-once checkpoint does not align, so there is nothing to unalign); remove one of them"
                ),
            });
        }
        self.get(&CHECKPOINTING_TIMEOUT)?;
        self.get(&CHECKPOINTING_MIN_PAUSE)?;
        self.get(&CHECKPOINTING_MAX_CONCURRENT)?;
        self.get(&CHECKPOINTING_TOLERABLE_FAILED)?;
        self.get(&CHECKPOINTS_NUM_RETAINED)?;
        self.get(&CHECKPOINTING_INCREMENTAL)?;
        self.get(&CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY)?;
        self.get(&STATE_RECOVERY_CLAIM_MODE)?;
        self.get(&CHECKPOINTS_DIR)?;
        self.get(&SAVEPOINTS_DIR)?;
        self.get(&STATE_BACKEND_TYPE)?;
        self.get(&STATE_BACKEND_SPILLABLE_MEMORY)?;
        self.get(&STATE_BACKEND_FJALL_MEMORY)?;
        self.get(&IO_TMP_DIRS)?;
        let restart_strategy = self.get(&RESTART_STRATEGY_TYPE)?;
        self.get(&RESTART_FIXED_DELAY_ATTEMPTS)?;
        self.get(&RESTART_FIXED_DELAY_DELAY)?;
        self.get(&RESTART_FAILURE_RATE_MAX_FAILURES)?;
        self.get(&RESTART_FAILURE_RATE_INTERVAL)?;
        self.get(&RESTART_FAILURE_RATE_DELAY)?;
        let initial_backoff = self.get(&RESTART_EXPONENTIAL_INITIAL_BACKOFF)?;
        let max_backoff = self.get(&RESTART_EXPONENTIAL_MAX_BACKOFF)?;
        self.get(&RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER)?;
        self.get(&RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD)?;
        self.get(&RESTART_EXPONENTIAL_JITTER_FACTOR)?;
        self.get(&RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET)?;
        self.get(&FAILOVER_STRATEGY)?;
        let heartbeat_interval = self.get(&HEARTBEAT_INTERVAL)?;
        let heartbeat_timeout = self.get(&HEARTBEAT_TIMEOUT)?;
        let ha = self.get(&HIGH_AVAILABILITY_TYPE)?;
        let ha_storage = self.get(&HIGH_AVAILABILITY_STORAGE_DIR)?;
        self.get(&HIGH_AVAILABILITY_CLUSTER_ID)?;
        self.get(&HIGH_AVAILABILITY_ETCD_ENDPOINTS)?;
        self.get(&HIGH_AVAILABILITY_ETCD_LEASE_TTL)?;
        self.get(&HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION)?;
        self.get(&RESOURCEMANAGER_TASKMANAGER_TIMEOUT)?;
        self.get(&SLOTMANAGER_NUMBER_OF_SLOTS_MIN)?;
        self.get(&OPERATOR_ROLLBACK_ENABLED)?;
        self.get(&OPERATOR_READINESS_TIMEOUT)?;
        self.get(&OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT)?;
        self.get(&OPERATOR_SAVEPOINT_HISTORY_MAX_AGE)?;
        self.get(&OPERATOR_LAST_STATE_FALLBACK)?;
        self.get(&OPERATOR_PERIODIC_SAVEPOINT_INTERVAL)?;
        self.get(&OPERATOR_JM_DEPLOYMENT_RECOVERY)?;
        self.get(&OPERATOR_LEASE_DURATION)?;
        self.get(&OPERATOR_RECONCILE_INTERVAL)?;
        self.get(&OPERATOR_REST_PORT)?;
        self.get(&HIGH_AVAILABILITY_RECONCILE_TIMEOUT)?;
        self.get(&PIPELINE_NAME)?;
        self.get(&PIPELINE_FIXED_JOB_ID)?;
        self.get(&RESTORE_NEWEST_RETAINED)?;
        let secret = self.get(&SECURITY_INTERNAL_SECRET)?;
        let secret_file = self.get(&SECURITY_INTERNAL_SECRET_FILE)?;
        let tls = self.get(&SECURITY_SSL_INTERNAL_ENABLED)?;
        let keystore = self.get(&SECURITY_SSL_INTERNAL_KEYSTORE)?;
        let truststore = self.get(&SECURITY_SSL_INTERNAL_TRUSTSTORE)?;
        self.get(&SECURITY_SSL_INTERNAL_KEYSTORE_TYPE)?;
        self.get(&SECURITY_SSL_INTERNAL_TRUSTSTORE_TYPE)?;

        if secret.is_some() && secret_file.is_some() {
            return Err(self.inconsistent(
                &SECURITY_INTERNAL_SECRET,
                HIDDEN_CONTENT,
                "and",
                &SECURITY_INTERNAL_SECRET_FILE,
                &format!("{}; set only one of them", secret_file.as_deref().unwrap_or_default()),
            ));
        }
        if tls {
            for (option, value) in
                [(&SECURITY_SSL_INTERNAL_KEYSTORE, &keystore), (&SECURITY_SSL_INTERNAL_TRUSTSTORE, &truststore)]
            {
                if value.is_none() {
                    let (key, source) = self.origin_of(SECURITY_SSL_INTERNAL_ENABLED.key, &[]);
                    return Err(ConfigError::Inconsistent {
                        message: format!(
                            "configuration key '{key}' (true, from {source}) needs '{}': set it to a PEM file ({})",
                            option.key, option.description
                        ),
                    });
                }
            }
        }

        if ha.is_enabled() && ha_storage.is_none() {
            let (key, source) = self.origin_of(HIGH_AVAILABILITY_TYPE.key, HIGH_AVAILABILITY_TYPE.fallback_keys);
            let ha = ha.to_string().to_lowercase();
            return Err(ConfigError::Inconsistent {
                message: format!(
                    "configuration key '{key}' ({ha}, from {source}) needs 'high-availability.storageDir': set it to a directory or object-store URL every JobManager can reach (the submitted jobs are kept there)"
                ),
            });
        }

        if let Some(max_parallelism) = max_parallelism
            && max_parallelism < parallelism
        {
            return Err(self.inconsistent(
                &PIPELINE_MAX_PARALLELISM,
                &max_parallelism.to_string(),
                "must not be smaller than",
                &PARALLELISM_DEFAULT,
                &parallelism.to_string(),
            ));
        }
        if heartbeat_timeout < heartbeat_interval {
            return Err(self.inconsistent(
                &HEARTBEAT_TIMEOUT,
                &format_duration(heartbeat_timeout),
                "must not be smaller than",
                &HEARTBEAT_INTERVAL,
                &format_duration(heartbeat_interval),
            ));
        }
        let may_use_exponential_delay = matches!(restart_strategy, None | Some(RestartStrategyType::ExponentialDelay));
        if may_use_exponential_delay && max_backoff < initial_backoff {
            return Err(self.inconsistent(
                &RESTART_EXPONENTIAL_MAX_BACKOFF,
                &format_duration(max_backoff),
                "must not be smaller than",
                &RESTART_EXPONENTIAL_INITIAL_BACKOFF,
                &format_duration(initial_backoff),
            ));
        }
        Ok(())
    }

    /// Builds the error for two options whose values contradict each other.
    fn inconsistent<A, B>(
        &self,
        first: &ConfigOption<A>,
        first_value: &str,
        rule: &str,
        second: &ConfigOption<B>,
        second_value: &str,
    ) -> ConfigError {
        let (first_key, first_source) = self.origin_of(first.key, first.fallback_keys);
        let (second_key, second_source) = self.origin_of(second.key, second.fallback_keys);
        ConfigError::Inconsistent {
            message: format!(
                "configuration key '{first_key}' ({first_value}, from {first_source}) {rule} \
                 '{second_key}' ({second_value}, from {second_source})"
            ),
        }
    }

    /// The name and source in effect for an option, or its main key and [`Source::Default`].
    fn origin_of(&self, key: &'static str, fallback_keys: &'static [&'static str]) -> (&str, Source) {
        match self.lookup(key, fallback_keys) {
            Some((name, entry)) => (name, entry.source.clone()),
            None => (key, Source::Default),
        }
    }

    /// Finds the entry in effect for an option: the most recently set of its names.
    fn lookup(&self, key: &'static str, fallback_keys: &'static [&'static str]) -> Option<(&'static str, &Entry)> {
        let mut found: Option<(&'static str, &Entry)> = None;
        for name in std::iter::once(&key).chain(fallback_keys) {
            let Some(entry) = self.entries.get(*name) else {
                continue;
            };
            let newer = match found {
                Some((_, best)) => entry.sequence > best.sequence,
                None => true,
            };
            if newer {
                found = Some((*name, entry));
            }
        }
        found
    }
}

/// The known key (main or fallback name) closest to `key` within edit distance 2, ignoring
/// case; ties go to the first in [`options::ALL`] order.
fn suggest_key(key: &str) -> Option<&'static str> {
    let lower = key.to_lowercase();
    let mut best: Option<(usize, &'static str)> = None;
    for info in options::ALL {
        for name in std::iter::once(&info.key).chain(info.fallback_keys) {
            let distance = edit_distance(&lower, &name.to_lowercase());
            if distance > 2 {
                continue;
            }
            let better = match best {
                Some((best_distance, _)) => distance < best_distance,
                None => true,
            };
            if better {
                best = Some((distance, *name));
            }
        }
    }
    best.map(|(_, name)| name)
}

/// Levenshtein distance between two strings, counted in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b_chars: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b_chars.len()).collect();
    let mut current = vec![0; b_chars.len() + 1];
    for (i, a_char) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, b_char) in b_chars.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            let deletion = previous[j + 1] + 1;
            let insertion = current[j] + 1;
            current[j + 1] = substitution.min(deletion).min(insertion);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b_chars.len()]
}

#[cfg(test)]
mod tests;
