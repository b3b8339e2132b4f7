//! Tests of loading, precedence, typed access, warnings and validation.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::options::*;
use crate::values::{CheckpointingMode, FailoverStrategy, HighAvailabilityType, RestartStrategyType, StateBackendType};

fn overrides(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| item.to_string()).collect()
}

fn with_overrides(items: &[&str]) -> Configuration {
    match Configuration::load(None, &overrides(items)) {
        Ok(config) => config,
        Err(error) => panic!("load failed: {error}"),
    }
}

/// Writes `text` to `config.yaml` in a fresh temporary directory.
fn yaml_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

#[test]
fn defaults_when_nothing_is_set() {
    let config = Configuration::new();
    assert!(config.is_empty());
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 1);
    assert_eq!(config.get(&PIPELINE_MAX_PARALLELISM).unwrap(), None);
    assert_eq!(config.get(&REST_ADDRESS).unwrap(), "127.0.0.1");
    assert_eq!(config.get(&REST_PORT).unwrap(), 8081);
    assert_eq!(config.get(&REST_BIND_ADDRESS).unwrap(), None);
    assert_eq!(config.get(&JOBMANAGER_RPC_ADDRESS).unwrap(), "127.0.0.1");
    assert_eq!(config.get(&JOBMANAGER_RPC_PORT).unwrap(), 6123);
    assert_eq!(config.get(&TASKMANAGER_NUMBER_OF_TASK_SLOTS).unwrap(), 1);
    assert_eq!(config.get(&CHECKPOINTING_INTERVAL).unwrap(), None);
    assert_eq!(config.get(&CHECKPOINTING_MODE).unwrap(), CheckpointingMode::ExactlyOnce);
    assert_eq!(config.get(&CHECKPOINTING_TIMEOUT).unwrap(), Duration::from_secs(600));
    assert_eq!(config.get(&CHECKPOINTING_MIN_PAUSE).unwrap(), Duration::ZERO);
    assert_eq!(config.get(&CHECKPOINTING_MAX_CONCURRENT).unwrap(), 1);
    assert_eq!(config.get(&CHECKPOINTING_TOLERABLE_FAILED).unwrap(), 0);
    assert_eq!(config.get(&CHECKPOINTS_NUM_RETAINED).unwrap(), 1);
    assert_eq!(config.get(&CHECKPOINTS_DIR).unwrap(), None);
    assert_eq!(config.get(&SAVEPOINTS_DIR).unwrap(), None);
    assert_eq!(config.get(&STATE_BACKEND_TYPE).unwrap(), StateBackendType::HashMap);
    assert_eq!(config.get(&STATE_BACKEND_SPILLABLE_MEMORY).unwrap(), 256 << 20);
    assert!(!config.get(&CHECKPOINTING_INCREMENTAL).unwrap());
    assert_eq!(config.get(&CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY).unwrap(), 10);
    assert_eq!(config.get(&STATE_RECOVERY_CLAIM_MODE).unwrap(), crate::ClaimMode::NoClaim);
    assert_eq!(config.get(&RESTART_STRATEGY_TYPE).unwrap(), None);
    assert_eq!(config.get(&RESTART_FIXED_DELAY_ATTEMPTS).unwrap(), 1);
    assert_eq!(config.get(&RESTART_FIXED_DELAY_DELAY).unwrap(), Duration::from_secs(1));
    assert_eq!(config.get(&RESTART_FAILURE_RATE_MAX_FAILURES).unwrap(), 1);
    assert_eq!(config.get(&RESTART_FAILURE_RATE_INTERVAL).unwrap(), Duration::from_secs(60));
    assert_eq!(config.get(&RESTART_FAILURE_RATE_DELAY).unwrap(), Duration::from_secs(1));
    assert_eq!(config.get(&RESTART_EXPONENTIAL_INITIAL_BACKOFF).unwrap(), Duration::from_secs(1));
    assert_eq!(config.get(&RESTART_EXPONENTIAL_MAX_BACKOFF).unwrap(), Duration::from_secs(60));
    assert_eq!(config.get(&RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER).unwrap(), 1.5);
    assert_eq!(config.get(&RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD).unwrap(), Duration::from_secs(3600));
    assert_eq!(config.get(&RESTART_EXPONENTIAL_JITTER_FACTOR).unwrap(), 0.1);
    assert_eq!(config.get(&RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET).unwrap(), None);
    assert_eq!(config.get(&FAILOVER_STRATEGY).unwrap(), FailoverStrategy::Region);
    assert_eq!(config.get(&HEARTBEAT_INTERVAL).unwrap(), Duration::from_secs(10));
    assert_eq!(config.get(&HEARTBEAT_TIMEOUT).unwrap(), Duration::from_secs(50));
    assert_eq!(config.get(&HIGH_AVAILABILITY_TYPE).unwrap(), HighAvailabilityType::None);
    assert_eq!(config.get(&HIGH_AVAILABILITY_STORAGE_DIR).unwrap(), None);
    assert_eq!(config.get(&PIPELINE_NAME).unwrap(), None);
    assert!(config.validate().is_ok());
    assert!(config.warnings().is_empty());
}

