//! The deployment tests' harness: a data directory with `my-weir operator`, the spec of the
//! test deployment, and checks of its committed output.
#![allow(dead_code)]

#[path = "../../../../crates/weir-cli/tests/common/bounded.rs"]
pub mod bounded;
pub mod runs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use bounded::BoundedOutput;

pub const WAIT_MAX: Duration = Duration::from_secs(30);
pub const USERS: u64 = 10;

pub fn binary(version: u32) -> &'static str {
    match version {
        1 => env!("CARGO_BIN_EXE_my-weir"),
        2 => env!("CARGO_BIN_EXE_my-weir-v2"),
        3 => env!("CARGO_BIN_EXE_my-weir-v3"),
        _ => env!("CARGO_BIN_EXE_my-weir-v4"),
    }
}

/// A spec for the test deployment.
pub struct Spec {
    pub version: u32,
    pub parallelism: u32,
    pub mode: &'static str,
    pub state: &'static str,
    pub output: PathBuf,
    pub extra_configuration: Vec<(&'static str, &'static str)>,
    pub nonce: Option<i64>,
    /// More job arguments (v4's `--crash-at-start`).
    pub flags: Vec<&'static str>,
}

impl Spec {
    pub fn new(output: &Path) -> Spec {
        Spec {
            version: 1,
            parallelism: 2,
            mode: "savepoint",
            state: "running",
            output: output.to_path_buf(),
            extra_configuration: Vec::new(),
            nonce: None,
            flags: Vec::new(),
        }
    }

    pub fn yaml(&self) -> String {
        let mut configuration = String::from("    execution.checkpointing.interval: 300ms\n");
        if !self.extra_configuration.iter().any(|(key, _)| *key == "restart-strategy.type") {
            configuration.push_str("    restart-strategy.type: none\n");
        }
        for (key, value) in &self.extra_configuration {
            configuration.push_str(&format!("    {key}: \"{value}\"\n"));
        }
        let nonce = self.nonce.map(|n| format!("    savepointTriggerNonce: {n}\n")).unwrap_or_default();
        let flags: String = self.flags.iter().map(|f| format!(", {f}")).collect();
        format!(
            "apiVersion: weir.dev/v1\nkind: WeirDeployment\nmetadata:\n  name: counts\nspec:\n  binary: {}\n  configuration:\n{configuration}  taskManager:\n    replicas: 2\n    slots: 2\n  job:\n    name: versioned-counter\n    args: [--users, \"{USERS}\", --rate, \"400\", --output, {}{flags}]\n    parallelism: {}\n    upgradeMode: {}\n    state: {}\n{nonce}",
            binary(self.version),
            self.output.display(),
            self.parallelism,
            self.mode,
            self.state
        )
    }
}

