//! Identifiers that users see and type: job ids are 32 lowercase hex characters, as Flink's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A job's identity: 16 random bytes shown as 32 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct JobId(u128);

impl JobId {
    /// A new random job id.
    pub fn generate() -> JobId {
        JobId(uuid::Uuid::new_v4().as_u128())
    }

    /// The id from its raw value (used by tests and deterministic replays).
    pub fn from_u128(raw: u128) -> JobId {
        JobId(raw)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

/// A string that is not a job id.
#[derive(Debug, thiserror::Error)]
#[error("'{0}' is not a job id: expected 32 lowercase hex characters, as printed by `weir run` or `weir list`")]
pub struct BadJobId(pub String);

impl FromStr for JobId {
    type Err = BadJobId;

    fn from_str(s: &str) -> Result<JobId, BadJobId> {
        let well_formed = s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(BadJobId(s.to_string()));
        }
        u128::from_str_radix(s, 16).map(JobId).map_err(|_| BadJobId(s.to_string()))
    }
}

impl From<JobId> for String {
    fn from(id: JobId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for JobId {
    type Error = BadJobId;
    fn try_from(s: String) -> Result<JobId, BadJobId> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_id_is_32_lowercase_hex_and_round_trips() {
        let id = JobId::generate();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert!(text.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(text.parse::<JobId>().ok(), Some(id));
    }

    #[test]
    fn malformed_job_ids_are_rejected() {
        for bad in ["", "abc", "ZZ000000000000000000000000000000", &"A".repeat(32), &"0".repeat(33)] {
            assert!(bad.parse::<JobId>().is_err(), "{bad}");
        }
    }
}
