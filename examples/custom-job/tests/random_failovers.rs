//! Failovers inside a job between its savepoints and checkpoints, `kill -9` of the whole
//! process at random points, and restores into new jobs: exactly once.
//!
//! Each round runs a chain of `flaky-counter` jobs over one bounded input into one output
//! directory. The first job crashes once inside (at a random event: the job restarts from its
//! newest checkpoint, which may be older than a savepoint taken just before), takes a
//! savepoint at a random moment, and is killed at a random moment, often within a few hundred
//! milliseconds of its failover, before its next checkpoint. The next job restores from the
//! newest restore point the killed one left (its newest checkpoint, or its savepoint when that
//! is newer: then the parts that savepoint staged must still be there). The last job runs to
//! the end, and every count must be in the output exactly once.
//!
//! The seed of each round is printed; `WEIR_RANDOM_FAILOVER_SEED` replays one and
//! `WEIR_RANDOM_FAILOVER_ROUNDS` runs more (CI runs the default).

mod common;
use common::bounded::BoundedOutput;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::runs::{RUN_WAIT_MAX, Run, assert_exactly_once, get_json, my_weir};

const USERS: u64 = 50;
const EVENTS: u64 = 24_000;
/// Events per second: the input ends about 2.4 s after a fresh start.
const RATE: u64 = 10_000;
const ROUNDS_DEFAULT: u64 = 4;

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

/// A snapshot directory and its checkpoint id.
#[derive(Clone, Debug)]
struct RestorePoint {
    path: PathBuf,
    checkpoint_id: u64,
}

fn checkpoint_id_of(snapshot: &Path) -> u64 {
    let bytes = std::fs::read(snapshot.join("_metadata")).unwrap();
    weir_checkpoint::decode_metadata(&bytes, "test").unwrap().checkpoint_id
}

fn newest_checkpoint(root: &Path, job_id: &str) -> Option<RestorePoint> {
    std::fs::read_dir(root.join(job_id))
        .ok()?
        .filter_map(|e| {
            let path = e.ok()?.path();
            let id: u64 = path.file_name()?.to_str()?.strip_prefix("chk-")?.parse().ok()?;
            path.join("_metadata").is_file().then_some((id, path))
        })
        .max()
        .map(|(checkpoint_id, path)| RestorePoint { path, checkpoint_id })
}

/// Waits until every subtask of the job runs; false when its REST API went away (it ended).
fn wait_running(rest: &str, job_id: &str) -> bool {
    let deadline = Instant::now() + RUN_WAIT_MAX;
    while Instant::now() < deadline {
        let job = get_json(&format!("{rest}/jobs/{job_id}"));
        if job.is_null() || job["state"] == "FINISHED" {
            return false;
        }
        let running = job["vertices"].as_array().is_some_and(|vs| {
            vs.iter().all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
        });
        if running {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("job {job_id} never ran");
}

fn one_round(seed: u64) {
    let mut random = Random(seed);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let marker = dir.path().join("crashed");
    let chk_root = dir.path().join("chk");
    let fail_at = 4_000 + random.below(EVENTS - 8_000);
    let job: Vec<String> = [
        "flaky-counter",
        "--users",
        &USERS.to_string(),
        "--events",
        &EVENTS.to_string(),
        "--rate",
        &RATE.to_string(),
        "--fail-at",
        &fail_at.to_string(),
        "--marker",
        marker.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let killed_jobs = 1 + random.below(2);
    let mut restore: Option<RestorePoint> = None;
    for index in 0..=killed_jobs {
        let parallelism = (1 + random.below(3)).to_string();
        let interval = ["300ms", "700ms", "1500ms"][random.below(3) as usize];
        let mut args: Vec<String> = vec!["run".into(), "-p".into(), parallelism.clone()];
        for setting in [
            "rest.port=0".to_string(),
            format!("execution.checkpointing.interval={interval}"),
            format!("state.checkpoints.dir=file://{}", chk_root.display()),
            "state.checkpoints.num-retained=2".to_string(),
            "restart-strategy.type=fixed-delay".to_string(),
            "restart-strategy.fixed-delay.delay=100ms".to_string(),
        ] {
            args.extend(["-D".to_string(), setting]);
        }
        let restore_path = restore.as_ref().map(|point| point.path.to_str().unwrap().to_string());
        if let Some(path) = &restore_path {
            args.extend(["-s".to_string(), path.clone()]);
        }
        args.extend(job.iter().cloned());
        if index == killed_jobs {
            eprintln!("seed {seed}: job {index} at -p {parallelism} from {restore_path:?} runs to the end");
            let output = my_weir().args(&args).bounded_output().unwrap();
            assert!(output.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&output.stderr));
            break;
        }
        let (mut run, rest, job_id) = Run::start(&args);
        let ran = wait_running(&rest, &job_id);
        let crashes = !marker.exists();
        // The savepoint comes before the crash or after it; the kill mostly soon after the
        // failover, before the next checkpoint.
        let before_savepoint = Duration::from_millis(random.below(1500));
        let kill_after_failover = Duration::from_millis(random.below(600));
        eprintln!(
            "seed {seed}: job {index} {job_id} at -p {parallelism}, checkpoints every {interval}, from {restore_path:?}: crash at event {fail_at} {}, savepoint after {before_savepoint:?}, kill {kill_after_failover:?} after the failover",
            if crashes { "ahead" } else { "already happened" }
        );
        std::thread::sleep(before_savepoint);
        let mut savepoint = None;
        if ran {
            let target = dir.path().join("savepoints");
            let output = my_weir()
                .args(["savepoint", "-m", rest.trim_start_matches("http://"), &job_id, target.to_str().unwrap()])
                .bounded_output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).to_string();
            // A job restarting or finishing takes no savepoint: that is fine here.
            if let Some(path) = stdout.lines().find_map(|l| l.strip_prefix("Savepoint completed. Path: ")) {
                let path = PathBuf::from(path.trim().trim_start_matches("file://"));
                savepoint = Some(RestorePoint { checkpoint_id: checkpoint_id_of(&path), path });
            }
        }
        // Until the failover (or the end of the input, or 4 s).
        let deadline = Instant::now() + Duration::from_secs(4);
        while crashes && !marker.exists() && Instant::now() < deadline && run.child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(kill_after_failover);
        run.kill_hard();
        let newest =
            [newest_checkpoint(&chk_root, &job_id), savepoint].into_iter().flatten().max_by_key(|p| p.checkpoint_id);
        if let Some(newest) = newest {
            let kind = if newest.path.starts_with(&chk_root) { "checkpoint" } else { "savepoint" };
            eprintln!("seed {seed}: restore point: {kind} {} ({})", newest.checkpoint_id, newest.path.display());
            restore = Some(newest);
        }
    }
    assert!(marker.exists(), "seed {seed}: the injected failover never happened");
    assert_exactly_once(&out, USERS, EVENTS);
}

#[test]
fn failovers_between_savepoints_and_checkpoints_kills_and_restores_stay_exactly_once() {
    let rounds =
        std::env::var("WEIR_RANDOM_FAILOVER_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS_DEFAULT);
    let replay: Option<u64> = std::env::var("WEIR_RANDOM_FAILOVER_SEED").ok().and_then(|s| s.parse().ok());
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    for round in 0..rounds {
        let seed = replay.unwrap_or(base.wrapping_add(round.wrapping_mul(0x9e37_79b9)));
        eprintln!("WEIR_RANDOM_FAILOVER_SEED={seed}");
        one_round(seed);
        if replay.is_some() {
            break;
        }
    }
}
