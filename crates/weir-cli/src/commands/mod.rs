//! One module per verb.

mod cancel;
pub(crate) mod cluster;
mod jobs;
mod list;
pub(crate) mod run;
pub(crate) mod savepoint;

use std::process::ExitCode;

use weir_api::catalog::JobCatalog;

use crate::args::{Cli, Command};
use crate::error::CliError;

/// Runs the parsed command.
pub fn dispatch(cli: Cli, catalog: std::sync::Arc<JobCatalog>) -> Result<ExitCode, CliError> {
    let catalog_ref: &JobCatalog = &catalog;
    match cli.command {
        Command::Jobmanager(args) => cluster::jobmanager(args, std::sync::Arc::clone(&catalog)),
        Command::Taskmanager(args) => cluster::taskmanager(args, std::sync::Arc::clone(&catalog)),
        Command::Cluster(command) => cluster::cluster(command),
        Command::Run(args) => run::run(args, catalog_ref),
        Command::List(args) => list::list(args),
        Command::Cancel(args) => cancel::cancel(args),
        Command::Jobs => jobs::jobs(catalog_ref),
        Command::Stop(args) => savepoint::stop(args),
        Command::Savepoint(args) => savepoint::savepoint(args),
    }
}
