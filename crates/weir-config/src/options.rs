//! The configuration options weir understands, under Apache Flink's key names.
//!
//! Every option is a `const` [`ConfigOption`]; [`ALL`] and [`ALL_KEYS`] list them all.

use std::time::Duration;

use crate::duration::parse_duration;
use crate::option::parse::{
    boolean, duration_at_least, f64_in, host, int_in, is_none_word, memory_size, non_negative_u32, optional_job_id,
    optional_string, port, positive_u32, u32_in,
};
use crate::option::{ConfigOption, OptionInfo};
use crate::values::{
    CheckpointingMode, ClaimMode, FailoverStrategy, HighAvailabilityType, RestartStrategyType, StateBackendType,
};

/// The largest parallelism and max parallelism Flink accepts (2^15).
pub const MAX_PARALLELISM_UPPER_BOUND: u32 = 32_768;

/// The shortest checkpoint interval and timeout Flink accepts.
pub const MINIMAL_CHECKPOINT_TIME: Duration = Duration::from_millis(10);

const PARALLELISM_EXPECTED: &str = "expected a positive integer up to 32768";

fn parse_parallelism(text: &str) -> Result<u32, String> {
    u32_in(text, 1, MAX_PARALLELISM_UPPER_BOUND, PARALLELISM_EXPECTED)
}

fn parse_optional_parallelism(text: &str) -> Result<Option<u32>, String> {
    if is_none_word(text) {
        return Ok(None);
    }
    parse_parallelism(text).map(Some)
}

fn parse_any_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err("expected a positive duration such as '10s'".to_string());
    }
    Ok(duration)
}

fn parse_checkpoint_interval(text: &str) -> Result<Option<Duration>, String> {
    if is_none_word(text) || text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let Ok(interval) = parse_duration(text) else {
        return Err(
            "expected a duration of at least 10ms such as '10s', or 'none' to disable checkpointing".to_string()
        );
    };
    if interval < MINIMAL_CHECKPOINT_TIME {
        return Err(
            "expected a duration of at least 10ms such as '10s', or 'none' to disable checkpointing".to_string()
        );
    }
    Ok(Some(interval))
}

fn parse_checkpoint_timeout(text: &str) -> Result<Duration, String> {
    duration_at_least(text, MINIMAL_CHECKPOINT_TIME)
}

fn parse_restart_strategy(text: &str) -> Result<Option<RestartStrategyType>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some)
}

fn parse_backoff_multiplier(text: &str) -> Result<f64, String> {
    f64_in(text, 1.0, f64::MAX, "expected a number of at least 1.0")
}

fn parse_jitter_factor(text: &str) -> Result<f64, String> {
    f64_in(text, 0.0, 1.0, "expected a number from 0.0 to 1.0")
}

fn parse_optional_attempts(text: &str) -> Result<Option<u32>, String> {
    if is_none_word(text) {
        return Ok(None);
    }
    let expected = "expected a non-negative integer, or 'none' for unlimited";
    let number = int_in(text, 0, u64::from(u32::MAX), expected)?;
    u32::try_from(number).map(Some).map_err(|_| expected.to_string())
}

fn localhost() -> String {
    "127.0.0.1".to_string()
}

/// `parallelism.default`: the parallelism of operators that set none.
pub const PARALLELISM_DEFAULT: ConfigOption<u32> = ConfigOption {
    key: "parallelism.default",
    fallback_keys: &[],
    default_description: "1",
    description: "default parallelism of jobs and operators that do not set one",
    parse: parse_parallelism,
    default: || 1,
};

/// `pipeline.max-parallelism`: the number of key groups; `None` means derive it later from
/// the parallelism.
pub const PIPELINE_MAX_PARALLELISM: ConfigOption<Option<u32>> = ConfigOption {
    key: "pipeline.max-parallelism",
    fallback_keys: &[],
    default_description: "none (derived from the parallelism)",
    description: "maximum parallelism (number of key groups) of keyed operators",
    parse: parse_optional_parallelism,
    default: || None,
};

/// `pipeline.auto-watermark-interval`: how often watermark strategies emit watermarks.
pub const PIPELINE_AUTO_WATERMARK_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "pipeline.auto-watermark-interval",
    fallback_keys: &[],
    default_description: "200ms",
    description: "interval at which periodic watermarks are emitted; 0 emits only the final watermark",
    parse: crate::duration::parse_duration,
    default: || Duration::from_millis(200),
};

/// `rest.address`: the address clients use to reach the REST endpoint.
pub const REST_ADDRESS: ConfigOption<String> = ConfigOption {
    key: "rest.address",
    fallback_keys: &[],
    default_description: "127.0.0.1",
    description: "address that clients use to connect to the rest endpoint",
    parse: host,
    default: localhost,
};

/// `rest.port`: the REST endpoint's port; 0 picks any free port.
pub const REST_PORT: ConfigOption<u16> = ConfigOption {
    key: "rest.port",
    fallback_keys: &[],
    default_description: "8081",
    description: "port of the rest endpoint (0 picks a free port)",
    parse: port,
    default: || 8081,
};

/// `rest.retry.max-attempts`: how often the CLI tries a REST request whose JobManager does
/// not answer (a failover under way).
pub const REST_RETRY_MAX_ATTEMPTS: ConfigOption<u32> = ConfigOption {
    key: "rest.retry.max-attempts",
    fallback_keys: &[],
    default_description: "20",
    description: "attempts of a CLI request while the JobManager does not answer (with high availability, or when set); 1 tries once",
    parse: positive_u32,
    default: || 20,
};

/// `rest.retry.delay`: the wait between two of those attempts.
pub const REST_RETRY_DELAY: ConfigOption<Duration> = ConfigOption {
    key: "rest.retry.delay",
    fallback_keys: &[],
    default_description: "1s",
    description: "wait between two attempts of a CLI request while the JobManager does not answer",
    parse: crate::duration::parse_duration,
    default: || Duration::from_secs(1),
};

/// `rest.bind-address`: the local address the REST server binds; `None` means `rest.address`.
pub const REST_BIND_ADDRESS: ConfigOption<Option<String>> = ConfigOption {
    key: "rest.bind-address",
    fallback_keys: &[],
    default_description: "none",
    description: "address the rest server binds to (defaults to rest.address)",
    parse: optional_string,
    default: || None,
};

/// `jobmanager.rpc.address`: the address task managers use to reach the job manager.
pub const JOBMANAGER_RPC_ADDRESS: ConfigOption<String> = ConfigOption {
    key: "jobmanager.rpc.address",
    fallback_keys: &[],
    default_description: "127.0.0.1",
    description: "address of the job manager for task manager connections",
    parse: host,
    default: localhost,
};

/// `jobmanager.rpc.port`: the job manager's RPC port.
pub const JOBMANAGER_RPC_PORT: ConfigOption<u16> = ConfigOption {
    key: "jobmanager.rpc.port",
    fallback_keys: &[],
    default_description: "6123",
    description: "rpc port of the job manager",
    parse: port,
    default: || 6123,
};

