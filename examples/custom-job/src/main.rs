//! A user's own weir binary: every built-in job plus its own (`sensor-stats`,
//! `flaky-counter`, `versioned-counter` v1), with the same command line as `weir`
//! (`my-weir run sensor-stats --input readings.csv --output -`).

fn main() -> std::process::ExitCode {
    weir_cli::main_with(custom_job::catalog(custom_job::versions::Version::V1))
}
