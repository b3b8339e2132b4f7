//! Checkpoints, savepoints, stop and restore with the real binary: output stays exactly-once
//! across stops, rescales and `kill -9`; every refused restore says why and changes nothing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    assert_counts_exactly_once as assert_exactly_once, committed_lines, error_lines, get, newest_checkpoint, poll_json,
    run_weir, savepoint_location, start_running as start,
};

/// A local path from the `file://` URL the CLI prints.
fn path_of(location: &str) -> PathBuf {
    PathBuf::from(location.trim_start_matches("file://"))
}

fn address(rest: &str) -> String {
    rest.trim_start_matches("http://").to_string()
}

/// Stops the job with a savepoint into `dir`; returns the savepoint's location.
fn stop(rest: &str, job_id: &str, dir: &Path) -> String {
    let output = run_weir(&["stop", "-m", &address(rest), "--savepoint-path", dir.to_str().unwrap(), job_id]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("Suspending job {job_id} with a savepoint.")), "{stdout}");
    savepoint_location(&stdout)
}

/// A savepoint of `counter --users 10` (p=2, max parallelism 128) shared by the error tests.
fn shared_savepoint(enrich: bool) -> &'static Path {
    static PLAIN: OnceLock<PathBuf> = OnceLock::new();
    static ENRICHED: OnceLock<PathBuf> = OnceLock::new();
    let cell = if enrich { &ENRICHED } else { &PLAIN };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let mut args = vec![
            "run",
            "-D",
            "rest.port=0",
            "-p",
            "2",
            "counter",
            "--users",
            "10",
            "--rate",
            "2000",
            "--output",
            "none",
        ];
        if enrich {
            args.push("--enrich");
        }
        let (mut weir, rest, job_id) = start(&args);
        std::thread::sleep(Duration::from_millis(300));
        let location = stop(&rest, &job_id, &dir);
        assert_eq!(weir.wait(), Some(0), "a stopped job ends FINISHED");
        path_of(&location)
    })
}

#[test]
fn a_savepoint_of_a_running_job_can_be_inspected_and_disposed() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let (weir, rest, job_id) = start(&[
        "run",
        "-D",
        "rest.port=0",
        "-D",
        "execution.checkpointing.interval=100ms",
        "-D",
        &checkpoints,
        "-p",
        "2",
        "counter",
        "--users",
        "50",
        "--rate",
        "5000",
        "--output",
        "none",
    ]);
    let output = run_weir(&["savepoint", "-m", &address(&rest), &job_id, dir.path().join("sp").to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let location = savepoint_location(&stdout);
    let savepoint = path_of(&location);
    let name = savepoint.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with(&format!("savepoint-{}-", &job_id[..6])) && name.len() == "savepoint-".len() + 6 + 1 + 12,
        "{name}"
    );
    assert!(savepoint.join("_metadata").is_file());

    // The job keeps running, and keeps checkpointing.
    let checkpoints =
        poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(3));
    assert_eq!(get(&format!("{rest}/jobs/{job_id}/status")).json()["status"], "RUNNING");
    assert_eq!(checkpoints["latest"]["savepoint"]["external_path"], location.as_str());
    assert!(checkpoints["latest"]["completed"]["external_path"].as_str().unwrap().contains(&format!("{job_id}/chk-")));
    let history = checkpoints["history"].as_array().unwrap();
    assert!(history.iter().all(|h| h["trigger_timestamp"].as_u64().is_some() && h["state_size"].as_u64().is_some()));
    assert!(history.iter().any(|h| h["operator_sizes"]["counter"].as_u64() > Some(0)), "{checkpoints}");
    let config = get(&format!("{rest}/jobs/{job_id}/checkpoints/config")).json();
    assert_eq!(config["interval"], 100);
    assert_eq!(config["mode"], "exactly_once");

    let inspect = run_weir(&["savepoint", "inspect", savepoint.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success());
    for needle in [
        "savepoint",
        "max parallelism:  128",
        "Operator 'counter'",
        "key type u64",
        "keyed state 'count'",
        "key groups 0..=63",
        "Operator 'source'",
        "source-positions",
    ] {
        assert!(text.contains(needle), "'{needle}' missing:\n{text}");
    }
    let json = run_weir(&["savepoint", "inspect", "--json", savepoint.to_str().unwrap()]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["max_parallelism"], 128);

    let dispose = run_weir(&["savepoint", "--dispose", savepoint.to_str().unwrap()]);
    assert!(dispose.status.success(), "{}", String::from_utf8_lossy(&dispose.stderr));
    assert!(!savepoint.exists());
    drop(weir.stdout_lines());
}