/// `jobmanager.bind-host`: the local address the JobManager listens on for TaskManagers;
/// `None` means `jobmanager.rpc.address`.
pub const JOBMANAGER_BIND_HOST: ConfigOption<Option<String>> = ConfigOption {
    key: "jobmanager.bind-host",
    fallback_keys: &[],
    default_description: "jobmanager.rpc.address",
    description: "local address the job manager listens on for task managers (0.0.0.0: every interface); it still advertises jobmanager.rpc.address",
    parse: optional_string,
    default: || None,
};

/// `taskmanager.host`: the address a TaskManager advertises to its peers; `None` means the
/// local address of its connection to the JobManager.
pub const TASKMANAGER_HOST: ConfigOption<Option<String>> = ConfigOption {
    key: "taskmanager.host",
    fallback_keys: &[],
    default_description: "the local address of its connection to the job manager",
    description: "address other task managers reach this task manager's data port at",
    parse: optional_string,
    default: || None,
};

/// `taskmanager.bind-host`: where a TaskManager's data server listens; `None` means the
/// address it advertises.
pub const TASKMANAGER_BIND_HOST: ConfigOption<Option<String>> = ConfigOption {
    key: "taskmanager.bind-host",
    fallback_keys: &[],
    default_description: "taskmanager.host",
    description: "local address the task manager's data server listens on (0.0.0.0: every interface)",
    parse: optional_string,
    default: || None,
};

/// `taskmanager.data.port`: the data server's port; 0 picks any free port.
pub const TASKMANAGER_DATA_PORT: ConfigOption<u16> = ConfigOption {
    key: "taskmanager.data.port",
    fallback_keys: &[],
    default_description: "0",
    description: "port of the task manager's data server, for channels between task managers (0 picks a free port)",
    parse: port,
    default: || 0,
};

/// `taskmanager.numberOfTaskSlots`: parallel slots offered by each task manager.
pub const TASKMANAGER_NUMBER_OF_TASK_SLOTS: ConfigOption<u32> = ConfigOption {
    key: "taskmanager.numberOfTaskSlots",
    fallback_keys: &[],
    default_description: "1",
    description: "number of task slots each task manager offers",
    parse: positive_u32,
    default: || 1,
};

/// `taskmanager.memory.process.size`: the most memory a TaskManager process may hold; `None`
/// for no limit.
pub const TASKMANAGER_MEMORY_PROCESS_SIZE: ConfigOption<Option<usize>> = ConfigOption {
    key: "taskmanager.memory.process.size",
    fallback_keys: &[],
    default_description: "none (no limit)",
    description: "the most resident memory a TaskManager process (weir taskmanager, and those weir cluster start starts) may hold: above it, its subtasks fail with an error naming the limit, and the job restarts as its restart strategy says, instead of the kernel's OOM killer ending the process",
    parse: |text| memory_size(text).map(Some),
    default: || None,
};

/// `execution.checkpointing.interval`: time between checkpoints; `None` disables them.
pub const CHECKPOINTING_INTERVAL: ConfigOption<Option<Duration>> = ConfigOption {
    key: "execution.checkpointing.interval",
    fallback_keys: &[],
    default_description: "none (checkpointing off)",
    description: "interval between checkpoints; 'none' disables checkpointing",
    parse: parse_checkpoint_interval,
    default: || None,
};

/// `execution.checkpointing.mode`: exactly-once or at-least-once checkpoints.
pub const CHECKPOINTING_MODE: ConfigOption<CheckpointingMode> = ConfigOption {
    key: "execution.checkpointing.mode",
    fallback_keys: &[],
    default_description: "EXACTLY_ONCE",
    description: "checkpointing mode: EXACTLY_ONCE or AT_LEAST_ONCE",
    parse: |text| text.parse(),
    default: || CheckpointingMode::ExactlyOnce,
};

/// `execution.checkpointing.timeout`: a checkpoint not completed in this time is aborted.
pub const CHECKPOINTING_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "execution.checkpointing.timeout",
    fallback_keys: &[],
    default_description: "10min",
    description: "time after which an incomplete checkpoint is aborted",
    parse: parse_checkpoint_timeout,
    default: || Duration::from_secs(600),
};

/// `execution.checkpointing.min-pause`: minimum time between the end of one checkpoint and
/// the start of the next.
pub const CHECKPOINTING_MIN_PAUSE: ConfigOption<Duration> = ConfigOption {
    key: "execution.checkpointing.min-pause",
    fallback_keys: &[],
    default_description: "0ms",
    description: "minimal pause between the end of a checkpoint and the start of the next",
    parse: parse_any_duration,
    default: || Duration::ZERO,
};

/// `execution.checkpointing.max-concurrent-checkpoints`: checkpoints allowed in flight.
pub const CHECKPOINTING_MAX_CONCURRENT: ConfigOption<u32> = ConfigOption {
    key: "execution.checkpointing.max-concurrent-checkpoints",
    fallback_keys: &[],
    default_description: "1",
    description: "maximum number of checkpoints in progress at the same time",
    parse: positive_u32,
    default: || 1,
};

/// `execution.checkpointing.tolerable-failed-checkpoints`: consecutive checkpoint failures
/// tolerated before the job fails.
pub const CHECKPOINTING_TOLERABLE_FAILED: ConfigOption<u32> = ConfigOption {
    key: "execution.checkpointing.tolerable-failed-checkpoints",
    fallback_keys: &[],
    default_description: "0",
    description: "number of consecutive checkpoint failures tolerated before the job fails",
    parse: non_negative_u32,
    default: || 0,
};

/// `execution.checkpointing.unaligned.enabled`: barriers overtake queued records, which are
/// snapshotted as in-flight state (Flink's unaligned checkpoints).
pub const CHECKPOINTING_UNALIGNED: ConfigOption<bool> = ConfigOption {
    key: "execution.checkpointing.unaligned.enabled",
    fallback_keys: &["execution.checkpointing.unaligned"],
    default_description: "false",
    description: "unaligned checkpoints (exactly-once only): a barrier overtakes the records queued before it and a subtask snapshots at its first notice, recording those records as in-flight state, so backpressure does not hold checkpoints back; savepoints stay aligned",
    parse: boolean,
    default: || false,
};

/// `execution.checkpointing.incremental`: checkpoints write only the key groups that changed
/// since the previous completed checkpoint.
pub const CHECKPOINTING_INCREMENTAL: ConfigOption<bool> = ConfigOption {
    key: "execution.checkpointing.incremental",
    fallback_keys: &["state.backend.incremental"],
    default_description: "false",
    description: "incremental checkpoints: write only the key groups changed since the last completed checkpoint and share the rest (in <checkpoint dir>/<job id>/shared/)",
    parse: boolean,
    default: || false,
};

