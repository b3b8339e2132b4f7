//! One module per verb.

mod cancel;
pub(crate) mod cluster;
pub(crate) mod deployment;
mod jobs;
mod kafka;
mod list;
mod operator;
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
        Command::Deployment(command) => deployment::deployment(command),
        Command::Operator(args) => operator::operator(args),
        Command::Kafka(command) => kafka::kafka(command),
        Command::Completions { shell } => completions(shell),
    }
}

/// Prints the completion script for the binary's own name (a custom job binary built on
/// `weir_cli::main_with` completes as itself).
fn completions(shell: clap_complete::Shell) -> Result<ExitCode, CliError> {
    use clap::CommandFactory;
    let name = std::env::args_os()
        .next()
        .and_then(|arg| std::path::Path::new(&arg).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "weir".to_string());
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
