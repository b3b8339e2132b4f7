//! The standalone cluster from the command line: `weir jobmanager`, `weir taskmanager`,
//! `weir cluster start|stop`, and `weir run -m` submitting to it.

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use weir_api::catalog::JobCatalog;
use weir_config::options::{
    HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, JOBMANAGER_RPC_ADDRESS, JOBMANAGER_RPC_PORT, REST_ADDRESS, REST_PORT,
    TASKMANAGER_MEMORY_PROCESS_SIZE, TASKMANAGER_NUMBER_OF_TASK_SLOTS,
};
use weir_jobmanager::settings::{connect_ha, ha_settings, wire_security};
use weir_jobmanager::{JobManager, build_graph, job_config};
use weir_runtime::cluster::{GraphBuilder, JobManagerSource, JobSubmission, run_taskmanager};
use weir_types::JobStatus;

use crate::args::{ClusterCommand, ClusterStartArgs, ConfigArgs, ConfigOnly, RunArgs, TaskmanagerArgs};
use crate::client::{RestClient, error_text};
use crate::error::CliError;
use crate::settings;

/// Longest `weir cluster start` waits for its processes to be up.
const CLUSTER_START_WAIT_MAX: Duration = Duration::from_secs(20);
/// Longest `cluster stop` waits for the processes it stopped to exit.
const CLUSTER_STOP_WAIT_MAX: Duration = Duration::from_secs(15);

/// `weir jobmanager`: a JobManager until SIGTERM or SIGINT (what stopping means for its
/// jobs depends on high availability: see `weir_jobmanager::JobManager::run`).
pub fn jobmanager(args: ConfigOnly, catalog: Arc<JobCatalog>) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let jobmanager = JobManager::start(config, catalog)?;
    let stop = crate::signals::on_termination("JobManager", |_| {})
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    jobmanager.run(&stop.flag())?;
    Ok(ExitCode::SUCCESS)
}