/// `execution.checkpointing.incremental.materialize-every`: each key group is written whole
/// again once every n checkpoints of its subtask, staggered across key groups.
pub const CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY: ConfigOption<u32> = ConfigOption {
    key: "execution.checkpointing.incremental.materialize-every",
    fallback_keys: &[],
    default_description: "10",
    description: "with incremental checkpoints, each key group is written whole again once every n checkpoints of its subtask (periodic materialization, spread so that each checkpoint rewrites about 1/n of the state), so old shared files are released and chains stay short",
    parse: positive_u32,
    default: || 10,
};

/// `execution.state-recovery.claim-mode`: who owns the snapshot a job starts from.
pub const STATE_RECOVERY_CLAIM_MODE: ConfigOption<ClaimMode> = ConfigOption {
    key: "execution.state-recovery.claim-mode",
    fallback_keys: &["execution.savepoint-restore-mode"],
    default_description: "NO_CLAIM",
    description: "CLAIM: the restored checkpoint becomes the job's and is disposed once subsumed; NO_CLAIM: it stays the user's and is never touched",
    parse: |text| text.parse(),
    default: || ClaimMode::NoClaim,
};

/// `state.checkpoints.num-retained`: completed checkpoints kept.
pub const CHECKPOINTS_NUM_RETAINED: ConfigOption<u32> = ConfigOption {
    key: "state.checkpoints.num-retained",
    fallback_keys: &["execution.checkpointing.num-retained"],
    default_description: "1",
    description: "number of completed checkpoints to retain",
    parse: positive_u32,
    default: || 1,
};

/// `state.checkpoints.dir`: where checkpoints are written (object-store URL or path).
pub const CHECKPOINTS_DIR: ConfigOption<Option<String>> = ConfigOption {
    key: "state.checkpoints.dir",
    fallback_keys: &["execution.checkpointing.dir"],
    default_description: "none",
    description: "directory or object-store url for checkpoint data",
    parse: optional_string,
    default: || None,
};

/// `state.savepoints.dir`: default target directory for savepoints.
pub const SAVEPOINTS_DIR: ConfigOption<Option<String>> = ConfigOption {
    key: "state.savepoints.dir",
    fallback_keys: &["execution.checkpointing.savepoint-dir"],
    default_description: "none",
    description: "default directory or object-store url for savepoints",
    parse: optional_string,
    default: || None,
};

/// `state.backend.type`: the keyed state backend.
pub const STATE_BACKEND_TYPE: ConfigOption<StateBackendType> = ConfigOption {
    key: "state.backend.type",
    fallback_keys: &["state.backend"],
    default_description: "hashmap",
    description: "state backend for keyed state: hashmap (in memory), spillable (hash maps, cold key groups spilled to a local LSM store), fjall (every entry in a local LSM store, the ones in use cached)",
    parse: |text| text.parse(),
    default: || StateBackendType::HashMap,
};

/// `state.backend.spillable.memory`: resident keyed state of the process before the
/// `spillable` backend spills key groups.
pub const STATE_BACKEND_SPILLABLE_MEMORY: ConfigOption<usize> = ConfigOption {
    key: "state.backend.spillable.memory",
    fallback_keys: &[],
    default_description: "256mb",
    description: "with state.backend.type spillable: the estimated memory of key groups kept in hash maps by all subtasks of the process; beyond it, key groups are spilled to io.tmp.dirs",
    parse: memory_size,
    default: || 256 << 20,
};

/// `state.backend.fjall.memory`: cached entries of the process's `fjall` backends.
pub const STATE_BACKEND_FJALL_MEMORY: ConfigOption<usize> = ConfigOption {
    key: "state.backend.fjall.memory",
    fallback_keys: &[],
    default_description: "256mb",
    description: "with state.backend.type fjall: the estimated memory of the entries all subtasks of the process cache in hash maps; every entry is in the LSM store under io.tmp.dirs, and its block cache (32 MiB) and memtables (up to 64 MiB) per keyed operator subtask come on top",
    parse: memory_size,
    default: || 256 << 20,
};

/// `io.tmp.dirs`: local directories for scratch data (the spillable backend's store); the
/// first is used.
pub const IO_TMP_DIRS: ConfigOption<Option<String>> = ConfigOption {
    key: "io.tmp.dirs",
    fallback_keys: &[],
    default_description: "the system's temporary directory",
    description: "local directories for scratch data (the spillable and fjall backends' stores), separated by ',' or ':'; the first is used",
    parse: |text| Ok(Some(text.trim().to_string())),
    default: || None,
};

/// `restart-strategy.type`: how failed jobs restart; `None` means decide later from whether
/// checkpointing is enabled (Flink's rule).
pub const RESTART_STRATEGY_TYPE: ConfigOption<Option<RestartStrategyType>> = ConfigOption {
    key: "restart-strategy.type",
    fallback_keys: &["restart-strategy"],
    default_description: "none set (exponential-delay with checkpointing, otherwise none)",
    description: "restart strategy: none, fixed-delay, failure-rate or exponential-delay",
    parse: parse_restart_strategy,
    default: || None,
};

/// `restart-strategy.fixed-delay.attempts`: restarts before the job fails.
pub const RESTART_FIXED_DELAY_ATTEMPTS: ConfigOption<u32> = ConfigOption {
    key: "restart-strategy.fixed-delay.attempts",
    fallback_keys: &[],
    default_description: "1",
    description: "number of restart attempts of the fixed-delay strategy",
    parse: non_negative_u32,
    default: || 1,
};

/// `restart-strategy.fixed-delay.delay`: wait between two restart attempts.
pub const RESTART_FIXED_DELAY_DELAY: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.fixed-delay.delay",
    fallback_keys: &[],
    default_description: "1s",
    description: "delay between restart attempts of the fixed-delay strategy",
    parse: parse_any_duration,
    default: || Duration::from_secs(1),
};

/// `restart-strategy.failure-rate.max-failures-per-interval`: failures tolerated per interval.
pub const RESTART_FAILURE_RATE_MAX_FAILURES: ConfigOption<u32> = ConfigOption {
    key: "restart-strategy.failure-rate.max-failures-per-interval",
    fallback_keys: &[],
    default_description: "1",
    description: "failures allowed within the interval before the job fails",
    parse: positive_u32,
    default: || 1,
};

/// `restart-strategy.failure-rate.failure-rate-interval`: the window failures are counted in.
pub const RESTART_FAILURE_RATE_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.failure-rate.failure-rate-interval",
    fallback_keys: &[],
    default_description: "1min",
    description: "time window for counting failures of the failure-rate strategy",
    parse: parse_positive_duration,
    default: || Duration::from_secs(60),
};

/// `restart-strategy.failure-rate.delay`: wait between two restart attempts.
pub const RESTART_FAILURE_RATE_DELAY: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.failure-rate.delay",
    fallback_keys: &[],
    default_description: "1s",
    description: "delay between restart attempts of the failure-rate strategy",
    parse: parse_any_duration,
    default: || Duration::from_secs(1),
};

/// `restart-strategy.exponential-delay.initial-backoff`: the first restart delay.
pub const RESTART_EXPONENTIAL_INITIAL_BACKOFF: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.exponential-delay.initial-backoff",
    fallback_keys: &[],
    default_description: "1s",
    description: "first restart delay of the exponential-delay strategy",
    parse: parse_any_duration,
    default: || Duration::from_secs(1),
};

