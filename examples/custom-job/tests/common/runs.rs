//! `my-weir run` in the background: its output lines, its REST API, and the check that a
//! counter's committed output holds every count exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// The longest a run's line or state is waited for.
pub const RUN_WAIT_MAX: Duration = Duration::from_secs(60);

pub fn my_weir() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_my-weir"));
    command.env("WEIR_LOG", "off");
    command
}

/// A `my-weir run` in the background, killed when dropped.
pub struct Run {
    pub child: Child,
    pub stdout: Receiver<String>,
    pub stderr: Receiver<String>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn lines(stream: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    receiver
}

pub fn wait_line(receiver: &Receiver<String>, marker: &str) -> String {
    let deadline = Instant::now() + RUN_WAIT_MAX;
    loop {
        match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(marker) => return line,
            Ok(_) => {}
            Err(_) => panic!("no line with {marker:?}"),
        }
    }
}

pub fn get_json(url: &str) -> serde_json::Value {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    let body = agent.get(url).call().expect("REST answers").body_mut().read_to_string().unwrap();
    serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
}

/// Every count 1..=events/users of every user exactly once in the committed part files.
pub fn assert_exactly_once(dir: &std::path::Path, users: u64, events: u64) {
    let mut per_user: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_name().to_string_lossy().starts_with("part-") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            let (user, count) = line.split_once('\t').unwrap();
            per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
        }
    }
    assert_eq!(per_user.len() as u64, users);
    let mut duplicated = 0;
    let mut lost = 0;
    for counts in per_user.values_mut() {
        counts.sort_unstable();
        let expected: Vec<u64> = (1..=events / users).collect();
        let mut deduplicated = counts.clone();
        deduplicated.dedup();
        duplicated += counts.len() - deduplicated.len();
        lost += expected.iter().filter(|c| deduplicated.binary_search(c).is_err()).count();
    }
    assert_eq!((duplicated, lost), (0, 0), "records duplicated and lost in {}", dir.display());
}

impl Run {
    /// Starts `my-weir` with `args` (a `run`); once it printed them, its REST address and
    /// job id.
    pub fn start(args: &[String]) -> (Run, String, String) {
        let mut child = my_weir()
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        let run = Run { child, stdout, stderr };
        let rest_line = wait_line(&run.stderr, "REST API at http://");
        let rest = rest_line.split("REST API at ").nth(1).unwrap().trim().to_string();
        let job_id =
            wait_line(&run.stdout, "Job has been submitted with JobID ").rsplit(' ').next().unwrap().to_string();
        (run, rest, job_id)
    }

    /// `kill -9`.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
