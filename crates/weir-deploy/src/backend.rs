//! Where a deployment's clusters run. The controller decides (which step, from which
//! snapshot, whether to roll back); a [`ClusterBackend`] carries out the steps that touch a
//! cluster: processes of the deployment's binary on this machine ([`ProcessClusters`]), or
//! Kubernetes objects (`weir_kubernetes`). Every rule of the controller holds for both,
//! because both are driven by the same code.

use std::path::PathBuf;

use crate::processes::{self, DeploymentDirs};
use crate::spec::DeploymentSpec;
use crate::status::ClusterInfo;

/// The cluster-touching steps of the controller.
pub trait ClusterBackend: Send + Sync {
    /// Where the clusters run, for messages.
    fn describe(&self) -> String;

    /// The sequence numbers of deployment `name`'s clusters that exist (running or not yet
    /// cleaned up), ascending.
    fn clusters(&self, name: &str) -> Result<Vec<u64>, String>;

    /// Ends every process of cluster `seq` of deployment `name` (JobManagers and
    /// TaskManagers); returns once none is left. A cluster that does not exist is stopped.
    fn stop(&self, name: &str, seq: u64) -> Result<(), String>;

    /// Starts cluster `seq` of deployment `name` for `target` (first ending whatever an
    /// interrupted earlier attempt of this step left); what the status records of it.
    fn start(&self, name: &str, seq: u64, target: &DeploymentSpec) -> Result<ClusterInfo, String>;

    /// Whether a JobManager of `cluster` still runs (false: the controller recovers the
    /// deployment from its newest checkpoint).
    fn jobmanager_alive(&self, name: &str, cluster: &ClusterInfo) -> bool;

    /// Where the controller reaches `cluster`'s REST API now: the address recorded when it
    /// started, unless the backend knows a better one (a highly available cluster on
    /// Kubernetes whose JobManager pod was replaced has a new pod IP).
    fn rest_address(&self, _name: &str, cluster: &ClusterInfo) -> String {
        cluster.rest_address.clone()
    }

    /// The newest completed checkpoint of job `job_id` that `cluster`'s HA store recorded
    /// (the one its next leader restores), for a last-state upgrade when its REST API does
    /// not answer; `None` when the cluster keeps no HA store the backend can read.
    fn recorded_checkpoint(&self, _name: &str, _cluster: &ClusterInfo, _job_id: &str) -> Option<String> {
        None
    }

    /// The pre-flight: `run --dry-run` of `target`'s binary against `snapshot`; the lines of
    /// its report, or why the new job cannot start from it.
    fn dry_run(&self, name: &str, target: &DeploymentSpec, snapshot: Option<&str>) -> Result<Vec<String>, String>;

    /// Records a step or a failure of deployment `name` where its users look: on Kubernetes
    /// an Event on the resource (`kubectl describe`); processes have only the log.
    fn event(&self, _name: &str, _warning: bool, _reason: &str, _message: &str) {}

    /// Submits `target`'s job to `cluster` as job `job_id` (when given: the controller
    /// recorded it before, so a job it submitted and never heard back from is still its
    /// own), from `restore_from` if any: its job id.
    fn submit(
        &self,
        name: &str,
        cluster: &ClusterInfo,
        target: &DeploymentSpec,
        restore_from: Option<&str>,
        job_id: Option<&str>,
    ) -> Result<String, String>;
}

/// Clusters as processes of the deployment's binary on this machine, each under
/// `<root>/<name>/clusters/<seq>` ([`processes`]).
pub struct ProcessClusters {
    root: PathBuf,
}

impl ProcessClusters {
    /// Clusters of the deployments under `root` (`<data dir>/deployments`).
    pub fn new(root: impl Into<PathBuf>) -> ProcessClusters {
        ProcessClusters { root: root.into() }
    }

    fn dirs(&self, name: &str) -> DeploymentDirs {
        DeploymentDirs::new(self.root.join(name))
    }
}

impl ClusterBackend for ProcessClusters {
    fn describe(&self) -> String {
        format!("processes under {}", self.root.display())
    }

    fn clusters(&self, name: &str) -> Result<Vec<u64>, String> {
        Ok(self.dirs(name).clusters().into_iter().map(|(seq, _)| seq).collect())
    }

    fn stop(&self, name: &str, seq: u64) -> Result<(), String> {
        processes::stop_cluster(&self.dirs(name).cluster(seq))
    }

    fn start(&self, name: &str, seq: u64, target: &DeploymentSpec) -> Result<ClusterInfo, String> {
        let dirs = self.dirs(name);
        let dir = dirs.cluster(seq);
        // Whatever an interrupted earlier attempt of this step left.
        processes::stop_cluster(&dir)?;
        let _ = std::fs::remove_dir_all(dir.join("cluster"));
        let ports = processes::free_ports(target.job_manager.replicas.min(u32::from(u16::MAX)) as u16)?;
        let config = processes::cluster_configuration(target, name, seq, &dirs, ports);
        processes::write_configuration(&dir, &config)?;
        processes::start_cluster(&target.binary, target, &dir)?;
        Ok(ClusterInfo {
            rest_address: processes::rest_address(&config),
            dir: dir.display().to_string(),
            binary: target.binary.clone(),
            seq,
        })
    }

    fn jobmanager_alive(&self, _name: &str, cluster: &ClusterInfo) -> bool {
        !processes::jobmanagers_of(std::path::Path::new(&cluster.dir)).is_empty()
    }

    fn dry_run(&self, name: &str, target: &DeploymentSpec, snapshot: Option<&str>) -> Result<Vec<String>, String> {
        let dirs = self.dirs(name);
        let config = processes::cluster_configuration(target, name, 0, &dirs, processes::Ports { rest: 0, rpc: 0 });
        let config_path = processes::write_configuration(&dirs.root().join("pre-flight"), &config)?;
        processes::dry_run(&target.binary, target, &config_path, snapshot)
    }

    fn submit(
        &self,
        name: &str,
        cluster: &ClusterInfo,
        target: &DeploymentSpec,
        restore_from: Option<&str>,
        job_id: Option<&str>,
    ) -> Result<String, String> {
        let config = self.dirs(name).cluster(cluster.seq).join("config.yaml");
        processes::submit(&target.binary, target, &config, &cluster.rest_address, restore_from, job_id)
    }
}