/// `restart-strategy.exponential-delay.max-backoff`: the largest restart delay.
pub const RESTART_EXPONENTIAL_MAX_BACKOFF: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.exponential-delay.max-backoff",
    fallback_keys: &[],
    default_description: "1min",
    description: "largest restart delay of the exponential-delay strategy",
    parse: parse_any_duration,
    default: || Duration::from_secs(60),
};

/// `restart-strategy.exponential-delay.backoff-multiplier`: growth factor of the delay.
pub const RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER: ConfigOption<f64> = ConfigOption {
    key: "restart-strategy.exponential-delay.backoff-multiplier",
    fallback_keys: &[],
    default_description: "1.5",
    description: "factor the restart delay grows by after each failure",
    parse: parse_backoff_multiplier,
    default: || 1.5,
};

/// `restart-strategy.exponential-delay.reset-backoff-threshold`: failure-free run time after
/// which the delay resets to the initial backoff.
pub const RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.exponential-delay.reset-backoff-threshold",
    fallback_keys: &[],
    default_description: "1h",
    description: "failure-free time after which the restart delay resets",
    parse: parse_any_duration,
    default: || Duration::from_secs(3600),
};

/// `restart-strategy.exponential-delay.jitter-factor`: random spread applied to each delay.
pub const RESTART_EXPONENTIAL_JITTER_FACTOR: ConfigOption<f64> = ConfigOption {
    key: "restart-strategy.exponential-delay.jitter-factor",
    fallback_keys: &[],
    default_description: "0.1",
    description: "relative random jitter applied to each restart delay (0.0 to 1.0)",
    parse: parse_jitter_factor,
    default: || 0.1,
};

/// `restart-strategy.exponential-delay.attempts-before-reset-backoff`: restarts allowed before
/// the backoff resets; `None` means unlimited.
pub const RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET: ConfigOption<Option<u32>> = ConfigOption {
    key: "restart-strategy.exponential-delay.attempts-before-reset-backoff",
    fallback_keys: &[],
    default_description: "none (unlimited)",
    description: "restart attempts allowed before the backoff resets",
    parse: parse_optional_attempts,
    default: || None,
};

/// `jobmanager.execution.failover-strategy`: restart the failed region or the whole job.
pub const FAILOVER_STRATEGY: ConfigOption<FailoverStrategy> = ConfigOption {
    key: "jobmanager.execution.failover-strategy",
    fallback_keys: &[],
    default_description: "region",
    description: "which tasks restart after a failure: region or full",
    parse: |text| text.parse(),
    default: || FailoverStrategy::Region,
};

/// `heartbeat.interval`: time between heartbeat requests.
pub const HEARTBEAT_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "heartbeat.interval",
    fallback_keys: &[],
    default_description: "10s",
    description: "time between heartbeat requests",
    parse: parse_positive_duration,
    default: || Duration::from_secs(10),
};

/// `heartbeat.timeout`: time without heartbeat after which a peer is considered lost.
pub const HEARTBEAT_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "heartbeat.timeout",
    fallback_keys: &[],
    default_description: "50s",
    description: "time without a heartbeat after which a peer is considered dead",
    parse: parse_positive_duration,
    default: || Duration::from_secs(50),
};

/// `high-availability.type`: the high-availability service: `none` or `etcd`.
pub const HIGH_AVAILABILITY_TYPE: ConfigOption<HighAvailabilityType> = ConfigOption {
    key: "high-availability.type",
    fallback_keys: &["high-availability"],
    default_description: "none",
    description: "high-availability mode: 'none', 'etcd' (standby JobManagers, leader election and recoverable jobs on etcd) or 'kubernetes' (the same on a ConfigMap of the Kubernetes cluster the JobManagers run in)",
    parse: |text| text.parse(),
    default: || HighAvailabilityType::None,
};

/// `high-availability.storageDir`: where high-availability metadata is stored.
pub const HIGH_AVAILABILITY_STORAGE_DIR: ConfigOption<Option<String>> = ConfigOption {
    key: "high-availability.storageDir",
    fallback_keys: &[],
    default_description: "none",
    description: "directory or object-store url for high-availability metadata",
    parse: optional_string,
    default: || None,
};

/// `high-availability.cluster-id`: the prefix of everything the cluster keeps in etcd and in
/// the HA storage directory (clusters sharing an etcd need their own).
pub const HIGH_AVAILABILITY_CLUSTER_ID: ConfigOption<String> = ConfigOption {
    key: "high-availability.cluster-id",
    fallback_keys: &["kubernetes.cluster-id"],
    default_description: "default",
    description: "id of the cluster in etcd and in high-availability.storageDir",
    parse: parse_cluster_id,
    default: || "default".to_string(),
};

/// `high-availability.etcd.endpoints`: the etcd cluster, comma-separated.
pub const HIGH_AVAILABILITY_ETCD_ENDPOINTS: ConfigOption<Vec<String>> = ConfigOption {
    key: "high-availability.etcd.endpoints",
    fallback_keys: &[],
    default_description: "http://127.0.0.1:2379",
    description: "etcd endpoints (http://host:port), comma-separated",
    parse: parse_endpoints,
    default: || vec!["http://127.0.0.1:2379".to_string()],
};

/// `high-availability.etcd.lease-ttl`: the leader's lease; a dead leader is replaced about
/// this long after its death.
pub const HIGH_AVAILABILITY_ETCD_LEASE_TTL: ConfigOption<Duration> = ConfigOption {
    key: "high-availability.etcd.lease-ttl",
    fallback_keys: &[],
    default_description: "2s",
    description: "TTL of the leader's etcd lease (whole seconds, at least 2s): how soon a standby takes over from a dead leader",
    parse: parse_lease_ttl,
    default: || Duration::from_secs(2),
};

/// `high-availability.kubernetes.leader-election.lease-duration` (Flink's key): how long the
/// leader's lease in the HA ConfigMap holds without renewal.
pub const HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION: ConfigOption<Duration> = ConfigOption {
    key: "high-availability.kubernetes.leader-election.lease-duration",
    fallback_keys: &[],
    default_description: "2s",
    description: "with high-availability.type: kubernetes, how long the leader's lease holds without renewal: how soon a standby takes over from a dead leader (Flink's default is 15s; weir renews every third of it)",
    parse: parse_positive_duration,
    default: || Duration::from_secs(2),
};

/// `kubernetes.pod-template-file.taskmanager` (Flink's key): with it, a JobManager creates the
/// TaskManager pods its jobs need from this pod (native Kubernetes).
pub const KUBERNETES_POD_TEMPLATE_FILE_TASKMANAGER: ConfigOption<Option<String>> = ConfigOption {
    key: "kubernetes.pod-template-file.taskmanager",
    fallback_keys: &[],
    default_description: "none",
    description: "a Pod (YAML or JSON, with metadata.labels and a 'weir' container running `weir taskmanager`): the JobManager creates such pods for the slots its jobs need and replaces those that end (native Kubernetes; `spec.mode: native` of a WeirDeployment writes it)",
    parse: optional_string,
    default: || None,
};

