//! The one builder of etcd keys and HA blob names. Everything a cluster keeps lives under
//! `/weir/<high-availability.cluster-id>/`:
//!
//! | key | value |
//! |---|---|
//! | `leader` | the leader's [`LeaderInfo`](crate::LeaderInfo) (JSON), on its lease; its create revision is the epoch |
//! | `jobs/<job id>` | the submission pointer: `{"submission": "<blob name>", "submitted_ms": ...}` |
//! | `jobs/<job id>/checkpoint-counter` | the next checkpoint id (decimal) |
//! | `jobs/<job id>/attempt-counter` | the next deploy attempt number (decimal) |
//! | `jobs/<job id>/checkpoints/<id, 20 digits>` | a completed checkpoint: `{"location": "<url>", "timestamp_ms": ...}` |
//! | `jobs/<job id>/savepoints/<request id>` | a savepoint or stop request in flight: `{"terminate": bool, "requested_ms": ...}` |
//! | `job-results/<job id>` | an ended job: `{"state": "FINISHED", "end_time_ms": ..., "failure": ...}` |
//!
//! Blobs go to `<high-availability.storageDir>/<cluster id>/`: `submissions/<job id>.json`.

/// Keys of one cluster.
#[derive(Clone, Debug)]
pub struct Layout {
    root: String,
}

impl Layout {
    /// The keys of cluster `cluster_id`.
    pub fn new(cluster_id: &str) -> Layout {
        Layout { root: format!("/weir/{cluster_id}/") }
    }

    /// Every key of the cluster.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The leader key.
    pub fn leader(&self) -> String {
        format!("{}leader", self.root)
    }

    /// The prefix of every job's keys.
    pub fn jobs(&self) -> String {
        format!("{}jobs/", self.root)
    }

    /// A job's submission pointer (also the prefix of all its keys).
    pub fn job(&self, job_id: &str) -> String {
        format!("{}jobs/{job_id}", self.root)
    }

    /// A job's next checkpoint id.
    pub fn checkpoint_counter(&self, job_id: &str) -> String {
        format!("{}/checkpoint-counter", self.job(job_id))
    }

    /// A job's next attempt number.
    pub fn attempt_counter(&self, job_id: &str) -> String {
        format!("{}/attempt-counter", self.job(job_id))
    }

    /// The prefix of a job's completed checkpoints.
    pub fn checkpoints(&self, job_id: &str) -> String {
        format!("{}/checkpoints/", self.job(job_id))
    }

    /// One completed checkpoint (ids zero-padded, so keys sort by id).
    pub fn checkpoint(&self, job_id: &str, checkpoint_id: u64) -> String {
        format!("{}{checkpoint_id:020}", self.checkpoints(job_id))
    }

    /// The prefix of a job's savepoint requests in flight.
    pub fn savepoints(&self, job_id: &str) -> String {
        format!("{}/savepoints/", self.job(job_id))
    }

    /// One savepoint request in flight.
    pub fn savepoint(&self, job_id: &str, request_id: &str) -> String {
        format!("{}{request_id}", self.savepoints(job_id))
    }

    /// The prefix of ended jobs' results.
    pub fn results(&self) -> String {
        format!("{}job-results/", self.root)
    }

    /// An ended job's result.
    pub fn result(&self, job_id: &str) -> String {
        format!("{}{job_id}", self.results())
    }

    /// A job's submission blob, relative to the cluster's blob directory.
    pub fn submission_blob(job_id: &str) -> String {
        format!("submissions/{job_id}.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_under_the_cluster_and_the_job() {
        let layout = Layout::new("prod");
        assert_eq!(layout.leader(), "/weir/prod/leader");
        assert_eq!(layout.job("ab"), "/weir/prod/jobs/ab");
        assert_eq!(layout.checkpoint("ab", 7), "/weir/prod/jobs/ab/checkpoints/00000000000000000007");
        assert!(layout.checkpoint("ab", 7).starts_with(&layout.job("ab")));
        assert_eq!(layout.result("ab"), "/weir/prod/job-results/ab");
        assert!(!layout.result("ab").starts_with(&layout.jobs()));
    }
}
