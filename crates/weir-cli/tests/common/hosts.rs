//! A weir cluster on the multi-host test bed (`netns.rs`): etcd on one host, HA JobManagers
//! and TaskManagers on others, every one a real process of the `weir` binary bound to its
//! host's own address; the harness reaches them directly over the bed's switch.
//!
//! Include it with `#[path = "common/hosts.rs"] mod hosts;` next to `mod common;` and
//! `#[path = "common/netns.rs"] mod netns;`. Every process's output lines are kept with the
//! time the harness read them, so a test can tell what a process said and when. Dropping the
//! cluster ends every process (the bed kills whatever still runs on its hosts).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use weir_ha::{EtcdClient, HaServices, HaSettings, LeaderInfo};

use crate::netns::TestNet;

/// The JobManager's REST port on its host (each host has its own ports).
pub const REST_PORT: u16 = 8081;
/// The JobManager's port for TaskManagers.
pub const RPC_PORT: u16 = 6123;
/// A TaskManager's data port (fixed, so a delay proxy can stand in for it).
pub const DATA_PORT: u16 = 6124;
/// etcd's client and peer ports.
pub const ETCD_CLIENT_PORT: u16 = 2379;
pub const ETCD_PEER_PORT: u16 = 2380;
/// The cluster id in etcd.
pub const CLUSTER_ID: &str = "bed";

/// Longest a process takes to start and say so.
pub const START_MAX: Duration = Duration::from_secs(30);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A line a process printed (stdout or stderr), with when the harness read it.
#[derive(Clone, Debug)]
pub struct Line {
    pub at: Instant,
    pub text: String,
}

/// A process running on a host of the bed, its output collected line by line.
pub struct HostProcess {
    pub name: String,
    pub host: usize,
    child: Child,
    lines: Arc<Mutex<Vec<Line>>>,
    pub started: Instant,
}

fn collect(stream: impl std::io::Read + Send + 'static, into: Arc<Mutex<Vec<Line>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(text) = line else { break };
            lock(&into).push(Line { at: Instant::now(), text });
        }
    });
}

/// The `WEIR_LOG` filter of the processes: `WEIR_TEST_LOG` when set, else `default`.
fn log_filter(default: &str) -> String {
    std::env::var("WEIR_TEST_LOG").unwrap_or_else(|_| default.to_string())
}

