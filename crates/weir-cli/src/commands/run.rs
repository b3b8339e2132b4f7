//! `weir run`: builds a catalog job and runs it on an embedded cluster in this process.

use std::process::ExitCode;
use std::sync::Arc;

use weir_api::catalog::JobCatalog;
use weir_config::Configuration;
use weir_config::options::{REST_PORT, RESTORE_NEWEST_RETAINED};
use weir_jobmanager::settings::{host_port, rest_hosts, shown_configuration};
use weir_jobmanager::{PreparedJob, prepare};
use weir_rest::{ClusterInfo, RestServer};
use weir_runtime::{Dispatcher, JobGraph, JobMaster};
use weir_types::JobStatus;

use crate::args::RunArgs;
use crate::error::CliError;
use crate::settings;

/// Longest the embedded REST API stays up after the job ended, for savepoint clients.
const REPORT_LINGER_MAX: std::time::Duration = std::time::Duration::from_secs(3);

pub fn run(args: RunArgs, catalog: &JobCatalog) -> Result<ExitCode, CliError> {
    let mut config = settings::load(&args.config)?;
    if let Some(parallelism) = args.parallelism {
        config.set_from("parallelism.default", parallelism.to_string(), "-p");
        config.validate().map_err(CliError::usage)?;
    }
    if let Some(target) = &args.target {
        config.set_from("execution.target", target.clone(), "-t");
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
    run_embedded(&args, catalog, &config)
}

/// Runs the job on an embedded cluster in this process, its REST API up while it runs.
fn run_embedded(args: &RunArgs, catalog: &JobCatalog, config: &Configuration) -> Result<ExitCode, CliError> {
    let PreparedJob { graph, settings, notes } = prepare(
        catalog,
        config,
        &args.job,
        &args.job_args,
        args.from_savepoint.as_deref(),
        args.allow_non_restored_state,
    )?;
    for note in &notes {
        eprintln!("{note}");
    }
    let job_graph = JobGraph::build(&graph, &settings).map_err(CliError::usage)?;
    // Records on stdout: the run's own lines go to stderr, so `> out.txt` holds records only.
    let records_on_stdout = graph.writes_to_stdout();
    let status_line = |line: String| {
        if records_on_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let slots = job_graph.vertices.iter().map(|v| v.parallelism).max().unwrap_or(1);

    let dispatcher = Dispatcher::new("localhost");
    let rest = start_rest(config, &dispatcher, slots)?;
    let (_, rest_host) = rest_hosts(config)?;
    eprintln!("Embedded cluster: REST API at http://{}", host_port(&rest_host, rest.local_addr().port()));

    let job_id = weir_jobmanager::fixed_job_id(config)?.unwrap_or_else(weir_types::JobId::generate);
    let master = dispatcher.submit_as(job_id, graph, settings).map_err(CliError::usage)?;
    status_line(format!("Job has been submitted with JobID {}", master.job_id()));
    // Found by `weir list`/`stop` without -m even if the REST port moved off a taken 8081.
    let _registered = crate::runs::register(
        &master.job_id().to_string(),
        &format!("http://{}", host_port(&rest_host, rest.local_addr().port())),
    );
    cancel_on_termination(&master)?;
    if args.from_savepoint.is_some() {
        crate::progress::follow_restore(|| Ok(master.details()))?;
    }
    let status = master.wait_terminal(None);
    let duration_ms = master.overview().duration;
    linger_for_savepoint_clients(&master);
    rest.shutdown();

    status_line(format!("Job {} ended with state {status} after {duration_ms} ms", master.job_id()));
    match status {
        JobStatus::Finished => Ok(ExitCode::SUCCESS),
        JobStatus::Failed => {
            let cause = master.failure_cause().unwrap_or_else(|| "no cause recorded".into());
            Err(CliError::runtime(format!("job {} FAILED: {cause}", master.job_id())))
        }
        _ => Ok(ExitCode::from(1)),
    }
}

/// Ctrl-C (SIGINT) or SIGTERM: cancel the job and say where it can resume from (retained
/// checkpoints outlive a cancel, as Flink's RETAIN_ON_CANCELLATION); a second one exits.
fn cancel_on_termination(master: &Arc<JobMaster>) -> Result<(), CliError> {
    let interrupted = Arc::clone(master);
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
    Ok(())
}

/// Waits, at most [`REPORT_LINGER_MAX`], while savepoints of the ended job are unreported.
fn linger_for_savepoint_clients(master: &JobMaster) {
    // A `weir stop` or `weir savepoint` client may still have to read where its savepoint is.
    let linger_until = std::time::Instant::now() + REPORT_LINGER_MAX;
    while master.has_unreported_savepoints() && std::time::Instant::now() < linger_until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `weir run --dry-run`: every check `run` does before it starts a job (catalog job and its
/// arguments, configuration, job graph, and with `-s` the restore pre-flight: uids, max
/// parallelism, parallelism, key types, the kind and type of every declared state), then a report of what would run and what each
/// operator would restore. Nothing is started or written.
fn dry_run(args: &RunArgs, catalog: &JobCatalog, config: &Configuration) -> Result<ExitCode, CliError> {
    let snapshot = match args.from_savepoint.as_deref() {
        Some(path) if config.get(&RESTORE_NEWEST_RETAINED).map_err(CliError::usage)? => Some(
            weir_checkpoint::io_runtime()
                .block_on(weir_checkpoint::newest_complete_checkpoint_from(path))
                .unwrap_or_else(|| path.to_string()),
        ),
        other => other.map(str::to_string),
    };
    let PreparedJob { graph, settings, notes } =
        prepare(catalog, config, &args.job, &args.job_args, snapshot.as_deref(), args.allow_non_restored_state)?;
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

/// Binds the REST API. An explicitly configured port must be free; the default port falls
/// back to any free port with a warning, so a second embedded run just works.
fn start_rest(config: &Configuration, dispatcher: &Arc<Dispatcher>, slots: u32) -> Result<RestServer, CliError> {
    let (address, _) = rest_hosts(config)?;
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    let cluster = || ClusterInfo {
        taskmanagers: 1,
        slots_total: slots,
        version: env!("CARGO_PKG_VERSION").to_string(),
        configuration: shown_configuration(config),
        ..ClusterInfo::default()
    };
    match RestServer::start(&address, port, Arc::clone(dispatcher), cluster()) {
        Ok(server) => Ok(server),
        Err(error) if config.contains(&REST_PORT) => Err(CliError::runtime(error)),
        Err(error) => {
            eprintln!(
                "warning: {error}; using a free port instead (`weir list`, `stop`, `cancel` and `savepoint` without -m find this run's job there)"
            );
            RestServer::start(&address, 0, Arc::clone(dispatcher), cluster()).map_err(CliError::runtime)
        }
    }
}