#[test]
fn stop_then_restore_at_parallelism_1_4_2_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let job = ["counter", "--users", "20", "--events", "60000", "--rate", "10000", "--output", &out_arg];
    let common = ["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];

    let mut args: Vec<&str> = common.to_vec();
    args.extend(["-p", "1"]);
    args.extend(job);
    let (mut first, rest, job_id) = start(&args);
    std::thread::sleep(Duration::from_millis(800));
    let savepoint_1 = path_of(&stop(&rest, &job_id, &dir.path().join("sp")));
    assert_eq!(first.wait(), Some(0));

    let mut args: Vec<&str> = common.to_vec();
    let savepoint_1_arg = savepoint_1.to_str().unwrap().to_string();
    args.extend(["-s", &savepoint_1_arg, "-p", "4"]);
    args.extend(job);
    let (mut second, rest, job_id) = start(&args);
    let details = get(&format!("{rest}/jobs/{job_id}")).json();
    assert!(
        details["vertices"].as_array().unwrap().iter().all(|v| v["parallelism"] == 4 && v["maxParallelism"] == 128)
    );
    // The restore's progress: every byte of the savepoint's state was read, and `run` says so.
    let restore = poll_json(&format!("{rest}/jobs/{job_id}"), |d| {
        d["restore"]["bytes-total"].as_u64() > Some(0) && d["restore"]["bytes-read"] == d["restore"]["bytes-total"]
    })["restore"]
        .clone();
    let savepoint_name = savepoint_1.file_name().unwrap().to_string_lossy().to_string();
    assert!(restore["external_path"].as_str().unwrap().ends_with(&savepoint_name), "{restore}");
    let restored_line = second.stderr_line("Restored ");
    assert!(restored_line.contains(&savepoint_name), "{restored_line}");
    std::thread::sleep(Duration::from_millis(800));
    let savepoint_2 = path_of(&stop(&rest, &job_id, &dir.path().join("sp")));
    assert_eq!(second.wait(), Some(0));

    let savepoint_2_arg = savepoint_2.to_str().unwrap().to_string();
    let mut args: Vec<&str> = common.to_vec();
    args.extend(["-s", &savepoint_2_arg, "-p", "2"]);
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    assert_exactly_once(&committed_lines(&out), 20, 60_000);
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(name.starts_with("part-"), "left behind: {name}");
    }
}

