//! The dispatcher: accepts jobs and keeps them (running and ended) for queries.

use std::sync::{Arc, Mutex};

use weir_api::graph::StreamGraph;
use weir_types::lifecycle::now_ms;
use weir_types::{JobId, JobStatus};

use crate::job_master::JobMaster;
use crate::job_settings::JobSettings;
use crate::jobgraph::{JobGraph, JobGraphError};

/// Why a job was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The graph is invalid for these settings.
    #[error(transparent)]
    Graph(#[from] JobGraphError),
    /// The job could not be started.
    #[error("cannot start the job: {0}")]
    Start(String),
}

/// Ended jobs kept for queries, at most (oldest dropped first).
const ENDED_JOBS_RETAINED_MAX: usize = 1000;

/// Drops the oldest ended job once more than [`ENDED_JOBS_RETAINED_MAX`] are kept.
fn retain_at_most(jobs: &mut Vec<Arc<JobMaster>>) {
    if jobs.len() > ENDED_JOBS_RETAINED_MAX
        && let Some(oldest_ended) = jobs.iter().position(|j| j.status().is_globally_terminal())
    {
        jobs.remove(oldest_ended);
    }
}

/// The jobs of one cluster.
pub struct Dispatcher {
    jobs: Mutex<Vec<Arc<JobMaster>>>,
    started_ms: u64,
    location: String,
}

impl Dispatcher {
    /// A dispatcher whose subtasks run at `location` (shown in REST as the host).
    pub fn new(location: &str) -> Arc<Dispatcher> {
        Arc::new(Dispatcher { jobs: Mutex::new(Vec::new()), started_ms: now_ms(), location: location.to_string() })
    }

    /// When the dispatcher started, epoch ms.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    fn jobs_guard(&self) -> std::sync::MutexGuard<'_, Vec<Arc<JobMaster>>> {
        match self.jobs.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Validates `graph` and starts it as a new job.
    pub fn submit(&self, graph: StreamGraph, settings: JobSettings) -> Result<Arc<JobMaster>, SubmitError> {
        self.submit_as(JobId::generate(), graph, settings)
    }

    /// Validates `graph` and starts it as job `job_id` (an id recorded before the submit
    /// was acknowledged, or a job a new leader recovers); an earlier entry of the same id
    /// (the job as a former leadership of this process left it, SUSPENDED) is replaced.
    pub fn submit_as(
        &self,
        job_id: JobId,
        graph: StreamGraph,
        settings: JobSettings,
    ) -> Result<Arc<JobMaster>, SubmitError> {
        // Validate before accepting so configuration mistakes are reported to the submitter
        // rather than as a failed job.
        JobGraph::build(&graph, &settings)?;
        let master =
            JobMaster::start(job_id, graph, settings, &self.location).map_err(|e| SubmitError::Start(e.to_string()))?;
        let mut jobs = self.jobs_guard();
        jobs.retain(|job| job.job_id() != job_id);
        jobs.push(Arc::clone(&master));
        retain_at_most(&mut jobs);
        Ok(master)
    }

    /// Keeps a job an earlier leader ended (from the job result store) for queries, in
    /// place of a SUSPENDED entry of it; a job this dispatcher runs or ended is kept as is.
    pub fn remember_ended(
        &self,
        job_id: JobId,
        job_name: &str,
        status: JobStatus,
        end_time_ms: u64,
        failure: Option<String>,
    ) {
        let mut jobs = self.jobs_guard();
        // A SUSPENDED entry (this process's former leadership) gives way to the result.
        if let Some(known) = jobs.iter().position(|job| job.job_id() == job_id) {
            let status = jobs[known].status();
            if !weir_types::Lifecycle::is_terminal(status) || status.is_globally_terminal() {
                return;
            }
            jobs.remove(known);
        }
        jobs.push(JobMaster::ended(job_id, job_name, status, end_time_ms, failure, &self.location));
        retain_at_most(&mut jobs);
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Vec<Arc<JobMaster>> {
        self.jobs_guard().clone()
    }

    /// The job with `job_id`.
    pub fn job(&self, job_id: JobId) -> Option<Arc<JobMaster>> {
        self.jobs_guard().iter().find(|j| j.job_id() == job_id).cloned()
    }

    /// Counts of jobs per state group, for `/overview`.
    pub fn job_counts(&self) -> JobCounts {
        let mut counts = JobCounts::default();
        for job in self.jobs() {
            match job.status() {
                JobStatus::Finished => counts.finished += 1,
                JobStatus::Canceled => counts.cancelled += 1,
                JobStatus::Failed => counts.failed += 1,
                _ => counts.running += 1,
            }
        }
        counts
    }

    /// Subtasks of jobs that are not terminal (slots in use on an embedded cluster).
    pub fn busy_subtasks(&self) -> u32 {
        let mut busy = 0;
        for job in self.jobs() {
            let record = job.record();
            if !<JobStatus as weir_types::Lifecycle>::is_terminal(record.history.current()) {
                busy += record.subtasks.iter().map(|v| v.len() as u32).sum::<u32>();
            }
        }
        busy
    }
}

/// Jobs per state group.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobCounts {
    /// Not yet terminal.
    pub running: u32,
    /// FINISHED.
    pub finished: u32,
    /// CANCELED.
    pub cancelled: u32,
    /// FAILED.
    pub failed: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_job_from_the_result_store_answers_queries_once() {
        let dispatcher = Dispatcher::new("jm");
        let job_id = JobId::generate();
        dispatcher.remember_ended(job_id, "counter", JobStatus::Failed, 7, Some("boom".into()));
        dispatcher.remember_ended(job_id, "counter", JobStatus::Finished, 8, None);
        assert_eq!(dispatcher.jobs().len(), 1);
        let job = dispatcher.job(job_id).expect("the ended job is known");
        assert_eq!(
            (job.status(), job.job_name(), job.failure_cause()),
            (JobStatus::Failed, "counter", Some("boom".into()))
        );
        assert_eq!(job.wait_terminal(Some(std::time::Duration::ZERO)), JobStatus::Failed);
        assert!(job.cancel().is_err());
        assert!(job.trigger_savepoint(Some("file:///tmp/sp".into()), false).is_err());
        assert_eq!(dispatcher.job_counts().failed, 1);
    }
}
