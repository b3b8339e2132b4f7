//! The JobManager's settings from Flink's configuration keys: the job's checkpointing and
//! restart strategy, high availability, the internal wire's security, where the RPC and REST
//! endpoints listen and what they advertise, native TaskManager pods. Configuration mistakes
//! are usage errors naming the key; the command line uses the same readers for its clients.

use std::sync::Arc;

use weir_config::Configuration;
use weir_config::options::{
    CHECKPOINTING_INTERVAL, CHECKPOINTING_MAX_CONCURRENT, CHECKPOINTING_MIN_PAUSE, CHECKPOINTING_MODE,
    CHECKPOINTING_TIMEOUT, CHECKPOINTING_TOLERABLE_FAILED, CHECKPOINTS_DIR, CHECKPOINTS_NUM_RETAINED, SAVEPOINTS_DIR,
    STATE_BACKEND_TYPE,
};
use weir_config::options::{
    RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET, RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER,
    RESTART_EXPONENTIAL_INITIAL_BACKOFF, RESTART_EXPONENTIAL_JITTER_FACTOR, RESTART_EXPONENTIAL_MAX_BACKOFF,
    RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD, RESTART_FAILURE_RATE_DELAY, RESTART_FAILURE_RATE_INTERVAL,
    RESTART_FAILURE_RATE_MAX_FAILURES, RESTART_FIXED_DELAY_ATTEMPTS, RESTART_FIXED_DELAY_DELAY, RESTART_STRATEGY_TYPE,
};
use weir_config::{CheckpointingMode, RestartStrategyType};
use weir_runtime::checkpointing::CheckpointSettings;
use weir_runtime::checkpointing::settings::default_checkpoints_url;
use weir_runtime::restart::RestartStrategyConfig;

use crate::error::JobManagerError as Error;

/// The HA services settings with `high-availability.type: etcd` or `kubernetes`, else `None`.
pub fn ha_settings(config: &Configuration) -> Result<Option<weir_ha::HaSettings>, Error> {
    use weir_config::HighAvailabilityType;
    use weir_config::options::{
        HIGH_AVAILABILITY_CLUSTER_ID, HIGH_AVAILABILITY_ETCD_ENDPOINTS, HIGH_AVAILABILITY_ETCD_LEASE_TTL,
        HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION, HIGH_AVAILABILITY_STORAGE_DIR, HIGH_AVAILABILITY_TYPE,
        KUBERNETES_NAMESPACE,
    };
    let ha = config.get(&HIGH_AVAILABILITY_TYPE).map_err(Error::usage)?;
    if !ha.is_enabled() {
        return Ok(None);
    }
    let storage_dir = config.get(&HIGH_AVAILABILITY_STORAGE_DIR).map_err(Error::usage)?.ok_or_else(|| {
        Error::usage(format!("high-availability.type: {} needs high-availability.storageDir (a directory or object-store URL every JobManager can reach)", ha.to_string().to_lowercase()))
    })?;
    weir_checkpoint::SnapshotStorage::from_url(&storage_dir).map_err(|e| {
        Error::usage(format!("bad value '{storage_dir}' for configuration key 'high-availability.storageDir': {e}"))
    })?;
    let kubernetes = (ha == HighAvailabilityType::Kubernetes).then(|| {
        Ok::<_, Error>(weir_ha::KubernetesHa { namespace: config.get(&KUBERNETES_NAMESPACE).map_err(Error::usage)? })
    });
    let lease_ttl = match ha {
        HighAvailabilityType::Kubernetes => config.get(&HIGH_AVAILABILITY_KUBERNETES_LEASE_DURATION),
        _ => config.get(&HIGH_AVAILABILITY_ETCD_LEASE_TTL),
    }
    .map_err(Error::usage)?;
    Ok(Some(weir_ha::HaSettings {
        endpoints: config.get(&HIGH_AVAILABILITY_ETCD_ENDPOINTS).map_err(Error::usage)?,
        cluster_id: config.get(&HIGH_AVAILABILITY_CLUSTER_ID).map_err(Error::usage)?,
        storage_dir,
        lease_ttl,
        kubernetes: kubernetes.transpose()?,
    }))
}

