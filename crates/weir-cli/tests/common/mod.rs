//! Shared helpers for tests that run the real `weir` binary: spawning it, reading its
//! output as it comes, talking to its REST API, and always ending the process.

#![allow(dead_code)]

pub mod bounded;
pub mod ha;

pub use bounded::{BoundedOutput, collect_within};

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest any test waits for the binary to reach a point it expects.
pub const WAIT_MAX: Duration = Duration::from_secs(30);

/// The built `weir` binary with logging off.
pub fn weir() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    // Quiet unless WEIR_TEST_LOG asks for the processes' logs (a WEIR_LOG filter).
    let log = std::env::var("WEIR_TEST_LOG").unwrap_or_else(|_| "off".to_string());
    command.env("WEIR_LOG", log).env_remove("WEIR_JOBMANAGER").env_remove("WEIR_CONF_DIR");
    command
}

/// Runs `weir args...` to completion (at most `bounded::RUN_MAX`).
pub fn run_weir(args: &[&str]) -> Output {
    weir().args(args).bounded_output().expect("the weir binary runs")
}

/// The lines of stderr that start with `error:`.
pub fn error_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr).lines().filter(|l| l.starts_with("error:")).map(str::to_string).collect()
}

/// A `weir run` in the background whose output is collected line by line.
pub struct RunningWeir {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

fn collect(stream: impl std::io::Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            into.lock().unwrap().push(line);
        }
    });
}

impl RunningWeir {
    /// Starts `weir` with `args` (add `-D rest.port=0` yourself).
    pub fn start(args: &[&str]) -> RunningWeir {
        RunningWeir::start_with(|command| command, args)
    }

    /// As [`RunningWeir::start`], letting `configure` adjust the command (environment).
    pub fn start_with(configure: impl FnOnce(Command) -> Command, args: &[&str]) -> RunningWeir {
        let mut child = configure(weir())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the weir binary starts");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        RunningWeir { child, stdout, stderr }
    }