#[test]
fn typed_values_parse() {
    let config = with_overrides(&[
        "parallelism.default=8",
        "pipeline.max-parallelism=128",
        "rest.port=0",
        "rest.bind-address=0.0.0.0",
        "execution.checkpointing.interval=10 s",
        "execution.checkpointing.mode=at_least_once",
        "state.checkpoints.dir=s3://bucket/checkpoints",
        "state.backend.type=HashMap",
        "restart-strategy.type=fixeddelay",
        "restart-strategy.exponential-delay.backoff-multiplier=2",
        "restart-strategy.exponential-delay.jitter-factor=0",
        "restart-strategy.exponential-delay.attempts-before-reset-backoff=5",
        "jobmanager.execution.failover-strategy=FULL",
        "high-availability.type=NONE",
        "pipeline.name=word count",
    ]);
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 8);
    assert_eq!(config.get(&PIPELINE_MAX_PARALLELISM).unwrap(), Some(128));
    assert_eq!(config.get(&REST_PORT).unwrap(), 0);
    assert_eq!(config.get(&REST_BIND_ADDRESS).unwrap().as_deref(), Some("0.0.0.0"));
    assert_eq!(config.get(&CHECKPOINTING_INTERVAL).unwrap(), Some(Duration::from_secs(10)));
    assert_eq!(config.get(&CHECKPOINTING_MODE).unwrap(), CheckpointingMode::AtLeastOnce);
    assert_eq!(config.get(&CHECKPOINTS_DIR).unwrap().as_deref(), Some("s3://bucket/checkpoints"));
    assert_eq!(config.get(&RESTART_STRATEGY_TYPE).unwrap(), Some(RestartStrategyType::FixedDelay));
    assert_eq!(config.get(&RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER).unwrap(), 2.0);
    assert_eq!(config.get(&RESTART_EXPONENTIAL_JITTER_FACTOR).unwrap(), 0.0);
    assert_eq!(config.get(&RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET).unwrap(), Some(5));
    assert_eq!(config.get(&FAILOVER_STRATEGY).unwrap(), FailoverStrategy::Full);
    assert_eq!(config.get(&PIPELINE_NAME).unwrap().as_deref(), Some("word count"));
    assert!(config.validate().is_ok());
}

#[test]
fn memory_sizes_take_flink_s_units() {
    for (text, bytes) in [
        ("65536", 65536usize),
        ("64kb", 64 << 10),
        ("256mb", 256 << 20),
        ("1 g", 1 << 30),
        ("2GB", 2 << 30),
        ("3m", 3 << 20),
        ("7b", 7),
    ] {
        let config = with_overrides(&[&format!("state.backend.spillable.memory={text}")]);
        assert_eq!(config.get(&STATE_BACKEND_SPILLABLE_MEMORY).unwrap(), bytes, "{text}");
    }
    let config = with_overrides(&["state.backend.type=SPILLABLE", "execution.state-recovery.claim-mode=claim"]);
    assert_eq!(config.get(&STATE_BACKEND_TYPE).unwrap(), StateBackendType::Spillable);
    assert_eq!(config.get(&STATE_RECOVERY_CLAIM_MODE).unwrap(), crate::ClaimMode::Claim);
}