pub fn taskmanager(args: TaskmanagerArgs, catalog: Arc<JobCatalog>) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let jobmanager = match args.jobmanager {
        Some(address) => address,
        None => format!(
            "{}:{}",
            config.get(&JOBMANAGER_RPC_ADDRESS).map_err(CliError::usage)?,
            config.get(&JOBMANAGER_RPC_PORT).map_err(CliError::usage)?
        ),
    };
    let resources = weir_runtime::cluster::TaskManagerResources {
        slots: config.get(&TASKMANAGER_NUMBER_OF_TASK_SLOTS).map_err(CliError::usage)?,
        memory_limit: config.get(&TASKMANAGER_MEMORY_PROCESS_SIZE).map_err(CliError::usage)?.map(|b| b as u64),
    };
    let heartbeat = weir_runtime::cluster::Heartbeats {
        interval: config.get(&HEARTBEAT_INTERVAL).map_err(CliError::usage)?,
        timeout: config.get(&HEARTBEAT_TIMEOUT).map_err(CliError::usage)?,
    };
    let security = wire_security(&config)?;
    let source = match ha_settings(&config)? {
        // With high availability the leader is found (and followed) through etcd.
        Some(ha) => JobManagerSource::Leader(Arc::new(connect_ha(ha)?)),
        None => JobManagerSource::Fixed(jobmanager),
    };
    let addresses = settings::data_addresses(&config)?;
    let builder: GraphBuilder = Arc::new(move |submission: &JobSubmission| {
        let config = job_config(&config, submission).map_err(|e| e.to_string())?;
        build_graph(&catalog, &config, &submission.job, &submission.args).map_err(|e| e.to_string())
    });
    // SIGTERM / SIGINT: cancel the subtasks, deregister, exit 0.
    let stop = crate::signals::on_termination("TaskManager", |_| {})
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    run_taskmanager(source, resources, heartbeat, builder, security, addresses, stop.flag())
        .map_err(|e| CliError::runtime(format!("TaskManager: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// `weir run -m`: submits to the cluster at `address`, then follows the job unless `-d`.
pub fn submit(address: &str, args: &RunArgs) -> Result<ExitCode, CliError> {
    let client = RestClient::new(address);
    let savepoint = args.from_savepoint.as_deref().map(|path| {
        if path.contains("://") {
            path.to_string()
        } else {
            std::path::absolute(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.to_string())
        }
    });
    let submission = JobSubmission {
        job: args.job.clone(),
        args: args.job_args.clone(),
        config: args.config.dynamic.clone(),
        parallelism: args.parallelism,
        savepoint,
        allow_non_restored_state: args.allow_non_restored_state,
    };
    let body = serde_json::to_value(&submission).map_err(|e| CliError::runtime(e.to_string()))?;
    let response = client.post_json("/jobs", &body)?;
    if !(200..300).contains(&response.status) {
        let message = error_text(&response.body);
        return Err(if response.status == 400 { CliError::usage(message) } else { CliError::runtime(message) });
    }
    let answer: Value = serde_json::from_str(&response.body).map_err(|e| CliError::runtime(e.to_string()))?;
    let job_id = answer["jobid"].as_str().unwrap_or_default().to_string();
    println!("Job has been submitted with JobID {job_id}");
    for note in answer["notes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        eprintln!("{note}");
    }
    if args.detached {
        return Ok(ExitCode::SUCCESS);
    }
    detach_on_interrupt(address, &job_id)?;
    if args.from_savepoint.is_some() {
        crate::progress::follow_restore(|| {
            let details: Value = client.get_json(&format!("/jobs/{job_id}"))?;
            serde_json::from_value(details).map_err(|e| {
                CliError::runtime(format!("{}/jobs/{job_id} answered something unexpected: {e}", client.base()))
            })
        })?;
    }
    loop {
        let status: Value = client.get_json(&format!("/jobs/{job_id}/status"))?;
        let state: JobStatus =
            serde_json::from_value(status["status"].clone()).map_err(|e| CliError::runtime(e.to_string()))?;
        if state.is_globally_terminal() {
            let details: Value = client.get_json(&format!("/jobs/{job_id}"))?;
            println!("Job {job_id} ended with state {state} after {} ms", details["duration"]);
            return match state {
                JobStatus::Finished => Ok(ExitCode::SUCCESS),
                JobStatus::Failed => Err(CliError::runtime(format!(
                    "job {job_id} FAILED: {}",
                    details["failure-cause"].as_str().unwrap_or("no cause recorded")
                ))),
                _ => Ok(ExitCode::from(1)),
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ctrl-C (or SIGTERM) while following a job on a cluster: as Flink's attached `flink run`
/// (without `-sae`), the job keeps running and the client goes; it says how to reach the
/// job and where it could resume from.
fn detach_on_interrupt(address: &str, job_id: &str) -> Result<(), CliError> {
    let (address, job_id) = (address.to_string(), job_id.to_string());
    crate::signals::on_termination("weir run", move |signal| {
        let newest = RestClient::new(&address)
            .get_json::<Value>(&format!("/jobs/{job_id}/checkpoints"))
            .ok()
            .and_then(|stats| stats["latest"]["completed"]["external_path"].as_str().map(str::to_string));
        eprintln!(
            "Detached from job {job_id}: it keeps running on the cluster at {address}. `weir cancel -m {address} {job_id}` cancels it, `weir stop -m {address} {job_id}` stops it with a savepoint."
        );
        match newest {
            Some(path) => eprintln!("Its newest checkpoint is {path}; a new run resumes from it with: weir run -s {path} ..."),
            None => eprintln!("It has completed no checkpoint yet."),
        }
        // Exited as a shell reports an interrupted command.
        #[allow(clippy::disallowed_methods)]
        std::process::exit(128 + signal);
    })
    .map(drop)
    .map_err(|e| CliError::runtime(format!("cannot handle SIGINT: {e}")))
}

fn cluster_dir() -> std::path::PathBuf {
    settings::data_dir().join("cluster")
}

pub fn cluster(command: ClusterCommand) -> Result<ExitCode, CliError> {
    match command {
        ClusterCommand::Start(args) => start(args),
        ClusterCommand::AddTaskmanager(args) => add_taskmanager(args),
        ClusterCommand::Stop => stop(),
    }
}

fn config_args(config: &ConfigArgs) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(file) = &config.config {
        args.push("-c".to_string());
        args.push(file.display().to_string());
    }
    for entry in &config.dynamic {
        args.push("-D".to_string());
        args.push(entry.clone());
    }
    args
}

fn start(args: ClusterStartArgs) -> Result<ExitCode, CliError> {
    let config = settings::load(&args.config)?;
    let dir = cluster_dir();
    let pid_file = dir.join("cluster.pids");
    if pid_file.exists() {
        return Err(CliError::runtime(format!(
            "a cluster started from {} may still run ({} exists); run `weir cluster stop` first",
            dir.display(),
            pid_file.display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(|e| CliError::runtime(format!("cannot create {}: {e}", dir.display())))?;
    let layout = ClusterLayout::read(&config, dir, args.jobmanagers)?;
    let started = Instant::now();
    let mut processes = Vec::new();
    let spawned = layout
        .start_jobmanagers(&args.config, &mut processes)
        .and_then(|rest| layout.start_taskmanagers(&args.config, args.taskmanagers, &mut processes).map(|()| rest));
    let rest_addresses = match spawned {
        Ok(rest) => rest,
        Err(error) => {
            stop_started(&mut processes);
            return Err(error);
        }
    };
    let text: Vec<String> = processes.iter().map(|p| p.child.id().to_string()).collect();
    std::fs::write(&pid_file, text.join("\n") + "\n")
        .map_err(|e| CliError::runtime(format!("cannot write {}: {e}", pid_file.display())))?;
    // `add-taskmanager` starts its TaskManagers with the same configuration.
    record_config_args(&layout.dir, &args.config)?;
    if let Err(error) = layout.wait_until_up(args.taskmanagers, started, &mut processes) {
        stop_started(&mut processes);
        let _ = std::fs::remove_file(&pid_file);
        return Err(error);
    }
    if layout.ha {
        println!(
            "High availability on etcd: JobManagers at {} (one leads, the others stand by)",
            rest_addresses.join(", ")
        );
    }
    let slots = config.get(&TASKMANAGER_NUMBER_OF_TASK_SLOTS).map_err(CliError::usage)?;
    let jobmanager = if layout.ha {
        "TaskManagers registered with the leader".to_string()
    } else {
        format!("JobManager at http://{} (TaskManagers connect to {})", layout.rest, layout.rpc)
    };
    println!(
        "Cluster started in {} ms: {jobmanager}, {} TaskManager(s) with {slots} slot(s) each; logs in {}",
        started.elapsed().as_millis(),
        args.taskmanagers,
        layout.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// What `weir cluster start` starts and where its processes listen, from the configuration.
struct ClusterLayout {
    /// The weir binary the processes run.
    exe: std::path::PathBuf,
    /// Where their logs and the pid file are.
    dir: std::path::PathBuf,
    rpc_port: u16,
    /// `host:port` of the first JobManager's RPC, which TaskManagers connect to without HA.
    rpc: String,
    rest_host: String,
    rest_port: u16,
    /// `host:port` of the first JobManager's REST API.
    rest: String,
    /// High availability: standby JobManagers, and TaskManagers that find the leader.
    ha: bool,
    jobmanagers: u32,
}

impl ClusterLayout {
    /// Reads the layout; more than one JobManager without high availability is refused (and
    /// the new, still empty cluster directory removed).
    fn read(config: &weir_config::Configuration, dir: std::path::PathBuf, jobmanagers: u32) -> Result<Self, CliError> {
        let exe =
            std::env::current_exe().map_err(|e| CliError::runtime(format!("cannot find the weir binary: {e}")))?;
        let rpc_port = config.get(&JOBMANAGER_RPC_PORT).map_err(CliError::usage)?;
        let rpc = format!("{}:{rpc_port}", config.get(&JOBMANAGER_RPC_ADDRESS).map_err(CliError::usage)?);
        let rest_port = config.get(&REST_PORT).map_err(CliError::usage)?;
        let rest_host = config.get(&REST_ADDRESS).map_err(CliError::usage)?;
        let rest = format!("{rest_host}:{rest_port}");
        let ha = ha_settings(config)?.is_some();
        let jobmanagers = jobmanagers.max(1);
        if jobmanagers > 1 && !ha {
            let _ = std::fs::remove_dir(&dir);
            return Err(CliError::usage(format!(
                "--jobmanagers {jobmanagers} needs high-availability.type: etcd (standby JobManagers take over through etcd; see docs/high-availability.md)"
            )));
        }
        Ok(ClusterLayout { exe, dir, rpc_port, rpc, rest_host, rest_port, rest, ha, jobmanagers })
    }

    /// Port `port` moved up by `index` for the `index`th JobManager; 0 (any free port) stays 0.
    fn offset(port: u16, index: u32) -> u16 {
        if port == 0 { 0 } else { port.saturating_add(index as u16) }
    }

    /// Starts the JobManagers, appended to `processes`; the URL of each one's REST API.
    fn start_jobmanagers(&self, config: &ConfigArgs, processes: &mut Vec<Started>) -> Result<Vec<String>, CliError> {
        let mut rest_addresses = Vec::new();
        for index in 0..self.jobmanagers {
            let mut jobmanager_args = vec!["jobmanager".to_string()];
            jobmanager_args.extend(config_args(config));
            if index > 0 {
                // Standbys listen next to the first JobManager.
                let rest_port = Self::offset(self.rest_port, index);
                let rpc_port = Self::offset(self.rpc_port, index);
                jobmanager_args.extend(["-D".to_string(), format!("rest.port={rest_port}")]);
                jobmanager_args.extend(["-D".to_string(), format!("jobmanager.rpc.port={rpc_port}")]);
            }
            rest_addresses.push(format!("http://{}:{}", self.rest_host, Self::offset(self.rest_port, index)));
            let name = if index == 0 { "jobmanager".to_string() } else { format!("jobmanager-{index}") };
            processes.push(spawn_process(&self.exe, &self.dir, &name, jobmanager_args)?);
        }
        Ok(rest_addresses)
    }

    /// Starts `count` TaskManagers, appended to `processes`.
    fn start_taskmanagers(
        &self,
        config: &ConfigArgs,
        count: u32,
        processes: &mut Vec<Started>,
    ) -> Result<(), CliError> {
        for index in 0..count {
            // With HA a TaskManager finds the leader through etcd.
            let mut taskmanager_args = vec!["taskmanager".to_string()];
            if !self.ha {
                taskmanager_args.extend(["--jobmanager".to_string(), self.rpc.clone()]);
            }
            taskmanager_args.extend(config_args(config));
            processes.push(spawn_process(&self.exe, &self.dir, &format!("taskmanager-{index}"), taskmanager_args)?);
        }
        Ok(())
    }

    /// Waits until `taskmanagers` TaskManagers are registered, at most
    /// [`CLUSTER_START_WAIT_MAX`] after `started`. A process of `processes` that exits
    /// meanwhile (a JobManager whose ports another cluster holds) fails the start at once,
    /// with its error: the REST API answering may be another cluster's.
    fn wait_until_up(&self, taskmanagers: u32, started: Instant, processes: &mut [Started]) -> Result<(), CliError> {
        // Through the first JobManager (a standby forwards to the leader).
        let client = RestClient::new(&self.rest);
        loop {
            if let Some(exited) = processes.iter_mut().find_map(|p| p.exited(&self.dir)) {
                return Err(CliError::runtime(format!(
                    "{exited}; the cluster was not started and what it had started is stopped"
                )));
            }
            // Until each JobManager says it listens, the REST API answering may be another
            // cluster's, with this cluster's TaskManagers registering there.
            let listening =
                processes.iter().filter(|p| p.name.starts_with("jobmanager")).all(|p| p.listening(&self.dir));
            if listening
                && let Ok(overview) = client.get_json::<Value>("/overview")
                && overview["taskmanagers"].as_u64() == Some(u64::from(taskmanagers))
            {
                return Ok(());
            }
            if started.elapsed() > CLUSTER_START_WAIT_MAX {
                return Err(CliError::runtime(format!(
                    "the cluster did not come up within {CLUSTER_START_WAIT_MAX:?}; see the logs in {}",
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A cluster process `cluster start` started.
struct Started {
    /// `jobmanager`, `taskmanager-0`, ...: its log is `<name>.log`.
    name: String,
    child: std::process::Child,
}

impl Started {
    /// Whether its log says it serves (a JobManager's "REST API at ..." line).
    fn listening(&self, dir: &std::path::Path) -> bool {
        std::fs::read_to_string(dir.join(format!("{}.log", self.name))).is_ok_and(|log| log.contains("REST API at "))
    }

    /// Why it ended, if it did: its exit status and the last error of its log.
    fn exited(&mut self, dir: &std::path::Path) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        let log = std::fs::read_to_string(dir.join(format!("{}.log", self.name))).unwrap_or_default();
        let error =
            log.lines().rev().find(|l| l.contains("error")).or_else(|| log.lines().last()).unwrap_or("no output");
        Some(format!("{} (pid {}) exited at once ({status}): {}", self.name, self.child.id(), error.trim()))
    }
}

/// Ends every process of an unfinished start (a TaskManager may already have registered with
/// whatever JobManager holds the ports).
fn stop_started(processes: &mut [Started]) {
    for process in processes {
        let _ = process.child.kill();
        let _ = process.child.wait();
    }
}

/// The file `cluster start` records its `-c` and `-D` arguments in.
fn config_args_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("cluster.args")
}

/// Records `config` (the configuration file as an absolute path) for `add-taskmanager`.
fn record_config_args(dir: &std::path::Path, config: &ConfigArgs) -> Result<(), CliError> {
    let mut recorded = config.clone();
    if let Some(file) = &recorded.config {
        recorded.config = Some(std::path::absolute(file).unwrap_or_else(|_| file.clone()));
    }
    let text = serde_json::to_string(&config_args(&recorded)).map_err(CliError::runtime)?;
    let path = config_args_file(dir);
    std::fs::write(&path, text).map_err(|e| CliError::runtime(format!("cannot write {}: {e}", path.display())))
}

/// `args` over what `cluster start` recorded: its configuration file unless `args` names
/// one, its `-D`s before those of `args` (which win).
fn with_recorded_config_args(dir: &std::path::Path, args: &ConfigArgs) -> Result<ConfigArgs, CliError> {
    let path = config_args_file(dir);
    let recorded: Vec<String> = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            CliError::runtime(format!("{} is damaged ({e}); stop the cluster and start it again", path.display()))
        })?,
        // A cluster started by an older weir recorded none.
        Err(_) => Vec::new(),
    };
    let mut merged = ConfigArgs { config: None, dynamic: Vec::new() };
    let mut words = recorded.into_iter();
    while let (Some(flag), Some(value)) = (words.next(), words.next()) {
        match flag.as_str() {
            "-c" => merged.config = Some(value.into()),
            _ => merged.dynamic.push(value),
        }
    }
    if args.config.is_some() {
        merged.config = args.config.clone();
    }
    merged.dynamic.extend(args.dynamic.iter().cloned());
    Ok(merged)
}

/// Starts `weir <verb...>` in the background with its output in `<dir>/<name>.log`.
fn spawn_process(
    exe: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    verb: Vec<String>,
) -> Result<Started, CliError> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))
        .map_err(|e| CliError::runtime(format!("cannot create the log of {name}: {e}")))?;
    let err = log.try_clone().map_err(|e| CliError::runtime(e.to_string()))?;
    let child = Command::new(exe)
        .args(verb)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| CliError::runtime(format!("cannot start {name}: {e}")))?;
    Ok(Started { name: name.to_string(), child })
}

/// `weir cluster add-taskmanager`: one more TaskManager for the cluster `cluster start`
/// started, recorded in its pid file so `cluster stop` ends it too.
fn add_taskmanager(args: ConfigArgs) -> Result<ExitCode, CliError> {
    let dir = cluster_dir();
    let args = with_recorded_config_args(&dir, &args)?;
    let config = settings::load(&args)?;
    let pid_file = dir.join("cluster.pids");
    if !pid_file.exists() {
        return Err(CliError::runtime(format!(
            "no cluster runs from {} ({} does not exist); start one with `weir cluster start`",
            dir.display(),
            pid_file.display()
        )));
    }
    let exe = std::env::current_exe().map_err(|e| CliError::runtime(format!("cannot find the weir binary: {e}")))?;
    let rpc = format!(
        "{}:{}",
        config.get(&JOBMANAGER_RPC_ADDRESS).map_err(CliError::usage)?,
        config.get(&JOBMANAGER_RPC_PORT).map_err(CliError::usage)?
    );
    let client = settings::jobmanager_client(None, &config)?;
    let count = |client: &RestClient| {
        client.get_json::<Value>("/overview").ok().and_then(|overview| overview["taskmanagers"].as_u64())
    };
    let Some(before) = count(&client) else {
        return Err(CliError::runtime(format!(
            "the cluster's JobManager does not answer at {}; check {}/jobmanager.log",
            client.base(),
            dir.display()
        )));
    };
    // The next free log name: taskmanager-<n>.log.
    let index = (0..).find(|n| !dir.join(format!("taskmanager-{n}.log")).exists()).unwrap_or(0);
    let name = format!("taskmanager-{index}");
    let mut verb = vec!["taskmanager".to_string()];
    // With HA a TaskManager finds the leader through etcd (and follows it when it changes).
    let ha = ha_settings(&config)?.is_some();
    if !ha {
        verb.extend(["--jobmanager".to_string(), rpc.clone()]);
    }
    verb.extend(config_args(&args));
    let started = Instant::now();
    let pid = spawn_process(&exe, &dir, &name, verb)?.child.id();
    let mut pids = std::fs::OpenOptions::new()
        .append(true)
        .open(&pid_file)
        .map_err(|e| CliError::runtime(format!("cannot record the TaskManager in {}: {e}", pid_file.display())))?;
    std::io::Write::write_all(&mut pids, format!("{pid}\n").as_bytes())
        .map_err(|e| CliError::runtime(format!("cannot record the TaskManager in {}: {e}", pid_file.display())))?;
    while count(&client).is_none_or(|now| now <= before) {
        if started.elapsed() > CLUSTER_START_WAIT_MAX {
            return Err(CliError::runtime(format!(
                "the TaskManager (pid {pid}) did not register within {CLUSTER_START_WAIT_MAX:?}; see {}/{name}.log",
                dir.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let connected =
        if ha { "registered with the leader JobManager".to_string() } else { format!("connected to {rpc}") };
    println!(
        "TaskManager started in {} ms (pid {pid}), {connected}; log in {}/{name}.log",
        started.elapsed().as_millis(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// False when `pid` is known not to be a weir JobManager or TaskManager (it ended, and the
/// pid may since belong to another process); true where `/proc` cannot tell.
fn is_cluster_process(pid: &str) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => cmdline.split(|b| *b == 0).any(|arg| arg == b"jobmanager" || arg == b"taskmanager"),
        Err(_) => !std::path::Path::new("/proc/self").exists(),
    }
}

fn stop() -> Result<ExitCode, CliError> {
    let pid_file = cluster_dir().join("cluster.pids");
    let text = std::fs::read_to_string(&pid_file)
        .map_err(|_| CliError::runtime(format!("no cluster to stop: {} does not exist", pid_file.display())))?;
    let mut stopped = Vec::new();
    for pid in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !is_cluster_process(pid) {
            continue;
        }
        let status = Command::new("kill").arg(pid.trim()).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if status.is_ok_and(|s| s.success()) {
            stopped.push(pid);
        }
    }
    // Gone before this returns, as stop-cluster.sh's processes are: a `cluster start` right
    // after must find their ports free.
    let deadline = Instant::now() + CLUSTER_STOP_WAIT_MAX;
    while stopped.iter().any(|pid| is_cluster_process(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = stopped.len();
    let _ = std::fs::remove_file(&pid_file);
    println!("Stopped {stopped} cluster process(es).");
    Ok(ExitCode::SUCCESS)
}