/// A data directory with an operator; everything it started ends on drop.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub operator: Option<Child>,
    /// The directory of the operator's and the CLI's `config.yaml` (`WEIR_CONF_DIR`), if
    /// any: high availability on etcd.
    conf_dir: Option<PathBuf>,
    watcher_stop: Arc<AtomicBool>,
    watcher: Option<std::thread::JoinHandle<()>>,
    /// The most clusters of the deployment seen alive at once.
    most_alive: Arc<AtomicUsize>,
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_configuration(None)
    }

    /// A harness whose operator and CLI read `config` (YAML) as their `config.yaml`.
    pub fn with_configuration(config: Option<&str>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = config.map(|text| {
            let conf_dir = dir.path().join("conf");
            std::fs::create_dir_all(&conf_dir).unwrap();
            std::fs::write(conf_dir.join("config.yaml"), text).unwrap();
            conf_dir
        });
        let mut harness = Harness {
            dir,
            operator: None,
            conf_dir,
            watcher_stop: Arc::new(AtomicBool::new(false)),
            watcher: None,
            most_alive: Arc::new(AtomicUsize::new(0)),
        };
        harness.start_operator();
        // Two clusters of one deployment alive at the same moment would be two jobs.
        let (stop, most, root) =
            (Arc::clone(&harness.watcher_stop), Arc::clone(&harness.most_alive), harness.deployment_dir());
        harness.watcher = Some(std::thread::spawn(move || {
            let dirs = weir_deploy::processes::DeploymentDirs::new(root);
            while !stop.load(Ordering::Relaxed) {
                let alive = dirs
                    .clusters()
                    .iter()
                    .filter(|(_, dir)| !weir_deploy::processes::jobmanagers_of(dir).is_empty())
                    .count();
                most.fetch_max(alive, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        harness
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn deployment_dir(&self) -> PathBuf {
        self.data().join("deployments/counts")
    }

    pub fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn weir(&self) -> Command {
        let mut command = Command::new(binary(1));
        command.env("WEIR_DATA_DIR", self.data()).env("WEIR_LOG", "off").env_remove("WEIR_CONF_DIR");
        if let Some(conf_dir) = &self.conf_dir {
            command.env("WEIR_CONF_DIR", conf_dir);
        }
        command
    }

    pub fn start_operator(&mut self) {
        self.start_operator_with(&[]);
    }

    pub fn start_operator_with(&mut self, env: &[(&str, &str)]) {
        self.operator = Some(self.spawn_operator("operator.log", env));
    }

    /// Starts another `my-weir operator` on the same data directory and store, logging to
    /// `log` in the test directory; the caller ends it.
    pub fn spawn_operator(&self, log: &str, env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(log)).unwrap();
        let mut command = self.weir();
        for (key, value) in env {
            command.env(key, value);
        }
        command
            .args(["operator", "-D", "operator.rest.port=0"])
            .env("WEIR_LOG", "info")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap()
    }

    /// Waits for the operator to end by itself (a crash point aborted it).
    pub fn wait_operator_exit(&mut self) {
        let deadline = Instant::now() + WAIT_MAX;
        if let Some(child) = &mut self.operator {
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(self.dir.path().join("operator.log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    panic!("the operator did not reach its crash point; its log (newest first):\n{}", tail.join("\n"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.operator = None;
    }

    pub fn kill_operator(&mut self) {
        if let Some(mut child) = self.operator.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn apply(&self, spec: &Spec) -> String {
        let file = self.dir.path().join("counts.yaml");
        std::fs::write(&file, spec.yaml()).unwrap();
        let output = self.weir().args(["deployment", "apply", "-f"]).arg(&file).bounded_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(output.status.success(), "apply failed: {stdout}{stderr}");
        stdout
    }

    pub fn status(&self) -> Value {
        let output = self.weir().args(["deployment", "get", "counts", "-o", "json"]).bounded_output().unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
    }

    /// The newest lines of every log under the harness directory (operators and the clusters'
    /// processes), newest first, for a failure message.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut logs = Vec::new();
        let mut dirs = vec![self.dir.path().to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "log" || e == "out") {
                    logs.push(path);
                }
            }
        }
        logs.sort();
        let mut text = String::new();
        for log in logs {
            let content = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = content.lines().rev().take(lines).collect();
            text.push_str(&format!("--- {} (newest first):\n{}\n", log.display(), tail.join("\n")));
        }
        text
    }

    /// Waits until the deployment's status satisfies `done`; the status.
    pub fn wait(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let status = self.status();
            if done(&status) {
                return status;
            }
            if Instant::now() > deadline {
                panic!("waited {WAIT_MAX:?} for {what}; status: {status:#}\n{}", self.logs_tail(40));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for generation `generation` to be STABLE with a running job; the status.
    pub fn wait_stable(&self, generation: u64) -> Value {
        self.wait(&format!("generation {generation} STABLE"), |s| {
            s["status"]["observedGeneration"] == generation
                && s["status"]["lifecycleState"] == "STABLE"
                && s["status"]["jobStatus"]["state"] == "RUNNING"
                && s["status"].get("operation").is_none()
        })
    }

    pub fn most_clusters_alive_at_once(&self) -> usize {
        self.most_alive.load(Ordering::Relaxed)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.kill_operator();
        self.watcher_stop.store(true, Ordering::Relaxed);
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        let dirs = weir_deploy::processes::DeploymentDirs::new(self.deployment_dir());
        for (_, dir) in dirs.clusters() {
            let _ = weir_deploy::processes::stop_cluster(&dir);
        }
    }
}

/// Copies a directory tree (a savepoint) to `to`.
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

pub fn generation(status: &Value) -> u64 {
    status["metadata"]["generation"].as_u64().unwrap()
}

pub fn job_id(status: &Value) -> String {
    status["status"]["jobStatus"]["jobId"].as_str().unwrap_or_default().to_string()
}

/// Every user's committed counts in `dir`, each count once: user -> (how many, highest).
/// Panics naming the user on a lost or repeated count.
pub fn committed_counts(dir: &Path) -> BTreeMap<u64, (u64, u64)> {
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    for entry in entries.map(Result::unwrap) {
        if !entry.file_name().to_string_lossy().starts_with("part-") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (user, count) = line.split_once('\t').unwrap();
            counts.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
        }
    }
    counts
        .into_iter()
        .map(|(user, mut seen)| {
            seen.sort_unstable();
            let expected: Vec<u64> = (1..=seen.len() as u64).collect();
            assert_eq!(
                seen,
                expected,
                "user {user}: the committed counts are not exactly 1..={} once each",
                seen.len()
            );
            (user, (seen.len() as u64, *seen.last().unwrap_or(&0)))
        })
        .collect()
}

/// Waits until every user's committed count passed `above` (the job really runs on).
pub fn wait_counts_beyond(dir: &Path, above: &BTreeMap<u64, (u64, u64)>) -> BTreeMap<u64, (u64, u64)> {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let now = committed_counts(dir);
        let beyond = now.len() as u64 == USERS
            && now.iter().all(|(user, (_, max))| above.get(user).is_none_or(|(_, before)| max > before));
        if beyond {
            return now;
        }
        assert!(Instant::now() < deadline, "the counts did not go on past {above:?}: {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills the TaskManagers of the cluster in `dir` (its JobManager stays): their job fails.
pub fn kill_taskmanagers(dir: &Path) {
    let jobmanagers = weir_deploy::processes::jobmanagers_of(dir);
    for pid in weir_deploy::processes::processes_of(dir) {
        if !jobmanagers.contains(&pid) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

pub fn operator_log(harness: &Harness) -> String {
    std::fs::read_to_string(harness.dir.path().join("operator.log")).unwrap_or_default()
}

pub fn history_locations(status: &Value) -> Vec<String> {
    status["status"]["savepointHistory"]
        .as_array()
        .map(|h| h.iter().filter_map(|r| r["location"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}
