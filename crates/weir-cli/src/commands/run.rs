//! `weir run`: builds a catalog job and runs it on an embedded cluster in this process.

use std::process::ExitCode;
use std::sync::Arc;

use weir_api::catalog::{JobArgs, JobCatalog};
use weir_api::datastream::StreamExecutionEnvironment;
use weir_config::Configuration;
use weir_config::options::{
    PARALLELISM_DEFAULT, PIPELINE_MAX_PARALLELISM, PIPELINE_NAME, REST_ADDRESS, REST_BIND_ADDRESS, REST_PORT,
};
use weir_rest::{ClusterInfo, RestServer};
use weir_runtime::{Dispatcher, JobGraph, JobSettings};
use weir_types::JobStatus;

use crate::args::RunArgs;
use crate::error::CliError;
use crate::settings;

pub fn run(args: RunArgs, catalog: &JobCatalog) -> Result<ExitCode, CliError> {
    let mut config = settings::load(&args.config)?;
    if let Some(parallelism) = args.parallelism {
        config.set_from("parallelism.default", parallelism.to_string(), "-p");
        config.validate().map_err(CliError::usage)?;
    }

    let Some(job) = catalog.get(&args.job) else {
        let names: Vec<&str> = catalog.jobs().iter().map(|j| j.name()).collect();
        return Err(CliError::usage(format!(
            "unknown job '{}'; the catalog has: {} (see `weir jobs`)",
            args.job,
            names.join(", ")
        )));
    };
    let job_args = JobArgs::parse(job.name(), &job.args(), &args.job_args).map_err(CliError::usage)?;
    let env = StreamExecutionEnvironment::new();
    job.build(&job_args, &env).map_err(CliError::usage)?;
    let job_name = config.get(&PIPELINE_NAME).map_err(CliError::usage)?.unwrap_or_else(|| job.name().to_string());
    let graph = env.build(&job_name).map_err(CliError::usage)?;
    let settings = JobSettings {
        default_parallelism: config.get(&PARALLELISM_DEFAULT).map_err(CliError::usage)?,
        max_parallelism: config.get(&PIPELINE_MAX_PARALLELISM).map_err(CliError::usage)?,
    };
    // Every check that does not need a running cluster happens before anything starts.
    let job_graph = JobGraph::build(&graph, &settings).map_err(CliError::usage)?;
    let slots = job_graph.vertices.iter().map(|v| v.parallelism).max().unwrap_or(1);

    let dispatcher = Dispatcher::new("localhost");
    let rest = start_rest(&config, &dispatcher, slots)?;
    eprintln!("Embedded cluster: REST API at http://{}", rest.local_addr());

    let master = dispatcher.submit(graph, settings).map_err(CliError::usage)?;
    println!("Job has been submitted with JobID {}", master.job_id());
    let status = master.wait_terminal(None);
    let duration_ms = master.overview().duration;
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

/// Binds the REST API. An explicitly configured port must be free; the default port falls
/// back to any free port with a warning, so a second embedded run just works.
fn start_rest(config: &Configuration, dispatcher: &Arc<Dispatcher>, slots: u32) -> Result<RestServer, CliError> {
    let address = match config.get(&REST_BIND_ADDRESS).map_err(CliError::usage)? {
        Some(bind) => bind,
        None => config.get(&REST_ADDRESS).map_err(CliError::usage)?,
    };
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    let cluster =
        || ClusterInfo { taskmanagers: 1, slots_total: slots, version: env!("CARGO_PKG_VERSION").to_string() };
    match RestServer::start(&address, port, Arc::clone(dispatcher), cluster()) {
        Ok(server) => Ok(server),
        Err(error) if config.contains(&REST_PORT) => Err(CliError::runtime(error)),
        Err(error) => {
            eprintln!("warning: {error}; using a free port instead");
            RestServer::start(&address, 0, Arc::clone(dispatcher), cluster()).map_err(CliError::runtime)
        }
    }
}