/// Beyond the max parallelism: `-p 129` against a savepoint with 128 key groups is refused and
/// says how to fix it; `weir savepoint rewrite` gives it 256 key groups, leaving the original
/// untouched, and the job goes on at parallelism 129 with every count exactly once.
#[test]
fn a_savepoint_rewritten_to_more_key_groups_restores_beyond_the_old_max_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let job = ["counter", "--users", "300", "--events", "30000", "--rate", "20000", "--output", &out_arg];
    let mut args = vec!["run", "-D", "rest.port=0", "-p", "2"];
    args.extend(job);
    let (mut first, rest, job_id) = start(&args);
    std::thread::sleep(Duration::from_millis(500));
    let savepoint = path_of(&stop(&rest, &job_id, &dir.path().join("sp")));
    assert_eq!(first.wait(), Some(0));
    let original = snapshot_files(&savepoint);
    let savepoint_arg = savepoint.to_str().unwrap().to_string();

    let mut refused = vec!["run", "-s", &savepoint_arg, "-p", "129"];
    refused.extend(job);
    assert_refused(&refused, &["max parallelism 128", "weir savepoint rewrite --max-parallelism 129"]);
    // A dry run reports what a restore would do, refuses what `run` refuses, and starts nothing.
    let lines_before = committed_lines(&out).len();
    let mut dry = vec!["run", "--dry-run", "-s", &savepoint_arg, "-p", "4"];
    dry.extend(job);
    dry.push("--enrich");
    let output = run_weir(&dry);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    for needle in [
        "operator 'counter' restores its state (parallelism 2 -> 4)",
        "operator 'enrich' is new: starts as in a fresh job (empty state; a source reads from its beginning)",
        "nothing was started or written",
    ] {
        assert!(stdout.contains(needle), "'{needle}' missing:\n{stdout}");
    }
    let mut dry_refused = vec!["run", "--dry-run", "-s", &savepoint_arg, "-p", "129"];
    dry_refused.extend(job);
    assert_refused(&dry_refused, &["max parallelism 128"]);
    assert_eq!(committed_lines(&out).len(), lines_before, "a dry run wrote output");
    // The deployment pre-flight names a running job's newest checkpoint, which retention may
    // delete before the dry run reads it: with `$internal.restore.newest-retained` the dry run
    // checks the newest complete successor beside it (chk-5 is gone, chk-6 never completed).
    let job_dir = dir.path().join("checkpoints").join("0123456789abcdef0123456789abcdef");
    copy_dir(&savepoint, &job_dir.join("chk-7"));
    std::fs::create_dir_all(job_dir.join("chk-6")).unwrap();
    let gone = format!("file://{}", job_dir.join("chk-5").display());
    let mut dry_gone = vec!["run", "--dry-run", "-s", &gone, "-p", "2"];
    dry_gone.extend(job);
    assert_refused(&dry_gone, &["no _metadata"]);
    let mut dry_newest =
        vec!["run", "--dry-run", "-D", "$internal.restore.newest-retained=true", "-s", &gone, "-p", "2"];
    dry_newest.extend(job);
    let output = run_weir(&dry_newest);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("Restoring from file://{}", job_dir.join("chk-7").display())), "{stdout}");

    let rewritten_dir = dir.path().join("rewritten");
    let output = run_weir(&[
        "savepoint",
        "rewrite",
        "--max-parallelism",
        "256",
        &savepoint_arg,
        rewritten_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("from max parallelism 128 to 256"), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("Savepoint rewritten")).unwrap_or_else(|| panic!("{stdout}"));
    let rewritten = path_of(line.rsplit("Path: ").next().unwrap().trim());
    assert_eq!(snapshot_files(&savepoint), original, "the original savepoint changed");
    let inspect = run_weir(&["savepoint", "inspect", rewritten.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("max parallelism:  256"));

    let rewritten_arg = rewritten.to_str().unwrap().to_string();
    let mut args = vec!["run", "-D", "rest.port=0", "-s", &rewritten_arg, "-p", "129"];
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_exactly_once(&committed_lines(&out), 300, 30_000);

    // Asking for fewer key groups than an operator's parallelism is a usage error.
    let output = run_weir(&["savepoint", "rewrite", "--max-parallelism", "1", &savepoint_arg, "/tmp/unused"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(error_lines(&output)[0].contains("give at least 2"), "{:?}", error_lines(&output));
}

/// A delay that differs per run (printed so a failure can be replayed).
fn random_delay(min_ms: u64, spread_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    let delay = min_ms + nanos % spread_ms;
    eprintln!("kill after {delay} ms");
    Duration::from_millis(delay)
}

#[test]
fn kill_9_mid_run_then_restore_from_the_latest_checkpoint_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let job = ["counter", "--users", "50", "--events", "40000", "--rate", "10000", "--output", &out_arg];
    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    args.extend(["-D", "state.checkpoints.num-retained=2", "-p", "2"]);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args);
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
    std::thread::sleep(random_delay(200, 1500));
    drop(weir.stdout_lines());
    weir.kill_hard();

    // The newest retained checkpoint is the one with the highest id that has _metadata.
    let job_dir = chk_root.join(&job_id);
    let mut retained: Vec<(u64, PathBuf)> = std::fs::read_dir(&job_dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let id = path.file_name()?.to_str()?.strip_prefix("chk-")?.parse().ok()?;
            path.join("_metadata").is_file().then_some((id, path))
        })
        .collect();
    retained.sort();
    assert!(!retained.is_empty() && retained.len() <= 3, "retained {retained:?}");
    let latest = retained.last().unwrap().1.to_str().unwrap().to_string();

    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    args.extend(["-s", &latest, "-p", "3"]);
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_exactly_once(&committed_lines(&out), 50, 40_000);
}