/// How the cluster's processes authenticate each other on the TaskManager port and the
/// data ports: the shared secret (`security.internal.secret` or the file
/// `security.internal.secret-file` names) and mutual TLS (`security.ssl.internal.*`).
pub fn wire_security(config: &Configuration) -> Result<weir_runtime::security::WireSecurity, Error> {
    use weir_config::options::{
        SECURITY_INTERNAL_SECRET, SECURITY_INTERNAL_SECRET_FILE, SECURITY_SSL_INTERNAL_ENABLED,
        SECURITY_SSL_INTERNAL_KEYSTORE, SECURITY_SSL_INTERNAL_TRUSTSTORE,
    };
    use weir_runtime::security::{SharedSecret, TlsIdentity, WireSecurity};
    let secret = match (
        config.get(&SECURITY_INTERNAL_SECRET).map_err(Error::usage)?,
        config.get(&SECURITY_INTERNAL_SECRET_FILE).map_err(Error::usage)?,
    ) {
        (Some(secret), _) => Some(secret.into_bytes()),
        (None, Some(path)) => {
            let mut bytes = std::fs::read(&path).map_err(|e| {
                Error::usage(format!(
                    "cannot read the shared secret from '{path}' (security.internal.secret-file): {e}"
                ))
            })?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            Some(bytes)
        }
        (None, None) => None,
    };
    let secret = match secret {
        Some(bytes) => Some(SharedSecret::new(&bytes).map_err(Error::usage)?),
        None => None,
    };
    let tls = if config.get(&SECURITY_SSL_INTERNAL_ENABLED).map_err(Error::usage)? {
        // validate() made sure both are set.
        let keystore = config.get(&SECURITY_SSL_INTERNAL_KEYSTORE).map_err(Error::usage)?.unwrap_or_default();
        let truststore = config.get(&SECURITY_SSL_INTERNAL_TRUSTSTORE).map_err(Error::usage)?.unwrap_or_default();
        Some(
            TlsIdentity::from_pem_files(std::path::Path::new(&keystore), std::path::Path::new(&truststore))
                .map_err(Error::usage)?,
        )
    } else {
        None
    };
    Ok(WireSecurity::new(secret, tls))
}

/// Connects to the HA services of `settings` (etcd, or the Kubernetes API server the pod's
/// service account or the kubeconfig reaches); an unreachable store is one line naming it.
pub fn connect_ha(settings: weir_ha::HaSettings) -> Result<weir_ha::HaServices, Error> {
    let Some(kubernetes) = settings.kubernetes.clone() else {
        return weir_ha::HaServices::connect(settings).map_err(|e| Error::runtime(e.to_string()));
    };
    let kube = weir_kubernetes::Kube::connect(None, kubernetes.namespace.as_deref())
        .map_err(|e| Error::runtime(format!("high-availability.type: kubernetes: {e}")))?;
    let store = weir_kubernetes::ha::ConfigMapStore::connect(Arc::new(kube), &settings.cluster_id)
        .map_err(|e| Error::runtime(e.to_string()))?;
    weir_ha::HaServices::on(settings, Arc::new(store)).map_err(|e| Error::runtime(e.to_string()))
}

/// The restart strategy from Flink's keys; without `restart-strategy.type`, exponential-delay
/// when checkpointing is on and none otherwise (Flink 1.19+).
pub fn restart_strategy(config: &Configuration, checkpointing: bool) -> Result<RestartStrategyConfig, Error> {
    let kind = config.get(&RESTART_STRATEGY_TYPE).map_err(Error::usage)?;
    let kind =
        kind.unwrap_or(if checkpointing { RestartStrategyType::ExponentialDelay } else { RestartStrategyType::None });
    Ok(match kind {
        RestartStrategyType::None => RestartStrategyConfig::None,
        RestartStrategyType::FixedDelay => RestartStrategyConfig::FixedDelay {
            attempts: config.get(&RESTART_FIXED_DELAY_ATTEMPTS).map_err(Error::usage)?,
            delay: config.get(&RESTART_FIXED_DELAY_DELAY).map_err(Error::usage)?,
        },
        RestartStrategyType::FailureRate => RestartStrategyConfig::FailureRate {
            max_failures: config.get(&RESTART_FAILURE_RATE_MAX_FAILURES).map_err(Error::usage)?,
            interval: config.get(&RESTART_FAILURE_RATE_INTERVAL).map_err(Error::usage)?,
            delay: config.get(&RESTART_FAILURE_RATE_DELAY).map_err(Error::usage)?,
        },
        RestartStrategyType::ExponentialDelay => RestartStrategyConfig::ExponentialDelay {
            initial_backoff: config.get(&RESTART_EXPONENTIAL_INITIAL_BACKOFF).map_err(Error::usage)?,
            max_backoff: config.get(&RESTART_EXPONENTIAL_MAX_BACKOFF).map_err(Error::usage)?,
            multiplier: config.get(&RESTART_EXPONENTIAL_BACKOFF_MULTIPLIER).map_err(Error::usage)?,
            reset_threshold: config.get(&RESTART_EXPONENTIAL_RESET_BACKOFF_THRESHOLD).map_err(Error::usage)?,
            jitter: config.get(&RESTART_EXPONENTIAL_JITTER_FACTOR).map_err(Error::usage)?,
            attempts_before_reset: config.get(&RESTART_EXPONENTIAL_ATTEMPTS_BEFORE_RESET).map_err(Error::usage)?,
        },
    })
}

