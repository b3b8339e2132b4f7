//! A savepoint taken while a job runs commits nothing (Flink since 1.15, FLINK-25191): the
//! failover after it restores the newest checkpoint, or nothing, and the output stays exactly
//! once. Before, the sink committed on the savepoint's completion and the replay after the
//! crash wrote those records a second time. The parts the savepoint staged survive that
//! failover, so a later restore of the savepoint commits them. And a source that is new in a
//! restored job reads its input, as in a fresh run.

mod common;
use common::bounded::BoundedOutput;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::runs::{RUN_WAIT_MAX as WAIT_MAX, Run, assert_exactly_once, get_json, lines, my_weir, wait_line};

/// Where the runs with a checkpoint every 2 s crash: at 10 000 events/s, 3.3 s in, after
/// the first checkpoint (2 s) and before the second (4 s), leaving the savepoint taken after
/// the first 1.3 s to complete (at 2.9 s, a CI run with four such jobs at once once crashed
/// before its savepoint completed).
const CRASH_AT: u64 = 33_000;

/// What [`savepoint_then_crash`] leaves: its directory, the output directory, the savepoint.
struct SavedAndCrashed {
    dir: tempfile::TempDir,
    out: std::path::PathBuf,
    savepoint: String,
}

/// Runs `flaky-counter` (50 users, `events` at 10 000/s, one crash at `fail_at`) with
/// periodic checkpoints every `interval`; takes a savepoint once `checkpoints_before` periodic
/// checkpoints completed, then lets the job crash, restart and finish.
fn savepoint_then_crash(interval: &str, checkpoints_before: u64, events: u64, fail_at: u64) -> SavedAndCrashed {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let marker = dir.path().join("crashed");
    let checkpoints = format!("state.checkpoints.dir=file://{}/chk", dir.path().display());
    let interval = format!("execution.checkpointing.interval={interval}");
    let mut child = my_weir()
        .args(["run", "-p", "2", "-D", "rest.port=0", "-D", &interval, "-D", &checkpoints])
        .args(["-D", "restart-strategy.type=fixed-delay", "-D", "restart-strategy.fixed-delay.delay=100ms"])
        .args(["flaky-counter", "--users", "50", "--events", &events.to_string(), "--rate", "10000"])
        .args(["--fail-at", &fail_at.to_string(), "--marker"])
        .arg(&marker)
        .arg("--output")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines(child.stdout.take().unwrap());
    let stderr = lines(child.stderr.take().unwrap());
    let mut run = Run { child, stdout, stderr };
    let rest_line = wait_line(&run.stderr, "REST API at http://");
    let rest = rest_line.split("REST API at ").nth(1).unwrap().trim().to_string();
    let job_id = wait_line(&run.stdout, "Job has been submitted with JobID ").rsplit(' ').next().unwrap().to_string();
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let stats = get_json(&format!("{rest}/jobs/{job_id}/checkpoints"));
        let periodic = stats["history"]
            .as_array()
            .map(|h| h.iter().filter(|c| c["status"] == "COMPLETED" && c["is_savepoint"] == false).count() as u64)
            .unwrap_or(0);
        let running = get_json(&format!("{rest}/jobs/{job_id}"))["vertices"].as_array().is_some_and(|vs| {
            vs.iter().all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
        });
        if periodic >= checkpoints_before && running {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint completed: {stats}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let address = rest.trim_start_matches("http://");
    let savepoint = my_weir()
        .args(["savepoint", "-m", address, &job_id])
        .arg(dir.path().join("savepoints"))
        .bounded_output()
        .unwrap();
    assert!(savepoint.status.success(), "{}", String::from_utf8_lossy(&savepoint.stderr));
    assert!(!marker.exists(), "the crash came before the savepoint completed; the test proves nothing");
    let deadline = Instant::now() + WAIT_MAX;
    let status = loop {
        if let Some(status) = run.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the job did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the job did not finish");
    assert!(marker.exists(), "the injected crash did not happen");
    assert_exactly_once(&out, 50, events);
    let stdout = String::from_utf8_lossy(&savepoint.stdout);
    let savepoint =
        stdout.lines().find_map(|line| line.split("Path: ").nth(1)).expect("the savepoint's path").trim().to_string();
    SavedAndCrashed { dir, out, savepoint }
}

/// Each user's counts in the committed part files of `dir` named in `names`.
fn counts_in(dir: &std::path::Path, names: &[String]) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut per_user: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    for name in names {
        for line in std::fs::read_to_string(dir.join(name)).unwrap().lines() {
            let (user, count) = line.split_once('\t').unwrap();
            per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
        }
    }
    per_user
}

fn committed_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("part-"))
        .collect();
    names.sort();
    names
}