/// `kill -9` at a random point around the end of a bounded job (the last records, the final
/// checkpoint, its commit, or after the job finished), then a restore from the newest retained
/// checkpoint into the same output: every count exactly once.
#[test]
fn kill_9_around_the_end_then_restore_from_the_latest_checkpoint_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    // 6 000 events at 10 000/s: the input ends about 0.6 s after the start.
    let job = ["counter", "--users", "30", "--events", "6000", "--rate", "10000", "--output", &out_arg];
    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    args.extend(["-p", "2"]);
    args.extend(job);
    let (mut weir, _rest, job_id) = start(&args);
    std::thread::sleep(random_delay(350, 450));
    drop(weir.stdout_lines());
    weir.kill_hard();

    let job_dir = chk_root.join(&job_id);
    let latest = newest_checkpoint(&job_dir).map(|path| path.to_str().unwrap().to_string());
    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    if let Some(latest) = &latest {
        args.extend(["-s", latest.as_str()]);
    }
    args.extend(["-p", "2"]);
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_exactly_once(&committed_lines(&out), 30, 6_000);
}

fn assert_refused(args: &[&str], needles: &[&str]) {
    let started = Instant::now();
    let output = run_weir(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    let errors = error_lines(&output);
    assert_eq!(errors.len(), 1, "{stderr}");
    for needle in needles {
        assert!(errors[0].contains(needle), "'{needle}' missing in {}", errors[0]);
    }
    assert!(!stderr.contains("panicked"));
    assert!(started.elapsed() < Duration::from_secs(20));
}

fn snapshot_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().to_string(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn refused_restores_name_the_numbers_and_uids_and_change_nothing() {
    let savepoint = shared_savepoint(false);
    let path = savepoint.to_str().unwrap();
    let before = snapshot_files(savepoint);
    assert_refused(&["run", "-s", path, "-p", "256", "counter", "--users", "10"], &["256", "128", "max parallelism"]);
    assert_refused(
        &["run", "-s", path, "-D", "pipeline.max-parallelism=256", "counter", "--users", "10"],
        &["128", "256", "max parallelism"],
    );
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("words.txt");
    std::fs::write(&input, "a b c\n").unwrap();
    assert_refused(
        &["run", "-s", path, "wordcount", "--input", input.to_str().unwrap(), "--output", "-"],
        &["'counter'", "u64", "String"],
    );
    assert_eq!(snapshot_files(savepoint), before, "a refused restore changed the snapshot");
}

#[test]
fn orphan_state_is_refused_without_n_and_dropped_with_it() {
    let savepoint = shared_savepoint(true);
    let path = savepoint.to_str().unwrap();
    assert_refused(
        &["run", "-s", path, "counter", "--users", "10", "--events", "100", "--output", "none"],
        &["enrich", "-n"],
    );
    let output = run_weir(&[
        "run",
        "-D",
        "rest.port=0",
        "-s",
        path,
        "-n",
        "counter",
        "--users",
        "10",
        "--events",
        "100",
        "--output",
        "none",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("'enrich' is not restored"), "{stderr}");
}

#[test]
fn corrupt_or_truncated_snapshots_are_errors_naming_the_file() {
    let original = shared_savepoint(false);
    for damage in ["flip", "truncate"] {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("savepoint-copy");
        std::fs::create_dir(&copy).unwrap();
        for (name, bytes) in snapshot_files(original) {
            std::fs::write(copy.join(name), bytes).unwrap();
        }
        let metadata = copy.join("_metadata");
        let mut bytes = std::fs::read(&metadata).unwrap();
        match damage {
            "flip" => {
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x01;
            }
            _ => bytes.truncate(bytes.len() / 2),
        }
        std::fs::write(&metadata, &bytes).unwrap();
        assert_refused(&["run", "-s", copy.to_str().unwrap(), "counter", "--users", "10"], &["_metadata"]);
        let inspect = run_weir(&["savepoint", "inspect", copy.to_str().unwrap()]);
        assert_eq!(inspect.status.code(), Some(1));
        assert!(error_lines(&inspect)[0].contains("_metadata"), "{:?}", error_lines(&inspect));
    }

    // A damaged data file: the job fails at start naming the file; nothing is restored.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("savepoint-copy");
    std::fs::create_dir(&copy).unwrap();
    for (name, mut bytes) in snapshot_files(original) {
        if name.starts_with("task-1-") {
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
        }
        std::fs::write(copy.join(name), bytes).unwrap();
    }
    let output = run_weir(&[
        "run",
        "-D",
        "rest.port=0",
        "-s",
        copy.to_str().unwrap(),
        "-p",
        "2",
        "counter",
        "--users",
        "10",
        "--output",
        "none",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let errors = error_lines(&output);
    assert!(errors[0].contains("FAILED") && errors[0].contains("task-1-"), "{errors:?}");
}

#[test]
fn at_least_once_mode_loses_nothing_across_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.path().join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let job = ["counter", "--users", "20", "--events", "20000", "--rate", "10000", "--output", &out_arg];
    let mut args = vec!["run", "-D", "rest.port=0", "-D", "execution.checkpointing.interval=100ms", "-D", &checkpoints];
    args.extend(["-D", "execution.checkpointing.mode=AT_LEAST_ONCE", "-p", "2"]);
    args.extend(job);
    let (mut weir, rest, job_id) = start(&args);
    let config = get(&format!("{rest}/jobs/{job_id}/checkpoints/config")).json();
    assert_eq!(config["mode"], "at_least_once");
    poll_json(&format!("{rest}/jobs/{job_id}/checkpoints"), |c| c["counts"]["completed"].as_u64() >= Some(2));
    std::thread::sleep(random_delay(100, 600));
    weir.kill_hard();
    let latest = std::fs::read_dir(chk_root.join(&job_id))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("_metadata").is_file())
        .max_by_key(|p| p.file_name().unwrap().to_string_lossy().trim_start_matches("chk-").parse::<u64>().unwrap_or(0))
        .unwrap();
    let latest = latest.to_str().unwrap().to_string();
    let mut args = vec!["run", "-D", "rest.port=0", "-s", &latest, "-p", "2"];
    args.extend(job);
    let output = run_weir(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // At-least-once: every count from 1 to the user's event count was emitted (duplicates allowed).
    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in committed_lines(&out) {
        let (user, count) = line.split_once('\t').unwrap();
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(per_user.len(), 20);
    for (user, counts) in per_user {
        for expected in 1..=1000u64 {
            assert!(counts.contains(&expected), "user {user} lost count {expected}");
        }
    }
}

#[test]
fn a_savepoint_moved_to_another_directory_still_restores() {
    let original = shared_savepoint(false);
    let dir = tempfile::tempdir().unwrap();
    let moved = dir.path().join("elsewhere").join("renamed-savepoint");
    std::fs::create_dir_all(&moved).unwrap();
    for (name, bytes) in snapshot_files(original) {
        std::fs::write(moved.join(name), bytes).unwrap();
    }
    let output = run_weir(&[
        "run",
        "-D",
        "rest.port=0",
        "-s",
        moved.to_str().unwrap(),
        "-p",
        "3",
        "counter",
        "--users",
        "10",
        "--events",
        "1",
        "--output",
        "none",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // Pointing at the _metadata file works as well, as in Flink.
    let metadata = moved.join("_metadata");
    let inspect = run_weir(&["savepoint", "inspect", metadata.to_str().unwrap()]);
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
}

/// Copies the files of snapshot directory `from` (data files and `_metadata`) into `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for (name, bytes) in snapshot_files(from) {
        std::fs::write(to.join(name), bytes).unwrap();
    }
}
