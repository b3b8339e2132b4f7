//! Version 3 of the user's binary (see `custom_job::versions`): what the deployment tests
//! upgrade to.

fn main() -> std::process::ExitCode {
    weir_cli::main_with(custom_job::catalog(custom_job::versions::Version::V3))
}