/// `slotmanager.number-of-slots.min` (Flink's key): native TaskManager pods are kept for at
/// least this many slots, whether jobs need them yet or not.
pub const SLOTMANAGER_NUMBER_OF_SLOTS_MIN: ConfigOption<u32> = ConfigOption {
    key: "slotmanager.number-of-slots.min",
    fallback_keys: &[],
    default_description: "0",
    description: "with native TaskManager pods, the slots kept ready even when no job needs them (a WeirDeployment in native mode sets it to the job's parallelism, so the pods start with the JobManager)",
    parse: |text| text.trim().parse::<u32>().map_err(|_| "expected a whole number of slots, such as '4'".to_string()),
    default: || 0,
};

/// `resourcemanager.taskmanager-timeout` (Flink's key): how long native TaskManager pods stay
/// when no job needs a slot.
pub const RESOURCEMANAGER_TASKMANAGER_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "resourcemanager.taskmanager-timeout",
    fallback_keys: &[],
    default_description: "30s",
    description: "with native TaskManager pods, how long they stay when no job needs a slot",
    parse: parse_positive_duration,
    default: || Duration::from_secs(30),
};

/// `kubernetes.namespace` (Flink's key): the namespace of the HA ConfigMap and of native
/// TaskManager pods.
pub const KUBERNETES_NAMESPACE: ConfigOption<Option<String>> = ConfigOption {
    key: "kubernetes.namespace",
    fallback_keys: &[],
    default_description: "the pod's namespace",
    description: "with high-availability.type: kubernetes, the namespace of the HA ConfigMap (default: the namespace of the pod's service account, else the kubeconfig's)",
    parse: optional_string,
    default: || None,
};

/// `high-availability.reconcile-timeout`: how long a new leader waits for the TaskManagers
/// to report a running job before it restarts it from its newest checkpoint.
pub const HIGH_AVAILABILITY_RECONCILE_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "high-availability.reconcile-timeout",
    fallback_keys: &[],
    default_description: "10s",
    description: "how long a new leader waits for the TaskManagers to report a running job (RECONCILING) before it restarts the job from its newest checkpoint",
    parse: parse_positive_duration,
    default: || Duration::from_secs(10),
};

fn parse_cluster_id(text: &str) -> Result<String, String> {
    let text = text.trim();
    let valid = !text.is_empty()
        && text.len() <= 64
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !valid {
        return Err("expected 1 to 64 letters, digits, '-', '_' or '.'".to_string());
    }
    Ok(text.to_string())
}

fn parse_endpoints(text: &str) -> Result<Vec<String>, String> {
    let mut endpoints = Vec::new();
    for endpoint in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let with_scheme = if endpoint.contains("://") { endpoint.to_string() } else { format!("http://{endpoint}") };
        if !with_scheme.starts_with("http://") {
            return Err(format!("endpoint '{endpoint}': expected http://host:port (TLS to etcd is not supported)"));
        }
        endpoints.push(with_scheme);
    }
    if endpoints.is_empty() {
        return Err("expected at least one endpoint such as http://127.0.0.1:2379".to_string());
    }
    Ok(endpoints)
}

fn parse_lease_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl < Duration::from_secs(2) || ttl.subsec_nanos() != 0 {
        return Err("expected whole seconds, at least 2s (etcd's shortest lease), such as '2s'".to_string());
    }
    Ok(ttl)
}

/// Where `weir run` runs a job, Flink's `execution.target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutionTarget {
    /// On an embedded cluster in the `weir run` process.
    Local,
    /// On the standalone cluster at `rest.address:rest.port` (or `-m`).
    Remote,
}

fn execution_target(text: &str) -> Result<Option<ExecutionTarget>, String> {
    match text {
        "" => Ok(None),
        "local" => Ok(Some(ExecutionTarget::Local)),
        "remote" => Ok(Some(ExecutionTarget::Remote)),
        other => Err(format!(
            "'{other}' is not a target weir has: local (an embedded cluster in the weir run process) or remote (a standalone cluster; Kubernetes deployments go through weir operator)"
        )),
    }
}

/// `execution.target`: `local` or `remote`; `None` lets `weir run` choose (remote when an
/// address is configured).
pub const EXECUTION_TARGET: ConfigOption<Option<ExecutionTarget>> = ConfigOption {
    key: "execution.target",
    fallback_keys: &[],
    default_description: "none (remote when -m, $WEIR_JOBMANAGER, rest.address or high availability names a cluster, else local)",
    description: "where weir run runs the job: local (embedded cluster) or remote (a standalone cluster)",
    parse: execution_target,
    default: || None,
};

/// `pipeline.name`: the job name; `None` means the program chooses one.
pub const PIPELINE_NAME: ConfigOption<Option<String>> = ConfigOption {
    key: "pipeline.name",
    fallback_keys: &[],
    default_description: "none",
    description: "name of the job",
    parse: optional_string,
    default: || None,
};

/// `$internal.pipeline.job-id`: the id a submitted job takes (Flink's
/// `PipelineOptionsInternal.PIPELINE_FIXED_JOB_ID`). The deployment controller sets it, as
/// Flink's Kubernetes operator does, so the job's id (and where its checkpoints go) is known
/// before it is submitted.
pub const PIPELINE_FIXED_JOB_ID: ConfigOption<Option<String>> = ConfigOption {
    key: "$internal.pipeline.job-id",
    fallback_keys: &[],
    default_description: "none (a random id)",
    description: "the id the submitted job takes: 32 hexadecimal characters",
    parse: optional_job_id,
    default: || None,
};

/// `$internal.restore.newest-retained`: with `-s` naming a checkpoint `chk-<n>`, check the
/// restore against the newest complete `chk-<m>` (`m >= n`) beside it. The deployment
/// controller's pre-flight sets it for `run --dry-run` against a running job's newest
/// checkpoint: the job subsumes (and deletes) that one every checkpoint interval, sooner than
/// a process starts and reads it, and its successor has the same operators.
pub const RESTORE_NEWEST_RETAINED: ConfigOption<bool> = ConfigOption {
    key: "$internal.restore.newest-retained",
    fallback_keys: &[],
    default_description: "false",
    description: "with -s naming a chk-<n>, use the newest complete chk-<m> (m >= n) beside it (the deployment pre-flight against a running job)",
    parse: boolean,
    default: || false,
};

/// The shortest shared secret accepted, in bytes (as weir-runtime's security requires).
pub const INTERNAL_SECRET_BYTES_MIN: usize = 16;

fn parse_internal_secret(text: &str) -> Result<Option<String>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() < INTERNAL_SECRET_BYTES_MIN {
        return Err(format!(
            "expected at least {INTERNAL_SECRET_BYTES_MIN} characters, not {}; generate one with `openssl rand -hex 32`",
            text.len()
        ));
    }
    Ok(Some(text.to_string()))
}

