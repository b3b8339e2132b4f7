//! `weir cancel`: cancels a job through the REST API and waits until it is CANCELED.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use weir_types::{JobId, JobStatus};

use crate::args::CancelArgs;
use crate::client::check_job_response;
use crate::error::CliError;
use crate::settings;

/// Longest `weir cancel` waits for the job to reach CANCELED.
const CANCEL_WAIT_MAX: Duration = Duration::from_secs(60);

#[derive(serde::Deserialize)]
struct Status {
    status: JobStatus,
}

pub fn cancel(args: CancelArgs) -> Result<ExitCode, CliError> {
    let job_id: JobId = args.job_id.parse().map_err(CliError::usage)?;
    let config = settings::load(&args.config)?;
    let client = settings::jobmanager_client_for_job(args.jobmanager.as_deref(), &config, &job_id.to_string())?;
    let response = client.patch(&format!("/jobs/{job_id}?mode=cancel"))?;
    check_job_response(&response, &client, job_id, "cancel job")?;
    println!("Cancelling job {job_id}.");
    let deadline = Instant::now() + CANCEL_WAIT_MAX;
    loop {
        let status = match client.get_json::<Status>(&format!("/jobs/{job_id}/status")) {
            Ok(status) => status.status,
            // An embedded cluster ends with its job; the job is gone, so the cancel took.
            Err(_) => JobStatus::Canceled,
        };
        if status == JobStatus::Canceled {
            println!("Cancelled job {job_id}.");
            return Ok(ExitCode::SUCCESS);
        }
        if status.is_globally_terminal() {
            return Err(CliError::runtime(format!(
                "job {job_id} ended with state {status} before it could be cancelled"
            )));
        }
        if Instant::now() >= deadline {
            return Err(CliError::runtime(format!(
                "job {job_id} is still {status} {} s after the cancel request; check `weir list`",
                CANCEL_WAIT_MAX.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