    fn wait_for_line(&mut self, stream: &Arc<Mutex<Vec<String>>>, marker: &str) -> String {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(line) = stream.lock().unwrap().iter().find(|l| l.contains(marker)) {
                return line.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("weir exited with {status} before printing '{marker}'; stderr: {:?}", self.stderr_lines());
            }
            assert!(Instant::now() < deadline, "no '{marker}' within {WAIT_MAX:?}; stderr: {:?}", self.stderr_lines());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The first stderr line containing `marker` (waits for it).
    pub fn stderr_line(&mut self, marker: &str) -> String {
        let stderr = Arc::clone(&self.stderr);
        self.wait_for_line(&stderr, marker)
    }

    /// The REST base URL the embedded cluster printed.
    pub fn rest_url(&mut self) -> String {
        let stderr = Arc::clone(&self.stderr);
        let line = self.wait_for_line(&stderr, "REST API at http://");
        line.split("REST API at ").nth(1).unwrap().trim().to_string()
    }

    /// The job id `run` printed (on stdout, or on stderr when its records go to stdout).
    pub fn job_id(&mut self) -> String {
        let marker = "Job has been submitted with JobID ";
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            for stream in [&self.stdout, &self.stderr] {
                if let Some(line) = stream.lock().unwrap().iter().find(|l| l.contains(marker)) {
                    return line.rsplit(' ').next().unwrap().to_string();
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("weir exited with {status} before printing '{marker}'; stderr: {:?}", self.stderr_lines());
            }
            assert!(Instant::now() < deadline, "no '{marker}' within {WAIT_MAX:?}; stderr: {:?}", self.stderr_lines());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to end; returns its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader threads drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return status.code();
            }
            assert!(Instant::now() < deadline, "weir did not exit within {WAIT_MAX:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True once the process exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the process with SIGKILL (`kill -9`): no shutdown code runs.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Everything printed on stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// Everything printed on stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `signal` (`TERM`, `INT`, `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {} failed", self.child.id());
    }
}

/// A child process killed (and reaped) when dropped, so a failed assertion leaves none.
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RunningWeir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A REST answer.
pub struct Http {
    pub status: u16,
    pub body: String,
}

impl Http {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent()
}

/// GET `url`.
pub fn get(url: &str) -> Http {
    let mut response = agent().get(url).call().expect("REST answers");
    let status = response.status().as_u16();
    Http { status, body: response.body_mut().read_to_string().unwrap() }
}

/// PATCH `url`.
pub fn patch(url: &str) -> Http {
    let mut response = agent().patch(url).send_empty().expect("REST answers");
    let status = response.status().as_u16();
    Http { status, body: response.body_mut().read_to_string().unwrap() }
}

/// POST `url` with a JSON `body`.
pub fn post_json(url: &str, body: &str) -> Http {
    let mut response = agent().post(url).header("Content-Type", "application/json").send(body).expect("REST answers");
    let status = response.status().as_u16();
    Http { status, body: response.body_mut().read_to_string().unwrap() }
}

/// Polls `GET url` until `done(json)` or [`WAIT_MAX`].
pub fn poll_json(url: &str, mut done: impl FnMut(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let answer = get(url);
        if answer.status == 200 {
            let json = answer.json();
            if done(&json) {
                return json;
            }
        }
        assert!(Instant::now() < deadline, "{url} never reached the expected state; last: {}", answer.body);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every line of every committed `part-*` file in `dir` (dot-files ignored, as readers do).
pub fn committed_lines(dir: &std::path::Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("part-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}

/// Starts `weir args` and waits until the job and every subtask are RUNNING; the process,
/// the REST URL and the job id.
pub fn start_running(args: &[&str]) -> (RunningWeir, String, String) {
    let mut weir = RunningWeir::start(args);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    poll_json(&format!("{rest}/jobs/{job_id}"), |job| {
        job["state"] == "RUNNING"
            && job["vertices"].as_array().is_some_and(|vs| {
                vs.iter()
                    .all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
            })
    });
    (weir, rest, job_id)
}

/// Starts `weir args`; waits until the job runs and has completed `checkpoints` checkpoints;
/// the process, the REST URL and the job id.
pub fn start_checkpointed(args: &[&str], checkpoints: u64) -> (RunningWeir, String, String) {
    let mut weir = RunningWeir::start(args);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(checkpoints));
    (weir, rest, job_id)
}

/// `weir stop --savepoint-path DIR JOB` against the REST API at `rest`; the savepoint's path.
pub fn stop_with_savepoint(rest: &str, job_id: &str, dir: &std::path::Path) -> String {
    let address = rest.trim_start_matches("http://");
    let output = run_weir(&["stop", "-m", address, "--savepoint-path", dir.to_str().unwrap(), job_id]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    savepoint_location(&stdout)
}

/// The names of the entries of `dir` that start with `prefix` (a backend's local stores).
pub fn entries_starting_with(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The location in `weir savepoint`/`weir stop`'s "Savepoint completed. Path: ..." line.
pub fn savepoint_location(stdout: &str) -> String {
    let line =
        stdout.lines().find(|l| l.starts_with("Savepoint completed. Path: ")).unwrap_or_else(|| panic!("{stdout}"));
    line.trim_start_matches("Savepoint completed. Path: ").trim().to_string()
}

/// The newest `chk-<n>` with a `_metadata` in a job's checkpoint directory.
pub fn newest_checkpoint(job_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(job_dir)
        .ok()?
        .filter_map(|e| {
            let path = e.ok()?.path();
            let id: u64 = path.file_name()?.to_str()?.strip_prefix("chk-")?.parse().ok()?;
            path.join("_metadata").is_file().then_some((id, path))
        })
        .max()
        .map(|(_, path)| path)
}

/// Checks the counter's output: every one of `users` users has exactly the counts
/// 1..=events/users (nothing lost, nothing duplicated).
pub fn assert_counts_exactly_once(lines: &[String], users: u64, events: u64) {
    let mut per_user: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    for line in lines {
        let (user, count) = line.split_once('\t').unwrap_or_else(|| panic!("not user<TAB>count: {line:?}"));
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(per_user.len() as u64, users, "users seen");
    let expected: Vec<u64> = (1..=events / users).collect();
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        if counts != expected {
            let mut seen = std::collections::BTreeMap::new();
            for c in &counts {
                *seen.entry(*c).or_insert(0) += 1;
            }
            let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).map(|(c, _)| *c).take(5).collect();
            panic!(
                "user {user}: {} counts for {} events; duplicated {duplicated:?}, max {:?}",
                counts.len(),
                expected.len(),
                counts.last()
            );
        }
    }
}

/// SIGKILLs every process whose command line mentions `dir`.
pub fn kill_processes_naming(dir: &std::path::Path) {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if String::from_utf8_lossy(&cmdline).contains(&needle) && pid != std::process::id() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

/// Runs `command` (its output piped) to its end, killing it after `limit`; its output, and
/// whether it ended by itself.
pub fn output_within(mut command: Command, limit: Duration) -> (Output, bool) {
    collect_within(&mut command, limit).unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"))
}

/// `weir jobmanager` on free ports with `settings` (`-D` values): the process, its REST base
/// URL (`http://HOST:PORT`) and the RPC address TaskManagers connect to.
pub fn start_jobmanager(settings: &[&str]) -> (RunningWeir, String, String) {
    let mut args = vec!["jobmanager", "-D", "rest.port=0", "-D", "jobmanager.rpc.port=0"];
    for setting in settings {
        args.extend(["-D", setting]);
    }
    let mut jobmanager = RunningWeir::start(&args);
    let line = jobmanager.stderr_line("REST API at http://");
    let rest = line.split("REST API at ").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    (jobmanager, rest, rpc)
}

/// `weir taskmanager` connected to `rpc` with `slots` slots and a 200 ms heartbeat, once it
/// registered.
pub fn start_taskmanager(rpc: &str, slots: u32) -> RunningWeir {
    let slots = format!("taskmanager.numberOfTaskSlots={slots}");
    let mut taskmanager =
        RunningWeir::start(&["taskmanager", "--jobmanager", rpc, "-D", &slots, "-D", "heartbeat.interval=200ms"]);
    taskmanager.stderr_line("registered at");
    taskmanager
}

/// Waits up to `limit` until job `job_id` at `rest` is FINISHED or FAILED; its details.
pub fn wait_for_job_end(rest: &str, job_id: &str, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let details = get(&format!("{rest}/jobs/{job_id}")).json();
        if details["state"] == "FINISHED" || details["state"] == "FAILED" {
            return details;
        }
        assert!(Instant::now() < deadline, "job did not finish: {details}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