#[test]
fn optional_options_accept_none_and_empty() {
    let config = with_overrides(&[
        "execution.checkpointing.interval=none",
        "pipeline.max-parallelism=",
        "state.checkpoints.dir=",
        "restart-strategy.exponential-delay.attempts-before-reset-backoff=NONE",
    ]);
    assert_eq!(config.get(&CHECKPOINTING_INTERVAL).unwrap(), None);
    assert_eq!(config.get(&PIPELINE_MAX_PARALLELISM).unwrap(), None);
    assert_eq!(config.get(&CHECKPOINTS_DIR).unwrap(), None);
    assert_eq!(config.get(&RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET).unwrap(), None);
    let off = with_overrides(&["execution.checkpointing.interval=off"]);
    assert_eq!(off.get(&CHECKPOINTING_INTERVAL).unwrap(), None);
}

#[test]
fn bad_value_message_has_the_documented_form() {
    let config = with_overrides(&["parallelism.default=abc"]);
    let error = config.get(&PARALLELISM_DEFAULT).unwrap_err();
    assert_eq!(
        error.to_string(),
        "bad value 'abc' for configuration key 'parallelism.default' (from -D): \
         expected a positive integer up to 32768"
    );
    assert_eq!(error.key(), Some("parallelism.default"));
}

/// A value each known key rejects, with a fragment of the expected explanation.
const BAD_VALUES: &[(&str, &str, &str)] = &[
    ("parallelism.default", "0", "expected a positive integer up to 32768"),
    ("parallelism.default", "32769", "expected a positive integer up to 32768"),
    ("pipeline.max-parallelism", "-1", "expected a positive integer up to 32768"),
    ("rest.address", "", "expected a host name or ip address"),
    ("rest.port", "65536", "expected a port number from 0 to 65535"),
    ("jobmanager.rpc.address", " ", "expected a host name or ip address"),
    ("jobmanager.rpc.port", "http", "expected a port number"),
    ("taskmanager.numberOfTaskSlots", "0", "expected a positive integer"),
    ("execution.checkpointing.interval", "5ms", "at least 10ms"),
    ("execution.checkpointing.interval", "soon", "'none' to disable checkpointing"),
    ("execution.checkpointing.mode", "exactly-once", "expected 'EXACTLY_ONCE' or 'AT_LEAST_ONCE'"),
    ("execution.checkpointing.timeout", "1ms", "expected a duration of at least 10ms"),
    ("execution.checkpointing.min-pause", "-1s", "expected a duration such as"),
    ("execution.checkpointing.max-concurrent-checkpoints", "0", "expected a positive integer"),
    ("execution.checkpointing.tolerable-failed-checkpoints", "-1", "expected a non-negative integer"),
    ("state.checkpoints.num-retained", "0", "expected a positive integer"),
    ("state.backend.type", "rocksdb", "state backend 'rocksdb' is not available in this build; use 'fjall'"),
    ("state.backend.type", "memory", "expected 'hashmap', 'spillable' or 'fjall'"),
    ("state.backend.fjall.memory", "lots", "expected a memory size such as 256mb"),
    ("state.backend.spillable.memory", "lots", "expected a memory size such as 256mb"),
    ("state.backend.spillable.memory", "0", "expected a memory size"),
    ("state.backend.spillable.memory", "12 parsecs", "expected a memory size"),
    ("state.backend.spillable.memory", "99999999999t", "expected a memory size"),
    ("execution.state-recovery.claim-mode", "LEGACY", "LEGACY was removed"),
    ("execution.state-recovery.claim-mode", "mine", "expected CLAIM or NO_CLAIM"),
    ("execution.checkpointing.incremental", "maybe", "expected"),
    ("execution.checkpointing.incremental.materialize-every", "0", "expected a positive integer"),
    ("restart-strategy.type", "always", "expected 'none', 'fixed-delay', 'failure-rate' or 'exponential-delay'"),
    ("restart-strategy.fixed-delay.attempts", "many", "expected a non-negative integer"),
    ("restart-strategy.fixed-delay.delay", "1 fortnight", "unknown time unit 'fortnight'"),
    ("restart-strategy.failure-rate.max-failures-per-interval", "0", "expected a positive integer"),
    ("restart-strategy.failure-rate.failure-rate-interval", "0s", "expected a positive duration"),
    ("restart-strategy.failure-rate.delay", "1.5s", "expected a duration such as"),
    ("restart-strategy.exponential-delay.initial-backoff", "", "the duration is empty"),
    ("restart-strategy.exponential-delay.max-backoff", "x", "does not start with a number"),
    ("restart-strategy.exponential-delay.backoff-multiplier", "0.5", "expected a number of at least 1.0"),
    ("restart-strategy.exponential-delay.backoff-multiplier", "inf", "expected a number of at least 1.0"),
    ("restart-strategy.exponential-delay.reset-backoff-threshold", "99999999999999999999d", "too large"),
    ("restart-strategy.exponential-delay.jitter-factor", "1.5", "expected a number from 0.0 to 1.0"),
    ("restart-strategy.exponential-delay.jitter-factor", "NaN", "expected a number from 0.0 to 1.0"),
    ("restart-strategy.exponential-delay.attempts-before-reset-backoff", "-3", "expected a non-negative integer"),
    ("jobmanager.execution.failover-strategy", "partial", "expected 'region' or 'full'"),
    ("heartbeat.interval", "0", "expected a positive duration"),
    ("heartbeat.timeout", "later", "expected a duration such as"),
    ("high-availability.type", "zookeeper", "high-availability.type 'zookeeper' is Flink's, not weir's"),
    ("high-availability.type", "consul", "high-availability.type 'consul' is not one of none, etcd"),
    ("high-availability.cluster-id", "a/b", "expected 1 to 64 letters"),
    ("high-availability.etcd.endpoints", "https://x:2379", "TLS to etcd is not supported"),
    ("high-availability.etcd.lease-ttl", "500ms", "at least 2s"),
];

