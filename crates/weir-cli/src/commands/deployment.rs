//! `weir deployment apply | get | history | delete`: the user's side of declarative
//! deployments (kubectl's side of a FlinkDeployment). The spec goes to the store the
//! operator reads: the data directory, or etcd when the configuration sets HA.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_config::Configuration;
use weir_deploy::store::{DeploymentStore, EtcdStore, FileStore, StoredDeployment};

use crate::args::{
    DeploymentApplyArgs, DeploymentCommand, DeploymentEventsArgs, DeploymentGetArgs, DeploymentNameArgs, OutputFormat,
};
use crate::error::CliError;
use crate::settings;

/// How long `delete` waits for a running operator to remove the deployment.
const DELETE_WAIT_MAX: Duration = Duration::from_secs(120);

/// The deployments' store and the directory their processes live under.
pub(crate) struct Deployments {
    pub store: Arc<dyn DeploymentStore>,
    /// `<data dir>/deployments`.
    pub root: PathBuf,
    /// With HA: the etcd client and cluster id (the operator's election).
    pub etcd: Option<(Arc<weir_ha::EtcdClient>, String)>,
}

/// The store the configuration names: etcd with `high-availability.type: etcd`, else the
/// data directory.
pub(crate) fn open(config: &Configuration) -> Result<Deployments, CliError> {
    let root = settings::data_dir().join("deployments");
    // The operator's own store is etcd only: with Kubernetes HA the operator runs as
    // `weir operator --kubernetes`, its deployments are resources.
    match weir_jobmanager::settings::ha_settings(config)?.filter(|ha| ha.kubernetes.is_none()) {
        Some(ha) => {
            let client = Arc::new(weir_ha::EtcdClient::connect(&ha.endpoints).map_err(CliError::runtime)?);
            let store = Arc::new(EtcdStore::new(Arc::clone(&client), &ha.cluster_id));
            Ok(Deployments { store, root, etcd: Some((client, ha.cluster_id)) })
        }
        None => Ok(Deployments { store: Arc::new(FileStore::new(&root)), root, etcd: None }),
    }
}

impl Deployments {
    /// Whether an operator controls these deployments right now.
    pub fn operator_running(&self) -> bool {
        match &self.etcd {
            Some((client, cluster_id)) => {
                weir_deploy::lock::election(Arc::clone(client), cluster_id).leader().ok().flatten().is_some()
            }
            None => weir_deploy::lock::file_lock_held(&self.root),
        }
    }
}

pub fn deployment(command: DeploymentCommand) -> Result<ExitCode, CliError> {
    match command {
        DeploymentCommand::Apply(args) => apply(args),
        DeploymentCommand::Get(args) => get(args),
        DeploymentCommand::History(args) => history(args),
        DeploymentCommand::Events(args) => events(args),
        DeploymentCommand::Delete(args) => delete(args),
    }
}

fn store_error(error: weir_deploy::store::StoreError) -> CliError {
    CliError::runtime(error)
}