fn parse_pem_store_type(text: &str) -> Result<String, String> {
    if text.eq_ignore_ascii_case("pem") {
        return Ok("PEM".to_string());
    }
    Err("expected PEM: weir reads PEM files only (convert a PKCS12 store with `openssl pkcs12 -in store.p12 -nodes -out store.pem`)".to_string())
}

/// `security.internal.secret`: the secret every JobManager and TaskManager of a cluster
/// shares; each connection on the TaskManager port and the data ports proves it
/// (challenge-response, the secret never travels).
pub const SECURITY_INTERNAL_SECRET: ConfigOption<Option<String>> = ConfigOption {
    key: "security.internal.secret",
    fallback_keys: &[],
    default_description: "none",
    description: "shared secret of the cluster's processes (at least 16 characters); every TaskManager connection proves it. Prefer security.internal.secret-file",
    parse: parse_internal_secret,
    default: || None,
};

/// `security.internal.secret-file`: a file holding the shared secret (a trailing newline
/// is ignored); keeps the secret out of command lines and configuration files.
pub const SECURITY_INTERNAL_SECRET_FILE: ConfigOption<Option<String>> = ConfigOption {
    key: "security.internal.secret-file",
    fallback_keys: &[],
    default_description: "none",
    description: "file holding the shared secret of the cluster's processes (instead of security.internal.secret)",
    parse: optional_string,
    default: || None,
};

/// `security.ssl.internal.enabled`: mutual TLS on the TaskManager port and the data ports.
pub const SECURITY_SSL_INTERNAL_ENABLED: ConfigOption<bool> = ConfigOption {
    key: "security.ssl.internal.enabled",
    fallback_keys: &[],
    default_description: "false",
    description: "mutual TLS between the cluster's processes (needs security.ssl.internal.keystore and .truststore)",
    parse: boolean,
    default: || false,
};

/// `security.ssl.internal.keystore`: a PEM file with this process's certificate chain and
/// its (unencrypted) private key.
pub const SECURITY_SSL_INTERNAL_KEYSTORE: ConfigOption<Option<String>> = ConfigOption {
    key: "security.ssl.internal.keystore",
    fallback_keys: &[],
    default_description: "none",
    description: "PEM file with this process's certificate chain and private key for internal TLS",
    parse: optional_string,
    default: || None,
};

/// `security.ssl.internal.truststore`: a PEM file with the certificates a peer's must chain
/// to.
pub const SECURITY_SSL_INTERNAL_TRUSTSTORE: ConfigOption<Option<String>> = ConfigOption {
    key: "security.ssl.internal.truststore",
    fallback_keys: &[],
    default_description: "none",
    description: "PEM file with the certificates internal TLS peers must chain to",
    parse: optional_string,
    default: || None,
};

/// `security.ssl.internal.keystore-type`: only `PEM` (Flink's JKS and PKCS12 are refused).
pub const SECURITY_SSL_INTERNAL_KEYSTORE_TYPE: ConfigOption<String> = ConfigOption {
    key: "security.ssl.internal.keystore-type",
    fallback_keys: &[],
    default_description: "PEM",
    description: "format of security.ssl.internal.keystore: PEM",
    parse: parse_pem_store_type,
    default: || "PEM".to_string(),
};

/// `security.ssl.internal.truststore-type`: only `PEM`.
pub const SECURITY_SSL_INTERNAL_TRUSTSTORE_TYPE: ConfigOption<String> = ConfigOption {
    key: "security.ssl.internal.truststore-type",
    fallback_keys: &[],
    default_description: "PEM",
    description: "format of security.ssl.internal.truststore: PEM",
    parse: parse_pem_store_type,
    default: || "PEM".to_string(),
};

fn parse_optional_duration(text: &str) -> Result<Option<Duration>, String> {
    if is_none_word(text) {
        return Ok(None);
    }
    duration_at_least(text, Duration::from_millis(1)).map(Some)
}

// The deployment controller (`weir operator`) takes the Flink Kubernetes Operator's keys, in
// its own configuration or a deployment's `spec.configuration` (which wins).

/// Roll a deployment back to its last stable spec when an upgrade does not get ready.
pub const OPERATOR_ROLLBACK_ENABLED: ConfigOption<bool> = ConfigOption {
    key: "kubernetes.operator.deployment.rollback.enabled",
    fallback_keys: &[],
    default_description: "false",
    description: "roll a deployment back to its last stable spec when the new spec is not running within the readiness timeout",
    parse: boolean,
    default: || false,
};

/// How long a new spec has to get its job running before it counts as failed.
pub const OPERATOR_READINESS_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "kubernetes.operator.deployment.readiness.timeout",
    fallback_keys: &[],
    default_description: "5min",
    description: "how long a deployed spec may take to get its job running (every subtask RUNNING, a checkpoint completed when checkpointing is on) before a rollback",
    parse: parse_positive_duration,
    default: || Duration::from_secs(300),
};

/// Savepoint history entries kept per deployment.
pub const OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT: ConfigOption<u32> = ConfigOption {
    key: "kubernetes.operator.savepoint.history.max.count",
    fallback_keys: &[],
    default_description: "10",
    description: "savepoints kept in a deployment's history; older ones are disposed (the newest is always kept)",
    parse: positive_u32,
    default: || 10,
};

/// Age beyond which savepoint history entries are disposed.
pub const OPERATOR_SAVEPOINT_HISTORY_MAX_AGE: ConfigOption<Duration> = ConfigOption {
    key: "kubernetes.operator.savepoint.history.max.age",
    fallback_keys: &[],
    default_description: "1d",
    description: "savepoints older than this are disposed from a deployment's history (the newest is always kept)",
    parse: parse_positive_duration,
    default: || Duration::from_secs(24 * 3600),
};

/// Upgrade a job that is not running from its newest checkpoint.
pub const OPERATOR_LAST_STATE_FALLBACK: ConfigOption<bool> = ConfigOption {
    key: "kubernetes.operator.job.upgrade.last-state-fallback.enabled",
    fallback_keys: &[],
    default_description: "true",
    description: "in savepoint mode, upgrade a job that is not running from its newest completed checkpoint instead of waiting",
    parse: boolean,
    default: || true,
};

/// Interval of periodic savepoints; none by default.
pub const OPERATOR_PERIODIC_SAVEPOINT_INTERVAL: ConfigOption<Option<Duration>> = ConfigOption {
    key: "kubernetes.operator.periodic.savepoint.interval",
    fallback_keys: &[],
    default_description: "none",
    description: "take a savepoint of each running deployment this often (history trigger type PERIODIC)",
    parse: parse_optional_duration,
    default: || None,
};

/// Redeploy a deployment whose JobManager is gone.
pub const OPERATOR_JM_DEPLOYMENT_RECOVERY: ConfigOption<bool> = ConfigOption {
    key: "kubernetes.operator.jm-deployment-recovery.enabled",
    fallback_keys: &[],
    default_description: "true",
    description: "when a deployment's JobManager processes are gone, start its cluster again and its job from the newest completed checkpoint",
    parse: boolean,
    default: || true,
};

