//! The enumerated option values (checkpointing mode, state backend, restart strategy, ...).
//!
//! Each parses Flink's spellings case-insensitively via `FromStr` and displays the canonical
//! Flink spelling; serde uses the same canonical spelling.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The consistency guarantee of checkpoints (`execution.checkpointing.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum CheckpointingMode {
    /// Barriers are aligned, so every record affects state exactly once.
    #[default]
    #[serde(rename = "EXACTLY_ONCE")]
    ExactlyOnce,
    /// Barriers are not aligned; after recovery some records may be applied twice.
    #[serde(rename = "AT_LEAST_ONCE")]
    AtLeastOnce,
}

impl FromStr for CheckpointingMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("EXACTLY_ONCE") {
            return Ok(CheckpointingMode::ExactlyOnce);
        }
        if text.eq_ignore_ascii_case("AT_LEAST_ONCE") {
            return Ok(CheckpointingMode::AtLeastOnce);
        }
        Err("expected 'EXACTLY_ONCE' or 'AT_LEAST_ONCE'".to_string())
    }
}

impl fmt::Display for CheckpointingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckpointingMode::ExactlyOnce => "EXACTLY_ONCE",
            CheckpointingMode::AtLeastOnce => "AT_LEAST_ONCE",
        })
    }
}

/// Who owns the snapshot a job is restored from (`execution.state-recovery.claim-mode`,
/// Flink's `RecoveryClaimMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ClaimMode {
    /// The job takes the snapshot over: once its own checkpoints subsume it, the restored
    /// checkpoint is disposed like one of its own.
    #[serde(rename = "CLAIM")]
    Claim,
    /// The snapshot stays the user's: nothing of it is deleted, and the job's first
    /// checkpoint is a full one that uses none of its files.
    #[default]
    #[serde(rename = "NO_CLAIM")]
    NoClaim,
}

impl FromStr for ClaimMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("claim") {
            Ok(ClaimMode::Claim)
        } else if text.eq_ignore_ascii_case("no_claim") || text.eq_ignore_ascii_case("no-claim") {
            Ok(ClaimMode::NoClaim)
        } else if text.eq_ignore_ascii_case("legacy") {
            Err("LEGACY was removed (as in Flink 2.0); use CLAIM or NO_CLAIM".to_string())
        } else {
            Err("expected CLAIM or NO_CLAIM".to_string())
        }
    }
}

impl fmt::Display for ClaimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimMode::Claim => "CLAIM",
            ClaimMode::NoClaim => "NO_CLAIM",
        })
    }
}

/// Where keyed state lives (`state.backend.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StateBackendType {
    /// State is kept in in-memory hash maps and snapshotted to checkpoint storage.
    #[default]
    #[serde(rename = "hashmap")]
    HashMap,
    /// The same hash maps, with cold key groups spilled to a local LSM store (fjall) once
    /// `state.backend.spillable.memory` is used: state larger than memory.
    #[serde(rename = "spillable")]
    Spillable,
    /// Every entry in a local LSM store (fjall), one store entry per key as Flink's RocksDB
    /// backend keeps it, the entries in use cached in hash maps up to
    /// `state.backend.fjall.memory`: state far larger than memory.
    #[serde(rename = "fjall")]
    Fjall,
}

impl FromStr for StateBackendType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("hashmap") {
            return Ok(StateBackendType::HashMap);
        }
        if text.eq_ignore_ascii_case("spillable") {
            return Ok(StateBackendType::Spillable);
        }
        if text.eq_ignore_ascii_case("fjall") {
            return Ok(StateBackendType::Fjall);
        }
        for unavailable in ["rocksdb", "forst"] {
            if text.eq_ignore_ascii_case(unavailable) {
                return Err(format!(
                    "state backend '{unavailable}' is not available in this build; use 'fjall' (every entry in a local LSM store, as RocksDB keeps it) for state larger than memory, or 'hashmap'"
                ));
            }
        }
        Err("expected 'hashmap', 'spillable' or 'fjall'".to_string())
    }
}

