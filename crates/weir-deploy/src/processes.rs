//! A deployment's clusters as processes of its binary. Each cluster gets its own directory
//! (`<deployment dir>/clusters/<seq>`: `config.yaml`, and, through `WEIR_DATA_DIR`, the pid
//! file and logs of `<binary> cluster start`), and every process of it names that
//! directory's `config.yaml` on its command line. That is how the controller finds them all
//! again after its own death, and how it makes sure an old cluster is gone before a new one
//! starts: two jobs of one deployment never run at once.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::spec::DeploymentSpec;

/// How long processes get to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// The directories of one deployment.
#[derive(Clone, Debug)]
pub struct DeploymentDirs {
    root: PathBuf,
}

impl DeploymentDirs {
    /// The directories under `root` (`<data dir>/deployments/<name>`).
    pub fn new(root: impl Into<PathBuf>) -> DeploymentDirs {
        DeploymentDirs { root: root.into() }
    }

    /// The deployment's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of cluster `seq`.
    pub fn cluster(&self, seq: u64) -> PathBuf {
        self.root.join("clusters").join(seq.to_string())
    }

    /// Every cluster directory that exists, by sequence number.
    pub fn clusters(&self) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(self.root.join("clusters")) else { return Vec::new() };
        let mut all: Vec<(u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
            .collect();
        all.sort();
        all
    }

    /// `state.checkpoints.dir` unless the spec sets it.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// `state.savepoints.dir` unless the spec sets it.
    pub fn savepoints(&self) -> PathBuf {
        self.root.join("savepoints")
    }

    /// `high-availability.storageDir` unless the spec sets it.
    pub fn ha(&self) -> PathBuf {
        self.root.join("ha")
    }
}

/// The ports of a cluster's first JobManager; standbys take the next ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    /// `rest.port`.
    pub rest: u16,
    /// `jobmanager.rpc.port`.
    pub rpc: u16,
}

/// `count` consecutive free ports for REST and as many for RPC.
pub fn free_ports(count: u16) -> Result<Ports, String> {
    let run = |taken: &[u16]| -> Option<u16> {
        for _ in 0..200 {
            let first = TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
            let last = first.checked_add(count.saturating_sub(1))?;
            let all_free = (first..=last).all(|port| {
                !taken.contains(&port) && (port == first || TcpListener::bind(("127.0.0.1", port)).is_ok())
            });
            if all_free {
                return Some(first);
            }
        }
        None
    };
    let rest = run(&[]).ok_or("no free ports for the JobManagers' REST APIs")?;
    let taken: Vec<u16> = (rest..rest.saturating_add(count)).collect();
    let rpc = run(&taken).ok_or("no free ports for the JobManagers' RPC")?;
    Ok(Ports { rest, rpc })
}

/// The configuration a cluster of `spec` runs with: `spec.configuration`, the slots, and
/// defaults under the deployment's directory for what the spec leaves out.
pub fn cluster_configuration(
    spec: &DeploymentSpec,
    name: &str,
    seq: u64,
    dirs: &DeploymentDirs,
    ports: Ports,
) -> BTreeMap<String, String> {
    let mut config = spec.configuration.clone();
    let url = |path: PathBuf| format!("file://{}", path.display());
    config.entry("rest.address".into()).or_insert_with(|| "127.0.0.1".into());
    config.entry("jobmanager.rpc.address".into()).or_insert_with(|| "127.0.0.1".into());
    config.entry("rest.port".into()).or_insert_with(|| ports.rest.to_string());
    config.entry("jobmanager.rpc.port".into()).or_insert_with(|| ports.rpc.to_string());
    config.insert("taskmanager.numberOfTaskSlots".into(), spec.task_manager.slots.to_string());
    config.entry("state.checkpoints.dir".into()).or_insert_with(|| url(dirs.checkpoints()));
    config.entry("state.savepoints.dir".into()).or_insert_with(|| url(dirs.savepoints()));
    if crate::spec::high_availability(&spec.configuration) {
        // One per cluster: a cluster started after the last one was killed (a last-state
        // upgrade, a recovery) must not recover that cluster's job as well as run its own.
        config.entry("high-availability.cluster-id".into()).or_insert_with(|| ha_cluster_id(name, seq));
        config.entry("high-availability.storageDir".into()).or_insert_with(|| url(dirs.ha()));
    }
    config
}