fn apply(args: DeploymentApplyArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", args.file.display())))?;
    let mut warnings = Vec::new();
    let mut deployment = weir_deploy::spec::parse(&text, &mut warnings)
        .map_err(|e| CliError::usage(format!("{}: {e}; nothing was applied", args.file.display())))?;
    deployment.spec.binary = resolve_binary(&deployment.spec.binary)
        .map_err(|e| CliError::usage(format!("{}: spec.binary: {e}; nothing was applied", args.file.display())))?;
    if let Some(path) = &deployment.spec.job.initial_savepoint_path
        && !path.contains("://")
        && !path.starts_with('/')
    {
        let absolute =
            std::path::absolute(path).map_err(|e| CliError::usage(format!("spec.job.initialSavepointPath: {e}")))?;
        deployment.spec.job.initial_savepoint_path = Some(absolute.display().to_string());
    }
    for (index, arg) in deployment.spec.job.args.iter().enumerate() {
        if arg.contains('/') && !arg.starts_with('/') && !arg.contains("://") && !arg.starts_with('-') {
            warnings.push(format!(
                "spec.job.args[{index}]: '{arg}' looks like a relative path; the deployment's processes do not run in this directory, so give an absolute path"
            ));
        }
    }
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    validate_job(&deployment).map_err(|e| {
        CliError::usage(format!("{}: spec.job: the job does not start: {e}; nothing was applied", args.file.display()))
    })?;
    let deployments = open(&config)?;
    let name = deployment.metadata.name.clone();
    let existing = deployments.store.get(&name).map_err(store_error)?;
    // Applying the spec of a refused upgrade again tries it again.
    let retry = existing.as_ref().is_some_and(|stored| {
        stored.deployment.spec == deployment.spec
            && stored.status.refused_generation == Some(stored.deployment.metadata.generation)
    });
    let (outcome, generation) = deployments.store.apply(deployment, retry).map_err(store_error)?;
    let again = if retry { " (the refused upgrade is tried again)" } else { "" };
    println!("deployment.weir.dev/{name} {}{again} (generation {generation})", outcome.as_str());
    if !deployments.operator_running() {
        eprintln!(
            "note: no `weir operator` controls the deployments in {} right now; the spec takes effect when one runs",
            deployments.store.describe()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the deployment's binary builds its job from the spec's name, arguments and
/// configuration (`run --dry-run`, no snapshot): a typo is refused at apply, not by the
/// operator's pre-flight after the user walked away. The pre-flight still checks the new
/// spec against the state it would start from.
fn validate_job(deployment: &weir_deploy::WeirDeployment) -> Result<(), String> {
    let spec = &deployment.spec;
    let dir = std::env::temp_dir().join(format!("weir-apply-{}", std::process::id()));
    let dirs = weir_deploy::processes::DeploymentDirs::new(dir.clone());
    let ports = weir_deploy::processes::Ports { rest: 0, rpc: 0 };
    let configuration = weir_deploy::processes::cluster_configuration(spec, &deployment.metadata.name, 0, &dirs, ports);
    let checked = weir_deploy::processes::write_configuration(&dir, &configuration)
        .and_then(|config| weir_deploy::processes::dry_run(&spec.binary, spec, &config, None));
    let _ = std::fs::remove_dir_all(&dir);
    checked.map(drop)
}

/// An absolute path of an executable file: a path as given, or a name looked up on `PATH`.
fn resolve_binary(binary: &str) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |path: &Path| path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if binary.contains('/') {
        let path = std::path::absolute(binary).map_err(|e| format!("'{binary}': {e}"))?;
        if !path.exists() {
            return Err(format!("{} does not exist; build it first or fix the path", path.display()));
        }
        if !executable(&path) {
            return Err(format!("{} is not an executable file", path.display()));
        }
        return Ok(path.display().to_string());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| executable(candidate))
        .map(|found| found.display().to_string())
        .ok_or_else(|| format!("'{binary}' is not on PATH; give the program's path"))
}

fn find(deployments: &Deployments, name: &str) -> Result<StoredDeployment, CliError> {
    deployments.store.get(name).map_err(store_error)?.ok_or_else(|| {
        CliError::runtime(format!(
            "no deployment '{name}' in {}; `weir deployment get` lists them",
            deployments.store.describe()
        ))
    })
}

fn print_structured(value: &serde_json::Value, format: OutputFormat) -> Result<(), CliError> {
    match format {
        OutputFormat::Json => {
            println!("{}", serde_json::to_string_pretty(value).map_err(CliError::runtime)?);
        }
        OutputFormat::Yaml => print!("{}", serde_norway::to_string(value).map_err(CliError::runtime)?),
    }
    Ok(())
}

fn get(args: DeploymentGetArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let deployments = open(&config)?;
    if let Some(name) = &args.name {
        let stored = find(&deployments, name)?;
        match args.output {
            Some(format) => print_structured(&stored.to_json(), format)?,
            None => describe(&stored),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let all = deployments.store.list().map_err(store_error)?;
    if let Some(format) = args.output {
        let items: Vec<serde_json::Value> = all.iter().map(StoredDeployment::to_json).collect();
        print_structured(&serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": items }), format)?;
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        println!("No deployments in {}.", deployments.store.describe());
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 6]> = all
        .iter()
        .map(|stored| {
            let status = &stored.status;
            [
                stored.deployment.metadata.name.clone(),
                status.lifecycle_state.as_str().to_string(),
                status.job_status.state.clone().unwrap_or_else(|| "-".into()),
                stored.deployment.spec.job.upgrade_mode.as_str().to_string(),
                match refused(stored) {
                    Some(generation) => format!(
                        "{}/{} ({generation} refused)",
                        status.observed_generation, stored.deployment.metadata.generation
                    ),
                    None => format!("{}/{}", status.observed_generation, stored.deployment.metadata.generation),
                },
                status.job_status.job_id.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = ["NAME", "LIFECYCLE", "JOB STATE", "UPGRADE MODE", "GENERATION", "JOB ID"];
    let widths: Vec<usize> =
        (0..6).map(|i| rows.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: [&str; 6]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(&format!("{cell:<width$}  ", width = widths[i]));
        }
        println!("{}", text.trim_end());
    };
    line(header);
    for row in &rows {
        line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]);
    }
    for stored in &all {
        if let Some(error) = &stored.status.error {
            println!("{}: {error}", stored.deployment.metadata.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The generation the operator refused, while it is the applied one.
fn refused(stored: &StoredDeployment) -> Option<u64> {
    stored.status.refused_generation.filter(|g| *g == stored.deployment.metadata.generation)
}

/// A spec's job in one line.
fn spec_line(spec: &weir_deploy::DeploymentSpec) -> String {
    format!(
        "{} {} (parallelism {}, upgrade mode {}, {})",
        spec.job.name,
        spec.job.args.join(" "),
        spec.job.parallelism.map_or("default".to_string(), |p| p.to_string()),
        spec.job.upgrade_mode.as_str(),
        match spec.job.state {
            weir_deploy::spec::DesiredState::Running => "running",
            weir_deploy::spec::DesiredState::Suspended => "suspended",
        }
    )
}

/// One deployment, readable.
fn describe(stored: &StoredDeployment) {
    let spec = &stored.deployment.spec;
    let status = &stored.status;
    println!("Name:             {}", stored.deployment.metadata.name);
    println!("Generation:       {} (observed {})", stored.deployment.metadata.generation, status.observed_generation);
    println!("Lifecycle:        {}", status.lifecycle_state.as_str());
    // A refused spec is not what runs: the running one is shown, and the refused one apart.
    let running = match refused(stored) {
        Some(generation) => {
            println!(
                "Refused:          generation {generation}: {} (see Error; the job runs on as it was)",
                spec_line(spec)
            );
            status.reconciliation_status.last_reconciled_spec.as_ref().unwrap_or(spec)
        }
        None => spec,
    };
    println!("Binary:           {}", running.binary);
    println!("Job:              {}", spec_line(running));
    let job = &status.job_status;
    println!(
        "Job status:       {} {}",
        job.state.as_deref().unwrap_or("-"),
        job.job_id.as_deref().map(|id| format!("(job {id})")).unwrap_or_default()
    );
    if let Some(cluster) = &status.cluster_info {
        println!("Cluster:          {} (REST API and Web UI), processes in {}", cluster.rest_address, cluster.dir);
    }
    if let Some(path) = &job.upgrade_savepoint_path {
        println!("Upgrade savepoint: {path}");
    }
    if let Some(path) = &job.last_checkpoint_path {
        println!("Last checkpoint:  {path}");
    }
    println!("Reconciliation:   {}", status.reconciliation_status.state.as_str());
    if let Some(operation) = &status.operation {
        println!(
            "In progress:      {:?} to generation {} ({} mode): {}",
            operation.kind,
            operation.generation,
            operation.mode.as_str(),
            operation.step.describe()
        );
    }
    println!("Savepoints:       {} in the history", status.savepoint_history.len());
    if let Some(error) = &status.error {
        println!("Error:            {error}");
    }
}

fn history(args: DeploymentNameArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let deployments = open(&config)?;
    let stored = find(&deployments, &args.name)?;
    let history = &stored.status.savepoint_history;
    if history.is_empty() {
        println!("No savepoints in the history of '{}' yet.", args.name);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<23}  {:<8}  {:<9}  LOCATION", "TIME", "TRIGGER", "FORMAT");
    for record in history.iter().rev() {
        println!(
            "{:<23}  {:<8}  {:<9}  {}",
            weir_checkpoint::inspect::format_utc(record.time_stamp),
            record.trigger_type.as_str(),
            record.format_type,
            record.location
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The operator's events of one deployment, oldest first, as `kubectl describe` lists a
/// resource's Events.
fn events(args: DeploymentEventsArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let deployments = open(&config)?;
    find(&deployments, &args.name)?;
    let events = deployments.store.events(&args.name).map_err(store_error)?;
    if let Some(format) = args.output {
        let value = serde_json::json!({ "events": events });
        print_structured(&value, format)?;
        return Ok(ExitCode::SUCCESS);
    }
    if events.is_empty() {
        println!(
            "No events of '{}' yet: the operator records them as it acts (`weir operator -d` starts it).",
            args.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<23}  {:<7}  {:<18}  MESSAGE", "TIME", "TYPE", "REASON");
    for event in &events {
        println!(
            "{:<23}  {:<7}  {:<18}  {}",
            weir_checkpoint::inspect::format_utc(event.time_ms),
            event.kind,
            event.reason,
            event.message
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn delete(args: DeploymentNameArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let deployments = open(&config)?;
    if !deployments.store.request_delete(&args.name).map_err(store_error)? {
        return Err(CliError::runtime(format!(
            "no deployment '{}' in {}; `weir deployment get` lists them",
            args.name,
            deployments.store.describe()
        )));
    }
    if !deployments.operator_running() {
        println!(
            "deployment.weir.dev/{} marked for deletion; its job and cluster stop when `weir operator` runs",
            args.name
        );
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    while deployments.store.get(&args.name).map_err(store_error)?.is_some() {
        if started.elapsed() > DELETE_WAIT_MAX {
            return Err(CliError::runtime(format!(
                "deployment '{}' is marked for deletion but still there after {DELETE_WAIT_MAX:?}; `weir deployment get {}` says what the operator is doing",
                args.name, args.name
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("deployment.weir.dev/{} deleted", args.name);
    Ok(ExitCode::SUCCESS)
}