#[test]
fn bad_values_from_overrides_name_key_value_and_source() {
    for (key, value, expected) in BAD_VALUES {
        let config = with_overrides(&[&format!("{key}={value}")]);
        let error = config.validate().expect_err(key);
        let text = error.to_string();
        assert_eq!(error.key(), Some(*key), "{text}");
        assert!(text.contains(&format!("configuration key '{key}'")), "{text}");
        assert!(text.contains(&format!("bad value '{}'", value.trim())), "{text}");
        assert!(text.contains("(from -D)"), "{text}");
        assert!(text.contains(expected), "{key}: {text}");
        assert!(!text.contains('\n'), "{text}");
    }
}

#[test]
fn bad_values_from_a_file_name_the_file() {
    for (key, value, expected) in BAD_VALUES {
        let (_dir, path) = yaml_file(&format!("{key}: '{value}'\n"));
        let config = Configuration::load(Some(&path), &[]).expect("load");
        let text = config.validate().expect_err(key).to_string();
        assert!(text.contains(&format!("configuration key '{key}'")), "{text}");
        assert!(text.contains(&format!("(from {})", path.display())), "{text}");
        assert!(text.contains(expected), "{key}: {text}");
    }
}

#[test]
fn validate_checks_every_non_string_key() {
    // Keys whose value is free text accept anything non-empty.
    let free_text = [
        "rest.address",
        "rest.bind-address",
        "jobmanager.rpc.address",
        "jobmanager.bind-host",
        "taskmanager.host",
        "taskmanager.bind-host",
        "state.checkpoints.dir",
        "state.savepoints.dir",
        "high-availability.storageDir",
        "high-availability.etcd.endpoints",
        "kubernetes.namespace",
        "kubernetes.pod-template-file.taskmanager",
        "pipeline.name",
        "io.tmp.dirs",
        "security.internal.secret-file",
        "security.ssl.internal.keystore",
        "security.ssl.internal.truststore",
    ];
    for key in ALL_KEYS {
        let config = with_overrides(&[&format!("{key}=@@garbage@@")]);
        match config.validate() {
            Ok(()) => assert!(free_text.contains(key), "validate accepted garbage for {key}"),
            Err(error) => assert_eq!(error.key(), Some(*key), "{error}"),
        }
    }
}

