//! Loading the configuration for a command: file, `-D` overrides, warnings printed once; where
//! the command's cluster is. The JobManager's own settings readers are in
//! `weir_jobmanager::settings`.

use std::path::PathBuf;

use weir_config::Configuration;
use weir_config::options::{REST_ADDRESS, REST_PORT};
use weir_jobmanager::settings::{connect_ha, ha_settings};

use crate::args::ConfigArgs;
use crate::client::{RestClient, Retry};
use crate::error::CliError;

/// Loads, validates and warns; configuration mistakes are usage errors (exit 2).
pub fn load(args: &ConfigArgs) -> Result<Configuration, CliError> {
    let file = match &args.config {
        Some(path) => Some(path.clone()),
        None => default_config_file(),
    };
    let config = Configuration::load(file.as_deref(), &args.dynamic).map_err(CliError::usage)?;
    config.validate().map_err(CliError::usage)?;
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(config)
}

fn default_config_file() -> Option<PathBuf> {
    let dir = std::env::var_os("WEIR_CONF_DIR")?;
    let path = PathBuf::from(dir).join("config.yaml");
    path.is_file().then_some(path)
}

/// The cluster `weir run` submits to: `-m`, else none with `execution.target: local` (`-t
/// local`), else `$WEIR_JOBMANAGER`, else the leader of the HA cluster the configuration
/// names, else `rest.address` when the configuration sets it (or `execution.target:
/// remote`); `None` runs the job on an embedded cluster. A configuration file that sets
/// `rest.address` (a Flink `config.yaml` does) is said to be the reason, with how to run
/// here instead.
pub fn cluster_address(explicit: Option<&str>, config: &Configuration) -> Result<Option<String>, CliError> {
    use weir_config::options::{EXECUTION_TARGET, ExecutionTarget};
    if explicit.is_some() {
        return jobmanager_address(explicit, config).map(Some);
    }
    let target = config.get(&EXECUTION_TARGET).map_err(CliError::usage)?;
    if target == Some(ExecutionTarget::Local) {
        return Ok(None);
    }
    let ha = ha_settings(config)?.is_some();
    if std::env::var("WEIR_JOBMANAGER").is_ok_and(|a| !a.is_empty()) || ha || target == Some(ExecutionTarget::Remote) {
        return jobmanager_address(None, config).map(Some);
    }
    if config.contains(&REST_ADDRESS) {
        let address = jobmanager_address(None, config)?;
        let from = config.source(REST_ADDRESS.key).map_or_else(|| "the configuration".to_string(), |s| s.to_string());
        eprintln!(
            "Submitting to the cluster at {address}: rest.address is set (from {from}). `weir run -t local ...` runs the job here, on an embedded cluster."
        );
        return Ok(Some(address));
    }
    Ok(None)
}

/// The data directory: `$WEIR_DATA_DIR`, else `$HOME/.local/share/weir`, else `./.weir`.
pub fn data_dir() -> PathBuf {
    let dir = match std::env::var_os("WEIR_DATA_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(".local/share/weir"),
            None => PathBuf::from(".weir"),
        },
    };
    std::path::absolute(&dir).unwrap_or(dir)
}

/// The REST address to talk to: `-m`, else `$WEIR_JOBMANAGER`, else (high availability) the
/// leader's as etcd publishes it, as Flink's CLI asks its HA services, else
/// `rest.address:rest.port`. With HA, `rest.address` is where each JobManager listens, and
/// the one it names may be a standby or dead.
pub fn jobmanager_address(explicit: Option<&str>, config: &Configuration) -> Result<String, CliError> {
    Ok(resolve_jobmanager(explicit, config)?.0)
}

/// A client of the REST API at [`jobmanager_address`]; when etcd named the address, a
/// failure to reach it says that a failover may be under way.
///
/// It tries again through a JobManager failover (`rest.retry.max-attempts` times,
/// `rest.retry.delay` apart) when the leader came from the HA store, asking it for the
/// leader before each try, or when `rest.retry.max-attempts` is set; a plain address that
/// does not answer fails at once.
pub fn jobmanager_client(explicit: Option<&str>, config: &Configuration) -> Result<RestClient, CliError> {
    use weir_config::options::{REST_RETRY_DELAY, REST_RETRY_MAX_ATTEMPTS};
    let attempts = config.get(&REST_RETRY_MAX_ATTEMPTS).map_err(CliError::usage)?;
    let delay = config.get(&REST_RETRY_DELAY).map_err(CliError::usage)?;
    let mut resolved = resolve_jobmanager(explicit, config);
    // No leader yet (the old one's lease has not expired, or a standby is taking over):
    // asked again, as a request that got no answer is.
    let mut attempt = 1;
    while resolved.is_err() && attempt < attempts && explicit.is_none() && ha_settings(config)?.is_some() {
        std::thread::sleep(delay);
        resolved = resolve_jobmanager(explicit, config);
        attempt += 1;
    }
    let (address, cluster_id) = resolved?;
    let client = RestClient::new(&address);
    Ok(match cluster_id {
        Some(cluster_id) => {
            let located = config.clone();
            let locate: crate::client::Locate =
                Box::new(move || resolve_jobmanager(None, &located).map(|(address, _)| address));
            client
                .with_unreachable_hint(format!(
                    "etcd names it the leader of cluster '{cluster_id}', and no leader answered within rest.retry.max-attempts x rest.retry.delay; is a JobManager of the cluster running?"
                ))
                .with_retry(Retry { attempts, delay, locate: Some(locate) })
        }
        None if config.contains(&REST_RETRY_MAX_ATTEMPTS) => client.with_retry(Retry { attempts, delay, locate: None }),
        None => client,
    })
}

