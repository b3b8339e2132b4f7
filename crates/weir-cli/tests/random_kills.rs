//! `kill -9` at random points, over and over, and restores into new jobs: exactly once.
//!
//! Each round runs a chain of jobs over one bounded input and one output directory. Every job
//! but the last is killed at a random moment (while it reads, after a savepoint it took while
//! running, while it checkpoints, in its end-of-input phase, or after it finished); the next
//! job (a new job id, at a random parallelism) restores from the newest restore point the
//! killed job left: its newest retained checkpoint, or its savepoint when that is newer, or
//! else the restore point the killed job started from. The last job runs to the end. Every
//! count must then be in the output exactly once.
//!
//! Every third round (an odd seed) aims its first kill at the end-of-input phase: the fresh
//! job takes a savepoint while it runs, and is killed within 150 ms of its sources having
//! emitted the whole input (while its final checkpoint and end-of-input results are under
//! way, or just after).
//!
//! Half the chains (by a bit of their seed) take unaligned checkpoints.
//!
//! Every other round runs two such chains at once into the same output directory (two jobs
//! sharing an external resource): each chain's part files (named by its jobs' ids) must hold
//! its counts exactly once, whatever the other chain's kills and restores did.
//!
//! The seed of each round is printed; `WEIR_RANDOM_KILL_SEED` replays one (with
//! `WEIR_RANDOM_KILL_CHAINS=2` for a round of two chains), and `WEIR_RANDOM_KILL_ROUNDS` runs
//! more rounds (CI runs the default).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{RunningWeir, committed_lines, run_weir};
use weir_types::seeded::SeededRng;

const USERS: u64 = 30;
const EVENTS: u64 = 15_000;
/// Events per second: the input ends about 1.5 s after a fresh start.
const RATE: u64 = 10_000;
const ROUNDS_DEFAULT: u64 = 6;

/// The committed lines of `dir` in part files written by one of `jobs`.
fn committed_lines_of(dir: &Path, jobs: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return lines };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let written_by_chain =
            name.strip_prefix("part-").is_some_and(|rest| jobs.iter().any(|j| rest.starts_with(j.as_str())));
        if written_by_chain {
            lines.extend(std::fs::read_to_string(entry.path()).unwrap().lines().map(str::to_string));
        }
    }
    lines
}

fn assert_exactly_once(lines: &[String], seed: u64) {
    let mut per_user: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let (user, count) =
            line.split_once('\t').unwrap_or_else(|| panic!("seed {seed}: not user<TAB>count: {line:?}"));
        per_user.entry(user.parse().unwrap()).or_default().push(count.parse().unwrap());
    }
    assert_eq!(per_user.len() as u64, USERS, "seed {seed}: users seen");
    for (user, mut counts) in per_user {
        counts.sort_unstable();
        let expected: Vec<u64> = (1..=EVENTS / USERS).collect();
        if counts != expected {
            let mut deduplicated = counts.clone();
            deduplicated.dedup();
            let lost = expected.iter().filter(|c| deduplicated.binary_search(c).is_err()).count();
            panic!(
                "seed {seed}: user {user}: {} duplicated, {lost} lost (replay with WEIR_RANDOM_KILL_SEED={seed})",
                counts.len() - deduplicated.len()
            );
        }
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

/// The newest retained checkpoint of `job_id`.
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

/// One round: `chains` chains of jobs into one output directory, at once.
fn one_round(seed: u64, chains: u64) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    if chains == 1 {
        chain(seed, dir.path(), &out);
        assert_exactly_once(&committed_lines(&out), seed);
        return;
    }
    let runs: Vec<_> = (0..chains)
        .map(|index| {
            // The second chain's seed differs (even: it aims no kill at the end of input).
            let seed = if index == 0 { seed } else { seed.wrapping_mul(31).wrapping_add(index) & !1 };
            let (dir, out) = (dir.path().to_path_buf(), out.clone());
            (seed, std::thread::spawn(move || chain(seed, &dir, &out)))
        })
        .collect();
    for (seed, run) in runs {
        let jobs = run.join().unwrap_or_else(|_| panic!("seed {seed}: a chain failed"));
        assert_exactly_once(&committed_lines_of(&out, &jobs), seed);
    }
}

