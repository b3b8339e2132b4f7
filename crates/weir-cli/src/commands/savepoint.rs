//! `weir savepoint`, `weir stop`, `weir savepoint --dispose` and `weir savepoint inspect`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weir_checkpoint::{inspect_json, inspect_text, load_metadata};
use weir_jobmanager::snapshot_storage;
use weir_types::JobId;

use crate::args::{SavepointArgs, StopArgs};
use crate::client::{RestClient, check_job_response};
use crate::error::CliError;
use crate::progress::SavepointBar;
use crate::settings;

/// Longest the CLI waits for a savepoint to complete.
const SAVEPOINT_WAIT_MAX: Duration = Duration::from_secs(600);

pub fn savepoint(args: SavepointArgs) -> Result<ExitCode, CliError> {
    if let Some(path) = &args.dispose {
        if !args.args.is_empty() {
            return Err(CliError::usage("--dispose takes only the savepoint's path: weir savepoint --dispose PATH"));
        }
        return dispose(path);
    }
    if args.args.first().map(String::as_str) == Some("inspect") {
        return match args.args.as_slice() {
            [_, path] => inspect(path, args.json),
            _ => Err(CliError::usage("usage: weir savepoint inspect PATH [--json]")),
        };
    }
    if args.args.first().map(String::as_str) == Some("rewrite") {
        return match (args.args.as_slice(), args.max_parallelism) {
            ([_, path, dir], Some(max)) => rewrite(path, dir, max),
            _ => Err(CliError::usage("usage: weir savepoint rewrite --max-parallelism N PATH DIR")),
        };
    }
    if args.json {
        return Err(CliError::usage("--json goes with `weir savepoint inspect PATH`"));
    }
    if args.max_parallelism.is_some() {
        return Err(CliError::usage(
            "--max-parallelism goes with `weir savepoint rewrite --max-parallelism N PATH DIR`",
        ));
    }
    let (job_id, target) = match args.args.as_slice() {
        [job_id] => (job_id, None),
        [job_id, dir] => (job_id, Some(absolute(dir))),
        _ => return Err(CliError::usage("usage: weir savepoint [-m HOST:PORT] JOBID [DIR]")),
    };
    let job_id: JobId = job_id.parse().map_err(CliError::usage)?;
    let config = settings::load(&args.config)?;
    let client = settings::jobmanager_client_for_job(args.jobmanager.as_deref(), &config, &job_id.to_string())?;
    println!("Triggering savepoint for job {job_id}.");
    let format = args.format.unwrap_or(crate::args::FormatArg::Canonical).rest_name();
    let body = json!({"target-directory": target, "cancel-job": false, "formatType": format});
    let location = trigger_and_wait(&client, job_id, &format!("/jobs/{job_id}/savepoints"), &body)?;
    println!("Savepoint completed. Path: {location}");
    println!("You can resume your program from this savepoint with: weir run -s {location} ...");
    Ok(ExitCode::SUCCESS)
}

pub fn stop(args: StopArgs) -> Result<ExitCode, CliError> {
    let job_id: JobId = args.job_id.parse().map_err(CliError::usage)?;
    let config = settings::load(&args.config)?;
    let client = settings::jobmanager_client_for_job(args.jobmanager.as_deref(), &config, &job_id.to_string())?;
    println!("Suspending job {job_id} with a savepoint.");
    let body = json!({
        "targetDirectory": args.savepoint_path.as_deref().map(absolute),
        "drain": args.drain,
        "formatType": args.format.rest_name()
    });
    let location = trigger_and_wait(&client, job_id, &format!("/jobs/{job_id}/stop"), &body)?;
    println!("Savepoint completed. Path: {location}");
    Ok(ExitCode::SUCCESS)
}

/// Local paths are sent absolute: the cluster may run in another directory.
fn absolute(path: &str) -> String {
    if path.contains("://") {
        return path.to_string();
    }
    match std::path::absolute(path) {
        Ok(absolute) => absolute.display().to_string(),
        Err(_) => path.to_string(),
    }
}