/// Where a backend with a local store keeps it (the first of `io.tmp.dirs`), and its memory
/// budget from `budget`.
fn disk_state_options(
    config: &Configuration,
    layout: weir_state::spill::DiskLayout,
    budget: &weir_config::ConfigOption<usize>,
) -> Result<weir_state::spill::SpillOptions, Error> {
    Ok(weir_state::spill::SpillOptions {
        dir: config
            .get(&weir_config::options::IO_TMP_DIRS)
            .map_err(Error::usage)?
            .and_then(|dirs| dirs.split([',', ':']).find(|d| !d.trim().is_empty()).map(|d| d.trim().into()))
            .unwrap_or_else(std::env::temp_dir),
        memory_budget: config.get(budget).map_err(Error::usage)?,
        layout,
    })
}

/// The job's checkpointing options from Flink's keys.
pub fn checkpoint_settings(config: &Configuration) -> Result<CheckpointSettings, Error> {
    // Validated here so a bad backend name is a usage error even though only one exists.
    config.get(&STATE_BACKEND_TYPE).map_err(Error::usage)?;
    let mode = config.get(&CHECKPOINTING_MODE).map_err(Error::usage)?;
    for (key, url) in [
        ("state.checkpoints.dir", config.get(&CHECKPOINTS_DIR).map_err(Error::usage)?),
        ("state.savepoints.dir", config.get(&SAVEPOINTS_DIR).map_err(Error::usage)?),
    ] {
        if let Some(url) = url {
            weir_checkpoint::SnapshotStorage::from_url(&url)
                .map_err(|e| Error::usage(format!("bad value '{url}' for configuration key '{key}': {e}")))?;
        }
    }
    Ok(CheckpointSettings {
        interval: config.get(&CHECKPOINTING_INTERVAL).map_err(Error::usage)?,
        exactly_once: matches!(mode, CheckpointingMode::ExactlyOnce),
        unaligned: config.get(&weir_config::options::CHECKPOINTING_UNALIGNED).map_err(Error::usage)?
            && matches!(mode, CheckpointingMode::ExactlyOnce),
        timeout: config.get(&CHECKPOINTING_TIMEOUT).map_err(Error::usage)?,
        min_pause: config.get(&CHECKPOINTING_MIN_PAUSE).map_err(Error::usage)?,
        max_concurrent: config.get(&CHECKPOINTING_MAX_CONCURRENT).map_err(Error::usage)?,
        tolerable_failures: config.get(&CHECKPOINTING_TOLERABLE_FAILED).map_err(Error::usage)?,
        num_retained: config.get(&CHECKPOINTS_NUM_RETAINED).map_err(Error::usage)?,
        checkpoints_url: config.get(&CHECKPOINTS_DIR).map_err(Error::usage)?.unwrap_or_else(default_checkpoints_url),
        savepoints_url: config.get(&SAVEPOINTS_DIR).map_err(Error::usage)?,
        incremental: if config.get(&weir_config::options::CHECKPOINTING_INCREMENTAL).map_err(Error::usage)? {
            Some(config.get(&weir_config::options::CHECKPOINTING_INCREMENTAL_MATERIALIZE_EVERY).map_err(Error::usage)?)
        } else {
            None
        },
        spill: match config.get(&STATE_BACKEND_TYPE).map_err(Error::usage)? {
            weir_config::StateBackendType::Spillable => Some(disk_state_options(
                config,
                weir_state::spill::DiskLayout::KeyGroups,
                &weir_config::options::STATE_BACKEND_SPILLABLE_MEMORY,
            )?),
            weir_config::StateBackendType::Fjall => Some(disk_state_options(
                config,
                weir_state::spill::DiskLayout::Entries,
                &weir_config::options::STATE_BACKEND_FJALL_MEMORY,
            )?),
            _ => None,
        },
        claim_restored: matches!(
            config.get(&weir_config::options::STATE_RECOVERY_CLAIM_MODE).map_err(Error::usage)?,
            weir_config::ClaimMode::Claim
        ),
    })
}

