//! A high-availability cluster of real processes for tests: an etcd (started here), JobManager
//! and TaskManager processes of the `weir` binary, every one ended when the cluster is dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir_ha::testing::EtcdServer;
use weir_ha::{HaServices, HaSettings, LeaderInfo};

use super::{RunningWeir, WAIT_MAX, run_weir};

/// One JobManager process and its REST address.
pub struct JobManager {
    pub process: RunningWeir,
    pub rest: String,
}

pub struct HaCluster {
    pub etcd: EtcdServer,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub jobmanagers: Vec<JobManager>,
    pub taskmanagers: Vec<RunningWeir>,
    ha: HaServices,
}

impl HaCluster {
    /// etcd, `jobmanagers` JobManagers (the first one leads) and `taskmanagers` TaskManagers
    /// with 2 slots each; `extra` adds configuration lines (`key: value`).
    pub fn start(jobmanagers: usize, taskmanagers: usize, extra: &[&str]) -> HaCluster {
        let etcd = EtcdServer::start();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        let text = format!(
            "high-availability.type: etcd\nhigh-availability.etcd.endpoints: {}\nhigh-availability.cluster-id: test\nhigh-availability.storageDir: {}/ha\nhigh-availability.reconcile-timeout: 3s\nstate.checkpoints.dir: {}/chk\nexecution.checkpointing.interval: 200ms\ntaskmanager.numberOfTaskSlots: 2\nrestart-strategy.type: fixed-delay\nrestart-strategy.fixed-delay.attempts: 20\nrestart-strategy.fixed-delay.delay: 200ms\n",
            etcd.endpoint(),
            dir.path().display(),
            dir.path().display()
        );
        // `extra` lines replace the defaults of the same key.
        let overridden = |line: &&str| extra.iter().any(|e| e.split(':').next() == line.split(':').next());
        let mut lines: Vec<&str> = text.lines().filter(|line| !overridden(line)).collect();
        lines.extend(extra);
        let text = lines.join("\n") + "\n";
        std::fs::write(&config, text).unwrap();
        let ha = HaServices::connect(HaSettings {
            endpoints: vec![etcd.endpoint()],
            cluster_id: "test".into(),
            storage_dir: format!("{}/ha", dir.path().display()),
            lease_ttl: Duration::from_secs(2),
            kubernetes: None,
        })
        .unwrap();
        let mut cluster = HaCluster { etcd, dir, config, jobmanagers: Vec::new(), taskmanagers: Vec::new(), ha };
        for _ in 0..jobmanagers {
            cluster.start_jobmanager(&[]);
            if cluster.jobmanagers.len() == 1 {
                cluster.wait_for_leader(None);
            }
        }
        for _ in 0..taskmanagers {
            cluster.start_taskmanager();
        }
        cluster
    }

    /// One more JobManager (a standby while another leads), with `env` (crash points).
    pub fn start_jobmanager(&mut self, env: &[(&str, &str)]) -> &JobManager {
        let config = self.config.to_str().unwrap().to_string();
        let mut process = RunningWeir::start_with(
            |mut command| {
                for (key, value) in env {
                    command.env(key, value);
                }
                command
            },
            &["jobmanager", "-c", &config, "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"],
        );
        let line = process.stderr_line("REST API at http://");
        let rest = line.split("REST API at http://").nth(1).unwrap().split(',').next().unwrap().to_string();
        self.jobmanagers.push(JobManager { process, rest });
        self.jobmanagers.last().unwrap()
    }

    /// The TaskManagers the leader names as hosts of `job`'s subtasks.
    pub fn subtask_hosts(&self, job: &str) -> std::collections::BTreeSet<String> {
        let details = self.get(&format!("/jobs/{job}")).unwrap_or_default();
        let vertices = details["vertices"].as_array().cloned().unwrap_or_default();
        vertices
            .iter()
            .flat_map(|v| v["subtasks"].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s["host"].as_str().map(str::to_string))
            .collect()
    }