/// How long an operator replica on Kubernetes holds its Lease without renewing it.
pub const OPERATOR_LEASE_DURATION: ConfigOption<Duration> = ConfigOption {
    key: "kubernetes.operator.leader-election.lease-duration",
    fallback_keys: &[],
    default_description: "15s",
    description: "how long the Lease of `weir operator --kubernetes` holds without renewal; a standby takes over after it (at once when the leader stops gracefully). The leader stops acting two thirds of it after its last renewal",
    parse: parse_positive_duration,
    default: || Duration::from_secs(15),
};

/// How often `weir operator --kubernetes` looks at deployments at rest with no change.
pub const OPERATOR_RECONCILE_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "kubernetes.operator.reconcile.interval",
    fallback_keys: &[],
    default_description: "1s",
    description: "how often `weir operator --kubernetes` reconciles deployments that are at rest: a change to a WeirDeployment or to a pod of its clusters wakes it at once through a watch, and a deployment mid-upgrade is followed every 100 ms; this resync notices what no watch reports (a job failing inside a running JobManager). Flink's operator: 60s",
    parse: parse_positive_duration,
    default: || Duration::from_secs(1),
};

/// Where `weir operator` serves `/deployments` and its Web UI page.
pub const OPERATOR_REST_PORT: ConfigOption<u16> = ConfigOption {
    key: "operator.rest.port",
    fallback_keys: &[],
    default_description: "8085",
    description: "port of the deployment controller's REST API (/deployments) and Web UI, on rest.address; 0 takes any free port",
    parse: port,
    default: || 8085,
};

/// Every known option, in the order of [`ALL_KEYS`].
pub const ALL: &[OptionInfo] = &[
    PARALLELISM_DEFAULT.info(),
    PIPELINE_MAX_PARALLELISM.info(),
    PIPELINE_AUTO_WATERMARK_INTERVAL.info(),
    REST_ADDRESS.info(),
    REST_PORT.info(),
    REST_BIND_ADDRESS.info(),
    REST_RETRY_MAX_ATTEMPTS.info(),
    REST_RETRY_DELAY.info(),
    JOBMANAGER_RPC_ADDRESS.info(),
    JOBMANAGER_RPC_PORT.info(),
    JOBMANAGER_BIND_HOST.info(),
    TASKMANAGER_HOST.info(),
    TASKMANAGER_BIND_HOST.info(),
    TASKMANAGER_DATA_PORT.info(),
    TASKMANAGER_NUMBER_OF_TASK_SLOTS.info(),
    TASKMANAGER_MEMORY_PROCESS_SIZE.info(),
    CHECKPOINTING_INTERVAL.info(),
    CHECKPOINTING_MODE.info(),
    CHECKPOINTING_TIMEOUT.info(),
    CHECKPOINTING_MIN_PAUSE.info(),
    CHECKPOINTING_MAX_CONCURRENT.info(),
    CHECKPOINTING_TOLERABLE_FAILED.info(),
    CHECKPOINTS_NUM_RETAINED.info(),
    CHECKPOINTING_UNALIGNED.info(),
    CHECKPOINTING_INCREMENTAL.info(),
    CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY.info(),
    STATE_RECOVERY_CLAIM_MODE.info(),
    CHECKPOINTS_DIR.info(),
    SAVEPOINTS_DIR.info(),
    STATE_BACKEND_TYPE.info(),
    STATE_BACKEND_SPILLABLE_MEMORY.info(),
    STATE_BACKEND_FJALL_MEMORY.info(),
    IO_TMP_DIRS.info(),
    RESTART_STRATEGY_TYPE.info(),
    RESTART_FIXED_DELAY_ATTEMPTS.info(),
    RESTART_FIXED_DELAY_DELAY.info(),
    RESTART_FAILURE_RATE_MAX_FAILURES.info(),
    RESTART_FAILURE_RATE_INTERVAL.info(),
    RESTART_FAILURE_RATE_DELAY.info(),
    RESTART_EXPONENTIAL_INITIAL_BACKOFF.info(),
    RESTART_EXPONENTIAL_MAX_BACKOFF.info(),
    RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER.info(),
    RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD.info(),
    RESTART_EXPONENTIAL_JITTER_FACTOR.info(),
    RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET.info(),
    FAILOVER_STRATEGY.info(),
    HEARTBEAT_INTERVAL.info(),
    HEARTBEAT_TIMEOUT.info(),
    HIGH_AVAILABILITY_TYPE.info(),
    HIGH_AVAILABILITY_STORAGE_DIR.info(),
    HIGH_AVAILABILITY_CLUSTER_ID.info(),
    HIGH_AVAILABILITY_ETCD_ENDPOINTS.info(),
    HIGH_AVAILABILITY_ETCD_LEASE_TTL.info(),
    HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION.info(),
    KUBERNETES_NAMESPACE.info(),
    KUBERNETES_POD_TEMPLATE_FILE_TASKMANAGER.info(),
    RESOURCEMANAGER_TASKMANAGER_TIMEOUT.info(),
    SLOTMANAGER_NUMBER_OF_SLOTS_MIN.info(),
    HIGH_AVAILABILITY_RECONCILE_TIMEOUT.info(),
    PIPELINE_NAME.info(),
    EXECUTION_TARGET.info(),
    PIPELINE_FIXED_JOB_ID.info(),
    RESTORE_NEWEST_RETAINED.info(),
    SECURITY_INTERNAL_SECRET.info(),
    SECURITY_INTERNAL_SECRET_FILE.info(),
    SECURITY_SSL_INTERNAL_ENABLED.info(),
    SECURITY_SSL_INTERNAL_KEYSTORE.info(),
    SECURITY_SSL_INTERNAL_TRUSTSTORE.info(),
    SECURITY_SSL_INTERNAL_KEYSTORE_TYPE.info(),
    SECURITY_SSL_INTERNAL_TRUSTSTORE_TYPE.info(),
    OPERATOR_ROLLBACK_ENABLED.info(),
    OPERATOR_READINESS_TIMEOUT.info(),
    OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT.info(),
    OPERATOR_SAVEPOINT_HISTORY_MAX_AGE.info(),
    OPERATOR_LAST_STATE_FALLBACK.info(),
    OPERATOR_PERIODIC_SAVEPOINT_INTERVAL.info(),
    OPERATOR_JM_DEPLOYMENT_RECOVERY.info(),
    OPERATOR_LEASE_DURATION.info(),
    OPERATOR_RECONCILE_INTERVAL.info(),
    OPERATOR_REST_PORT.info(),
];

