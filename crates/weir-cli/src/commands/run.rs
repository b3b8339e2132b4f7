//! `weir run`: builds a catalog job and runs it on an embedded cluster in this process.

use std::process::ExitCode;
use std::sync::Arc;

use weir_api::catalog::{JobArgs, JobCatalog};
use weir_api::datastream::StreamExecutionEnvironment;
use weir_api::graph::{StreamGraph, StreamNode};
use weir_checkpoint::SnapshotMetadata;
use weir_config::Configuration;
use weir_config::FailoverStrategy;
use weir_config::options::{
    FAILOVER_STRATEGY, PARALLELISM_DEFAULT, PIPELINE_AUTO_WATERMARK_INTERVAL, PIPELINE_MAX_PARALLELISM, PIPELINE_NAME,
    REST_PORT,
};
use weir_rest::{ClusterInfo, RestServer};
use weir_runtime::checkpointing::{RestoreOpenError, RestoreSource};
use weir_runtime::{Dispatcher, JobGraph, JobSettings};
use weir_types::JobStatus;

use crate::args::RunArgs;
use crate::commands::savepoint::snapshot_storage;
use crate::error::CliError;
use crate::settings;

/// Longest the embedded REST API stays up after the job ended, for savepoint clients.
const REPORT_LINGER_MAX: std::time::Duration = std::time::Duration::from_secs(3);

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
) -> Result<PreparedJob, CliError> {
    let graph = build_graph(catalog, config, job, job_args)?;
    let checkpointing = settings::checkpoint_settings(config)?;
    let restart = settings::restart_strategy(config, checkpointing.interval.is_some())?;
    let mut settings = JobSettings {
        default_parallelism: config.get(&PARALLELISM_DEFAULT).map_err(CliError::usage)?,
        max_parallelism: config.get(&PIPELINE_MAX_PARALLELISM).map_err(CliError::usage)?,
        checkpointing,
        restore: None,
        restart,
        executor: None,
        failover_full: config.get(&FAILOVER_STRATEGY).map_err(CliError::usage)? == FailoverStrategy::Full,
        ha: None,
        auto_watermark_interval_ms: Some(
            config.get(&PIPELINE_AUTO_WATERMARK_INTERVAL).map_err(CliError::usage)?.as_millis() as u64,
        ),
    };
    let mut notes = Vec::new();
    if let Some(path) = savepoint {
        let restore = plan_restore(path, &graph, &settings, allow_non_restored_state)?;
        notes.push(format!(
            "Restoring from {} ({} {}, max parallelism {})",
            restore.location, restore.metadata.kind, restore.metadata.checkpoint_id, restore.plan.max_parallelism
        ));
        for uid in &restore.plan.non_restored {
            notes.push(format!(
                "warning: the state of operator '{uid}' is not restored (-n/--allow-non-restored-state)"
            ));
        }
        notes.extend(check_restored_states(path, &graph, &restore)?);
        settings.max_parallelism = Some(restore.plan.max_parallelism);
        settings.restore = Some(Arc::new(restore));
    }
    JobGraph::build(&graph, &settings).map_err(CliError::usage)?;
    Ok(PreparedJob { graph, settings, notes })
}

/// The stream graph of catalog job `job` with `job_args`.
pub fn build_graph(
    catalog: &JobCatalog,
    config: &Configuration,
    job: &str,
    job_args: &[String],
) -> Result<StreamGraph, CliError> {
    let Some(definition) = catalog.get(job) else {
        let names: Vec<&str> = catalog.jobs().iter().map(|j| j.name()).collect();
        return Err(CliError::usage(format!(
            "unknown job '{job}'; the catalog has: {} (see `weir jobs`)",
            names.join(", ")
        )));
    };
    let parsed = JobArgs::parse(definition.name(), &definition.args(), job_args).map_err(CliError::usage)?;
    let env = StreamExecutionEnvironment::new();
    definition.build(&parsed, &env).map_err(CliError::usage)?;
    let job_name =
        config.get(&PIPELINE_NAME).map_err(CliError::usage)?.unwrap_or_else(|| definition.name().to_string());
    env.build(&job_name).map_err(CliError::usage)
}