impl HostProcess {
    /// Starts `command` (made by `TestNet::host(host).command(...)`).
    pub fn spawn(name: impl Into<String>, host: usize, mut command: Command) -> HostProcess {
        let name = name.into();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} on host {host}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            collect(stdout, Arc::clone(&lines));
        }
        if let Some(stderr) = child.stderr.take() {
            collect(stderr, Arc::clone(&lines));
        }
        HostProcess { name, host, child, lines, started: Instant::now() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`libc::SIGSTOP`, ...) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        let result = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(result, 0, "kill({}, {signal}) of {} failed", self.child.id(), self.name);
    }

    /// `kill -9`: no shutdown code runs.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// True once the process exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the process to exit, at most `within`; its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                return status.code();
            }
            assert!(Instant::now() < deadline, "{} did not exit within {within:?}", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        lock(&self.lines).clone()
    }

    /// The lines containing `marker` read at or after `since`.
    pub fn lines_with(&self, marker: &str, since: Instant) -> Vec<Line> {
        lock(&self.lines).iter().filter(|l| l.at >= since && l.text.contains(marker)).cloned().collect()
    }

    /// The first line containing `marker` read at or after `since`, waiting at most `within`.
    pub fn wait_line(&mut self, marker: &str, since: Instant, within: Duration) -> Line {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.lines_with(marker, since).into_iter().next() {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                if let Some(line) = self.lines_with(marker, since).into_iter().next() {
                    return line;
                }
                panic!("{} exited ({status}) before printing '{marker}':\n{}", self.name, self.tail(40));
            }
            assert!(
                Instant::now() < deadline,
                "{} printed no '{marker}' within {within:?}:\n{}",
                self.name,
                self.tail(40)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The last `n` lines, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let lines = lock(&self.lines);
        let start = lines.len().saturating_sub(n);
        lines[start..].iter().map(|l| format!("  [{}] {}", self.name, l.text)).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        // A frozen process must be woken to die of anything but SIGKILL; SIGKILL works anyway.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where etcd's binary is: `$WEIR_ETCD`, else the usual places.
fn etcd_binary() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_ETCD") {
        return PathBuf::from(path);
    }
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// etcd on a host of the bed, listening on the host's address only; its data survives a
/// `kill -9` and a restart.
pub struct EtcdOnHost {
    pub host: usize,
    pub ip: Ipv4Addr,
    data: PathBuf,
    pub process: Option<HostProcess>,
}

impl EtcdOnHost {
    /// Starts etcd on `host` with its data in `data` and waits until it answers.
    pub fn start(net: &TestNet, host: usize, data: PathBuf) -> EtcdOnHost {
        let mut etcd = EtcdOnHost { host, ip: net.host(host).ip(), data, process: None };
        etcd.spawn(net);
        etcd
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{ETCD_CLIENT_PORT}", self.ip)
    }

    fn command(&self, net: &TestNet) -> Command {
        let client = self.endpoint();
        let peer = format!("http://{}:{ETCD_PEER_PORT}", self.ip);
        let mut command = net.host(self.host).command(etcd_binary());
        command
            .args(["--name", "bed", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("bed={peer}")])
            .args(["--log-level", "warn"]);
        command
    }

    fn spawn(&mut self, net: &TestNet) {
        let client = self.endpoint();
        let command = self.command(net);
        self.process = Some(HostProcess::spawn(format!("etcd@h{}", self.host), self.host, command));
        let etcd = EtcdClient::new(std::slice::from_ref(&client), Duration::from_millis(500));
        let deadline = Instant::now() + Duration::from_secs(20);
        while etcd.get("/weir/").is_err() {
            if let Some(process) = &mut self.process
                && process.exited()
            {
                panic!(
                    "etcd exited at start on host {} (install it with {}):\n{}",
                    self.host,
                    weir_ha::testing::INSTALL,
                    process.tail(20)
                );
            }
            assert!(Instant::now() < deadline, "etcd at {client} did not answer within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9` of etcd (its data stays).
    pub fn kill_hard(&mut self) {
        if let Some(process) = &mut self.process {
            process.kill_hard();
        }
    }

    /// Starts etcd again on the same data and address (after [`kill_hard`](Self::kill_hard))
    /// and waits until it answers.
    pub fn restart(&mut self, net: &TestNet) {
        self.kill_hard();
        self.spawn(net);
    }

    /// Starts etcd again without waiting for it (the harness may not reach it now).
    pub fn respawn(&mut self, net: &TestNet) {
        self.kill_hard();
        let command = self.command(net);
        if let Some(old) = self.process.replace(HostProcess::spawn(format!("etcd@h{}", self.host), self.host, command))
        {
            drop(old);
        }
    }

    /// True once the etcd process exited.
    pub fn exited(&mut self) -> bool {
        self.process.as_mut().is_none_or(HostProcess::exited)
    }

    pub fn signal(&self, signal: i32) {
        if let Some(process) = &self.process {
            process.signal(signal);
        }
    }
}

/// A JobManager process on a host and its addresses.
pub struct JobManagerOnHost {
    pub process: HostProcess,
    /// `ip:port` of its REST API.
    pub rest: String,
    /// `ip:port` TaskManagers connect to.
    pub rpc: String,
}

/// A TaskManager process on a host.
pub struct TaskManagerOnHost {
    pub process: HostProcess,
}

impl TaskManagerOnHost {
    /// Its id, from the line it prints when it listens (empty until then).
    pub fn id(&self) -> String {
        self.process
            .lines_with("listening on", self.process.started)
            .first()
            .and_then(|line| line.text.split("TaskManager ").nth(1)?.split(' ').next().map(str::to_string))
            .unwrap_or_default()
    }
}

/// Which host runs what.
#[derive(Clone, Debug)]
pub struct Layout {
    pub etcd: usize,
    pub jobmanagers: Vec<usize>,
    pub taskmanagers: Vec<usize>,
    /// Hosts with nothing of the cluster on them (a Kafka broker, say).
    pub others: Vec<usize>,
}

impl Layout {
    /// etcd on host 0, `jobmanagers` JobManagers on the next hosts, then `taskmanagers`
    /// TaskManagers, then `others` free hosts: one process kind per host.
    pub fn spread(jobmanagers: usize, taskmanagers: usize, others: usize) -> Layout {
        let jm: Vec<usize> = (1..=jobmanagers).collect();
        let tm: Vec<usize> = (jobmanagers + 1..=jobmanagers + taskmanagers).collect();
        let free: Vec<usize> = (jobmanagers + taskmanagers + 1..=jobmanagers + taskmanagers + others).collect();
        Layout { etcd: 0, jobmanagers: jm, taskmanagers: tm, others: free }
    }

    /// How many hosts the layout uses (one more than the highest index).
    pub fn hosts(&self) -> usize {
        let all =
            [self.etcd].into_iter().chain(self.jobmanagers.iter().copied()).chain(self.taskmanagers.iter().copied());
        all.chain(self.others.iter().copied()).max().map_or(1, |h| h + 1)
    }
}

/// etcd, HA JobManagers and TaskManagers, each on its own host of a [`TestNet`].
pub struct HostCluster {
    // Dropped first: processes end before the bed goes (the bed would kill them anyway).
    pub jobmanagers: Vec<Option<JobManagerOnHost>>,
    pub taskmanagers: Vec<Option<TaskManagerOnHost>>,
    pub etcd: EtcdOnHost,
    ha: HaServices,
    pub layout: Layout,
    /// Processes that were killed or exited and replaced: their output is still looked at.
    pub retired: Vec<HostProcess>,
    /// The JobManagers' RPC address for TaskManagers on their host (`127.0.0.1` for a
    /// loopback cluster); `None`: the host's own address.
    rpc_host: Option<String>,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
    pub net: TestNet,
}

/// The configuration every process of the cluster reads; `extra` lines (`key: value`)
/// replace the defaults of the same key.
fn config_text(etcd: &str, dir: &Path, extra: &[&str]) -> String {
    let defaults = [
        "high-availability.type: etcd".to_string(),
        format!("high-availability.etcd.endpoints: {etcd}"),
        format!("high-availability.cluster-id: {CLUSTER_ID}"),
        format!("high-availability.storageDir: file://{}/ha", dir.display()),
        "high-availability.etcd.lease-ttl: 2s".to_string(),
        // A loaded CI machine can take a few seconds to bring every TaskManager to a new
        // leader; a takeover that times out restarts the job, which the tests count.
        "high-availability.reconcile-timeout: 6s".to_string(),
        "heartbeat.interval: 1s".to_string(),
        "heartbeat.timeout: 5s".to_string(),
        format!("state.checkpoints.dir: file://{}/chk", dir.display()),
        "execution.checkpointing.interval: 300ms".to_string(),
        "taskmanager.numberOfTaskSlots: 2".to_string(),
        format!("taskmanager.data.port: {DATA_PORT}"),
        format!("jobmanager.rpc.port: {RPC_PORT}"),
        format!("rest.port: {REST_PORT}"),
        "restart-strategy.type: fixed-delay".to_string(),
        "restart-strategy.fixed-delay.attempts: 100000".to_string(),
        "restart-strategy.fixed-delay.delay: 200ms".to_string(),
    ];
    let key = |line: &str| line.split(':').next().unwrap_or_default().trim().to_string();
    let mut lines: Vec<String> =
        defaults.into_iter().filter(|line| !extra.iter().any(|e| key(e) == key(line))).collect();
    lines.extend(extra.iter().map(|e| e.to_string()));
    lines.join("\n") + "\n"
}

impl HostCluster {
    /// A bed of `layout.hosts()` hosts, etcd, the JobManagers (the first one leads: the
    /// others start once it does) and the TaskManagers (each registered with the leader).
    pub fn start(layout: Layout, extra: &[&str]) -> HostCluster {
        let mut cluster = HostCluster::start_on(layout, extra, None);
        for index in 0..cluster.taskmanagers.len() {
            cluster.start_taskmanager(index);
        }
        cluster
    }

    /// As [`start`](Self::start) without starting the TaskManagers: the test starts each
    /// with [`start_taskmanager_with`](Self::start_taskmanager_with) and its own overrides.
    pub fn start_without_taskmanagers(layout: Layout, extra: &[&str]) -> HostCluster {
        HostCluster::start_on(layout, extra, None)
    }

    /// One host running etcd, a JobManager and `taskmanagers` TaskManagers that reach it and
    /// each other over loopback (`127.0.0.1`: the control and data planes never leave the
    /// host); its REST API on the host's address for the harness.
    pub fn start_loopback(taskmanagers: usize, extra: &[&str]) -> HostCluster {
        let layout = Layout { etcd: 0, jobmanagers: vec![0], taskmanagers: vec![0; taskmanagers], others: Vec::new() };
        let mut extra = extra.to_vec();
        extra.push("taskmanager.data.port: 0");
        let mut cluster = HostCluster::start_on(layout, &extra, Some("127.0.0.1".to_string()));
        for index in 0..cluster.taskmanagers.len() {
            cluster.start_taskmanager(index);
        }
        cluster
    }

    fn start_on(layout: Layout, extra: &[&str], rpc_host: Option<String>) -> HostCluster {
        let net = TestNet::new(layout.hosts());
        let dir = tempfile::tempdir().expect("a temporary directory");
        let etcd = EtcdOnHost::start(&net, layout.etcd, dir.path().join("etcd"));
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, config_text(&etcd.endpoint(), dir.path(), extra)).expect("write the configuration");
        let ha = HaServices::connect(HaSettings {
            endpoints: vec![etcd.endpoint()],
            cluster_id: CLUSTER_ID.into(),
            storage_dir: format!("file://{}/ha", dir.path().display()),
            lease_ttl: Duration::from_secs(2),
            kubernetes: None,
        })
        .expect("the harness reaches etcd on its host");
        let mut cluster = HostCluster {
            jobmanagers: (0..layout.jobmanagers.len()).map(|_| None).collect(),
            taskmanagers: (0..layout.taskmanagers.len()).map(|_| None).collect(),
            etcd,
            ha,
            layout,
            retired: Vec::new(),
            rpc_host,
            config,
            dir,
            net,
        };
        for index in 0..cluster.jobmanagers.len() {
            cluster.start_jobmanager(index);
            if index == 0 {
                cluster.wait_for_leader(None, START_MAX);
            }
        }
        cluster
    }

    pub fn host_ip(&self, host: usize) -> Ipv4Addr {
        self.net.host(host).ip()
    }

    /// The `weir` command on `host`, logging at `log` unless `WEIR_TEST_LOG` says otherwise.
    pub fn weir_on(&self, host: usize, log: &str) -> Command {
        let mut command = self.net.host(host).command(env!("CARGO_BIN_EXE_weir"));
        command.env("WEIR_LOG", log_filter(log)).env_remove("WEIR_JOBMANAGER").env_remove("WEIR_CONF_DIR");
        command
    }

    /// Starts JobManager `index` on its host (again, after it was killed); returns once it
    /// printed its addresses (it leads or stands by).
    pub fn start_jobmanager(&mut self, index: usize) {
        self.spawn_jobmanager(index);
        let jm = self.jobmanager_mut(index);
        let since = jm.process.started;
        jm.process.wait_line("REST API at http://", since, START_MAX);
    }

    /// Starts JobManager `index` on its host without waiting for it; a process it replaces
    /// is killed and retired.
    pub fn spawn_jobmanager(&mut self, index: usize) {
        let host = self.layout.jobmanagers[index];
        let ip = self.host_ip(host);
        let rpc_host = self.rpc_host.clone().unwrap_or_else(|| ip.to_string());
        let mut command = self.weir_on(host, "info");
        command.arg("jobmanager").arg("-c").arg(&self.config);
        command.args(["-D", &format!("jobmanager.rpc.address={rpc_host}"), "-D", &format!("rest.address={ip}")]);
        let generation = self.retired.len();
        let process = HostProcess::spawn(format!("jm{index}@h{host}#{generation}"), host, command);
        let jobmanager =
            JobManagerOnHost { process, rest: format!("{ip}:{REST_PORT}"), rpc: format!("{rpc_host}:{RPC_PORT}") };
        if let Some(mut old) = self.jobmanagers[index].replace(jobmanager) {
            old.process.kill_hard();
            self.retired.push(old.process);
        }
    }

    /// Starts TaskManager `index` on its host; returns once it registered with the leader.
    pub fn start_taskmanager(&mut self, index: usize) {
        self.start_taskmanager_with(index, &[]);
    }

    /// As [`start_taskmanager`](Self::start_taskmanager) with `-D` overrides.
    pub fn start_taskmanager_with(&mut self, index: usize, overrides: &[String]) {
        self.spawn_taskmanager_with(index, overrides);
        let tm = self.taskmanager_mut(index);
        let since = tm.process.started;
        tm.process.wait_line("registered at", since, START_MAX);
    }

    /// Starts TaskManager `index` on its host with `-D` overrides without waiting for it; a
    /// process it replaces is killed and retired.
    pub fn spawn_taskmanager_with(&mut self, index: usize, overrides: &[String]) {
        let host = self.layout.taskmanagers[index];
        let mut command = self.weir_on(host, "warn");
        command.arg("taskmanager").arg("-c").arg(&self.config);
        for value in overrides {
            command.args(["-D", value]);
        }
        let generation = self.retired.len();
        let process = HostProcess::spawn(format!("tm{index}@h{host}#{generation}"), host, command);
        if let Some(mut old) = self.taskmanagers[index].replace(TaskManagerOnHost { process }) {
            old.process.kill_hard();
            self.retired.push(old.process);
        }
    }

    pub fn jobmanager(&self, index: usize) -> &JobManagerOnHost {
        self.jobmanagers[index].as_ref().unwrap_or_else(|| panic!("JobManager {index} is not running"))
    }

    pub fn jobmanager_mut(&mut self, index: usize) -> &mut JobManagerOnHost {
        self.jobmanagers[index].as_mut().unwrap_or_else(|| panic!("JobManager {index} is not running"))
    }

    pub fn taskmanager(&self, index: usize) -> &TaskManagerOnHost {
        self.taskmanagers[index].as_ref().unwrap_or_else(|| panic!("TaskManager {index} is not running"))
    }

    pub fn taskmanager_mut(&mut self, index: usize) -> &mut TaskManagerOnHost {
        self.taskmanagers[index].as_mut().unwrap_or_else(|| panic!("TaskManager {index} is not running"))
    }

    /// The leader etcd names, with its epoch (`None` when there is none or etcd does not
    /// answer).
    pub fn leader(&self) -> Option<(LeaderInfo, i64)> {
        self.ha.leader().ok().flatten()
    }

    /// The index of the JobManager at `rest` (`ip:port`).
    pub fn jobmanager_at(&self, rest: &str) -> Option<usize> {
        self.jobmanagers.iter().position(|jm| jm.as_ref().is_some_and(|jm| jm.rest == rest))
    }

    /// Waits for a leader of another epoch than `previous` (any leader with `None`) that is
    /// one of the cluster's JobManagers; its index and epoch.
    pub fn wait_for_leader(&self, previous: Option<i64>, within: Duration) -> (usize, i64) {
        let deadline = Instant::now() + within;
        loop {
            if let Some((leader, epoch)) = self.leader()
                && Some(epoch) != previous
                && let Some(index) = self.jobmanager_at(&leader.rest_address)
            {
                return (index, epoch);
            }
            assert!(Instant::now() < deadline, "no new leader within {within:?}\n{}", self.tails(20));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The leader's index (waiting for one).
    pub fn leader_index(&self) -> usize {
        self.wait_for_leader(None, START_MAX).0
    }

    /// `GET path` from the leader, else from any JobManager that answers 200 with JSON.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        let leader = self.leader().and_then(|(info, _)| self.jobmanager_at(&info.rest_address));
        let order = leader.into_iter().chain(0..self.jobmanagers.len());
        for index in order {
            let Some(jm) = &self.jobmanagers[index] else { continue };
            if let Some(json) = get_json(&format!("http://{}{path}", jm.rest), Duration::from_secs(2)) {
                return Some(json);
            }
        }
        None
    }

    /// The job's state and whether every subtask is RUNNING, as some JobManager reports it.
    pub fn job_status(&self, job: &str) -> Option<(String, bool)> {
        let details = self.get(&format!("/jobs/{job}"))?;
        let state = details["state"].as_str()?.to_string();
        Some((state, all_subtasks_running(&details)))
    }

    /// Waits until the job is RUNNING with every subtask RUNNING (or FINISHED); how long it
    /// took.
    pub fn wait_running(&self, job: &str, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            match self.job_status(job) {
                Some((state, all)) if state == "RUNNING" && all => return start.elapsed(),
                Some((state, _)) if state == "FINISHED" => return start.elapsed(),
                Some((state, _)) if state == "FAILED" || state == "CANCELED" => {
                    panic!("job {job} went {state}: {:?}", self.get(&format!("/jobs/{job}/exceptions")))
                }
                _ => {}
            }
            assert!(
                start.elapsed() < within,
                "job {job} not RUNNING within {within:?}: {:?}\n{}",
                self.job_status(job),
                self.tails(30)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the job is FINISHED.
    pub fn wait_finished(&self, job: &str, within: Duration) {
        let start = Instant::now();
        loop {
            match self.job_status(job) {
                Some((state, _)) if state == "FINISHED" => return,
                Some((state, _)) if state == "FAILED" || state == "CANCELED" => {
                    panic!("job {job} went {state}: {:?}", self.get(&format!("/jobs/{job}/exceptions")))
                }
                _ => {}
            }
            assert!(
                start.elapsed() < within,
                "job {job} not FINISHED within {within:?}: {:?}\n{}",
                self.job_status(job),
                self.tails(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `weir run -m <leader> -d args...` from the harness: the job id.
    pub fn submit(&self, args: &[&str]) -> String {
        let (index, _) = self.wait_for_leader(None, START_MAX);
        let rest = self.jobmanager(index).rest.clone();
        let mut all = vec!["run", "-m", rest.as_str(), "-d"];
        all.extend(args);
        let output = crate::common::run_weir(&all);
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
            .map(|id| id.trim().to_string())
            .unwrap_or_else(|| panic!("no job id in {stdout}"))
    }

    /// The TaskManager ids the leader names as hosts of the job's subtasks.
    pub fn subtask_taskmanagers(&self, job: &str) -> BTreeSet<String> {
        let details = self.get(&format!("/jobs/{job}")).unwrap_or_default();
        details["vertices"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| v["subtasks"].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s["host"].as_str().map(str::to_string))
            .collect()
    }

    /// The indexes of the running TaskManagers that run some of the job's subtasks (asked
    /// until the leader names some).
    pub fn taskmanagers_running(&self, job: &str, within: Duration) -> Vec<usize> {
        let deadline = Instant::now() + within;
        loop {
            let ids = self.subtask_taskmanagers(job);
            let running: Vec<usize> = (0..self.taskmanagers.len())
                .filter(|&i| self.taskmanagers[i].as_ref().is_some_and(|tm| ids.contains(&tm.id())))
                .collect();
            if !running.is_empty() {
                return running;
            }
            assert!(Instant::now() < deadline, "no TaskManager runs job {job}: {ids:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The job's restarts so far (`numRestarts`).
    pub fn restarts(&self, job: &str) -> u64 {
        self.get(&format!("/jobs/{job}")).and_then(|d| d["numRestarts"].as_u64()).unwrap_or(0)
    }

    /// A directory for a job's output.
    pub fn output(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The last lines of every process, for failure messages.
    pub fn tails(&self, n: usize) -> String {
        let mut parts = Vec::new();
        for jm in self.jobmanagers.iter().flatten() {
            parts.push(jm.process.tail(n));
        }
        for tm in self.taskmanagers.iter().flatten() {
            parts.push(tm.process.tail(n));
        }
        if let Some(etcd) = &self.etcd.process {
            parts.push(etcd.tail(n));
        }
        parts.join("\n")
    }

    /// Every JobManager process's "checkpoint completed" log lines, retired ones included, as
    /// (checkpoint id, process name, when read), in the order read: no two leaders may
    /// complete the same checkpoint.
    pub fn completed_checkpoints(&self) -> Vec<(u64, String, Instant)> {
        let mut all = Vec::new();
        let processes = self.jobmanagers.iter().flatten().map(|jm| &jm.process).chain(&self.retired);
        for process in processes.filter(|p| p.name.starts_with("jm")) {
            for line in process.lines_with("checkpoint completed", process.started) {
                let id = line
                    .text
                    .split("checkpoint=")
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|digits| digits.parse().ok());
                if let Some(id) = id {
                    all.push((id, process.name.clone(), line.at));
                }
            }
        }
        all.sort_by_key(|(_, _, at)| *at);
        all
    }
}

/// `GET url` with a timeout: the JSON body of a 200 answer.
pub fn get_json(url: &str, timeout: Duration) -> Option<serde_json::Value> {
    let agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().new_agent();
    let mut response = agent.get(url).call().ok()?;
    if response.status().as_u16() != 200 {
        return None;
    }
    let body = response.body_mut().read_to_string().ok()?;
    serde_json::from_str(&body).ok()
}

/// `POST url` with a JSON body and a timeout: the status and the body.
pub fn post_json(url: &str, body: &str, timeout: Duration) -> Option<(u16, String)> {
    let agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().new_agent();
    let mut response = agent.post(url).header("Content-Type", "application/json").send(body).ok()?;
    let status = response.status().as_u16();
    Some((status, response.body_mut().read_to_string().unwrap_or_default()))
}

/// True when every subtask of every vertex in a `/jobs/<id>` answer is RUNNING.
pub fn all_subtasks_running(details: &serde_json::Value) -> bool {
    details["vertices"].as_array().is_some_and(|vs| {
        !vs.is_empty()
            && vs.iter().all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
    })
}

/// The committed part files of `dir` by attempt (`part-<job>-<attempt>-<subtask>-...`).
pub fn committed_parts(dir: &Path) -> BTreeMap<u32, BTreeSet<String>> {
    let mut parts: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(rest) = name.strip_prefix("part-")
            && let Some(attempt) = rest.split('-').nth(1).and_then(|a| a.parse().ok())
        {
            parts.entry(attempt).or_default().insert(name);
        }
    }
    parts
}