/// A chain of jobs of seed `seed` into `out` (module docs); the ids of its jobs.
fn chain(seed: u64, dir: &Path, out: &Path) -> Vec<String> {
    let mut random = SeededRng::new(seed);
    let mut jobs = Vec::new();
    let out_arg = out.to_str().unwrap().to_string();
    let chk_root = dir.join("chk");
    let checkpoints = format!("state.checkpoints.dir=file://{}", chk_root.display());
    let (events, rate, users) = (EVENTS.to_string(), RATE.to_string(), USERS.to_string());
    let job = ["counter", "--users", &users, "--events", &events, "--rate", &rate, "--output", &out_arg];
    // Odd seeds aim the first kill at the end-of-input phase (module docs).
    let aim_at_end = seed % 2 == 1;
    // Half the chains checkpoint unaligned (a bit of the seed, so old seeds replay as before).
    let unaligned = format!("execution.checkpointing.unaligned.enabled={}", seed & 8 != 0);
    let killed_jobs = 1 + random.below(2);
    let mut restore: Option<RestorePoint> = None;
    for index in 0..=killed_jobs {
        let parallelism = (1 + random.below(3)).to_string();
        // Checkpoints far apart make the savepoint the newest restore point more often.
        let interval = ["execution.checkpointing.interval=100ms", "execution.checkpointing.interval=700ms"]
            [random.below(2) as usize];
        let mut args = vec!["run", "-D", "rest.port=0", "-D", interval];
        args.extend(["-D", &checkpoints, "-D", "state.checkpoints.num-retained=2", "-p", &parallelism]);
        args.extend(["-D", &unaligned]);
        let restore_path = restore.as_ref().map(|point| point.path.to_str().unwrap().to_string());
        if let Some(path) = &restore_path {
            args.extend(["-s", path.as_str()]);
        }
        args.extend(job);
        if index == killed_jobs {
            eprintln!(
                "seed {seed}: job {index} at -p {parallelism} ({unaligned}) from {restore_path:?} runs to the end"
            );
            let output = run_weir(&args);
            assert!(output.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&output.stderr));
            let stdout = String::from_utf8_lossy(&output.stdout);
            let id = stdout.lines().find_map(|l| l.strip_prefix("Job has been submitted with JobID "));
            jobs.push(id.unwrap_or_else(|| panic!("seed {seed}: no job id in {stdout}")).trim().to_string());
            break;
        }
        let mut weir = RunningWeir::start(&args);
        let rest = weir.rest_url();
        let job_id = weir.job_id();
        jobs.push(job_id.clone());
        let ran = poll_running(&rest, &job_id);
        let before_savepoint = random.below(900);
        let aimed = aim_at_end && index == 0;
        let take_savepoint = random.below(2) == 0 || aimed;
        // A third of the kills come right after the savepoint, before the next checkpoint.
        let after = if random.below(3) == 0 { random.below(40) } else { random.below(1200) };
        // Aimed: the kill comes this long after the sources emitted the whole input.
        let after_end = random.below(150);
        if aimed {
            eprintln!(
                "seed {seed}: job {index} {job_id} at -p {parallelism}: savepoint after {before_savepoint} ms, kill {after_end} ms after the input ended"
            );
        } else {
            eprintln!(
                "seed {seed}: job {index} {job_id} at -p {parallelism} from {restore_path:?}: savepoint {take_savepoint} after {before_savepoint} ms, kill {after} ms later"
            );
        }
        std::thread::sleep(Duration::from_millis(before_savepoint));
        let mut savepoint = None;
        if take_savepoint && ran {
            let target = dir.join("savepoints");
            let output =
                run_weir(&["savepoint", "-m", rest.trim_start_matches("http://"), &job_id, target.to_str().unwrap()]);
            let stdout = String::from_utf8_lossy(&output.stdout).to_string();
            // A job already finishing takes no savepoint: that is fine here.
            if let Some(path) = stdout.lines().find_map(|l| l.strip_prefix("Savepoint completed. Path: ")) {
                let path = PathBuf::from(path.trim().trim_start_matches("file://"));
                savepoint = Some(RestorePoint { checkpoint_id: checkpoint_id_of(&path), path });
            }
        }
        if aimed {
            if ran && !wait_for_input_end(&rest, &job_id, EVENTS) {
                eprintln!("seed {seed}: job {index} finished before the kill");
            }
            std::thread::sleep(Duration::from_millis(after_end));
        } else {
            std::thread::sleep(Duration::from_millis(after));
        }
        drop(weir.stdout_lines());
        weir.kill_hard();
        let newest =
            [newest_checkpoint(&chk_root, &job_id), savepoint].into_iter().flatten().max_by_key(|p| p.checkpoint_id);
        if let Some(newest) = newest {
            eprintln!("seed {seed}: restore point {} (checkpoint {})", newest.path.display(), newest.checkpoint_id);
            restore = Some(newest);
        }
    }
    jobs
}