impl fmt::Display for StateBackendType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateBackendType::HashMap => "hashmap",
            StateBackendType::Spillable => "spillable",
            StateBackendType::Fjall => "fjall",
        })
    }
}

/// How a failed job is restarted (`restart-strategy.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RestartStrategyType {
    /// Never restart; the job fails on the first task failure.
    #[serde(rename = "none")]
    None,
    /// Restart a fixed number of times with a fixed delay.
    #[serde(rename = "fixed-delay")]
    FixedDelay,
    /// Restart until too many failures happen within an interval.
    #[serde(rename = "failure-rate")]
    FailureRate,
    /// Restart with exponentially growing delays.
    #[serde(rename = "exponential-delay")]
    ExponentialDelay,
}

impl FromStr for RestartStrategyType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let lower = text.trim().to_ascii_lowercase();
        match lower.as_str() {
            "none" | "off" | "disable" => Ok(RestartStrategyType::None),
            "fixed-delay" | "fixeddelay" => Ok(RestartStrategyType::FixedDelay),
            "failure-rate" | "failurerate" => Ok(RestartStrategyType::FailureRate),
            "exponential-delay" | "exponentialdelay" => Ok(RestartStrategyType::ExponentialDelay),
            _ => Err("expected 'none', 'fixed-delay', 'failure-rate' or 'exponential-delay'".to_string()),
        }
    }
}

impl fmt::Display for RestartStrategyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RestartStrategyType::None => "none",
            RestartStrategyType::FixedDelay => "fixed-delay",
            RestartStrategyType::FailureRate => "failure-rate",
            RestartStrategyType::ExponentialDelay => "exponential-delay",
        })
    }
}

/// Which tasks are restarted after a task failure (`jobmanager.execution.failover-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum FailoverStrategy {
    /// Restart only the pipelined region containing the failed task.
    #[default]
    #[serde(rename = "region")]
    Region,
    /// Restart every task of the job.
    #[serde(rename = "full")]
    Full,
}

impl FromStr for FailoverStrategy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("region") {
            return Ok(FailoverStrategy::Region);
        }
        if text.eq_ignore_ascii_case("full") {
            return Ok(FailoverStrategy::Full);
        }
        Err("expected 'region' or 'full'".to_string())
    }
}

impl fmt::Display for FailoverStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailoverStrategy::Region => "region",
            FailoverStrategy::Full => "full",
        })
    }
}

/// The high-availability service (`high-availability.type`): `none`, `etcd` or `kubernetes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum HighAvailabilityType {
    /// No high availability: a job manager failure fails its jobs.
    #[default]
    #[serde(rename = "NONE")]
    None,
    /// Leader election and recoverable job state on etcd (`high-availability.etcd.*`).
    #[serde(rename = "ETCD")]
    Etcd,
    /// Leader election and recoverable job state on a ConfigMap of the Kubernetes cluster the
    /// JobManagers run in (`high-availability.kubernetes.*`).
    #[serde(rename = "KUBERNETES")]
    Kubernetes,
}

impl HighAvailabilityType {
    /// True when standby JobManagers can take over (any service but `none`).
    pub fn is_enabled(self) -> bool {
        self != HighAvailabilityType::None
    }
}

impl FromStr for HighAvailabilityType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") || text.eq_ignore_ascii_case("NO_HA") {
            return Ok(HighAvailabilityType::None);
        }
        if text.eq_ignore_ascii_case("etcd") {
            return Ok(HighAvailabilityType::Etcd);
        }
        if text.eq_ignore_ascii_case("kubernetes")
            || text.eq_ignore_ascii_case("org.apache.flink.kubernetes.highavailability.KubernetesHaServicesFactory")
        {
            return Ok(HighAvailabilityType::Kubernetes);
        }
        if text.eq_ignore_ascii_case("zookeeper") {
            return Err(format!(
                "high-availability.type '{text}' is Flink's, not weir's: weir's high availability runs on etcd or Kubernetes; use 'etcd' (with high-availability.etcd.endpoints), 'kubernetes' (in a Kubernetes cluster) or 'none'"
            ));
        }
        Err(format!("high-availability.type '{text}' is not one of none, etcd, kubernetes"))
    }
}

