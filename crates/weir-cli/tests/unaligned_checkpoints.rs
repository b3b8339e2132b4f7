//! Unaligned checkpoints (`execution.checkpointing.unaligned.enabled`) through the `weir`
//! binary: under backpressure they complete where aligned ones cannot, they hold the records
//! that were in flight, and restores from them, killed at random points and rescaled, stay
//! exactly once.
//!
//! The job is the counter with a slow stage (`--busy-us`): its source outruns it, so every
//! channel between them is full, as in a backpressured production job.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{RunningWeir, assert_counts_exactly_once, committed_lines, get, newest_checkpoint, run_weir};

const USERS: u64 = 30;
/// The in-flight records' state (`weir_api::snapshot::IN_FLIGHT_STATE`).
const IN_FLIGHT_STATE: &str = "weir.in-flight-records";

/// `weir run` of the slow counter at `parallelism`, checkpointing every 300 ms into `dir`.
fn args(
    dir: &Path,
    parallelism: u32,
    unaligned: bool,
    events: u64,
    busy_us: u64,
    restore: Option<&Path>,
) -> Vec<String> {
    let mut args: Vec<String> =
        ["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=300ms"].map(str::to_string).to_vec();
    for option in [
        format!("state.checkpoints.dir=file://{}", dir.join("chk").display()),
        format!("execution.checkpointing.unaligned.enabled={unaligned}"),
        "execution.checkpointing.timeout=2s".to_string(),
        "execution.checkpointing.tolerable-failed-checkpoints=1000".to_string(),
        "state.checkpoints.num-retained=3".to_string(),
    ] {
        args.extend(["-D".to_string(), option]);
    }
    args.extend(["-p".to_string(), parallelism.to_string()]);
    if let Some(restore) = restore {
        args.extend(["-s".to_string(), restore.display().to_string()]);
    }
    for arg in ["counter", "--users", &USERS.to_string(), "--events", &events.to_string()] {
        args.push(arg.to_string());
    }
    args.extend(["--busy-us".to_string(), busy_us.to_string()]);
    args.extend(["--output".to_string(), dir.join("out").display().to_string()]);
    args
}

fn start(args: &[String]) -> (RunningWeir, String, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut weir = RunningWeir::start(&args);
    let rest = weir.rest_url();
    let job_id = weir.job_id();
    (weir, rest, job_id)
}

/// The job's checkpoint statistics (`GET /jobs/{id}/checkpoints`).
fn checkpoints(rest: &str, job_id: &str) -> serde_json::Value {
    get(&format!("{rest}/jobs/{job_id}/checkpoints")).json()
}

