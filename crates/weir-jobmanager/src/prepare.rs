//! A catalog job made ready to submit: its stream graph built from the catalog with its
//! arguments, its `JobSettings` read from the configuration, and with a snapshot the restore
//! planned and checked (`restore`). `weir run` does this for its embedded cluster, a
//! JobManager for every submission and recovered job, and a TaskManager builds the same graph
//! for the subtasks it runs: one reading of the catalog and the configuration for all.

use weir_api::catalog::{JobArgs, JobCatalog};
use weir_api::datastream::StreamExecutionEnvironment;
use weir_api::graph::StreamGraph;
use weir_config::options::{
    FAILOVER_STRATEGY, PARALLELISM_DEFAULT, PIPELINE_AUTO_WATERMARK_INTERVAL, PIPELINE_FIXED_JOB_ID,
    PIPELINE_MAX_PARALLELISM, PIPELINE_NAME,
};
use weir_config::{Configuration, FailoverStrategy};
use weir_runtime::cluster::JobSubmission;
use weir_runtime::{JobGraph, JobSettings};

use crate::error::JobManagerError as Error;
use crate::settings;

/// A job ready to submit: its graph and settings, checked against its snapshot if any.
pub struct PreparedJob {
    /// The stream graph.
    pub graph: StreamGraph,
    /// The settings.
    pub settings: JobSettings,
    /// Lines for the user: the snapshot restored and any state left behind.
    pub notes: Vec<String>,
}

/// Builds catalog job `job` with `job_args` under `config` (which already holds `-p`), and
/// checks a restore from `savepoint` (nothing starts, nothing is written).
pub fn prepare(
    catalog: &JobCatalog,
    config: &Configuration,
    job: &str,
    job_args: &[String],
    savepoint: Option<&str>,
    allow_non_restored_state: bool,
) -> Result<PreparedJob, Error> {
    let graph = build_graph(catalog, config, job, job_args)?;
    let mut settings = job_settings(config)?;
    let notes = match savepoint {
        Some(path) => crate::restore::restore_from(path, &graph, &mut settings, allow_non_restored_state)?,
        None => Vec::new(),
    };
    JobGraph::build(&graph, &settings).map_err(Error::usage)?;
    Ok(PreparedJob { graph, settings, notes })
}

/// The id `$internal.pipeline.job-id` asks the job to take, if set.
pub fn fixed_job_id(config: &Configuration) -> Result<Option<weir_types::JobId>, Error> {
    let Some(value) = config.get(&PIPELINE_FIXED_JOB_ID).map_err(Error::usage)? else { return Ok(None) };
    value.trim().parse().map(Some).map_err(|_| {
        Error::usage(format!(
            "{}: '{value}' is not a job id (32 hexadecimal characters, as `weir list` shows them)",
            PIPELINE_FIXED_JOB_ID.key
        ))
    })
}

/// A job's settings from the configuration: parallelism, checkpointing, restarts, failover.
fn job_settings(config: &Configuration) -> Result<JobSettings, Error> {
    let checkpointing = settings::checkpoint_settings(config)?;
    let restart = settings::restart_strategy(config, checkpointing.interval.is_some())?;
    Ok(JobSettings {
        default_parallelism: config.get(&PARALLELISM_DEFAULT).map_err(Error::usage)?,
        max_parallelism: config.get(&PIPELINE_MAX_PARALLELISM).map_err(Error::usage)?,
        checkpointing,
        restore: None,
        restart,
        executor: None,
        failover_full: config.get(&FAILOVER_STRATEGY).map_err(Error::usage)? == FailoverStrategy::Full,
        ha: None,
        clock: weir_runtime::control_clock::ControlClock::system(),
        auto_watermark_interval_ms: Some(
            config.get(&PIPELINE_AUTO_WATERMARK_INTERVAL).map_err(Error::usage)?.as_millis() as u64,
        ),
    })
}