/// The savepoint of [`savepoint_then_crash`] staged part files that its own restore commits
/// (intermediate savepoints commit nothing themselves). The failover that restarted the job
/// from the older checkpoint must not delete them: restored later into the same directory,
/// the savepoint finds every part pending, and what it commits plus what the restored job
/// writes are exactly the counts after the checkpoint the crash went back to.
#[test]
fn a_failover_keeps_the_part_files_an_intermediate_savepoint_staged_for_its_later_restore() {
    const EVENTS: u64 = 36_000;
    let run = savepoint_then_crash("2s", 1, EVENTS, CRASH_AT);
    let job_args = |marker: &std::path::Path| {
        let mut args: Vec<String> =
            ["flaky-counter", "--users", "50", "--events", &EVENTS.to_string(), "--rate", "100000"]
                .iter()
                .map(|a| a.to_string())
                .collect();
        args.extend(["--fail-at".to_string(), (EVENTS + 1).to_string(), "--marker".to_string()]);
        args.push(marker.display().to_string());
        args.extend(["--output".to_string(), run.out.display().to_string()]);
        args
    };
    let marker = run.dir.path().join("never");
    let report = my_weir()
        .args(["run", "--dry-run", "-p", "2", "-s", &run.savepoint])
        .args(job_args(&marker))
        .bounded_output()
        .unwrap();
    let report_text = format!("{}{}", String::from_utf8_lossy(&report.stdout), String::from_utf8_lossy(&report.stderr));
    assert!(report.status.success(), "{report_text}");
    let pending_line = report_text
        .lines()
        .find(|l| l.contains("pending part file(s) of the snapshot"))
        .unwrap_or_else(|| panic!("the savepoint staged no part file: {report_text}"));
    assert!(pending_line.contains("0 already committed, 0 missing"), "{pending_line}");

    // Before the restore: the committed counts of attempt 0 of the first job end where the
    // checkpoint the crash went back to ended (the savepoint's staged parts are hidden).
    let before = committed_names(&run.out);
    let first_attempt: Vec<String> = before.iter().filter(|n| n.split('-').nth(2) == Some("0")).cloned().collect();
    let at_checkpoint: std::collections::BTreeMap<u64, u64> = counts_in(&run.out, &first_attempt)
        .into_iter()
        .map(|(user, counts)| (user, counts.into_iter().max().unwrap_or(0)))
        .collect();

    let restored = my_weir()
        .args(["run", "-p", "2", "-D", "rest.port=0", "-s", &run.savepoint])
        .args(job_args(&marker))
        .bounded_output()
        .unwrap();
    assert!(restored.status.success(), "{}", String::from_utf8_lossy(&restored.stderr));
    let new: Vec<String> = committed_names(&run.out).into_iter().filter(|n| !before.contains(n)).collect();
    let per_user = counts_in(&run.out, &new);
    assert_eq!(per_user.len(), 50);
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        let from = at_checkpoint.get(&user).copied().unwrap_or(0) + 1;
        let expected: Vec<u64> = (from..=EVENTS / 50).collect();
        assert_eq!(counts, expected, "user {user}: the savepoint's restore lost or repeated counts");
    }
}

/// A periodic checkpoint, then the savepoint, then the crash before the next checkpoint: the
/// restart restores the checkpoint, older than the savepoint.
#[test]
fn a_savepoint_between_a_checkpoint_and_a_crash_commits_nothing_the_restart_replays() {
    let _ = savepoint_then_crash("2s", 1, 36_000, CRASH_AT);
}

/// No periodic checkpoint before the crash at all: the restart starts from nothing.
#[test]
fn a_savepoint_before_any_checkpoint_and_a_crash_commits_nothing_the_restart_replays() {
    let _ = savepoint_then_crash("30s", 0, 20_000, 12_000);
}

/// A savepoint of another job restored with `-n` into `sensor-stats`: its source is new and
/// reads the whole file (it read nothing before).
#[test]
fn a_source_new_in_the_restored_job_reads_its_whole_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("readings.csv");
    let readings: String = (0..20).map(|i| format!("sensor-{i},{}.5\n", i % 7)).collect();
    std::fs::write(&input, readings).unwrap();
    let mut child = my_weir()
        .args(["run", "-p", "2", "-D", "rest.port=0", "counter", "--users", "10", "--rate", "1000", "--output", "none"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines(child.stdout.take().unwrap());
    let stderr = lines(child.stderr.take().unwrap());
    let run = Run { child, stdout, stderr };
    let rest_line = wait_line(&run.stderr, "REST API at http://");
    let rest = rest_line.split("REST API at ").nth(1).unwrap().trim().to_string();
    let job_id = wait_line(&run.stdout, "Job has been submitted with JobID ").rsplit(' ').next().unwrap().to_string();
    let stop = loop {
        let output = my_weir()
            .args(["stop", "-m", rest.trim_start_matches("http://"), "--savepoint-path"])
            .arg(dir.path().join("sp"))
            .arg(&job_id)
            .bounded_output()
            .unwrap();
        if output.status.success() {
            break String::from_utf8_lossy(&output.stdout).to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let savepoint =
        stop.lines().find_map(|l| l.strip_prefix("Savepoint completed. Path: ")).unwrap().trim().to_string();
    drop(run);
    let restored = my_weir()
        .args(["run", "-D", "rest.port=0", "-s", &savepoint, "-n", "sensor-stats", "--input"])
        .arg(&input)
        .args(["--output", "-"])
        .bounded_output()
        .unwrap();
    let out = String::from_utf8_lossy(&restored.stdout);
    assert!(restored.status.success(), "{out}{}", String::from_utf8_lossy(&restored.stderr));
    let summaries = out.lines().filter(|l| l.starts_with("sensor-")).count();
    assert_eq!(summaries, 20, "{out}");
}