/// The `high-availability.cluster-id` of cluster `seq` of deployment `name`.
pub fn ha_cluster_id(name: &str, seq: u64) -> String {
    format!("deployment-{name}-{seq}")
}

/// The REST address of a cluster started with `config`.
pub fn rest_address(config: &BTreeMap<String, String>) -> String {
    let host = config.get("rest.address").map_or("127.0.0.1", String::as_str);
    let port = config.get("rest.port").map_or("8081", String::as_str);
    format!("http://{host}:{port}")
}

/// Writes `config` as the YAML of cluster directory `dir`: the path every process of the
/// cluster names.
pub fn write_configuration(dir: &Path, config: &BTreeMap<String, String>) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("config.yaml");
    let text = serde_norway::to_string(config).map_err(|e| e.to_string())?;
    crate::store::write_atomically(&path, text.as_bytes()).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Starts the cluster of `spec` in `dir` (its `config.yaml` written) with `binary cluster
/// start`, in a process group of its own so a Ctrl-C of the controller leaves it running.
pub fn start_cluster(binary: &str, spec: &DeploymentSpec, dir: &Path) -> Result<(), String> {
    let config = dir.join("config.yaml");
    let output = Command::new(binary)
        .args(["cluster", "start", "--jobmanagers"])
        .arg(spec.job_manager.replicas.to_string())
        .arg("--taskmanagers")
        .arg(spec.task_manager.replicas.to_string())
        .arg("-c")
        .arg(&config)
        .env("WEIR_DATA_DIR", dir)
        .env_remove("WEIR_CONF_DIR")
        .env_remove("WEIR_JOBMANAGER")
        .stdin(Stdio::null())
        .process_group(0)
        .output()
        .map_err(|e| format!("cannot run {binary}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{binary} cluster start` failed ({}): {}",
        output.status,
        last_line(&output.stderr).unwrap_or_else(|| "no message".into())
    ))
}

/// The last non-empty line of `bytes`, without `error: `.
pub fn last_line(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    Some(line.strip_prefix("error: ").unwrap_or(line).to_string())
}

/// The processes whose command line names `dir`'s `config.yaml`: the cluster's JobManagers
/// and TaskManagers (and a `cluster start` still running).
pub fn processes_of(dir: &Path) -> Vec<u32> {
    let needle = dir.join("config.yaml");
    let needle = needle.as_os_str().as_encoded_bytes();
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == own {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.split(|b| *b == 0).any(|arg| arg == needle) && !is_zombie(pid) {
            found.push(pid);
        }
    }
    found
}

/// The JobManagers among [`processes_of`] `dir`.
pub fn jobmanagers_of(dir: &Path) -> Vec<u32> {
    processes_of(dir)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|b| *b == 0).any(|arg| arg == b"jobmanager"))
        })
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Ends every process of the cluster in `dir`: SIGTERM, then SIGKILL after a grace period;
/// returns once none is left.
pub fn stop_cluster(dir: &Path) -> Result<(), String> {
    let mut pids = processes_of(dir);
    if pids.is_empty() {
        return Ok(());
    }
    for pid in &pids {
        signal(*pid, "TERM");
    }
    let deadline = Instant::now() + TERM_GRACE;
    while Instant::now() < deadline {
        pids = processes_of(dir);
        if pids.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in &pids {
        signal(*pid, "KILL");
    }
    let deadline = Instant::now() + TERM_GRACE;
    while Instant::now() < deadline {
        if processes_of(dir).is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("processes {:?} of the cluster in {} do not exit, even on SIGKILL", processes_of(dir), dir.display()))
}

/// Runs `binary run --dry-run` for `spec` against `snapshot` (the pre-flight): `Ok(lines)`
/// when the new job can start from it, `Err(reason)` when not.
pub fn dry_run(
    binary: &str,
    spec: &DeploymentSpec,
    config: &Path,
    snapshot: Option<&str>,
) -> Result<Vec<String>, String> {
    let mut command = Command::new(binary);
    command.args(["run", "--dry-run", "-c"]).arg(config);
    if let Some(snapshot) = snapshot {
        command.args(["-s", snapshot]);
    }
    run_args(&mut command, spec);
    let output = command
        .env_remove("WEIR_CONF_DIR")
        .env_remove("WEIR_JOBMANAGER")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {binary}: {e}"))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect());
    }
    Err(last_line(&output.stderr).unwrap_or_else(|| format!("`{binary} run --dry-run` failed ({})", output.status)))
}