/// The stream graph of catalog job `job` with `job_args`.
pub fn build_graph(
    catalog: &JobCatalog,
    config: &Configuration,
    job: &str,
    job_args: &[String],
) -> Result<StreamGraph, Error> {
    let Some(definition) = catalog.get(job) else {
        let names: Vec<&str> = catalog.jobs().iter().map(|j| j.name()).collect();
        return Err(Error::usage(format!(
            "unknown job '{job}'; the catalog has: {} (see `weir jobs`)",
            names.join(", ")
        )));
    };
    let parsed = JobArgs::parse(definition.name(), &definition.args(), job_args).map_err(Error::usage)?;
    let env = StreamExecutionEnvironment::new();
    definition.build(&parsed, &env).map_err(Error::usage)?;
    let job_name = config.get(&PIPELINE_NAME).map_err(Error::usage)?.unwrap_or_else(|| definition.name().to_string());
    env.build(&job_name).map_err(Error::usage)
}

/// The cluster's configuration plus a submission's own overrides and `-p`.
pub fn job_config(base: &Configuration, submission: &JobSubmission) -> Result<Configuration, Error> {
    let mut config = base.clone();
    for entry in &submission.config {
        config.apply_override(entry).map_err(Error::usage)?;
    }
    if let Some(parallelism) = submission.parallelism {
        config.set_from("parallelism.default", parallelism.to_string(), "-p");
    }
    config.validate().map_err(Error::usage)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn a_submission_overrides_the_cluster_configuration_and_its_p_wins() {
        let mut cluster = Configuration::new();
        cluster.set("parallelism.default", "2");
        cluster.set("pipeline.name", "cluster-name");
        let submission = JobSubmission {
            config: args(&["pipeline.name=own-name", "parallelism.default=3"]),
            parallelism: Some(4),
            ..JobSubmission::default()
        };
        let config = job_config(&cluster, &submission).unwrap();
        assert_eq!(config.get(&PARALLELISM_DEFAULT).unwrap(), 4);
        assert_eq!(config.get(&PIPELINE_NAME).unwrap().as_deref(), Some("own-name"));
        assert_eq!(cluster.get(&PARALLELISM_DEFAULT).unwrap(), 2, "the cluster's own configuration is untouched");
    }

    #[test]
    fn a_bad_override_is_a_usage_error_naming_the_key() {
        let submission = JobSubmission { config: args(&["parallelism.default=abc"]), ..JobSubmission::default() };
        match job_config(&Configuration::new(), &submission) {
            Err(Error::Usage(message)) => assert!(message.contains("parallelism.default"), "{message}"),
            other => panic!("expected a usage error, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn an_unknown_job_is_a_usage_error_listing_the_catalog() {
        let catalog = weir_jobs::builtin_catalog();
        match build_graph(&catalog, &Configuration::new(), "nosuchjob", &[]) {
            Err(Error::Usage(message)) => {
                assert!(message.starts_with("unknown job 'nosuchjob'; the catalog has: "), "{message}");
                assert!(message.contains("counter") && message.contains("(see `weir jobs`)"), "{message}");
            }
            other => panic!("expected a usage error, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn a_prepared_job_takes_its_name_and_settings_from_the_configuration() {
        let catalog = weir_jobs::builtin_catalog();
        let mut config = Configuration::new();
        config.set("pipeline.name", "counting");
        config.set("parallelism.default", "3");
        config.set("jobmanager.execution.failover-strategy", "full");
        let prepared = prepare(&catalog, &config, "counter", &args(&["--users", "2", "--events", "10"]), None, false)
            .expect("counter prepares");
        assert_eq!(prepared.graph.job_name, "counting");
        assert_eq!(prepared.settings.default_parallelism, 3);
        assert!(prepared.settings.failover_full);
        assert!(prepared.settings.restore.is_none() && prepared.settings.ha.is_none());
        assert!(prepared.notes.is_empty());
    }

    #[test]
    fn a_snapshot_that_is_not_there_is_refused_before_anything_starts() {
        let catalog = weir_jobs::builtin_catalog();
        let dir = std::env::temp_dir().join(format!("weir-jobmanager-no-snapshot-{}", std::process::id()));
        let path = dir.join("_metadata").display().to_string();
        let result = prepare(&catalog, &Configuration::new(), "counter", &args(&["--users", "2"]), Some(&path), false);
        match result {
            Err(Error::Usage(message)) => assert!(message.contains(&dir.display().to_string()), "{message}"),
            other => panic!("expected a usage error, got {:?}", other.map(|_| ())),
        }
    }
}