pub fn run(args: RunArgs, catalog: &JobCatalog) -> Result<ExitCode, CliError> {
    let mut config = settings::load(&args.config)?;
    if let Some(parallelism) = args.parallelism {
        config.set_from("parallelism.default", parallelism.to_string(), "-p");
        config.validate().map_err(CliError::usage)?;
    }
    if args.dry_run {
        // The pre-flight a cluster would run, done here: it starts nothing, anywhere.
        return dry_run(&args, catalog, &config);
    }
    if let Some(address) = settings::cluster_address(args.jobmanager.as_deref(), &config)? {
        // The cluster's processes have their own working directories: paths are ours.
        let mut args = args;
        if let (Some(definition), Ok(cwd)) = (catalog.get(&args.job), std::env::current_dir()) {
            args.job_args = weir_api::catalog::absolute_path_args(&definition.args(), &args.job_args, &cwd);
        }
        return crate::commands::cluster::submit(&address, &args);
    }
    if args.detached {
        return Err(CliError::usage(
            "-d/--detached needs a cluster: pass -m HOST:PORT (start one with `weir cluster start`)",
        ));
    }
    let PreparedJob { graph, settings, notes } = prepare(
        catalog,
        &config,
        &args.job,
        &args.job_args,
        args.from_savepoint.as_deref(),
        args.allow_non_restored_state,
    )?;
    for note in &notes {
        eprintln!("{note}");
    }
    let job_graph = JobGraph::build(&graph, &settings).map_err(CliError::usage)?;
    let slots = job_graph.vertices.iter().map(|v| v.parallelism).max().unwrap_or(1);

    let dispatcher = Dispatcher::new("localhost");
    let rest = start_rest(&config, &dispatcher, slots)?;
    let (_, rest_host) = settings::rest_hosts(&config)?;
    eprintln!("Embedded cluster: REST API at http://{}", settings::host_port(&rest_host, rest.local_addr().port()));

    let master = dispatcher.submit(graph, settings).map_err(CliError::usage)?;
    println!("Job has been submitted with JobID {}", master.job_id());
    // Ctrl-C (SIGINT) or SIGTERM: cancel the job and say where it can resume from (retained
    // checkpoints outlive a cancel, as Flink's RETAIN_ON_CANCELLATION); a second one exits.
    let interrupted = Arc::clone(&master);
    crate::signals::on_termination("weir run", move |_| {
        eprintln!("Cancelling job {} (interrupted).", interrupted.job_id());
        let _ = interrupted.cancel();
        let newest = interrupted
            .checkpoint_stats()
            .history
            .iter()
            .rev()
            .find(|c| c.status == weir_runtime::checkpointing::stats::CheckpointStatus::Completed && !c.is_savepoint)
            .and_then(|c| c.external_path.clone());
        match newest {
            Some(path) => eprintln!("Its newest checkpoint is {path}; resume with: weir run -s {path} ..."),
            None => eprintln!("It completed no checkpoint: a new run starts from the beginning."),
        }
    })
    .map_err(|e| CliError::runtime(format!("cannot handle SIGINT: {e}")))?;
    if args.from_savepoint.is_some() {
        crate::progress::follow_restore(|| Ok(master.details()))?;
    }
    let status = master.wait_terminal(None);
    let duration_ms = master.overview().duration;
    // A `weir stop` or `weir savepoint` client may still have to read where its savepoint is.
    let linger_until = std::time::Instant::now() + REPORT_LINGER_MAX;
    while master.has_unreported_savepoints() && std::time::Instant::now() < linger_until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    rest.shutdown();

    println!("Job {} ended with state {status} after {duration_ms} ms", master.job_id());
    match status {
        JobStatus::Finished => Ok(ExitCode::SUCCESS),
        JobStatus::Failed => {
            let cause = master.failure_cause().unwrap_or_else(|| "no cause recorded".into());
            Err(CliError::runtime(format!("job {} FAILED: {cause}", master.job_id())))
        }
        _ => Ok(ExitCode::from(1)),
    }
}