/// The key of every known option (fallback names not included; see [`is_known_key`]).
pub const ALL_KEYS: &[&str] = &[
    PARALLELISM_DEFAULT.key,
    PIPELINE_MAX_PARALLELISM.key,
    PIPELINE_AUTO_WATERMARK_INTERVAL.key,
    REST_ADDRESS.key,
    REST_PORT.key,
    REST_BIND_ADDRESS.key,
    REST_RETRY_MAX_ATTEMPTS.key,
    REST_RETRY_DELAY.key,
    JOBMANAGER_RPC_ADDRESS.key,
    JOBMANAGER_RPC_PORT.key,
    JOBMANAGER_BIND_HOST.key,
    TASKMANAGER_HOST.key,
    TASKMANAGER_BIND_HOST.key,
    TASKMANAGER_DATA_PORT.key,
    TASKMANAGER_NUMBER_OF_TASK_SLOTS.key,
    TASKMANAGER_MEMORY_PROCESS_SIZE.key,
    CHECKPOINTING_INTERVAL.key,
    CHECKPOINTING_MODE.key,
    CHECKPOINTING_TIMEOUT.key,
    CHECKPOINTING_MIN_PAUSE.key,
    CHECKPOINTING_MAX_CONCURRENT.key,
    CHECKPOINTING_TOLERABLE_FAILED.key,
    CHECKPOINTS_NUM_RETAINED.key,
    CHECKPOINTING_UNALIGNED.key,
    CHECKPOINTING_INCREMENTAL.key,
    CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY.key,
    STATE_RECOVERY_CLAIM_MODE.key,
    CHECKPOINTS_DIR.key,
    SAVEPOINTS_DIR.key,
    STATE_BACKEND_TYPE.key,
    STATE_BACKEND_SPILLABLE_MEMORY.key,
    STATE_BACKEND_FJALL_MEMORY.key,
    IO_TMP_DIRS.key,
    RESTART_STRATEGY_TYPE.key,
    RESTART_FIXED_DELAY_ATTEMPTS.key,
    RESTART_FIXED_DELAY_DELAY.key,
    RESTART_FAILURE_RATE_MAX_FAILURES.key,
    RESTART_FAILURE_RATE_INTERVAL.key,
    RESTART_FAILURE_RATE_DELAY.key,
    RESTART_EXPONENTIAL_INITIAL_BACKOFF.key,
    RESTART_EXPONENTIAL_MAX_BACKOFF.key,
    RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER.key,
    RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD.key,
    RESTART_EXPONENTIAL_JITTER_FACTOR.key,
    RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET.key,
    FAILOVER_STRATEGY.key,
    HEARTBEAT_INTERVAL.key,
    HEARTBEAT_TIMEOUT.key,
    HIGH_AVAILABILITY_TYPE.key,
    HIGH_AVAILABILITY_STORAGE_DIR.key,
    HIGH_AVAILABILITY_CLUSTER_ID.key,
    HIGH_AVAILABILITY_ETCD_ENDPOINTS.key,
    HIGH_AVAILABILITY_ETCD_LEASE_TTL.key,
    HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION.key,
    KUBERNETES_NAMESPACE.key,
    KUBERNETES_POD_TEMPLATE_FILE_TASKMANAGER.key,
    RESOURCEMANAGER_TASKMANAGER_TIMEOUT.key,
    SLOTMANAGER_NUMBER_OF_SLOTS_MIN.key,
    HIGH_AVAILABILITY_RECONCILE_TIMEOUT.key,
    PIPELINE_NAME.key,
    EXECUTION_TARGET.key,
    PIPELINE_FIXED_JOB_ID.key,
    RESTORE_NEWEST_RETAINED.key,
    SECURITY_INTERNAL_SECRET.key,
    SECURITY_INTERNAL_SECRET_FILE.key,
    SECURITY_SSL_INTERNAL_ENABLED.key,
    SECURITY_SSL_INTERNAL_KEYSTORE.key,
    SECURITY_SSL_INTERNAL_TRUSTSTORE.key,
    SECURITY_SSL_INTERNAL_KEYSTORE_TYPE.key,
    SECURITY_SSL_INTERNAL_TRUSTSTORE_TYPE.key,
    OPERATOR_ROLLBACK_ENABLED.key,
    OPERATOR_READINESS_TIMEOUT.key,
    OPERATOR_SAVEPOINT_HISTORY_MAX_COUNT.key,
    OPERATOR_SAVEPOINT_HISTORY_MAX_AGE.key,
    OPERATOR_LAST_STATE_FALLBACK.key,
    OPERATOR_PERIODIC_SAVEPOINT_INTERVAL.key,
    OPERATOR_JM_DEPLOYMENT_RECOVERY.key,
    OPERATOR_LEASE_DURATION.key,
    OPERATOR_RECONCILE_INTERVAL.key,
    OPERATOR_REST_PORT.key,
];

/// Whether `key` names a known option, under its main or a fallback name.
pub fn is_known_key(key: &str) -> bool {
    find(key).is_some()
}

/// The option known under `key` (its main or a fallback name).
pub fn find(key: &str) -> Option<&'static OptionInfo> {
    ALL.iter().find(|info| info.key == key || info.fallback_keys.contains(&key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_and_all_keys_agree() {
        assert_eq!(ALL.len(), ALL_KEYS.len());
        for (info, key) in ALL.iter().zip(ALL_KEYS) {
            assert_eq!(info.key, *key);
        }
    }

    #[test]
    fn keys_are_unique_across_main_and_fallback_names() {
        let mut names = Vec::new();
        for info in ALL {
            names.push(info.key);
            names.extend_from_slice(info.fallback_keys);
        }
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }

    #[test]
    fn find_accepts_fallback_names() {
        assert_eq!(find("execution.checkpointing.dir").map(|info| info.key), Some("state.checkpoints.dir"));
        assert!(is_known_key("parallelism.default"));
        assert!(!is_known_key("paralelism.default"));
    }

    #[test]
    fn documented_defaults_match_default_values() {
        use crate::duration::format_duration;
        assert_eq!((PARALLELISM_DEFAULT.default)().to_string(), PARALLELISM_DEFAULT.default_description);
        assert_eq!((REST_PORT.default)().to_string(), REST_PORT.default_description);
        assert_eq!((JOBMANAGER_RPC_PORT.default)().to_string(), JOBMANAGER_RPC_PORT.default_description);
        assert_eq!((REST_ADDRESS.default)(), REST_ADDRESS.default_description);
        let durations = [
            CHECKPOINTING_TIMEOUT,
            CHECKPOINTING_MIN_PAUSE,
            RESTART_FIXED_DELAY_DELAY,
            RESTART_FAILURE_RATE_INTERVAL,
            RESTART_FAILURE_RATE_DELAY,
            RESTART_EXPONENTIAL_INITIAL_BACKOFF,
            RESTART_EXPONENTIAL_MAX_BACKOFF,
            RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD,
            HEARTBEAT_INTERVAL,
            HEARTBEAT_TIMEOUT,
        ];
        for option in durations {
            assert_eq!(format_duration((option.default)()), option.default_description, "{}", option.key);
            // The documented default must itself be a valid value.
            assert_eq!((option.parse)(option.default_description), Ok((option.default)()), "{}", option.key);
        }
    }
}
