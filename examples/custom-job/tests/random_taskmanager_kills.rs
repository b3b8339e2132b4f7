//! A multi-region job (the counter and its unconnected steady pipeline) on a cluster of real
//! TaskManager processes, with TaskManagers killed (`kill -9`) at random moments and the
//! counter crashing once inside at a random event: each kill fails the regions with subtasks
//! there, each region restarts from the newest checkpoint (on a replacement TaskManager), and
//! both outputs hold every count exactly once. Seeds are printed;
//! `WEIR_RANDOM_TM_KILL_SEED` replays one, `WEIR_RANDOM_TM_KILL_ROUNDS` runs more rounds.

mod common;
use common::bounded::BoundedOutput;

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::runs::{assert_exactly_once, get_json, my_weir};

const USERS: u64 = 20;
const EVENTS: u64 = 40_000;
const RATE: u64 = 8_000;
const ROUNDS_DEFAULT: u64 = 2;

/// A process ended when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `my-weir args`; returns it with its first stderr line containing `marker`.
fn spawn_until(args: &[&str], marker: &str) -> (Process, String) {
    let mut child = my_weir().args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let process = Process(child);
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(marker) => return (process, line),
            Ok(_) => {}
            Err(_) => panic!("`my-weir {}` did not print {marker:?}", args.join(" ")),
        }
    }
}

fn taskmanager(rpc: &str) -> Process {
    let args =
        ["taskmanager", "--jobmanager", rpc, "-D", "taskmanager.numberOfTaskSlots=2", "-D", "heartbeat.interval=200ms"];
    spawn_until(&args, "registered at").0
}

/// splitmix64.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound
    }
}

fn one_round(seed: u64) {
    let mut random = Random(seed);
    let jobmanager_args = [
        "jobmanager",
        "-D",
        "rest.port=0",
        "-D",
        "jobmanager.rpc.port=0",
        "-D",
        "heartbeat.interval=200ms",
        "-D",
        "heartbeat.timeout=3s",
    ];
    let (_jobmanager, line) = spawn_until(&jobmanager_args, "REST API at http://");
    let rest = line.split("REST API at http://").nth(1).unwrap().split(',').next().unwrap().to_string();
    let rpc = line.rsplit("connect to ").next().unwrap().trim().to_string();
    let mut taskmanagers: Vec<Process> = (0..3).map(|_| taskmanager(&rpc)).collect();
    let dir = tempfile::tempdir().unwrap();
    let (out, steady) = (dir.path().join("out"), dir.path().join("steady"));
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let fail_at = 4_000 + random.below(EVENTS - 8_000);
    let submit = my_weir()
        .args(["run", "-m", &rest, "-d", "-D", "execution.checkpointing.interval=200ms", "-D", &checkpoints])
        .args(["-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.attempts=20"])
        .args(["-D", "restart-strategy.fixed-delay.delay=100ms", "-p", "2", "flaky-counter"])
        .args(["--users", &USERS.to_string(), "--events", &EVENTS.to_string(), "--rate", &RATE.to_string()])
        .args(["--fail-at", &fail_at.to_string(), "--marker"])
        .arg(dir.path().join("crashed"))
        .arg("--output")
        .arg(&out)
        .arg("--steady-output")
        .arg(&steady)
        .bounded_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    assert!(submit.status.success(), "seed {seed}: {stdout}{}", String::from_utf8_lossy(&submit.stderr));
    let job_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Job has been submitted with JobID "))
        .unwrap_or_else(|| panic!("no job id in {stdout}"))
        .trim()
        .to_string();
    let kills = 1 + random.below(2);
    let mut story = vec![format!("seed {seed}: the counter crashes at event {fail_at}")];
    for kill in 0..kills {
        let after = Duration::from_millis(500 + random.below(2000));
        std::thread::sleep(after);
        let state = get_json(&format!("http://{rest}/jobs/{job_id}"))["state"].as_str().unwrap_or("").to_string();
        if state == "FINISHED" {
            break;
        }
        let victim = random.below(taskmanagers.len() as u64) as usize;
        drop(taskmanagers.remove(victim));
        story.push(format!("kill {kill}: TaskManager {victim} after {after:?} (job {state})"));
        taskmanagers.push(taskmanager(&rpc));
    }
    eprintln!("{}", story.join("\n"));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let state = get_json(&format!("http://{rest}/jobs/{job_id}"))["state"].as_str().unwrap_or("").to_string();
        if state == "FINISHED" {
            break;
        }
        assert!(state != "FAILED", "{}\nthe job FAILED", story.join("\n"));
        assert!(Instant::now() < deadline, "{}\nthe job is {state} after 90 s", story.join("\n"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_exactly_once(&out, USERS, EVENTS);
    assert_exactly_once(&steady, USERS, EVENTS);
}

#[test]
fn taskmanagers_killed_under_a_multi_region_job_leave_both_outputs_exactly_once() {
    let rounds =
        std::env::var("WEIR_RANDOM_TM_KILL_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS_DEFAULT);
    let replay: Option<u64> = std::env::var("WEIR_RANDOM_TM_KILL_SEED").ok().and_then(|s| s.parse().ok());
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    for round in 0..rounds {
        let seed = replay.unwrap_or(base.wrapping_add(round.wrapping_mul(0x9e37_79b9)));
        eprintln!("WEIR_RANDOM_TM_KILL_SEED={seed}");
        one_round(seed);
        if replay.is_some() {
            break;
        }
    }
}