/// Waits until the job completed `n` checkpoints; their statistics.
fn wait_for_completed(rest: &str, job_id: &str, n: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = checkpoints(rest, job_id);
        if stats["counts"]["completed"].as_u64() >= Some(n) {
            return stats;
        }
        assert!(Instant::now() < deadline, "job {job_id} did not complete {n} checkpoints: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Records in flight that the snapshot at `path` holds (elements of the in-flight state).
fn in_flight_batches(path: &Path) -> u64 {
    let output = run_weir(&["savepoint", "inspect", "--json", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let inspected: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let operators = inspected["operators"].as_array().cloned().unwrap_or_default();
    operators
        .iter()
        .flat_map(|operator| operator["operator_states"].as_array().cloned().unwrap_or_default())
        .filter(|state| state["name"] == IN_FLIGHT_STATE)
        .filter_map(|state| state["elements"].as_u64())
        .sum()
}

/// The newest complete checkpoint of `job_id` under `dir`.
fn newest(dir: &Path, job_id: &str) -> PathBuf {
    newest_checkpoint(&dir.join("chk").join(job_id)).unwrap_or_else(|| panic!("job {job_id} left no checkpoint"))
}

/// With every channel full, an aligned barrier waits behind 16 batches per channel at 1024
/// records of 200 µs each (over 3 s), so a 2 s checkpoint timeout expires every aligned
/// checkpoint; the unaligned notice overtakes them and its checkpoints complete, holding
/// the records that were in the channels.
#[test]
fn under_backpressure_unaligned_checkpoints_complete_where_aligned_ones_expire() {
    let dir = tempfile::tempdir().unwrap();
    let (mut aligned, rest, job_id) = start(&args(dir.path(), 2, false, 1_000_000, 200, None));
    let deadline = Instant::now() + Duration::from_secs(60);
    let stats = loop {
        let stats = checkpoints(&rest, &job_id);
        if stats["counts"]["failed"].as_u64() >= Some(1) {
            break stats;
        }
        assert!(Instant::now() < deadline, "no aligned checkpoint expired: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(stats["counts"]["completed"], 0, "an aligned checkpoint completed under full backpressure: {stats}");
    let config = get(&format!("{rest}/jobs/{job_id}/checkpoints/config")).json();
    assert_eq!(config["unaligned_checkpoints"], false, "{config}");
    aligned.kill_hard();

    let dir = tempfile::tempdir().unwrap();
    let (mut unaligned, rest, job_id) = start(&args(dir.path(), 2, true, 1_000_000, 200, None));
    let stats = wait_for_completed(&rest, &job_id, 3);
    let completed = &stats["latest"]["completed"];
    assert_eq!(completed["checkpoint_type"], "UNALIGNED_CHECKPOINT", "{stats}");
    let config = get(&format!("{rest}/jobs/{job_id}/checkpoints/config")).json();
    assert_eq!(config["unaligned_checkpoints"], true, "{config}");
    let path = newest(dir.path(), &job_id);
    assert!(in_flight_batches(&path) > 0, "{} holds no in-flight records", path.display());
    unaligned.kill_hard();
}

/// `kill -9` of backpressured jobs at random points after an unaligned checkpoint, each
/// restored from the newest one into a new job at another parallelism (the in-flight
/// records of the keyed exchange go to their key groups' new owners); the last job runs to
/// the end. Every count is in the output exactly once. `WEIR_UNALIGNED_SEED` replays a seed.
#[test]
fn kills_and_rescaled_restores_from_unaligned_checkpoints_stay_exactly_once() {
    // Enough that no killed job reaches the end of its input (15 s at -p 2).
    const EVENTS: u64 = 600_000;
    let seed = std::env::var("WEIR_UNALIGNED_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed} (replay with WEIR_UNALIGNED_SEED={seed})");
    let mut random = weir_types::seeded::SeededRng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut restore: Option<PathBuf> = None;
    let mut in_flight_restored = 0;
    for parallelism in [2, 3] {
        let job_args = args(dir.path(), parallelism, true, EVENTS, 50, restore.as_deref());
        let (mut weir, rest, job_id) = start(&job_args);
        wait_for_completed(&rest, &job_id, 1 + random.below(3));
        std::thread::sleep(Duration::from_millis(random.below(400)));
        weir.kill_hard();
        let newest = newest(dir.path(), &job_id);
        in_flight_restored += in_flight_batches(&newest);
        eprintln!("seed {seed}: job {job_id} at -p {parallelism} killed; restoring {}", newest.display());
        restore = Some(newest);
    }
    // The last job runs to the end at yet another parallelism, at full speed.
    let last = args(dir.path(), 1, true, EVENTS, 0, restore.as_deref());
    let last: Vec<&str> = last.iter().map(String::as_str).collect();
    let output = run_weir(&last);
    assert!(output.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&output.stderr));
    assert!(in_flight_restored > 0, "seed {seed}: no restored checkpoint held in-flight records");
    assert_counts_exactly_once(&committed_lines(&dir.path().join("out")), USERS, EVENTS);
}

/// Across processes the notice crosses the TCP data connections as a frame of its own, and
/// the records in flight between two TaskManagers are in the checkpoint: one TaskManager is
/// killed with `kill -9`, the job restarts from its newest unaligned checkpoint on a fresh
/// one, and every count is in the output exactly once.
#[test]
fn a_taskmanager_killed_after_unaligned_checkpoints_of_records_crossing_the_network_loses_nothing() {
    const EVENTS: u64 = 240_000;
    let dir = tempfile::tempdir().unwrap();
    let (mut jobmanager, rest, rpc) = common::start_jobmanager(&["heartbeat.interval=200ms", "heartbeat.timeout=3s"]);
    let mut taskmanagers: Vec<RunningWeir> = (0..2).map(|_| common::start_taskmanager(&rpc, 1)).collect();
    common::poll_json(&format!("{rest}/overview"), |o| o["taskmanagers"] == 2);

    // Each TaskManager runs one source and one counter: half of each source's records
    // cross to the other TaskManager.
    let mut submit: Vec<String> =
        vec!["run".into(), "-m".into(), rest.trim_start_matches("http://").into(), "-d".into()];
    for option in [
        "restart-strategy.type=fixed-delay",
        "restart-strategy.fixed-delay.attempts=5",
        "restart-strategy.fixed-delay.delay=0ms",
    ] {
        submit.extend(["-D".into(), option.into()]);
    }
    submit.extend(args(dir.path(), 2, true, EVENTS, 50, None).into_iter().skip(3));
    let submit: Vec<&str> = submit.iter().map(String::as_str).collect();
    let output = run_weir(&submit);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let job_id =
        stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID ")).unwrap().trim().to_string();

    wait_for_completed(&rest, &job_id, 2);
    let before_kill = newest(dir.path(), &job_id);
    taskmanagers[0].kill_hard();
    taskmanagers.push(common::start_taskmanager(&rpc, 1));
    assert!(in_flight_batches(&before_kill) > 0, "{} holds no in-flight records", before_kill.display());

    let details = common::wait_for_job_end(&rest, &job_id, Duration::from_secs(120));
    assert_eq!(details["state"], "FINISHED", "{details}");
    assert!(details["numRestarts"].as_u64() >= Some(1), "{details}");
    assert_counts_exactly_once(&committed_lines(&dir.path().join("out")), USERS, EVENTS);
    jobmanager.kill_hard();
}
