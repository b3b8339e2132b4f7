//! Loading the configuration for a command: file, `-D` overrides, warnings printed once.

use std::path::PathBuf;

use weir_config::Configuration;
use weir_config::options::{REST_ADDRESS, REST_PORT};

use crate::args::ConfigArgs;
use crate::error::CliError;

/// Loads, validates and warns; configuration mistakes are usage errors (exit 2).
pub fn load(args: &ConfigArgs) -> Result<Configuration, CliError> {
    let file = match &args.config {
        Some(path) => Some(path.clone()),
        None => default_config_file(),
    };
    let config = Configuration::load(file.as_deref(), &args.dynamic).map_err(CliError::usage)?;
    config.validate().map_err(CliError::usage)?;
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(config)
}

fn default_config_file() -> Option<PathBuf> {
    let dir = std::env::var_os("WEIR_CONF_DIR")?;
    let path = PathBuf::from(dir).join("config.yaml");
    path.is_file().then_some(path)
}

/// The REST address to talk to: `-m`, else `$WEIR_JOBMANAGER`, else `rest.address:rest.port`.
pub fn jobmanager_address(explicit: Option<&str>, config: &Configuration) -> Result<String, CliError> {
    if let Some(address) = explicit {
        return Ok(address.to_string());
    }
    if let Ok(address) = std::env::var("WEIR_JOBMANAGER")
        && !address.is_empty()
    {
        return Ok(address);
    }
    let host = config.get(&REST_ADDRESS).map_err(CliError::usage)?;
    let port = config.get(&REST_PORT).map_err(CliError::usage)?;
    Ok(format!("{host}:{port}"))
}
