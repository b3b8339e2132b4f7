//! `weir jobs`: the catalog with each job's arguments.

use std::process::ExitCode;

use weir_api::catalog::JobCatalog;

use crate::error::CliError;

pub fn jobs(catalog: &JobCatalog) -> Result<ExitCode, CliError> {
    let mut text = String::new();
    for job in catalog.jobs() {
        text.push_str(&format!(
            "{}\n    {}\n    usage: weir run [OPTIONS] {}\n",
            job.name(),
            job.description(),
            JobCatalog::usage(job)
        ));
        for arg in job.args() {
            let name = match arg.value_name {
                Some(value) => format!("--{} {value}", arg.name),
                None => format!("--{}", arg.name),
            };
            let required = if arg.required { " (required)" } else { "" };
            text.push_str(&format!("      {name:<24} {}{required}\n", arg.help));
        }
        text.push('\n');
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