#[test]
fn set_from_names_its_origin() {
    let mut config = Configuration::new();
    config.set_from("parallelism.default", "zero", "-p");
    let text = config.get(&PARALLELISM_DEFAULT).unwrap_err().to_string();
    assert!(text.contains("(from -p)"), "{text}");

    config.set("parallelism.default", "many");
    let text = config.get(&PARALLELISM_DEFAULT).unwrap_err().to_string();
    assert!(text.contains("(from programmatic setting)"), "{text}");
}

#[test]
fn overrides_win_over_the_file_and_set_wins_over_both() {
    let (_dir, path) = yaml_file("parallelism.default: 2\nrest.port: 9000\npipeline.name: from-file\n");
    let mut config =
        Configuration::load(Some(&path), &overrides(&["parallelism.default=3", "pipeline.name = from-d "]))
            .expect("load");
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 3);
    assert_eq!(config.get(&REST_PORT).unwrap(), 9000);
    assert_eq!(config.get_raw("pipeline.name"), Some("from-d"));
    assert_eq!(config.source("parallelism.default"), Some(&Source::Override));
    assert_eq!(config.source("rest.port"), Some(&Source::File(path.clone())));

    config.set("parallelism.default", "5");
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 5);
    assert_eq!(config.source("parallelism.default"), Some(&Source::Set("programmatic setting".to_string())));
}

#[test]
fn nested_yaml_file_is_flattened() {
    let (_dir, path) = yaml_file(
        "execution:\n  checkpointing:\n    interval: 10s\n    mode: AT_LEAST_ONCE\n\
         parallelism:\n  default: 4\nrest:\n  port: 8082\n  address: example.org\n\
         pipeline:\n  jars:\n    - a.jar\n    - b.jar\n  name: ~\n",
    );
    let config = Configuration::load(Some(&path), &[]).expect("load");
    assert_eq!(config.get(&CHECKPOINTING_INTERVAL).unwrap(), Some(Duration::from_secs(10)));
    assert_eq!(config.get(&CHECKPOINTING_MODE).unwrap(), CheckpointingMode::AtLeastOnce);
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 4);
    assert_eq!(config.get(&REST_PORT).unwrap(), 8082);
    assert_eq!(config.get(&REST_ADDRESS).unwrap(), "example.org");
    assert_eq!(config.get_raw("pipeline.jars"), Some("a.jar;b.jar"));
    assert_eq!(config.get_raw("pipeline.name"), None);
    let keys: Vec<&str> = config.entries().map(|(key, _, _)| key).collect();
    assert_eq!(
        keys,
        [
            "execution.checkpointing.interval",
            "execution.checkpointing.mode",
            "parallelism.default",
            "pipeline.jars",
            "rest.address",
            "rest.port",
        ]
    );
}

#[test]
fn empty_file_is_fine() {
    let (_dir, path) = yaml_file("");
    let config = Configuration::load(Some(&path), &[]).expect("load");
    assert!(config.is_empty());
    let (_dir, path) = yaml_file("# only comments\n");
    assert!(Configuration::load(Some(&path), &[]).expect("load").is_empty());
}

#[test]
fn unreadable_file_error_names_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.yaml");
    let error = Configuration::load(Some(&missing), &[]).unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with("cannot read configuration file"), "{text}");
    assert!(text.contains(&missing.display().to_string()), "{text}");
    assert!(text.contains("no such file"), "{text}");
    assert!(matches!(error, ConfigError::Read { kind: std::io::ErrorKind::NotFound, .. }));

    let text = Configuration::load(Some(dir.path()), &[]).unwrap_err().to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
}

