//! The `weir` binary: the command line over the built-in job catalog.

fn main() -> std::process::ExitCode {
    weir_cli::main_with(weir_jobs::builtin_catalog())
}