/// The explicitly set options as `GET /jobmanager/config` shows them: sorted by key,
/// secrets masked.
pub fn shown_configuration(config: &Configuration) -> Vec<(String, String)> {
    config
        .entries()
        .map(|(key, value, _)| {
            let shown = if weir_config::is_sensitive_key(key) { weir_config::HIDDEN_CONTENT } else { value };
            (key.to_string(), shown.to_string())
        })
        .collect()
}

/// `host:port`, with an IPv6 address in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// Where the JobManager listens for TaskManagers (`jobmanager.bind-host`, else
/// `jobmanager.rpc.address`) and the host it advertises (`jobmanager.rpc.address`).
pub fn jobmanager_rpc_hosts(config: &Configuration) -> Result<(String, String, u16), Error> {
    use weir_config::options::{JOBMANAGER_BIND_HOST, JOBMANAGER_RPC_ADDRESS, JOBMANAGER_RPC_PORT};
    let advertised = config.get(&JOBMANAGER_RPC_ADDRESS).map_err(Error::usage)?;
    let bind = config.get(&JOBMANAGER_BIND_HOST).map_err(Error::usage)?.unwrap_or_else(|| advertised.clone());
    let port = config.get(&JOBMANAGER_RPC_PORT).map_err(Error::usage)?;
    Ok((bind, advertised, port))
}

/// Where the REST server listens (`rest.bind-address`, else `rest.address`) and the host it
/// advertises (`rest.address`).
pub fn rest_hosts(config: &Configuration) -> Result<(String, String), Error> {
    use weir_config::options::{REST_ADDRESS, REST_BIND_ADDRESS};
    let advertised = config.get(&REST_ADDRESS).map_err(Error::usage)?;
    let bind = config.get(&REST_BIND_ADDRESS).map_err(Error::usage)?.unwrap_or_else(|| advertised.clone());
    Ok((bind, advertised))
}

/// Native TaskManagers: with `kubernetes.pod-template-file.taskmanager`, TaskManager pods
/// for the slots `resources`' jobs need, connecting to `jobmanager` (`None` with high
/// availability: they find the leader).
pub fn taskmanager_pods(
    config: &Configuration,
    resources: &Arc<weir_runtime::cluster::ClusterResources>,
    jobmanager: Option<String>,
) -> Result<Option<weir_kubernetes::native::TaskManagerPods>, Error> {
    use weir_config::options::{
        KUBERNETES_NAMESPACE, KUBERNETES_POD_TEMPLATE_FILE_TASKMANAGER, RESOURCEMANAGER_TASKMANAGER_TIMEOUT,
        SLOTMANAGER_NUMBER_OF_SLOTS_MIN, TASKMANAGER_NUMBER_OF_TASK_SLOTS,
    };
    let Some(path) = config.get(&KUBERNETES_POD_TEMPLATE_FILE_TASKMANAGER).map_err(Error::usage)? else {
        return Ok(None);
    };
    let template = weir_kubernetes::native::read_template(std::path::Path::new(&path)).map_err(Error::usage)?;
    let namespace = config.get(&KUBERNETES_NAMESPACE).map_err(Error::usage)?;
    let kube = weir_kubernetes::Kube::connect(None, namespace.as_deref()).map_err(|e| {
        Error::runtime(format!("native TaskManager pods (kubernetes.pod-template-file.taskmanager): {e}"))
    })?;
    let settings = weir_kubernetes::native::PoolSettings {
        template,
        jobmanager,
        slots_per_pod: config.get(&TASKMANAGER_NUMBER_OF_TASK_SLOTS).map_err(Error::usage)?,
        idle_timeout: config.get(&RESOURCEMANAGER_TASKMANAGER_TIMEOUT).map_err(Error::usage)?,
    };
    let minimum = config.get(&SLOTMANAGER_NUMBER_OF_SLOTS_MIN).map_err(Error::usage)?;
    let resources = Arc::clone(resources);
    weir_kubernetes::native::TaskManagerPods::start(Arc::new(kube), settings, move || {
        resources.slots_demanded().max(minimum)
    })
    .map(Some)
    .map_err(Error::runtime)
}

#[cfg(test)]
mod shown_configuration_tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_keys_sorted() {
        let mut config = Configuration::new();
        config.set("s3.secret-key", "hunter2");
        config.set("parallelism.default", "4");
        assert_eq!(
            shown_configuration(&config),
            vec![
                ("parallelism.default".to_string(), "4".to_string()),
                ("s3.secret-key".to_string(), weir_config::HIDDEN_CONTENT.to_string())
            ]
        );
    }
}