/// `weir run --dry-run`: every check `run` does before it starts a job (catalog job and its
/// arguments, configuration, job graph, and with `-s` the restore pre-flight: uids, max
/// parallelism, parallelism, key types, the kind and type of every declared state), then a report of what would run and what each
/// operator would restore. Nothing is started or written.
fn dry_run(args: &RunArgs, catalog: &JobCatalog, config: &Configuration) -> Result<ExitCode, CliError> {
    let PreparedJob { graph, settings, notes } = prepare(
        catalog,
        config,
        &args.job,
        &args.job_args,
        args.from_savepoint.as_deref(),
        args.allow_non_restored_state,
    )?;
    let job_graph = JobGraph::build(&graph, &settings).map_err(CliError::usage)?;
    for note in &notes {
        println!("{note}");
    }
    println!(
        "Job '{}': {} task(s), {} subtask(s), max parallelism {}",
        graph.job_name,
        job_graph.vertices.len(),
        job_graph.subtask_count(),
        job_graph.max_parallelism
    );
    for vertex in &job_graph.vertices {
        println!("  task '{}' at parallelism {}", vertex.name, vertex.parallelism);
    }
    if let Some(restore) = &settings.restore {
        for node in graph.nodes() {
            let uid = node.uid_or_generated();
            let parallelism = job_graph.vertices[job_graph.vertex_of_node[node.id]].parallelism;
            let recorded = restore.metadata.operators.iter().find(|o| o.uid == uid);
            let finished = restore.plan.operators.get(&uid).map_or(0, |s| s.iter().filter(|s| s.finished).count());
            let mut what = match recorded {
                Some(operator) if operator.has_state() => {
                    format!("restores its state (parallelism {} -> {parallelism})", operator.parallelism)
                }
                Some(_) => "was in the snapshot without state".to_string(),
                None => "is new: starts as in a fresh job (empty state; a source reads from its beginning)".to_string(),
            };
            if finished > 0 {
                what.push_str(&format!(
                    "; {finished} of {parallelism} subtask(s) had finished: they read no input and do not emit their end-of-input results again"
                ));
            }
            println!("  operator '{uid}' {what}");
        }
        for uid in &restore.plan.non_restored {
            println!("  operator '{uid}' is only in the snapshot: its state is dropped (-n)");
        }
    }
    println!("Dry run: the job can start as given; nothing was started or written.");
    Ok(ExitCode::SUCCESS)
}

/// Runs every source's and sink's check of its restored state (read positions, pending
/// commits) before anything starts: a refusal names the snapshot and the operator; the lines
/// are what the restore will do.
fn check_restored_states(path: &str, graph: &StreamGraph, restore: &RestoreSource) -> Result<Vec<String>, CliError> {
    let mut lines = Vec::new();
    for node in graph.nodes() {
        let Some(check) = &node.restore_check else { continue };
        let uid = node.uid_or_generated();
        if !restore.plan.operators.contains_key(&uid) {
            continue;
        }
        let refused =
            |reason: String| CliError::usage(format!("cannot restore from {path}: operator '{uid}': {reason}"));
        let elements = restore.operator_state_elements(&uid, check.state).map_err(refused)?;
        for line in (check.check)(&elements).map_err(refused)? {
            lines.push(match line.strip_prefix("warning: ") {
                Some(warning) => format!("warning: operator '{uid}': {warning}"),
                None => format!("operator '{uid}': {line}"),
            });
        }
    }
    Ok(lines)
}