fn trigger_and_wait(client: &RestClient, job_id: JobId, path: &str, body: &Value) -> Result<String, CliError> {
    let response = client.post_json(path, body)?;
    check_job_response(&response, client, job_id, "take a savepoint of job")?;
    let trigger: Value = serde_json::from_str(&response.body)
        .map_err(|e| CliError::runtime(format!("{}{path} answered something unexpected: {e}", client.base())))?;
    let Some(request_id) = trigger["request-id"].as_str() else {
        return Err(CliError::runtime(format!("{}{path} answered without a request-id", client.base())));
    };
    let deadline = Instant::now() + SAVEPOINT_WAIT_MAX;
    let bar = SavepointBar::new(&format!("savepoint of job {job_id}"));
    let outcome = wait_for_savepoint(client, job_id, request_id, deadline, &bar);
    bar.finish();
    outcome
}

fn wait_for_savepoint(
    client: &RestClient,
    job_id: JobId,
    request_id: &str,
    deadline: Instant,
    bar: &SavepointBar,
) -> Result<String, CliError> {
    loop {
        let status: Value = client.get_json(&format!("/jobs/{job_id}/savepoints/{request_id}"))?;
        bar.update(&status["progress"]);
        if status["status"]["id"] == "COMPLETED" {
            if let Some(location) = status["operation"]["location"].as_str() {
                return Ok(location.to_string());
            }
            let cause = status["operation"]["failure-cause"]["stack-trace"].as_str().unwrap_or("no cause given");
            return Err(CliError::runtime(format!("the savepoint of job {job_id} failed: {cause}")));
        }
        if Instant::now() >= deadline {
            return Err(CliError::runtime(format!(
                "the savepoint of job {job_id} is still in progress after {} s; poll GET /jobs/{job_id}/savepoints/{request_id}",
                SAVEPOINT_WAIT_MAX.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn dispose(path: &str) -> Result<ExitCode, CliError> {
    let storage = snapshot_storage(path)?;
    let blocking = storage.blocking();
    let disposed = blocking.block_on(weir_checkpoint::dispose(&storage)).map_err(|e| match e {
        weir_checkpoint::LoadError::Format(_) => CliError::usage(format!("{e}; nothing was deleted")),
        _ => CliError::runtime(e.to_string()),
    })?;
    println!("Disposed savepoint {path} ({} bytes).", disposed.bytes);
    if !disposed.left.is_empty() {
        eprintln!(
            "warning: {} file(s) in {path} are not part of the snapshot and were left: {}",
            disposed.left.len(),
            disposed.left.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `weir savepoint rewrite --max-parallelism N PATH DIR`: a copy of the snapshot at PATH with
/// N key groups, in a new `savepoint-…` directory under DIR; PATH is only read.
fn rewrite(path: &str, dir: &str, max_parallelism: u32) -> Result<ExitCode, CliError> {
    let source = snapshot_storage(path)?;
    let blocking = source.blocking();
    let metadata = blocking.block_on(load_metadata(&source)).map_err(CliError::usage)?;
    let root = snapshot_storage(&absolute(dir))?;
    let target = root.child(&weir_checkpoint::paths::new_savepoint_dir_name(&metadata.job_id));
    println!("Rewriting {} from max parallelism {} to {max_parallelism}.", source.url(), metadata.max_parallelism);
    let started = Instant::now();
    let rewritten = blocking
        .block_on(weir_checkpoint::rewrite_max_parallelism(&source, &target, max_parallelism))
        .map_err(|e| match e {
            weir_checkpoint::RewriteError::Storage(_) => CliError::runtime(e.to_string()),
            _ => CliError::usage(e.to_string()),
        })?;
    println!(
        "Savepoint rewritten in {} ms ({} operators, max parallelism {}). Path: {}",
        started.elapsed().as_millis(),
        rewritten.operators.len(),
        rewritten.max_parallelism,
        target.url()
    );
    println!("You can resume your program from it with: weir run -s {} -p <up to {max_parallelism}> ...", target.url());
    Ok(ExitCode::SUCCESS)
}

fn inspect(path: &str, as_json: bool) -> Result<ExitCode, CliError> {
    let storage = snapshot_storage(path)?;
    let metadata =
        storage.blocking().block_on(load_metadata(&storage)).map_err(|e| CliError::runtime(e.to_string()))?;
    if as_json {
        let value = inspect_json(&metadata, storage.url());
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string()));
    } else {
        print!("{}", inspect_text(&metadata, storage.url()));
    }
    Ok(ExitCode::SUCCESS)
}