#[test]
fn invalid_yaml_error_names_the_path_and_reason() {
    let (_dir, path) = yaml_file("parallelism.default: [1\n");
    let text = Configuration::load(Some(&path), &[]).unwrap_err().to_string();
    assert!(text.starts_with("invalid configuration file"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("line"), "{text}");
    assert!(!text.contains('\n'), "{text}");
}

#[test]
fn override_without_equals_or_key_is_rejected() {
    let text = Configuration::load(None, &overrides(&["parallelism.default"])).unwrap_err().to_string();
    assert_eq!(text, "invalid override '-D parallelism.default': missing '='; expected the form -D key=value");
    let text = Configuration::load(None, &overrides(&[" =4"])).unwrap_err().to_string();
    assert!(text.contains("the key is empty"), "{text}");
    assert!(text.contains("-D key=value"), "{text}");
}

#[test]
fn override_value_may_contain_equals() {
    let config = with_overrides(&["pipeline.name=a=b", "state.checkpoints.dir="]);
    assert_eq!(config.get_raw("pipeline.name"), Some("a=b"));
    assert_eq!(config.get_raw("state.checkpoints.dir"), Some(""));
}

#[test]
fn unknown_key_warning_suggests_a_close_key() {
    let (_dir, path) = yaml_file("paralelism.default: 4\ntotally.unrelated: x\n");
    let config = Configuration::load(Some(&path), &overrides(&["taskmanager.numberoftaskslots=2"])).expect("load");
    let warnings = config.warnings();
    assert_eq!(
        warnings,
        vec![
            format!(
                "unknown configuration key 'paralelism.default' (from {}); it is ignored; \
                 did you mean 'parallelism.default'?",
                path.display()
            ),
            "unknown configuration key 'taskmanager.numberoftaskslots' (from -D); it is ignored; \
             did you mean 'taskmanager.numberOfTaskSlots'?"
                .to_string(),
            format!("unknown configuration key 'totally.unrelated' (from {}); it is ignored", path.display()),
        ]
    );
    // The misspelled key does not change the typed value.
    assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 1);
}

#[test]
fn fallback_names_work_and_the_latest_wins() {
    let (_dir, path) = yaml_file("state.checkpoints.dir: file:///old\n");
    let config = Configuration::load(Some(&path), &overrides(&["execution.checkpointing.dir=s3://new"])).expect("load");
    assert_eq!(config.get(&CHECKPOINTS_DIR).unwrap().as_deref(), Some("s3://new"));
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("'state.checkpoints.dir'"), "{}", warnings[0]);
    assert!(warnings[0].contains("the value 's3://new' of 'execution.checkpointing.dir' is used"), "{}", warnings[0]);

    let config = with_overrides(&["state.backend=rocksdb"]);
    let text = config.get(&STATE_BACKEND_TYPE).unwrap_err().to_string();
    assert!(text.contains("configuration key 'state.backend'"), "{text}");
    assert!(config.warnings().is_empty());
    assert!(config.contains(&STATE_BACKEND_TYPE));
}

#[test]
fn to_overrides_round_trips() {
    let (_dir, path) = yaml_file("execution:\n  checkpointing:\n    interval: 10s\nx.y: [1, 2]\n");
    let mut config =
        Configuration::load(Some(&path), &overrides(&["pipeline.name=a=b", "parallelism.default=2"])).expect("load");
    config.set("rest.port", "0");
    let forwarded = config.to_overrides();
    assert_eq!(
        forwarded,
        [
            "execution.checkpointing.interval=10s",
            "parallelism.default=2",
            "pipeline.name=a=b",
            "rest.port=0",
            "x.y=1;2",
        ]
    );
    let reloaded = Configuration::load(None, &forwarded).expect("reload");
    let original: Vec<(&str, &str)> = config.entries().map(|(k, v, _)| (k, v)).collect();
    let copy: Vec<(&str, &str)> = reloaded.entries().map(|(k, v, _)| (k, v)).collect();
    assert_eq!(original, copy);
}