    /// The index in `taskmanagers` of one that runs some of `job`'s subtasks (asked again
    /// while the leader names no host yet).
    pub fn taskmanager_running(&self, job: &str) -> usize {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let hosts = self.subtask_hosts(job);
            if let Some(index) = self.taskmanagers.iter().position(|tm| hosts.contains(&taskmanager_id(tm))) {
                return index;
            }
            assert!(Instant::now() < deadline, "no TaskManager runs the subtasks of {job}: {hosts:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One more TaskManager; returns once it registered with the leader.
    pub fn start_taskmanager(&mut self) {
        let config = self.config.to_str().unwrap().to_string();
        let mut process = RunningWeir::start(&["taskmanager", "-c", &config]);
        process.stderr_line("registered at");
        self.taskmanagers.push(process);
    }

    /// The leader etcd names, with its epoch.
    pub fn leader(&self) -> Option<(LeaderInfo, i64)> {
        self.ha.leader().ok().flatten()
    }

    /// Waits for a leader whose epoch differs from `previous`; returns it.
    pub fn wait_for_leader(&self, previous: Option<i64>) -> (LeaderInfo, i64) {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some((leader, epoch)) = self.leader()
                && Some(epoch) != previous
                && self.jobmanagers.iter().any(|jm| jm.rest == leader.rest_address)
            {
                return (leader, epoch);
            }
            assert!(Instant::now() < deadline, "no new leader within {WAIT_MAX:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The index of the leader's process.
    pub fn leader_index(&self) -> usize {
        let (leader, _) = self.wait_for_leader(None);
        self.jobmanagers.iter().position(|jm| jm.rest == leader.rest_address).unwrap()
    }

    /// `kill -9` of the leader; returns its epoch.
    pub fn kill_leader(&mut self) -> i64 {
        let (_, epoch) = self.wait_for_leader(None);
        let index = self.leader_index();
        let mut leader = self.jobmanagers.remove(index);
        leader.process.kill_hard();
        epoch
    }

    /// Forgets JobManager processes that exited (a crash point aborted them).
    pub fn forget_exited(&mut self) -> usize {
        let before = self.jobmanagers.len();
        self.jobmanagers.retain_mut(|jm| !jm.process.exited());
        before - self.jobmanagers.len()
    }

    /// The REST address of some live JobManager (any of them answers as the leader).
    pub fn rest(&self) -> String {
        self.jobmanagers.first().map(|jm| jm.rest.clone()).expect("a JobManager runs")
    }

    /// `weir run -m <a JobManager> -d args...`: the job id.
    pub fn submit(&self, args: &[&str]) -> String {
        let rest = self.rest();
        let mut all = vec!["run", "-m", &rest, "-d"];
        all.extend(args);
        let output = run_weir(&all);
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string()
    }

    /// `GET path` through some live JobManager; `None` while none answers.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        for jm in &self.jobmanagers {
            let agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .new_agent();
            let Ok(mut response) = agent.get(&format!("http://{}{path}", jm.rest)).call() else { continue };
            if response.status().as_u16() != 200 {
                continue;
            }
            if let Ok(body) = response.body_mut().read_to_string()
                && let Ok(json) = serde_json::from_str(&body)
            {
                return Some(json);
            }
        }
        None
    }

    /// The job's state as the leader reports it.
    pub fn job_state(&self, job_id: &str) -> Option<String> {
        self.get(&format!("/jobs/{job_id}")).and_then(|job| job["state"].as_str().map(str::to_string))
    }

    /// Waits until the job is in `state` with every subtask RUNNING (for RUNNING) or just in
    /// `state`; returns how long it took.
    pub fn wait_job(&self, job_id: &str, state: &str, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if let Some(job) = self.get(&format!("/jobs/{job_id}")) {
                let all_running = job["vertices"].as_array().is_some_and(|vs| {
                    vs.iter()
                        .all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
                });
                if job["state"] == state && (state != "RUNNING" || all_running) {
                    return started.elapsed();
                }
                assert!(
                    !matches!(job["state"].as_str(), Some("FAILED" | "CANCELED")) || state == job["state"],
                    "job {job_id} went {}: {}",
                    job["state"],
                    job["failure-cause"]
                );
            }
            assert!(
                started.elapsed() < within,
                "job {job_id} not {state} within {within:?}: {:?}",
                self.job_state(job_id)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The keys etcd holds under the cluster's root whose rest starts with `prefix`
    /// (`jobs/<id>/savepoints/`, say).
    pub fn etcd_keys(&self, prefix: &str) -> Vec<String> {
        let full = format!("/weir/test/{prefix}");
        self.ha.client().get_prefix(&full).unwrap().into_iter().map(|kv| kv.key).collect()
    }

    /// `POST path` with a JSON `body` to the leader: the answer's status and JSON body.
    pub fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (leader, _) = self.wait_for_leader(None);
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .new_agent();
        let mut response = agent
            .post(&format!("http://{}{path}", leader.rest_address))
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }

    /// Where the jobs' checkpoints go.
    pub fn checkpoints_dir(&self) -> PathBuf {
        self.dir.path().join("chk")
    }

    /// A directory for a job's output.
    pub fn output(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The attempt numbers of the committed part files in `dir` (`part-<job>-<attempt>-...`).
pub fn attempts(dir: &Path) -> std::collections::BTreeSet<u32> {
    let mut attempts = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if let Some(rest) = name.strip_prefix("part-") {
            attempts.insert(rest.split('-').nth(1).unwrap().parse().unwrap());
        }
    }
    attempts
}

/// A TaskManager process's id, from the line it prints once registered.
pub fn taskmanager_id(process: &RunningWeir) -> String {
    let lines = process.stderr_lines();
    let line = lines.iter().find(|l| l.contains(" registered at ")).expect("the TaskManager registered");
    line.split("TaskManager ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap_or_default().to_string()
}
