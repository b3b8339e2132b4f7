//! The controller's effects as values: everything it does to the world, besides looking.
//!
//! The controller decides in its steps; every action it takes on a cluster, a snapshot, the
//! store or its users is a [`ControllerEffect`], carried out in one place
//! (`Controller::carry_out`), which checks the leadership right before an action that
//! touches a cluster or storage and logs the step at `info` (so `weir operator` tells what
//! it did, step by step). Reading (a job's state, whether a snapshot
//! is there) is not an effect: it changes nothing, and a controller may read while another
//! leads.

use std::fmt;

use crate::spec::DeploymentSpec;
use crate::status::{ClusterInfo, DeploymentStatus};

/// One action of the controller on deployment `name`'s world.
// (Each variant's doc names its fields.)
#[allow(missing_docs)]
#[derive(Debug)]
pub enum ControllerEffect<'a> {
    /// Ends every process of cluster `seq` (a cluster that does not exist is stopped).
    StopCluster { seq: u64 },
    /// Starts cluster `seq` for `target`: answered with [`EffectAnswer::Cluster`].
    StartCluster { seq: u64, target: &'a DeploymentSpec },
    /// Submits `target`'s job to `cluster` as `job_id` from `restore_from`: answered with
    /// [`EffectAnswer::Job`].
    SubmitJob {
        cluster: &'a ClusterInfo,
        target: &'a DeploymentSpec,
        restore_from: Option<&'a str>,
        job_id: Option<&'a str>,
    },
    /// Cancels job `job_id` of `cluster`.
    CancelJob { cluster: &'a ClusterInfo, job_id: &'a str },
    /// Stop-with-savepoint of job `job_id` into `directory`: answered with
    /// [`EffectAnswer::Request`].
    StopWithSavepoint { cluster: &'a ClusterInfo, job_id: &'a str, directory: &'a str },
    /// A savepoint of job `job_id` into `directory`, the job going on: answered with
    /// [`EffectAnswer::Request`].
    TriggerSavepoint { cluster: &'a ClusterInfo, job_id: &'a str, directory: &'a str },
    /// Deletes the snapshot at `location` (a savepoint past the history's limits).
    DisposeSnapshot { location: &'a str },
    /// Writes the deployment's status (fenced by the store on the leadership's epoch).
    WriteStatus { status: &'a DeploymentStatus },
    /// Removes the deleted deployment from the store (fenced as a status write).
    RemoveDeployment,
    /// Tells the deployment's users of a step (`warning`: a failure): the log, and on
    /// Kubernetes an Event on the resource with `reason`.
    Report { warning: bool, reason: &'a str, message: &'a str },
}

impl ControllerEffect<'_> {
    /// Whether the effect acts on a cluster or on storage: the leadership is checked right
    /// before it. (Status writes are fenced by the store itself, in the same transaction; a
    /// report changes nothing a job depends on.)
    pub fn acts(&self) -> bool {
        !matches!(
            self,
            ControllerEffect::WriteStatus { .. } | ControllerEffect::RemoveDeployment | ControllerEffect::Report { .. }
        )
    }
}

/// One line per effect, for the log and the simulation's trace.
impl fmt::Display for ControllerEffect<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControllerEffect::StopCluster { seq } => write!(f, "stop cluster {seq}"),
            ControllerEffect::StartCluster { seq, target } => {
                write!(f, "start cluster {seq} for job {} of {}", target.job.name, target.binary)
            }
            ControllerEffect::SubmitJob { cluster, target, restore_from, job_id } => write!(
                f,
                "submit job {} as {} to cluster {} from {}",
                target.job.name,
                job_id.unwrap_or("a new id"),
                cluster.seq,
                restore_from.unwrap_or("empty state")
            ),
            ControllerEffect::CancelJob { cluster, job_id } => {
                write!(f, "cancel job {job_id} of cluster {}", cluster.seq)
            }
            ControllerEffect::StopWithSavepoint { cluster, job_id, directory } => {
                write!(f, "stop job {job_id} of cluster {} with a savepoint into {directory}", cluster.seq)
            }
            ControllerEffect::TriggerSavepoint { cluster, job_id, directory } => {
                write!(f, "savepoint of job {job_id} of cluster {} into {directory}", cluster.seq)
            }
            ControllerEffect::DisposeSnapshot { location } => write!(f, "dispose {location}"),
            ControllerEffect::WriteStatus { status } => match &status.operation {
                Some(operation) => write!(
                    f,
                    "write status: {}, {:?} of generation {} at {}",
                    status.lifecycle_state.as_str(),
                    operation.kind,
                    operation.generation,
                    operation.step.describe()
                ),
                None => write!(f, "write status: {}", status.lifecycle_state.as_str()),
            },
            ControllerEffect::RemoveDeployment => write!(f, "remove the deployment"),
            ControllerEffect::Report { warning, reason, message } => {
                write!(f, "{} {reason}: {message}", if *warning { "warning" } else { "event" })
            }
        }
    }
}