/// Submits `spec`'s job to the cluster at `rest` (`binary run -d`), from `snapshot` if any:
/// its job id.
pub fn submit(
    binary: &str,
    spec: &DeploymentSpec,
    config: &Path,
    rest: &str,
    snapshot: Option<&str>,
    job_id: Option<&str>,
) -> Result<String, String> {
    let mut command = Command::new(binary);
    command.args(["run", "-d", "-m", rest, "-c"]).arg(config);
    if let Some(snapshot) = snapshot {
        command.args(["-s", snapshot]);
    }
    command.args(fixed_job_id_args(job_id));
    run_args(&mut command, spec);
    let output = command
        .env_remove("WEIR_CONF_DIR")
        .env_remove("WEIR_JOBMANAGER")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {binary}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if let Some(id) = stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")) {
        return Ok(id.trim().to_string());
    }
    Err(last_line(&output.stderr).unwrap_or_else(|| format!("`{binary} run -d` failed ({})", output.status)))
}

/// `-D $internal.pipeline.job-id=<id>`: the job takes the id the controller chose.
pub fn fixed_job_id_args(job_id: Option<&str>) -> Vec<String> {
    match job_id {
        Some(id) => vec!["-D".into(), format!("{}={id}", weir_config::options::PIPELINE_FIXED_JOB_ID.key)],
        None => Vec::new(),
    }
}

fn run_args(command: &mut Command, spec: &DeploymentSpec) {
    command.args(run_arguments(spec));
}

/// The arguments of `run` after its options of place (`-c`, `-m`, `-s`): parallelism,
/// `-n`, the job and its arguments.
pub fn run_arguments(spec: &DeploymentSpec) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(parallelism) = spec.job.parallelism {
        args.extend(["-p".to_string(), parallelism.to_string()]);
    }
    if spec.job.allow_non_restored_state {
        args.push("-n".to_string());
    }
    args.push(spec.job.name.clone());
    args.extend(spec.job.args.iter().cloned());
    args
}

use std::os::unix::process::CommandExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_consecutive_and_distinct() {
        let ports = free_ports(3).unwrap();
        assert!(ports.rpc + 2 < ports.rest || ports.rest + 2 < ports.rpc);
    }

    #[test]
    fn the_cluster_configuration_fills_in_what_the_spec_leaves_out() {
        let text = "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: orders\nspec:\n  binary: /bin/weir\n  configuration:\n    state.checkpoints.dir: s3://bucket/chk\n    high-availability.type: etcd\n  taskManager:\n    slots: 3\n  job:\n    name: counter\n";
        let spec = crate::spec::parse(text, &mut Vec::new()).unwrap().spec;
        let dirs = DeploymentDirs::new("/data/deployments/orders");
        let config = cluster_configuration(&spec, "orders", 3, &dirs, Ports { rest: 9000, rpc: 9100 });
        assert_eq!(config["state.checkpoints.dir"], "s3://bucket/chk");
        assert_eq!(config["state.savepoints.dir"], "file:///data/deployments/orders/savepoints");
        assert_eq!(config["taskmanager.numberOfTaskSlots"], "3");
        assert_eq!(config["high-availability.cluster-id"], "deployment-orders-3");
        assert_eq!(rest_address(&config), "http://127.0.0.1:9000");
    }

    #[test]
    fn processes_are_found_by_their_configuration_path_and_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        // A process whose command line names the configuration, as a cluster's do.
        let mut child2 = Command::new("sleep").arg0(&config).arg("30").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_of(dir.path()).contains(&child2.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(processes_of(dir.path()).contains(&child2.id()));
        let reaper = std::thread::spawn(move || {
            let _ = child2.wait();
        });
        stop_cluster(dir.path()).unwrap();
        assert!(processes_of(dir.path()).is_empty());
        reaper.join().unwrap();
    }
}
