//! The typed description of one configuration option: key, parser, default and docs.

use std::fmt;

/// One typed configuration option, such as `parallelism.default`.
///
/// Options are plain `const` values (see [`crate::options`]); other crates may define their
/// own the same way. Read one with [`crate::Configuration::get`].
pub struct ConfigOption<T> {
    /// The Flink key, for example `parallelism.default`.
    pub key: &'static str,
    /// Older or newer Flink names for the same option, also accepted.
    ///
    /// When several of the names are set, the one set last wins (so a `-D` override beats
    /// the file whichever name either uses) and [`crate::Configuration::warnings`] says so.
    pub fallback_keys: &'static [&'static str],
    /// The default as the user would write it, for help output (for example `10min`).
    pub default_description: &'static str,
    /// One line describing what the option does.
    pub description: &'static str,
    /// Parses a trimmed raw value; the error says what is expected, e.g. "expected a
    /// positive integer".
    pub parse: fn(&str) -> Result<T, String>,
    /// Produces the value used when the key is absent.
    pub default: fn() -> T,
}

impl<T> ConfigOption<T> {
    /// The untyped description of this option, for listings and help output.
    pub const fn info(&self) -> OptionInfo {
        OptionInfo {
            key: self.key,
            fallback_keys: self.fallback_keys,
            default_description: self.default_description,
            description: self.description,
        }
    }
}

impl<T> Clone for ConfigOption<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ConfigOption<T> {}

impl<T> fmt::Debug for ConfigOption<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigOption")
            .field("key", &self.key)
            .field("fallback_keys", &self.fallback_keys)
            .field("default", &self.default_description)
            .finish_non_exhaustive()
    }
}

/// The untyped facts about an option: its names, default and description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionInfo {
    /// The Flink key.
    pub key: &'static str,
    /// Alternative Flink names accepted for the same option.
    pub fallback_keys: &'static [&'static str],
    /// The default as the user would write it.
    pub default_description: &'static str,
    /// One line describing what the option does.
    pub description: &'static str,
}

/// Parsers shared by the built-in options; each returns an "expected ..." error text.
pub(crate) mod parse {
    use std::time::Duration;

    use crate::duration::{format_duration, parse_duration};

    /// An unsigned integer within `min..=max`, or `expected` as the error.
    pub(crate) fn int_in(text: &str, min: u64, max: u64, expected: &str) -> Result<u64, String> {
        let Ok(number) = text.parse::<u64>() else {
            return Err(expected.to_string());
        };
        if number < min || number > max {
            return Err(expected.to_string());
        }
        Ok(number)
    }

    /// A `u32` within `min..=max`.
    pub(crate) fn u32_in(text: &str, min: u32, max: u32, expected: &str) -> Result<u32, String> {
        let number = int_in(text, u64::from(min), u64::from(max), expected)?;
        // Bounded by `max`, which is a u32.
        u32::try_from(number).map_err(|_| expected.to_string())
    }

    /// A memory size as Flink writes it: a number with an optional unit `b`, `k`/`kb`,
    /// `m`/`mb`, `g`/`gb`, `t`/`tb` (binary multiples, any case), at least 1 byte.
    pub(crate) fn memory_size(text: &str) -> Result<usize, String> {
        let expected = || format!("expected a memory size such as 256mb, 1g or 65536 (bytes), not '{text}'");
        let trimmed = text.trim().to_ascii_lowercase();
        let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
        let (digits, unit) = trimmed.split_at(split);
        let number: u64 = digits.parse().map_err(|_| expected())?;
        let shift = match unit.trim() {
            "" | "b" | "bytes" => 0,
            "k" | "kb" | "kibibytes" => 10,
            "m" | "mb" | "mebibytes" => 20,
            "g" | "gb" | "gibibytes" => 30,
            "t" | "tb" | "tebibytes" => 40,
            _ => return Err(expected()),
        };
        let bytes = number.checked_shl(shift).filter(|b| b >> shift == number && *b > 0).ok_or_else(expected)?;
        usize::try_from(bytes).map_err(|_| expected())
    }

    /// A positive `u32` (at least 1).
    pub(crate) fn positive_u32(text: &str) -> Result<u32, String> {
        u32_in(text, 1, u32::MAX, "expected a positive integer")
    }

    /// A non-negative `u32` (at least 0).
    pub(crate) fn non_negative_u32(text: &str) -> Result<u32, String> {
        u32_in(text, 0, u32::MAX, "expected a non-negative integer")
    }

    /// A TCP port; 0 asks the operating system for any free port.
    pub(crate) fn port(text: &str) -> Result<u16, String> {
        let number = int_in(text, 0, 65_535, "expected a port number from 0 to 65535")?;
        u16::try_from(number).map_err(|_| "expected a port number from 0 to 65535".to_string())
    }

    /// A finite floating-point number within `min..=max`.
    pub(crate) fn f64_in(text: &str, min: f64, max: f64, expected: &str) -> Result<f64, String> {
        let Ok(number) = text.parse::<f64>() else {
            return Err(expected.to_string());
        };
        if !number.is_finite() || number < min || number > max {
            return Err(expected.to_string());
        }
        Ok(number)
    }

    /// A duration of at least `min`.
    pub(crate) fn duration_at_least(text: &str, min: Duration) -> Result<Duration, String> {
        let duration = parse_duration(text)?;
        if duration < min {
            return Err(format!("expected a duration of at least {}", format_duration(min)));
        }
        Ok(duration)
    }

    /// A non-empty string (host names and addresses).
    pub(crate) fn host(text: &str) -> Result<String, String> {
        if text.is_empty() {
            return Err("expected a host name or ip address".to_string());
        }
        Ok(text.to_string())
    }

    /// An optional string: empty means unset.
    pub(crate) fn optional_string(text: &str) -> Result<Option<String>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        Ok(Some(text.to_string()))
    }

    /// A job id: 32 hexadecimal characters (empty: none).
    pub(crate) fn optional_job_id(text: &str) -> Result<Option<String>, String> {
        if text.is_empty() {
            return Ok(None);
        }
        if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Some(text.to_ascii_lowercase()));
        }
        Err("expected a job id: 32 hexadecimal characters, as `weir list` shows them".into())
    }

    /// `true` or `false` (any case), as Flink's boolean options.
    pub(crate) fn boolean(text: &str) -> Result<bool, String> {
        match text.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err("expected true or false".to_string()),
        }
    }

    /// Whether `text` spells "no value" for an optional option: empty or `none`.
    pub(crate) fn is_none_word(text: &str) -> bool {
        text.is_empty() || text.eq_ignore_ascii_case("none")
    }
}
