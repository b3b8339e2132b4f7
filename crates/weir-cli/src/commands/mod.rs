//! One module per verb.

mod cancel;
mod jobs;
mod list;
mod run;
pub(crate) mod savepoint;

use std::process::ExitCode;

use weir_api::catalog::JobCatalog;

use crate::args::{Cli, Command};
use crate::error::CliError;

/// Runs the parsed command.
pub fn dispatch(cli: Cli, catalog: &JobCatalog) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Run(args) => run::run(args, catalog),
        Command::List(args) => list::list(args),
        Command::Cancel(args) => cancel::cancel(args),
        Command::Jobs => jobs::jobs(catalog),
        Command::Stop(args) => savepoint::stop(args),
        Command::Savepoint(args) => savepoint::savepoint(args),
    }
}