/// Reads the snapshot at `path` and checks that this job can start from it: uids, max
/// parallelism, parallelism. Nothing is written anywhere; a refusal changes nothing.
fn plan_restore(
    path: &str,
    graph: &StreamGraph,
    settings: &JobSettings,
    allow_non_restored_state: bool,
) -> Result<RestoreSource, CliError> {
    let storage = snapshot_storage(path)?;
    let request = weir_runtime::checkpointing::restore::restore_request(
        graph,
        |node| node.parallelism.or(graph.parallelism).unwrap_or(settings.default_parallelism),
        graph.max_parallelism.or(settings.max_parallelism),
        allow_non_restored_state,
    );
    let source = RestoreSource::read(storage, &request).map_err(|e| match e {
        RestoreOpenError::Plan(e) => CliError::usage(format!("cannot restore from {path}: {e}")),
        e => CliError::usage(e),
    })?;
    let metadata = &source.metadata;
    // A native snapshot is the writing backend's own layout: only that backend reads it.
    let backend = settings.checkpointing.state_backend();
    if !metadata.format.is_canonical()
        && !weir_runtime::checkpointing::coordinator::native_compatible(metadata.backend(), backend)
    {
        return Err(CliError::usage(format!(
            "cannot restore from {path}: it is a native snapshot of the {} state backend, and this job's backend is {backend} (state.backend.type); only the backend that wrote a native snapshot reads it: take a canonical savepoint of the old job (`weir savepoint --type canonical JOBID DIR` or `weir stop --type canonical`) and restore that",
            metadata.backend()
        )));
    }
    // Pre-flight: a keyed operator must keep its key type, and every state it declares the
    // kind and type the snapshot recorded (the tasks check the same again when they restore;
    // neither touches the snapshot).
    for node in graph.nodes() {
        check_declared_states(path, node, metadata)?;
    }
    for node in graph.nodes() {
        let uid = node.uid_or_generated();
        let recorded =
            metadata.operators.iter().find(|o| o.uid == uid && o.has_keyed_state()).and_then(|o| o.key_type.as_deref());
        if let (Some(recorded), Some(declared)) = (recorded, node.key_type)
            && recorded != declared
        {
            return Err(CliError::usage(format!(
                "cannot restore from {path}: operator '{uid}' was keyed by {recorded} in the snapshot and is keyed by {declared} now; the key type of a stateful operator cannot change (give the operator a new uid and pass -n to start it empty)"
            )));
        }
    }
    Ok(source)
}

/// Every state `node` declares must be of the kind and type the snapshot recorded for a state
/// of that name, if it recorded one.
fn check_declared_states(path: &str, node: &StreamNode, metadata: &SnapshotMetadata) -> Result<(), CliError> {
    let uid = node.uid_or_generated();
    let Some(recorded) = metadata.operators.iter().find(|o| o.uid == uid) else { return Ok(()) };
    for declared in &node.declared_states {
        let handle = recorded.subtasks.iter().flat_map(|s| &s.keyed_states).find(|h| h.name == declared.name);
        if let Some(handle) = handle
            && (handle.kind != declared.kind.to_string() || handle.value_type != declared.cell_type)
        {
            return Err(CliError::usage(format!(
                "cannot restore from {path}: state '{}' of operator '{uid}' is a {} state of {} in the snapshot, and the job now declares it as a {}; keep the old type, give the new state another name, or give the operator a new uid and pass -n to start it empty",
                declared.name,
                handle.kind,
                handle.value_type,
                declared.describe()
            )));
        }
    }
    Ok(())
}

/// Binds the REST API. An explicitly configured port must be free; the default port falls
/// back to any free port with a warning, so a second embedded run just works.
fn start_rest(config: &Configuration, dispatcher: &Arc<Dispatcher>, slots: u32) -> Result<RestServer, CliError> {
    let (address, _) = settings::rest_hosts(config)?;
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    let cluster = || ClusterInfo {
        taskmanagers: 1,
        slots_total: slots,
        version: env!("CARGO_PKG_VERSION").to_string(),
        configuration: settings::shown_configuration(config),
        ..ClusterInfo::default()
    };
    match RestServer::start(&address, port, Arc::clone(dispatcher), cluster()) {
        Ok(server) => Ok(server),
        Err(error) if config.contains(&REST_PORT) => Err(CliError::runtime(error)),
        Err(error) => {
            eprintln!("warning: {error}; using a free port instead");
            RestServer::start(&address, 0, Arc::clone(dispatcher), cluster()).map_err(CliError::runtime)
        }
    }
}