/// Whether the CLI would ask the default address (nothing names one: no `-m`,
/// `$WEIR_JOBMANAGER`, `rest.address`/`rest.port` or high availability).
fn default_address(explicit: Option<&str>, config: &Configuration) -> Result<bool, CliError> {
    Ok(explicit.is_none()
        && std::env::var("WEIR_JOBMANAGER").ok().is_none_or(|a| a.is_empty())
        && !config.contains(&REST_ADDRESS)
        && !config.contains(&REST_PORT)
        && ha_settings(config)?.is_none())
}

/// A client of the JobManager that has `job_id`: [`jobmanager_client`], unless nothing names
/// an address and a `weir run` of this machine serves the job elsewhere (its REST port moved
/// off a taken default), which is then asked instead.
pub fn jobmanager_client_for_job(
    explicit: Option<&str>,
    config: &Configuration,
    job_id: &str,
) -> Result<RestClient, CliError> {
    if default_address(explicit, config)?
        && let Some(run) = crate::runs::live().into_iter().find(|run| run.job_id == job_id)
    {
        let client = RestClient::new(&run.rest);
        if client.base() != RestClient::new(&jobmanager_address(explicit, config)?).base() {
            eprintln!("Job {job_id} runs in `weir run` (pid {}) at {}.", run.pid, run.rest);
        }
        return Ok(client);
    }
    jobmanager_client(explicit, config)
}

/// The `weir run`s of this machine whose jobs the default address does not serve, when
/// nothing names an address (for `weir list` to mention).
pub fn runs_elsewhere(explicit: Option<&str>, config: &Configuration) -> Result<Vec<crate::runs::RunRecord>, CliError> {
    if !default_address(explicit, config)? {
        return Ok(Vec::new());
    }
    let default = RestClient::new(&jobmanager_address(explicit, config)?).base();
    Ok(crate::runs::live().into_iter().filter(|run| RestClient::new(&run.rest).base() != default).collect())
}

/// The address, and the HA cluster id when etcd named it.
fn resolve_jobmanager(explicit: Option<&str>, config: &Configuration) -> Result<(String, Option<String>), CliError> {
    if let Some(address) = explicit {
        return Ok((address.to_string(), None));
    }
    if let Ok(address) = std::env::var("WEIR_JOBMANAGER")
        && !address.is_empty()
    {
        return Ok((address, None));
    }
    if let Some(settings) = ha_settings(config)? {
        let cluster_id = settings.cluster_id.clone();
        let ha = connect_ha(settings)?;
        return match ha.leader().map_err(|e| CliError::runtime(e.to_string()))? {
            Some((leader, _)) => Ok((leader.rest_address, Some(cluster_id))),
            None => Err(CliError::runtime(format!(
                "no JobManager leads cluster '{cluster_id}' in {}; start one (`weir cluster start`, `weir jobmanager`) or pass -m HOST:PORT",
                ha.client().describe()
            ))),
        };
    }
    let host = config.get(&REST_ADDRESS).map_err(CliError::usage)?;
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    Ok((format!("{host}:{port}"), None))
}

/// A TaskManager's data addresses from `taskmanager.host`, `.bind-host` and `.data.port`.
pub(crate) fn data_addresses(config: &Configuration) -> Result<weir_runtime::cluster::DataAddresses, CliError> {
    use weir_config::options::{TASKMANAGER_BIND_HOST, TASKMANAGER_DATA_PORT, TASKMANAGER_HOST};
    Ok(weir_runtime::cluster::DataAddresses {
        host: config.get(&TASKMANAGER_HOST).map_err(CliError::usage)?,
        bind_host: config.get(&TASKMANAGER_BIND_HOST).map_err(CliError::usage)?,
        port: config.get(&TASKMANAGER_DATA_PORT).map_err(CliError::usage)?,
    })
}
