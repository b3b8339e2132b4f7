//! What a new leader does first: it shows the jobs earlier leaders ended, and starts every
//! job the HA store holds and no result ends. Each waits RECONCILING for the TaskManagers to
//! report it, and is restarted from its newest checkpoint if they do not; a job that cannot
//! be started again is recorded FAILED, with the reason, rather than left to no one.

use weir_ha::{HaStore, JobResult, RecoverableJob};
use weir_runtime::Dispatcher;
use weir_runtime::cluster::JobSubmission;
use weir_types::{JobId, JobStatus, Lifecycle};

use crate::server::{Jobs, Term};

/// The newest ended jobs a new leader shows (as many as a dispatcher keeps).
const ENDED_JOBS_SHOWN_MAX: usize = 1000;
/// How long a new leader waits between reads of an HA store that does not answer.
const STORE_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Recovers, in `term`, the jobs its HA store holds.
pub(crate) fn recover_jobs(jobs: &Jobs, term: &Term) {
    let Some(store) = &term.store else { return };
    let Some((ended, recoverable)) = read_jobs(store) else { return };
    remember_ended_jobs(&jobs.dispatcher, &ended);
    let ended: Vec<String> = ended.into_iter().map(|r| r.job_id).collect();
    let mut recovered = Vec::new();
    for job in recoverable.into_iter().filter(|job| !ended.contains(&job.job_id)) {
        let job_id = job.job_id.clone();
        match recover_job(jobs, term, job) {
            Ok(name) => {
                eprintln!("JobManager recovered job {job_id} ('{name}'): RECONCILING with the TaskManagers");
                recovered.push(job_id);
            }
            Err(reason) => record_unrecoverable(store, &job_id, &reason),
        }
    }
    // From now on a TaskManager's report of an attempt is kept only for these jobs while
    // they reconcile; any other (a job that ended, a TaskManager back from a freeze) is
    // cancelled on it at once.
    term.resources.recovered(&recovered);
}

/// The job results and the submitted jobs in `store`, read until it answers, while this
/// term lasts (`None` once it ended): a leader that went on without the jobs (etcd just
/// restarted, say) would cancel their running attempts as nobody's and leave the jobs to no
/// one until the next failover.
fn read_jobs(store: &HaStore) -> Option<(Vec<JobResult>, Vec<RecoverableJob>)> {
    loop {
        match store.results().and_then(|results| Ok((results, store.recoverable_jobs()?))) {
            Ok(read) => return Some(read),
            Err(error) => {
                if !store.guard().is_held() {
                    return None;
                }
                tracing::warn!(%error, "cannot read the submitted jobs and results from the HA store; retrying");
                std::thread::sleep(STORE_RETRY);
            }
        }
    }
}

/// Starts `job` again as it was submitted, from its newest checkpoint if it has one; the
/// catalog job's name, or why it cannot be started.
fn recover_job(jobs: &Jobs, term: &Term, job: RecoverableJob) -> Result<String, String> {
    let parsed_id = job.job_id.parse::<JobId>().map_err(|_| "its id is not a job id".to_string())?;
    let mut submission: JobSubmission = serde_json::from_slice(&job.submission)
        .map_err(|error| format!("its recorded submission is unreadable ({error})"))?;
    // A restart after a failed takeover restores the newest checkpoint; the snapshot the job
    // was first started from may be gone by now.
    if let Some((_, latest)) = job.checkpoints.last() {
        submission.savepoint = Some(latest.clone());
        submission.allow_non_restored_state = false;
    }
    let job_id = job.job_id.clone();
    let prepared = jobs.prepare_job(term, &submission, &job_id, Some(job)).map_err(|e| e.to_string())?;
    jobs.dispatcher.submit_as(parsed_id, prepared.graph, prepared.settings).map_err(|e| e.to_string())?;
    Ok(submission.job)
}

/// Says why job `job_id` cannot be recovered, and records it FAILED with that reason.
fn record_unrecoverable(store: &HaStore, job_id: &str, reason: &str) {
    eprintln!("error: cannot recover job {job_id}: {reason}");
    let result = JobResult {
        job_id: job_id.to_string(),
        state: "FAILED".into(),
        end_time_ms: weir_types::lifecycle::now_ms(),
        failure: Some(format!("cannot recover the job after a JobManager failover: {reason}")),
        job_name: None,
    };
    if let Err(error) = store.job(job_id).finish(&result) {
        tracing::error!(job_id = %job_id, %error, "cannot record the job's failure");
    }
}

/// Shows the jobs earlier leaders ended, as the job result store recorded them: a client
/// waiting on a job across a failover (`weir run`, `flink list -a`, a script polling
/// `GET /jobs/{id}`) learns how it ended instead of "no such job".
fn remember_ended_jobs(dispatcher: &Dispatcher, results: &[JobResult]) {
    let mut results: Vec<&JobResult> = results.iter().collect();
    results.sort_by_key(|result| result.end_time_ms);
    let skip = results.len().saturating_sub(ENDED_JOBS_SHOWN_MAX);
    for result in results.into_iter().skip(skip) {
        let status = <JobStatus as Lifecycle>::all().iter().find(|s| s.to_string() == result.state);
        let (Ok(job_id), Some(&status)) = (result.job_id.parse::<JobId>(), status) else {
            tracing::warn!(job_id = %result.job_id, state = %result.state, "skipping an unreadable job result in the HA store");
            continue;
        };
        let name = result.job_name.as_deref().unwrap_or("(ended under an earlier leader)");
        dispatcher.remember_ended(job_id, name, status, result.end_time_ms, result.failure.clone());
    }
}