#[test]
fn validate_checks_rules_between_keys() {
    let text = with_overrides(&["heartbeat.timeout=5s"]).validate().unwrap_err().to_string();
    assert_eq!(
        text,
        "configuration key 'heartbeat.timeout' (5s, from -D) must not be smaller than \
         'heartbeat.interval' (10s, from default)"
    );

    let text =
        with_overrides(&["parallelism.default=8", "pipeline.max-parallelism=4"]).validate().unwrap_err().to_string();
    assert!(text.contains("'pipeline.max-parallelism' (4, from -D)"), "{text}");
    assert!(text.contains("'parallelism.default' (8, from -D)"), "{text}");

    let backoff = ["restart-strategy.exponential-delay.initial-backoff=2min"];
    assert!(with_overrides(&backoff).validate().is_err());
    let fixed = ["restart-strategy.exponential-delay.initial-backoff=2min", "restart-strategy.type=fixed-delay"];
    assert!(with_overrides(&fixed).validate().is_ok());
}

#[test]
fn remove_restores_the_default() {
    let mut config = with_overrides(&["rest.port=1234"]);
    assert_eq!(config.remove("rest.port").as_deref(), Some("1234"));
    assert_eq!(config.get(&REST_PORT).unwrap(), 8081);
    assert_eq!(config.len(), 0);
}

#[test]
fn sensitive_keys_are_recognised() {
    assert!(is_sensitive_key("s3.secret-key"));
    assert!(is_sensitive_key("security.ssl.keystore-password"));
    assert!(is_sensitive_key("some.API-KEY"));
    assert!(!is_sensitive_key("parallelism.default"));
}

#[test]
fn edit_distance_counts_characters() {
    assert_eq!(edit_distance("", ""), 0);
    assert_eq!(edit_distance("abc", ""), 3);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("paralelism", "parallelism"), 1);
    assert_eq!(edit_distance("µs", "us"), 1);
    assert_eq!(suggest_key("rest.prot"), Some("rest.port"));
    assert_eq!(suggest_key("something.else"), None);
}

#[test]
fn internal_security_options_are_validated_without_showing_the_secret() {
    let config = with_overrides(&["security.internal.secret=0123456789abcdef0123"]);
    assert_eq!(config.get(&SECURITY_INTERNAL_SECRET).unwrap().as_deref(), Some("0123456789abcdef0123"));
    assert!(!config.get(&SECURITY_SSL_INTERNAL_ENABLED).unwrap());
    config.validate().unwrap();

    let short = with_overrides(&["security.internal.secret=hunter2"]);
    let error = short.validate().unwrap_err().to_string();
    assert!(error.contains("security.internal.secret") && error.contains("at least 16"), "{error}");
    assert!(!error.contains("hunter2"), "the secret was shown: {error}");

    let both = with_overrides(&["security.internal.secret=0123456789abcdef0123", "security.internal.secret-file=/s"]);
    let error = both.validate().unwrap_err().to_string();
    assert!(error.contains("set only one of them") && !error.contains("0123456789abcdef"), "{error}");

    let tls = with_overrides(&["security.ssl.internal.enabled=true", "security.ssl.internal.keystore=/k.pem"]);
    let error = tls.validate().unwrap_err().to_string();
    assert!(error.contains("needs 'security.ssl.internal.truststore'"), "{error}");

    let jks = with_overrides(&["security.ssl.internal.keystore-type=JKS"]);
    let error = jks.validate().unwrap_err().to_string();
    assert!(error.contains("PEM files only"), "{error}");
}

/// Unaligned checkpoints need exactly-once, as in Flink: the pair is refused naming both keys.
#[test]
fn unaligned_checkpoints_with_at_least_once_are_refused() {
    let config = with_overrides(&[
        "execution.checkpointing.unaligned.enabled=true",
        "execution.checkpointing.mode=AT_LEAST_ONCE",
    ]);
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("'execution.checkpointing.unaligned.enabled' (true, from -D"), "{error}");
    assert!(error.contains("needs 'execution.checkpointing.mode: EXACTLY_ONCE'"), "{error}");
    with_overrides(&["execution.checkpointing.unaligned=true"]).validate().unwrap();
}