/// Waits until every subtask runs; false when the job ended first (restored from a final
/// checkpoint, a job ends at once and its embedded REST API goes away with it).
fn poll_running(rest: &str, job_id: &str) -> bool {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let deadline = std::time::Instant::now() + common::WAIT_MAX;
    while std::time::Instant::now() < deadline {
        let Ok(mut response) = agent.get(&format!("{rest}/jobs/{job_id}")).call() else {
            return false;
        };
        let job: serde_json::Value =
            response.body_mut().read_to_string().ok().and_then(|b| serde_json::from_str(&b).ok()).unwrap_or_default();
        let running = job["vertices"].as_array().is_some_and(|vs| {
            vs.iter().all(|v| v["subtasks"].as_array().is_some_and(|ss| ss.iter().all(|s| s["status"] == "RUNNING")))
        });
        if running {
            return true;
        }
        if job["state"] == "FINISHED" {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("job {job_id} never ran");
}

/// Waits until the job's sources (its first vertex) emitted `events` records, that is until
/// its input ended; false when the job finished (its REST API went away) first.
fn wait_for_input_end(rest: &str, job_id: &str, events: u64) -> bool {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let deadline = std::time::Instant::now() + common::WAIT_MAX;
    while std::time::Instant::now() < deadline {
        let Ok(mut response) = agent.get(&format!("{rest}/jobs/{job_id}")).call() else {
            return false;
        };
        let job: serde_json::Value =
            response.body_mut().read_to_string().ok().and_then(|b| serde_json::from_str(&b).ok()).unwrap_or_default();
        if job["state"] == "FINISHED" {
            return false;
        }
        if job["vertices"][0]["metrics"]["write-records"].as_u64().is_some_and(|written| written >= events) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the input of job {job_id} never ended");
}

#[test]
fn random_kills_and_restores_into_new_jobs_with_savepoints_taken_while_running_stay_exactly_once() {
    let rounds = std::env::var("WEIR_RANDOM_KILL_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS_DEFAULT);
    let replay: Option<u64> = std::env::var("WEIR_RANDOM_KILL_SEED").ok().and_then(|s| s.parse().ok());
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    for round in 0..rounds {
        // Every third round's seed is odd: it aims a kill at the end-of-input phase.
        let seed = (base.wrapping_add(round.wrapping_mul(0x9e37_79b9)) & !1) | u64::from(round % 3 == 2);
        let seed = replay.unwrap_or(seed);
        // A replayed seed runs as many chains as WEIR_RANDOM_KILL_CHAINS says (1 by default).
        let chains = match replay {
            Some(_) => std::env::var("WEIR_RANDOM_KILL_CHAINS").ok().and_then(|c| c.parse().ok()).unwrap_or(1),
            None => 1 + round % 2,
        };
        eprintln!("round {round}: seed {seed}, {chains} chain(s)");
        one_round(seed, chains);
        if replay.is_some() {
            break;
        }
    }
}