/// What carrying an effect out gave back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectAnswer {
    /// Done; nothing to give back.
    Done,
    /// The cluster a [`ControllerEffect::StartCluster`] started.
    Cluster(ClusterInfo),
    /// The job id a [`ControllerEffect::SubmitJob`] submitted.
    Job(String),
    /// The request id of a savepoint or a stop.
    Request(String),
}

impl EffectAnswer {
    /// The id a submit, a stop or a savepoint answered with.
    pub fn id(self) -> Result<String, String> {
        match self {
            EffectAnswer::Job(id) | EffectAnswer::Request(id) => Ok(id),
            other => Err(format!("the controller's world answered {other:?} where an id was due")),
        }
    }

    /// The cluster a start answered with.
    pub fn cluster(self) -> Result<ClusterInfo, String> {
        match self {
            EffectAnswer::Cluster(cluster) => Ok(cluster),
            other => Err(format!("the controller's world answered {other:?} where a started cluster was due")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ControllerEffect, EffectAnswer};
    use crate::status::{ClusterInfo, DeploymentStatus};

    fn cluster() -> ClusterInfo {
        ClusterInfo { rest_address: "127.0.0.1:1".into(), dir: "/c".into(), binary: "weir".into(), seq: 3 }
    }

    #[test]
    fn only_effects_on_clusters_and_storage_wait_for_the_leadership_check() {
        let cluster = cluster();
        let status = DeploymentStatus::default();
        assert!(ControllerEffect::StopCluster { seq: 1 }.acts());
        assert!(ControllerEffect::CancelJob { cluster: &cluster, job_id: "j" }.acts());
        assert!(ControllerEffect::DisposeSnapshot { location: "file:///s" }.acts());
        assert!(!ControllerEffect::WriteStatus { status: &status }.acts());
        assert!(!ControllerEffect::RemoveDeployment.acts());
        assert!(!ControllerEffect::Report { warning: true, reason: "Refused", message: "m" }.acts());
    }

    #[test]
    fn each_effect_reads_as_one_line() {
        let cluster = cluster();
        let effect = ControllerEffect::StopWithSavepoint { cluster: &cluster, job_id: "ab", directory: "file:///sp" };
        assert_eq!(effect.to_string(), "stop job ab of cluster 3 with a savepoint into file:///sp");
        assert_eq!(ControllerEffect::StopCluster { seq: 2 }.to_string(), "stop cluster 2");
    }

    #[test]
    fn an_answer_of_the_wrong_kind_is_an_error_not_a_panic() {
        assert_eq!(EffectAnswer::Request("r1".into()).id(), Ok("r1".into()));
        assert!(EffectAnswer::Done.id().unwrap_err().contains("an id was due"));
        assert!(EffectAnswer::Job("j".into()).cluster().is_err());
        assert_eq!(EffectAnswer::Cluster(cluster()).cluster(), Ok(cluster()));
    }
}