impl fmt::Display for HighAvailabilityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HighAvailabilityType::None => "NONE",
            HighAvailabilityType::Etcd => "ETCD",
            HighAvailabilityType::Kubernetes => "KUBERNETES",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpointing_mode_parses_case_insensitively() {
        assert_eq!("EXACTLY_ONCE".parse(), Ok(CheckpointingMode::ExactlyOnce));
        assert_eq!("exactly_once".parse(), Ok(CheckpointingMode::ExactlyOnce));
        assert_eq!("At_Least_Once".parse(), Ok(CheckpointingMode::AtLeastOnce));
        assert!("exactly-once".parse::<CheckpointingMode>().is_err());
    }

    #[test]
    fn restart_strategy_accepts_flink_spellings() {
        for (text, expected) in [
            ("none", RestartStrategyType::None),
            ("OFF", RestartStrategyType::None),
            ("disable", RestartStrategyType::None),
            ("fixed-delay", RestartStrategyType::FixedDelay),
            ("FixedDelay", RestartStrategyType::FixedDelay),
            ("failure-rate", RestartStrategyType::FailureRate),
            ("failurerate", RestartStrategyType::FailureRate),
            ("exponential-delay", RestartStrategyType::ExponentialDelay),
            ("EXPONENTIALDELAY", RestartStrategyType::ExponentialDelay),
        ] {
            assert_eq!(text.parse(), Ok(expected), "{text}");
        }
        assert!("sometimes".parse::<RestartStrategyType>().is_err());
    }

    #[test]
    fn state_backend_explains_rocksdb() {
        assert_eq!("HashMap".parse(), Ok(StateBackendType::HashMap));
        assert_eq!(
            "rocksdb".parse::<StateBackendType>(),
            Err("state backend 'rocksdb' is not available in this build; use 'fjall' (every entry in a local LSM store, as RocksDB keeps it) for state larger than memory, or 'hashmap'".into())
        );
        assert_eq!("memory".parse::<StateBackendType>(), Err("expected 'hashmap', 'spillable' or 'fjall'".into()));
        assert_eq!("spillable".parse(), Ok(StateBackendType::Spillable));
        assert_eq!("FJALL".parse(), Ok(StateBackendType::Fjall));
    }

    #[test]
    fn high_availability_is_none_etcd_or_kubernetes() {
        assert_eq!("NONE".parse(), Ok(HighAvailabilityType::None));
        assert_eq!("etcd".parse(), Ok(HighAvailabilityType::Etcd));
        assert_eq!("kubernetes".parse(), Ok(HighAvailabilityType::Kubernetes));
        for ha in [HighAvailabilityType::Etcd, HighAvailabilityType::Kubernetes] {
            assert_eq!(ha.to_string().parse(), Ok(ha));
        }
        let zookeeper = "zookeeper".parse::<HighAvailabilityType>().unwrap_err();
        assert!(zookeeper.contains("runs on etcd or Kubernetes; use 'etcd'"), "{zookeeper}");
    }

    #[test]
    fn display_round_trips_through_from_str() {
        for mode in [CheckpointingMode::ExactlyOnce, CheckpointingMode::AtLeastOnce] {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
        for kind in [
            RestartStrategyType::None,
            RestartStrategyType::FixedDelay,
            RestartStrategyType::FailureRate,
            RestartStrategyType::ExponentialDelay,
        ] {
            assert_eq!(kind.to_string().parse(), Ok(kind));
        }
        for strategy in [FailoverStrategy::Region, FailoverStrategy::Full] {
            assert_eq!(strategy.to_string().parse(), Ok(strategy));
        }
        assert_eq!(StateBackendType::HashMap.to_string().parse(), Ok(StateBackendType::HashMap));
        assert_eq!(HighAvailabilityType::None.to_string().parse(), Ok(HighAvailabilityType::None));
    }
}
