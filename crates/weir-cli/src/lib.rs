//! The weir command line as a library: `weir run|list|cancel|jobs`.
//!
//! A user's own binary gets the same command line for its own jobs:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     let mut catalog = weir_jobs::builtin_catalog();
//!     // catalog.register(MyJob);
//!     weir_cli::main_with(catalog)
//! }
//! ```
#![warn(missing_docs)]

mod args;
mod client;
mod commands;
mod error;
mod progress;
mod runs;
mod settings;
mod signals;

use std::process::ExitCode;

use clap::Parser;
use weir_api::catalog::JobCatalog;

pub use error::CliError;

/// Parses the process arguments and runs the command against `catalog`.
pub fn main_with(catalog: JobCatalog) -> ExitCode {
    install_panic_hook();
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = ExitCode::from(e.exit_code().clamp(0, 255) as u8);
            match e.kind() {
                // Help and version go to stdout as clap renders them.
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                }
                // A usage error is one `error:` line, as every other error.
                _ => {
                    eprintln!("{}", usage_error_line(&e.render().to_string()));
                }
            }
            return code;
        }
    };
    // The operator tells every step it takes, as Flink's operator logs each reconcile at
    // INFO; `weir run` and the other commands say only what went wrong unless WEIR_LOG asks
    // for more.
    // A JobManager and a TaskManager log at info, as Flink's do (their logs go to files and
    // the Web UI): registrations, checkpoints, restarts.
    let default_filter = match cli.command {
        args::Command::Operator(_) => "warn,weir_deploy=info,weir_kubernetes=info",
        args::Command::Jobmanager(_) | args::Command::Taskmanager(_) => {
            "warn,weir_runtime=info,weir_jobmanager=info,weir_rest=info,weir_ha=info,weir_checkpoint=info,weir_cli=info"
        }
        _ => "warn",
    };
    init_logging(default_filter);
    if let Err(error) = weir_runtime::crash::arm_from_env() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    match commands::dispatch(cli, std::sync::Arc::new(catalog)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// clap's rendered usage error as one `error:` line: what is wrong, with the arguments it
/// names (clap lists missing ones on lines of their own) and its "tip:" (a similar
/// subcommand or flag), without the usage block.
fn usage_error_line(rendered: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        parts.push(line.to_string());
    }
    let Some((first, rest)) = parts.split_first() else { return "error: invalid arguments (see --help)".into() };
    let mut text = first.trim_end_matches(':').to_string();
    if !rest.is_empty() {
        let (tips, named): (Vec<&String>, Vec<&String>) = rest.iter().partition(|l| l.starts_with("tip:"));
        if !named.is_empty() {
            text.push_str(": ");
            text.push_str(&named.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
        }
        for tip in tips {
            text.push_str("; ");
            text.push_str(tip);
        }
    }
    format!("{text} (see --help)")
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Also kept in memory for the REST API's /jobmanager/log.
        .with_writer(|| weir_runtime::log_tail::TeeToStderr)
        // Its own write errors it would print with `eprintln!`, which panics on a closed
        // stderr (see `TeeToStderr`).
        .log_internal_errors(false)
        .with_target(false);
    // WEIR_LOG_FORMAT=json: one JSON object per line, for log shippers (Flink's JSON layout).
    if std::env::var("WEIR_LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json")) {
        let _ = builder.json().flatten_event(true).with_current_span(false).try_init();
        return;
    }
    // Colours on a terminal only: cluster processes log to files.
    let _ = builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init();
}

/// Panics in subtask threads are user-code failures the job reports (FAILED with the panic
/// message); printing them again as a raw panic would only confuse. Other panics are weir
/// bugs and keep the default report.
fn install_panic_hook() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // `weir list | head -1`: the reader went away, and `println!` panics on a closed
        // stdout (Rust ignores SIGPIPE). Unwind without a message, as a Unix tool dies of
        // SIGPIPE silently; destructors still run.
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("Broken pipe") || message.contains("BrokenPipe") {
            return;
        }
        let in_task = std::thread::current().name().is_some_and(|name| name.starts_with("weir-task-"));
        if !in_task {
            default_hook(info);
        }
    }));
}
